"""Saved runs, loaded and re-judged: every DIR/<lab>/*.json as a Run, or the reason it was skipped.

A run's lab module is found by name at load time (llmlab.labs.<name>), because its judge() and views()
live there: the report knows no lab by import, and a file of a lab that no longer exists is skipped.
"""

from __future__ import annotations

import importlib
import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from types import ModuleType

from llmlab.core.results import LabResult
from llmlab.tools.report.text import failure

# The labs in the order of the articles (a lab not listed here follows, alphabetically).
ORDER = ("tokens", "train-vs-infer", "five-steps", "prefill-decode", "gpu-parallelism", "roofline", "kvcache-growth",
         "samplers", "ttft-breakdown", "speculative", "serving")


@dataclass
class Run:
    """One saved run, loaded and re-judged."""

    path: Path
    result: LabResult
    module: ModuleType
    claims: list = field(default_factory=list)
    judge_note: str = ""  # empty when the saved verdicts came from the current judge

    @property
    def lab(self) -> str:
        return self.result.lab

    @property
    def card(self) -> dict:
        return self.result.env.get("device", {}) or {}

    @property
    def machine(self) -> str:
        """What runs are grouped by: the device and its name ("cuda:0 · NVIDIA H100", "cpu · AMD EPYC")."""
        return f"{self.card.get('device', '?')} · {self.card.get('name', '?')}"

    @property
    def stamp(self) -> str:
        return str(self.result.env.get("utc_stamp") or self.result.env.get("utc") or self.path.stem)

    @property
    def when(self) -> str:
        """The run's start as "2026-12-02 14:57 UTC" (the stamp as saved when it is not ISO)."""
        raw = str(self.result.env.get("utc") or self.stamp)
        for parse in (datetime.fromisoformat, _compact_utc):
            try:
                return parse(raw).astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
            except ValueError:
                continue
        return raw


def _compact_utc(text: str) -> datetime:
    """A stamp like 20261202T145700Z as a UTC datetime."""
    return datetime.strptime(text, "%Y%m%dT%H%M%SZ").replace(tzinfo=timezone.utc)


def lab_module(lab: str) -> ModuleType | None:
    """The lab's module (llmlab.labs.<name>), or None when there is no such lab."""
    if not re.fullmatch(r"[a-z0-9][a-z0-9_-]*", lab or ""):
        return None
    name = f"llmlab.labs.{lab.replace('-', '_')}"
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name and name.startswith(exc.name):  # the lab itself is missing, not one of its imports
            return None
        raise


def rejudge(result: LabResult, module: ModuleType) -> tuple[list, str]:
    """The current judge()'s claims and a note when they differ in version from the saved ones."""
    judge = getattr(module, "judge", None)
    saved = list(getattr(result, "claims", []) or [])
    if judge is None:
        return saved, "saved verdicts (this lab has no judge())"
    try:
        claims = list(judge(result))
    except Exception as exc:  # an old run may lack a table the judge now reads
        return saved, f"judge() failed on this run ({failure(exc)}); the saved verdicts are shown"
    now, then = getattr(module, "JUDGE_VERSION", None), getattr(result, "judge_version", None)
    note = "" if now == then else f"re-judged with judge v{now}; the run was saved with judge v{then}"
    return claims, note


def load_runs(results_dir: Path | str) -> tuple[list[Run], list[tuple[Path, str]]]:
    """Every DIR/<lab>/*.json as a Run, and (path, why) for each file skipped."""
    runs: list[Run] = []
    skipped: list[tuple[Path, str]] = []
    for path in sorted(Path(results_dir).glob("*/*.json")):
        try:
            result = LabResult.from_json(path.read_text(encoding="utf-8"))
        except Exception as exc:  # not JSON, another schema, a missing field: skip with the reason
            skipped.append((path, f"does not parse as a lab result ({failure(exc)})"))
            continue
        try:
            module = lab_module(result.lab)
        except Exception as exc:
            skipped.append((path, f"lab module for {result.lab!r} failed to import ({failure(exc)})"))
            continue
        if module is None:
            skipped.append((path, f"unknown lab {result.lab!r}"))
            continue
        claims, note = rejudge(result, module)
        runs.append(Run(path, result, module, claims, note))
    return runs, skipped


def _lab_key(lab: str) -> tuple[int, str]:
    """Sort key of a lab: the order of the articles, then unlisted labs alphabetically."""
    return (ORDER.index(lab) if lab in ORDER else len(ORDER), lab)


def gpu_first(machine: str) -> tuple[bool, str]:
    """Sort key of a machine: GPU runs first, then the CPU (the faster machine reads first)."""
    return (not machine.startswith("cuda"), machine)
