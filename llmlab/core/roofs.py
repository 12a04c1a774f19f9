"""The two roofs, measured: memory bandwidth (STREAM kernels) and matmul peak FLOP/s.

Small public functions that any lab can call to get this machine's roofline:

    bw = bandwidth_GBps(device, "triad")            # GB/s, buffers >= 8x the last-level cache
    peak = matmul_peak_gflops(device, "fp32")        # GFLOP/s, best median over aligned shapes
    ridge = ridge_point(peak, bw)                    # FLOP/byte where the two roofs meet

How bytes are counted: every byte a kernel must read or write, once (STREAM's convention):
read = N, write = N, copy = 2N, triad a = b + s*c = 3N. A CPU's write-allocate traffic is real
but not counted. The bandwidth kernels are timed in blocks of calls (one timer or CUDA event
pair per block, never per call), so launch and dispatch gaps do not fall inside a ~100 us
sample; `warm_up` runs matmuls for a fixed time first, so GPU and CPU clocks are boosted.

References:
- McCalpin, STREAM benchmark (copy, scale, add, triad; bytes counted once; arrays >> cache).
- Williams, Waterman, Patterson, "Roofline", CACM 2009 (ridge point = peak / bandwidth).
- Stas Bekman, mamf-finder (ml-engineering): aligned shapes, flush L2, report best and median.
- torch.utils.benchmark.Timer.blocked_autorange: blocks of calls per timer read.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from llmlab.core.device import Device, last_level_cache_bytes, torch_threads
from llmlab.core.device import tf32 as device_tf32
from llmlab.core.stats import Summary
from llmlab.core.timing import LATENCY, THROUGHPUT, L2Flusher, calls_per_block, measure

KERNELS = ("read", "write", "copy", "triad")
TRIAD_SCALAR = 3.0
MATMUL_DTYPES = ("fp32", "tf32", "bf16", "fp16")
CPU_SHAPES = ((1024, 1024, 1024), (2048, 1024, 1024), (4096, 1024, 1024), (1024, 4096, 1024), (2048, 2048, 2048))
GPU_SHAPES = ((4096, 4096, 4096), (8192, 8192, 8192), (6144, 6144, 6144), (8192, 8192, 2048), (16384, 4096, 4096))


# ---------------------------------------------------------------- warm-up


def warm_up(device: Device, seconds: float = 0.3) -> float:
    """Run matmuls for at least `seconds` of wall time so clocks are boosted; returns the time spent (s)."""
    import torch

    n = 4096 if device.is_cuda else 512
    a = torch.ones(n, n, device=device.torch)  # (n, n)
    out = torch.empty(n, n, device=device.torch)
    t0 = time.perf_counter()
    while True:
        torch.mm(a, a, out=out)
        device.synchronize()
        if time.perf_counter() - t0 >= seconds:
            return time.perf_counter() - t0


# ---------------------------------------------------------------- bandwidth


@dataclass(frozen=True)
class Buffers:
    a: object  # three FP32 torch tensors of n elements each
    b: object
    c: object
    note: str  # why the buffers are smaller than asked ("" when they are not)

    @property
    def nbytes(self) -> int:
        return self.a.numel() * 4


def buffer_bytes(device: Device, llc_multiple: int = 8) -> tuple[int, str]:
    """(bytes of one bandwidth buffer, why it is smaller than asked or ""): llc_multiple x LLC, capped at 1/8 of
    free memory."""
    want = llc_multiple * last_level_cache_bytes(device)
    cap = device.free_memory_bytes() // 8
    nbytes = min(want, cap) if cap > 0 else want
    if nbytes == want:
        return nbytes, ""
    return nbytes, f"bandwidth buffers capped at {nbytes / 2**20:.0f} MiB (1/8 of free memory), not {llc_multiple}x LLC"


def bandwidth_buffers(device: Device, llc_multiple: int = 8) -> Buffers:
    """Three FP32 buffers of llc_multiple x LLC each (capped at 1/8 of free memory, with a note)."""
    import torch

    nbytes, note = buffer_bytes(device, llc_multiple)
    n = nbytes // 4
    a, b, c = (torch.full((n,), float(i + 1), dtype=torch.float32, device=device.torch) for i in range(3))
    return Buffers(a, b, c, note)


def bandwidth_kernels(a, b, c) -> dict[str, tuple[Callable[[], object], int]]:
    """name -> (fn, bytes moved per call), counting each byte read or written once."""
    import torch

    nb = a.numel() * a.element_size()
    return {
        "read": (lambda: torch.sum(a), nb),  # reads a
        "write": (lambda: a.fill_(1.0), nb),  # writes a
        "copy": (lambda: b.copy_(a), 2 * nb),  # reads a, writes b
        "triad": (lambda: torch.add(b, c, alpha=TRIAD_SCALAR, out=a), 3 * nb),  # a = b + s*c: reads b, c, writes a
    }


def time_blocks(fn: Callable[[], object], device: Device, *, blocks: int = 10, min_block_s: float = 0.02,
                warmup_calls: int = 1) -> tuple[Summary, int]:
    """Per-call time (ms) over `blocks` THROUGHPUT blocks of calls (core.timing); each block is one timer pair.

    The calls per block are picked from a probe (the last warm-up call) so one block lasts at least
    `min_block_s`: the gap between calls (launch, dispatch) is then part of the throughput, not of a
    sample's edge. Returns (Summary over blocks of the mean per-call time, calls per block).
    """
    for _ in range(max(1, warmup_calls) - 1):
        fn()
    calls = calls_per_block(fn, device, min_block_s)
    return measure(fn, device, mode=THROUGHPUT, warmup=0, repeats=blocks, calls=calls), calls


@dataclass(frozen=True)
class Bandwidth:
    kernel: str
    threads: int
    buffer_bytes: int  # one buffer
    bytes_per_call: int
    calls_per_block: int
    median_GBps: float
    best_GBps: float
    p10_GBps: float
    p90_GBps: float
    median_ms: float  # per call
    blocks: int


def measure_bandwidth(device: Device, kind: str = "triad", *, bufs: Buffers | None = None, llc_multiple: int = 8,
                      blocks: int = 10, min_block_s: float = 0.02, threads: int | None = None) -> Bandwidth:
    """One STREAM kernel over buffers >= llc_multiple x LLC, timed in blocks of calls."""
    import torch

    if kind not in KERNELS:
        raise ValueError(f"bandwidth kernel '{kind}': use one of {', '.join(KERNELS)}")
    bufs = bufs or bandwidth_buffers(device, llc_multiple)
    fn, nbytes = bandwidth_kernels(bufs.a, bufs.b, bufs.c)[kind]
    with torch_threads(threads):
        s, calls = time_blocks(fn, device, blocks=blocks, min_block_s=min_block_s)
        used = torch.get_num_threads()
    return Bandwidth(kind, used, bufs.nbytes, nbytes, calls, nbytes / (s.median / 1e3) / 1e9,
                     nbytes / (s.min / 1e3) / 1e9,
                     nbytes / (s.p90 / 1e3) / 1e9, nbytes / (s.p10 / 1e3) / 1e9, s.median, s.n)


def bandwidth_GBps(device: Device, kind: str = "triad", **kw) -> float:
    """Median GB/s of one STREAM kernel (read, write, copy, triad) over buffers >= 8x the LLC."""
    return measure_bandwidth(device, kind, **kw).median_GBps


# ---------------------------------------------------------------- compute


def torch_dtype(spec: str):
    import torch

    return {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[spec]


def tf32(enabled: bool):
    """TF32 tensor-core matmuls on (True) or strict IEEE FP32 (False) inside the block; restored after.

    It wraps core.device's one TF32 helper, which speaks both torch APIs (fp32_precision and allow_tf32)."""
    return device_tf32(matmul=enabled)


def gemm_operands(m: int, n: int, k: int, dtype: str, device: Device, gen):
    """Random A (M, K), B (K, N) drawn on the device (`gen` lives there), and an output C (M, N)."""
    import torch

    dt = torch_dtype(dtype)
    a = torch.randn(m, k, generator=gen, device=device.torch).to(dt)  # (M, K)
    b = torch.randn(k, n, generator=gen, device=device.torch).to(dt)  # (K, N)
    return a, b, torch.empty(m, n, dtype=dt, device=device.torch)  # (M, N)


def matmul_fn(backend: str, a, b, out) -> Callable[[], object]:
    """torch.matmul, or numpy's own BLAS (OpenBLAS in the wheels) on the same CPU buffers."""
    import torch

    if backend == "numpy":
        import numpy as np

        an, bn, on = a.numpy(), b.numpy(), out.numpy()
        return lambda: np.matmul(an, bn, out=on)
    return lambda: torch.matmul(a, b, out=out)


def check_matmul(backend: str, dtype: str, device: Device) -> None:
    """llm.c style: the variant against an FP64 reference before any timing (RuntimeError if off)."""
    import torch

    gen = torch.Generator(device=device.torch).manual_seed(0)
    a, b, out = gemm_operands(64, 48, 256, dtype, device, gen)
    with tf32(dtype == "tf32") if device.is_cuda else _nothing():
        matmul_fn(backend, a, b, out)()
    ref = a.double().cpu() @ b.double().cpu()
    tol = {"fp32": 1e-3, "tf32": 2e-2, "bf16": 5e-2, "fp16": 2e-2}[dtype] * math.sqrt(256)
    err = (out.double().cpu() - ref).abs().max().item()
    if not err <= tol:
        raise RuntimeError(f"matmul {backend}/{dtype} differs from the FP64 reference by {err:.3g} (> {tol:.3g})")


@contextmanager
def _nothing() -> Iterator[None]:
    yield


def matmul_stats(device: Device, m: int, n: int, k: int, dtype: str = "fp32", *, backend: str = "torch",
                 repeats: int = 5, threads: int | None = None, flush: L2Flusher | None = None,
                 seed: int = 0) -> Summary:
    """Per-call time of one (M,K) @ (K,N) matmul, the cache flushed before each call (mamf-finder)."""
    import torch

    gen = torch.Generator(device=device.torch).manual_seed(seed)
    a, b, out = gemm_operands(m, n, k, dtype, device, gen)
    flush = flush or L2Flusher(device)
    with torch_threads(threads), (tf32(dtype == "tf32") if device.is_cuda else _nothing()):
        return measure(matmul_fn(backend, a, b, out), device, mode=LATENCY, warmup=1, repeats=repeats, setup=flush)


def matmul_peak_gflops(device: Device, dtype: str = "fp32", *, shapes=None, repeats: int = 5,
                       backends: tuple[str, ...] = ("torch",), threads: int | None = None) -> float:
    """Best median GFLOP/s over aligned shapes (and backends), each checked against FP64 first."""
    if dtype not in MATMUL_DTYPES:
        raise ValueError(f"matmul dtype '{dtype}': use one of {', '.join(MATMUL_DTYPES)}")
    shapes = shapes or (GPU_SHAPES[:2] if device.is_cuda else CPU_SHAPES[:2])
    flush = L2Flusher(device)
    best = 0.0
    for backend in backends:
        check_matmul(backend, dtype, device)
        for m, n, k in shapes:
            s = matmul_stats(device, m, n, k, dtype, backend=backend, repeats=repeats, threads=threads, flush=flush)
            best = max(best, 2 * m * n * k / (s.median / 1e3) / 1e9)
    return best


def l2_beating_arch(device: Device, llc_multiple: int = 32, dtype: str = "bfloat16",
                    budget_frac: float = 0.25) -> str | None:
    """`arch:NAME` of the smallest registry architecture whose `dtype` weights are >= llc_multiple x the
    device's last-level cache and fit in budget_frac of its free memory; None when none does.

    A GPU's speed parts time this instead of `tiny` (23 MB, inside a 40-50 MB L2): weights that stay
    in L2 are not read from HBM, so decode there is not memory-bound. Sizes come from the device."""
    from llmlab.core.models import ARCHS, arch_config, estimate_bytes

    want, budget = llc_multiple * last_level_cache_bytes(device), budget_frac * device.free_memory_bytes()
    sizes = sorted((estimate_bytes(arch_config(name), dtype), name) for name in ARCHS)
    return next((f"arch:{name}" for nbytes, name in sizes if want <= nbytes <= budget), None)


def gpu_speed_model(requested: str, choice: str, device: Device, dtype: str = "bfloat16",
                    llc_multiple: int = 32) -> tuple[str, str]:
    """(the model a lab's speed part times, why: "" when it is `requested`).

    On a CPU, or with choice "same", it is `requested`. On a GPU, choice "auto" keeps `requested` when its
    weights are >= llc_multiple x L2, else takes `l2_beating_arch`; any other choice is a model reference."""
    if not device.is_cuda or choice == "same":
        return requested, ""
    if choice != "auto":
        return choice, f"{choice} (cuda_model) instead of {requested}"
    from llmlab.core.models import estimate_bytes, load_config

    l2 = last_level_cache_bytes(device)
    if estimate_bytes(load_config(requested), dtype) >= llc_multiple * l2:
        return requested, ""
    arch = l2_beating_arch(device, llc_multiple, dtype)
    if arch is None:
        return requested, (f"{requested} (no registry shape of >= {llc_multiple}x the {l2 / 2**20:.0f} MiB L2 fits in "
                           "memory: weights may sit in L2)")
    return arch, (f"{arch} (random weights) instead of {requested}: the smallest registry shape whose {dtype} weights "
                  f"are >= {llc_multiple}x the {l2 / 2**20:.0f} MiB L2, so they are read from HBM")


def ridge_point(peak_gflops: float, bandwidth_GBps: float) -> float:
    """FLOP per byte where the compute roof meets the bandwidth roof."""
    if bandwidth_GBps <= 0:
        raise ValueError("bandwidth must be positive")
    return peak_gflops / bandwidth_GBps


def attainable_gflops(intensity: float, peak_gflops: float, bandwidth_GBps: float) -> float:
    """The roofline: min(peak, intensity x bandwidth)."""
    return min(peak_gflops, intensity * bandwidth_GBps)


def batch_knee(batches, step_ms) -> tuple[float, bool]:
    """(the knee batch, whether it is reached) of a decode batch sweep, batches ascending.

    The knee is where the flat batch-1 step time meets the ray through the largest batch's time:
    t1 x Bmax / t(Bmax). It counts as reached only when the largest batch took at least twice the
    batch-1 time (compute shows); before that the step is flat and any knee is extrapolation.
    """
    t1, b_max, t_max = float(step_ms[0]), float(batches[-1]), float(step_ms[-1])
    return t1 * b_max / t_max, t_max >= 2 * t1
