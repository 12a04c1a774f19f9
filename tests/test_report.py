"""`llmlab report` (the HTML page) and `python -m llmlab.tools.readme` (the README's claims table).

The page is built from a fixture folder of two hand-made runs of a fixture lab (one "GPU"
machine, one CPU), registered as llmlab.labs.report_fixture: no real lab runs here. The browser
test (tests/test_report_browser.py) opens the same page in headless Chromium.
"""

from __future__ import annotations

import base64
import io
import json
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest

from llmlab.core.render import fmt
from llmlab.core.results import Chart, Claim, Col, LabResult, View
from llmlab.tools import readme
from llmlab.tools.report import _run_head, cell, chart_figure, load_runs, write_report

LAB = "report-fixture"
MODULE = "llmlab.labs.report_fixture"
REPO = Path(__file__).resolve().parents[1]

GPU_CARD = {"device": "cuda:0", "name": "NVIDIA H100 80GB HBM3", "compute_capability": "9.0", "sm_count": 132,
            "memory_bytes": 85_000_000_000, "l2_bytes": 52_428_800, "power_limit_w": None, "driver": "555.42",
            "cuda_runtime": "12.4", "versions": {"torch": "2.13.0"},
            "cpu": {"model": "Intel Xeon", "physical": 32, "logical": 64, "isa": {"avx2": True}}}
CPU_CARD = {"device": "cpu", "name": "AMD EPYC", "cpu": {"model": "AMD EPYC", "physical": 2, "logical": 2,
            "isa": {"avx2": True, "avx512f": True, "amx_bf16": False}, "caches_bytes": {"L2": 2**20, "L3": 32 * 2**20},
            "memory_bytes": 25 * 2**30}, "versions": {"python": "3.11.7", "torch": "2.13.0+cpu"}}


# -- the fixture lab: judge, views, figures (pure, from the tables)


def _judge(result: LabResult) -> list[Claim]:
    best = float(result.tables["sweep"]["tokens_per_s"].max())
    return [
        Claim(id="report-fixture.fast", text="decode reaches 100 tokens/s", expected=">= 100 tokens/s",
               measured=f"{best:.0f} tokens/s", holds=best >= 100, note="" if best >= 100 else "too slow here"),
        Claim(id="report-fixture.gpu_only", text="a GPU-only check", expected="-", measured="-", holds=None,
              note="not measured: no GPU"),
    ]


def _views(result: LabResult) -> list[View]:
    return [
        View("1. Batch sweep", "How do time and throughput grow with the batch?", "sweep",
             (Col("batch", "batch", "int"), Col("ms_per_token", "ms / token"), Col("tokens_per_s", "tokens / s", "int"),
              Col("speedup", "x batch 1", "x"), Col("peak_share", "% of peak", "%"), Col("kind", "kind", "text", 6)),
             rows=lambda df: df.sort_values("batch"),
             chart=Chart("tokens / s vs batch", "sweep", "batch", "tokens_per_s", series="kind", logx=True, logy=True)),
        View("2. Where the time goes", "Which phase dominates each scenario?", "phases",
             (Col("scenario", "scenario", "text"), Col("queue_ms", "queue ms"), Col("prefill_ms", "prefill ms")),
             chart=Chart("phases per scenario", "phases", "scenario", ["queue_ms", "prefill_ms"], kind="stacked")),
        View("3. Tensor cores", "How much faster is BF16 on tensor cores?", "tensor_cores",
             (Col("dtype", "dtype", "text"), Col("tflops", "TFLOP/s"))),
    ]


def _figures(result: LabResult):
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(4, 2.5))
    df = result.tables["sweep"].query("kind == 'eager'")
    ax.plot(df["batch"], df["ms_per_token"], marker="o")
    return [("ms / token vs batch (figures())", fig)]


def _module() -> types.ModuleType:
    mod = types.ModuleType(MODULE)
    mod.LAB, mod.VERSION, mod.JUDGE_VERSION = LAB, 1, 2
    mod.judge, mod.views, mod.figures = _judge, _views, _figures
    mod.headline = lambda result, claims: f"best decode: {claims[0].measured}"
    return mod


@pytest.fixture(scope="module")
def fixture_lab():
    with pytest.MonkeyPatch.context() as mp:
        mod = _module()
        mp.setitem(sys.modules, MODULE, mod)
        yield mod


def make_run(card: dict, stamp: str, scale: float, judge_version: int = 2) -> LabResult:
    res = LabResult(lab=LAB, version=1)
    batches = [1, 2, 4, 8, 16]
    res.add_table("sweep", [
        {"batch": b, "ms_per_token": 5.0 * (1 + b / 8) / scale / f, "tokens_per_s": scale * f * 200 * b / (1 + b / 8),
         "speedup": b / (1 + b / 8), "peak_share": 0.01 * b, "kind": k}
        for b in batches for k, f in (("eager", 0.6), ("compiled-graph", 1.0))
    ])
    res.add_table("phases", [
        {"scenario": "idle", "queue_ms": 0.5, "prefill_ms": 12.0 / scale},
        {"scenario": "busy", "queue_ms": 40.0, "prefill_ms": 12.0 / scale},
    ])
    res.env = {"device": card, "utc": stamp, "utc_stamp": stamp, "command": f"llmlab {LAB} --quick", "quick": True}
    res.notes.append("fixture run: numbers made up for the report test")
    res.claims = _judge(res)
    res.judge_version = judge_version
    if card["device"] == "cpu":
        res.skipped = {"tensor_cores": "no GPU"}
    else:
        res.add_table("tensor_cores", [{"dtype": "bf16", "tflops": 700.0}, {"dtype": "fp32", "tflops": 60.0}])
    return res


def make_results(root: Path, broken: bool = False) -> Path:
    """Two runs of the fixture lab (a GPU and a CPU machine) under root/<lab>/; with broken, two files to skip."""
    folder = root / LAB
    folder.mkdir(parents=True)
    (folder / "20261201T100000Z-cuda0.json").write_text(make_run(GPU_CARD, "20261201T100000Z", 10.0).to_json())
    cpu_run = make_run(CPU_CARD, "20261202T100000Z", 0.02, judge_version=1)
    (folder / "20261202T100000Z-cpu.json").write_text(cpu_run.to_json())
    if broken:
        (folder / "truncated.json").write_text('{"lab": "report-fixt')
        (root / "no-such-lab").mkdir()
        other = json.loads(make_run(CPU_CARD, "20261203T000000Z", 1.0).to_json())
        other["lab"] = "no-such-lab"
        (root / "no-such-lab" / "x.json").write_text(json.dumps(other))
    return root


@pytest.fixture(scope="module")
def report(tmp_path_factory, fixture_lab):
    """(path, runs, skipped, page) of the report on the fixture folder (two runs, two broken files)."""
    root = make_results(tmp_path_factory.mktemp("results"), broken=True)
    path, n_runs, n_skipped = write_report(root)
    return path, n_runs, n_skipped, path.read_text()


def _pngs(page: str) -> list[bytes]:
    return [base64.b64decode(s) for s in re.findall(r'src="data:image/png;base64,([^"]+)"', page)]


# -- the page


def test_report_puts_both_machines_side_by_side_with_views_verdicts_and_plots(report):
    from PIL import Image

    path, n_runs, n_skipped, page = report
    assert path.name == "report.html" and n_runs == 2
    section = page[page.index(f'id="lab-{LAB}"'):]
    # one section, two columns: the GPU run first, then the CPU run
    assert "repeat(2, minmax" in section
    assert section.index("NVIDIA H100 80GB HBM3") < section.index("AMD EPYC")
    # the device cards in the header
    assert "compute capability" in page and "50 MiB" in page and "power limit" not in page  # None: not shown
    assert "avx512f" in page and "amx_bf16" not in page
    # each view's title, question and human headers, cells formatted by the Col
    for text in ("1. Batch sweep", "How do time and throughput grow with the batch?", "ms / token", "x batch 1",
                 "% of peak", "queue ms"):
        assert text in section
    assert "compi…" in section  # width 6 cuts the text column
    # peak_share 0.16 as "%", 16 / 3 as "x" (as the terminal writes it)
    assert "16%" in section and fmt(16 / 3, "x") in section
    # verdicts: the GPU run holds, the CPU run does not; the headline of each
    assert section.count('pill ok">holds') == 1 and section.count('pill bad">does not hold') == 1
    assert section.count('pill na">not measured') == 2
    assert "best decode: 10667 tokens/s" in section and "too slow here" in section
    # a part only one machine measured: the table on the GPU side, the reason on the CPU side
    tc = section[section.index("3. Tensor cores"):]
    assert tc.index("TFLOP/s") < tc.index("not measured: no GPU")
    # 2 view charts per run + 1 figure per run, each a real PNG
    pngs = _pngs(page)
    assert len(pngs) == 6
    for png in pngs:
        im = Image.open(io.BytesIO(png))
        assert im.format == "PNG" and im.width > 200 and im.height > 100


def test_report_rejudges_and_says_so_when_the_saved_judge_version_differs(tmp_path, fixture_lab):
    make_results(tmp_path)
    path = tmp_path / "20261202T100000Z-cpu.json"
    d = json.loads((tmp_path / LAB / path.name).read_text())
    for c in d["claims"]:  # the saved verdict says "holds"; the current judge says "does not hold"
        c["holds"] = True
        c.pop("verdict", None)
    (tmp_path / LAB / path.name).write_text(json.dumps(d))
    runs, _ = load_runs(tmp_path)
    cpu = next(r for r in runs if r.card["device"] == "cpu")
    assert cpu.claims[0].holds is False
    assert cpu.judge_note == "re-judged with judge v2; the run was saved with judge v1"
    assert next(r for r in runs if r.card["device"] != "cpu").judge_note == ""
    assert "re-judged with judge v2" in _run_head(cpu)


def test_broken_and_unknown_files_are_listed_and_do_not_break_the_page(report):
    _, n_runs, n_skipped, page = report
    assert (n_runs, n_skipped) == (2, 2)
    assert "2 files skipped" in page and 'id="skipped"' in page
    assert "truncated.json" in page and "does not parse" in page
    assert "unknown lab &#x27;no-such-lab&#x27;" in page
    assert len(_pngs(page)) == 6  # the good runs are all there


def test_report_is_self_contained(report):
    page = report[3]
    assert "<script" not in page.lower()
    assert not re.search(r"https?://", page)
    for url in re.findall(r'(?:src|href)="([^"]*)"', page):
        assert url.startswith(("data:", "#")), url


def test_a_lab_without_views_shows_its_raw_tables(tmp_path, fixture_lab, monkeypatch):
    monkeypatch.delattr(fixture_lab, "views")
    make_results(tmp_path)
    page = write_report(tmp_path)[0].read_text()
    assert "<h4>sweep</h4>" in page and "<h4>phases</h4>" in page
    assert "<th class=\"num\">ms_per_token</th>" in page and "more rows in the CSV" not in page  # 10 rows, all shown
    assert len(_pngs(page)) == 2  # only the figures() ones


def test_older_runs_of_a_machine_are_folded_below_the_newest(tmp_path, fixture_lab, monkeypatch):
    monkeypatch.delattr(fixture_lab, "views")  # raw tables only: nothing to draw, the layout is what is tested
    monkeypatch.delattr(fixture_lab, "figures")
    make_results(tmp_path)
    (tmp_path / LAB / "20261130T000000Z-cpu.json").write_text(make_run(CPU_CARD, "20261130T000000Z", 0.5).to_json())
    page = write_report(tmp_path)[0].read_text()
    top, folded = page.split("<details>")
    assert "repeat(2, minmax" in top and "20261202T100000Z-cpu.json" in top and "20261130T000000Z-cpu.json" not in top
    assert folded.startswith("<summary>1 older run of this lab</summary>") and "20261130T000000Z-cpu.json" in folded


def test_cell_formats_follow_the_col_fmt():
    assert cell(16 / 3, "x") == fmt(16 / 3, "x") and cell(16 / 3, "x") in ("5.33x", "5.333x")  # as the terminal report
    assert cell(0.9312, "%") == "93.1%"
    assert cell(1234567.4, "int") == "1,234,567"
    assert cell(3.14159, ".2f") == "3.14"
    assert cell(3.14159, "d") == "3.14159"  # a spec that does not fit the value: the plain value, no crash
    assert cell("compiled-graph", "text", 6) == "compi…"
    assert cell(12345.678) == "12,346" and cell(0.012345) == "0.01235" and cell(7) == "7"
    assert cell(float("nan")) == "-" and cell(None, "x") == "-" and cell(True) == "yes"


@pytest.mark.parametrize(
    ("kind", "y", "series", "lines", "bars"),
    [("line", "tokens_per_s", "kind", 2, 0), ("scatter", "tokens_per_s", None, 0, 0),
     ("bar", "tokens_per_s", None, 0, 5), ("stacked", ["ms_per_token", "speedup"], None, 0, 10)],
)
def test_chart_kinds_draw_one_artist_per_series_or_bar(kind, y, series, lines, bars):
    df = make_run(CPU_CARD, "s", 1.0).tables["sweep"]
    df = df if series else df[df["kind"] == "eager"]  # 5 rows: vertical bars
    fig = chart_figure(df, Chart("t", "sweep", "batch", y, kind=kind, series=series, logy=True))
    ax = fig.axes[0]
    assert len(ax.lines) == lines and len(ax.patches) == bars
    if kind == "scatter":
        assert len(ax.collections) == 1
    assert ax.get_yscale() == "log"


def test_matplotlib_is_imported_only_when_drawing():
    code = "import sys, llmlab.cli, llmlab.tools.report, llmlab.tools.readme; print('matplotlib' in sys.modules)"
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "False"


def test_cli_report_writes_the_page_and_a_missing_folder_exits_2(tmp_path, cli):
    (tmp_path / "roofline").mkdir()
    (tmp_path / "roofline" / "broken.json").write_text("not json")
    p = cli("report", str(tmp_path))  # in this process (tests/conftest.py): no lab runs, one page written
    assert p.returncode == 0, p.stderr
    assert "1 file(s) skipped" in p.stderr
    page = (tmp_path / "report.html").read_text()
    assert "No lab runs found" in page and "broken.json" in page
    p = cli("report", str(tmp_path / "nope"), "-o", str(tmp_path / "x.html"))
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1 and "not a folder" in p.stderr
    assert not (tmp_path / "x.html").exists()


# -- the README's claims table


def test_readme_table_takes_the_newest_run_of_each_lab(tmp_path, fixture_lab):
    make_results(tmp_path)  # the CPU run (newer) does not hold; the GPU run (older) holds
    table = readme.claims_table(tmp_path)
    lines = table.splitlines()
    assert lines[0] == "| lab | claim id | claim | expected | measured | verdict |"
    assert len(lines) == 4
    assert lines[2].startswith(f"| {LAB} | `report-fixture.fast` | decode reaches 100 tokens/s | >= 100 tokens/s |")
    assert lines[2].endswith("| does not hold |") and "| 21 tokens/s |" in lines[2]
    assert lines[3].endswith("| not measured |")


def test_readme_rewrite_replaces_only_the_block(tmp_path, fixture_lab):
    make_results(tmp_path)
    md = tmp_path / "README.md"
    md.write_text(f"# x\n\nbefore\n{readme.BEGIN}\nold | table\n{readme.END}\nafter\n")
    assert readme.main(["--results", str(tmp_path), "--readme", str(md), "--write"]) == 0
    text = md.read_text()
    assert text.startswith("# x\n\nbefore\n") and text.endswith(f"{readme.END}\nafter\n")
    assert readme.block(text) == readme.claims_table(tmp_path)
    assert "old | table" not in text
    md.write_text("no markers\n")
    assert readme.main(["--results", str(tmp_path), "--readme", str(md), "--write"]) == 2


def test_readme_claims_block_matches_the_saved_results():
    text = (REPO / "README.md").read_text(encoding="utf-8")
    if not (readme.block(text) or "").strip():
        pytest.skip(f"README.md has no {readme.BEGIN} / {readme.END} markers yet, or nothing between them "
                    "(`python -m llmlab.tools.readme --write` fills them)")
    skipped: list = []
    table = readme.claims_table(REPO / readme.REFERENCE, skipped)
    assert skipped == [], ("results/reference/ holds files no lab can read "
                           "(they would be missing from the README's table)")
    assert readme.block(text) == table, ("README's claims table differs from results/reference/: "
                                         "run `python -m llmlab.tools.readme --write`")
