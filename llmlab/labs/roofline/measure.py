"""The two roofs measured: STREAM bandwidth (and the working-set sweep), matmul FLOP/s, the spec beside them."""

from __future__ import annotations

import math
from contextlib import nullcontext
from dataclasses import dataclass

import pandas as pd
import torch

from llmlab.core.device import Device, cpu_caches, cpu_isa, last_level_cache_bytes, torch_threads
from llmlab.core.render import track
from llmlab.core.roofs import bandwidth_buffers, bandwidth_kernels, check_matmul, gemm_operands, matmul_fn, tf32
from llmlab.core.roofs import measure_bandwidth as roof_bandwidth
from llmlab.core.specs import bandwidth_spec_GBps, peak_for
from llmlab.core.stats import Summary
from llmlab.core.telemetry import Telemetry
from llmlab.core.timing import LATENCY, L2Flusher, autorange, graph_replay, measure
from llmlab.labs.roofline.config import DTYPES, Config


def overlay_dtype(cfg: Config, device: Device) -> str:
    return cfg.dtype if cfg.dtype != "auto" else ("bfloat16" if device.is_cuda else "float32")


def compute_dtypes(device: Device, extra: str) -> tuple[str, ...]:
    """Spec names measured: fp32/tf32/bf16/fp16 on a GPU, fp32/bf16 on a CPU (+ the overlay's)."""
    base = ("fp32", "tf32", "bf16", "fp16") if device.is_cuda else ("fp32", "bf16")
    return base if DTYPES[extra] in base else (*base, DTYPES[extra])


LONG_CALL_MS = 1.0  # a call this long is timed alone: launch latency (~5 us) is < 1% of it


def timing_path(device: Device, probe_ms: float) -> str:
    """How a sweep point is timed, from one probe call: "calls" (one call per sample) at LONG_CALL_MS or more;
    below it "graph" on a GPU (a CUDA graph of many calls, replayed: eager launches back to back would time the
    host's dispatch, not the cache) and "blocks" on a CPU (torch.utils.benchmark blocks of calls)."""
    if probe_ms >= LONG_CALL_MS:
        return "calls"
    return "graph" if device.is_cuda else "blocks"


def graph_calls(probe_ms: float, min_run_s: float, repeats: int) -> int:
    """Calls captured in one graph so the `repeats` replays fill about `min_run_s` (the probe overestimates a
    sub-ms call: it holds a launch), at least 8 and at most 10,000 nodes."""
    return int(min(10_000, max(8, math.ceil(min_run_s * 1e3 / repeats / max(probe_ms, 1e-4)))))


def _time(fn, device: Device, repeats: int, min_run_s: float) -> tuple[Summary, str]:
    """(per-call Summary, the timing path): see timing_path."""
    probe = measure(fn, device, mode=LATENCY, warmup=1, repeats=3)
    path = timing_path(device, probe.median)
    if path == "calls":
        return measure(fn, device, mode=LATENCY, warmup=0, repeats=repeats), path
    if path == "graph":
        calls = graph_calls(probe.median, min_run_s, repeats)
        replay = graph_replay(fn, device, calls)
        return measure(replay, device, mode=LATENCY, warmup=1, repeats=repeats).divided(calls), path
    return autorange(fn, device, min_run_time=min_run_s), path


def sweep_sizes(cfg: Config, device: Device, n_max: int) -> list[int]:
    """FP32 elements per sweep buffer: x sweep_factor from the smallest to sweep_max_llc x LLC (and n_max).

    On a GPU the sweep starts at L2 / 64 (from the device): smaller buffers time a launch, not a cache."""
    llc = last_level_cache_bytes(device)
    top = min(n_max, int(cfg.sweep_max_llc * llc) // 4)
    n = max(cfg.sweep_min_bytes, llc // 64 if device.is_cuda else 0) // 4
    sizes = []
    while n <= top:
        sizes.append(n)
        n *= cfg.sweep_factor
    return sizes if sizes and sizes[-1] == top else [*sizes, top]


def cache_level(working_set: int, device: Device) -> str:
    """Which level a working set fits in (CPU: sizes as one core sees them; a shared L3)."""
    if device.is_cuda:
        return "L2" if working_set <= last_level_cache_bytes(device) else "HBM"
    for level, key in (("L1", "L1d"), ("L2", "L2"), ("L3", "L3")):
        size = cpu_caches().get(key)
        if size and working_set <= size:
            return level
    return "DRAM"


# ---------------------------------------------------------------- 1. bandwidth


def thread_counts(device: Device) -> tuple[int, ...]:
    """CPU: all threads, and one. On a busy machine one thread can win by 10x: an OpenMP region waits
    for its slowest thread, and a descheduled thread costs a scheduler quantum at every barrier."""
    if device.is_cuda:
        return (torch.get_num_threads(),)
    return tuple(dict.fromkeys((torch.get_num_threads(), 1)))


def pick_fastest(cands: dict, device: Device):
    """The key of the fastest of `cands` (key -> (fn, torch threads)) by a short probe: a warm-up call and a
    timed call each, in order; a candidate whose warm-up call is 4x slower than the best so far is dropped."""
    if len(cands) == 1:
        return next(iter(cands))
    probe: dict = {}
    for key, (fn, threads) in cands.items():
        with torch_threads(threads):
            warm = measure(fn, device, mode=LATENCY, warmup=0, repeats=1).min
            if probe and warm > 4 * min(probe.values()):
                continue
            probe[key] = min(warm, measure(fn, device, mode=LATENCY, warmup=0, repeats=1).min)
    return min(probe, key=probe.get)


def pick_threads(fn, device: Device) -> int:
    """The faster thread count for `fn` (one thread is probed first)."""
    return pick_fastest({t: (fn, t) for t in sorted(thread_counts(device))}, device)


def measure_bandwidth(cfg: Config, device: Device, bufs=None, progress=None) -> pd.DataFrame:
    """Every kernel at every thread count, timed in blocks of calls (core.roofs)."""
    bufs = bufs if bufs is not None else bandwidth_buffers(device, cfg.llc_multiple)
    rows = []
    jobs = [(t, k) for t in thread_counts(device) for k in cfg.kernels]
    for threads, name in track(progress, jobs, "bandwidth"):
        bw = roof_bandwidth(device, name, bufs=bufs, blocks=cfg.bandwidth_repeats, min_block_s=cfg.bandwidth_block_s,
                            threads=threads)
        rows.append(dict(kernel=name, threads=threads, buffer_bytes=bw.buffer_bytes, bytes_moved=bw.bytes_per_call,
                         median_GBps=bw.median_GBps, best_GBps=bw.best_GBps, p10_GBps=bw.p10_GBps, p90_GBps=bw.p90_GBps,
                         median_ms=bw.median_ms, calls_per_block=bw.calls_per_block, n=bw.blocks))
    return pd.DataFrame(rows)


def measure_sweep(cfg: Config, device: Device, bufs, threads: int, progress=None) -> pd.DataFrame:
    """read / copy / triad on views of growing size, at `threads`: each cache level is a plateau."""
    a, b, c = bufs.a, bufs.b, bufs.c
    sizes = sweep_sizes(cfg, device, a.numel())
    rows = []
    jobs = [(n, k) for n in sizes for k in cfg.sweep_kernels]
    for n, name in track(progress, jobs, "bandwidth sweep"):
        fn, nbytes = bandwidth_kernels(a[:n], b[:n], c[:n])[name]
        with torch_threads(threads):
            s, path = _time(fn, device, cfg.bandwidth_repeats, cfg.sweep_min_run_s)
        ws = nbytes  # the working set is what the kernel touches
        rows.append(dict(kernel=name, threads=threads, buffer_bytes=n * 4, working_set_bytes=ws,
                         level=cache_level(ws, device),
                         median_GBps=nbytes / (s.median / 1e3) / 1e9, best_GBps=nbytes / (s.min / 1e3) / 1e9,
                         median_us=s.median * 1e3, n=s.n, timing=path))
    return pd.DataFrame(rows)


# ---------------------------------------------------------------- 2. compute


def matmul_backends(device: Device, dtype: str) -> list[tuple[str, int]]:
    """(backend, threads): torch at each thread count; numpy (its own BLAS, OpenBLAS in the wheels, at its
    default threads) too for CPU FP32, where it beats MKL's AMD code path by ~1.3x."""
    rows = [("torch", t) for t in thread_counts(device)]
    return rows + ([("numpy", 0)] if (not device.is_cuda and dtype == "fp32") else [])


def device_generator(device: Device, seed: int) -> torch.Generator:
    return torch.Generator(device=device.torch).manual_seed(seed)


def measure_compute(cfg: Config, device: Device, dtypes: tuple[str, ...], progress=None) -> pd.DataFrame:
    shapes = cfg.gpu_shapes if device.is_cuda else cfg.cpu_shapes
    flush = L2Flusher(device)
    gen = device_generator(device, cfg.seed)
    rows = []
    for dtype in track(progress, dtypes, "compute"):
        with Telemetry(device) as tel, (tf32(dtype == "tf32") if device.is_cuda else nullcontext()):
            part = []
            for backend, threads in matmul_backends(device, dtype):
                check_matmul(backend, dtype, device)
                for m, n, k in shapes:
                    a, b, out = gemm_operands(m, n, k, dtype, device, gen)
                    with torch_threads(threads or torch.get_num_threads()):
                        s = measure(matmul_fn(backend, a, b, out), device, mode=LATENCY, warmup=1,
                                    repeats=cfg.compute_repeats, setup=flush)
                    flops = 2 * m * n * k
                    part.append(dict(dtype=dtype, backend=backend, threads=threads or "blas default", m=m, n=n, k=k,
                                     flops=flops,
                                     median_gflops=flops / (s.median / 1e3) / 1e9,
                                     best_gflops=flops / (s.min / 1e3) / 1e9,
                                     median_ms=s.median, n_samples=s.n))
                    del a, b, out
        t = tel.summary()
        for r in part:
            if t.get("source") == "nvml":
                r.update(sm_clock_mhz=(t["sm_clock_mhz"] or {}).get("median"),
                         power_w=(t["power_w"] or {}).get("median"),
                         temp_c=(t["temp_c"] or {}).get("max"),  # None: a field NVML does not report (MIG, no sensor)
                         throttle="unknown" if t["throttle_reasons"] is None
                         else ",".join(t["throttle_reasons"]) or "none")
            else:
                r.update(cpu_utilisation_cores=t.get("cpu_utilisation_cores"), loadavg_1m=t.get("loadavg_1m"))
        rows += part
    return pd.DataFrame(rows)


# ---------------------------------------------------------------- 3. roofs and spec


@dataclass(frozen=True)
class Roofs:
    bandwidth_GBps: float  # highest median over kernels and thread counts
    bandwidth_kernel: str
    bandwidth_threads: int
    peak_gflops: dict[str, float]  # dtype -> highest median over shapes and backends
    best_backend: dict[str, str]

    def ridge(self, dtype: str) -> float:
        """FLOP per byte where the two roofs meet."""
        return self.peak_gflops[dtype] / self.bandwidth_GBps

    def attainable(self, dtype: str, intensity: float) -> float:
        return min(self.peak_gflops[dtype], intensity * self.bandwidth_GBps)


def roofs_from(bw: pd.DataFrame, comp: pd.DataFrame) -> Roofs:
    top = bw.loc[bw["median_GBps"].idxmax()]
    best = comp.loc[comp.groupby("dtype")["median_gflops"].idxmax()]
    return Roofs(float(top["median_GBps"]), f"{top['kernel']} ({int(top['threads'])} threads)", int(top["threads"]),
                 {r.dtype: float(r.median_gflops) for r in best.itertuples()},
                 {r.dtype: r.backend for r in best.itertuples()})


def want_pct(device: Device, dtype: str) -> float | None:
    """The share of the spec peak a good matmul should reach: 80% on a GPU (mamf-finder sees 70-93%),
    70% on a CPU; None for BF16 on a CPU without a BF16 unit (the spec is then only an upper bound)."""
    if device.is_cuda:
        return 80.0
    if dtype in ("bf16", "fp16") and not (cpu_isa()["amx_bf16"] or cpu_isa()["avx512_bf16"]):
        return None
    return 70.0


def roofs_table(roofs: Roofs, bw: pd.DataFrame, comp: pd.DataFrame, device: Device) -> pd.DataFrame:
    spec_bw, bw_src = bandwidth_spec_GBps(device)
    rows = [dict(roof="bandwidth", dtype="-", how=roofs.bandwidth_kernel, measured_median=roofs.bandwidth_GBps,
                 measured_best=float(bw["best_GBps"].max()), unit="GB/s", spec=spec_bw,
                 pct_of_spec=100 * roofs.bandwidth_GBps / spec_bw if spec_bw else None, want_pct=90.0,
                 spec_source=bw_src)]
    for dtype, peak in roofs.peak_gflops.items():
        spec, src = peak_for(device, dtype)
        sub = comp[comp["dtype"] == dtype]
        rows.append(dict(roof="compute", dtype=dtype, how=roofs.best_backend[dtype], measured_median=peak,
                         measured_best=float(sub["best_gflops"].max()), unit="GFLOP/s", spec=spec,
                         pct_of_spec=100 * peak / spec if spec else None, want_pct=want_pct(device, dtype),
                         spec_source=src,
                         loadavg_1m=sub["loadavg_1m"].max() if "loadavg_1m" in sub else None))
    for dtype in roofs.peak_gflops:
        spec, _ = peak_for(device, dtype)
        rows.append(dict(roof="ridge", dtype=dtype, how="peak / bandwidth", measured_median=roofs.ridge(dtype),
                         measured_best=None, unit="FLOP/byte", spec=spec / spec_bw if spec and spec_bw else None,
                         pct_of_spec=None, want_pct=None,
                         spec_source="spec peak / spec bandwidth" if spec and spec_bw else "no bandwidth spec"))
    return pd.DataFrame(rows)


