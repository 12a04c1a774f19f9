"""Benchmark: are the roofline lab's roofs as high as independent code reaches on the same machine?

Run: `make bench-roofline` (= `python -m benchmarks.roofline [--device cpu] [--rounds 3] [--quick]`).

Ours: `llmlab.core.roofs` (torch kernels read, write, copy, triad timed in blocks of calls; the lab's
DRAM roof is the best median over kernels and thread counts; torch.matmul, cache flushed).
Peers, independent code:
- bandwidth, C: `benchmarks/stream_triad.c`, McCalpin's four STREAM kernels (Copy, Scale, Add,
  Triad, FP64; Copy with non-temporal stores where the compiler has AVX/AVX-512 intrinsics),
  compiled now with `cc -O3 -march=native -fopenmp` (reported "not run: no compiler" when there is
  none), run with OMP_NUM_THREADS set to each thread count. Its arrays hold as many bytes as the
  lab's buffers (8x the LLC, capped at 1/8 of free memory) and at least STREAM's 80 M doubles.
  Its results are checked against STREAM's scalar recurrence before they count.
- bandwidth, numpy: copy = `np.copyto(b, a)`; triad = `np.multiply(c, s, out=t)` then
  `np.add(b, t, out=a)`. numpy's ufuncs run on one thread, so numpy appears at 1 thread only.
- compute: numpy's own BLAS (OpenBLAS in the wheels) `np.matmul(a, b, out=c)`, in a child
  process with OPENBLAS_NUM_THREADS / OMP_NUM_THREADS set to the same thread count as ours.
Bytes are counted STREAM's way on every side (copy and scale 2N, add and triad 3N, read and write
N, whatever a spelling moves in between: numpy's two-pass triad really moves 5N, which is its cost).

The headline ratio is the lab's DRAM roof (its median, as the lab reports it) over STREAM's best
kernel at its best rate (as STREAM reports it), same run; the goal is >= 0.9x. Same thread counts on
both sides (1 and all usable CPUs); rounds alternate the order of the sides, so a shared machine's
drift hits both alike; each side allocates its buffers for its turn only.

References:
- McCalpin, STREAM (stream.c): copy c = a, scale b = s*c, add c = a + b, triad a = b + s*c,
  each byte counted once, best rate over repeats.
- Stas Bekman, mamf-finder: best and median over shapes, cache flushed between repeats.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

S = 3.0  # the triad scalar (STREAM's 3.0)
C_SOURCE = Path(__file__).with_name("stream_triad.c")
NO_COMPILER = "not run: no compiler"

# ---------------------------------------------------------------- peers (no llmlab, no torch)


def numpy_bandwidth_peers(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> dict[str, tuple]:
    """kernel -> (fn, bytes counted STREAM's way); a, b, c: float32 arrays of n elements."""
    tmp = np.empty_like(a)
    nb = a.nbytes

    def triad():
        np.multiply(c, S, out=tmp)
        np.add(b, tmp, out=a)

    return {"copy": (lambda: np.copyto(b, a), 2 * nb), "triad": (triad, 3 * nb)}


def time_numpy(fn, repeats: int) -> tuple[float, float]:
    """(best s, median s) per call after one warm-up call."""
    fn()
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return min(ts), statistics.median(ts)


C_FLAGS = ("-O3", "-march=native", "-fopenmp")
STREAM_KERNELS = ("copy", "scale", "add", "triad")
STREAM_MIN_ELEMENTS = 80_000_000  # STREAM's own advice: arrays >= 4x the LLC; 80 M doubles is its usual size


def build_c_stream(workdir: Path) -> tuple[Path | None, str]:
    """Compile stream_triad.c with cc -O3 -march=native -fopenmp; (executable, "") or (None, why not)."""
    cc = shutil.which(os.environ.get("CC", "cc"))
    if cc is None:
        return None, NO_COMPILER
    exe = Path(workdir) / "stream"
    p = subprocess.run([cc, *C_FLAGS, str(C_SOURCE), "-o", str(exe)], capture_output=True, text=True)
    if p.returncode != 0:
        return None, f"not run: cc {' '.join(C_FLAGS)} failed ({(p.stderr.strip().splitlines() or ['?'])[-1][:80]})"
    return exe, ""


def stream_checksum(n: int, repeats: int) -> float:
    """STREAM's check: a, b, c after repeats + 1 rounds of copy, scale, add, triad from 1, 2, 0, summed every 4096th."""
    a, b, c = 1.0, 2.0, 0.0
    for _ in range(repeats + 1):
        c = a
        b = S * c
        c = a + b
        a = b + S * c
    return len(range(0, n // 8 * 8, 4096)) * (a + b + c)


def parse_stream(stdout: str) -> tuple[dict[str, tuple[float, float]], str, float]:
    """({kernel: (best GB/s, median GB/s)}, copy stores, checksum) from stream_triad's output."""
    rates, stores, checksum = {}, "?", float("nan")
    for line in stdout.splitlines():
        name, *vals = line.split()
        if name in STREAM_KERNELS:
            rates[name] = (float(vals[0]), float(vals[1]))
        elif name == "copy_stores":
            stores = vals[0]
        elif name == "checksum":
            checksum = float(vals[0])
    return rates, stores, checksum


def run_c_stream(exe: Path, n: int, threads: int, repeats: int) -> tuple[dict[str, tuple[float, float]], str]:
    """({kernel: (best GB/s, median GB/s)}, copy stores) of STREAM over n doubles at `threads` (OMP_NUM_THREADS);
    raises RuntimeError when its arrays do not hold what STREAM's recurrence predicts."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "OMP_PROC_BIND": "false"}
    p = subprocess.run([str(exe), str(n), str(threads), str(repeats)], capture_output=True, text=True, env=env,
                       check=True)
    rates, stores, checksum = parse_stream(p.stdout)
    want = stream_checksum(n, repeats)
    if not abs(checksum - want) <= 1e-9 * abs(want):
        raise RuntimeError(f"STREAM's arrays are wrong: checksum {checksum} != {want}")
    return rates, stores


NUMPY_MATMUL_CHILD = """
import sys, time, statistics
import numpy as np
m, n, k, repeats, flush_bytes = (int(x) for x in sys.argv[1:6])
rng = np.random.default_rng(1)
a = rng.standard_normal((m, k), dtype=np.float32)
b = rng.standard_normal((k, n), dtype=np.float32)
c = np.empty((m, n), dtype=np.float32)
flush = np.empty(flush_bytes // 4, dtype=np.float32)
np.matmul(a, b, out=c)
ts = []
for _ in range(repeats):
    flush.fill(1.0)
    t0 = time.perf_counter()
    np.matmul(a, b, out=c)
    ts.append(time.perf_counter() - t0)
print(min(ts), statistics.median(ts))
"""


def numpy_matmul_gflops(m: int, n: int, k: int, threads: int, repeats: int, flush_bytes: int) -> tuple[float, float]:
    """(best, median) GFLOP/s of numpy's BLAS on (M,K) @ (K,N) FP32 in a child with `threads` BLAS threads."""
    env = {**os.environ, "OPENBLAS_NUM_THREADS": str(threads), "OMP_NUM_THREADS": str(threads),
           "MKL_NUM_THREADS": str(threads)}
    p = subprocess.run([sys.executable, "-c", NUMPY_MATMUL_CHILD, str(m), str(n), str(k), str(repeats),
                        str(flush_bytes)],
                       capture_output=True, text=True, env=env, check=True)
    best_s, med_s = (float(x) for x in p.stdout.split())
    flops = 2 * m * n * k
    return flops / best_s / 1e9, flops / med_s / 1e9


# ---------------------------------------------------------------- the comparison


def best_of(results: dict) -> tuple[object, float]:
    """(thread count, GB/s or GFLOP/s) of the best median over rounds, for one side."""
    key = max(results, key=lambda t: max(results[t]))
    return key, max(results[key])


def main() -> None:
    import torch

    from llmlab.core import roofs
    from llmlab.core.device import cpu_cores, last_level_cache_bytes, resolve_device
    from llmlab.core.specs import bandwidth_spec_GBps, peak_for

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--rounds", type=int, default=3, help="rounds, order of the sides flipped each round")
    p.add_argument("--quick", action="store_true", help="fewer repeats and one shape (a smoke test, not the goal)")
    p.add_argument("--json", action="store_true", help="print the numbers as JSON instead of the report")
    args = p.parse_args()
    device = resolve_device(args.device)
    repeats = 3 if args.quick else 10
    threads = sorted({1, cpu_cores()["logical"]})
    warm = roofs.warm_up(device, 0.3)
    if device.is_cuda:  # the peers are CPU code: a GPU compares with its spec sheet only
        return gpu_report(device, repeats, bandwidth_spec_GBps, peak_for)
    nbytes, note = roofs.buffer_bytes(device, 8)  # the lab's buffer size: 8x the LLC, capped at 1/8 of free memory
    out: dict = {"device": device.name, "buffer_MiB": nbytes / 2**20, "buffer_note": note, "threads": threads,
                 "warm_up_s": warm}
    with tempfile.TemporaryDirectory() as tmp:
        exe, why = build_c_stream(Path(tmp))
        out["c_stream"] = why or f"built with cc {' '.join(C_FLAGS)}"
        bw = bandwidth_rounds(device, threads, args.rounds, repeats, exe, nbytes)
    out["bandwidth"] = bw
    out["compute"] = compute_rounds(device, threads, args.rounds, repeats, args.quick, last_level_cache_bytes(device))
    out["roof_vs_stream"] = roof_vs_stream(bw)
    if args.json:
        print(json.dumps(out, indent=1, default=str))
        return
    _report(out, torch.__version__)


def gpu_report(device, repeats: int, bandwidth_spec_GBps, peak_for) -> None:
    from llmlab.core import roofs

    bufs = roofs.bandwidth_buffers(device, 8)
    bw = max(roofs.bandwidth_GBps(device, k, bufs=bufs, blocks=repeats) for k in roofs.KERNELS)
    spec, _ = bandwidth_spec_GBps(device)
    peak = roofs.matmul_peak_gflops(device, "bf16", repeats=repeats)
    sbf, _ = peak_for(device, "bf16")
    print(f"{device.name}: bandwidth {bw:.0f} GB/s ({100 * bw / spec:.0f}% of spec)" if spec
          else f"bandwidth {bw:.0f} GB/s")
    print(f"bf16 matmul {peak:.0f} GFLOP/s" + (f" ({100 * peak / sbf:.0f}% of spec)" if sbf else ""))
    print("peers: not run on a GPU (numpy and the C STREAM are CPU code)")


def bandwidth_rounds(device, threads: list[int], rounds: int, repeats: int, exe: Path | None, nbytes: int) -> dict:
    """side -> kernel -> threads -> [(best GB/s, median GB/s) per round]; each side allocates its buffers for its
    turn."""
    from llmlab.core import roofs

    res: dict = {"ours (torch)": {}, "numpy": {}, "C STREAM": {}}
    add = lambda side, kernel, t, v: res[side].setdefault(kernel, {}).setdefault(t, []).append(v)  # noqa: E731
    n_c = max(STREAM_MIN_ELEMENTS, nbytes // 8)
    for r in range(rounds):
        for side in (["ours", "peers"] if r % 2 == 0 else ["peers", "ours"]):
            if side == "ours":
                bufs = roofs.bandwidth_buffers(device, 8)
                for t in threads:
                    for kind in roofs.KERNELS:
                        b = roofs.measure_bandwidth(device, kind, bufs=bufs, blocks=repeats, threads=t)
                        add("ours (torch)", kind, t, (b.best_GBps, b.median_GBps))
                del bufs
                continue
            for kind, rates in numpy_round(nbytes, repeats).items():  # its arrays are freed before the C side runs
                add("numpy", kind, 1, rates)
            for t in threads if exe is not None else ():
                rates, stores = run_c_stream(exe, n_c, t, repeats)
                res["copy_stores"], res["stream_MiB"] = stores, n_c * 8 / 2**20
                for kind, v in rates.items():
                    add("C STREAM", kind, t, v)
    return res


def numpy_round(nbytes: int, repeats: int) -> dict[str, tuple[float, float]]:
    """numpy's copy and triad on its own three float32 arrays of `nbytes`: kernel -> (best GB/s, median GB/s)."""
    arrays = [np.full(nbytes // 4, v, dtype=np.float32) for v in (0.0, 1.0, 2.0)]
    out = {}
    for kind, (fn, nb) in numpy_bandwidth_peers(*arrays).items():
        best, med = time_numpy(fn, repeats)
        out[kind] = (nb / best / 1e9, nb / med / 1e9)
    return out


def compute_rounds(device, threads: list[int], rounds: int, repeats: int, quick: bool, llc: int) -> dict:
    """side -> threads -> [median GFLOP/s per shape and round]: torch.matmul against numpy's BLAS."""
    from llmlab.core import roofs

    shapes = ((2048, 2048, 2048),) if quick else ((2048, 2048, 2048), (4096, 1024, 1024), (1024, 4096, 1024))
    comp: dict = {"ours (torch)": {}, "numpy BLAS": {}}
    for r in range(rounds):
        for side in (["ours", "peers"] if r % 2 == 0 else ["peers", "ours"]):
            for t in threads:
                for m, nn, k in shapes:
                    if side == "ours":
                        s = roofs.matmul_stats(device, m, nn, k, "fp32", repeats=repeats, threads=t)
                        comp["ours (torch)"].setdefault(t, []).append(2 * m * nn * k / (s.median / 1e3) / 1e9)
                    else:
                        comp["numpy BLAS"].setdefault(t,
                                                      []).append(numpy_matmul_gflops(m, nn, k, t, repeats, 2 * llc)[1])
    return comp


def roof_vs_stream(bw: dict) -> dict:
    """The lab's DRAM roof (best median over kernels, threads, rounds: the lab's rule) against STREAM's best kernel
    at its best rate (STREAM's own statistic) and at its best median."""
    def top(side: str, i: int) -> tuple[float, str]:
        cands = [(v[i], f"{k}, {t} threads") for k, by_t in bw.get(side,
                                                                   {}).items() for t, vs in by_t.items() for v in vs]
        return max(cands) if cands else (float("nan"), "not run")

    roof, roof_how = top("ours (torch)", 1)
    best, best_how = top("C STREAM", 0)
    med, med_how = top("C STREAM", 1)
    return dict(lab_roof_GBps=roof, lab_roof_kernel=roof_how, stream_best_rate_GBps=best, stream_best_kernel=best_how,
                stream_best_median_GBps=med, stream_median_kernel=med_how, ratio_to_best_rate=roof / best,
                ratio_to_best_median=roof / med, goal=0.9)


def _report(out: dict, torch_version: str) -> None:
    bw, rv = out["bandwidth"], out["roof_vs_stream"]
    note = "; " + out["buffer_note"] if out["buffer_note"] else ""
    print(f"device: {out['device']}; lab buffers {out['buffer_MiB']:.0f} MiB each (8x LLC{note}); "
          f"threads {out['threads']}; warm-up {out['warm_up_s']:.2f} s; torch {torch_version}")
    print(f"C STREAM: {out['c_stream']}; arrays {bw.get('stream_MiB', 0):.0f} MiB each (FP64); "
          f"copy stores: {bw.get('copy_stores', '-')}")
    print("\nbandwidth, GB/s per thread count: best rate / median (best over rounds); STREAM byte counts on every side")
    for side in ("ours (torch)", "C STREAM", "numpy"):
        for kind, by_t in bw.get(side, {}).items():
            per_t = ", ".join(f"{t}t {max(v[0] for v in vs):.2f} / {max(v[1] for v in vs):.2f}"
                              for t, vs in sorted(by_t.items()))
            print(f"  {side:13s} {kind:6s} {per_t}")
    print(f"\nthe lab's DRAM roof {rv['lab_roof_GBps']:.2f} GB/s ({rv['lab_roof_kernel']}, median) / "
          f"STREAM's best kernel {rv['stream_best_rate_GBps']:.2f} GB/s ({rv['stream_best_kernel']}, best rate): "
          f"{rv['ratio_to_best_rate']:.2f}x (goal >= {rv['goal']}x); against STREAM's best median "
          f"{rv['stream_best_median_GBps']:.2f}: {rv['ratio_to_best_median']:.2f}x")
    print("\ncompute, FP32 matmul GFLOP/s: best median over shapes and rounds, per thread count")
    comp = out["compute"]
    for side, d in comp.items():
        bt, _ = best_of(d)
        per_t = ", ".join(f"{t}t {max(v):.1f}" for t, v in sorted(d.items()))
        print(f"  {side:13s} {per_t} (best at {bt} threads)")
    (ot, o), (pt, pv) = best_of(comp["ours (torch)"]), best_of(comp["numpy BLAS"])
    print(f"  ours at its best ({ot} threads) / numpy BLAS at its best ({pt} threads): {o / pv:.2f}x")


if __name__ == "__main__":
    main()
