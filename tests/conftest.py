"""Shared fixtures. `quick_run(lab)`: the lab's --quick run through the CLI, once per test session.

Each lab's end-to-end checks (its own test file) and the report checks (tests/test_render.py)
read the same run: the saved JSON and the report printed at 80 columns off a TTY. Running every
lab once instead of twice keeps the suite inside its time budget on 2 cores.

`start_serve(*args)`: a real `llmlab serve` subprocess on 127.0.0.1 and a free port, up and healthy.

`cli(*args)`: `llmlab ARGS` through `llmlab.main.main()` in this process: (returncode, stdout,
stderr). For bad input (exit 2, one `error:` line) and --help: a subprocess re-imports torch and
transformers, 3-6 s each time. tests/test_cli.py keeps one bad-input check in a real process, for
the entry point's own exit-2 path.

Two streams on the 2 cores: a test that asks for a quick run not yet started runs it itself, while a
background thread runs the others one at a time, starting from the one the selected tests ask for last:
the two meet in the middle, and neither waits long for the other.

Every process of the session uses one torch thread (OMP_NUM_THREADS=1, set here before torch loads):
two multi-threaded OpenMP processes on 2 cores spin-wait on each other's descheduled threads, and a
tiny decode runs 10x slower that way. Set OMP_NUM_THREADS yourself to override.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import types
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")  # before torch loads (see the docstring); subprocesses inherit it

import pytest  # noqa: E402


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


# the module of each lab's own end-to-end test (tests/test_render.py passes the lab as its `lab` parameter)
_QUICK_USERS = {"test_gpu_parallelism": "gpu-parallelism", "test_kvcache_growth": "kvcache-growth",
                "test_prefill_decode": "prefill-decode", "test_roofline": "roofline", "test_samplers": "samplers",
                "test_speculative_lab": "speculative", "test_ttft_breakdown": "ttft-breakdown",
                "test_tokens": "tokens"}


class _QuickRuns:
    """Each lab's quick run once per session: run by the first test that asks, or ahead by a background thread."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.runs: dict[str, Future] = {}
        self.procs: set[subprocess.Popen] = set()
        self.out: Path | None = None
        self.stopping = False

    def get(self, lab: str) -> QuickRun:
        with self.lock:
            fut, mine = self.runs.get(lab), False
            if fut is None:
                fut = self.runs[lab] = Future()
                mine = True
        if mine:
            self._run(lab, fut)
        return fut.result()

    def ahead(self, labs: list[str]) -> None:
        for lab in labs:
            with self.lock:
                if self.stopping or lab in self.runs:
                    continue
                fut = self.runs[lab] = Future()
            self._run(lab, fut)

    def _run(self, lab: str, fut: Future) -> None:
        try:
            out = self.out / f"quick-{lab}"
            env = dict(os.environ, COLUMNS="80", HF_HUB_OFFLINE="1")
            cmd = [sys.executable, "-m", "llmlab", lab, "--quick", "--device", "cpu", "--out", str(out)]
            with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env) as p:
                self.procs.add(p)
                try:
                    stdout, stderr = p.communicate(timeout=900)
                finally:
                    self.procs.discard(p)
            fut.set_result(QuickRun(lab, p.returncode, stdout, stderr, next((out / lab).glob("*.json"), None)))
        except BaseException as exc:  # noqa: BLE001 - the test that waits on it sees the error
            fut.set_exception(exc)

    def stop(self) -> None:
        with self.lock:
            self.stopping = True
        for p in list(self.procs):
            p.kill()


_QUICK = _QuickRuns()


def _quick_lab(item) -> str | None:
    if "quick_run" not in getattr(item, "fixturenames", ()):
        return None
    params = getattr(getattr(item, "callspec", None), "params", {})
    return params.get("lab") or _QUICK_USERS.get(item.module.__name__.rsplit(".", 1)[-1])


@pytest.hookimpl(trylast=True)  # after -k / -m deselection: run ahead only the quick runs the selected tests need
def pytest_collection_modifyitems(session, config, items):
    labs = list(dict.fromkeys(lab for lab in map(_quick_lab, items) if lab))
    config._llmlab_quick_ahead = labs  # started by the session fixture below, once the tests begin


@pytest.fixture(scope="session", autouse=True)
def _quick_runs_ahead(request, tmp_path_factory):
    _QUICK.out = tmp_path_factory.mktemp("quick")
    labs = getattr(request.config, "_llmlab_quick_ahead", [])
    worker = threading.Thread(target=_QUICK.ahead, args=(labs[::-1],), name="quick-runs-ahead", daemon=True)
    if len(labs) > 1:  # one lab: the test that asks runs it
        worker.start()
    yield
    _QUICK.stop()
    if worker.is_alive():
        worker.join(timeout=30)


@pytest.fixture(scope="session")
def quick_run():
    return _QUICK.get


@pytest.fixture
def cli(capsys, monkeypatch):
    """`cli(*args, columns=80, env=None)`: `llmlab ARGS` in this process, its error handling included
    (main() always calls sys.exit).

    Only for what stops before measuring (bad input, --help): a lab that runs here would leave its state
    behind. Env read at import time (CUDA_VISIBLE_DEVICES once torch has started) needs a real subprocess.
    The seeds run_lab sets before a lab's own checks fail are put back afterwards.
    """
    from llmlab import main as llmlab_cli

    def run(*args: str, columns: int = 80, env: dict[str, str] | None = None) -> types.SimpleNamespace:
        monkeypatch.setattr(sys, "argv", ["llmlab", *args])
        monkeypatch.setenv("COLUMNS", str(columns))
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
        hub = sys.modules.get("huggingface_hub.constants")
        if hub is not None:  # read once at import: the variable alone would not take offline mode in this process
            monkeypatch.setattr(hub, "HF_HUB_OFFLINE", True)
        for k, v in (env or {}).items():
            monkeypatch.setenv(k, v)
        capsys.readouterr()  # drop what the test printed before
        rng = _rng_state()
        try:
            with pytest.raises(SystemExit) as exc:
                llmlab_cli.main()
        finally:
            _set_rng_state(rng)
        out = capsys.readouterr()
        return types.SimpleNamespace(returncode=exc.value.code, stdout=out.out, stderr=out.err)

    return run


def _rng_state() -> tuple:
    """The global generators already imported (a --help run imports neither numpy nor torch)."""
    import random

    np, torch = sys.modules.get("numpy"), sys.modules.get("torch")
    cuda = torch.cuda.get_rng_state_all() if torch is not None and torch.cuda.is_initialized() else None
    return (random.getstate(), np and np.random.get_state(), torch and torch.get_rng_state(), cuda)


def _set_rng_state(state: tuple) -> None:
    import random

    py, np_state, torch_state, cuda = state
    random.setstate(py)
    if np_state is not None:
        sys.modules["numpy"].random.set_state(np_state)
    if torch_state is not None:
        sys.modules["torch"].set_rng_state(torch_state)
    if cuda is not None:
        sys.modules["torch"].cuda.set_rng_state_all(cuda)


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
