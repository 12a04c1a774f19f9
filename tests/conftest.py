"""Shared fixtures. `quick_run(lab)`: the lab's --quick run through the CLI, once per test session.

Each lab's end-to-end checks (its own test file) and the report checks (tests/test_render.py)
read the same run: the saved JSON and the report printed at 80 columns off a TTY. Running every
lab once instead of twice keeps the suite inside its time budget on 2 cores.

`start_serve(*args)`: a real `llmlab serve` subprocess on 127.0.0.1 and a free port, up and healthy.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
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


ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_serve(*args: str) -> tuple[str, subprocess.Popen]:
    """`llmlab serve --model tiny --device cpu ARGS` on a free port; (base URL, process) once /health answers."""
    import httpx

    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable, "-m", "llmlab", "serve", "--model", "tiny", "--device", "cpu", "--port", str(port), *args]
    log = tempfile.TemporaryFile("w+")  # a file, not a pipe: a pipe nobody reads fills up and blocks the server
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, text=True)
    proc.log = log
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            log.seek(0)
            pytest.fail("server exited: " + log.read())
        try:
            if httpx.get(base + "/health", timeout=1).status_code == 200:
                return base, proc
        except httpx.HTTPError:
            time.sleep(0.5)
    proc.kill()
    pytest.fail("server did not come up")


def stop_serve(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait()
