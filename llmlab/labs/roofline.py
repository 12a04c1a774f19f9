"""Lab: the two speed limits, measured — memory bandwidth and compute, and where LLM work sits.

The article's argument, each step turned into a measurement:
1. Peak memory bandwidth: read, write, copy and triad over buffers >= 8x the last-level cache,
   repeated (median and best), and a size sweep that shows the cache plateaus above DRAM/HBM.
2. Peak compute: matmul FLOP/s over a small set of aligned shapes (FP32 and BF16 on a CPU;
   FP32, TF32, BF16, FP16 on a GPU), cache flushed between repeats, best and median, with the
   clocks and power NVML saw per dtype.
3. "% of spec" for both roofs where the spec is known (a CPU's bandwidth spec is not).
4. The ridge point (peak FLOP/s / bandwidth) and an intensity sweep: GEMMs of M = batch rows
   against a K x N weight; achieved FLOP/s against arithmetic intensity traces the roofline.
5. The LLM overlay: the per-layer matmuls of prefill (S tokens) and decode (batch B) of --model,
   with their intensity, on the measured roofline; and the real model's decode step timed at
   batch 1..N: achieved bandwidth and achieved fraction of peak compute.

How bytes are counted: every byte a kernel must read or write, once (STREAM's convention):
read = N, write = N, copy = 2N, triad a = b + s*c = 3N. A CPU's write-allocate traffic (reading
a line before overwriting it) is real but not counted, so write and copy look slower than read.
A GEMM moves A + B + C once each: intensity = 2MKN / (bytes of A + B + C).

Threads on a CPU: every kernel is measured with all torch threads and with one (or the faster
is picked by a short probe) and the `threads` column says which won. On a shared machine an
OpenMP region waits for its slowest thread, so one thread can beat two by 10x; on an idle one,
all threads win the compute-bound rows. The roofs are the best of what was measured.

References:
- Williams, Waterman, Patterson, "Roofline: an insightful visual performance model for
  multicore architectures", CACM 2009.
- McCalpin, STREAM benchmark (copy, scale, add, triad; bytes counted once).
- Empirical Roofline Toolkit (ERT), LBNL: working-set sweep showing each cache level.
- Stas Bekman, mamf-finder (ml-engineering): search aligned shapes, flush L2, report best/median.
- "Making Deep Learning Go Brrrr From First Principles" (Horace He): overhead, bandwidth, compute.
"""

from __future__ import annotations

import math
from contextlib import nullcontext
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd
import torch

from llmlab.core.device import Device, cpu_caches, cpu_isa, cpu_load, last_level_cache_bytes, torch_threads
from llmlab.core.errors import UsageError
from llmlab.core.render import track
from llmlab.core.results import Chart, Claim, Col, LabResult, View, empty_table
from llmlab.core.roofs import (
    CPU_SHAPES,
    GPU_SHAPES,
    KERNELS,
    bandwidth_buffers,
    bandwidth_kernels,
    check_matmul,
    gemm_operands,
    gpu_speed_model,
    matmul_fn,
    tf32,
    torch_dtype,
    warm_up,
)
from llmlab.core.roofs import (
    measure_bandwidth as roof_bandwidth,
)
from llmlab.core.specs import bandwidth_spec_GBps, peak_for
from llmlab.core.telemetry import Telemetry
from llmlab.core.timing import LATENCY, L2Flusher, Stats, Stopwatch, autorange, graph_replay, measure

LAB = "roofline"
VERSION = 2  # 2: bandwidth timed in blocks of calls after a 0.3 s warm-up (core.roofs)
JUDGE_VERSION = 1
DTYPES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}  # torch name -> spec name
NO_GPU = "not measured: no GPU"
_tf32 = tf32  # the old private name (tests/test_gpu_readiness.py); core.roofs.tf32 wraps core.device.tf32



@dataclass(frozen=True)
class Config:
    llc_multiple: int = 8  # bandwidth buffers are 8x the last-level cache: < 1/8 of any access can hit
    bandwidth_repeats: int = 10  # timed blocks of calls per kernel: median and best of 10
    bandwidth_block_s: float = 0.02  # each block lasts >= 20 ms: launch gaps are inside the throughput, not at a sample's edge
    warmup_s: float = 0.3  # matmuls for 0.3 s before the roofs: clocks boosted (issue 12 item 15)
    kernels: tuple[str, ...] = KERNELS  # read, write, copy, triad: write and copy show the cost of write-allocate
    sweep_kernels: tuple[str, ...] = ("read", "copy", "triad")  # the working-set sweep's kernels
    sweep_max_llc: float = 8.0  # the sweep's largest buffer, in LLCs: 8 = the roof's own buffer (DRAM for sure)
    sweep_min_bytes: int = 16 * 1024  # smallest sweep buffer: half an L1d, where per-call overhead shows
    sweep_factor: int = 2  # each sweep buffer is 2x the last: 2-3 points per cache level
    sweep_min_run_s: float = 0.1  # autorange time per small sweep point (sub-ms calls, many per block)
    cpu_shapes: tuple[tuple[int, int, int], ...] = CPU_SHAPES  # (M, N, K): 2-34 GFLOP, 0.05-1 s per call on 2 cores
    gpu_shapes: tuple[tuple[int, int, int], ...] = GPU_SHAPES  # mamf-finder style: large, 256-aligned
    compute_repeats: int = 5  # timed matmuls per shape and dtype (+1 warm-up), cache flushed before each
    intensity_batches: tuple[int, ...] = tuple(2**i for i in range(13))  # M = 1..4096: far below to far above the ridge
    intensity_kn: int = 2048  # CPU: K = N of the weight, 16 MB in FP32 (flushed from cache before each call); M=4096 is 34 GFLOP
    intensity_kn_gpu: int = 8192  # GPU: 128 MB in BF16, 2x+ any L2; M=4096 is 550 GFLOP, well into the compute roof
    intensity_repeats: int = 5  # timed GEMMs per M
    model: str = "tiny"  # the overlay model: any load_config reference
    cuda_model: str = "auto"  # GPU: auto = a registry arch: of >= 32x the L2 when --model fits in it (tiny does); "same" keeps --model
    dtype: str = "auto"  # overlay and sweep compute dtype: auto = float32 on a CPU, bfloat16 on a GPU
    prefill_tokens: int = 512  # S of the prefill overlay (analytic)
    decode_context: int = 128  # prompt tokens in the KV cache when the decode step is timed
    decode_batches: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128)  # decode batch sweep: past the ridge on a CPU
    decode_steps: int = 12  # timed decode steps per batch (after the thread probe and 1 warm-up)
    decode_max_gib: float = 2.0  # CPU: weights above this are not timed (random init of big arch: takes minutes)
    seed: int = 0  # the CLI sets it from --seed

    def __post_init__(self):
        if self.llc_multiple < 1:
            raise ValueError("llc_multiple must be at least 1")
        for name in ("bandwidth_repeats", "compute_repeats", "intensity_repeats", "decode_steps"):
            if getattr(self, name) < 3:
                raise ValueError(f"{name} must be at least 3 (a median needs samples)")
        for name in ("kernels", "sweep_kernels"):
            bad = [k for k in getattr(self, name) if k not in KERNELS]
            if bad or not getattr(self, name):
                raise ValueError(f"{name}: choose from {', '.join(KERNELS)}")
        if self.sweep_max_llc <= 0:
            raise ValueError("sweep_max_llc must be > 0")
        if self.sweep_factor < 2:
            raise ValueError("sweep_factor must be at least 2")
        for name in ("intensity_batches", "decode_batches"):
            vals = getattr(self, name)
            if not vals or any(int(v) < 1 for v in vals):
                raise ValueError(f"{name} must be positive integers")
        if self.dtype not in ("auto", *DTYPES):
            raise ValueError(f"--dtype {self.dtype}: use auto, {', '.join(DTYPES)}")
        if self.prefill_tokens < 1 or self.decode_context < 1 or min(self.intensity_kn, self.intensity_kn_gpu) < 16:
            raise ValueError("prefill_tokens and decode_context must be >= 1 and intensity_kn >= 16")

    @classmethod
    def quick(cls) -> Config:
        return cls(
            bandwidth_repeats=3, kernels=("read", "copy", "triad"), sweep_kernels=("triad",), sweep_max_llc=1.0, sweep_factor=8, sweep_min_run_s=0.03,
            cpu_shapes=((2048, 1024, 1024), (1024, 2048, 1024)), gpu_shapes=GPU_SHAPES[:2], compute_repeats=3,
            intensity_batches=(1, 4, 16, 64, 256), intensity_kn_gpu=4096, intensity_repeats=3,
            decode_context=32, decode_batches=(1, 4, 16, 64), decode_steps=6,
        )


# ---------------------------------------------------------------- helpers


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


def _time(fn, device: Device, repeats: int, min_run_s: float) -> tuple[Stats, str]:
    """(per-call Stats, the timing path): see timing_path."""
    probe = measure(fn, device, mode=LATENCY, warmup=1, repeats=3)
    path = timing_path(device, probe.median_ms)
    if path == "calls":
        return measure(fn, device, mode=LATENCY, warmup=0, repeats=repeats), path
    if path == "graph":
        calls = graph_calls(probe.median_ms, min_run_s, repeats)
        replay = graph_replay(fn, device, calls)
        return measure(replay, device, mode=LATENCY, warmup=1, repeats=repeats).per_call(calls), path
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
            warm = measure(fn, device, mode=LATENCY, warmup=0, repeats=1).min_ms
            if probe and warm > 4 * min(probe.values()):
                continue
            probe[key] = min(warm, measure(fn, device, mode=LATENCY, warmup=0, repeats=1).min_ms)
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
        bw = roof_bandwidth(device, name, bufs=bufs, blocks=cfg.bandwidth_repeats, min_block_s=cfg.bandwidth_block_s, threads=threads)
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
        rows.append(dict(kernel=name, threads=threads, buffer_bytes=n * 4, working_set_bytes=ws, level=cache_level(ws, device),
                         median_GBps=nbytes / s.median_s / 1e9, best_GBps=nbytes / (s.min_ms / 1e3) / 1e9,
                         median_us=s.median_ms * 1e3, n=s.n, timing=path))
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
                        s = measure(matmul_fn(backend, a, b, out), device, mode=LATENCY, warmup=1, repeats=cfg.compute_repeats, setup=flush)
                    flops = 2 * m * n * k
                    part.append(dict(dtype=dtype, backend=backend, threads=threads or "blas default", m=m, n=n, k=k, flops=flops,
                                     median_gflops=flops / s.median_s / 1e9, best_gflops=flops / (s.min_ms / 1e3) / 1e9,
                                     median_ms=s.median_ms, n_samples=s.n))
                    del a, b, out
        t = tel.summary()
        for r in part:
            if t.get("source") == "nvml":
                r.update(sm_clock_mhz=(t["sm_clock_mhz"] or {}).get("median"), power_w=(t["power_w"] or {}).get("median"),
                         temp_c=(t["temp_c"] or {}).get("max"),  # None: a field NVML does not report here (MIG, no sensor)
                         throttle="unknown" if t["throttle_reasons"] is None else ",".join(t["throttle_reasons"]) or "none")
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
                 pct_of_spec=100 * roofs.bandwidth_GBps / spec_bw if spec_bw else None, want_pct=90.0, spec_source=bw_src)]
    for dtype, peak in roofs.peak_gflops.items():
        spec, src = peak_for(device, dtype)
        sub = comp[comp["dtype"] == dtype]
        rows.append(dict(roof="compute", dtype=dtype, how=roofs.best_backend[dtype], measured_median=peak,
                         measured_best=float(sub["best_gflops"].max()), unit="GFLOP/s", spec=spec,
                         pct_of_spec=100 * peak / spec if spec else None, want_pct=want_pct(device, dtype), spec_source=src,
                         loadavg_1m=sub["loadavg_1m"].max() if "loadavg_1m" in sub else None))
    for dtype in roofs.peak_gflops:
        spec, _ = peak_for(device, dtype)
        rows.append(dict(roof="ridge", dtype=dtype, how="peak / bandwidth", measured_median=roofs.ridge(dtype),
                         measured_best=None, unit="FLOP/byte", spec=spec / spec_bw if spec and spec_bw else None,
                         pct_of_spec=None, want_pct=None, spec_source="spec peak / spec bandwidth" if spec and spec_bw else "no bandwidth spec"))
    return pd.DataFrame(rows)


# ---------------------------------------------------------------- 4. intensity sweep


def gemm_intensity(m: int, k: int, n: int, elem: int) -> tuple[int, int, float]:
    """(FLOPs, bytes, FLOP/byte) of (M,K) @ (K,N): A, B and C each moved once."""
    flops = 2 * m * k * n
    nbytes = elem * (m * k + k * n + m * n)
    return flops, nbytes, flops / nbytes


def measure_intensity(cfg: Config, device: Device, dtype: str, roofs: Roofs, progress=None) -> pd.DataFrame:
    flush = L2Flusher(device)
    gen = device_generator(device, cfg.seed + 1)
    k = n = cfg.intensity_kn_gpu if device.is_cuda else cfg.intensity_kn
    elem = torch_dtype(dtype).itemsize
    rows = []
    with tf32(dtype == "tf32") if device.is_cuda else nullcontext():
        _, w, _ = gemm_operands(1, k, n, dtype, device, gen)  # (N, K) weight, nn.Linear's layout, shared by every M
        for m in track(progress, cfg.intensity_batches, "intensity sweep"):
            x, _, out = gemm_operands(m, n, k, dtype, device, gen)  # (M, K) activations, (M, N) out
            cands = {(b, t): (matmul_fn(b, x, w.t(), out), t or torch.get_num_threads())  # x @ W^T, as F.linear does
                     for b, t in matmul_backends(device, dtype)}
            backend, threads = pick_fastest(cands, device)  # per M: small M wants other kernels than large M
            with torch_threads(cands[(backend, threads)][1]):
                s = measure(cands[(backend, threads)][0], device, mode=LATENCY, warmup=0 if not device.is_cuda else 1,
                            repeats=cfg.intensity_repeats, setup=flush)
            flops, nbytes, ai = gemm_intensity(m, k, n, elem)
            roof = roofs.attainable(dtype, ai)
            rows.append(dict(m=m, k=k, n=n, dtype=dtype, backend=backend, threads=threads or "blas default", flops=flops, bytes=nbytes, intensity=ai,
                             median_gflops=flops / s.median_s / 1e9, best_gflops=flops / (s.min_ms / 1e3) / 1e9,
                             roof_gflops=roof, fraction_of_roof=flops / s.median_s / 1e9 / roof,
                             bound="memory" if ai < roofs.ridge(dtype) else "compute", median_ms=s.median_ms))
    return pd.DataFrame(rows)


# ---------------------------------------------------------------- 5. the LLM overlay


def layer_matmuls(config) -> list[tuple[str, int, int, int]]:
    """(name, K, N, count per model) of every weight matmul of a Llama-family decoder."""
    from llmlab.core.models import shape

    s = shape(config)
    h, hd, q, kv, i, L = s["hidden"], s["head_dim"], s["heads"], s["kv_heads"], s["intermediate"], s["layers"]
    return [("q_proj", h, q * hd, L), ("k_proj", h, kv * hd, L), ("v_proj", h, kv * hd, L), ("o_proj", q * hd, h, L),
            ("gate_proj", h, i, L), ("up_proj", h, i, L), ("down_proj", i, h, L), ("lm_head", h, s["vocab"], 1)]


def attention_cost(config, tokens: int, context: int, elem: int, prefill: bool) -> tuple[int, int]:
    """(FLOPs, bytes) of QK^T and PV over all layers: Q, K, V, O each moved once (flash-attention style)."""
    from llmlab.core.models import shape

    s = shape(config)
    q, kv, hd, L = s["heads"], s["kv_heads"], s["head_dim"], s["layers"]
    pairs = tokens * (tokens + 1) // 2 if prefill else tokens * context  # causal prefill; decode sees the context
    flops = 4 * q * hd * pairs * L  # 2 FLOPs x (QK^T + PV)
    kv_tokens = tokens if prefill else tokens * context
    nbytes = elem * L * (2 * tokens * q * hd + 2 * kv_tokens * kv * hd)
    return flops, nbytes


def overlay_table(config, roofs: Roofs, dtype: str, prefill_tokens: int, batches, context: int) -> pd.DataFrame:
    """Analytic: each matmul of prefill (M = S, lm_head on the last position only) and decode (M = B)."""
    elem = torch_dtype(dtype).itemsize
    phases = [("prefill", prefill_tokens)] + [("decode", b) for b in batches]
    rows = []
    for phase, m in phases:
        for name, k, n, count in layer_matmuls(config):
            mm = 1 if (phase == "prefill" and name == "lm_head") else m  # logits_to_keep=1
            flops, nbytes, ai = gemm_intensity(mm, k, n, elem)
            rows.append(_overlay_row(phase, m, name, mm, k, n, count, flops, nbytes, roofs, dtype))
        flops, nbytes = attention_cost(config, m, context, elem, prefill=phase == "prefill")
        rows.append(_overlay_row(phase, m, "attention", m, None, None, 1, flops, nbytes, roofs, dtype))
    return pd.DataFrame(rows)


def _overlay_row(phase, tokens, op, m, k, n, count, flops, nbytes, roofs: Roofs, dtype) -> dict:
    ai = flops / nbytes
    roof = roofs.attainable(dtype, ai)
    total_flops = flops * count
    return dict(phase=phase, tokens=tokens, op=op, m=m, k=k, n=n, count=count, flops=total_flops,
                bytes=nbytes * count, intensity=ai, attainable_gflops=roof,
                bound="memory" if ai < roofs.ridge(dtype) else "compute", roof_us=total_flops / roof / 1e3)


def step_cost(config, batch: int, context: float, elem: int) -> dict:
    """One decode step at batch B: weights read once, KV read per sequence, 2 x matmul params x B FLOPs."""
    from llmlab.core.models import kv_bytes_per_token

    mm_params = sum(k * n * c for _, k, n, c in layer_matmuls(config))
    weight_bytes = elem * mm_params
    kv_bytes = batch * context * kv_bytes_per_token(config, elem)
    attn_flops, _ = attention_cost(config, batch, int(round(context)), elem, prefill=False)
    return dict(matmul_params=mm_params, weight_bytes=weight_bytes, kv_bytes=int(kv_bytes),
                bytes=int(weight_bytes + kv_bytes), flops=2 * mm_params * batch + attn_flops)


def predicted_knee(config, roofs: Roofs, dtype: str, context: float) -> float:
    """Batch where decode intensity reaches the ridge: B = R*W / (f1 - R*b1), inf if it never does."""
    elem = torch_dtype(dtype).itemsize
    one, two = step_cost(config, 1, context, elem), step_cost(config, 2, context, elem)
    f1, b1 = two["flops"] - one["flops"], two["bytes"] - one["bytes"]  # per extra sequence
    w = one["bytes"] - b1
    r = roofs.ridge(dtype)
    return r * w / (f1 - r * b1) if f1 > r * b1 else math.inf


def decode_budget_bytes(cfg: Config, device: Device) -> int:
    return int(0.5 * device.free_memory_bytes()) if device.is_cuda else int(cfg.decode_max_gib * 2**30)


def measure_decode(cfg: Config, device: Device, lm, dtype: str, roofs: Roofs, res: LabResult, progress=None) -> pd.DataFrame:
    from llmlab.core.device import is_oom

    model, config = lm.model, lm.config
    elem = torch_dtype(DTYPES[dtype]).itemsize
    peak = roofs.peak_gflops[DTYPES[dtype]]
    gen = torch.Generator().manual_seed(cfg.seed + 2)
    rows, threads = [], None  # the thread count is probed at the first batch and kept (a busy CPU makes probes costly)
    for batch in track(progress, cfg.decode_batches, "decode steps"):
        try:
            s, threads = time_decode_step(model, batch, cfg.decode_context, cfg.decode_steps, device, gen, threads)
        except RuntimeError as exc:
            if is_oom(exc):
                res.note(f"decode sweep stopped at batch {batch}: out of memory")
                break
            raise
        context = cfg.decode_context + 2 + cfg.decode_steps / 2  # mean cache length over the timed steps
        c = step_cost(config, batch, context, elem)
        gflops = c["flops"] / s.median_s / 1e9
        roof_ms = max(c["bytes"] / roofs.bandwidth_GBps / 1e6, c["flops"] / peak / 1e6)
        rows.append(dict(batch=batch, threads=threads, context=context, median_ms=s.median_ms, p10_ms=s.p10_ms, p90_ms=s.p90_ms,
                         weight_bytes=c["weight_bytes"], kv_bytes=c["kv_bytes"], bytes=c["bytes"], flops=c["flops"],
                         intensity=c["flops"] / c["bytes"], achieved_GBps=c["bytes"] / s.median_s / 1e9,
                         pct_of_bandwidth=100 * c["bytes"] / s.median_s / 1e9 / roofs.bandwidth_GBps,
                         achieved_gflops=gflops, pct_of_peak_compute=100 * gflops / peak,
                         roof_ms=roof_ms, measured_over_roof=s.median_ms / roof_ms, tokens_per_s=batch / s.median_s))
    return pd.DataFrame(rows)


def time_decode_step(model, batch: int, context: int, steps: int, device: Device, gen: torch.Generator,
                     threads: int | None = None) -> tuple[Stats, int]:
    """Prefill `context` random tokens per sequence, then time `steps` decode steps (the cache grows by one each)
    at `threads` (None: probe for the faster count)."""
    from llmlab.inference.decode import decode_one_token, new_cache, prefill

    vocab = model.config.vocab_size
    cache = new_cache(model)
    ids = torch.randint(0, vocab, (batch, context), generator=gen).to(device.torch)  # (B, S)
    with torch_threads(min(thread_counts(device))):  # not timed: the cheap way (one thread wins on a busy CPU)
        prefill(model, ids, cache)  # fills the KV cache
    tok = torch.randint(0, vocab, (batch, 1), generator=gen).to(device.torch)  # (B, 1)
    step = lambda: decode_one_token(model, tok, cache)  # noqa: E731
    threads = threads or pick_threads(step, device)
    with torch_threads(threads):
        return measure(step, device, mode=LATENCY, warmup=1, repeats=steps), threads


def measured_knee(dec: pd.DataFrame) -> tuple[float, bool]:
    """Where the flat batch-1 time meets the ray through the largest batch's time: t1 * Bmax / t(Bmax).

    Reached only when the largest batch took at least twice the batch-1 time (compute shows)."""
    t1 = float(dec.iloc[0]["median_ms"])
    last = dec.iloc[-1]
    return t1 * float(last["batch"]) / float(last["median_ms"]), float(last["median_ms"]) >= 2 * t1


# ---------------------------------------------------------------- the chart


def chart_table(roofs: Roofs, dtype: str, device: Device, sweep: pd.DataFrame, overlay: pd.DataFrame,
                dec: pd.DataFrame | None) -> pd.DataFrame:
    pts = [sweep["intensity"], overlay["intensity"]] + ([dec["intensity"]] if dec is not None and len(dec) else [])
    lo = min(float(p.min()) for p in pts) / 16  # room on the left: the legend covers the top-left corner
    hi = max(max(float(p.max()) for p in pts), roofs.ridge(dtype)) * 2
    grid = np.geomspace(lo, hi, 60)
    rows = [dict(series=f"measured roof ({dtype})", intensity=x, gflops=roofs.attainable(dtype, x)) for x in grid]
    spec, _ = peak_for(device, dtype)
    spec_bw, _ = bandwidth_spec_GBps(device)
    if spec:  # sparse points: a dashed line
        label = "spec roof" if spec_bw else "spec peak"
        rows += [dict(series=label, intensity=x, gflops=min(spec, x * spec_bw) if spec_bw else spec) for x in grid[::4]]
    rows += [dict(series="GEMM sweep", intensity=r.intensity, gflops=r.median_gflops) for r in sweep.itertuples()]
    decode = overlay[overlay["phase"] == "decode"]
    ops = pd.concat([overlay[overlay["phase"] == "prefill"], decode[decode["tokens"] == decode["tokens"].min()]])
    rows += [dict(series="LLM matmuls (on roof)", intensity=r.intensity, gflops=r.attainable_gflops)
             for r in ops.itertuples()]
    if dec is not None:
        rows += [dict(series="decode steps", intensity=r.intensity, gflops=r.achieved_gflops) for r in dec.itertuples()]
    return pd.DataFrame(rows)


# ---------------------------------------------------------------- the lab


def run(cfg: Config, device: Device, progress=None) -> LabResult:
    """Measures. Fills tables, env, notes, skipped. Never prints, never judges."""
    from llmlab.core.models import estimate_bytes, load, load_config

    dtype_name = overlay_dtype(cfg, device)
    ref, why = gpu_speed_model(cfg.model, cfg.cuda_model, device, dtype_name)
    cfg = replace(cfg, model=ref)  # the model that runs is the one the result records
    res = LabResult.new(LAB, VERSION, cfg)
    if why:
        res.note(f"the overlay and the decode step use {why}")
    dtype = DTYPES[dtype_name]
    if not device.is_cuda and dtype == "fp16":
        raise UsageError("--dtype float16 on a CPU: no FP16 matmul unit to measure; use float32 or bfloat16")
    config = load_config(cfg.model)  # a bad --model fails here, before any measuring
    res.env["overlay"] = dict(model=cfg.model, dtype=dtype_name, timing_only=cfg.model.startswith("arch:"))
    sw = Stopwatch(device)
    res.env["phases_ms"] = sw.phases_ms  # wall time per part (ms), filled as the parts run
    if not device.is_cuda:
        res.skipped["gpu_roofs"] = "TF32, FP16 and HBM roofs: no GPU"
    with res.guard():
        with sw.phase("bandwidth"):
            res.env["warm_up_s"] = warm_up(device, cfg.warmup_s)  # clocks boosted before the roofs
            bufs = bandwidth_buffers(device, cfg.llc_multiple)
            if bufs.note:
                res.note(bufs.note)
            bw = res.add_table("bandwidth", measure_bandwidth(cfg, device, bufs, progress))
        with sw.phase("compute"):
            comp = res.add_table("compute", measure_compute(cfg, device, compute_dtypes(device, dtype_name), progress))
        roofs = roofs_from(bw, comp)
        res.add_table("roofs", roofs_table(roofs, bw, comp, device))
        with sw.phase("intensity_sweep"):
            sweep = res.add_table("intensity_sweep", measure_intensity(cfg, device, dtype, roofs, progress))
        overlay = res.add_table("overlay", overlay_table(config, roofs, dtype, cfg.prefill_tokens, cfg.decode_batches, cfg.decode_context))
        need = estimate_bytes(config, dtype_name)
        timed = need <= decode_budget_bytes(cfg, device)
        res.add_table("decode_model", [decode_model_row(cfg, config, roofs, dtype, need, timed, device)])
        dec = None
        if timed:
            with sw.phase("decode"):
                lm = load(cfg.model, device, dtype_name)
                dec = res.add_table("decode", measure_decode(cfg, device, lm, dtype_name, roofs, res, progress))
                del lm
        else:
            res.skipped["decode"] = (f"{cfg.model} needs {need / 2**30:.1f} GiB of weights in {dtype_name} "
                                     f"(budget {decode_budget_bytes(cfg, device) / 2**30:.1f} GiB): the overlay is analytic only")
        with sw.phase("bandwidth_sweep"):  # last: the roofs and the sweeps compared with them run back to back
            res.add_table("bandwidth_sweep", measure_sweep(cfg, device, bufs, roofs.bandwidth_threads, progress))
            del bufs
        res.add_table("roofline_chart", chart_table(roofs, dtype, device, sweep, overlay, dec))
        _notes(res, cfg, device, roofs, dtype_name, dec)
    return res


def decode_model_row(cfg: Config, config, roofs: Roofs, dtype: str, need: int, timed: bool, device: Device) -> dict:
    """The roofline's prediction for the model's decode step, from its config (what judge compares with)."""
    elem = torch_dtype(dtype).itemsize
    ctx = cfg.decode_context + 2 + cfg.decode_steps / 2  # the mean cache length over the timed steps
    c1 = step_cost(config, 1, ctx, elem)
    return dict(model=cfg.model, dtype=dtype, weight_bytes=c1["weight_bytes"], fits_llc=c1["weight_bytes"] <= last_level_cache_bytes(device),
                timed=timed, context=ctx, b1_intensity=c1["flops"] / c1["bytes"], ridge=roofs.ridge(dtype),
                predicted_knee=predicted_knee(config, roofs, dtype, ctx), largest_batch=max(cfg.decode_batches))


def _notes(res: LabResult, cfg: Config, device: Device, roofs: Roofs, dtype_name: str, dec) -> None:
    if not device.is_cuda:
        load, cores = cpu_load()
        if load is not None and load > cores:
            res.note(f"busy CPU (load {load:.1f} on {cores} CPUs): roofs are what this process got")
    if dec is not None and len(dec):
        w = float(dec.iloc[0]["weight_bytes"])
        if w <= last_level_cache_bytes(device):
            res.note(f"{cfg.model}'s {w / 2**20:.0f} MiB of weights fit in cache: for DRAM-bound decode "
                     "use --model arch:qwen2.5-0.5b")
    if cfg.model.startswith("arch:"):
        res.note(f"{cfg.model} has random weights: timings only")


# ---------------------------------------------------------------- judge


def _row(df: pd.DataFrame, **eq) -> pd.Series | None:
    sub = df
    for k, v in eq.items():
        sub = sub[sub[k] == v]
    return sub.iloc[0] if len(sub) else None


def _num(x) -> float | None:
    return None if x is None or (isinstance(x, float) and math.isnan(x)) or pd.isna(x) else float(x)


def judge(result: LabResult) -> list[Claim]:
    """Pure: every verdict from result.tables alone."""
    t = result.tables
    claims = [_bandwidth_claim(t["roofs"])] if "roofs" in t else []
    if "roofs" in t:
        claims += [_peak_claim(t["roofs"], d) for d in ("fp32", "bf16")]
    if "bandwidth_sweep" in t and "roofs" in t:
        claims.append(_cache_claim(t["bandwidth_sweep"], t["roofs"]))
    if "intensity_sweep" in t:
        claims.append(_sweep_claim(t["intensity_sweep"]))
    if "decode_model" in t:
        claims += _decode_claims(t["decode_model"].iloc[0], t.get("decode"))
    return claims


def _bandwidth_claim(roofs: pd.DataFrame) -> Claim:
    r = _row(roofs, roof="bandwidth")
    spec, got = _num(r["spec"]), float(r["measured_median"])
    cid, text = "roofline.bandwidth_vs_spec", "the best STREAM kernel's roof reaches >= 90% of the bandwidth spec"
    if spec is None:
        return Claim(cid, text, ">= 90% of spec", f"{got:.1f} GB/s, no spec", None, "a CPU's bandwidth spec depends on its DIMMs")
    pct = 100 * got / spec
    note = "" if pct <= 100 else "above 100%: the spec sheet's figure is below what this part delivered"
    return Claim(cid, text, f">= 90% of {spec:.0f} GB/s", f"{pct:.0f}% ({got:.0f} GB/s, {r['how']})", pct >= 90, note)


def _peak_claim(roofs: pd.DataFrame, dtype: str) -> Claim:
    cid, text = f"roofline.{dtype}_peak_vs_spec", f"the {dtype.upper()} matmul peak is close to the spec sheet's"
    r = _row(roofs, roof="compute", dtype=dtype)
    if r is None:
        return Claim(cid, text, "a measured peak", "-", None, f"no {dtype} matmul here")
    spec, want, got = _num(r["spec"]), _num(r["want_pct"]), float(r["measured_median"])
    if spec is None or want is None:
        why = "no spec for this device" if spec is None else f"no BF16 unit: {_short_source(r['spec_source'], dtype)} is a bound"
        return Claim(cid, text, "a spec to compare with", f"{got:.0f} GFLOP/s", None, why)
    pct = 100 * got / spec
    note = ""
    if pct > 100:  # never above 100% without saying why (issue 12 item 11)
        note = f"above 100%: {_over_spec_why(str(r['spec_source']))} ({_short_source(r['spec_source'], dtype)})"
    elif pct < want:
        load = _num(r.get("loadavg_1m"))
        note = f"spec: {_short_source(r['spec_source'], dtype)}" + (f"; load {load:.0f}" if load else "")
    return Claim(cid, text, f">= {want:.0f}% of {spec:.0f} GFLOP/s{spec_clock(str(r['spec_source']))}", f"{pct:.0f}% ({got:.0f} GFLOP/s)",
                 pct >= want, note)


def spec_clock(how: str) -> str:
    """" (at 3.50 GHz, max boost clock)": the clock a CPU spec assumes, from its derivation; "" for a GPU datasheet."""
    import re

    m = re.search(r"x ([\d.]+ GHz) \((max boost clock|clock from /proc/cpuinfo)", how)
    if not m:
        return ""
    return f" (at {m.group(1)}, {'max boost clock' if m.group(2).startswith('max') else 'the clock /proc/cpuinfo reports: no max boost'})"


def _over_spec_why(how: str) -> str:
    """Why a measured peak beat its spec (core.specs.over_spec_note's reasons, short)."""
    if "max boost" in how:
        return "spec at max boost: suspect FLOP/cycle or timing"
    if "GHz" in how:
        return "the spec's clock is below the boost clock"
    return "check the spec row and the timing"


def _short_source(src, dtype: str = "fp32") -> str:
    """The spec's derivation without its asides: "2 cores x 3.50 GHz x 64 FP32 FLOP/cycle"."""
    import re

    src = str(src)
    while re.search(r"\([^()]*\)", src):  # innermost asides first: they nest
        src = re.sub(r"\s*\([^()]*\)", "", src)
    parts = [p.strip() for p in src.split(";")]
    if dtype in ("bf16", "fp16") and len(parts) > 1 and "GHz" in parts[0]:  # "BF16 x 1024" of "cores x GHz x ..."
        return f"{parts[0].split(' x ')[0]} x {parts[0].split(' x ')[1]} x {parts[1].removeprefix('BF16 x ')} BF16 FLOP/cycle"[:60]
    return parts[0][:60]


def _cache_claim(sweep: pd.DataFrame, roofs: pd.DataFrame) -> Claim:
    cid, text = "roofline.cache_above_dram", "in-cache working sets stream >= 1.5x faster than DRAM"
    dram = float(_row(roofs, roof="bandwidth")["measured_median"])
    tri = sweep[(sweep["kernel"] == "triad") & ~sweep["level"].isin(["DRAM", "HBM"])]
    if tri.empty:
        return Claim(cid, text, ">= 1.5x the DRAM roof", "-", None, "no sweep point fits in a cache")
    best = tri.loc[tri["median_GBps"].idxmax()]
    ratio = float(best["median_GBps"]) / dram
    return Claim(cid, text, f">= 1.5x {dram:.1f} GB/s", f"{ratio:.1f}x ({float(best['median_GBps']):.0f} GB/s, {best['level']})", ratio >= 1.5)


def _sweep_claim(sweep: pd.DataFrame) -> Claim:
    fr = sweep["fraction_of_roof"]
    return Claim("roofline.gemm_traces_roofline", "a GEMM sweep over M traces the roofline (at or under it)",
                 "every M <= 1.25x its roof, median >= 0.5x",
                 f"{fr.min():.2f}-{fr.max():.2f}x, median {fr.median():.2f}x", bool(fr.max() <= 1.25 and fr.median() >= 0.5))


def _decode_claims(m: pd.Series, dec: pd.DataFrame | None) -> list[Claim]:
    ridge, ai1 = float(m["ridge"]), float(m["b1_intensity"])
    knee_pred = _num(m["predicted_knee"])  # inf is saved as null: the knee is never reached
    knee_pred = math.inf if knee_pred is None else knee_pred
    share_text = "decode at batch 1 uses under 5% of peak compute"
    share_exp = f"< 5% (roof: <= {100 * min(1, ai1 / ridge):.1f}%)"
    knee_text = "decode turns compute-bound near the predicted batch"
    knee_exp = (f"knee within 0.5-2x of B ~{knee_pred:.0f} (step >= 2x B=1's by the last batch)" if math.isfinite(knee_pred)
                else "never (KV reads grow with B)")
    if dec is None or not len(dec):
        why = "the model's decode was not timed (see skipped)"
        return [Claim("roofline.decode_b1_compute_share", share_text, share_exp, "-", None, why),
                Claim("roofline.decode_knee_vs_ridge", knee_text, knee_exp, "-", None, why)]
    one = dec.iloc[0]
    frac = float(one["pct_of_peak_compute"]) / 100
    share = Claim("roofline.decode_b1_compute_share", share_text, share_exp,
                  f"{100 * frac:.2f}% ({float(one['achieved_gflops']):.1f} GFLOP/s)", frac < 0.05,
                  "" if frac < 0.05 else "per-op dispatch or a cache-resident model can lift it")
    knee, reached = measured_knee(dec)
    last = dec.iloc[-1]
    growth = float(last["median_ms"]) / float(one["median_ms"])
    if reached:
        holds = math.isfinite(knee_pred) and 0.5 <= knee / knee_pred <= 2
        meas, note = f"B ~{knee:.0f} (B={int(last['batch'])}: {growth:.1f}x B=1)", ""
    else:
        holds = False if math.isfinite(knee_pred) and knee_pred <= float(last["batch"]) else None
        meas = f"not reached by B={int(last['batch'])} ({growth:.1f}x B=1)"
        note = "" if holds is False else "the predicted knee is past the largest batch"
    if holds is False and reached:
        note = "knee: where the flat B=1 time meets the ray through the largest batch"
    return [share, Claim("roofline.decode_knee_vs_ridge", knee_text, knee_exp, meas, holds, note)]


# ---------------------------------------------------------------- report


def _overlay_rows(df: pd.DataFrame) -> pd.DataFrame:
    """One row per phase and token count: the whole forward's matmuls and attention."""
    g = df.groupby(["phase", "tokens"], sort=False).agg(flops=("flops", "sum"), bytes=("bytes", "sum"), roof_us=("roof_us", "sum"))
    g = g.reset_index()
    g["intensity"] = g["flops"] / g["bytes"]
    g["roof_ms"] = g["roof_us"] / 1e3
    mem = df.groupby(["phase", "tokens"], sort=False)["bound"].agg(lambda b: f"{(b == 'memory').sum()} of {len(b)} ops")
    g["memory_bound_ops"] = mem.values
    return g


def _sweep_rows(df: pd.DataFrame) -> pd.DataFrame:
    tri = df[df["kernel"] == "triad"].copy()
    tri["working_set_MiB"] = tri["working_set_bytes"] / 2**20
    if len(tri) > 12:  # keep both ends and an even spread
        idx = np.unique(np.linspace(0, len(tri) - 1, 12).round().astype(int))
        tri = tri.iloc[idx]
    return tri


def _roof_rows(df: pd.DataFrame, dtype: str) -> pd.DataFrame:
    """Both roofs for every dtype; the ridge only for the dtype the sweep and the overlay use."""
    return df[(df["roof"] != "ridge") | (df["dtype"] == dtype)]


def _best_threads(df: pd.DataFrame) -> pd.DataFrame:
    return df.loc[df.groupby("kernel", sort=False)["median_GBps"].idxmax()]


def views(result: LabResult) -> list[View]:
    sweep = result.tables.get("intensity_sweep")
    dtype = "fp32" if empty_table(sweep) else str(sweep["dtype"].iloc[0])
    out = [
        View("1. Bandwidth roof", "How many GB/s do STREAM kernels get over buffers 8x the cache?", "bandwidth",
             (Col("kernel", "kernel", "text"), Col("threads", "threads", "int"), Col("median_GBps", "GB/s median", ".1f"),
              Col("best_GBps", "GB/s best", ".1f"), Col("calls_per_block", "calls per timed block", "int")), rows=_best_threads),
        View("2. Compute roof and ridge", "What matmul FLOP/s is reachable, and where do the roofs meet?", "roofs",
             (Col("roof", "roof", "text"), Col("dtype", "dtype", "text"), Col("measured_median", "measured"),
              Col("unit", "unit", "text"), Col("spec", "spec"), Col("pct_of_spec", "% of spec", ".0f")), rows=lambda df: _roof_rows(df, dtype)),
        View("3. The roofline, traced by one GEMM", f"Does (M x {_kn(result)}) @ W climb the bandwidth roof to the compute roof?",
             "intensity_sweep",
             (Col("m", "M", "int"), Col("intensity", "FLOP / byte", ".3g"), Col("median_gflops", "GFLOP/s", ".4g"),
              Col("roof_gflops", "roof GFLOP/s", ".4g"), Col("fraction_of_roof", "of roof", "%"), Col("bound", "bound", "text")),
             chart=Chart(f"roofline ({dtype}), log-log", "roofline_chart", "intensity", "gflops", kind="scatter", series="series",
                         logx=True, logy=True, xlabel="FLOP/byte", ylabel="GFLOP/s")),
        View("4. Where an LLM's matmuls sit", "Prefill and decode: FLOP per byte of the whole forward pass", "overlay",
             (Col("phase", "phase", "text"), Col("tokens", "tokens (S or B)", "int"), Col("intensity", "FLOP / byte", ".3g"),
              Col("memory_bound_ops", "memory-bound", "text"), Col("roof_ms", "roof time ms", ".3g")), rows=_overlay_rows),
    ]
    if "decode" in result.tables:
        out.append(View("5. The real decode step", "How does the step time grow with batch?", "decode",
                        (Col("batch", "batch", "int"), Col("median_ms", "ms / step", ".3g"), Col("roof_ms", "roof ms", ".3g"),
                         Col("achieved_GBps", "GB/s", ".3g"), Col("pct_of_peak_compute", "% of peak FLOP/s", ".2f"),
                         Col("tokens_per_s", "tokens / s", ".4g"))))
    out.append(View("6. Caches above DRAM", "Triad GB/s as the working set grows past each cache", "bandwidth_sweep",
                    (Col("working_set_MiB", "working set MiB", ".3g"), Col("level", "fits in", "text"),
                     Col("median_GBps", "GB/s median", ".1f"), Col("best_GBps", "GB/s best", ".1f")), rows=_sweep_rows))
    return out


def _kn(result: LabResult) -> str:
    s = result.tables.get("intensity_sweep")
    return f"{int(s['k'].iloc[0])}" if s is not None and len(s) else "K"


def headline(result: LabResult, claims: list[Claim]) -> str:
    m = result.tables.get("decode_model")
    roofs = result.tables.get("roofs")
    if m is None or roofs is None:
        return ""
    m = m.iloc[0]
    bw = float(_row(roofs, roof="bandwidth")["measured_median"])
    text = (f"Decode at batch 1 does {float(m['b1_intensity']):.2f} FLOP per byte, far below the ridge "
            f"({float(m['ridge']):.1f} at {bw:.1f} GB/s)")
    dec = result.tables.get("decode")
    if dec is not None and len(dec):
        text += f": it used {float(dec.iloc[0]['pct_of_peak_compute']):.1f}% of peak compute"
        if bool(m["fits_llc"]):
            text += " (weights in cache: dispatch sets its time)"
    return text + "."


def figures(result: LabResult) -> list:
    """The roofline on log-log axes: measured roofs (lines) and measured points; the cache sweep."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = []
    ch = result.tables.get("roofline_chart")
    if ch is not None and len(ch):
        fig, ax = plt.subplots(figsize=(6, 3.5))
        for series, g in ch.groupby("series", sort=False):
            if series.startswith(("measured roof", "spec")):
                ax.plot(g["intensity"], g["gflops"], "-" if series.startswith("measured") else "--", label=series)
            else:
                ax.scatter(g["intensity"], g["gflops"], s=14, label=series)
        ax.set(xscale="log", yscale="log", xlabel="arithmetic intensity (FLOP/byte)", ylabel="GFLOP/s", title="Roofline, measured")
        ax.legend(fontsize=6)
        fig.tight_layout()
        out.append(("roofline: measured roofs and points", fig))
    sw = result.tables.get("bandwidth_sweep")
    if sw is not None and len(sw):
        fig, ax = plt.subplots(figsize=(6, 3.5))
        for kernel, g in sw.groupby("kernel", sort=False):
            ax.plot(g["working_set_bytes"] / 2**20, g["median_GBps"], marker="o", ms=3, label=kernel)
        ax.set(xscale="log", yscale="log", xlabel="working set (MiB)", ylabel="GB/s", title="Bandwidth vs working set")
        ax.legend(fontsize=7)
        fig.tight_layout()
        out.append(("bandwidth vs working set: the cache plateaus", fig))
    return out
