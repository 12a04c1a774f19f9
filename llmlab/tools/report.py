"""The HTML report (`llmlab report [DIR] [-o FILE]`): every saved run under DIR in one page.

One self-contained file: inline CSS, plots as base64 PNG <img> (matplotlib, Agg backend), no
script, no network. The header shows each machine's device card; then one section per lab, in
the order of the articles, with the newest run of each machine side by side (a GPU run beside a
CPU run) part by part: the verdicts, then each view (its question, its table with human headers,
its chart), the lab's extra figures, notes and what was not measured. Older runs of the same
machine follow, folded. Runs are re-judged with the lab's current judge() (the page says when
the saved judge version differs). A file that does not parse, or whose lab is unknown, is
listed at the end and skipped: a broken file never breaks the report.

core normally never imports a lab; this module finds a run's lab module by name at run time
(llmlab.labs.<name>), as the CLI does, because judge() and views() live there.

References:
- matplotlib, "Backends" (Agg for files without a display) and Figure.savefig:
  https://matplotlib.org/stable/users/explain/figure/backends.html
- RFC 2397, the "data" URL scheme (images inline as base64).
"""

from __future__ import annotations

import base64
import html
import importlib
import io
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import pandas as pd

from llmlab.core.results import LabResult

# The labs in the order of the articles (a lab not listed here follows, alphabetically).
ORDER = ("tokens", "train-vs-infer", "five-steps", "prefill-decode", "gpu-parallelism", "roofline", "kvcache-growth", "samplers",
         "ttft-breakdown", "speculative", "serving")
RAW_MAX_ROWS = 12  # a raw table (lab without views) is cut here: the CSV keeps every row
MAX_OLDER = 6  # older runs of one machine rendered in full; beyond that only listed
_VERDICT = {True: ("holds", "ok"), False: ("does not hold", "bad"), None: ("not measured", "na")}


@dataclass
class Run:
    """One saved run, loaded and re-judged."""

    path: Path
    result: LabResult
    module: ModuleType
    claims: list = field(default_factory=list)
    judge_note: str = ""  # empty when the saved verdicts came from the current judge

    @property
    def lab(self) -> str:
        return self.result.lab

    @property
    def card(self) -> dict:
        return self.result.env.get("device", {}) or {}

    @property
    def machine(self) -> str:
        """What runs are grouped by: the device and its name ("cuda:0 · NVIDIA H100", "cpu · AMD EPYC")."""
        return f"{self.card.get('device', '?')} · {self.card.get('name', '?')}"

    @property
    def stamp(self) -> str:
        return str(self.result.env.get("utc_stamp") or self.result.env.get("utc") or self.path.stem)


# ---------------------------------------------------------------- loading


def lab_module(lab: str) -> ModuleType | None:
    """The lab's module (llmlab.labs.<name>), or None when there is no such lab."""
    if not re.fullmatch(r"[a-z0-9][a-z0-9_-]*", lab or ""):
        return None
    name = f"llmlab.labs.{lab.replace('-', '_')}"
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name and name.startswith(exc.name):  # the lab itself is missing, not one of its imports
            return None
        raise


def rejudge(result: LabResult, module: ModuleType) -> tuple[list, str]:
    """The current judge()'s claims and a note when they differ in version from the saved ones."""
    judge = getattr(module, "judge", None)
    saved = list(getattr(result, "claims", []) or [])
    if judge is None:
        return saved, "saved verdicts (this lab has no judge())"
    try:
        claims = list(judge(result))
    except Exception as exc:  # an old run may lack a table the judge now reads
        return saved, f"judge() failed on this run ({type(exc).__name__}: {_short(exc)}); the saved verdicts are shown"
    now, then = getattr(module, "JUDGE_VERSION", None), getattr(result, "judge_version", None)
    note = "" if now == then else f"re-judged with judge v{now}; the run was saved with judge v{then}"
    return claims, note


def load_runs(results_dir: Path | str) -> tuple[list[Run], list[tuple[Path, str]]]:
    """Every DIR/<lab>/*.json as a Run, and (path, why) for each file skipped."""
    runs: list[Run] = []
    skipped: list[tuple[Path, str]] = []
    for path in sorted(Path(results_dir).glob("*/*.json")):
        try:
            result = LabResult.from_json(path.read_text(encoding="utf-8"))
        except Exception as exc:  # not JSON, another schema, a missing field: skip with the reason
            skipped.append((path, f"does not parse as a lab result ({type(exc).__name__}: {_short(exc)})"))
            continue
        try:
            module = lab_module(result.lab)
        except Exception as exc:
            skipped.append((path, f"lab module for {result.lab!r} failed to import ({type(exc).__name__}: {_short(exc)})"))
            continue
        if module is None:
            skipped.append((path, f"unknown lab {result.lab!r}"))
            continue
        claims, note = rejudge(result, module)
        runs.append(Run(path, result, module, claims, note))
    return runs, skipped


def _short(exc: BaseException, n: int = 120) -> str:
    s = " ".join(str(exc).split())
    return s if len(s) <= n else s[: n - 1] + "…"


def _lab_key(lab: str) -> tuple[int, str]:
    return (ORDER.index(lab) if lab in ORDER else len(ORDER), lab)


# ---------------------------------------------------------------- cells and tables


def cell(v: Any, fmt: str = "", width: int = 0) -> str:
    """One table cell as text by a Col's fmt, exactly as the terminal report writes it (render.fmt)."""
    from llmlab.core.render import fmt as render_fmt

    try:
        s = render_fmt(v, fmt)
    except (ValueError, TypeError):  # a format spec that does not fit the value
        s = str(v)
    s = s.replace("\n", " ")
    if width and len(s) > width:
        s = s[: max(1, width - 1)] + "…"
    return s


def _numeric(df: pd.DataFrame, col: str) -> bool:
    return pd.api.types.is_numeric_dtype(df[col]) and not pd.api.types.is_bool_dtype(df[col])


def html_table(df: pd.DataFrame, cols: list[tuple[str, str, str, int]], max_rows: int) -> str:
    """cols: (key, header, fmt, width). Numbers right-aligned; rows past max_rows counted in a caption."""
    cols = [c for c in cols if c[0] in df.columns]
    if not cols or df.empty:
        return '<p class="muted">(no rows)</p>'
    head = "".join(f'<th class="{"num" if _numeric(df, k) else ""}">{_e(h)}</th>' for k, h, _, _ in cols)
    body = []
    for _, row in df.head(max_rows).iterrows():
        tds = "".join(f'<td class="{"num" if _numeric(df, k) else ""}">{_e(cell(row[k], f, w))}</td>' for k, _, f, w in cols)
        body.append(f"<tr>{tds}</tr>")
    more = f'<caption>{len(df) - max_rows} more rows in the CSV</caption>' if len(df) > max_rows else ""
    return f'<div class="tw"><table class="data">{more}<thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table></div>'


def verdict_table(claims: list) -> str:
    if not claims:
        return '<p class="muted">No claims.</p>'
    rows = []
    for c in claims:
        label, cls = _VERDICT.get(getattr(c, "holds", None), _VERDICT[None])
        cid = getattr(c, "id", "")
        note = getattr(c, "note", "")
        text = f'{_e(c.text)}{f"<div class=cid>{_e(cid)}</div>" if cid else ""}{f"<div class=note>{_e(note)}</div>" if note else ""}'
        rows.append(f'<tr class="v-{cls}"><td>{text}</td><td>{_e(c.expected)}</td><td>{_e(c.measured)}</td><td><span class="pill {cls}">{label}</span></td></tr>')
    return (
        '<div class="tw"><table class="verdicts"><thead><tr><th>claim</th><th>expected</th><th>measured</th><th>verdict</th></tr></thead>'
        f'<tbody>{"".join(rows)}</tbody></table></div>'
    )


# ---------------------------------------------------------------- plots (matplotlib, imported here only)


def _pyplot():
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


STYLE = {  # one look for the report's charts and the labs' figures(): no box, a light grid, small legends
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "legend.frameon": False,
    "legend.fontsize": 8,
}


def figure_png(fig) -> bytes:
    """The figure as PNG bytes; log axes left on matplotlib's default 3x10^1 labels get plain ones."""
    from matplotlib.ticker import LogFormatterSciNotation

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
        labels = [str(v) for v in df[chart.x]]
        pos = list(range(len(labels)))
        horizontal = len(labels) > 8 or max((len(s) for s in labels), default=0) > 12
        bar = ax.barh if horizontal else ax.bar
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
            w = 0.8 / len(ys)
            for i, y in enumerate(ys):
                p = [q - 0.4 + w * (i + 0.5) for q in pos]
                bar(p, [_num(v) for v in df[y]], w, label=headers.get(y, y))
        (ax.set_yticks if horizontal else ax.set_xticks)(pos, labels, **({} if horizontal else {"rotation": 30 if len(labels) > 4 else 0, "ha": "right" if len(labels) > 4 else "center"}))
        if horizontal:
            ax.invert_yaxis()
        if chart.logy or chart.logx:
            value_axis = ax.xaxis if horizontal else ax.yaxis
            (ax.set_xscale if horizontal else ax.set_yscale)("log")
            _plain_log_ticks(value_axis)
        ax.grid(axis="x" if horizontal else "y", alpha=0.3)
        cat_label = chart.xlabel or headers.get(chart.x, chart.x)
        val_label = chart.ylabel or (headers.get(ys[0], ys[0]) if len(ys) == 1 else "")
        ax.set_xlabel(val_label if horizontal else cat_label)
        ax.set_ylabel(cat_label if horizontal else val_label)
        if len(ys) > 1:
            ax.legend(fontsize=8, frameon=False, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    else:
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
                label = " · ".join(str(p) for p in (name, headers.get(y, y) if len(ys) > 1 else None) if p is not None) or None
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
    if title:
        ax.set_title(chart.title, fontsize=11, loc="left")
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    return fig


def _plain_log_ticks(axis) -> None:
    """Log-axis ticks as plain numbers (1, 2, 4, 1,000) rather than 2x10^3, when the range allows."""
    from matplotlib.ticker import FuncFormatter

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
    return f'<img class="plot" alt="{_e(alt)}" src="data:image/png;base64,{base64.b64encode(png).decode("ascii")}">'


def chart_html(result: LabResult, chart: Any, headers: dict[str, str] | None = None, title: bool = True) -> str:
    df = result.tables.get(chart.table)
    if df is None or df.empty:
        return f'<p class="muted">(chart “{_e(chart.title)}”: table {_e(chart.table)} is empty or missing)</p>'
    try:
        with _pyplot().rc_context(STYLE):
            return img(figure_png(chart_figure(df, chart, headers, title)), chart.title)
    except Exception as exc:  # a chart that cannot be drawn is reported, the page goes on
        _pyplot().close("all")
        return f'<p class="warn">chart “{_e(chart.title)}” could not be drawn: {_e(type(exc).__name__)}: {_e(_short(exc))}</p>'


# ---------------------------------------------------------------- one run as parts


def run_parts(run: Run) -> list[tuple[str, str, str, str]]:
    """The run's parts in reading order: (key, title, question, html). Keys align runs side by side."""
    res, mod = run.result, run.module
    parts = [("head", "", "", _run_head(run))]
    headline = getattr(mod, "headline", None)
    found = ""
    if headline is not None:
        try:
            found = f'<p class="headline">{_e(headline(res, run.claims))}</p>'
        except Exception as exc:
            found = f'<p class="warn">headline() failed: {_e(_short(exc))}</p>'
    parts.append(("verdicts", "What this run found", "", found + verdict_table(run.claims)))
    views = None
    if hasattr(mod, "views"):
        try:
            views = list(mod.views(res))
        except Exception as exc:
            parts.append(("views-error", "Views", "", f'<p class="warn">views() failed on this run ({_e(type(exc).__name__)}: {_e(_short(exc))}); raw tables follow</p>'))
    if views:
        for v in views:
            parts.append((f"view:{v.title}", v.title, getattr(v, "question", ""), _view_html(res, v)))
    else:
        for name, df in res.tables.items():
            parts.append((f"table:{name}", name, "", html_table(df, [(str(c), str(c), "", 0) for c in df.columns], RAW_MAX_ROWS)))
        for ch in getattr(res, "charts", []) or []:  # results saved before views: their own charts
            parts.append((f"chart:{ch.title}", ch.title, "", chart_html(res, ch, title=False)))
    figs = getattr(mod, "figures", None)
    if figs is not None:
        try:
            with _pyplot().rc_context(STYLE):
                imgs = [img(figure_png(f), t) + f'<div class="cap">{_e(t)}</div>' for t, f in figs(res)]
        except Exception as exc:
            _pyplot().close("all")
            imgs = [f'<p class="warn">figures() failed on this run ({_e(type(exc).__name__)}: {_e(_short(exc))})</p>']
        if imgs:
            parts.append(("figures", "Figures", "", "".join(f'<figure>{i}</figure>' for i in imgs)))
    notes = list(getattr(res, "notes", []) or [])
    skipped = dict(getattr(res, "skipped", {}) or {})
    if notes or skipped:
        items = [f"<li>{_e(n)}</li>" for n in notes] + [f'<li><b>not measured</b> {_e(k)}: {_e(why)}</li>' for k, why in skipped.items()]
        parts.append(("notes", "Notes", "", f'<ul class="notes">{"".join(items)}</ul>'))
    return parts


def _view_html(res: LabResult, v: Any) -> str:
    df = res.tables.get(v.table)
    skipped = dict(getattr(res, "skipped", {}) or {})
    if df is None:
        why = skipped.get(v.table, "the table is not in this run")
        return f'<p class="muted">not measured: {_e(why)}</p>'
    out = []
    try:
        shown = v.rows(df) if getattr(v, "rows", None) else df
    except Exception as exc:
        out.append(f'<p class="warn">rows() failed ({_e(_short(exc))}); all rows shown</p>')
        shown = df
    cols = [(c.key, c.header, getattr(c, "fmt", ""), getattr(c, "width", 0)) for c in v.cols]
    missing = [k for k, *_ in cols if k not in shown.columns]
    table = html_table(shown, cols, getattr(v, "max_rows", 12))
    if missing:
        table += f'<p class="muted">columns not in this run: {_e(", ".join(missing))}</p>'
    chart = ""
    if getattr(v, "chart", None) is not None:
        chart = chart_html(res, v.chart, {c.key: c.header for c in v.cols}, title=v.chart.title != v.title)
    # table and chart side by side when the column is wide enough (one run), else the chart below
    out.append(f'<div class="tv"><div>{table}</div>{f"<div>{chart}</div>" if chart else ""}</div>')
    return "".join(out)


def _run_head(run: Run) -> str:
    env, card = run.result.env, run.card
    bits = [f'<div class="machine">{_e(card.get("name", "?"))} <span class="dev">{_e(card.get("device", "?"))}</span></div>']
    meta = [_e(_when(run)), f"lab v{_e(run.result.version)}"]
    if env.get("quick"):
        meta.append("--quick")
    tel = env.get("telemetry") or {}
    if isinstance(tel, dict) and tel.get("wall_s") is not None:
        meta.append(f'{cell(tel["wall_s"])} s')
    bits.append(f'<div class="meta">{" · ".join(meta)}</div>')
    if env.get("command"):
        bits.append(f'<div class="cmd"><code>{_e(env["command"])}</code></div>')
    bits.append(f'<div class="file">{_e(run.path.name)}</div>')
    if run.result.interrupted:
        bits.append('<p class="warn">interrupted (Ctrl-C): partial results</p>')
    if run.judge_note:
        bits.append(f'<p class="jnote">{_e(run.judge_note)}</p>')
    return "".join(bits)


# ---------------------------------------------------------------- the page


def device_card_html(card: dict, n_runs: int) -> str:
    rows: list[tuple[str, str]] = []
    if str(card.get("device", "")).startswith("cuda"):
        gib = card.get("memory_bytes")
        rows += [
            ("GPU", f'{card.get("name", "?")} ({card.get("device")})'),
            ("compute capability", str(card.get("compute_capability", "?"))),
            ("SMs", str(card.get("sm_count", "?"))),
            ("memory", f"{gib / 2**30:.1f} GiB" if isinstance(gib, (int, float)) else "?"),
        ]
        if card.get("l2_bytes"):
            rows.append(("L2", _bytes(card["l2_bytes"])))
        if card.get("max_sm_clock_mhz"):
            rows.append(("max SM / memory clock", f'{card["max_sm_clock_mhz"]} / {card.get("max_mem_clock_mhz", "?")} MHz'))
        if card.get("power_limit_w"):
            rows.append(("power limit", f'{card["power_limit_w"]:.0f} W'))
        if card.get("driver") or card.get("cuda_runtime"):
            rows.append(("driver · CUDA", f'{card.get("driver", "?")} · {card.get("cuda_runtime", "?")}'))
    cpu = card.get("cpu") or {}
    if cpu:
        isa = ", ".join(k for k, v in (cpu.get("isa") or {}).items() if v) or "–"
        caches = cpu.get("caches_bytes") or {}
        cache = " · ".join(f"{k} {_bytes(v)}" for k, v in caches.items() if k in ("L2", "L3"))
        rows += [
            ("CPU", f'{cpu.get("model", "?")}: {cpu.get("physical", "?")} cores, {cpu.get("logical", "?")} threads'
             + (f', {cpu["max_mhz"]:.0f} MHz' if isinstance(cpu.get("max_mhz"), (int, float)) else "")),
            ("ISA", isa),
        ]
        if cache:
            rows.append(("caches", cache))
        if cpu.get("memory_bytes"):
            rows.append(("RAM", _bytes(cpu["memory_bytes"])))
    ver = card.get("versions") or {}
    if ver:
        rows.append(("versions", " · ".join(f"{k} {ver[k]}" for k in ("python", "torch", "transformers", "llmlab") if k in ver)))
    if card.get("platform"):
        rows.append(("platform", str(card["platform"])))
    body = "".join(f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>" for k, v in rows)
    title = f'{card.get("name", "?")} <span class="dev">{_e(card.get("device", "?"))}</span>'
    return f'<div class="card"><h3>{title}</h3><table class="kv">{body}</table><div class="muted">{n_runs} run{"s" if n_runs != 1 else ""}</div></div>'


def _when(run: Run) -> str:
    """The run's start as "2026-12-02 14:57 UTC" (the stamp as saved when it is not ISO)."""
    from datetime import datetime, timezone

    raw = str(run.result.env.get("utc") or run.stamp)
    for parse in (datetime.fromisoformat, lambda t: datetime.strptime(t, "%Y%m%dT%H%M%SZ").replace(tzinfo=timezone.utc)):
        try:
            return parse(raw).astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        except ValueError:
            continue
    return raw


def _bytes(n: Any) -> str:
    if not isinstance(n, (int, float)):
        return str(n)
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n:.0f} B"


def _counts(claims: list) -> str:
    n = {k: sum(1 for c in claims if getattr(c, "holds", None) is k) for k in (True, False, None)}
    out = []
    for k in (True, False, None):
        if n[k]:
            label, cls = _VERDICT[k]
            out.append(f'<span class="pill {cls}">{n[k]} {label}</span>')
    return " ".join(out) or '<span class="muted">no claims</span>'


def _anchor(lab: str) -> str:
    return "lab-" + re.sub(r"[^a-z0-9-]", "-", lab.lower())


def lab_section(lab: str, runs: list[Run]) -> str:
    """One lab: the newest run of each machine side by side, part by part; older runs folded below."""
    by_machine: dict[str, list[Run]] = {}
    for r in sorted(runs, key=lambda r: r.stamp, reverse=True):
        by_machine.setdefault(r.machine, []).append(r)
    # GPU runs first, then the CPU: the faster machine reads first
    machines = sorted(by_machine, key=lambda m: (not m.startswith("cuda"), m))
    newest = [by_machine[m][0] for m in machines]
    older = [r for m in machines for r in by_machine[m][1:]]
    out = [f'<section class="lab" id="{_anchor(lab)}"><h2>{_e(lab)}</h2>', _side_by_side(newest)]
    if older:
        shown = older[:MAX_OLDER]
        inner = "".join(f'<div class="older">{_side_by_side([r])}</div>' for r in shown)
        if len(older) > len(shown):
            inner += "<p class='muted'>also: " + ", ".join(_e(r.path.name) for r in older[len(shown):]) + "</p>"
        out.append(f"<details><summary>{len(older)} older run{'s' if len(older) != 1 else ''} of this lab</summary>{inner}</details>")
    out.append("</section>")
    return "".join(out)


def _side_by_side(runs: list[Run]) -> str:
    per_run = [run_parts(r) for r in runs]
    order: list[str] = []
    meta: dict[str, tuple[str, str]] = {}
    for parts in per_run:
        for key, title, question, _ in parts:
            if key not in meta:
                order.append(key)
                meta[key] = (title, question)
    lookup = [{k: h for k, _, _, h in parts} for parts in per_run]
    n = len(runs)
    cells = []
    for key in order:
        title, question = meta[key]
        if title:
            q = f'<div class="q">{_e(question)}</div>' if question else ""
            cells.append(f'<div class="part-title"><h4>{_e(title)}</h4>{q}</div>')
        for d in lookup:
            cells.append(f'<div class="cell {key.split(":")[0]}">{d.get(key, "<p class=muted>–</p>")}</div>')
    return f'<div class="grid" style="grid-template-columns: repeat({n}, minmax(440px, 1fr))">{"".join(cells)}</div>'


def build_html(runs: list[Run], skipped: list[tuple[Path, str]], source: str = "results") -> str:
    labs: dict[str, list[Run]] = {}
    for r in runs:
        labs.setdefault(r.lab, []).append(r)
    order = sorted(labs, key=_lab_key)
    cards: dict[str, tuple[dict, int]] = {}
    for r in runs:
        card, n = cards.get(r.machine, (r.card, 0))
        cards[r.machine] = (card, n + 1)
    cards_html = "".join(device_card_html(c, n) for _, (c, n) in sorted(cards.items(), key=lambda kv: (not kv[0].startswith("cuda"), kv[0])))
    summary_rows = []
    for lab in order:
        newest: dict[str, Run] = {}
        for r in sorted(labs[lab], key=lambda r: r.stamp):
            newest[r.machine] = r
        machines = sorted(newest, key=lambda m: (not m.startswith("cuda"), m))
        for i, m in enumerate(machines):
            r = newest[m]
            first = f'<td rowspan="{len(machines)}"><a href="#{_anchor(lab)}">{_e(lab)}</a></td>' if i == 0 else ""
            summary_rows.append(f"<tr>{first}<td>{_e(m)}</td><td>{_e(_when(r))}</td><td>{_counts(r.claims)}</td></tr>")
    summary = (
        '<table class="summary"><thead><tr><th>lab</th><th>device</th><th>newest run</th><th>verdicts</th></tr></thead>'
        f'<tbody>{"".join(summary_rows)}</tbody></table>'
        if summary_rows
        else f'<p class="warn">No lab runs found under {_e(source)}/ (run a lab, e.g. <code>llmlab roofline --quick</code>).</p>'
    )
    skip_line = f'<p class="warn">{len(skipped)} file{"s" if len(skipped) != 1 else ""} skipped: see <a href="#skipped">the end of the page</a>.</p>' if skipped else ""
    skip_html = ""
    if skipped:
        items = "".join(f"<li><code>{_e(str(p))}</code>: {_e(why)}</li>" for p, why in skipped)
        skip_html = f'<section id="skipped"><h2>Skipped files</h2><ul class="notes">{items}</ul></section>'
    sections = "".join(lab_section(lab, labs[lab]) for lab in order)
    from datetime import datetime, timezone

    made = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<link rel="icon" href="data:,"><title>llmlab report</title><style>{CSS}</style></head>
<body><header><h1>llmlab report</h1>
<p class="sub">{len(runs)} run{"s" if len(runs) != 1 else ""} of {len(order)} lab{"s" if len(order) != 1 else ""} from <code>{_e(source)}/</code> · written {made} · verdicts re-judged by each lab's current judge()</p>
<div class="cards">{cards_html}</div>{summary}{skip_line}</header>
<main>{sections}{skip_html}</main></body></html>
"""


def write_report(results_dir: Path | str = "results", out: Path | str | None = None) -> tuple[Path, int, int]:
    """Build the page from every run under results_dir; write it atomically. Returns (path, runs, skipped)."""
    from llmlab.core.results import atomic_write

    results_dir = Path(results_dir)
    out = Path(out) if out is not None else results_dir / "report.html"
    runs, skipped = load_runs(results_dir)
    page = build_html(runs, skipped, str(results_dir))
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(out, page)
    umask = os.umask(0)
    os.umask(umask)
    out.chmod(0o666 & ~umask)  # mkstemp makes files 0600; a report is for reading, like any file the user writes
    return out, len(runs), len(skipped)


def _e(s: Any) -> str:
    return html.escape(str(s), quote=True)


CSS = """
:root { --fg:#1f2328; --muted:#656d76; --line:#d0d7de; --bg:#f6f8fa; --ok:#1a7f37; --okb:#dafbe1;
  --bad:#cf222e; --badb:#ffebe9; --na:#9a6700; --nab:#fff8c5; --acc:#0969da; }
* { box-sizing: border-box; }
body { margin:0; font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif;
  color:var(--fg); background:#fff; }
header, main { max-width: 1500px; margin: 0 auto; padding: 0 28px; }
header { padding-top: 22px; padding-bottom: 8px; }
h1 { font-size: 26px; margin: 0 0 2px; }
h2 { font-size: 21px; margin: 0 0 12px; padding-bottom: 6px; border-bottom: 2px solid var(--fg); }
h3 { font-size: 15px; margin: 0 0 6px; }
h4 { font-size: 15px; margin: 0; }
a { color: var(--acc); text-decoration: none; } a:hover { text-decoration: underline; }
code { font: 12px/1.4 ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; }
.sub, .muted, .file, .meta, .cid { color: var(--muted); }
.cards { display:flex; flex-wrap:wrap; gap:14px; margin:14px 0; }
.card { border:1px solid var(--line); border-radius:8px; padding:12px 14px; background:var(--bg); min-width:380px; flex:1 1 420px; max-width:720px; }
.dev { font-weight:500; color:var(--muted); font-size:.9em; }
table { border-collapse: collapse; }
table.kv th { text-align:left; font-weight:500; color:var(--muted); padding:1px 12px 1px 0; vertical-align:top; white-space:nowrap; }
table.kv td { padding:1px 0; }
table.summary { margin: 6px 0 12px; }
table.summary th, table.summary td { padding:4px 14px 4px 0; text-align:left; border-bottom:1px solid var(--line); vertical-align:top; }
section.lab { margin: 30px 0 12px; }
.grid { display:grid; column-gap:28px; row-gap:6px; overflow-x:auto; }
.part-title { grid-column: 1 / -1; margin-top:14px; padding-top:8px; border-top:1px solid var(--line); }
.q { color: var(--muted); font-style: italic; }
.cell { min-width:0; }
.cell.head { background:var(--bg); border-radius:8px; padding:10px 12px; }
.machine { font-weight:600; font-size:15px; }
.cmd code { color:#24292f; word-break: break-all; }
.file { font-size:12px; }
.headline { font-size:15px; margin:4px 0 8px; font-weight:500; }
.tw { overflow-x:auto; }
table.data, table.verdicts { width:100%; font-size:13px; margin:4px 0; }
table.data { width:auto; min-width:min(100%, 560px); }
.tv { display:flex; flex-wrap:wrap; column-gap:32px; align-items:flex-start; }
.tv > div { min-width:0; max-width:100%; }  /* a 4-column table does not stretch over 1,400 px */
table.data th, table.verdicts th { text-align:left; font-weight:600; padding:4px 8px; border-bottom:2px solid var(--line); vertical-align:bottom; }
table.data td, table.verdicts td { padding:3px 8px; border-bottom:1px solid #eaeef2; vertical-align:top; }
table.data .num { text-align:right; font-variant-numeric: tabular-nums; white-space:nowrap; }
table.data tbody tr:nth-child(even) { background:#fafbfc; }
table.verdicts td:nth-child(2), table.verdicts td:nth-child(3) { font-variant-numeric: tabular-nums; }
caption { caption-side: bottom; text-align:left; color:var(--muted); font-size:12px; padding-top:2px; }
.cid { font: 11px ui-monospace, Menlo, Consolas, monospace; }
.note { color: var(--muted); font-size:12px; margin-top:2px; }
tr.v-bad td:first-child { border-left:3px solid var(--bad); }
tr.v-ok td:first-child { border-left:3px solid var(--ok); }
tr.v-na td:first-child { border-left:3px solid #d4a72c; }
.pill { display:inline-block; padding:1px 8px; border-radius:10px; font-size:12px; font-weight:600; white-space:nowrap; }
.pill.ok { color:var(--ok); background:var(--okb); } .pill.bad { color:var(--bad); background:var(--badb); } .pill.na { color:var(--na); background:var(--nab); }
img.plot { display:block; width:auto; max-width:100%; height:auto; margin:6px 0; }
figure { margin: 0 0 10px; } .cap { color: var(--muted); font-size:12px; }
ul.notes { margin:4px 0; padding-left:18px; color:#3d444d; }
.warn { color:var(--na); background:var(--nab); padding:6px 10px; border-radius:6px; }
.jnote { color:var(--na); font-size:12px; margin:6px 0 0; }
details { margin: 14px 0; } summary { cursor:pointer; color:var(--acc); }
.older { border-left:3px solid var(--line); padding-left:14px; margin:10px 0; }
"""
