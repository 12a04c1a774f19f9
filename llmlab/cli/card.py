"""`llmlab env` as a card a person reads: one line per fact, sizes in binary units, flags as a list.

The card is drawn from the same dict `llmlab env --json` prints, so the two never disagree: a
nested section becomes indented lines, a key ending in `_bytes` a size (48 KiB, 23.5 GiB), a dict
of booleans the names of those that are true, a dict of sizes one line of "name size" pairs.
"""

from __future__ import annotations

import textwrap
from typing import Any

from llmlab.core.units import human_bytes

TITLES = {"device": "Device", "spec": "Spec sheet (napkin peaks, not measured)", "telemetry": "Telemetry sample"}
KEY_WIDTH = 22


def value_text(key: str, value: Any) -> str:
    """One value as text: sizes for *_bytes, the true names of a dict of flags, pairs for a dict of sizes."""
    if value is None:
        return "-"
    if isinstance(value, dict) and value and all(isinstance(v, bool) for v in value.values()):
        return " ".join(k for k, v in value.items() if v) or "none"
    if isinstance(value, dict) and key.endswith("_bytes"):
        return ", ".join(f"{k} {human_bytes(v)}" for k, v in value.items())
    if isinstance(value, dict):
        return ", ".join(f"{k} {value_text(k, v)}" for k, v in value.items())
    if key.endswith("_bytes") and isinstance(value, (int, float)):
        return human_bytes(value)
    if isinstance(value, float):
        return f"{value:,.4g}"
    if isinstance(value, (list, tuple)):
        return ", ".join(map(str, value))
    return str(value)


def _label(key: str) -> str:
    return key.removesuffix("_bytes").replace("_", " ")


def section_lines(data: dict, width: int, indent: str = "  ") -> list[str]:
    """The lines of one section: `key  value`, wrapped under the value's column; sub-sections indented."""
    lines: list[str] = []
    for key, value in data.items():
        flags = isinstance(value, dict) and value and all(isinstance(v, bool) for v in value.values())
        nested = isinstance(value, dict) and value and any(isinstance(v, dict) for v in value.values())
        if nested or (isinstance(value, dict) and len(value) > 6 and not key.endswith("_bytes") and not flags):
            lines.append(f"{indent}{_label(key)}")
            lines += section_lines(value, width, indent + "  ")
            continue
        head = f"{indent}{_label(key):<{KEY_WIDTH - len(indent) + 2}} "
        body = textwrap.wrap(value_text(key, value), max(width - len(head), 20)) or ["-"]
        lines.append(head + body[0])
        lines += [" " * len(head) + more for more in body[1:]]
    return lines


def card_lines(data: dict, width: int) -> list[str]:
    """Every section of the env dict under its title."""
    lines: list[str] = []
    for name, section in data.items():
        lines.append(TITLES.get(name, name))
        lines += section_lines(section, width) if isinstance(section, dict) else [f"  {section}"]
        lines.append("")
    return lines[:-1]
