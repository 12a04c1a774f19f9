"""The lab commands are generated from each lab's Config: every field an option, defaults never retyped."""

from __future__ import annotations

import dataclasses
import pkgutil
import re
from typing import Optional

import pytest
import typer
from typer.testing import CliRunner

import llmlab.labs
from llmlab.cli import labs as L
from llmlab.core.config import flag_of, opt, option_of

COMMON_FLAGS = {"--device", "-d", "--gpu", "--quick", "--json", "--out", "--no-save", "--seed", "--tables", "--help"}


def test_every_lab_in_the_package_has_a_command_in_the_series_order():
    found = {m.name.replace("_", "-") for m in pkgutil.iter_modules(llmlab.labs.__path__) if not m.name.startswith("_")}
    assert found == set(L.LAB_ORDER)
    assert len(L.LAB_ORDER) == len(set(L.LAB_ORDER))


@pytest.mark.parametrize("lab", L.LAB_ORDER)
def test_every_config_field_has_a_flag_with_help(lab):
    cfg = L.config_class(lab)
    fields = L.lab_fields(cfg)
    missing = [f.name for f in fields if not (option_of(f) or {}).get("help", "").strip()]
    assert not missing, f"{lab}: Config fields without opt(help=...): {missing}"
    flags = [flag_of(f) for f in fields] + [(option_of(f) or {}).get("short") for f in fields]
    flags = [x for x in flags if x]
    assert len(flags) == len(set(flags)), f"{lab}: a flag is used twice"
    assert not set(flags) & COMMON_FLAGS, f"{lab}: a field's flag shadows a common option"


@pytest.mark.parametrize("lab", L.LAB_ORDER)
def test_help_states_each_default_and_quick_value_from_the_dataclass(lab):
    cfg = L.config_class(lab)
    full, quick = cfg(), cfg.quick()
    for f in L.lab_fields(cfg):
        text = L.help_of(f, getattr(full, f.name), getattr(quick, f.name))
        if getattr(full, f.name) is not None:
            assert f"Default {L.show(getattr(full, f.name))}" in text, (lab, f.name, text)
        if getattr(quick, f.name) != getattr(full, f.name):
            assert f"({L.show(getattr(quick, f.name))} with --quick)" in text, (lab, f.name, text)


@pytest.mark.parametrize("lab", L.LAB_ORDER)
def test_lab_help_lists_every_flag(cli, lab):
    r = cli(lab, "--help", columns=200)
    assert r.returncode == 0
    for f in L.lab_fields(L.config_class(lab)):
        if not (option_of(f) or {}).get("hidden"):
            assert flag_of(f) in r.stdout, f"{lab} --help does not show {flag_of(f)}"


@dataclasses.dataclass(frozen=True)
class Toy:
    """A toy lab: its docstring is the command's help.

    The long paragraph.
    """

    models: tuple[str, ...] = opt(("tiny",), help="Models (repeatable).", flag="--model", short="-m")
    sizes: tuple[int, ...] = opt((1, 2), help="Sizes, comma-separated.")
    rate: Optional[float] = opt(None, help="Arrivals per second; default: as fast as the server answers.")
    greedy: bool = opt(False, help="Greedy only.")
    seed: int = 0

    @classmethod
    def quick(cls) -> Toy:
        return cls(sizes=(1,))


def _toy(monkeypatch, *args):
    seen = {}
    monkeypatch.setattr(L, "run_lab", lambda lab, common, **given: seen.update(given, _quick=common.quick))
    app = typer.Typer()
    app.command("toy")(L.make_command("toy", Toy))
    app.command("other")(lambda: None)  # two commands: Typer keeps the subcommand name
    return CliRunner().invoke(app, ["toy", *args], env={"COLUMNS": "300"}), seen


def test_tuples_take_commas_or_repeats_and_only_given_options_reach_the_lab(monkeypatch):
    r, seen = _toy(monkeypatch, "-m", "a,b", "--model", "c", "--sizes", "4, 8", "--greedy")
    assert r.exit_code == 0, r.output
    assert seen == {"models": ("a", "b", "c"), "sizes": (4, 8), "greedy": True, "_quick": False}
    r, seen = _toy(monkeypatch, "--quick")
    assert seen == {"_quick": True}  # --quick's base decides every field not given


def test_a_bad_number_is_a_usage_error(monkeypatch):
    r, _ = _toy(monkeypatch, "--sizes", "4,x")
    assert r.exit_code != 0 and "whole numbers" in str(r.exception)


def test_help_comes_from_the_dataclass(monkeypatch):
    r, _ = _toy(monkeypatch, "--help")
    text = re.sub(r"\s+", " ", r.output.replace("│", " "))
    assert "A toy lab: its docstring is the command's help." in text
    assert "Sizes, comma-separated. Default 1,2 (1 with --quick)." in text
    assert "Arrivals per second; default: as fast as the server answers." in text and "Default none" not in text
