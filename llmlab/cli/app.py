"""The llmlab app: its consoles, the options every lab takes, `run_lab`, and `main`.

`run_lab` is the one path from a command line to a saved result: build the lab's Config (quick or
full, then the options given), let the lab check it, resolve the device, run under telemetry, judge,
save, render, and exit with the contract's code. torch, transformers and pandas are imported inside
the functions that need them, so `llmlab --help` stays instant.
"""

from __future__ import annotations

import dataclasses
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from llmlab import __version__
from llmlab.core.device import device_card, resolve_device
from llmlab.core.errors import MeasurementError, UsageError
from llmlab.core.telemetry import Telemetry
from llmlab.labs import judged
from llmlab.labs import module as lab_module

app = typer.Typer(
    name="llmlab",
    help="Hands-on, measured labs for LLM inference on your own hardware (a CUDA GPU, or the CPU).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
)

out = Console()  # stdout: tables, charts, claims (or only JSON with --json)
err = Console(stderr=True)  # stderr: progress, notices, errors

LABS = "Labs"
TOOLS = "Tools"
COMMON = "Common options"
ENDPOINT = "Against a running server"

# -- options every lab takes (shared aliases, one help panel)
DeviceOpt = Annotated[str, typer.Option(
    "--device", "-d", help="auto | cpu | cuda | cuda:N. auto takes cuda:0 when there is one.", rich_help_panel=COMMON)]
GpuOpt = Annotated[Optional[int], typer.Option(
    "--gpu", help="GPU index: --gpu N is --device cuda:N.", rich_help_panel=COMMON, show_default=False)]
QuickOpt = Annotated[bool, typer.Option(
    "--quick", help="Small sweeps: seconds on a 2-core CPU (what tests and CI run).", rich_help_panel=COMMON)]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print only the JSON result on stdout.", rich_help_panel=COMMON)]
OutOpt = Annotated[str, typer.Option(
    "--out", help="Folder for results (<out>/<lab>/<stamp>-<device>.json + CSVs).", rich_help_panel=COMMON)]
TablesOpt = Annotated[str, typer.Option(
    "--tables", help="report: the compact report | all: also every table in full.", rich_help_panel=COMMON)]
NoSaveOpt = Annotated[bool, typer.Option("--no-save", help="Do not write results.", rich_help_panel=COMMON)]
SeedOpt = Annotated[int, typer.Option("--seed", help="Seed for torch, random and numpy.", rich_help_panel=COMMON)]
ModelOpt = Annotated[str, typer.Option(
    "--model", "-m",
    help="tiny | tiny-draft | a Hugging Face id or local path | arch:NAME (random weights: timing only).")]


@dataclasses.dataclass(frozen=True)
class Common:
    device: str = "auto"
    gpu: int | None = None
    quick: bool = False
    json: bool = False
    out: Path | str = Path("results")
    no_save: bool = False
    seed: int = 0
    tables: str = "report"


def _check_tables(tables: str) -> str:
    if tables not in ("report", "all"):
        raise UsageError(f"--tables must be 'report' or 'all', got {tables!r}")
    return tables


def run_lab(lab: str, common: Common, **overrides) -> None:
    """Build the Config, run the lab under telemetry, render, save; exit with the contract's code."""
    from llmlab.core.results import check_writable, command_line, utc_stamp  # lazy: pandas costs start-up time

    module = lab_module(lab)
    _check_tables(common.tables)
    device = resolve_device(common.device, common.gpu)
    if not common.no_save:
        check_writable(common.out)
    base = module.Config.quick() if common.quick else module.Config()
    fields = {f.name for f in dataclasses.fields(base)}
    given = {k: v for k, v in overrides.items() if v is not None}
    if "seed" in fields:
        given["seed"] = common.seed
    try:
        cfg = dataclasses.replace(base, **given)
    except ValueError as exc:  # Config.__post_init__ validates
        raise UsageError(str(exc)) from None
    # what a lab checks before it starts (an endpoint that must answer) fails with one line and exit 2
    if hasattr(module, "check"):
        cfg = module.check(cfg) or cfg  # a check may return the Config with what it found (an endpoint's card)
    _seed(common.seed)
    if common.device in ("auto", "") and common.gpu is None:
        fallback = "" if device.is_cuda else " — no CUDA GPU found, using the CPU"
        err.print(f"[dim]device: {device.spec} ({device.name}){fallback}[/]")
    started = datetime.now(timezone.utc)
    progress = Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                        TimeElapsedColumn(), console=err, transient=True)
    with device.activate(), Telemetry(device) as tel, progress:  # --gpu N: the whole command runs on cuda:N
        result = module.run(cfg, device, progress)
    result.env = {
        "command": command_line(),
        "utc": started.isoformat(timespec="seconds"),
        "utc_stamp": utc_stamp(),
        "seed": common.seed,
        "quick": common.quick,
        "device": device_card(device),
        "telemetry": tel.summary(),
        **result.env,
    }
    try:
        result.claims, views, headline = judged(result, module)
    except Exception:  # a judge bug must not lose the measurement: save it unjudged, then fail loudly
        if not common.no_save:
            err.print(f"[yellow]judge failed: saved the unjudged result as {result.save(common.out, device.slug())}[/]")
        raise
    result.judge_version = getattr(module, "JUDGE_VERSION", 0)
    # saved before rendering: nothing is lost if rendering fails
    path = None if common.no_save else result.save(common.out, device.slug())
    if common.json:
        sys.stdout.write(result.to_json() + "\n")
    else:
        from llmlab.core.render import render  # lazy: pandas, as above

        render(result, out, views=views, headline=headline, tables=common.tables, saved=path)
    if path is not None:
        err.print(f"[dim]saved {path}[/]")
    if result.interrupted:
        raise typer.Exit(130)
    # a lab may say the run failed (after saving): (exit code, message)
    failed = module.exit_code(result) if hasattr(module, "exit_code") else None
    if failed:
        err.print(f"[red]{failed[1]}[/]")
        raise typer.Exit(failed[0])


def _seed(seed: int) -> None:
    import random

    import numpy as np  # lazy: numpy and torch cost start-up time; only a lab's run needs them
    import torch

    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


@app.callback()
def _root(
    version: Annotated[bool, typer.Option("--version", help="Print the version and exit.")] = False,
) -> None:
    """Hands-on, measured labs for LLM inference on your own hardware (a CUDA GPU, or the CPU).

    Every lab measures, prints tables, charts and claims with verdicts, and saves its numbers
    under results/. Start with `llmlab env`, then any lab with --quick.
    """
    if version:
        out.print(f"llmlab {__version__}")
        raise typer.Exit(0)


def main() -> None:
    """Run the app; errors become one line on stderr with the contract's exit code."""
    try:
        rc = app(standalone_mode=False)
    except (UsageError, MeasurementError) as exc:
        err.print(f"[bold red]error:[/] {exc}", highlight=False, soft_wrap=True)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        err.print("[yellow]interrupted[/]")
        sys.exit(130)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except Exception as exc:
        if hasattr(exc, "format_message") and hasattr(exc, "exit_code"):  # Click usage errors
            err.print(f"[bold red]error:[/] {exc.format_message()}", highlight=False, soft_wrap=True)
            sys.exit(exc.exit_code)
        if type(exc).__name__ == "Abort":
            sys.exit(130)
        raise
    sys.exit(rc if isinstance(rc, int) else 0)

