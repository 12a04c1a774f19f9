"""Benchmark: are the roofline lab's roofs as high as independent code reaches on the same machine?

Run: `make bench-roofline` (= `python -m benchmarks.roofline [--device cpu] [--rounds 3] [--quick]`).

Ours: `llmlab.core.roofs` (torch kernels timed in blocks of calls; torch.matmul, cache flushed).
Peers, independent code (issue 12 item 9):
- bandwidth, numpy: copy = `np.copyto(b, a)`; triad = `np.multiply(c, s, out=t)` then
  `np.add(b, t, out=a)`. numpy's ufuncs run on one thread, so numpy appears at 1 thread only.
- bandwidth, C: `benchmarks/stream_triad.c`, the project's own OpenMP triad, compiled now with
  `cc -O2 -fopenmp` (reported "not run: no compiler" when there is none), at each thread count.
- compute: numpy's own BLAS (OpenBLAS in the wheels) `np.matmul(a, b, out=c)`, in a child
  process with OPENBLAS_NUM_THREADS / OMP_NUM_THREADS set to the same thread count as ours.
Bytes are counted STREAM's way on both sides (copy 2N, triad 3N, whatever a spelling moves in
between: numpy's two-pass triad really moves 5N, which is its cost, not ours).

Same thread counts on both sides (1 and all usable CPUs); each side's best thread count is
reported separately, and the ratio compares each side at its own best. Rounds alternate the
order of the sides, so a shared machine's drift hits both alike.

References:
- McCalpin, STREAM (stream.c): copy c = a, triad a = b + s*c, each byte counted once.
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


def build_c_triad(workdir: Path) -> tuple[Path | None, str]:
    """Compile stream_triad.c with cc -O2 -fopenmp; (executable, "") or (None, why not)."""
    cc = shutil.which(os.environ.get("CC", "cc"))
    if cc is None:
        return None, NO_COMPILER
    exe = Path(workdir) / "stream_triad"
    p = subprocess.run([cc, "-O2", "-fopenmp", str(C_SOURCE), "-o", str(exe)], capture_output=True, text=True)
    if p.returncode != 0:
        return None, f"not run: cc -fopenmp failed ({(p.stderr.strip().splitlines() or ['?'])[-1][:80]})"
    return exe, ""


def run_c_triad(exe: Path, n: int, threads: int, repeats: int) -> tuple[float, float, float]:
    """(best GB/s, median GB/s, checksum) of the C triad over n FP32 elements at `threads`."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "OMP_PROC_BIND": "false"}
    p = subprocess.run([str(exe), str(n), str(threads), str(repeats)], capture_output=True, text=True, env=env, check=True)
    best, median, checksum = (float(x) for x in p.stdout.split())
    return best, median, checksum


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
    env = {**os.environ, "OPENBLAS_NUM_THREADS": str(threads), "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    p = subprocess.run([sys.executable, "-c", NUMPY_MATMUL_CHILD, str(m), str(n), str(k), str(repeats), str(flush_bytes)],
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
    bufs = roofs.bandwidth_buffers(device, 8)
    n = bufs.a.numel()
    out: dict = {"device": device.name, "buffer_MiB": bufs.nbytes / 2**20, "threads": threads, "warm_up_s": warm, "bandwidth": {}, "compute": {}}
    if device.is_cuda:  # the peers are CPU code: a GPU compares with its spec sheet only
        bw = max(roofs.bandwidth_GBps(device, k, bufs=bufs, blocks=repeats) for k in ("copy", "triad"))
        spec, _ = bandwidth_spec_GBps(device)
        peak = roofs.matmul_peak_gflops(device, "bf16", repeats=repeats)
        sbf, _ = peak_for(device, "bf16")
        print(f"{device.name}: bandwidth {bw:.0f} GB/s ({100 * bw / spec:.0f}% of spec)" if spec else f"bandwidth {bw:.0f} GB/s")
        print(f"bf16 matmul {peak:.0f} GFLOP/s" + (f" ({100 * peak / sbf:.0f}% of spec)" if sbf else ""))
        print("peers: not run on a GPU (numpy and the C triad are CPU code)")
        return
    an, bn, cn = (np.full(n, v, dtype=np.float32) for v in (0.0, 1.0, 2.0))  # the peers' own buffers, same size
    peers = numpy_bandwidth_peers(an, bn, cn)
    with tempfile.TemporaryDirectory() as tmp:
        exe, why = build_c_triad(Path(tmp))
        res: dict = {k: {"ours (torch)": {}, "numpy": {}, "C OpenMP": {}} for k in ("copy", "triad")}
        for r in range(args.rounds):
            sides = ["ours", "peers"] if r % 2 == 0 else ["peers", "ours"]
            for side in sides:
                for t in threads:
                    for kind in ("copy", "triad"):
                        if side == "ours":
                            g = roofs.measure_bandwidth(device, kind, bufs=bufs, blocks=repeats, threads=t).median_GBps
                            res[kind]["ours (torch)"].setdefault(t, []).append(g)
                        elif t == 1:
                            fn, nb = peers[kind]
                            res[kind]["numpy"].setdefault(t, []).append(nb / time_numpy(fn, repeats)[1] / 1e9)
                    if side == "peers" and exe is not None:
                        res["triad"]["C OpenMP"].setdefault(t, []).append(run_c_triad(exe, n, t, repeats)[1])
        del an, bn, cn, peers, bufs
    for kind, sides in res.items():
        out["bandwidth"][kind] = {s: {str(t): v for t, v in d.items()} for s, d in sides.items()}
    shapes = ((2048, 2048, 2048),) if args.quick else ((2048, 2048, 2048), (4096, 1024, 1024), (1024, 4096, 1024))
    flush_bytes = 2 * last_level_cache_bytes(device)
    comp: dict = {"ours (torch)": {}, "numpy BLAS": {}}
    for r in range(args.rounds):
        for side in (["ours", "peers"] if r % 2 == 0 else ["peers", "ours"]):
            for t in threads:
                for m, nn, k in shapes:
                    if side == "ours":
                        s = roofs.matmul_stats(device, m, nn, k, "fp32", repeats=repeats, threads=t)
                        comp["ours (torch)"].setdefault(t, []).append(2 * m * nn * k / s.median_s / 1e9)
                    else:
                        comp["numpy BLAS"].setdefault(t, []).append(numpy_matmul_gflops(m, nn, k, t, repeats, flush_bytes)[1])
    out["compute"] = {s: {str(t): v for t, v in d.items()} for s, d in comp.items()}
    out["c_triad"] = why or "built with cc -O2 -fopenmp"
    if args.json:
        print(json.dumps(out, indent=1))
        return
    _report(out, res, comp, why, torch.__version__)


def _report(out: dict, res: dict, comp: dict, why: str, torch_version: str) -> None:
    print(f"device: {out['device']}; buffers {out['buffer_MiB']:.0f} MiB each (8x LLC); threads {out['threads']}; "
          f"warm-up {out['warm_up_s']:.2f} s; torch {torch_version}")
    print("\nbandwidth, GB/s: best median over rounds, per thread count; STREAM byte counts on both sides")
    for kind, sides in res.items():
        line = []
        for side, d in sides.items():
            if not d:
                line.append(f"{side}: {(why or 'triad only') if side == 'C OpenMP' else 'n/a'}")
                continue
            per_t = ", ".join(f"{t}t {max(v):.2f}" for t, v in sorted(d.items()))
            bt, _ = best_of(d)
            line.append(f"{side}: {per_t} (best at {bt} threads)")
        print(f"  {kind:6s} " + " | ".join(line))
        ours_t, ours = best_of(sides["ours (torch)"])
        peer = max(((s, *best_of(d)) for s, d in sides.items() if s != "ours (torch)" and d), key=lambda x: x[2], default=None)
        if peer:
            print(f"         ours at its best ({ours_t} threads) / best peer ({peer[0]}, {peer[1]} threads): {ours / peer[2]:.2f}x")
    print("\ncompute, FP32 matmul GFLOP/s: best median over shapes and rounds, per thread count")
    for side, d in comp.items():
        bt, _ = best_of(d)
        print(f"  {side:13s} " + ", ".join(f"{t}t {max(v):.1f}" for t, v in sorted(d.items())) + f" (best at {bt} threads)")
    (ot, o), (pt, pv) = best_of(comp["ours (torch)"]), best_of(comp["numpy BLAS"])
    print(f"  ours at its best ({ot} threads) / numpy BLAS at its best ({pt} threads): {o / pv:.2f}x")


if __name__ == "__main__":
    main()
