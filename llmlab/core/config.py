"""A lab's Config field, with the command-line option it becomes.

Every lab's `Config` is a frozen dataclass whose fields are declared with `opt()`: the default, a
help text that teaches (units, range, why this value), and optionally the flag's name when it is
not the field's (`--model` for `models`). The CLI builds each lab's command from these fields, so
a default or a `--quick` value is written once, in the dataclass, and the help shows both:

    prompt_lens: tuple[int, ...] = opt((64, 256, 1024), help="Prompt lengths T, comma-separated.")

Types the CLI knows: str, int, float, bool, `X | None` (None: "auto", the lab decides) and
`tuple[X, ...]` (comma-separated values, or the option repeated). Range checks stay in the
Config's `__post_init__`, so a notebook's Config gets the same errors as the command line.
"""

from __future__ import annotations

import dataclasses
from typing import Any


def opt(default: Any = dataclasses.MISSING, *, help: str, flag: str | None = None, short: str | None = None,
        panel: str | None = None, hidden: bool = False) -> Any:
    """A dataclass field whose metadata carries its command-line option.

    help: what the value means, with its unit and range; the CLI adds "Default X (Y with --quick)".
    flag: the option's name when it is not `--field-name`; short: a one-letter alias ("-m").
    panel: the `--help` group of the option when it is not the lab's own (e.g. "Against a running server").
    hidden: an option for tests and experts, left out of `--help`.
    """
    meta = {"help": help, "flag": flag, "short": short, "panel": panel, "hidden": hidden}
    return dataclasses.field(default=default, metadata=meta)


def option_of(field: dataclasses.Field) -> dict | None:
    """The option metadata `opt()` attached to a field, or None for a field declared without it."""
    return dict(field.metadata) if "help" in field.metadata else None


def flag_of(field: dataclasses.Field) -> str:
    """The field's command-line flag: its own `flag=`, else `--field-name`."""
    meta = option_of(field) or {}
    return meta.get("flag") or "--" + field.name.replace("_", "-")
