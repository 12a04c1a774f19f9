"""`make install` on a GPU machine (the torch floor, the wheel index) and `make gpu-check` (the CUDA preflight, the
labs, the serve check, the kernel probe, the summary), tested without a GPU."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from llmlab.tools import gpucheck

ROOT = Path(__file__).resolve().parents[1]
SMI_124 = "| NVIDIA-SMI 550.54.15    Driver Version: 550.54.15    CUDA Version: 12.4     |\n"
SMI_128 = "| NVIDIA-SMI 570.86.10    Driver Version: 570.86.10    CUDA Version: 12.8     |\n"


# ---------------------------------------------------------------- item 20: make install on a GPU machine


def test_install_check_explains_a_cpu_torch_with_the_pip_command(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.version, "cuda", None)
    hint = gpucheck.install_hint(SMI_128, python=".venv/bin/python")
    assert "CPU build" in hint and "\n" not in hint  # one line
    assert hint.endswith(".venv/bin/python -m pip install --force-reinstall 'torch>=2.9' --index-url https://download.pytorch.org/whl/cu128")


def test_install_check_explains_a_wheel_newer_than_the_driver(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    hint = gpucheck.install_hint(SMI_128, python="py")
    assert "built for CUDA 13.0, newer than driver 570.86.10 supports (CUDA 12.8)" in hint
    assert hint.endswith("--index-url https://download.pytorch.org/whl/cu128")


def test_the_hint_points_only_at_indexes_that_carry_the_floor():
    # torch 2.9's wheels: cu126, cu128, cu130; cu118-cu124 stop at 2.7 and cu129 at 2.8, so they cannot satisfy
    # the floor
    assert gpucheck.wheel_tag("12.9") == "cu128" and gpucheck.wheel_tag("13.2") == "cu130"
    assert gpucheck.wheel_tag("12.6") == "cu126"
    assert gpucheck.wheel_tag("12.4") is None and gpucheck.wheel_tag("11.8") is None
    assert "update the NVIDIA driver" in gpucheck.pip_fix("12.4") and "12.6" in gpucheck.pip_fix("12.4")
    assert gpucheck.pip_index_args(SMI_128) == "--index-url https://download.pytorch.org/whl/cu128"
    assert gpucheck.pip_index_args(None) == "" and gpucheck.pip_index_args(SMI_124) == ""


def test_install_check_names_a_torch_below_the_floor(monkeypatch):
    monkeypatch.setattr(torch, "__version__", "2.6.0+cu124")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # it sees the GPU, but is too old for the code
    hint = gpucheck.install_hint(SMI_124, python="py")
    assert "torch 2.6.0+cu124 is older than llmlab's floor 2.9" in hint and "update the NVIDIA driver" in hint


def test_install_check_is_silent_when_torch_sees_the_gpu_or_there_is_none(monkeypatch):
    assert gpucheck.install_hint(None) is None  # nvidia-smi absent or sees no GPU
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch, "__version__", "2.13.0+cu128")
    assert gpucheck.install_hint(SMI_128) is None


def test_one_torch_floor_in_pyproject_makefile_and_gpucheck():
    tomllib = pytest.importorskip("tomllib")
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert "torch>=" + gpucheck.TORCH_FLOOR in deps
    assert re.search(r"^TORCH_FLOOR := (\S+)$", (ROOT / "Makefile").read_text(), re.M).group(1) == gpucheck.TORCH_FLOOR
    cpu = re.search(r"^TORCH_CPU \?= torch==(\S+)$", (ROOT / "Makefile").read_text(), re.M).group(1)
    # the CPU pin satisfies the floor: pip pulls nothing more
    assert gpucheck._ver(cpu) >= gpucheck._ver(gpucheck.TORCH_FLOOR)


@pytest.mark.skipif(not shutil.which("make"), reason="no make on this machine")
def test_make_install_on_a_gpu_machine_checks_cuda_and_the_floor(tmp_path):
    venv = tmp_path / "venv"
    recipe = subprocess.run(["make", "-n", "install", "HAVE_GPU=1", f"VENV={venv}"], cwd=ROOT,
                            capture_output=True, text=True, check=True).stdout
    assert "torch.version.cuda is None" in recipe and "pip uninstall -q -y torch" in recipe  # a CPU torch is replaced
    # the floor, from the driver's index
    assert '"torch>=2.9" $(' in recipe and "llmlab.tools.gpucheck --pip-index" in recipe
    # checked after install
    assert recipe.index("-e \".[dev]\"") < recipe.index("llmlab.tools.gpucheck --install-check")
    cpu_recipe = subprocess.run(["make", "-n", "install", "HAVE_GPU=", f"VENV={venv}"], cwd=ROOT,
                                capture_output=True, text=True, check=True).stdout
    assert "--install-check" not in cpu_recipe and "pip install -q torch==2.13.0" in cpu_recipe


def test_pip_index_runs_before_torch_is_installed():
    # make install asks for the index before torch is there: the module must not import torch for it
    code = ("import sys, runpy; sys.modules['torch'] = None; sys.argv = ['gpucheck', '--pip-index']; "
            "runpy.run_module('llmlab.tools.gpucheck', run_name='__main__')")
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "" or p.stdout.startswith("--index-url https://download.pytorch.org/whl/cu"), p.stdout


@pytest.mark.skipif(not shutil.which("make"), reason="no make on this machine")
@pytest.mark.parametrize("version, cuda, replaced", [("2.13.0+cpu", None, True), ("2.6.0+cu124", "12.4", True),
                                                     ("2.9.1+cu128", "12.8", False), ("2.13.0+cu130", "13.0", False)])
def test_make_install_keeps_only_a_cuda_torch_at_the_floor(tmp_path, version, cuda, replaced):
    # the recipe's own check, run against a stand-in torch module: exit 1 means "replace it"
    recipe = subprocess.run(["make", "-n", "install", "HAVE_GPU=1", f"VENV={tmp_path}"], cwd=ROOT,
                            capture_output=True, text=True, check=True).stdout
    code = re.search(r'-c "(import torch, sys; sys.exit\(torch.version.cuda is None.*?\))"', recipe).group(1)
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text(f"__version__ = {version!r}\nclass version:\n    cuda = {cuda!r}\n")
    p = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env={"PYTHONPATH": str(tmp_path)})
    assert p.returncode == (1 if replaced else 0)


# ---------------------------------------------------------- make gpu-check stops first where torch cannot use CUDA


def test_preflight_on_a_cpu_torch_is_one_line_that_says_what_to_install(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.version, "cuda", None)
    line = gpucheck.preflight("cuda", smi_text=lambda: None)  # no nvidia-smi
    assert line.startswith("gpu-check: no CUDA GPU here") and "\n" not in line
    assert "install the NVIDIA driver" in line and "torch >= 2.9" in line and "CPU build" in line
    line = gpucheck.preflight("cuda", smi_text=lambda: SMI_128)  # a driver, but a CPU torch: the pip command
    assert "CPU build" in line and "whl/cu128" in line
    assert gpucheck.preflight("cpu") is None
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch, "__version__", "2.7.1+cu126")  # sees the GPU, no nvidia-smi, below the floor
    line = gpucheck.preflight("cuda", smi_text=lambda: None)
    assert "older than llmlab's floor 2.9" in line and "'torch>=2.9'" in line
    monkeypatch.setattr(torch, "__version__", "2.13.0+cu130")
    assert gpucheck.preflight("cuda", smi_text=lambda: None) is None  # torch can use CUDA: go on


def _no_gpu_env() -> dict:
    import os

    return {**os.environ, "CUDA_VISIBLE_DEVICES": "", "HF_HUB_OFFLINE": "1"}  # torch sees no GPU on any machine


def test_gpucheck_module_without_cuda_exits_2_with_one_line_and_runs_no_lab(tmp_path):
    p = subprocess.run([sys.executable, "-m", "llmlab.tools.gpucheck", "--out", str(tmp_path)], cwd=ROOT,
                       capture_output=True, text=True, env=_no_gpu_env(), timeout=120)
    lines = [x for x in p.stderr.splitlines() if x.strip()]
    assert p.returncode == 2 and len(lines) == 1 and lines[0].startswith("gpu-check: "), p.stderr
    assert "== llmlab" not in p.stdout and not (tmp_path / "gpu-check").exists()


@pytest.mark.skipif(not shutil.which("make"), reason="no make on this machine")
def test_make_gpu_check_without_cuda_exits_2_with_that_line(tmp_path):
    # -o install: the venv as it is (no reinstall); the recipe is the one `make gpu-check` runs
    p = subprocess.run(["make", "-o", "install", "gpu-check", f"OUT={tmp_path}", f"BIN={Path(sys.executable).parent}"],
                       cwd=ROOT, capture_output=True, text=True, env=_no_gpu_env(), timeout=120)
    ours = [x for x in p.stderr.splitlines() if x.strip() and not x.startswith("make")]  # make adds its own "Error 2"
    assert p.returncode == 2 and len(ours) == 1 and ours[0].startswith("gpu-check: "), p.stderr
    assert "== llmlab" not in p.stdout and not (tmp_path / "gpu-check").exists()


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


SERVE_ROW = dict(ok=True, greedy_same=True, stream_same=True, stream_chunks=16, concurrent=32, rounds=3, requests=96,
                 completed=96, errors=0, first_error="", output_tokens_per_s=812.0, load_s=60.2, seconds=71.0)
PROBE_ROWS = [dict(kernel="fp8 _scaled_mm", status="not available", detail="needs compute capability >= 8.9"),
              dict(kernel="launch gap", status="ran", detail="4.00 us per tiny kernel")]


def test_gpu_check_summary_counts_claims_and_keeps_crash_tracebacks(tmp_path, monkeypatch, capsys):
    script = tmp_path / "stand_in_lab.py"
    script.write_text(STAND_IN)
    monkeypatch.setattr(gpucheck, "lab_argv", lambda lab, device, out: [sys.executable, str(script), lab, str(out)])
    monkeypatch.setattr(gpucheck, "serve_check", lambda device, log_dir: SERVE_ROW)
    monkeypatch.setattr(gpucheck, "probe_subprocess", lambda device: PROBE_ROWS)
    rc = gpucheck.main(["--device", "cpu", "--labs", "works,crashes", "--out", str(tmp_path / "results")])
    assert rc == 1  # a lab failed
    folder = tmp_path / "results" / "gpu-check"
    summary = json.loads((folder / "summary.json").read_text())
    works, crashes = summary["labs"]
    assert (works["exit"], works["held"], works["not held"], works["not measured"]) == (0, 1, 1, 1)
    assert works["not_held"][0]["id"] == "works.b"
    assert crashes["exit"] == 1 and "held" not in crashes
    assert summary["serve"] == SERVE_ROW and summary["kernels"] == PROBE_ROWS
    tb = (folder / "crashes.stderr.txt").read_text()
    assert "Traceback" in tb and "illegal memory access" in crashes["error"]
    screen = capsys.readouterr().out
    text = (folder / "summary.txt").read_text()
    assert "claims: 1 held, 1 not held, 1 not measured; labs: 1 ran, 1 failed" in screen
    assert "works" in screen and "1 held    1 not held    1 not measured" in screen  # one line per lab: its counts
    assert "crashes           FAILED (exit 1" in screen and "illegal memory access" in screen  # or its failure
    assert "serve     ok: health, greedy same True" in screen and "96/96 requests in 3 rounds of 32" in screen
    assert "kernel    fp8 _scaled_mm        not available: needs compute capability >= 8.9" in screen
    summary_lines = screen[screen.index("gpu-check: 2 labs"):].splitlines()
    assert len(summary_lines) <= 40 and all(len(x) <= 160 for x in summary_lines)  # one screen
    assert "not held  works: works.b (measured 3; expected < 2)" in text  # the detail is saved, not on screen
    assert "not held  works" not in screen


def test_gpu_check_records_labs_past_the_budget_as_not_run(tmp_path, monkeypatch):
    script = tmp_path / "stand_in_lab.py"
    script.write_text(STAND_IN)
    monkeypatch.setattr(gpucheck, "lab_argv", lambda lab, device, out: [sys.executable, str(script), lab, str(out)])
    got = gpucheck.gpu_check(["works", "late"], "cpu", tmp_path, budget_s=5, skip=("serve", "probe"),
                             echo=lambda *_: None)
    assert [r["exit"] for r in got["labs"]] == ["not run", "not run"] and "budget" in got["labs"][0]["error"]
    text = gpucheck.summary_text(got["labs"], "cpu", "now")
    assert "late              not run: the labs' 5 s" in text
    assert "labs: 0 ran, 0 failed, 2 not run (time budget)" in text
    assert got["serve"] is None and got["kernels"] is None
    monkeypatch.setattr(gpucheck, "serve_check", lambda device, log_dir: SERVE_ROW)
    monkeypatch.setattr(gpucheck, "probe_subprocess", lambda device: PROBE_ROWS)
    got = gpucheck.gpu_check(["works"], "cpu", tmp_path, budget_s=gpucheck.SERVE_S + 60, echo=lambda *_: None)
    assert got["labs"][0]["exit"] == "not run" and got["serve"] == SERVE_ROW  # serve and the probe keep their share


def test_serve_line_reports_a_failed_server():
    line = gpucheck.serve_line({"ok": False, "error": "/health did not answer within 120 s", "log": "serve.log"})
    assert line.startswith("serve     FAILED: /health did not answer")


def test_serve_check_against_a_real_llmlab_serve_on_the_cpu(tmp_path):
    row = gpucheck.serve_check("cpu", tmp_path, seconds=1)
    assert row["ok"] is True, row
    assert row["greedy_same"] and row["stream_same"] and row["stream_chunks"] >= 1
    assert row["completed"] == row["requests"] == 32 * row["rounds"] and row["errors"] == 0
    assert row["output_tokens_per_s"] > 0


def test_probe_on_the_cpu_records_missing_kernels_as_not_available():
    rows = {r["kernel"]: r for r in gpucheck.probe_kernels("cpu")}
    assert rows["tf32 matmul"]["status"] == "not available" and "CUDA" in rows["tf32 matmul"]["detail"]
    assert rows["fp8 _scaled_mm"]["status"] == "not available" and "8.9" in rows["fp8 _scaled_mm"]["detail"]
    assert {"int8 _weight_int8pack_mm", "int4 _weight_int4pack_mm", "sdpa backend", "launch gap"} <= set(rows)
    for r in rows.values():
        assert r["status"] in ("ran", "mismatch", "not available") and r["detail"]


def test_probe_without_an_op_or_with_a_failing_one_says_not_available(monkeypatch):
    from llmlab.core import kernelprobe

    monkeypatch.delattr(torch, "_weight_int8pack_mm")
    row = kernelprobe.probe_int8(torch.device("cpu"))
    assert row["status"] == "not available" and "has no torch._weight_int8pack_mm" in row["detail"]

    def broken(dev):
        raise RuntimeError("no kernel image is available for execution on the device")

    monkeypatch.setattr(kernelprobe, "PROBES", (broken, kernelprobe.probe_launch))
    rows = kernelprobe.probe_all("cpu")
    assert rows[0] == {"kernel": "broken", "status": "not available",
                       "detail": "RuntimeError: no kernel image is available for execution on the device"}
    assert rows[1]["status"] == "ran"


def test_int8_probe_checks_the_kernel_against_its_reference(monkeypatch):
    from llmlab.core import kernelprobe

    assert kernelprobe.probe_int8(torch.device("cpu"))["status"] == "ran"
    def wrong(x, w, s):  # a wrong kernel: twice the product
        return 2 * (x @ (w.float() * s[:, None]).t())

    monkeypatch.setattr(torch, "_weight_int8pack_mm", wrong)
    assert kernelprobe.probe_int8(torch.device("cpu"))["status"] == "mismatch"


@pytest.mark.slow
def test_gpu_check_runs_a_real_lab_on_the_cpu(tmp_path):
    rc = gpucheck.main(["--device", "cpu", "--labs", "gpu-parallelism", "--out", str(tmp_path),
                        "--skip", "serve,probe"])
    row = json.loads((tmp_path / "gpu-check" / "summary.json").read_text())["labs"][0]
    assert rc == 0 and row["exit"] == 0, row
    saved = json.loads(Path(row["result_file"]).read_text())
    assert row["held"] + row["not held"] + row["not measured"] == len(saved["claims"]) > 0


def test_gpu_check_finds_every_lab_the_cli_has():
    labs = gpucheck.discover_labs()
    assert {"roofline", "speculative", "gpu-parallelism"} <= set(labs) and "ttft" not in labs
