"""A run cut short keeps its verdicts where it can: judges tolerate missing tables, and an interrupted
run's partial tables (Ctrl-C mid-sweep) neither crash the judge nor the report.

Works on the committed quick runs in results/reference/ (one per lab), cut in the ways a run gets cut.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from llmlab.core.render import report_lines
from llmlab.core.results import LabResult
from llmlab.labs import judged, module

SAVED = sorted(Path(__file__).resolve().parents[1].glob("results/reference/*/*.json"))


def _load(path: Path, tables: dict | None = None, interrupted: bool = False) -> LabResult:
    r = LabResult.from_json(path.read_text())
    if tables is not None:
        r.tables = tables
    r.interrupted = interrupted
    return r


def test_every_lab_has_a_saved_run():
    from test_render import _labs

    assert {p.parent.name for p in SAVED} >= set(_labs())


@pytest.mark.parametrize("path", SAVED, ids=lambda p: p.parent.name)
def test_judge_tolerates_any_missing_table(path):
    full = _load(path)
    mod = module(full.lab)
    for gone in [None, *full.tables]:  # None: no table at all
        kept = {} if gone is None else {k: v for k, v in full.tables.items() if k != gone}
        r = _load(path, kept)
        claims = mod.judge(r)
        assert all(c.id.startswith(full.lab.replace("-", "_")) for c in claims)
        views = mod.views(r)
        report_lines(r, 80, views=views, headline=mod.headline(r, claims) if hasattr(mod, "headline") else "")


@pytest.mark.parametrize("path", SAVED, ids=lambda p: p.parent.name)
@pytest.mark.parametrize("rows", [0, 1, 0.5])
def test_an_interrupted_run_with_partial_tables_is_judged_and_rendered(path, rows):
    full = _load(path)
    cut = {k: v.head(rows if isinstance(rows, int) else max(1, len(v) // 2)) for k, v in full.tables.items()}
    r = _load(path, cut, interrupted=True)
    claims, views, headline = judged(r)
    text = "\n".join(line.plain for line in report_lines(r, 80, views=views, headline=headline))
    assert "interrupted" in text


@pytest.mark.parametrize("path", SAVED, ids=lambda p: p.parent.name)
def test_a_run_stopped_in_its_last_table_keeps_the_other_verdicts(path):
    full = _load(path)
    last = list(full.tables)[-1]
    before = {c.id for c in module(full.lab).judge(_load(path, {k: v for k, v in full.tables.items() if k != last}))}
    r = _load(path, {k: (v.head(1) if k == last else v) for k, v in full.tables.items()}, interrupted=True)
    claims, _, _ = judged(r)
    assert before <= {c.id for c in claims}
