"""Benchmark: are the roofline lab's measured roofs as high as the straightforward tools reach?

Run: `make bench-roofline` (= `python -m benchmarks.roofline [--device cpu] [--rounds 3] [--quick]`).

Goals (issue 5): on a CPU, the lab's bandwidth >= 0.9x a STREAM-style copy / triad done the
straightforward way with numpy or torch, and its compute >= 0.95x the best plain numpy / torch
matmul among the lab's searched shapes, measured in the same run. On an H100/H200-class GPU,
bandwidth >= 90% of spec and dense BF16 >= 80% of spec.

Method: the lab's own kernels and variants (`bandwidth_kernels` at each of `thread_counts`;
`matmul_fn` over `matmul_backends`, output preallocated) and the peers (default threads, the
plain spelling) run on the same buffers and shapes, interleaved per kernel and per shape, the
order flipped every round, so that a shared machine's drift hits both sides alike. The lab's
figure is its best variant's median (what its roof is); the peer's is the best peer's median;
each is the best over rounds. On a busy machine a best-over-rounds can catch one lucky quiet
window, so the verdict uses the paired ratio: ours / peers within the same round and shape,
median over rounds and shapes. Bytes are counted as the lab counts them: copy 2N, triad 3N.

References:
- McCalpin, STREAM: copy c = a, triad a = b + s*c, each byte counted once.
- Stas Bekman, mamf-finder: best and median over shapes, cache flushed between repeats.
"""

from __future__ import annotations

import argparse
import statistics
from contextlib import nullcontext

import numpy as np
import torch

from llmlab.core.device import resolve_device, torch_threads
from llmlab.core.specs import bandwidth_spec_GBps, peak_for
from llmlab.core.timing import L2Flusher, measure
from llmlab.labs import roofline as R

S = R.TRIAD_SCALAR


def bandwidth_contenders(bufs, device) -> dict[str, dict[str, tuple]]:
    """kernel -> {label: (fn, bytes, torch threads or None)}; labels starting 'lab' are ours."""
    a, b, c, _ = bufs
    nb = a.numel() * a.element_size()
    out: dict[str, dict[str, tuple]] = {"copy": {}, "triad": {}}
    for t in R.thread_counts(device):
        for kernel in out:
            fn, nbytes = R.bandwidth_kernels(a, b, c)[kernel]
            out[kernel][f"lab ({t} threads)"] = (fn, nbytes, t)
    out["copy"]["torch b.copy_(a)"] = (lambda: b.copy_(a), 2 * nb, None)
    out["triad"]["torch.add(b, c, alpha=s, out=a)"] = (lambda: torch.add(b, c, alpha=S, out=a), 3 * nb, None)
    out["triad"]["torch a[:] = b + s * c"] = (lambda: a.__setitem__(slice(None), b + S * c), 3 * nb, None)
    if not a.is_cuda:
        an, bn, cn = a.numpy(), b.numpy(), c.numpy()
        out["copy"]["numpy np.copyto(b, a)"] = (lambda: np.copyto(bn, an), 2 * nb, None)
        out["triad"]["numpy a[:] = b + s * c"] = (lambda: an.__setitem__(slice(None), bn + S * cn), 3 * nb, None)
    return out


def matmul_contenders(a, b, out, dtype: str, device) -> dict[str, tuple]:
    """label -> (fn, torch threads or None) for one shape: the lab's variants and the plain peers."""
    c = {f"lab {bk} ({t or 'blas default'} threads)": (R.matmul_fn(bk, a, b, out), t or None)
         for bk, t in R.matmul_backends(device, dtype)}
    c["torch a @ b"] = (lambda: a @ b, None)
    if not device.is_cuda and dtype == "fp32":
        an, bn = a.numpy(), b.numpy()
        c["numpy a @ b"] = (lambda: an @ bn, None)
    return c


def _run(fn, threads, device, **kw):
    with torch_threads(threads):  # None: torch's own count
        return measure(fn, device, **kw)


def _ordered(items: dict, r: int) -> list:
    keys = list(items)
    return keys if r % 2 == 0 else keys[::-1]


def _paired(rnd: dict[str, float]) -> float:
    """ours / peers within one round: the best lab variant over the best peer."""
    return max(v for k, v in rnd.items() if k.startswith("lab")) / max(v for k, v in rnd.items() if not k.startswith("lab"))


def bench_bandwidth(cfg, device, bufs, rounds: int) -> tuple[dict[str, dict[str, float]], dict[str, list[float]]]:
    """(kernel -> label -> best per-round median GB/s, kernel -> paired ratios)."""
    best: dict[str, dict[str, float]] = {}
    pairs: dict[str, list[float]] = {}
    cont = bandwidth_contenders(bufs, device)
    for r in range(rounds):
        for kernel, cands in cont.items():
            rnd = {}
            for label in _ordered(cands, r):
                fn, nbytes, threads = cands[label]
                s = _run(fn, threads, device, warmup=cfg.bandwidth_warmup, repeats=cfg.bandwidth_repeats)
                rnd[label] = nbytes / s.median_s / 1e9
                best.setdefault(kernel, {})[label] = max(best.get(kernel, {}).get(label, 0.0), rnd[label])
            pairs.setdefault(kernel, []).append(_paired(rnd))
    return best, pairs


def bench_compute(cfg, device, dtypes, rounds: int) -> tuple[dict[str, dict[str, float]], dict[str, list[float]]]:
    """(dtype -> label -> best (over shapes and rounds) median GFLOP/s, dtype -> paired ratios), cache flushed."""
    shapes = cfg.gpu_shapes if device.is_cuda else cfg.cpu_shapes
    flush = L2Flusher(device)
    gen = R.device_generator(device, 1)
    best: dict[str, dict[str, float]] = {}
    pairs: dict[str, list[float]] = {}
    for dtype in dtypes:
        with R._tf32(dtype == "tf32") if device.is_cuda else nullcontext():
            for m, n, k in shapes:
                a, b, out = R.gemm_operands(m, n, k, dtype, device, gen)
                cands = matmul_contenders(a, b, out, dtype, device)
                for r in range(rounds):
                    rnd = {}
                    for label in _ordered(cands, r):
                        fn, threads = cands[label]
                        s = _run(fn, threads, device, warmup=1, repeats=cfg.compute_repeats, setup=flush)
                        rnd[label] = 2 * m * n * k / s.median_s / 1e9
                        best.setdefault(dtype, {})[label] = max(best.get(dtype, {}).get(label, 0.0), rnd[label])
                    pairs.setdefault(dtype, []).append(_paired(rnd))
                del a, b, out, cands
    return best, pairs


def _verdict(table: dict[str, float]) -> tuple[str, float, str, float, float]:
    """(our best label, ours, the best peer's label, peer, ours / peer)."""
    ours = {k: v for k, v in table.items() if k.startswith("lab")}
    peers = {k: v for k, v in table.items() if not k.startswith("lab")}
    o_label, o = max(ours.items(), key=lambda kv: kv[1])
    p_label, p = max(peers.items(), key=lambda kv: kv[1])
    return o_label, o, p_label, p, o / p


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="auto")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds, order flipped each round")
    p.add_argument("--quick", action="store_true", help="the lab's --quick shapes and repeats (a smoke test, not the goal)")
    args = p.parse_args()
    device = resolve_device(args.device)
    cfg = R.Config.quick() if args.quick else R.Config()
    dtypes = ("fp32", "tf32", "bf16", "fp16") if device.is_cuda else ("fp32", "bf16")
    bufs = R.bandwidth_buffers(cfg, device)
    print(f"device: {device.name} ({device.spec}); buffers {bufs[0].numel() * 4 / 2**20:.0f} MiB each; "
          f"shapes {cfg.gpu_shapes if device.is_cuda else cfg.cpu_shapes}; {args.rounds} rounds", flush=True)
    bw, bw_pairs = bench_bandwidth(cfg, device, bufs, args.rounds)
    del bufs
    comp, comp_pairs = bench_compute(cfg, device, dtypes, args.rounds)

    print("\nbandwidth, GB/s (best per-round median); paired = median of same-round ratios")
    for kernel, table in bw.items():
        ol, o, pl, pv, ratio = _verdict(table)
        paired = statistics.median(bw_pairs[kernel])
        print(f"  {kernel:6s} {ol:34s} {o:8.2f}  vs  {pl:34s} {pv:8.2f}   best/best {ratio:.3f}  paired {paired:.3f}  "
              f"(goal >= 0.90: {'ok' if paired >= 0.9 else 'BELOW'})")
    print("compute, GFLOP/s (best shape's median); paired = median over shapes and rounds")
    for dtype, table in comp.items():
        ol, o, pl, pv, ratio = _verdict(table)
        paired = statistics.median(comp_pairs[dtype])
        print(f"  {dtype:6s} {ol:34s} {o:8.1f}  vs  {pl:34s} {pv:8.1f}   best/best {ratio:.3f}  paired {paired:.3f}  "
              f"(goal >= 0.95: {'ok' if paired >= 0.95 else 'BELOW'})")
    spec_bw, _ = bandwidth_spec_GBps(device)
    top_bw = max(v for t in bw.values() for k, v in t.items() if k.startswith("lab"))
    print(f"bandwidth vs spec: {f'{100 * top_bw / spec_bw:.0f}% of {spec_bw:.0f} GB/s (goal >= 90% on H100/H200)' if spec_bw else 'no spec for this device'}")
    spec_bf16, src = peak_for(device, "bf16")
    if spec_bf16:
        top = max(v for k, v in comp["bf16"].items() if k.startswith("lab"))
        goal = " (goal >= 80% on H100/H200)" if device.is_cuda else ""
        print(f"bf16 vs spec: {100 * top / spec_bf16:.0f}% of {spec_bf16:.0f} GFLOP/s{goal} [{src}]")


if __name__ == "__main__":
    main()
