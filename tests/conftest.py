"""Shared fixtures. `quick_run(lab)`: the lab's --quick run through the CLI, once per test session.

Each lab's end-to-end checks (its own test file) and the report checks (tests/test_render.py)
read the same run: the saved JSON and the report printed at 80 columns off a TTY. Running every
lab once instead of twice keeps the suite inside its time budget on 2 cores.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest


@dataclass(frozen=True)
class QuickRun:
    lab: str
    returncode: int
    stdout: str  # the terminal report at COLUMNS=80, not a TTY
    stderr: str
    json_path: Path | None

    @property
    def data(self) -> dict:
        assert self.returncode == 0, self.stderr[-3000:]
        assert self.json_path is not None, f"{self.lab}: no JSON saved"
        return json.loads(self.json_path.read_text())


_RUNS: dict[str, QuickRun] = {}


@pytest.fixture(scope="session")
def quick_run(tmp_path_factory):
    def run(lab: str) -> QuickRun:
        if lab not in _RUNS:
            out = tmp_path_factory.mktemp(f"quick-{lab}")
            env = dict(os.environ, COLUMNS="80", HF_HUB_OFFLINE="1")
            p = subprocess.run([sys.executable, "-m", "llmlab", lab, "--quick", "--device", "cpu", "--out", str(out)],
                               capture_output=True, text=True, timeout=900, env=env)
            _RUNS[lab] = QuickRun(lab, p.returncode, p.stdout, p.stderr, next((out / lab).glob("*.json"), None))
        return _RUNS[lab]

    return run
