"""The page's plots: a view's Chart drawn with matplotlib (Agg backend) and inlined as a base64 PNG <img>.

matplotlib is imported only when a plot is drawn (in _pyplot and the tick helpers): importing the report,
as `llmlab --help` does through the tools, must not pay for it.
"""

from __future__ import annotations

import base64
import io
import math
from typing import Any

import pandas as pd

from llmlab.core.results import LabResult
from llmlab.tools.report.text import esc, failure

STYLE = {  # one look for the report's charts and the labs' figures(): no box, a light grid, small legends
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "legend.frameon": False,
    "legend.fontsize": 8,
}


def _pyplot():
    import matplotlib  # lazy: matplotlib costs start-up time and only drawing needs it

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def figure_png(fig) -> bytes:
    """The figure as PNG bytes; log axes left on matplotlib's default 3x10^1 labels get plain ones."""
    from matplotlib.ticker import LogFormatterSciNotation  # lazy, as in _pyplot

    for ax in fig.axes:
        for axis, scale in ((ax.xaxis, ax.get_xscale()), (ax.yaxis, ax.get_yscale())):
            if scale == "log" and type(axis.get_major_formatter()) is LogFormatterSciNotation:
                _plain_log_ticks(axis)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight", facecolor="white")
    _pyplot().close(fig)
    return buf.getvalue()


def _powers_of_two(values) -> bool:
    vals = [float(v) for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    return len(vals) > 1 and all(v > 0 and math.log2(v).is_integer() for v in vals)


def chart_figure(df: pd.DataFrame, chart: Any, headers: dict[str, str] | None = None, title: bool = True):
    """Draw a Chart (line | scatter | bar | stacked; series; logx/logy) from df into a matplotlib Figure."""
    plt = _pyplot()
    headers = headers or {}
    ys = [chart.y] if isinstance(chart.y, str) else list(chart.y)
    fig, ax = plt.subplots(figsize=(6.4, 3.5))
    kind = getattr(chart, "kind", "line")
    if kind in ("bar", "stacked"):
        _draw_bars(ax, df, chart, kind, ys, headers)
    else:
        _draw_lines(ax, df, chart, kind, ys, headers)
    if title:
        ax.set_title(chart.title, fontsize=11, loc="left")
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    return fig


def _draw_bars(ax, df: pd.DataFrame, chart: Any, kind: str, ys: list[str], headers: dict[str, str]) -> None:
    """Bars (grouped, or stacked for kind "stacked"); horizontal when the categories are many or long."""
    labels = [str(v) for v in df[chart.x]]
    pos = list(range(len(labels)))
    horizontal = len(labels) > 8 or max((len(s) for s in labels), default=0) > 12
    if kind == "stacked":
        base = [0.0] * len(labels)
        for y in ys:
            vals = [_num(v) for v in df[y]]
            vals = [0.0 if math.isnan(v) else v for v in vals]
            if horizontal:
                ax.barh(pos, vals, 0.7, left=base, label=headers.get(y, y))
            else:
                ax.bar(pos, vals, 0.7, bottom=base, label=headers.get(y, y))
            base = [a + b for a, b in zip(base, vals, strict=True)]
    else:
        bar = ax.barh if horizontal else ax.bar
        w = 0.8 / len(ys)
        for i, y in enumerate(ys):
            p = [q - 0.4 + w * (i + 0.5) for q in pos]
            bar(p, [_num(v) for v in df[y]], w, label=headers.get(y, y))
    if horizontal:
        ax.set_yticks(pos, labels)
        ax.invert_yaxis()
    else:
        tilted = len(labels) > 4
        ax.set_xticks(pos, labels, rotation=30 if tilted else 0, ha="right" if tilted else "center")
    if chart.logy or chart.logx:
        (ax.set_xscale if horizontal else ax.set_yscale)("log")
        _plain_log_ticks(ax.xaxis if horizontal else ax.yaxis)
    ax.grid(axis="x" if horizontal else "y", alpha=0.3)
    cat_label = chart.xlabel or headers.get(chart.x, chart.x)
    val_label = chart.ylabel or (headers.get(ys[0], ys[0]) if len(ys) == 1 else "")
    ax.set_xlabel(val_label if horizontal else cat_label)
    ax.set_ylabel(cat_label if horizontal else val_label)
    if len(ys) > 1:
        ax.legend(fontsize=8, frameon=False, loc="upper left", bbox_to_anchor=(1.0, 1.0))


def _draw_lines(ax, df: pd.DataFrame, chart: Any, kind: str, ys: list[str], headers: dict[str, str]) -> None:
    """Lines (or points for kind "scatter"): one per series and y column; non-positive values dropped on log axes."""
    groups = [(None, df)] if not getattr(chart, "series", None) else list(df.groupby(chart.series, sort=False))
    n_lines = 0
    for name, g in groups:
        for y in ys:
            sub = g[[chart.x, y]].apply(pd.to_numeric, errors="coerce").dropna()
            if chart.logx:
                sub = sub[sub[chart.x] > 0]
            if chart.logy:
                sub = sub[sub[y] > 0]
            if sub.empty:
                continue
            parts = (name, headers.get(y, y) if len(ys) > 1 else None)
            label = " · ".join(str(p) for p in parts if p is not None) or None
            if kind == "scatter":
                ax.scatter(sub[chart.x], sub[y], s=22, label=label, alpha=0.85)
            else:
                sub = sub.sort_values(chart.x)
                ax.plot(sub[chart.x], sub[y], marker="o", markersize=3.5, linewidth=1.6, label=label)
            n_lines += 1
    if chart.logx:
        ax.set_xscale("log", base=2 if _powers_of_two(df[chart.x]) else 10)
        _plain_log_ticks(ax.xaxis)
    if chart.logy:
        ax.set_yscale("log")
        _plain_log_ticks(ax.yaxis)
    ax.set_xlabel(chart.xlabel or headers.get(chart.x, chart.x))
    ax.set_ylabel(chart.ylabel or (headers.get(ys[0], ys[0]) if len(ys) == 1 else ""))
    ax.grid(alpha=0.3)
    if chart.logx or chart.logy:
        ax.grid(alpha=0.08, which="minor")
    if n_lines > 1:  # outside the plot, on the right: never over a line
        ax.legend(fontsize=8, frameon=False, loc="upper left", bbox_to_anchor=(1.0, 1.0), ncol=2 if n_lines > 12 else 1)


def _plain_log_ticks(axis) -> None:
    """Log-axis ticks as plain numbers (1, 2, 4, 1,000) rather than 2x10^3, when the range allows."""
    from matplotlib.ticker import FuncFormatter  # lazy, as in _pyplot

    lo, hi = sorted(axis.get_view_interval())
    if lo <= 0 or not (1e-3 <= lo and hi < 1e7):
        return

    def plain(v: float) -> str:
        return f"{v:,.0f}" if v >= 100 else f"{v:g}"

    few_decades = hi / lo < 300  # then label the 2s and 5s between the powers of ten too
    axis.set_major_formatter(FuncFormatter(lambda v, _: plain(v)))
    axis.set_minor_formatter(FuncFormatter(lambda v, _: plain(v) if few_decades and f"{v:e}"[0] in "25" else ""))


def _num(v) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        return float("nan")


def img(png: bytes, alt: str) -> str:
    """PNG bytes as an inline <img> (a data: URL, RFC 2397)."""
    data = base64.b64encode(png).decode("ascii")
    return f'<img class="plot" alt="{esc(alt)}" src="data:image/png;base64,{data}">'


def chart_html(result: LabResult, chart: Any, headers: dict[str, str] | None = None, title: bool = True) -> str:
    """The chart drawn from its table in result, as an <img>; a note in its place when it cannot be drawn."""
    df = result.tables.get(chart.table)
    if df is None or df.empty:
        return f'<p class="muted">(chart “{esc(chart.title)}”: table {esc(chart.table)} is empty or missing)</p>'
    try:
        with _pyplot().rc_context(STYLE):
            return img(figure_png(chart_figure(df, chart, headers, title)), chart.title)
    except Exception as exc:  # a chart that cannot be drawn is reported, the page goes on
        _pyplot().close("all")
        return f'<p class="warn">chart “{esc(chart.title)}” could not be drawn: {esc(failure(exc))}</p>'


def figures_html(figures, result: LabResult) -> list[str]:
    """A lab's figures(result) as captioned <img>s; one warning in their place when figures() fails."""
    try:
        with _pyplot().rc_context(STYLE):
            return [img(figure_png(f), t) + f'<div class="cap">{esc(t)}</div>' for t, f in figures(result)]
    except Exception as exc:
        _pyplot().close("all")
        return [f'<p class="warn">figures() failed on this run ({esc(failure(exc))})</p>']
