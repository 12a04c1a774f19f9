"""`make install` on a GPU machine and `make gpu-check` (issue 12 items 20, 21), testable without a GPU."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from llmlab.core import gpucheck

ROOT = Path(__file__).resolve().parents[1]
SMI_124 = "| NVIDIA-SMI 550.54.15    Driver Version: 550.54.15    CUDA Version: 12.4     |\n"


# ---------------------------------------------------------------- item 20: make install on a GPU machine


def test_install_check_explains_a_cpu_torch_with_the_pip_command(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.version, "cuda", None)
    hint = gpucheck.install_hint(SMI_124, python=".venv/bin/python")
    assert "CPU build" in hint and "\n" not in hint  # one line
    assert hint.endswith(".venv/bin/python -m pip install --force-reinstall torch --index-url https://download.pytorch.org/whl/cu124")


def test_install_check_explains_a_wheel_newer_than_the_driver(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    hint = gpucheck.install_hint(SMI_124, python="py")
    assert "built for CUDA 13.0, newer than driver 550.54.15 supports (CUDA 12.4)" in hint
    assert hint.endswith("--index-url https://download.pytorch.org/whl/cu124")
    assert gpucheck.wheel_tag("12.9") == "cu129" and gpucheck.wheel_tag("13.2") == "cu130" and gpucheck.wheel_tag("11.4") == "cu118"


def test_install_check_is_silent_when_torch_sees_the_gpu_or_there_is_none(monkeypatch):
    assert gpucheck.install_hint(None) is None  # nvidia-smi absent or sees no GPU
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert gpucheck.install_hint(SMI_124) is None


@pytest.mark.skipif(not shutil.which("make"), reason="no make on this machine")
def test_make_install_on_a_gpu_machine_checks_cuda_and_replaces_a_cpu_torch(tmp_path):
    recipe = subprocess.run(["make", "-n", "install", "HAVE_GPU=1", f"VENV={tmp_path / 'venv'}"], cwd=ROOT,
                            capture_output=True, text=True, check=True).stdout
    assert "torch.version.cuda is None" in recipe and "pip uninstall -q -y torch" in recipe  # a CPU torch is replaced
    assert recipe.index("-e \".[dev]\"") < recipe.index("llmlab.core.gpucheck --install-check")  # checked after install
    cpu_recipe = subprocess.run(["make", "-n", "install", "HAVE_GPU=", f"VENV={tmp_path / 'venv'}"], cwd=ROOT,
                                capture_output=True, text=True, check=True).stdout
    assert "--install-check" not in cpu_recipe


# ---------------------------------------------------------------- item 21: make gpu-check ends in a summary

STAND_IN = textwrap.dedent("""
    import json, sys, pathlib
    lab, out = sys.argv[1], pathlib.Path(sys.argv[2])
    if lab == "crashes":
        raise RuntimeError("CUDA error: an illegal memory access was encountered")
    claims = [dict(id=f"{lab}.a", text="a", expected="x", measured="y", holds=True, verdict="holds"),
              dict(id=f"{lab}.b", text="b", expected="< 2", measured="3", holds=False, verdict="does not hold"),
              dict(id=f"{lab}.c", text="c", expected="x", measured="-", holds=None, verdict="not measured")]
    (out / lab).mkdir(parents=True, exist_ok=True)
    (out / lab / "20260101T000000Z-cpu.json").write_text(json.dumps({"lab": lab, "claims": claims}))
""")


def test_gpu_check_summary_counts_claims_and_keeps_crash_tracebacks(tmp_path, monkeypatch, capsys):
    script = tmp_path / "stand_in_lab.py"
    script.write_text(STAND_IN)
    monkeypatch.setattr(gpucheck, "lab_argv", lambda lab, device, out: [sys.executable, str(script), lab, str(out)])
    rc = gpucheck.main(["--device", "cpu", "--labs", "works,crashes", "--out", str(tmp_path / "results")])
    assert rc == 1  # a lab failed
    folder = tmp_path / "results" / "gpu-check"
    summary = json.loads((folder / "summary.json").read_text())
    works, crashes = summary["labs"]
    assert (works["exit"], works["held"], works["not held"], works["not measured"]) == (0, 1, 1, 1)
    assert works["not_held"][0]["id"] == "works.b"
    assert crashes["exit"] == 1 and "held" not in crashes
    tb = (folder / "crashes.stderr.txt").read_text()
    assert "Traceback" in tb and "illegal memory access" in crashes["error"]
    text = (folder / "summary.txt").read_text()
    assert "claims: 1 held, 1 not held, 1 not measured; labs: 1 ran, 1 failed" in text
    assert "not held  works: works.b (measured 3; expected < 2)" in text and "FAILED    crashes (exit 1)" in text
    assert text.strip() in capsys.readouterr().out  # the summary is what the run ends with


@pytest.mark.slow
def test_gpu_check_runs_a_real_lab_on_the_cpu(tmp_path):
    rc = gpucheck.main(["--device", "cpu", "--labs", "gpu-parallelism", "--out", str(tmp_path)])
    row = json.loads((tmp_path / "gpu-check" / "summary.json").read_text())["labs"][0]
    assert rc == 0 and row["exit"] == 0, row
    saved = json.loads(Path(row["result_file"]).read_text())
    assert row["held"] + row["not held"] + row["not measured"] == len(saved["claims"]) > 0


def test_gpu_check_finds_every_lab_the_cli_has():
    labs = gpucheck.discover_labs()
    assert {"roofline", "speculative", "gpu-parallelism"} <= set(labs) and "ttft" not in labs
