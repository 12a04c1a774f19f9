"""One package per lab: `config.Config` (with `.quick()`), `run()` (measures), `judge()` (verdicts), `views()`.

`module(lab)` finds a lab's package by its command name; `judged(result)` re-judges a result
(saved or fresh) with its lab's current judge and returns what the report needs.

Optional hooks `cli.run_lab` calls when a lab defines them: `check(cfg)` before the run (raise
UsageError: one line, exit 2; it may return the Config with what it found, as the ttft lab does with
its --endpoint's card), `headline(result, claims)`, `figures(result)` (the HTML report), and
`exit_code(result) -> (code, message) | None` after the result is saved (the ttft lab's 3 when every
request to an endpoint failed).
"""

from __future__ import annotations

import importlib
from dataclasses import replace
from types import ModuleType


def module(lab: str) -> ModuleType:
    """The module of a lab named as on the command line ("kvcache-growth") or in a result ("kvcache-growth")."""
    return importlib.import_module(f"llmlab.labs.{lab.replace('-', '_')}")


def of_endpoint(result) -> bool:
    """A run of a lab's --endpoint mode (ttft-breakdown, speculative): a lab of its own, with its own tables,
    claims and views, which the lab's judge, views and headline hand to its endpoint module."""
    return bool(result.config.get("endpoint"))


def endpoint_hooks(endpoint: ModuleType, verdicts: ModuleType, report: ModuleType):
    """(judge, views, headline, exit_code) of a lab with an --endpoint mode: a run of that mode goes to the
    lab's endpoint module, any other to its verdicts (judge) and report (views, headline; no exit code)."""

    def judge(result):
        return (endpoint if of_endpoint(result) else verdicts).judge(result)

    def views(result):
        return (endpoint if of_endpoint(result) else report).views(result)

    def headline(result, claims) -> str:
        return (endpoint if of_endpoint(result) else report).headline(result, claims)

    def exit_code(result) -> tuple[int, str] | None:
        return endpoint.exit_code(result) if of_endpoint(result) else None

    return judge, views, headline, exit_code


def judged(result, mod: ModuleType | None = None):
    """(claims, views, headline) of `result` from its lab's current judge(), views() and headline().

    A lab module without judge() keeps the claims its run made; without views() the report
    shows its tables in full.
    """
    mod = mod or module(result.lab)
    partial = result.interrupted and hasattr(mod, "judge")
    claims, headline = _judge_partial(result, mod) if partial else _judge(result, mod)
    views = mod.views(result) if hasattr(mod, "views") else None
    return claims, views, headline


def _judge(result, mod: ModuleType):
    """(claims, headline) of `result`: the lab's judge() and headline(), or the claims its run made."""
    claims = mod.judge(result) if hasattr(mod, "judge") else result.claims
    return claims, mod.headline(result, claims) if hasattr(mod, "headline") else ""


def _judge_partial(result, mod: ModuleType):
    """Judge an interrupted run: the table being filled when Ctrl-C came may hold a part of its rows, which
    a verdict must not read as a full sweep. Set tables aside, the newest first, until the judge (and the
    headline) run on the rest; the report keeps every table and says which ones no verdict used."""
    names = list(result.tables)
    for keep in range(len(names), -1, -1):
        basis = replace(result, tables={n: result.tables[n] for n in names[:keep]}, claims=[], notes=[])
        try:
            judged_here = _judge(basis, mod)
        except Exception:
            if keep == 0:
                raise  # the judge fails without any table: a bug in it, not a partial table
            continue
        aside = names[keep:]
        if aside:
            result.note(f"not judged from {', '.join(aside)}: the run was interrupted while "
                        f"{'it was' if len(aside) == 1 else 'they were'} being measured")
        return judged_here
