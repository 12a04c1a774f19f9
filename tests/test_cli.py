"""The CLI end to end: --help, env --json, bad input -> exit 2 with one line, run_lab plumbing.

Bad input and --help go through cli.main() in this process (the `cli` fixture, tests/conftest.py): a subprocess
re-imports torch and transformers each time. One bad-input check stays a real `python -m llmlab` process."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import types

import pytest
import typer

from llmlab import cli
from llmlab.core.results import LabResult


def llmlab(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "llmlab", *args], capture_output=True, text=True, timeout=timeout)


def assert_one_line_error(p: subprocess.CompletedProcess | types.SimpleNamespace) -> None:
    assert p.returncode == 2, (p.returncode, p.stdout, p.stderr)
    lines = [line for line in p.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, p.stderr
    assert "Traceback" not in p.stderr and lines[0].startswith("error:")


def test_help_lists_env(cli):
    p = cli("--help")
    assert p.returncode == 0 and "env" in p.stdout


def test_env_json_is_the_device_card(cli):
    p = cli("env", "--json", "--seconds", "0.2")
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    assert d["device"]["device"] in ("cpu", "cuda:0")
    assert "torch" in d["device"]["versions"] and "transformers" in d["device"]["versions"]
    assert "telemetry" in d and d["telemetry"]["wall_s"] > 0


@pytest.mark.parametrize(
    "args",
    [
        ["env", "--gpu", "-1"],
        ["env", "--gpu", "99"],
        ["env", "--device", "tpu"],
        ["env", "--seconds", "abc"],
        ["env", "--no-such-option"],
    ],
)
def test_bad_input_exits_2_with_one_line(args, cli):
    assert_one_line_error(cli(*args))


def test_device_cuda_without_cuda_exits_2(cli):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    assert_one_line_error(cli("env", "--device", "cuda"))


# ---------------------------------------------------------------- run_lab, with a stand-in lab module


@dataclasses.dataclass(frozen=True)
class _Cfg:
    n: int = 3
    seed: int = 0
    boom: bool = False

    def __post_init__(self):
        if self.n < 1:
            raise ValueError("--n must be at least 1")

    @classmethod
    def quick(cls):
        return cls(n=1)


def _run(cfg, device, progress=None):
    res = LabResult.new("standin", 1, cfg)
    with res.guard():
        for i in range(cfg.n):
            res.add_table(f"part{i}", [{"i": i, "seed": cfg.seed}])
        if cfg.boom:
            raise KeyboardInterrupt
    return res


@pytest.fixture
def standin(monkeypatch):
    mod = types.ModuleType("llmlab.labs.standin")
    mod.Config, mod.run = _Cfg, _run
    monkeypatch.setitem(sys.modules, "llmlab.labs.standin", mod)
    return mod


def test_run_lab_saves_and_records_the_command(standin, tmp_path, capsys):
    cli.run_lab("standin", cli.Common(device="cpu", json=True, out=tmp_path, seed=7), n=2)
    d = json.loads(capsys.readouterr().out)
    assert d["config"] == {"n": 2, "seed": 7, "boom": False}
    assert d["env"]["seed"] == 7 and d["env"]["device"]["device"] == "cpu" and "command" in d["env"]
    saved = list((tmp_path / "standin").glob("*.json"))
    assert len(saved) == 1 and json.loads(saved[0].read_text())["tables"]["part1"]["rows"] == [[1, 7]]
    assert len(list((tmp_path / "standin").glob("*.csv"))) == 2


def test_run_lab_quick_and_no_save(standin, tmp_path, capsys):
    cli.run_lab("standin", cli.Common(device="cpu", quick=True, json=True, out=tmp_path / "x", no_save=True))
    assert json.loads(capsys.readouterr().out)["config"]["n"] == 1
    assert not (tmp_path / "x").exists()


def test_run_lab_bad_config_is_a_usage_error(standin, tmp_path):
    from llmlab.core.errors import UsageError

    with pytest.raises(UsageError, match="at least 1"):
        cli.run_lab("standin", cli.Common(device="cpu", out=tmp_path), n=0)


def test_run_lab_interrupt_saves_partial_and_exits_130(standin, tmp_path, capsys):
    with pytest.raises(typer.Exit) as e:
        cli.run_lab("standin", cli.Common(device="cpu", json=True, out=tmp_path), boom=True)
    assert e.value.exit_code == 130
    saved = json.loads(next((tmp_path / "standin").glob("*.json")).read_text())
    assert saved["interrupted"] is True and "part2" in saved["tables"]


def test_run_lab_unwritable_out_refuses_before_measuring(standin):
    from llmlab.core.errors import UsageError

    with pytest.raises(UsageError, match="--out"):
        cli.run_lab("standin", cli.Common(device="cpu", out="/proc/llmlab"))


# ---------------------------------------------------------------- the common options on a real lab


@pytest.mark.parametrize(
    "args",
    [
        ["--seed", "abc"],
        ["--gpu", "-1"],
        ["--gpu", "99"],
        ["--device", "tpu"],
        ["--out", "/proc/llmlab-results"],  # cannot be created, even by root
        ["--out", "/nonexistent-parent/results"],
    ],
)
def test_lab_common_bad_input_exits_2(args, cli):
    device = [] if {"--device", "--gpu"} & set(args) else ["--device", "cpu"]
    assert_one_line_error(cli("gpu-parallelism", "--quick", *device, *args))


def test_lab_bad_input_exits_2_in_a_real_process():
    """The one bad-input check through `python -m llmlab` itself: the lab module is imported, run_lab refuses the
    device, and the entry point prints one line and exits 2 (every other bad-input test runs cli.main in-process)."""
    assert_one_line_error(llmlab("gpu-parallelism", "--quick", "--device", "tpu"))


def test_every_lab_has_a_teaching_help(cli):
    for lab in ("gpu-parallelism", "roofline", "kvcache-growth", "samplers", "ttft-breakdown", "ttft", "speculative"):
        p = cli(lab, "--help")
        assert p.returncode == 0, (lab, p.stderr)
        assert "--quick" in p.stdout and "--device" in p.stdout and "--json" in p.stdout


def _sigint_default() -> None:
    """preexec_fn: a child of a parent that ignores SIGINT (`make test &`, nohup) inherits SIG_IGN, and
    Python then installs no KeyboardInterrupt handler: put the default back before exec."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _popen_interruptible(args: list[str], **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, *args], preexec_fn=_sigint_default, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **kw)


def test_ctrl_c_child_gets_sigint_even_when_the_parent_ignores_it():
    import signal

    old = signal.signal(signal.SIGINT, signal.SIG_IGN)  # what `make test &` or nohup does to the test run
    try:
        code = "import signal; print(signal.getsignal(signal.SIGINT) is signal.default_int_handler)"
        p = _popen_interruptible(["-c", code])
        out, err = p.communicate(timeout=60)
    finally:
        signal.signal(signal.SIGINT, old)
    assert out.strip() == "True", (out, err)  # the child turns Ctrl-C into KeyboardInterrupt


def test_ctrl_c_during_a_lab_saves_what_was_measured_and_exits_130(tmp_path):
    import signal
    import time

    # Pinned to the CPU: on a GPU host `auto` would take the GPU, whose parts take a different time to reach.
    # CUDA_VISIBLE_DEVICES="" rather than --device cpu because only `auto` prints the "device:" line that
    # says the lab is about to measure (a non-TTY progress display prints nothing until it stops).
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    p = _popen_interruptible(["-m", "llmlab", "gpu-parallelism", "--out", str(tmp_path)], env=env)
    line = p.stderr.readline()  # "device: cpu (...)": printed once the lab is about to start measuring
    assert line.startswith("device: cpu"), line
    time.sleep(2.0)  # the full run takes tens of seconds: this lands inside the first part
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=120)
    assert p.returncode == 130, err
    assert "judge failed" not in err  # a sweep cut mid-way is set aside by the judge, not a crash
    saved = json.loads(next((tmp_path / "gpu-parallelism").glob("*.json")).read_text())
    assert saved["interrupted"] is True
    assert any(t["rows"] for t in saved["tables"].values())  # something measured before the interrupt was kept


def test_run_lab_runs_the_lab_with_its_device_active(standin, tmp_path, monkeypatch, capsys):
    """--gpu N: torch.cuda.set_device(N) for the whole lab, through Device.activate."""
    import contextlib

    from llmlab.core import device as D

    seen = []

    @contextlib.contextmanager
    def activate(self):
        seen.append(("enter", self.spec))
        yield
        seen.append(("exit", self.spec))

    monkeypatch.setattr(D.Device, "activate", activate)
    run = standin.run
    monkeypatch.setattr(standin, "run",
                        lambda cfg, dev, progress=None: (seen.append(("run", dev.spec)), run(cfg, dev, progress))[1])
    cli.run_lab("standin", cli.Common(device="cpu", json=True, out=tmp_path))
    assert seen == [("enter", "cpu"), ("run", "cpu"), ("exit", "cpu")]
