"""One run as parts in reading order: its head, the verdicts, each view (question, table, chart), the lab's
figures, notes and what was not measured. A part's key lines up the same part of runs shown side by side.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from llmlab.core.results import LabResult
from llmlab.tools.report.plots import chart_html, figures_html
from llmlab.tools.report.runs import Run
from llmlab.tools.report.text import VERDICT, cell, esc, failure, short

RAW_MAX_ROWS = 12  # a raw table (lab without views) is cut here: the CSV keeps every row


def _numeric(df: pd.DataFrame, col: str) -> bool:
    return pd.api.types.is_numeric_dtype(df[col]) and not pd.api.types.is_bool_dtype(df[col])


def html_table(df: pd.DataFrame, cols: list[tuple[str, str, str, int]], max_rows: int) -> str:
    """cols: (key, header, fmt, width). Numbers right-aligned; rows past max_rows counted in a caption."""
    cols = [c for c in cols if c[0] in df.columns]
    if not cols or df.empty:
        return '<p class="muted">(no rows)</p>'
    align = {k: "num" if _numeric(df, k) else "" for k, *_ in cols}
    head = "".join(f'<th class="{align[k]}">{esc(h)}</th>' for k, h, _, _ in cols)
    body = []
    for _, row in df.head(max_rows).iterrows():
        tds = "".join(f'<td class="{align[k]}">{esc(cell(row[k], f, w))}</td>' for k, _, f, w in cols)
        body.append(f"<tr>{tds}</tr>")
    more = f'<caption>{len(df) - max_rows} more rows in the CSV</caption>' if len(df) > max_rows else ""
    return (f'<div class="tw"><table class="data">{more}<thead><tr>{head}</tr></thead>'
            f'<tbody>{"".join(body)}</tbody></table></div>')


def verdict_table(claims: list) -> str:
    """The claims as rows: the claim (its id and note below it), expected, measured, the verdict's pill."""
    if not claims:
        return '<p class="muted">No claims.</p>'
    rows = []
    for c in claims:
        label, cls = VERDICT.get(getattr(c, "holds", None), VERDICT[None])
        cid = getattr(c, "id", "")
        note = getattr(c, "note", "")
        text = (esc(c.text) + (f"<div class=cid>{esc(cid)}</div>" if cid else "")
                + (f"<div class=note>{esc(note)}</div>" if note else ""))
        rows.append(f'<tr class="v-{cls}"><td>{text}</td><td>{esc(c.expected)}</td><td>{esc(c.measured)}</td>'
                    f'<td><span class="pill {cls}">{label}</span></td></tr>')
    return (
        '<div class="tw"><table class="verdicts"><thead><tr><th>claim</th><th>expected</th><th>measured</th>'
        '<th>verdict</th></tr></thead>'
        f'<tbody>{"".join(rows)}</tbody></table></div>'
    )


def run_parts(run: Run) -> list[tuple[str, str, str, str]]:
    """The run's parts in reading order: (key, title, question, html). Keys align runs side by side."""
    res, mod = run.result, run.module
    parts = [("head", "", "", _run_head(run))]
    headline = getattr(mod, "headline", None)
    found = ""
    if headline is not None:
        try:
            found = f'<p class="headline">{esc(headline(res, run.claims))}</p>'
        except Exception as exc:
            found = f'<p class="warn">headline() failed: {esc(short(exc))}</p>'
    parts.append(("verdicts", "What this run found", "", found + verdict_table(run.claims)))
    parts += _view_parts(res, mod)
    figs = getattr(mod, "figures", None)
    if figs is not None:
        imgs = figures_html(figs, res)
        if imgs:
            parts.append(("figures", "Figures", "", "".join(f'<figure>{i}</figure>' for i in imgs)))
    notes = list(getattr(res, "notes", []) or [])
    skipped = dict(getattr(res, "skipped", {}) or {})
    if notes or skipped:
        items = ([f"<li>{esc(n)}</li>" for n in notes]
                 + [f'<li><b>not measured</b> {esc(k)}: {esc(why)}</li>' for k, why in skipped.items()])
        parts.append(("notes", "Notes", "", f'<ul class="notes">{"".join(items)}</ul>'))
    return parts


def _view_parts(res: LabResult, mod: Any) -> list[tuple[str, str, str, str]]:
    """One part per view; a lab without views (or whose views() fails) shows its raw tables and saved charts."""
    parts = []
    views = None
    if hasattr(mod, "views"):
        try:
            views = list(mod.views(res))
        except Exception as exc:
            warn = f'<p class="warn">views() failed on this run ({esc(failure(exc))}); raw tables follow</p>'
            parts.append(("views-error", "Views", "", warn))
    if views:
        return parts + [(f"view:{v.title}", v.title, getattr(v, "question", ""), _view_html(res, v)) for v in views]
    for name, df in res.tables.items():
        raw = html_table(df, [(str(c), str(c), "", 0) for c in df.columns], RAW_MAX_ROWS)
        parts.append((f"table:{name}", name, "", raw))
    for ch in getattr(res, "charts", []) or []:  # results saved before views: their own charts
        parts.append((f"chart:{ch.title}", ch.title, "", chart_html(res, ch, title=False)))
    return parts


def _view_html(res: LabResult, v: Any) -> str:
    df = res.tables.get(v.table)
    skipped = dict(getattr(res, "skipped", {}) or {})
    if df is None:
        why = skipped.get(v.table, "the table is not in this run")
        return f'<p class="muted">not measured: {esc(why)}</p>'
    out = []
    try:
        shown = v.rows(df) if getattr(v, "rows", None) else df
    except Exception as exc:
        out.append(f'<p class="warn">rows() failed ({esc(short(exc))}); all rows shown</p>')
        shown = df
    cols = [(c.key, c.header, getattr(c, "fmt", ""), getattr(c, "width", 0)) for c in v.cols]
    missing = [k for k, *_ in cols if k not in shown.columns]
    table = html_table(shown, cols, getattr(v, "max_rows", 12))
    if missing:
        table += f'<p class="muted">columns not in this run: {esc(", ".join(missing))}</p>'
    chart = ""
    if getattr(v, "chart", None) is not None:
        chart = chart_html(res, v.chart, {c.key: c.header for c in v.cols}, title=v.chart.title != v.title)
    # table and chart side by side when the column is wide enough (one run), else the chart below
    out.append(f'<div class="tv"><div>{table}</div>{f"<div>{chart}</div>" if chart else ""}</div>')
    return "".join(out)


def _run_head(run: Run) -> str:
    """The run's head: machine, start, lab version, --quick, wall time, the command, the file, warnings."""
    env, card = run.result.env, run.card
    name, device = esc(card.get("name", "?")), esc(card.get("device", "?"))
    bits = [f'<div class="machine">{name} <span class="dev">{device}</span></div>']
    meta = [esc(run.when), f"lab v{esc(run.result.version)}"]
    if env.get("quick"):
        meta.append("--quick")
    tel = env.get("telemetry") or {}
    if isinstance(tel, dict) and tel.get("wall_s") is not None:
        meta.append(f'{cell(tel["wall_s"])} s')
    bits.append(f'<div class="meta">{" · ".join(meta)}</div>')
    if env.get("command"):
        bits.append(f'<div class="cmd"><code>{esc(env["command"])}</code></div>')
    bits.append(f'<div class="file">{esc(run.path.name)}</div>')
    if run.result.interrupted:
        bits.append('<p class="warn">interrupted (Ctrl-C): partial results</p>')
    if run.judge_note:
        bits.append(f'<p class="jnote">{esc(run.judge_note)}</p>')
    return "".join(bits)
