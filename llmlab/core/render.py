"""The terminal report: a lab's views (question, compact table, chart), then what the run found.

Measurement code never prints; the CLI calls `render(result, console, ...)` after judging and
saving. The report fits the console's width (rich uses 80 columns when stdout is not a TTY):
tables are laid out here, not by rich, so that headers wrap only at spaces, numbers never fold,
and a column that does not fit is dropped with a pointer to `--tables all` instead of being
squeezed into a letter stack. `--tables all` adds every table in full, split into column
groups that fit the width. Charts are drawn with plotext at the report's width.

Off a TTY (a pipe, a file, `less`, CI) the report is plain ASCII: box-drawing and braille
characters become -, |, + and *, so every line is as many bytes as columns and any tool that
counts bytes agrees with the width.

plotext is pinned below 6: plotext 6 replaced the `plt.plot / plt.build` API used here.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Iterable, Iterator
from pathlib import Path

import pandas as pd
from rich.console import Console
from rich.progress import Progress
from rich.text import Text

from llmlab.core.results import Chart, Claim, Col, LabResult, View

MAX_CHART_WIDTH = 100  # a chart wider than this is harder to read, not easier
CHART_HEIGHT = 12  # rows of a terminal chart: enough for a trend, small enough for the line budget
MAX_NOTES = 5  # notes shown in the report; --tables all shows them all
INDENT = "  "
GAP = "  "  # between table columns

_ASCII = str.maketrans({"─": "-", "━": "=", "│": "|", "┌": "+", "┐": "+", "└": "+", "┘": "+", "├": "+",
                        "┤": "+", "┬": "+", "┴": "+", "┼": "+", "…": "~", "␣": "_", "⏎": "|", "·": "-",
                        "•": "*", "▇": "#", "█": "#", "▄": "#", "▀": "#", "▌": "#", "▐": "#"})


def ascii_line(line: str) -> str:
    """The same line in ASCII, one character per column (what a pipe or a file gets)."""
    line = line.translate(_ASCII)
    return "".join(ch if ch < "\x80" else ("*" if "\u2800" <= ch <= "\u28ff" else "?") for ch in line)


VERDICT = {True: ("holds", "bold green"), False: ("does not hold", "bold red"), None: ("not measured", "yellow")}
LABEL_W = max(len(v[0]) for v in VERDICT.values())


# ---------------------------------------------------------------- numbers


def fmt(v, spec: str = "") -> str:
    """One cell: 4 significant digits by default; see Col.fmt for the other specs."""
    if hasattr(v, "item") and not isinstance(v, (str, bytes)):
        try:
            v = v.item()
        except (ValueError, TypeError):
            pass
    if v is None or (isinstance(v, float) and math.isnan(v)) or v is pd.NA:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if spec == "text" or isinstance(v, str):
        return str(v)
    if not isinstance(v, (int, float)):
        return str(v)
    if isinstance(v, float) and math.isinf(v):
        return "inf" if v > 0 else "-inf"
    if spec == "x":
        return f"{_sig(v, 3)}x"
    if spec == "%":
        return f"{_sig(100 * v, 3)}%"
    if spec == "int":
        return f"{round(v):,}"
    if spec:
        return format(v, spec)
    if isinstance(v, int):
        return f"{v:,}"
    return _sig(v)


def _sig(v: float, digits: int = 4) -> str:
    """`digits` significant digits, without scientific notation for ordinary magnitudes."""
    if v == 0:
        return "0"
    a = abs(v)
    if a >= 1e7 or a < 1e-3:
        return f"{v:.{digits - 1}e}"
    if a >= 10 ** (digits - 1):
        return f"{v:,.0f}"
    decimals = digits - 1 - math.floor(math.log10(a))
    s = f"{v:.{decimals}f}"
    return s.rstrip("0").rstrip(".") if "." in s else s


# ---------------------------------------------------------------- tables


def table_lines(
    df: pd.DataFrame, cols: Iterable[Col], width: int, max_rows: int | None = None
) -> tuple[list[Text], int]:
    """Lay out `df[cols]` in `width` characters. Returns (lines, number of columns left out).

    Each column is as wide as its longest cell and its longest header word; leftover width
    goes to columns whose header would otherwise wrap. Columns that still do not fit are
    dropped from the right (the first one is always kept).
    """
    cols = [c for c in cols if c.key in df.columns]
    if not cols:  # e.g. a view's rows() found nothing complete in a run stopped by Ctrl-C
        return [Text(INDENT + "(no complete rows)", style="dim")], 0
    shown = df if max_rows is None else df.head(max_rows)
    cells = [[_cut(fmt(v, c.fmt), c.width) for v in shown[c.key].tolist()] for c in cols]
    numeric = [pd.api.types.is_numeric_dtype(df[c.key]) and c.fmt != "text" for c in cols]
    need = [max([len(w) for w in c.header.split()] + [len(x) for x in cells[i]] + [1]) for i, c in enumerate(cols)]
    full = [max([len(c.header)] + [len(x) for x in cells[i]]) for i, c in enumerate(cols)]
    room = width - len(INDENT)
    keep, used = 0, 0
    for i, w in enumerate(need):
        extra = w + (len(GAP) if i else 0)
        if i and used + extra > room:
            break
        keep, used = i + 1, used + extra
    widths = need[:keep]
    slack = room - used
    for i in range(keep):  # widen columns whose header wraps, leftmost first
        grow = min(full[i] - widths[i], slack)
        if grow > 0:
            widths[i] += grow
            slack -= grow
    heads = [textwrap.wrap(cols[i].header, widths[i], break_long_words=False, break_on_hyphens=False) or [""]
             for i in range(keep)]
    depth = max(len(h) for h in heads)
    lines: list[Text] = []
    for r in range(depth):  # headers bottom-aligned, like a spreadsheet's
        parts = []
        for i in range(keep):
            h = heads[i]
            word = h[r - (depth - len(h))] if r >= depth - len(h) else ""
            parts.append(word.rjust(widths[i]) if numeric[i] else word.ljust(widths[i]))
        lines.append(Text(INDENT + GAP.join(parts).rstrip(), style="bold"))
    lines.append(Text(INDENT + GAP.join("─" * w for w in widths)))
    for row in range(len(shown)):
        parts = [cells[i][row].rjust(widths[i]) if numeric[i] else cells[i][row].ljust(widths[i]) for i in range(keep)]
        lines.append(Text(INDENT + GAP.join(parts).rstrip()))
    return lines, len(cols) - keep


def _cut(s: str, n: int) -> str:
    s = s.replace("\n", "⏎")
    return s if not n or len(s) <= n else s[: max(n - 1, 1)] + "…"


def full_table_lines(name: str, df: pd.DataFrame, width: int) -> list[Text]:
    """Every row and column of a table, split into column groups that fit the width."""
    out = [Text(f"{name}  ({len(df)} rows)", style="bold")]
    cols = [Col(str(c), str(c)) for c in df.columns]
    if not cols:
        return out + [Text(INDENT + "(empty)")]
    first, rest = cols[0], cols[1:]
    while True:
        lines, left = table_lines(df, [first, *rest], width)
        out += lines
        if not left or left == len(rest):  # nothing more, or a column too wide even alone
            if left:
                out.append(Text(INDENT + f"({left} columns wider than the terminal: see the CSV)", style="dim"))
            return out
        rest = rest[len(rest) - left:]
        out.append(Text(""))


# ---------------------------------------------------------------- charts


# Without colour (a pipe, a saved report) each series is drawn with its own character, so the
# legend still tells them apart; with colour, braille dots in the series' colours.
_MARKERS = "*o+x#%@="


def chart_text(result: LabResult, chart: Chart, width: int, height: int = CHART_HEIGHT, color: bool = True) -> str:
    """Draw one Chart with plotext and return it as text (no line wider than `width`)."""
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
        marks = None if color else list(_MARKERS)[: len(ys)]
        if chart.kind == "stacked" and len(ys) > 1:
            plt.stacked_bar(labels, values, labels=ys, marker=marks)
        elif len(ys) > 1:
            plt.multiple_bar(labels, values, labels=ys, marker=marks)
        else:
            plt.bar(labels, values[0], orientation="horizontal" if len(labels) > 8 else "vertical")
    else:
        draw = plt.scatter if chart.kind == "scatter" else plt.plot
        groups = [(None, df)] if chart.series is None else list(df.groupby(chart.series, sort=False))
        marks = iter(_MARKERS * (1 + len(groups) * len(ys) // len(_MARKERS)))
        for name, g in groups:
            for y in ys:
                mark = next(marks)
                sub = g[[chart.x, y]].dropna()
                sub = sub[(sub[chart.x] > 0) & (sub[y] > 0)] if (chart.logx or chart.logy) else sub
                if sub.empty:
                    continue
                label = " ".join(str(p) for p in (name, y if len(ys) > 1 else None) if p is not None) or None
                draw([_num(v) for v in sub[chart.x]], [_num(v) for v in sub[y]], label=label,
                     marker="braille" if color else mark)
        if chart.logx:
            plt.xscale("log")
        if chart.logy:
            plt.yscale("log")
    plt.title(chart.title)
    plt.xlabel(chart.xlabel or chart.x + (" (log)" if chart.logx else ""))
    plt.ylabel(chart.ylabel or (ys[0] if len(ys) == 1 else "") + (" (log)" if chart.logy else ""))
    out = plt.build()
    plt.clear_figure()
    out = out if color else _strip_ansi(out)
    return "\n".join(line.rstrip() for line in out.splitlines())


def _num(v) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        return float("nan")


def _strip_ansi(s: str) -> str:
    import re

    return re.sub(r"\x1b\[[0-9;]*m", "", s)


# ---------------------------------------------------------------- the report


def _wrap(text: str, width: int, first: str = "", rest: str | None = None, style: str = "") -> list[Text]:
    rest = first if rest is None else rest
    lines = textwrap.wrap(text, width, initial_indent=first, subsequent_indent=rest, break_on_hyphens=False) or [first]
    return [Text(line, style=style) for line in lines]


def header_lines(result: LabResult, width: int) -> list[Text]:
    env, dev = result.env, result.env.get("device", {})
    quick = "  |  --quick" if env.get("quick") else ""
    title = Text(f"llmlab {result.lab}", style="bold")
    title.append(f"  v{result.version}  |  {dev.get('name', '?')} ({dev.get('device', '?')}){quick}")
    lines = [Text("━" * width), *_wrap(title.plain, width, style="bold")]
    lines += _wrap(f"$ {env.get('command', '')}   ({env.get('utc', '')})", width, rest="  ", style="dim")
    return lines + [Text("━" * width)]


def view_lines(result: LabResult, view: View, width: int, color: bool) -> list[Text]:
    lines = [
        Text(""),
        *_wrap(view.title, width, style="bold cyan"),
        *_wrap(view.question, width, INDENT, style="italic"),
    ]
    df = result.tables.get(view.table)
    if df is None or df.empty:
        why = result.skipped.get(view.table, "no data in this run")
        return lines + _wrap(f"not measured: {why}", width, INDENT, INDENT + "  ", style="yellow")
    shown = view.rows(df) if view.rows else df
    body, left = table_lines(shown, view.cols, width, view.max_rows)
    lines += body
    more = []
    if len(shown) > view.max_rows:
        more.append(_count(len(shown) - view.max_rows, "more row"))
    if left:
        more.append(_count(left, "more column"))
    if more:
        lines += _wrap(" and ".join(more) + ": --tables all", width, INDENT, style="dim")
    if view.chart is not None:
        lines.append(Text(""))
        drawn = chart_text(result, view.chart, min(width, MAX_CHART_WIDTH), color=color)
        lines += [Text.from_ansi(line) for line in drawn.splitlines()]
    return lines


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def claim_lines(claims: list[Claim], width: int) -> list[Text]:
    lines: list[Text] = []
    pad = INDENT + " " * (LABEL_W + 2)
    body = max(width - len(pad), 20)
    for c in claims:
        label, style = VERDICT[c.holds]
        text = textwrap.wrap(c.text, body, break_on_hyphens=False) or [""]
        first = Text(INDENT)
        first.append(label.ljust(LABEL_W), style=style)
        first.append("  " + text[0])
        lines.append(first)
        lines += [Text(pad + t) for t in text[1:]]
        unmeasured = c.holds is None and str(c.measured).strip() in ("", "-") and c.note
        if not unmeasured:  # a claim not measured, with its reason: the reason is the line to read
            lines += _wrap(f"measured {c.measured};  expected {c.expected}", width, pad, pad + "  ", style="dim")
        if c.note and c.holds is not True:
            why = c.note.removeprefix("not measured: ")
            lines += _wrap(f"why: {why}", width, pad, pad + "  ", style="dim")
    return lines


def report_lines(result: LabResult, width: int, *, views: list[View] | None = None, headline: str = "",
                 tables: str = "report", saved: Path | None = None, color: bool = False) -> list[Text]:
    """Every line of the report, as rich Texts no wider than `width` (plain ASCII unless `color`)."""
    lines = header_lines(result, width)
    if views is None:  # a lab without views: its tables in full
        views = []
        tables = "all"
    for v in views:
        lines += view_lines(result, v, width, color)
    lines += [Text(""), Text("What this run found", style="bold")]
    if headline:
        lines += _wrap(headline, width, INDENT)
    if result.claims:
        lines.append(Text(""))
        lines += claim_lines(result.claims, width)
    elif not headline:
        lines.append(Text(INDENT + "(no claims)"))
    in_views = {v.table for v in views}
    said = " ".join(c.note for c in result.claims if c.note)  # a reason a claim already gives is not repeated
    notes = [*result.notes, *(f"not measured: {t} ({why})" for t, why in result.skipped.items()
                              if t not in in_views and why not in said)]
    if notes:
        lines += [Text(""), Text("Notes", style="bold")]
        cap = len(notes) if tables == "all" else MAX_NOTES
        for n in notes[:cap]:
            lines += _wrap(n, width, INDENT + "- ", INDENT + "  ")
        if len(notes) > cap:
            lines.append(Text(INDENT + f"({len(notes) - cap} more notes: --tables all)", style="dim"))
    if tables == "all":
        for name, df in result.tables.items():
            lines.append(Text(""))
            lines += full_table_lines(name, df, width)
    if result.interrupted:
        lines += [Text(""), Text("interrupted: partial results", style="yellow")]
    lines.append(Text(""))
    if saved is not None:
        n = len(result.tables)
        lines += _wrap(f"Saved {saved} and {n} CSV{'s' if n != 1 else ''} beside it; `llmlab show` it with "
                       "--tables all for every table.", width, style="dim")
    elif tables != "all":
        lines += _wrap("Not saved (--no-save). Every table here: rerun with --tables all", width, style="dim")
    return lines if color else [Text(ascii_line(line.plain)) for line in lines]


def render(result: LabResult, console: Console, *, views: list[View] | None = None, headline: str = "",
           tables: str = "report", saved: Path | None = None) -> None:
    """Print the report to `console` at its width."""
    for line in report_lines(result, console.width, views=views, headline=headline, tables=tables, saved=saved,
                             color=console.is_terminal):
        console.print(line, overflow="ignore", crop=False, no_wrap=True)


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
