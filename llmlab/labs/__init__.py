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
    try:
        claims = mod.judge(result) if hasattr(mod, "judge") else result.claims
    except (KeyError, IndexError, ValueError, AttributeError):
        if not result.interrupted:
            raise
        claims = []  # an interrupted run may lack the tables a verdict needs: judge nothing rather than guess
        result.note("not judged: the run was interrupted before the tables the claims need were measured")
    views = mod.views(result) if hasattr(mod, "views") else None
    headline = mod.headline(result, claims) if hasattr(mod, "headline") else ""
    return claims, views, headline
