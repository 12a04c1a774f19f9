"""Terminal charts read without colour: each series of a line, scatter or bar chart has its own marker."""

from __future__ import annotations

import pandas as pd
import pytest

from llmlab.core.render import _MARKERS, chart_text
from llmlab.core.results import Chart, LabResult


def _result(df: pd.DataFrame) -> LabResult:
    return LabResult(lab="standin", version=1, env={}, config={}, tables={"t": df})


def _plot_area(text: str) -> str:
    """The chart's lines without its title and axis labels (the legend is inside the plot area)."""
    return "\n".join(text.splitlines()[1:-2])


@pytest.mark.parametrize("kind", ["line", "scatter"])
def test_each_series_of_a_line_chart_has_its_own_marker_without_colour(kind):
    df = pd.DataFrame({"n": [1, 2, 3, 4] * 3, "ms": [1, 2, 3, 4, 2, 4, 6, 8, 3, 6, 9, 12],
                       "layout": ["mha"] * 4 + ["gqa"] * 4 + ["mqa"] * 4})
    text = chart_text(_result(df), Chart("growth", "t", "n", "ms", kind=kind, series="layout"), 60, color=False)
    area = _plot_area(text)
    for mark in _MARKERS[:3]:
        assert mark in area, f"series marker {mark!r} missing:\n{text}"
    assert "\x1b[" not in text


def test_each_y_column_is_a_series_with_its_own_marker():
    df = pd.DataFrame({"n": [1, 2, 3, 4], "a_ms": [1, 2, 3, 4], "b_ms": [4, 3, 2, 1]})
    text = chart_text(_result(df), Chart("two", "t", "n", ["a_ms", "b_ms"]), 60, color=False)
    assert _MARKERS[0] in _plot_area(text) and _MARKERS[1] in _plot_area(text)
