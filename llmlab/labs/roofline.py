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
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from llmlab.core.device import Device, cpu_caches, cpu_load, last_level_cache_bytes, torch_threads
from llmlab.core.errors import UsageError
from llmlab.core.render import track
from llmlab.core.results import Chart, LabResult
from llmlab.core.roofs import (
    bandwidth_buffers,
    bandwidth_kernels,
    check_matmul,
    gemm_operands,
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
from llmlab.core.timing import L2Flusher, Stats, Stopwatch, autorange, measure

LAB = "roofline"
VERSION = 1
KERNELS = ("read", "write", "copy", "triad")
DTYPES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}  # torch name -> spec name
NO_GPU = "not measured: no GPU"

CPU_SHAPES = ((1024, 1024, 1024), (2048, 1024, 1024), (4096, 1024, 1024), (1024, 4096, 1024), (2048, 2048, 2048))
GPU_SHAPES = ((4096, 4096, 4096), (8192, 8192, 8192), (6144, 6144, 6144), (8192, 8192, 2048), (16384, 4096, 4096))


@dataclass(frozen=True)
class Config:
    llc_multiple: int = 8  # bandwidth buffers are 8x the last-level cache: < 1/8 of any access can hit
    bandwidth_repeats: int = 10  # timed blocks of calls per kernel: median and best of 10
    bandwidth_block_s: float = 0.02  # each block lasts >= 20 ms: launch gaps are inside the throughput, not at a sample's edge
    warmup_s: float = 0.3  # matmuls for 0.3 s before the roofs: clocks boosted (issue 12 item 15)
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
            bandwidth_repeats=3, sweep_factor=8, sweep_min_run_s=0.03,
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


def _time(fn, device: Device, repeats: int, min_run_s: float) -> Stats:
    """measure() for calls of a millisecond or more; autorange() (blocks of many calls) below."""
    probe = measure(fn, device, warmup=1, repeats=3)
    if probe.median_ms >= 1.0:
        return measure(fn, device, warmup=0, repeats=repeats)
    return autorange(fn, device, min_run_time=min_run_s)


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
            warm = measure(fn, device, warmup=0, repeats=1).min_ms
            if probe and warm > 4 * min(probe.values()):
                continue
            probe[key] = min(warm, measure(fn, device, warmup=0, repeats=1).min_ms)
    return min(probe, key=probe.get)


def pick_threads(fn, device: Device) -> int:
    """The faster thread count for `fn` (one thread is probed first)."""
    return pick_fastest({t: (fn, t) for t in sorted(thread_counts(device))}, device)


def measure_bandwidth(cfg: Config, device: Device, bufs=None, progress=None) -> pd.DataFrame:
    """Every kernel at every thread count, timed in blocks of calls (core.roofs)."""
    bufs = bufs if bufs is not None else bandwidth_buffers(device, cfg.llc_multiple)
    rows = []
    jobs = [(t, k) for t in thread_counts(device) for k in KERNELS]
    for threads, name in track(progress, jobs, "bandwidth"):
        bw = roof_bandwidth(device, name, bufs=bufs, blocks=cfg.bandwidth_repeats, min_block_s=cfg.bandwidth_block_s, threads=threads)
        rows.append(dict(kernel=name, threads=threads, buffer_bytes=bw.buffer_bytes, bytes_moved=bw.bytes_per_call,
                         median_GBps=bw.median_GBps, best_GBps=bw.best_GBps, p10_GBps=bw.p10_GBps, p90_GBps=bw.p90_GBps,
                         median_ms=bw.median_ms, calls_per_block=bw.calls_per_block, n=bw.blocks))
    return pd.DataFrame(rows)


def measure_sweep(cfg: Config, device: Device, bufs, threads: int, progress=None) -> pd.DataFrame:
    """read / copy / triad on views of growing size, at `threads`: each cache level is a plateau."""
    a, b, c = bufs.a, bufs.b, bufs.c
    sizes, n = [], cfg.sweep_min_bytes // 4
    while n <= a.numel():
        sizes.append(n)
        n *= cfg.sweep_factor
    if sizes[-1] != a.numel():
        sizes.append(a.numel())
    rows = []
    jobs = [(n, k) for n in sizes for k in ("read", "copy", "triad")]
    for n, name in track(progress, jobs, "bandwidth sweep"):
        fn, nbytes = bandwidth_kernels(a[:n], b[:n], c[:n])[name]
        with torch_threads(threads):
            s = _time(fn, device, cfg.bandwidth_repeats, cfg.sweep_min_run_s)
        ws = nbytes  # the working set is what the kernel touches
        rows.append(dict(kernel=name, threads=threads, buffer_bytes=n * 4, working_set_bytes=ws, level=cache_level(ws, device),
                         median_GBps=nbytes / s.median_s / 1e9, best_GBps=nbytes / (s.min_ms / 1e3) / 1e9,
                         median_us=s.median_ms * 1e3, n=s.n))
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
                        s = measure(matmul_fn(backend, a, b, out), device, warmup=1, repeats=cfg.compute_repeats, setup=flush)
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


def roofs_table(roofs: Roofs, bw: pd.DataFrame, comp: pd.DataFrame, device: Device) -> pd.DataFrame:
    spec_bw, bw_src = bandwidth_spec_GBps(device)
    rows = [dict(roof="bandwidth", dtype="-", how=roofs.bandwidth_kernel, measured_median=roofs.bandwidth_GBps,
                 measured_best=float(bw["best_GBps"].max()), unit="GB/s", spec=spec_bw,
                 pct_of_spec=100 * roofs.bandwidth_GBps / spec_bw if spec_bw else None, spec_source=bw_src)]
    for dtype, peak in roofs.peak_gflops.items():
        spec, src = peak_for(device, dtype)
        sub = comp[comp["dtype"] == dtype]
        rows.append(dict(roof="compute", dtype=dtype, how=f"matmul, {roofs.best_backend[dtype]}", measured_median=peak,
                         measured_best=float(sub["best_gflops"].max()), unit="GFLOP/s", spec=spec,
                         pct_of_spec=100 * peak / spec if spec else None, spec_source=src))
    for dtype in roofs.peak_gflops:
        spec, _ = peak_for(device, dtype)
        rows.append(dict(roof="ridge", dtype=dtype, how="peak / bandwidth", measured_median=roofs.ridge(dtype),
                         measured_best=None, unit="FLOP/byte", spec=spec / spec_bw if spec and spec_bw else None,
                         pct_of_spec=None, spec_source="spec peak / spec bandwidth" if spec and spec_bw else "no bandwidth spec"))
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
                s = measure(cands[(backend, threads)][0], device, warmup=0 if not device.is_cuda else 1,
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
    from llmlab.core.models import _shape

    s = _shape(config)
    h, hd, q, kv, i, L = s["hidden"], s["head_dim"], s["heads"], s["kv_heads"], s["intermediate"], s["layers"]
    return [("q_proj", h, q * hd, L), ("k_proj", h, kv * hd, L), ("v_proj", h, kv * hd, L), ("o_proj", q * hd, h, L),
            ("gate_proj", h, i, L), ("up_proj", h, i, L), ("down_proj", i, h, L), ("lm_head", h, s["vocab"], 1)]


def attention_cost(config, tokens: int, context: int, elem: int, prefill: bool) -> tuple[int, int]:
    """(FLOPs, bytes) of QK^T and PV over all layers: Q, K, V, O each moved once (flash-attention style)."""
    from llmlab.core.models import _shape

    s = _shape(config)
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
        return measure(step, device, warmup=1, repeats=steps), threads


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
        label = "spec roof" if spec_bw else "spec compute peak"
        rows += [dict(series=label, intensity=x, gflops=min(spec, x * spec_bw) if spec_bw else spec) for x in grid[::4]]
    rows += [dict(series="GEMM sweep (measured)", intensity=r.intensity, gflops=r.median_gflops) for r in sweep.itertuples()]
    decode = overlay[overlay["phase"] == "decode"]
    ops = pd.concat([overlay[overlay["phase"] == "prefill"], decode[decode["tokens"] == decode["tokens"].min()]])
    rows += [dict(series="model matmuls, prefill + decode B=1 (on roof)", intensity=r.intensity, gflops=r.attainable_gflops)
             for r in ops.itertuples()]
    if dec is not None:
        rows += [dict(series="decode step (measured)", intensity=r.intensity, gflops=r.achieved_gflops) for r in dec.itertuples()]
    return pd.DataFrame(rows)


# ---------------------------------------------------------------- the lab


def run(cfg: Config, device: Device, progress=None) -> LabResult:
    """Measures. Returns data. Never prints."""
    from llmlab.core.models import estimate_bytes, load, load_config

    res = LabResult.new(LAB, VERSION, cfg)
    dtype_name = overlay_dtype(cfg, device)
    dtype = DTYPES[dtype_name]
    if not device.is_cuda and dtype == "fp16":
        raise UsageError("--dtype float16 on a CPU: no FP16 matmul unit to measure; use float32 or bfloat16")
    config = load_config(cfg.model)  # a bad --model fails here, before any measuring
    res.env["overlay"] = dict(model=cfg.model, dtype=dtype_name, timing_only=cfg.model.startswith("arch:"))
    sw = Stopwatch(device)
    res.env["phases_s"] = sw.phases_ms  # wall time per part (ms), filled as the parts run
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
        dec = None
        need = estimate_bytes(config, dtype_name)
        if need <= decode_budget_bytes(cfg, device):
            with sw.phase("decode"):
                lm = load(cfg.model, device, dtype_name)
                dec = res.add_table("decode", measure_decode(cfg, device, lm, dtype_name, roofs, res, progress))
                del lm
        else:
            res.note(f"decode step not timed: {cfg.model} needs {need / 2**30:.1f} GiB of weights in {dtype_name} "
                     f"(budget {decode_budget_bytes(cfg, device) / 2**30:.1f} GiB); the overlay is analytic only")
        with sw.phase("bandwidth_sweep"):  # last: the roofs and the sweeps that are compared with them run back to back
            res.add_table("bandwidth_sweep", measure_sweep(cfg, device, bufs, roofs.bandwidth_threads, progress))
            del bufs
        order = ("bandwidth", "bandwidth_sweep", "compute", "roofs", "intensity_sweep", "overlay", "decode")
        res.tables = {k: res.tables[k] for k in (*order, *res.tables) if k in res.tables}  # reading order
        res.add_table("roofline_chart", chart_table(roofs, dtype, device, sweep, overlay, dec))
        _charts(res, dtype)
        _claims(res, cfg, device, config, roofs, dtype, sweep, dec)
        _notes(res, cfg, device, config, roofs, dtype_name, dec)
    return res


def _charts(res: LabResult, dtype: str) -> None:
    res.charts.append(Chart(f"roofline ({dtype}): measured roofs, GEMM sweep, model matmuls, decode steps", "roofline_chart",
                            "intensity", "gflops", kind="scatter", series="series", logx=True, logy=True,
                            xlabel="arithmetic intensity, FLOP/byte (log)", ylabel="GFLOP/s (log)"))
    res.charts.append(Chart("bandwidth vs working set: the cache plateaus", "bandwidth_sweep", "working_set_bytes",
                            "median_GBps", kind="line", series="kernel", logx=True, logy=True,
                            xlabel="working set, bytes (log)", ylabel="GB/s (log)"))
    if "decode" in res.tables:
        res.charts.append(Chart("decode step time vs batch", "decode", "batch", ["median_ms", "roof_ms"], kind="line",
                                logx=True, logy=True, xlabel="batch (log)", ylabel="ms per step (log)"))


def _claims(res, cfg, device, config, roofs: Roofs, dtype, sweep, dec) -> None:
    ridge = roofs.ridge(dtype)
    elem = torch_dtype(dtype).itemsize
    if dec is not None and len(dec):
        one = dec.iloc[0]
        frac = float(one["pct_of_peak_compute"]) / 100
        spec, _ = peak_for(device, dtype)
        of_spec = f"; {100 * float(one['achieved_gflops']) / spec:.2f}% of the spec peak" if spec else ""
        res.claim("decode at batch 1 uses under 5% of peak compute here",
                  f"< 5%: intensity {float(one['intensity']):.2f} FLOP/byte vs ridge {ridge:.1f} -> at most "
                  f"{100 * min(1, float(one['intensity']) / ridge):.1f}% of peak if bandwidth-bound",
                  f"{100 * frac:.2f}% of the measured {dtype} peak ({float(one['achieved_gflops']):.2f} of {roofs.peak_gflops[dtype]:.0f} GFLOP/s{of_spec})",
                  frac < 0.05, note=f"batch {int(one['batch'])}, {float(one['median_ms']):.2f} ms per step")
        knee_pred = predicted_knee(config, roofs, dtype, float(one["context"]))
        knee, reached = measured_knee(dec)
        pred = f"batch ~{knee_pred:.0f} (ridge {ridge:.1f} FLOP/byte; intensity ~ 2B/{elem} bytes per weight)" if math.isfinite(knee_pred) else "never (the KV reads grow as fast as the FLOPs)"
        if reached:
            holds = math.isfinite(knee_pred) and 0.5 <= knee / knee_pred <= 2
            meas = f"batch ~{knee:.0f} (step time flat, then growing with B; {float(dec.iloc[-1]['median_ms']) / float(one['median_ms']):.1f}x at batch {int(dec.iloc[-1]['batch'])})"
        else:
            holds = False if math.isfinite(knee_pred) and knee_pred <= float(dec.iloc[-1]["batch"]) else None
            meas = f"not reached by batch {int(dec.iloc[-1]['batch'])} (step time {float(dec.iloc[-1]['median_ms']) / float(one['median_ms']):.1f}x batch 1)"
        res.claim("decode becomes compute-bound at batch about N", pred, meas, holds,
                  note="within 2x counts as holding; the knee is where the flat batch-1 time meets the ray through the largest batch")
    else:  # analytic only: the roofline's prediction from the config, no verdict
        why = "not measured: the model was not timed (see notes); expected is the roofline's prediction from the config"
        c1 = step_cost(config, 1, cfg.decode_context, elem)
        ai = c1["flops"] / c1["bytes"]
        res.claim("decode at batch 1 uses under 5% of peak compute here",
                  f"< 5%: intensity {ai:.2f} FLOP/byte vs ridge {ridge:.1f} -> at most {100 * min(1, ai / ridge):.2f}% of peak", "-", None, note=why)
        knee_pred = predicted_knee(config, roofs, dtype, cfg.decode_context)
        res.claim("decode becomes compute-bound at batch about N",
                  f"batch ~{knee_pred:.0f} (ridge {ridge:.1f} FLOP/byte)" if math.isfinite(knee_pred) else "never (KV reads grow as fast as FLOPs)",
                  "-", None, note=why)
    spec_bw, src = bandwidth_spec_GBps(device)
    if spec_bw:
        pct = 100 * roofs.bandwidth_GBps / spec_bw
        res.claim("measured bandwidth is N% of spec", ">= 90% of spec (STREAM-class kernels on HBM)",
                  f"{pct:.0f}% ({roofs.bandwidth_GBps:.0f} of {spec_bw:.0f} GB/s, {roofs.bandwidth_kernel})", pct >= 90, note=src)
    else:
        res.claim("measured bandwidth is N% of spec", "a spec to compare with", f"{roofs.bandwidth_GBps:.1f} GB/s ({roofs.bandwidth_kernel})",
                  None, note=f"not measured: {src}")
    spec, src = peak_for(device, dtype)
    if spec:
        pct = 100 * roofs.peak_gflops[dtype] / spec
        want = 80 if device.is_cuda else 70
        res.claim(f"measured {dtype} matmul peak is N% of spec", f">= {want}% of {spec:.0f} GFLOP/s",
                  f"{pct:.0f}% ({roofs.peak_gflops[dtype]:.0f} GFLOP/s, {roofs.best_backend[dtype]})", pct >= want, note=src)
    fr = sweep["fraction_of_roof"]
    lowest, highest = sweep.iloc[0], sweep.iloc[-1]
    res.claim("the GEMM sweep traces the roofline: FLOP/s grows with intensity, then flattens at the compute roof",
              "every point at or under its roof (<= 1.25x), most within 2x of it",
              f"fraction of roof: min {fr.min():.2f}, median {fr.median():.2f}, max {fr.max():.2f}; "
              f"M={int(lowest['m'])}: {float(lowest['median_gflops']):.1f} GFLOP/s, M={int(highest['m'])}: {float(highest['median_gflops']):.0f}",
              bool(fr.max() <= 1.25 and fr.median() >= 0.5))


def _notes(res, cfg, device, config, roofs: Roofs, dtype_name, dec) -> None:
    res.note("bytes are counted once per byte a kernel must read or write (STREAM): read N, write N, copy 2N, triad 3N; "
             "CPU write-allocate traffic is not counted. GEMM intensity = 2MKN / bytes(A + B + C).")
    res.note(f"roofs: bandwidth = the highest median over kernels and thread counts ({roofs.bandwidth_kernel}); "
             "compute = the highest median over shapes and backends, cache flushed before every call.")
    if not device.is_cuda:
        res.note("GPU roofs (TF32, FP16, HBM) not measured: no GPU")
        load, cores = cpu_load()
        if load is not None and load > cores:
            res.note(f"the CPU was busy (1-minute load {load:.1f} on {cores} logical CPUs): these roofs are what this "
                     "process could get while sharing it, below an idle machine's; the thread count of each row says "
                     "whether one thread (immune to descheduled OpenMP peers) or all of them won")
    if dec is not None and len(dec):
        w = float(dec.iloc[0]["weight_bytes"])
        llc = last_level_cache_bytes(device)
        if w <= llc:
            t_dram = float(dec.iloc[0]["bytes"]) / roofs.bandwidth_GBps / 1e6
            res.note(f"{cfg.model}'s weights ({w / 2**20:.1f} MiB in {dtype_name}) fit in the {llc / 2**20:.0f} MiB last-level cache: "
                     f"decode reads them from cache, not DRAM, so 'memory-bound' here means cache- and overhead-bound. "
                     f"The DRAM roof predicts {t_dram:.2f} ms per batch-1 step, measured {float(dec.iloc[0]['median_ms']):.2f} ms: "
                     "the difference is per-op dispatch (Python, HF modules, small kernels), not bytes. "
                     "For a true DRAM-bound reading use a model larger than the cache (e.g. --model arch:qwen2.5-0.5b).")
    if cfg.model.startswith("arch:"):
        res.note(f"{cfg.model} has random weights: its figures are timings, never quality claims")
