"""Text for the page: escaped HTML, shortened messages, table cells, byte sizes, plurals.

Cells and sizes read as in the terminal: a cell by render.fmt, a size as `llmlab env`'s card writes it.
"""

from __future__ import annotations

import html
from typing import Any

from llmlab.core.render import fmt as render_fmt
from llmlab.core.units import human_bytes

# A verdict's label and its CSS class, by Claim.holds.
VERDICT = {True: ("holds", "ok"), False: ("does not hold", "bad"), None: ("not measured", "na")}


def esc(s: Any) -> str:
    """s as HTML text, quotes escaped too (safe inside an attribute)."""
    return html.escape(str(s), quote=True)


def short(exc: BaseException, n: int = 120) -> str:
    """An exception's message on one line, cut to n characters."""
    s = " ".join(str(exc).split())
    return s if len(s) <= n else s[: n - 1] + "…"


def failure(exc: BaseException) -> str:
    """An exception as "TypeName: message" (one line, shortened), for a warning or a skip reason."""
    return f"{type(exc).__name__}: {short(exc)}"


def cell(v: Any, fmt: str = "", width: int = 0) -> str:
    """One table cell as text by a Col's fmt, exactly as the terminal report writes it (render.fmt)."""
    try:
        s = render_fmt(v, fmt)
    except (ValueError, TypeError):  # a format spec that does not fit the value
        s = str(v)
    s = s.replace("\n", " ")
    if width and len(s) > width:
        s = s[: max(1, width - 1)] + "…"
    return s


def nbytes(n: Any) -> str:
    """A size in bytes as `llmlab env`'s card writes it ("23.5 GiB"); a value that is not a number as saved."""
    return human_bytes(n) if isinstance(n, (int, float)) else str(n)


def plural(n: int, word: str) -> str:
    """A count and its noun: "1 run", "2 runs"."""
    return f"{n} {word}{'s' if n != 1 else ''}"
