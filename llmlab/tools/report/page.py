"""The page: a header with each machine's device card and a summary of the newest verdicts, then one
section per lab with the newest run of each machine side by side and older runs folded below.
"""

from __future__ import annotations

import os
import re
from datetime import datetime, timezone
from pathlib import Path

from llmlab.core.results import atomic_write
from llmlab.tools.report.parts import run_parts
from llmlab.tools.report.runs import Run, _lab_key, gpu_first, load_runs
from llmlab.tools.report.style import CSS
from llmlab.tools.report.text import VERDICT, esc, nbytes, plural

MAX_OLDER = 6  # older runs of one machine rendered in full; beyond that only listed


def device_card_html(card: dict, n_runs: int) -> str:
    """One machine's card: the GPU (when there is one), the CPU, versions and platform, its number of runs."""
    rows = _gpu_rows(card) + _cpu_rows(card.get("cpu") or {})
    ver = card.get("versions") or {}
    if ver:
        keys = ("python", "torch", "transformers", "llmlab")
        rows.append(("versions", " · ".join(f"{k} {ver[k]}" for k in keys if k in ver)))
    if card.get("platform"):
        rows.append(("platform", str(card["platform"])))
    body = "".join(f"<tr><th>{esc(k)}</th><td>{esc(v)}</td></tr>" for k, v in rows)
    title = f'{esc(card.get("name", "?"))} <span class="dev">{esc(card.get("device", "?"))}</span>'
    return (f'<div class="card"><h3>{title}</h3><table class="kv">{body}</table>'
            f'<div class="muted">{plural(n_runs, "run")}</div></div>')


def _gpu_rows(card: dict) -> list[tuple[str, str]]:
    if not str(card.get("device", "")).startswith("cuda"):
        return []
    gib = card.get("memory_bytes")
    rows = [
        ("GPU", f'{card.get("name", "?")} ({card.get("device")})'),
        ("compute capability", str(card.get("compute_capability", "?"))),
        ("SMs", str(card.get("sm_count", "?"))),
        ("memory", f"{gib / 2**30:.1f} GiB" if isinstance(gib, (int, float)) else "?"),
    ]
    if card.get("l2_bytes"):
        rows.append(("L2", nbytes(card["l2_bytes"])))
    if card.get("max_sm_clock_mhz"):
        clocks = f'{card["max_sm_clock_mhz"]} / {card.get("max_mem_clock_mhz", "?")} MHz'
        rows.append(("max SM / memory clock", clocks))
    if card.get("power_limit_w"):
        rows.append(("power limit", f'{card["power_limit_w"]:.0f} W'))
    if card.get("driver") or card.get("cuda_runtime"):
        rows.append(("driver · CUDA", f'{card.get("driver", "?")} · {card.get("cuda_runtime", "?")}'))
    return rows


def _cpu_rows(cpu: dict) -> list[tuple[str, str]]:
    if not cpu:
        return []
    isa = ", ".join(k for k, v in (cpu.get("isa") or {}).items() if v) or "–"
    caches = cpu.get("caches_bytes") or {}
    cache = " · ".join(f"{k} {nbytes(v)}" for k, v in caches.items() if k in ("L2", "L3"))
    mhz = f', {cpu["max_mhz"]:.0f} MHz' if isinstance(cpu.get("max_mhz"), (int, float)) else ""
    rows = [
        ("CPU", f'{cpu.get("model", "?")}: {cpu.get("physical", "?")} cores, {cpu.get("logical", "?")} threads{mhz}'),
        ("ISA", isa),
    ]
    if cache:
        rows.append(("caches", cache))
    if cpu.get("memory_bytes"):
        rows.append(("RAM", nbytes(cpu["memory_bytes"])))
    return rows


def _counts(claims: list) -> str:
    n = {k: sum(1 for c in claims if getattr(c, "holds", None) is k) for k in (True, False, None)}
    out = []
    for k in (True, False, None):
        if n[k]:
            label, cls = VERDICT[k]
            out.append(f'<span class="pill {cls}">{n[k]} {label}</span>')
    return " ".join(out) or '<span class="muted">no claims</span>'


def _anchor(lab: str) -> str:
    return "lab-" + re.sub(r"[^a-z0-9-]", "-", lab.lower())


def lab_section(lab: str, runs: list[Run]) -> str:
    """One lab: the newest run of each machine side by side, part by part; older runs folded below."""
    by_machine: dict[str, list[Run]] = {}
    for r in sorted(runs, key=lambda r: r.stamp, reverse=True):
        by_machine.setdefault(r.machine, []).append(r)
    machines = sorted(by_machine, key=gpu_first)
    newest = [by_machine[m][0] for m in machines]
    older = [r for m in machines for r in by_machine[m][1:]]
    out = [f'<section class="lab" id="{_anchor(lab)}"><h2>{esc(lab)}</h2>', _side_by_side(newest)]
    if older:
        shown = older[:MAX_OLDER]
        inner = "".join(f'<div class="older">{_side_by_side([r])}</div>' for r in shown)
        if len(older) > len(shown):
            inner += "<p class='muted'>also: " + ", ".join(esc(r.path.name) for r in older[len(shown):]) + "</p>"
        out.append(f"<details><summary>{plural(len(older), 'older run')} of this lab</summary>{inner}</details>")
    out.append("</section>")
    return "".join(out)


def _side_by_side(runs: list[Run]) -> str:
    """The runs in columns, part by part: each part's title spans the row, then each run's cell of it."""
    per_run = [run_parts(r) for r in runs]
    order: list[str] = []
    meta: dict[str, tuple[str, str]] = {}
    for parts in per_run:
        for key, title, question, _ in parts:
            if key not in meta:
                order.append(key)
                meta[key] = (title, question)
    lookup = [{k: h for k, _, _, h in parts} for parts in per_run]
    cells = []
    for key in order:
        title, question = meta[key]
        if title:
            q = f'<div class="q">{esc(question)}</div>' if question else ""
            cells.append(f'<div class="part-title"><h4>{esc(title)}</h4>{q}</div>')
        for d in lookup:
            cells.append(f'<div class="cell {key.split(":")[0]}">{d.get(key, "<p class=muted>–</p>")}</div>')
    columns = f"grid-template-columns: repeat({len(runs)}, minmax(440px, 1fr))"
    return f'<div class="grid" style="{columns}">{"".join(cells)}</div>'


def _summary(labs: dict[str, list[Run]], order: list[str], source: str) -> str:
    """The header's table: per lab and machine, the newest run's start and its verdict counts."""
    rows = []
    for lab in order:
        newest: dict[str, Run] = {}
        for r in sorted(labs[lab], key=lambda r: r.stamp):
            newest[r.machine] = r
        machines = sorted(newest, key=gpu_first)
        for i, m in enumerate(machines):
            r = newest[m]
            first = f'<td rowspan="{len(machines)}"><a href="#{_anchor(lab)}">{esc(lab)}</a></td>' if i == 0 else ""
            rows.append(f"<tr>{first}<td>{esc(m)}</td><td>{esc(r.when)}</td><td>{_counts(r.claims)}</td></tr>")
    if not rows:
        return (f'<p class="warn">No lab runs found under {esc(source)}/ '
                '(run a lab, e.g. <code>llmlab roofline --quick</code>).</p>')
    return ('<table class="summary"><thead><tr><th>lab</th><th>device</th><th>newest run</th><th>verdicts</th></tr>'
            f'</thead><tbody>{"".join(rows)}</tbody></table>')


def _skipped_html(skipped: list[tuple[Path, str]]) -> tuple[str, str]:
    """The header's line on skipped files and the section at the end that lists them ("" and "" when none)."""
    if not skipped:
        return "", ""
    line = (f'<p class="warn">{plural(len(skipped), "file")} skipped: '
            'see <a href="#skipped">the end of the page</a>.</p>')
    items = "".join(f"<li><code>{esc(str(p))}</code>: {esc(why)}</li>" for p, why in skipped)
    return line, f'<section id="skipped"><h2>Skipped files</h2><ul class="notes">{items}</ul></section>'


def build_html(runs: list[Run], skipped: list[tuple[Path, str]], source: str = "results") -> str:
    """The whole page as one string: inline CSS, inline images, no script."""
    labs: dict[str, list[Run]] = {}
    for r in runs:
        labs.setdefault(r.lab, []).append(r)
    order = sorted(labs, key=_lab_key)
    cards: dict[str, tuple[dict, int]] = {}
    for r in runs:
        card, n = cards.get(r.machine, (r.card, 0))
        cards[r.machine] = (card, n + 1)
    cards_html = "".join(device_card_html(*cards[m]) for m in sorted(cards, key=gpu_first))
    skip_line, skip_html = _skipped_html(skipped)
    sections = "".join(lab_section(lab, labs[lab]) for lab in order)
    made = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    sub = (f'{plural(len(runs), "run")} of {plural(len(order), "lab")} from <code>{esc(source)}/</code> · '
           f"written {made} · verdicts re-judged by each lab's current judge()")
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<link rel="icon" href="data:,"><title>llmlab report</title><style>{CSS}</style></head>
<body><header><h1>llmlab report</h1>
<p class="sub">{sub}</p>
<div class="cards">{cards_html}</div>{_summary(labs, order, source)}{skip_line}</header>
<main>{sections}{skip_html}</main></body></html>
"""


def write_report(results_dir: Path | str = "results", out: Path | str | None = None) -> tuple[Path, int, int]:
    """Build the page from every run under results_dir; write it atomically. Returns (path, runs, skipped)."""
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
