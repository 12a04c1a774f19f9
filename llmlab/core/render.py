"""Rendering a LabResult: rich tables, plotext charts sized to the terminal, the claims panel.

Measurement code never prints; the CLI calls `render(result, console)`. When stdout is not a
TTY, rich writes plain text (no colour codes) and charts are drawn without colour.

plotext is pinned below 6: plotext 6 replaced the `plt.plot / plt.build` API used here.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator

import pandas as pd
from rich.console import Console, Group
from rich.panel import Panel
from rich.progress import Progress
from rich.table import Table
from rich.text import Text

from llmlab.core.results import Chart, Claim, LabResult

MAX_ROWS = 40  # longer tables are cut in the terminal; the CSV keeps every row

_VERDICT_STYLE = {True: ("holds", "bold green"), False: ("does not hold", "bold red"), None: ("not measured", "yellow")}


def fmt(v) -> str:
    """Numbers with 4 significant digits, large ones with thousands separators."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, float):
        if v != 0 and (abs(v) >= 1e7 or abs(v) < 1e-3):
            return f"{v:.3e}"
        if abs(v) >= 1000:
            return f"{v:,.0f}"
        return f"{v:.4g}"
    return str(v)


def table(df: pd.DataFrame, title: str = "") -> Table:
    t = Table(title=title, title_justify="left", header_style="bold", show_lines=False)
    for col in df.columns:
        numeric = pd.api.types.is_numeric_dtype(df[col])
        t.add_column(str(col), justify="right" if numeric else "left", overflow="fold")
    for row in df.head(MAX_ROWS).itertuples(index=False):
        t.add_row(*(fmt(v.item() if hasattr(v, "item") else v) for v in row))
    if len(df) > MAX_ROWS:
        t.caption = f"{len(df) - MAX_ROWS} more rows in the CSV"
    return t


def claims_panel(claims: list[Claim]) -> Panel:
    t = Table(show_header=True, header_style="bold", expand=True)
    t.add_column("claim", ratio=3)
    t.add_column("expected", ratio=2)
    t.add_column("measured", ratio=2)
    t.add_column("verdict", no_wrap=True)
    for c in claims:
        label, style = _VERDICT_STYLE[c.holds]
        claim = Text(c.text)
        if c.note:
            claim.append(f"\n{c.note}", style="dim")
        t.add_row(claim, c.expected, c.measured, Text(label, style=style))
    return Panel(t, title="claims", title_align="left")


def chart_text(result: LabResult, chart: Chart, width: int, height: int = 18, color: bool = True) -> str:
    """Draw one Chart with plotext and return it as text."""
    import plotext as plt

    df = result.tables.get(chart.table)
    if df is None or df.empty:
        return f"(chart '{chart.title}': no data)"
    plt.clear_figure()
    plt.plotsize(width, height)
    if not color:
        plt.theme("clear")
    ys = [chart.y] if isinstance(chart.y, str) else list(chart.y)
    if chart.kind in ("bar", "stacked"):
        labels = [str(v) for v in df[chart.x]]
        values = [[_num(v) for v in df[y]] for y in ys]
        if chart.kind == "stacked" and len(ys) > 1:
            plt.stacked_bar(labels, values, labels=ys)
        elif len(ys) > 1:
            plt.multiple_bar(labels, values, labels=ys)
        else:
            plt.bar(labels, values[0], orientation="horizontal" if len(labels) > 8 else "vertical")
    else:
        draw = plt.scatter if chart.kind == "scatter" else plt.plot
        groups = [(None, df)] if chart.series is None else list(df.groupby(chart.series, sort=False))
        for name, g in groups:
            for y in ys:
                sub = g[[chart.x, y]].dropna()
                sub = sub[(sub[chart.x] > 0) & (sub[y] > 0)] if (chart.logx or chart.logy) else sub
                if sub.empty:
                    continue
                label = " ".join(str(p) for p in (name, y if len(ys) > 1 else None) if p is not None) or None
                draw([_num(v) for v in sub[chart.x]], [_num(v) for v in sub[y]], label=label, marker="braille")
        if chart.logx:
            plt.xscale("log")
        if chart.logy:
            plt.yscale("log")
    plt.title(chart.title)
    plt.xlabel(chart.xlabel or chart.x + (" (log)" if chart.logx else ""))
    plt.ylabel(chart.ylabel or (ys[0] if len(ys) == 1 else "") + (" (log)" if chart.logy else ""))
    out = plt.build()
    plt.clear_figure()
    return out if color else _strip_ansi(out)


def _num(v) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        return float("nan")


def _strip_ansi(s: str) -> str:
    import re

    return re.sub(r"\x1b\[[0-9;]*m", "", s)


def render(result: LabResult, console: Console) -> None:
    """Print a LabResult: header, tables, charts, notes, claims."""
    env = result.env
    head = Text(f"llmlab {result.lab}", style="bold")
    head.append(f"  v{result.version}  ·  {env.get('device', {}).get('name', '?')} ({env.get('device', {}).get('device', '?')})")
    head.append(f"\n{env.get('command', '')}  ·  {env.get('utc', '')}", style="dim")
    console.print(Panel(head))
    for name, df in result.tables.items():
        console.print(table(df, title=name))
    width = max(40, min(console.width - 2, 120))
    for ch in result.charts:
        console.print(Text.from_ansi(chart_text(result, ch, width, color=console.is_terminal)))
    if result.notes:
        console.print(Panel(Group(*(Text("- " + n) for n in result.notes)), title="notes", title_align="left"))
    if result.claims:
        console.print(claims_panel(result.claims))
    if result.interrupted:
        console.print("[yellow]interrupted: partial results[/]")


def track(progress: Progress | None, items: Iterable, description: str, total: int | None = None) -> Iterator:
    """Iterate `items`, advancing a progress bar when there is one (labs never print)."""
    if progress is None:
        yield from items
        return
    if total is None and hasattr(items, "__len__"):
        total = len(items)  # type: ignore[arg-type]
    task = progress.add_task(description, total=total)
    try:
        for item in items:
            yield item
            progress.advance(task)
    finally:
        progress.remove_task(task)
