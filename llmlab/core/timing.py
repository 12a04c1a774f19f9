"""Timing: warm-up, synchronise, CUDA events or perf_counter_ns, robust statistics.

References:
- torch.utils.benchmark (Timer.blocked_autorange): the right tool for sub-millisecond kernels,
  it picks the number of calls per block so timer overhead vanishes. `autorange` wraps it.
- CUDA events measure on the GPU's own clock, with no host sync inside the timed region.
- Stas Bekman's mamf-finder: flush L2 between repeats of a kernel whose data fits in cache.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

from llmlab.core.device import Device


@dataclass(frozen=True)
class Stats:
    """Per-call wall time statistics over n samples, in milliseconds."""

    median_ms: float
    p10_ms: float
    p90_ms: float
    min_ms: float
    max_ms: float
    mean_ms: float
    n: int

    def as_dict(self, prefix: str = "") -> dict[str, float]:
        return {f"{prefix}{k}": v for k, v in asdict(self).items()}

    @property
    def median_s(self) -> float:
        return self.median_ms / 1e3


def _quantile(sorted_xs: list[float], q: float) -> float:
    """Linear-interpolated quantile (numpy's default method), q in [0, 1]."""
    if len(sorted_xs) == 1:
        return sorted_xs[0]
    pos = q * (len(sorted_xs) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(sorted_xs) - 1)
    return sorted_xs[lo] + (sorted_xs[hi] - sorted_xs[lo]) * (pos - lo)


def summarize(samples_ms: list[float]) -> Stats:
    """Median, p10, p90, min, max, mean of samples (ms). Raises ValueError on no samples."""
    if not samples_ms:
        raise ValueError("no samples to summarise")
    xs = sorted(float(x) for x in samples_ms)
    return Stats(
        median_ms=statistics.median(xs),
        p10_ms=_quantile(xs, 0.10),
        p90_ms=_quantile(xs, 0.90),
        min_ms=xs[0],
        max_ms=xs[-1],
        mean_ms=statistics.fmean(xs),
        n=len(xs),
    )


class L2Flusher:
    """Overwrites a buffer larger than the last-level cache, so the next kernel reads from DRAM/HBM."""

    def __init__(self, device: Device, nbytes: int | None = None):
        import torch

        from llmlab.core.device import last_level_cache_bytes

        nbytes = nbytes or 2 * last_level_cache_bytes(device)  # twice the LLC evicts it for sure
        self._buf = torch.empty(nbytes // 4, dtype=torch.float32, device=device.torch)

    def __call__(self) -> None:
        self._buf.fill_(1.0)


def measure(
    fn: Callable[[], object],
    device: Device,
    *,
    warmup: int = 3,
    repeats: int = 10,
    setup: Callable[[], object] | None = None,
    max_time_s: float | None = None,
) -> Stats:
    """Time `fn()` `repeats` times after `warmup` calls; one sample per call.

    `setup` runs before each timed call, outside the timed region (e.g. an L2 flush).
    On a GPU each call is bracketed by CUDA events; on the CPU by perf_counter_ns.
    `max_time_s` stops early (keeping at least 3 samples) when the calls are slow.
    """
    for _ in range(warmup):
        if setup:
            setup()
        fn()
    device.synchronize()
    samples: list[float] = []
    t_start = time.perf_counter()
    if device.is_cuda:
        import torch

        for _ in range(repeats):
            if setup:
                setup()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end))
            if max_time_s and len(samples) >= 3 and time.perf_counter() - t_start > max_time_s:
                break
    else:
        for _ in range(repeats):
            if setup:
                setup()
            t0 = time.perf_counter_ns()
            fn()
            samples.append((time.perf_counter_ns() - t0) / 1e6)
            if max_time_s and len(samples) >= 3 and time.perf_counter() - t_start > max_time_s:
                break
    return summarize(samples)


def autorange(fn: Callable[[], object], device: Device, *, min_run_time: float = 0.2) -> Stats:
    """Time a fast `fn` with torch.utils.benchmark.Timer.blocked_autorange.

    Each sample is the mean per-call time of one block of many calls, so the statistics are
    over blocks (n = number of blocks). The Timer synchronises CUDA itself.
    """
    from torch.utils import benchmark

    fn()  # warm-up: allocator, caches, lazy init
    device.synchronize()
    m = benchmark.Timer(stmt="fn()", globals={"fn": fn}, num_threads=_threads()).blocked_autorange(
        min_run_time=min_run_time
    )
    return summarize([t * 1e3 for t in m.times])


def _threads() -> int:
    import torch

    return torch.get_num_threads()


class Stopwatch:
    """Wall-clock phases on the host clock: `with sw.phase("prefill"): ...`, then `sw.phases_ms`.

    Call `device.synchronize()` inside a phase that launches GPU work, or pass `device`.
    """

    def __init__(self, device: Device | None = None):
        self.device = device
        self.phases_ms: dict[str, float] = {}

    def phase(self, name: str):
        return _Phase(self, name)


class _Phase:
    def __init__(self, sw: Stopwatch, name: str):
        self.sw, self.name = sw, name

    def __enter__(self):
        if self.sw.device:
            self.sw.device.synchronize()
        self.t0 = time.perf_counter_ns()
        return self

    def __exit__(self, *exc):
        if self.sw.device:
            self.sw.device.synchronize()
        self.sw.phases_ms[self.name] = self.sw.phases_ms.get(self.name, 0.0) + (time.perf_counter_ns() - self.t0) / 1e6
        return False
