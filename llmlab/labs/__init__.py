"""One module per lab: `Config` (with `.quick()`), `run()` (measures), `judge()` (verdicts), `views()` (the report).

`module(lab)` finds a lab's module by its command name; `judged(result)` re-judges a result
(saved or fresh) with its lab's current judge and returns what the report needs.

Optional hooks `cli.run_lab` calls when a lab defines them: `check(cfg)` before the run (raise
UsageError: one line, exit 2; the ttft lab asks its --endpoint what it is), `headline(result, claims)`,
`figures(result)` (the HTML report), and `exit_code(result) -> (code, message) | None` after the
result is saved (the ttft lab's 3 when every request to an endpoint failed).
Modules whose name starts with "_" are parts of a lab, not labs (`_ttft_endpoint`).
"""

from __future__ import annotations

import importlib
from dataclasses import replace
from types import ModuleType


def module(lab: str) -> ModuleType:
    """The module of a lab named as on the command line ("kvcache-growth") or in a result ("kvcache-growth")."""
    return importlib.import_module(f"llmlab.labs.{lab.replace('-', '_')}")


def judged(result, mod: ModuleType | None = None):
    """(claims, views, headline) of `result` from its lab's current judge(), views() and headline().

    A lab module without judge() keeps the claims its run made; without views() the report
    shows its tables in full.
    """
    mod = mod or module(result.lab)
    if not hasattr(mod, "judge"):
        claims, basis = result.claims, result
    elif not result.interrupted:
        claims, basis = mod.judge(result), result
    else:
        claims, basis = _judge_partial(result, mod)
    views = mod.views(result) if hasattr(mod, "views") else None
    headline = mod.headline(basis, claims) if hasattr(mod, "headline") else ""
    return claims, views, headline


def _judge_partial(result, mod: ModuleType):
    """Judge an interrupted run: the table being filled when Ctrl-C came may hold a part of its rows, which
    a verdict must not read as a full sweep. Set tables aside, the newest first, until the judge runs on
    the rest; the report keeps every table and says which ones no verdict used."""
    names = list(result.tables)
    for cut in range(len(names) + 1):
        kept = names[:len(names) - cut]
        basis = replace(result, tables={n: result.tables[n] for n in kept}, claims=[], notes=[])
        try:
            claims = mod.judge(basis)
            if hasattr(mod, "headline"):
                mod.headline(basis, claims)
        except Exception:
            if not kept:
                raise  # the judge fails without any table: a bug in it, not a partial table
            continue
        aside = names[len(kept):]
        if aside:
            result.note(f"not judged from {', '.join(aside)}: the run was interrupted while "
                        f"{'it was' if len(aside) == 1 else 'they were'} being measured")
        return claims, basis
    raise AssertionError("unreachable")
