"""The tool commands that sit above the CLI's labs: `llmlab report` (registered on the CLI's app by
`llmlab.main`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from llmlab.cli.app import TOOLS, app, err
from llmlab.core.errors import UsageError


@app.command("report", rich_help_panel=TOOLS)
def report(
    results_dir: Annotated[Path, typer.Argument(help="Folder of saved runs (<dir>/<lab>/*.json).")] = Path("results"),
    output: Annotated[Optional[Path], typer.Option(
        "--output", "-o", help="The HTML file (default <dir>/report.html).", show_default=False)] = None,
) -> None:
    """One self-contained HTML page of every saved run: device cards, verdicts, tables, plots."""
    from llmlab.tools.report import write_report  # lazy: pandas costs start-up time

    if not results_dir.is_dir():
        raise UsageError(f"{results_dir}: not a folder of results (run a lab first, e.g. llmlab roofline --quick)")
    path, n_runs, n_skipped = write_report(results_dir, output)
    skipped = f", {n_skipped} file(s) skipped (listed at the end of the page)" if n_skipped else ""
    err.print(f"[dim]wrote {path}: {n_runs} run{'s' if n_runs != 1 else ''}{skipped}[/]")
