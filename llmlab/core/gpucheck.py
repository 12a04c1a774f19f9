"""`make gpu-check`: every lab in --quick mode on one device, then one summary that tells the whole story.

    python -m llmlab.core.gpucheck [--device cuda] [--labs "roofline samplers"] [--out results]
    python -m llmlab.core.gpucheck --install-check      # what `make install` runs on a GPU machine

Each lab runs in its own subprocess (`python -m llmlab LAB --device D --quick --out OUT`), so a crash
in one lab does not stop the others. A lab that exits non-zero has its stderr (the traceback, or the
one-line error) saved under OUT/gpu-check/. The summary reads the JSON each lab saved and counts its
claims: held, not held, not measured; it is printed and saved as OUT/gpu-check/summary.{txt,json}.

`--install-check` is for a machine where nvidia-smi sees a GPU: when torch cannot use it, it prints
one line with the cause (a CPU build, or a wheel built for a newer CUDA than the driver supports) and
the exact pip command that installs a matching wheel from the PyTorch index.

References:
- PyTorch "Get started" (pytorch.org/get-started/locally): one wheel index per CUDA version,
  https://download.pytorch.org/whl/cuXYZ; a driver runs wheels built for its CUDA version or older.
- nvidia-smi's header: "Driver Version: 550.54.15   CUDA Version: 12.4" (the newest CUDA it supports).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

# PyTorch's CUDA wheel indexes, oldest first: a driver runs any wheel built for its CUDA version or older.
CUDA_WHEEL_TAGS = ("cu118", "cu121", "cu124", "cu126", "cu128", "cu129", "cu130")
LAB_TIMEOUT_S = 1800  # a --quick lab takes seconds to minutes; half an hour means it hangs


# ---------------------------------------------------------------- make install: can torch use the GPU?


def nvidia_smi_text() -> str | None:
    """nvidia-smi's plain output, or None where it is absent or sees no GPU."""
    if not shutil.which("nvidia-smi"):
        return None
    try:
        p = subprocess.run(["nvidia-smi"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return p.stdout if p.returncode == 0 else None


def driver_versions(smi: str) -> tuple[str | None, str | None]:
    """(driver version, newest CUDA version the driver supports) from nvidia-smi's header."""
    drv = re.search(r"Driver Version:\s*([\d.]+)", smi)
    cuda = re.search(r"CUDA Version:\s*([\d.]+)", smi)
    return (drv.group(1) if drv else None), (cuda.group(1) if cuda else None)


def _ver(v: str) -> tuple[int, int]:
    major, _, minor = v.partition(".")
    return int(major), int(minor.split(".")[0] or 0)


def wheel_tag(driver_cuda: str) -> str:
    """The newest PyTorch CUDA wheel index the driver can run (cu118 for anything older)."""
    fits = [t for t in CUDA_WHEEL_TAGS if _ver(f"{t[2:-1]}.{t[-1]}") <= _ver(driver_cuda)]
    return fits[-1] if fits else CUDA_WHEEL_TAGS[0]


def install_hint(smi: str | None, python: str = sys.executable) -> str | None:
    """None when torch can use the GPU (or nvidia-smi sees none), else one line: the cause and the fix."""
    if smi is None:
        return None
    import torch

    if torch.cuda.is_available():
        return None
    drv, cuda = driver_versions(smi)
    if cuda is None:
        return f"torch {torch.__version__} cannot use the GPU that nvidia-smi sees, and nvidia-smi does not say its CUDA version"
    built = torch.version.cuda
    if built is None:
        why = f"torch {torch.__version__} is a CPU build"
    elif _ver(built) > _ver(cuda):
        why = f"torch {torch.__version__} is built for CUDA {built}, newer than driver {drv} supports (CUDA {cuda})"
    else:
        return (f"torch {torch.__version__} (CUDA {built}) should run on driver {drv} (CUDA {cuda}) but sees no GPU: "
                f"check CUDA_VISIBLE_DEVICES and access to /dev/nvidia*")
    tag = wheel_tag(cuda)
    return (f"{why}, so CUDA is unavailable; fix: {python} -m pip install --force-reinstall torch "
            f"--index-url https://download.pytorch.org/whl/{tag}")


# ---------------------------------------------------------------- make gpu-check: every lab, then a summary


def discover_labs() -> list[str]:
    """Lab modules (llmlab/labs/*.py) that the CLI has a command for, as command names."""
    import pkgutil

    import llmlab.labs
    from llmlab import cli

    commands = {c.name or c.callback.__name__.replace("_", "-") for c in cli.app.registered_commands}
    mods = [m.name.replace("_", "-") for m in pkgutil.iter_modules(llmlab.labs.__path__) if not m.name.startswith("_")]
    return sorted(m for m in mods if m in commands)


def lab_argv(lab: str, device: str, out: Path) -> list[str]:
    return [sys.executable, "-m", "llmlab", lab, "--device", device, "--quick", "--out", str(out)]


def claim_counts(result: dict) -> dict:
    """held / not held / not measured from a saved result's claims (by `verdict`, else by `holds`)."""
    counts = {"held": 0, "not held": 0, "not measured": 0}
    not_held = []
    for c in result.get("claims", []):
        v = c.get("verdict") or {True: "holds", False: "does not hold"}.get(c.get("holds"), "not measured")
        key = {"holds": "held", "does not hold": "not held"}.get(v, "not measured")
        counts[key] += 1
        if key == "not held":
            not_held.append({"id": c.get("id"), "text": c.get("text"), "measured": c.get("measured"), "expected": c.get("expected")})
    return counts | {"not_held": not_held}


def run_one(lab: str, device: str, out: Path, log_dir: Path, timeout_s: float = LAB_TIMEOUT_S) -> dict:
    """Run one lab in a subprocess; return its row of the summary (the saved JSON's claim counts)."""
    folder = out / lab
    before = set(folder.glob("*.json")) if folder.exists() else set()
    env = {**os.environ, "HF_HUB_OFFLINE": os.environ.get("HF_HUB_OFFLINE", "1")}
    t0 = time.perf_counter()
    try:
        p = subprocess.run(lab_argv(lab, device, out), capture_output=True, text=True, timeout=timeout_s, env=env)
        rc, stderr = p.returncode, p.stderr
    except subprocess.TimeoutExpired as exc:
        rc = "timeout"
        stderr = (exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else exc.stderr or "") + f"\n[gpu-check: killed after {timeout_s:.0f} s]\n"
    row: dict = {"lab": lab, "exit": rc, "seconds": round(time.perf_counter() - t0, 1)}
    if rc != 0:
        log_dir.mkdir(parents=True, exist_ok=True)
        log = log_dir / f"{lab}.stderr.txt"
        log.write_text(stderr)
        row["stderr_file"] = str(log)
        lines = [ln for ln in stderr.strip().splitlines() if ln.strip()]
        row["error"] = lines[-1].strip() if lines else f"exit {rc}, nothing on stderr"
    new = sorted(set(folder.glob("*.json")) - before, key=lambda f: f.stat().st_mtime) if folder.exists() else []
    if new:
        row["result_file"] = str(new[-1])
        try:
            row |= claim_counts(json.loads(new[-1].read_text()))
        except (OSError, ValueError) as exc:
            row["error"] = row.get("error") or f"unreadable result {new[-1].name}: {exc}"
    return row


def summary_text(rows: list[dict], device: str, started: str) -> str:
    crashed = [r for r in rows if r["exit"] != 0]
    lines = [f"gpu-check: {len(rows)} labs, --device {device} --quick, started {started}",
             f"{'lab':<18}{'exit':>8}{'time':>9}{'held':>6}{'not held':>10}{'not measured':>14}  result"]
    for r in rows:
        n = [str(r[k]) if k in r else "-" for k in ("held", "not held", "not measured")]
        where = r.get("result_file", "no result saved")
        lines.append(f"{r['lab']:<18}{r['exit']!s:>8}{r['seconds']:>8.0f}s{n[0]:>6}{n[1]:>10}{n[2]:>14}  {where}")
    tot = {k: sum(r.get(k, 0) for r in rows) for k in ("held", "not held", "not measured")}
    lines.append(f"claims: {tot['held']} held, {tot['not held']} not held, {tot['not measured']} not measured; "
                 f"labs: {len(rows) - len(crashed)} ran, {len(crashed)} failed")
    for r in rows:
        for c in r.get("not_held", []):
            lines.append(f"  not held  {r['lab']}: {c['id'] or c['text']} (measured {c['measured']}; expected {c['expected']})")
    for r in crashed:
        lines.append(f"  FAILED    {r['lab']} (exit {r['exit']}): {r.get('error', '')}; full stderr: {r.get('stderr_file')}")
    return "\n".join(lines)


def gpu_check(labs: list[str], device: str, out: Path, timeout_s: float = LAB_TIMEOUT_S, echo=print) -> list[dict]:
    """Run every lab, save OUT/gpu-check/summary.{txt,json}, echo progress and the summary; return the rows."""
    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    log_dir = out / "gpu-check"
    rows = []
    for lab in labs:
        echo(f"== llmlab {lab} --device {device} --quick")
        rows.append(run_one(lab, device, out, log_dir, timeout_s))
    text = summary_text(rows, device, started)
    log_dir.mkdir(parents=True, exist_ok=True)
    (log_dir / "summary.txt").write_text(text + "\n")
    (log_dir / "summary.json").write_text(json.dumps({"device": device, "started": started, "labs": rows}, indent=2) + "\n")
    echo(text)
    echo(f"(saved: {log_dir / 'summary.txt'})")
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m llmlab.core.gpucheck", description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda", help="device for every lab (cpu works too: the same check without a GPU)")
    ap.add_argument("--labs", default=None, help="space- or comma-separated lab names (default: every lab the CLI has)")
    ap.add_argument("--out", default="results", help="results folder; the summary goes to OUT/gpu-check/")
    ap.add_argument("--timeout", type=float, default=LAB_TIMEOUT_S, help="seconds before one lab is killed")
    ap.add_argument("--install-check", action="store_true", help="only check that torch can use the GPU nvidia-smi sees")
    args = ap.parse_args(argv)
    if args.install_check:
        hint = install_hint(nvidia_smi_text())
        if hint:
            print(f"llmlab install: {hint}", file=sys.stderr)
        return 0  # a warning, not a failure: the CPU labs still work
    labs = [x for x in re.split(r"[\s,]+", args.labs or "") if x] or discover_labs()
    rows = gpu_check(labs, args.device, Path(args.out), args.timeout)
    return 0 if all(r["exit"] == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
