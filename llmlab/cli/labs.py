"""One command per lab, generated from the lab's Config.

A lab's `Config` (a frozen dataclass, its fields declared with `llmlab.core.config.opt`) is the
single source of its command: each field becomes an option (flag, help, type), its default and its
`--quick` value are read from `Config()` and `Config.quick()` and appended to the help, and the
Config's docstring is the command's help. Nothing here repeats a lab's default.

Every option is parsed as "not given" (None) unless the user gives it, so `--quick` picks the
quick base and only the options given replace its fields. A tuple field takes comma-separated
values or the option repeated (`--model tiny --model tiny-draft` = `--model tiny,tiny-draft`).
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import types
import typing
from typing import Annotated, Any, Optional

import typer

from llmlab.cli.app import (
    COMMON,
    LABS,
    Common,
    DeviceOpt,
    GpuOpt,
    JsonOpt,
    NoSaveOpt,
    OutOpt,
    QuickOpt,
    SeedOpt,
    TablesOpt,
    app,
    run_lab,
)
from llmlab.core.config import flag_of, option_of
from llmlab.core.errors import UsageError

# The labs in the order of the series (the order of `llmlab --help`), and their short aliases.
LAB_ORDER = ("tokens", "train-vs-infer", "five-steps", "prefill-decode", "gpu-parallelism", "roofline",
             "kvcache-growth", "samplers", "ttft-breakdown", "speculative", "serving", "quantization",
             "tensor-parallel")
ALIASES = {"ttft-breakdown": ("ttft",)}

# Options every lab takes: (parameter name, annotation, default), after the lab's own.
COMMON_PARAMS = (("device", DeviceOpt, "auto"), ("gpu", GpuOpt, None), ("quick", QuickOpt, False),
                 ("json_", JsonOpt, False), ("out", OutOpt, "results"), ("no_save", NoSaveOpt, False),
                 ("seed", SeedOpt, 0), ("tables", TablesOpt, "report"))
COMMON_FIELDS = {"seed"}  # Config fields a common option sets


def config_class(lab: str) -> type:
    """A lab's Config, imported without the lab's heavy parts: `llmlab.labs.<lab>.config` in a lab package."""
    name = f"llmlab.labs.{lab.replace('-', '_')}"
    try:
        return importlib.import_module(name + ".config").Config
    except ModuleNotFoundError as exc:
        if exc.name != name + ".config":
            raise
        return importlib.import_module(name).Config


def _base_type(hint: Any) -> tuple[type, bool]:
    """(element type, is_tuple) of a field's type hint; `X | None` is X (None: the lab decides)."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if typing.get_origin(hint) in (typing.Union, types.UnionType) and len(args) == 1:
        return _base_type(args[0])
    if typing.get_origin(hint) is tuple:
        return args[0], True
    return hint, False


def show(value: Any) -> str:
    """A default as the user types it: tuples comma-separated, floats without trailing zeros."""
    if isinstance(value, tuple):
        return ",".join(show(v) for v in value) if value else "none"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, bool):
        return "on" if value else "off"
    return "''" if value == "" else str(value)


def help_of(field: dataclasses.Field, full: Any, quick: Any) -> str:
    """The field's help with its default, and its --quick value where that differs."""
    text = (option_of(field) or {}).get("help", "").rstrip()
    if full is None and quick is None:
        return text
    default = f"Default {show(full)}" + (f" ({show(quick)} with --quick)" if quick != full else "")
    return f"{text} {default}." if text else f"{default}."


def _option(field: dataclasses.Field, hint: Any, full: Any, quick: Any) -> tuple[str, Any]:
    """(parameter name, Annotated type) of one Config field's option."""
    meta = option_of(field) or {}
    elem, is_tuple = _base_type(hint)
    names = [flag_of(field)] + ([meta["short"]] if meta.get("short") else [])
    if elem is bool and not is_tuple:
        names = [f"{names[0]}/--no-{names[0][2:]}"]
    kind = Optional[list[str]] if is_tuple else Optional[elem]
    metavar = f"<{elem.__name__},...>" if is_tuple else None
    info = typer.Option(*names, help=help_of(field, full, quick), show_default=False, hidden=meta.get("hidden", False),
                        rich_help_panel=meta.get("panel"), metavar=metavar)
    return field.name, Annotated[kind, info]


def _parse(field: dataclasses.Field, hint: Any, value: Any) -> Any:
    """A given option's value as the field's type: a tuple from comma-separated or repeated values."""
    elem, is_tuple = _base_type(hint)
    if not is_tuple:
        return value
    parts = [p.strip() for v in value for p in str(v).split(",") if p.strip()]
    try:
        return tuple(elem(p) for p in parts)
    except ValueError:
        kind = {int: "whole numbers", float: "numbers"}.get(elem, "values")
        raise UsageError(f"{flag_of(field)} {','.join(map(str, value))!r}: give {kind} separated by commas") from None


def lab_fields(cfg_cls: type) -> list[dataclasses.Field]:
    """The fields of a Config that get their own option: every one but those a common option sets and those a
    lab's `check()` fills in with what it found (`metadata={"found": True}`, e.g. an endpoint's card)."""
    return [f for f in dataclasses.fields(cfg_cls) if f.name not in COMMON_FIELDS and not f.metadata.get("found")]


def make_command(lab: str, cfg_cls: type):
    """The Typer callback of one lab: its Config's fields as options, then the common options."""
    hints = typing.get_type_hints(cfg_cls)
    full, quick = cfg_cls(), cfg_cls.quick()
    fields = lab_fields(cfg_cls)
    params = []
    for f in fields:
        name, annotation = _option(f, hints[f.name], getattr(full, f.name), getattr(quick, f.name))
        params.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=annotation))
    kw_only = inspect.Parameter.KEYWORD_ONLY
    params += [inspect.Parameter(n, kw_only, default=d, annotation=a) for n, a, d in COMMON_PARAMS]

    def command(**kw) -> None:
        common = Common(kw.pop("device"), kw.pop("gpu"), kw.pop("quick"), kw.pop("json_"), kw.pop("out"),
                        kw.pop("no_save"), kw.pop("seed"), kw.pop("tables"))
        given = {f.name: _parse(f, hints[f.name], kw[f.name]) for f in fields if kw.get(f.name) is not None}
        run_lab(lab, common, **given)

    command.__signature__ = inspect.Signature(params)
    command.__name__ = lab.replace("-", "_")
    command.__doc__ = help_text(cfg_cls.__doc__ or lab)
    return command


def help_text(doc: str) -> str:
    """A docstring as command help: each paragraph on one line (rich prints a line break inside the summary
    in the command list), paragraphs apart."""
    paragraphs = inspect.cleandoc(doc).split("\n\n")
    return "\n\n".join(" ".join(line.strip() for line in p.splitlines()) for p in paragraphs)


def register(names: tuple[str, ...] = LAB_ORDER) -> None:
    """Add one command per lab (and its aliases, hidden) to the app."""
    for lab in names:
        command = make_command(lab, config_class(lab))
        app.command(lab, rich_help_panel=LABS, help=command.__doc__)(command)
        for alias in ALIASES.get(lab, ()):
            app.command(alias, rich_help_panel=LABS, hidden=True, help=command.__doc__)(command)


__all__ = ["COMMON", "LAB_ORDER", "config_class", "help_of", "lab_fields", "make_command", "register"]
