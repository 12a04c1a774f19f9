"""The README's "What it measured here" table, generated from the saved runs so it cannot drift.

    python -m llmlab.tools.readme            # print the table (newest reference run of each lab)
    python -m llmlab.tools.readme --write    # rewrite the block between the markers in README.md

The block sits between `<!-- claims:begin -->` and `<!-- claims:end -->`. Each row is one claim
of the newest committed reference run of each lab (under `results/reference/`, which only
`make reference` writes: a user's own runs go to `results/<lab>/` and never change the table),
labs in the order of the articles, re-judged with the lab's current judge() as `llmlab show`
and `llmlab report` do. tests/test_report.py checks that the README's block equals the generated one.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from llmlab.tools.report import Run, _lab_key, load_runs

BEGIN = "<!-- claims:begin -->"
END = "<!-- claims:end -->"
_VERDICT = {True: "holds", False: "does not hold", None: "not measured"}


REFERENCE = Path("results") / "reference"  # the committed reference runs; labs save elsewhere by default


def newest_runs(results_dir: Path | str = REFERENCE, skipped: list | None = None) -> list[Run]:
    """The newest saved run of each lab (by its UTC stamp), labs in the order of the articles.

    Files that cannot be read as a known lab's result are appended to `skipped` as (path, why).
    """
    runs, why = load_runs(results_dir)
    if skipped is not None:
        skipped.extend(why)
    newest: dict[str, Run] = {}
    for r in sorted(runs, key=lambda r: (r.stamp, r.path.name)):
        newest[r.lab] = r
    return [newest[lab] for lab in sorted(newest, key=_lab_key)]


def _md(s: object) -> str:
    """One markdown table cell: one line, pipes escaped."""
    return " ".join(str(s).split()).replace("|", "\\|")


def claims_table(results_dir: Path | str = REFERENCE, skipped: list | None = None) -> str:
    """The markdown table: lab, claim id, claim, expected, measured, verdict."""
    lines = ["| lab | claim id | claim | expected | measured | verdict |", "| --- | --- | --- | --- | --- | --- |"]
    for run in newest_runs(results_dir, skipped):
        for c in run.claims:
            cid = getattr(c, "id", "")
            cells = (_md(run.lab), f"`{_md(cid)}`" if cid else "", _md(c.text), _md(c.expected), _md(c.measured),
                     _VERDICT.get(c.holds, "not measured"))
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def block(text: str) -> str | None:
    """The text between the markers (None when the README has no markers)."""
    m = re.search(re.escape(BEGIN) + r"\n?(.*?)" + re.escape(END), text, flags=re.S)
    return None if m is None else m.group(1)


def rewrite(text: str, table: str) -> str:
    """text with the block between the markers replaced by table."""
    if block(text) is None:
        raise ValueError(f"no {BEGIN} ... {END} markers")
    pattern = re.escape(BEGIN) + r".*?" + re.escape(END)
    return re.sub(pattern, lambda _: f"{BEGIN}\n{table}{END}", text, count=1, flags=re.S)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m llmlab.tools.readme", description=__doc__.splitlines()[0])
    ap.add_argument("--results", type=Path, default=REFERENCE, help=f"folder of saved runs (default {REFERENCE}/)")
    ap.add_argument("--readme", type=Path, default=Path("README.md"), help="the README to rewrite with --write")
    ap.add_argument("--write", action="store_true", help="rewrite the block between the markers in the README")
    args = ap.parse_args(argv)
    if not args.results.is_dir():
        print(f"error: {args.results} is not a folder", file=sys.stderr)
        return 2
    skipped: list = []
    table = claims_table(args.results, skipped)
    for path, why in skipped:  # a lab whose file is skipped is missing from the table: say so
        print(f"warning: skipped {path}: {why}", file=sys.stderr)
    if not args.write:
        sys.stdout.write(table)
        return 0
    try:
        text = args.readme.read_text(encoding="utf-8")
        new = rewrite(text, table)
    except (OSError, ValueError) as exc:
        print(f"error: {args.readme}: {exc}", file=sys.stderr)
        return 2
    if new != text:
        args.readme.write_text(new, encoding="utf-8")
        print(f"rewrote the claims block in {args.readme}", file=sys.stderr)
    else:
        print(f"{args.readme}: the claims block is already up to date", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
