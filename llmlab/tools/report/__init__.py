"""The HTML report (`llmlab report [DIR] [-o FILE]`): every saved run under DIR in one page.

One self-contained file: inline CSS, plots as base64 PNG <img> (matplotlib, Agg backend), no
script, no network. The header shows each machine's device card; then one section per lab, in
the order of the articles, with the newest run of each machine side by side (a GPU run beside a
CPU run) part by part: the verdicts, then each view (its question, its table with human headers,
its chart), the lab's extra figures, notes and what was not measured. Older runs of the same
machine follow, folded. Runs are re-judged with the lab's current judge() (the page says when
the saved judge version differs). A file that does not parse, or whose lab is unknown, is
listed at the end and skipped: a broken file never breaks the report.

The parts: runs (loading and re-judging), text (escaping, cells, sizes), plots (matplotlib),
parts (one run in reading order), page (cards, sections, the whole page), style (the CSS).

References:
- matplotlib, "Backends" (Agg for files without a display) and Figure.savefig:
  https://matplotlib.org/stable/users/explain/figure/backends.html
- RFC 2397, the "data" URL scheme (images inline as base64).
"""

from llmlab.tools.report.page import build_html, device_card_html, lab_section, write_report
from llmlab.tools.report.parts import _run_head, html_table, run_parts, verdict_table
from llmlab.tools.report.plots import STYLE, chart_figure, chart_html, figure_png
from llmlab.tools.report.runs import ORDER, Run, _lab_key, lab_module, load_runs, rejudge
from llmlab.tools.report.text import cell

__all__ = [
    "ORDER", "STYLE", "Run", "_lab_key", "_run_head", "build_html", "cell", "chart_figure", "chart_html",
    "device_card_html", "figure_png", "html_table", "lab_module", "lab_section", "load_runs", "rejudge",
    "run_parts", "verdict_table", "write_report",
]
