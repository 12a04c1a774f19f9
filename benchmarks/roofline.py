"""Benchmark: are the roofline lab's measured roofs as high as the straightforward tools reach?

Run: `make bench-roofline` (= `python -m benchmarks.roofline [--device cpu] [--rounds 2]`).

Goals (issue 5): on a CPU, the lab's bandwidth >= 0.9x a STREAM-style copy / triad done the
straightforward way with numpy or torch, and its compute >= 0.95x the best plain numpy / torch
matmul among the lab's searched shapes, measured in the same run. On an H100/H200-class GPU,
bandwidth >= 90% of spec and dense BF16 >= 80% of spec.

Method: the lab's own functions (`measure_bandwidth`, `measure_compute`) and the peers run on
the same buffers and shapes, alternating order over `--rounds` rounds (ours first, then peers
first) so drift on a shared machine hits both; each figure is the best per-round median.
Bytes are counted as the lab counts them: copy 2N, triad 3N.

References:
- McCalpin, STREAM: copy c = a, triad a = b + s*c, each byte counted once.
- Stas Bekman, mamf-finder: best and median over shapes, cache flushed between repeats.
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

from llmlab.core.device import resolve_device
from llmlab.core.specs import bandwidth_spec_GBps, peak_for
from llmlab.core.timing import L2Flusher, measure
from llmlab.labs import roofline as R

S = R.TRIAD_SCALAR


def peer_bandwidth(bufs, device, repeats: int) -> dict[tuple[str, str], float]:
    """(kernel, peer) -> median GB/s of the straightforward ways, at default threads."""
    a, b, c, _ = bufs
    nb = a.numel() * a.element_size()
    peers = {
        ("copy", "torch b.copy_(a)"): (lambda: b.copy_(a), 2 * nb),
        ("triad", "torch.add(b, c, alpha=s, out=a)"): (lambda: torch.add(b, c, alpha=S, out=a), 3 * nb),
        ("triad", "torch a[:] = b + s * c"): (lambda: a.__setitem__(slice(None), b + S * c), 3 * nb),
    }
    if not a.is_cuda:
        an, bn, cn = a.numpy(), b.numpy(), c.numpy()
        peers[("copy", "numpy np.copyto(b, a)")] = (lambda: np.copyto(bn, an), 2 * nb)
        peers[("triad", "numpy a[:] = b + s * c")] = (lambda: an.__setitem__(slice(None), bn + S * cn), 3 * nb)
    out = {}
    for key, (fn, nbytes) in peers.items():
        out[key] = nbytes / measure(fn, device, warmup=2, repeats=repeats).median_s / 1e9
    return out


def peer_compute(cfg: R.Config, device, dtypes) -> dict[tuple[str, str], float]:
    """(dtype, peer) -> best median GFLOP/s over the lab's shapes of plain `a @ b`, cache flushed."""
    shapes = cfg.gpu_shapes if device.is_cuda else cfg.cpu_shapes
    flush = L2Flusher(device)
    gen = R.device_generator(device, 1)
    out: dict[tuple[str, str], float] = {}
    for dtype in dtypes:
        with R._tf32(dtype == "tf32") if device.is_cuda else R._nullcontext():
            for m, n, k in shapes:
                a, b, _ = R.gemm_operands(m, n, k, dtype, device, gen)
                peers = {"torch a @ b": lambda a=a, b=b: a @ b}
                if not device.is_cuda and dtype == "fp32":
                    peers["numpy a @ b"] = lambda an=a.numpy(), bn=b.numpy(): an @ bn
                for name, fn in peers.items():
                    s = measure(fn, device, warmup=1, repeats=cfg.compute_repeats, setup=flush)
                    g = 2 * m * n * k / s.median_s / 1e9
                    out[(dtype, name)] = max(out.get((dtype, name), 0.0), g)
    return out


def ours(cfg, device, bufs, dtypes):
    bw = R.measure_bandwidth(cfg, device, bufs)
    comp = R.measure_compute(cfg, device, dtypes)
    return bw.groupby("kernel")["median_GBps"].max().to_dict(), comp.groupby("dtype")["median_gflops"].max().to_dict()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="auto")
    p.add_argument("--rounds", type=int, default=2, help="alternating rounds (ours first / peers first)")
    args = p.parse_args()
    device = resolve_device(args.device)
    cfg = R.Config()
    dtypes = ("fp32", "tf32", "bf16", "fp16") if device.is_cuda else ("fp32", "bf16")
    bufs = R.bandwidth_buffers(cfg, device)
    print(f"device: {device.name} ({device.spec}); buffers {bufs[0].numel() * 4 / 2**20:.0f} MiB each; "
          f"shapes {cfg.gpu_shapes if device.is_cuda else cfg.cpu_shapes}; {args.rounds} rounds", flush=True)
    best_bw: dict = {}
    best_c: dict = {}
    peers_bw: dict = {}
    peers_c: dict = {}

    def keep(d, new):
        for k, v in new.items():
            d[k] = max(d.get(k, 0.0), v)

    for r in range(args.rounds):
        order = ("ours", "peers") if r % 2 == 0 else ("peers", "ours")
        for who in order:
            if who == "ours":
                bw, comp = ours(cfg, device, bufs, dtypes)
                keep(best_bw, bw)
                keep(best_c, comp)
            else:
                keep(peers_bw, peer_bandwidth(bufs, device, cfg.bandwidth_repeats))
                keep(peers_c, peer_compute(cfg, device, dtypes))
        print(f"round {r + 1}/{args.rounds} done", flush=True)

    print("\nbandwidth (GB/s, best per-round median)          ours    best peer   ratio  goal")
    for kernel in ("copy", "triad"):
        cands = {name: v for (k, name), v in peers_bw.items() if k == kernel}
        name, peer = max(cands.items(), key=lambda kv: kv[1])
        ratio = best_bw[kernel] / peer
        print(f"  {kernel:6s} vs {name:36s} {best_bw[kernel]:8.2f} {peer:10.2f} {ratio:7.3f}  >= 0.90 {'ok' if ratio >= 0.9 else 'BELOW'}")
    print("compute (GFLOP/s, best shape's median)           ours    best peer   ratio  goal")
    for dtype in dtypes:
        cands = {name: v for (d, name), v in peers_c.items() if d == dtype}
        name, peer = max(cands.items(), key=lambda kv: kv[1])
        ratio = best_c[dtype] / peer
        print(f"  {dtype:6s} vs {name:36s} {best_c[dtype]:8.1f} {peer:10.1f} {ratio:7.3f}  >= 0.95 {'ok' if ratio >= 0.95 else 'BELOW'}")
    spec_bw, _ = bandwidth_spec_GBps(device)
    top_bw = max(best_bw.values())
    print(f"bandwidth vs spec: {f'{100 * top_bw / spec_bw:.0f}% of {spec_bw:.0f} GB/s (goal >= 90% on H100/H200)' if spec_bw else 'no spec for this device'}")
    spec_bf16, src = peak_for(device, "bf16")
    if spec_bf16:
        goal = " (goal >= 80% on H100/H200)" if device.is_cuda else ""
        print(f"bf16 vs spec: {100 * best_c['bf16'] / spec_bf16:.0f}% of {spec_bf16:.0f} GFLOP/s{goal} [{src}]")


if __name__ == "__main__":
    main()
