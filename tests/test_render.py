"""The terminal report: fits the width, headers break only at spaces, stays short.

Part one checks the layout on hand-made results; part two runs every lab in --quick mode
through the CLI (saving its JSON) and re-renders it with `llmlab show` at 80 and 120 columns.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys

import pandas as pd
import pytest
from rich.console import Console

from llmlab.core.render import ascii_line, fmt, render, report_lines, table_lines
from llmlab.core.results import Chart, Claim, Col, LabResult, View

MAX_LINES = 120  # a --quick report at 80 columns prints at most about 120 lines


def _result() -> LabResult:
    res = LabResult(lab="demo", version=2, env={"command": "llmlab demo --quick", "utc": "2026-12-02T00:00:00+00:00",
                                                "device": {"name": "Test CPU", "device": "cpu"}, "quick": True})
    res.add_table("speed", pd.DataFrame({
        "batch": [1, 2, 4, 8, 16, 32, 64] * 3,
        "tokens_per_s": [10.0 * b ** 0.8 for b in [1, 2, 4, 8, 16, 32, 64]] * 3,
        "speedup_vs_plain": [1.0, 1.7, 2.9, 4.8, 8.1, 13.9, 24.2] * 3,
        "share_of_peak": [0.01, 0.02, 0.04, 0.08, 0.15, 0.3, 0.55] * 3,
        "method": ["a rather long method name that must be cut"] * 21,
    }))
    res.claims = [Claim("demo.fast", "batching makes decode faster per token on this machine", "> 4x at batch 16",
                        "8.1x (81 vs 10 tokens/s)", True),
                  Claim("demo.gpu", "the GPU does it too", "> 4x", "-", None, "no GPU")]
    res.skip("gpu", "no GPU")
    res.note("one note")
    return res


VIEWS = [
    View("1. Speed vs batch", "How does throughput grow with batch size?", "speed",
         (Col("batch", "batch", "int"), Col("tokens_per_s", "tokens / s"), Col("speedup_vs_plain", "x batch 1", "x"),
          Col("share_of_peak", "% of peak compute", "%"), Col("method", "method", width=20)),
         chart=Chart("tokens/s vs batch", "speed", "batch", "tokens_per_s", logx=True, logy=True)),
    View("2. GPU", "Does a GPU agree?", "gpu", (Col("x", "x"),)),
]


def test_fmt_specs():
    assert fmt(1.2345, "x") == "1.23x" and fmt(12.345, "x") == "12.3x"
    assert fmt(0.931, "%") == "93.1%"
    assert fmt(1234.6, "int") == "1,235"
    assert fmt(0.5, ".2f") == "0.50"
    assert fmt(12345.678) == "12,346" and fmt(0.012345) == "0.01235" and fmt(1.0) == "1"


@pytest.mark.parametrize("width", [40, 80, 120])
def test_table_fits_and_headers_break_only_at_spaces(width):
    df = _result().tables["speed"]
    cols = VIEWS[0].cols
    lines, left = table_lines(df, cols, width)
    assert all(len(line.plain) <= width for line in lines)
    rule = next(
        i for i, line in enumerate(lines) if set(line.plain.strip()) == {"─", " "} or set(line.plain.strip()) == {"─"}
    )
    words = {w for c in cols for w in c.header.split()}
    for line in lines[:rule]:
        assert set(line.plain.split()) <= words, line.plain  # a fragment would mean a word split in two
    assert left == len(cols) - len(lines[rule].plain.split())


def test_narrow_terminal_drops_columns_and_says_so():
    lines = report_lines(_result(), 40, views=VIEWS)
    text = "\n".join(line.plain for line in lines)
    assert "1 more column" in text and "--tables all" in text
    assert all(len(line.plain) <= 40 for line in lines)


@pytest.mark.parametrize("width", [80, 120])
def test_report_has_views_claims_and_skips(width):
    console = Console(file=io.StringIO(), force_terminal=False, width=width)
    render(_result(), console, views=VIEWS, headline="Batching is the lever here.")
    text = console.file.getvalue()
    lines = text.splitlines()
    assert all(len(line) <= width for line in lines)
    assert all(line.isascii() for line in lines)  # off a TTY: plain ASCII, bytes == columns
    assert "\x1b[" not in text
    assert text.index("1. Speed vs batch") < text.index("What this run found") < text.index("Batching is the lever")
    assert "not measured: no GPU" in text  # the skipped part says why where it stands
    assert "measured 8.1x (81 vs 10 tokens/s);  expected > 4x at batch 16" in text
    assert "a rather long metho~" in text  # cut text cell
    assert "81%" not in text and "55%" in text  # % format of a fraction


def test_tables_all_prints_every_column_within_the_width():
    lines = report_lines(_result(), 60, views=VIEWS, tables="all")
    text = "\n".join(line.plain for line in lines)
    assert "speedup_vs_plain" in text and "share_of_peak" in text and all(len(line.plain) <= 60 for line in lines)


def test_ascii_line():
    assert ascii_line("──┼│ ⠁x…") == "--+| *x~"


# ---------------------------------------------------------------- every lab, end to end


def _labs() -> list[str]:
    import typer.main

    from llmlab.main import app

    group = typer.main.get_command(app)
    return [name for name, cmd in group.commands.items()
            if getattr(cmd, "rich_help_panel", None) == "Labs" and not cmd.hidden]


def _on_contract(lab: str) -> bool:
    from llmlab.labs import module

    return hasattr(module(lab), "views")


def _cli(*args, columns: int, timeout: float = 300) -> subprocess.CompletedProcess:
    env = dict(os.environ, COLUMNS=str(columns), HF_HUB_OFFLINE="1")
    return subprocess.run(
        [sys.executable, "-m", "llmlab", *args], capture_output=True, text=True, timeout=timeout, env=env
    )


def _check_report(text: str, width: int, lab: str) -> None:
    lines = text.splitlines()
    wide = [line for line in lines if len(line) > width]
    assert not wide, f"{lab}: {len(wide)} lines wider than {width}: {wide[:2]}"
    assert all(line.isascii() for line in lines), lab
    if width == 80:
        assert len(lines) <= MAX_LINES, f"{lab}: {len(lines)} lines at 80 columns"
    assert "What this run found" in text


@pytest.mark.slow
@pytest.mark.parametrize("lab", _labs())
def test_every_lab_quick_report_fits(lab, quick_run):
    if not _on_contract(lab):
        pytest.skip(f"{lab} is not on the views contract yet")
    run = quick_run(lab)
    d = run.data
    _check_report(run.stdout, 80, lab)
    saved = run.json_path
    assert d["claims"] and all(c["id"].startswith(lab.replace("-", "_") + ".") for c in d["claims"])
    # what `llmlab show` does with the saved file, in this process (a subprocess per width cost ~2-4 s a lab):
    # re-judged, the saved tables give the saved verdicts; re-rendered, the report fits 80 and 120 columns
    from llmlab.labs import judged

    result = LabResult.from_json(saved.read_text())
    claims, views, headline = judged(result)
    assert [(c.id, c.holds) for c in claims] == [(c["id"], c["holds"]) for c in d["claims"]]
    for width in (80, 120):
        text = "\n".join(
            line.plain for line in report_lines(result, width, views=views, headline=headline, saved=saved)
        )
        _check_report(text, width, lab)
    # the header of each view's table is never split inside a word, at 80 columns
    for v in views:
        df = result.tables.get(v.table)
        if df is None or df.empty:
            continue
        shown_df = v.rows(df) if v.rows else df
        lines, _ = table_lines(shown_df, v.cols, 80, v.max_rows)
        words = {w for c in v.cols for w in c.header.split()}
        for line in lines:
            if set(line.plain.strip()) <= {"─", " "}:
                break
            assert set(line.plain.split()) <= words, (lab, v.title, line.plain)


def test_show_renders_a_saved_run_through_the_cli(quick_run):
    """`llmlab show` end to end on one lab's saved quick run (every lab's saved run is re-rendered in-process above)."""
    run = quick_run("kvcache-growth")
    shown = _cli("show", str(run.json_path), columns=80)
    assert shown.returncode == 0, shown.stderr
    _check_report(shown.stdout, 80, "kvcache-growth")
    assert "verdict changed" not in shown.stderr


def test_show_rejects_what_is_not_a_result(tmp_path, cli):
    bad = tmp_path / "x.json"
    bad.write_text("{}")
    p = cli("show", str(bad), columns=80)
    assert p.returncode == 2 and p.stderr.startswith("error:") and len(p.stderr.strip().splitlines()) == 1
    p = cli("show", str(tmp_path / "missing.json"), columns=80)
    assert p.returncode == 2 and "cannot read" in p.stderr


def test_show_rejudges_and_says_when_the_verdict_or_judge_changed(tmp_path, monkeypatch, capsys):
    import types

    from llmlab.cli import commands

    mod = types.ModuleType("llmlab.labs.standin")
    mod.JUDGE_VERSION = 2
    mod.judge = lambda r: [
        Claim("standin.big", "x is big", "> 1", f"{r.tables['t'].x[0]}", bool(r.tables["t"].x[0] > 1))
    ]
    mod.views = lambda r: [View("1. x", "How big is x?", "t", (Col("x", "x"),))]
    monkeypatch.setitem(sys.modules, "llmlab.labs.standin", mod)
    res = LabResult(lab="standin", version=1, judge_version=1, env={"utc_stamp": "20260101T000000Z"})
    res.add_table("t", [{"x": 5}])
    res.claims = [Claim("standin.big", "x is big", "> 1", "5", False)]  # saved by an older, wrong judge
    path = res.save(tmp_path, "cpu")
    commands.show(path, tables="report", json_=False)
    captured = capsys.readouterr()
    assert "judge v2" in captured.err and "v1" in captured.err
    assert "standin.big: does not hold -> holds" in captured.err
    assert "How big is x?" in captured.out and "holds" in captured.out
