"""`make gpu-check`: can torch use CUDA, then every lab in --quick mode, a served model and the kernels, one summary.

    python -m llmlab.tools.gpucheck [--device cuda] [--labs "roofline samplers"] [--out results] [--skip serve,probe]
    python -m llmlab.tools.gpucheck --install-check      # what `make install` runs on a GPU machine
    python -m llmlab.tools.gpucheck --pip-index          # the PyTorch wheel index `make install` uses on a GPU machine
    python -m llmlab.tools.gpucheck --probe --device D   # the kernel probe alone, as JSON (run in a subprocess)

In order: (1) the preflight: on a CUDA device torch must be at least TORCH_FLOOR and see the GPU;
otherwise one line on stderr names what to install and the check exits 2 before any lab runs.
(2) Each lab in its own subprocess (`python -m llmlab LAB --device D --quick --out OUT`), so a crash
in one lab does not stop the others; a lab that exits non-zero has its stderr saved under
OUT/gpu-check/. (3) `llmlab serve` on the device for a minute: health, the same greedy text twice,
a streamed completion, rounds of 32 concurrent requests (httpx). (4) The kernel probe: TF32 vs
IEEE FP32 matmul, FP8 `torch._scaled_mm`, the INT8 / INT4 packed weight matmuls, which SDPA backend
the engine's attention call gets, and the launch gap; a kernel this torch or device lacks reads
"not available" with the reason. (5) A one-screen summary (one line per lab: its claim counts or its
failure), saved with the not-held claims in full as OUT/gpu-check/summary.{txt,json}. The whole
check keeps to a time budget (--budget-s, 8 minutes): the labs get what the serve check and the
probe leave, each lab at most what is left of that share, and a lab that would start past it is
recorded as not run.

`--install-check` is for a machine where nvidia-smi sees a GPU: when torch cannot use it, it prints
one line with the cause (a CPU build, a wheel built for a newer CUDA than the driver supports, or a
torch older than the floor) and the exact pip command that installs a matching wheel.

The module's top level imports the standard library only: `make install` runs `--pip-index` before
torch and the other dependencies are installed. torch, httpx and the CLI load inside the functions
that need them.

References:
- PyTorch "Get started" (pytorch.org/get-started/locally) and the release compatibility matrix
  (github.com/pytorch/pytorch RELEASE.md): one wheel index per CUDA version,
  https://download.pytorch.org/whl/cuXYZ; torch 2.9 ships cu126, cu128 and cu130 wheels; a driver
  runs wheels built for its CUDA version or older.
- nvidia-smi's header: "Driver Version: 550.54.15   CUDA Version: 12.4" (the newest CUDA it supports).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pkgutil
import re
import shutil
import socket
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

# The oldest torch the code runs on: SDPA's enable_gqa= (2.5) and the CUDA kernel of
# torch._weight_int8pack_mm (2.9). pyproject.toml and the Makefile's GPU branch carry the same floor.
TORCH_FLOOR = "2.9"
# PyTorch's CUDA wheel indexes that carry a torch >= TORCH_FLOOR, oldest first (2.9's matrix: cu126,
# cu128, cu130; cu118-cu124 stop at 2.7, cu129 at 2.8). A driver runs wheels for its CUDA version or older.
CUDA_WHEEL_TAGS = ("cu126", "cu128", "cu130")
LAB_TIMEOUT_S = 300  # one --quick lab on a GPU takes seconds to a minute; five minutes means it hangs
BUDGET_S = 480  # the whole check: 8 minutes, a short lease of a GPU machine
SERVE_S = 60  # llmlab serve under load for a minute
SERVE_START_S = 30  # kept for the server to load and answer /health (the tiny model loads in seconds)
PROBE_S = 30  # kept for the kernel probe
CONCURRENT = 32  # requests in flight at once in the serve check


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
    major, _, minor = v.split("+")[0].partition(".")
    return int(major), int(minor.split(".")[0] or 0)


def wheel_tag(driver_cuda: str) -> str | None:
    """The newest PyTorch CUDA wheel index with a torch >= TORCH_FLOOR that the driver can run; None if none."""
    fits = [t for t in CUDA_WHEEL_TAGS if _ver(f"{t[2:-1]}.{t[-1]}") <= _ver(driver_cuda)]
    return fits[-1] if fits else None


def pip_fix(driver_cuda: str | None, python: str = sys.executable) -> str:
    """The pip command that installs a torch >= TORCH_FLOOR this driver runs, or what to update first."""
    tag = wheel_tag(driver_cuda) if driver_cuda else CUDA_WHEEL_TAGS[-1]
    if tag is None:
        oldest = CUDA_WHEEL_TAGS[0]
        return (f"update the NVIDIA driver to one that supports CUDA {oldest[2:-1]}.{oldest[-1]} or newer "
                f"(torch >= {TORCH_FLOOR} has no wheel for CUDA {driver_cuda}), then make install")
    return (f"{python} -m pip install --force-reinstall 'torch>={TORCH_FLOOR}' "
            f"--index-url https://download.pytorch.org/whl/{tag}")


def install_hint(smi: str | None, python: str = sys.executable) -> str | None:
    """None when torch can use the GPU (or nvidia-smi sees none), else one line: the cause and the fix."""
    if smi is None:
        return None
    import torch  # lazy: the top level is stdlib only (see the module docstring)

    drv, cuda = driver_versions(smi)
    if _ver(torch.__version__) < _ver(TORCH_FLOOR):
        return f"torch {torch.__version__} is older than llmlab's floor {TORCH_FLOOR}; fix: {pip_fix(cuda, python)}"
    if torch.cuda.is_available():
        return None
    if cuda is None:
        return (f"torch {torch.__version__} cannot use the GPU that nvidia-smi sees, "
                "and nvidia-smi does not say its CUDA version")
    built = torch.version.cuda
    if built is None:
        why = f"torch {torch.__version__} is a CPU build"
    elif _ver(built) > _ver(cuda):
        why = f"torch {torch.__version__} is built for CUDA {built}, newer than driver {drv} supports (CUDA {cuda})"
    else:
        return (f"torch {torch.__version__} (CUDA {built}) should run on driver {drv} (CUDA {cuda}) but sees no GPU: "
                f"check CUDA_VISIBLE_DEVICES and access to /dev/nvidia*")
    return f"{why}, so CUDA is unavailable; fix: {pip_fix(cuda, python)}"


def pip_index_args(smi: str | None) -> str:
    """`--index-url URL` for make install's GPU branch (the wheel index the driver runs), or '' (pip's default)."""
    cuda = driver_versions(smi)[1] if smi else None
    tag = wheel_tag(cuda) if cuda else None
    return f"--index-url https://download.pytorch.org/whl/{tag}" if tag else ""


def preflight(device: str, smi_text=nvidia_smi_text) -> str | None:
    """None when `device` can run (the CPU always can), else one line: why CUDA cannot be used and what to install."""
    if not device.startswith("cuda"):
        return None
    try:
        import torch  # lazy: the top level is stdlib only (see the module docstring)
    except ImportError:
        return "gpu-check: torch is not installed; run make install"
    smi = smi_text()
    if _ver(torch.__version__) < _ver(TORCH_FLOOR):  # also where nvidia-smi is missing (a container may lack it)
        cuda = driver_versions(smi)[1] if smi else None
        return f"gpu-check: torch {torch.__version__} is older than llmlab's floor {TORCH_FLOOR}; fix: {pip_fix(cuda)}"
    hint = install_hint(smi)
    if hint:
        return f"gpu-check: {hint}"
    if torch.cuda.is_available():
        return None
    build = "a CPU build" if torch.version.cuda is None else f"built for CUDA {torch.version.cuda}"
    return (f"gpu-check: no CUDA GPU here (nvidia-smi is missing or sees no GPU; "
            f"torch {torch.__version__} is {build}): "
            f"install the NVIDIA driver, then make install (torch >= {TORCH_FLOOR} with CUDA); "
            f"without a GPU: make gpu-check GPU_CHECK_DEVICE=cpu")


# ---------------------------------------------------------------- every lab in --quick


def discover_labs() -> list[str]:
    """Lab modules (llmlab/labs/*.py) that the CLI has a command for, as command names."""
    import llmlab.labs  # lazy: the CLI needs typer and rich, which --pip-index runs without
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
            not_held.append({k: c.get(k) for k in ("id", "text", "measured", "expected")})
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
        got = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else exc.stderr or ""
        stderr = got + f"\n[gpu-check: killed after {timeout_s:.0f} s]\n"
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


# ---------------------------------------------------------------- llmlab serve for a minute


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop_process(proc: subprocess.Popen, grace_s: float = 10) -> None:
    """Stop a server we started: SIGTERM, then SIGKILL if it is still there after `grace_s`."""
    proc.terminate()
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _wait_health(base: str, proc: subprocess.Popen, timeout_s: float) -> str | None:
    """None once /health answers 200, else why not (the server exited, or the deadline passed)."""
    import httpx  # lazy: the top level is stdlib only (see the module docstring)

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return f"the server exited with code {proc.returncode} before /health answered"
        try:
            if httpx.get(base + "/health", timeout=2).status_code == 200:
                return None
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    return f"/health did not answer within {timeout_s:.0f} s"


def _complete(client, base: str, prompt: str, max_tokens: int, stream: bool = False) -> dict:
    """One greedy /v1/completions request: {"text", "tokens", "chunks"}; raises on an HTTP error or a cut stream."""
    payload = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0, "stream": stream}
    if not stream:
        r = client.post(base + "/v1/completions", json=payload, timeout=120)
        r.raise_for_status()
        body = r.json()
        return {"text": body["choices"][0]["text"], "tokens": body["usage"]["completion_tokens"], "chunks": 1}
    text, chunks, done = "", 0, False
    with client.stream("POST", base + "/v1/completions", json=payload, timeout=120) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if line.strip() == "data: [DONE]":
                done = True
            elif line.startswith("data: "):
                choices = json.loads(line[6:]).get("choices") or []
                if choices:
                    text, chunks = text + (choices[0].get("text") or ""), chunks + 1
    if not done:
        raise RuntimeError("the stream ended without data: [DONE]")
    return {"text": text, "tokens": chunks, "chunks": chunks}


async def _concurrent_round(base: str, n: int, max_tokens: int) -> tuple[int, int, list[str]]:
    """n requests in flight at once: (completed, completion tokens, errors)."""
    import httpx  # lazy: the top level is stdlib only (see the module docstring)

    async with httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=n)) as client:
        async def one(i: int):
            payload = {"prompt": f"Request {i}: the", "max_tokens": max_tokens, "temperature": 0.0, "ignore_eos": True}
            r = await client.post(base + "/v1/completions", json=payload)
            r.raise_for_status()
            return r.json()["usage"]["completion_tokens"]

        got = await asyncio.gather(*(one(i) for i in range(n)), return_exceptions=True)
    errors = [f"{type(g).__name__}: {g}" for g in got if isinstance(g, BaseException)]
    return len(got) - len(errors), sum(g for g in got if not isinstance(g, BaseException)), errors


def exercise_server(base: str, seconds: float, concurrent: int = CONCURRENT) -> dict:
    """Greedy twice (the same text), one stream, then rounds of `concurrent` requests until `seconds` pass."""
    import httpx  # lazy: the top level is stdlib only (see the module docstring)

    with httpx.Client() as client:
        a = _complete(client, base, "The cache", 16)
        b = _complete(client, base, "The cache", 16)
        s = _complete(client, base, "The cache", 16, stream=True)
    row = {"greedy_same": a["text"] == b["text"], "stream_same": s["text"] == a["text"], "stream_chunks": s["chunks"]}
    t0, done, tokens, errors, rounds = time.perf_counter(), 0, 0, [], 0
    while rounds == 0 or time.perf_counter() - t0 < seconds:
        ok, tok, err = asyncio.run(_concurrent_round(base, concurrent, 32))
        done, tokens, errors, rounds = done + ok, tokens + tok, errors + err, rounds + 1
    wall = time.perf_counter() - t0
    return row | {"concurrent": concurrent, "rounds": rounds, "requests": rounds * concurrent, "completed": done,
                  "errors": len(errors), "first_error": errors[0][:160] if errors else "",
                  "output_tokens_per_s": tokens / wall, "load_s": wall}


def serve_check(device: str, log_dir: Path, seconds: float = SERVE_S, argv: list[str] | None = None) -> dict:
    """`llmlab serve --device D` on a free port, exercised for `seconds`; the row of the summary (never raises)."""
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    cmd = argv or [sys.executable, "-m", "llmlab", "serve", "--model", "tiny", "--device", device, "--port", str(port)]
    log_dir.mkdir(parents=True, exist_ok=True)
    log = log_dir / "serve.log"
    t0 = time.perf_counter()
    with log.open("w") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env={**os.environ, "HF_HUB_OFFLINE": "1"})
        try:
            why = _wait_health(base, proc, 120)
            row = {"ok": False, "error": why} if why else exercise_server(base, seconds)
        except Exception as exc:  # noqa: BLE001  (any failure is the check's finding, not gpu-check's crash)
            row = {"ok": False, "error": f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:200]}
        finally:
            stop_process(proc)
    if "ok" not in row:
        row["ok"] = row["greedy_same"] and row["stream_same"] and row["errors"] == 0
    return row | {"seconds": round(time.perf_counter() - t0, 1), "log": str(log)}


def serve_line(row: dict) -> str:
    if "error" in row:
        return f"serve     FAILED: {row['error']} (log: {row.get('log')})"
    return (f"serve     {'ok' if row['ok'] else 'FAILED'}: health, greedy same {row['greedy_same']}, stream same "
            f"{row['stream_same']} ({row['stream_chunks']} chunks), {row['completed']}/{row['requests']} requests in "
            f"{row['rounds']} rounds of {row['concurrent']}, {row['output_tokens_per_s']:.0f} output tok/s"
            + (f"; first error: {row['first_error']}" if row["errors"] else ""))


# ---------------------------------------------------------------- the kernel probe


def probe_kernels(device: str) -> list[dict]:
    """One row per kernel the labs rely on: status 'ran' with what it measured, or 'not available' with why."""
    from llmlab.core import kernelprobe  # lazy: torch

    return kernelprobe.probe_all(device)


def probe_subprocess(device: str, timeout_s: float = 120) -> list[dict]:
    """The probe in its own process (a CUDA fault there cannot take gpu-check down)."""
    argv = [sys.executable, "-m", "llmlab.tools.gpucheck", "--probe", "--device", device]
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
        if p.returncode == 0:
            return json.loads(p.stdout)
        why = ([ln for ln in p.stderr.splitlines() if ln.strip()] or [f"exit {p.returncode}"])[-1]
    except (subprocess.TimeoutExpired, ValueError) as exc:
        why = f"{type(exc).__name__}"
    return [{"kernel": "probe", "status": "failed", "detail": why[:200]}]


# ---------------------------------------------------------------- the summary


def lab_line(r: dict) -> str:
    if r["exit"] == "not run":
        return f"{r['lab']:<18}not run: {r.get('error', '')}"
    if r["exit"] != 0:
        return f"{r['lab']:<18}FAILED (exit {r['exit']}, {r['seconds']:.0f} s): {r.get('error', '')}"[:160]
    n = [str(r[k]) if k in r else "-" for k in ("held", "not held", "not measured")]
    return f"{r['lab']:<18}{r['seconds']:>5.0f} s  {n[0]:>3} held  {n[1]:>3} not held  {n[2]:>3} not measured"


def summary_text(rows: list[dict], device: str, started: str, serve: dict | None = None,
                 probes: list[dict] | None = None) -> str:
    """One screen: a line per lab (claim counts, or its failure), the serve line, a line per probed kernel, totals."""
    crashed = [r for r in rows if r["exit"] != 0]
    lines = [f"gpu-check: {len(rows)} labs, --device {device} --quick, started {started}"]
    lines += [lab_line(r) for r in rows]
    if serve is not None:
        lines.append(serve_line(serve))
    for p in probes or []:
        lines.append(f"kernel    {p['kernel']:<22}{p['status']}: {p.get('detail', '')}"[:160])
    tot = {k: sum(r.get(k, 0) for r in rows) for k in ("held", "not held", "not measured")}
    skipped = [r for r in crashed if r["exit"] == "not run"]
    lines.append(f"claims: {tot['held']} held, {tot['not held']} not held, {tot['not measured']} not measured; "
                 f"labs: {len(rows) - len(crashed)} ran, {len(crashed) - len(skipped)} failed"
                 + (f", {len(skipped)} not run (time budget)" if skipped else ""))
    return "\n".join(lines)


def details_text(rows: list[dict]) -> str:
    """Every claim not held and every failure in full (saved; the screen has only the counts)."""
    lines = []
    for r in rows:
        for c in r.get("not_held", []):
            lines.append(f"  not held  {r['lab']}: {c['id'] or c['text']} "
                         f"(measured {c['measured']}; expected {c['expected']})")
    for r in rows:
        if r["exit"] != 0:
            lines.append(f"  FAILED    {r['lab']} (exit {r['exit']}): {r.get('error', '')}; "
                         f"full stderr: {r.get('stderr_file')}")
    return "\n".join(lines)


def gpu_check(labs: list[str], device: str, out: Path, timeout_s: float = LAB_TIMEOUT_S, echo=print,
              budget_s: float = BUDGET_S, skip: tuple[str, ...] = ()) -> dict:
    """Every lab, the serve check and the probe; saves OUT/gpu-check/summary.{txt,json}, echoes the summary."""
    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    log_dir = out / "gpu-check"
    reserve = (0 if "serve" in skip else SERVE_S + SERVE_START_S) + (0 if "probe" in skip else PROBE_S)
    deadline = time.monotonic() + budget_s - reserve  # the labs' share: serve and the probe come after them
    rows = []
    for lab in labs:
        left = deadline - time.monotonic()
        if left < 10:
            rows.append({"lab": lab, "exit": "not run", "seconds": 0.0,
                         "error": f"the labs' {budget_s - reserve:.0f} s of the {budget_s:.0f} s budget were spent"})
            continue
        echo(f"== llmlab {lab} --device {device} --quick")
        rows.append(run_one(lab, device, out, log_dir, min(timeout_s, left)))
    serve = None if "serve" in skip else serve_check(device, log_dir)
    probes = None if "probe" in skip else probe_subprocess(device)
    text = summary_text(rows, device, started, serve, probes)
    log_dir.mkdir(parents=True, exist_ok=True)
    (log_dir / "summary.txt").write_text(text + "\n" + details_text(rows) + "\n")
    summary = {"device": device, "started": started, "labs": rows, "serve": serve, "kernels": probes}
    (log_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    echo(text)
    echo(f"(saved, with every claim not held: {log_dir / 'summary.txt'})")
    return summary


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m llmlab.tools.gpucheck", description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda",
                    help="device for every lab (cpu works too: the same check without a GPU)")
    ap.add_argument("--labs", default=None, help="space- or comma-separated lab names (default: every lab the CLI has)")
    ap.add_argument("--out", default="results", help="results folder; the summary goes to OUT/gpu-check/")
    ap.add_argument("--timeout", type=float, default=LAB_TIMEOUT_S, help="seconds before one lab is killed")
    ap.add_argument("--budget-s", type=float, default=BUDGET_S,
                    help="seconds for the whole check; a lab that would start past the labs' share is not run")
    ap.add_argument("--skip", default="", help="comma-separated parts to leave out: serve, probe")
    ap.add_argument("--install-check", action="store_true",
                    help="only check that torch can use the GPU nvidia-smi sees")
    ap.add_argument("--pip-index", action="store_true",
                    help="print pip's --index-url for a CUDA torch this driver runs")
    ap.add_argument("--probe", action="store_true", help="only probe the kernels on --device; JSON on stdout")
    args = ap.parse_args(argv)
    if args.install_check:
        hint = install_hint(nvidia_smi_text())
        if hint:
            print(f"llmlab install: {hint}", file=sys.stderr)
        return 0  # a warning, not a failure: the CPU labs still work
    if args.pip_index:
        print(pip_index_args(nvidia_smi_text()))
        return 0
    stop = preflight(args.device)
    if stop:
        print(stop, file=sys.stderr)
        return 2
    if args.probe:
        print(json.dumps(probe_kernels(args.device)))
        return 0
    labs = [x for x in re.split(r"[\s,]+", args.labs or "") if x] or discover_labs()
    skip = tuple(x for x in re.split(r"[\s,]+", args.skip) if x)
    got = gpu_check(labs, args.device, Path(args.out), args.timeout, budget_s=args.budget_s, skip=skip)
    serve_ok = got["serve"] is None or got["serve"]["ok"]
    return 0 if serve_ok and all(r["exit"] == 0 for r in got["labs"]) else 1


if __name__ == "__main__":
    sys.exit(main())
