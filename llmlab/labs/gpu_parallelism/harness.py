"""Timing and checking helpers every part shares: threads, interleaved timing, relative error, the FP32 peak."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch

from llmlab.core.device import Device, cpu_cores, resolve_device, tf32_knobs
from llmlab.core.specs import peak_for
from llmlab.core.stats import Summary
from llmlab.core.timing import LATENCY, interleaved, measure


def thread_counts(cores: int) -> tuple[int, ...]:
    """1, 2, 4, ... below `cores`, then `cores` itself."""
    out, t = [], 1
    while t < cores:
        out.append(t)
        t *= 2
    return (*out, cores)


def threads_setter(n: int) -> Callable[[], None]:
    return lambda: torch.set_num_threads(n)


@contextmanager
def keep_torch_settings() -> Iterator[None]:
    """Whatever the lab changes (threads, TF32 for CUDA matmuls and cuDNN convs) is restored on exit."""
    threads = torch.get_num_threads()
    saved = {name: getattr(obj, attr) for name, (obj, attr, _, _) in tf32_knobs().items()}
    try:
        yield
    finally:
        torch.set_num_threads(threads)
        for name, (obj, attr, _, _) in tf32_knobs().items():
            setattr(obj, attr, saved[name])


def time_fn(fn: Callable[[], object], device: Device, budget_s: float,
            setup: Callable[[], object] | None = None) -> Summary:
    """A warm-up call and a probe call, then as many timed calls as fit in budget_s (3..500).

    One sample per call, so per-call dispatch and launch overhead is in every sample: at small
    sizes that overhead is what the lab shows.
    """
    for _ in range(2):  # the first call warms up (lazy init, caches); the second is the probe
        if setup:
            setup()
        t0 = time.perf_counter()
        fn()
        device.synchronize()
        probe = time.perf_counter() - t0
    repeats = int(min(500, max(3, budget_s / max(probe, 1e-6))))
    # a slow probe was warm-up enough
    return measure(fn, device, mode=LATENCY, warmup=0 if probe > 0.05 else 3, repeats=repeats, setup=setup,
                   max_time_s=budget_s)


def time_interleaved(fns: list[Callable[[], object]], device: Device, budget_s: float,
                     setups: list[Callable[[], object]] | None = None) -> list[Summary]:
    """Time several fns in alternation with core.timing.interleaved, ~budget_s each (3..500 rounds).

    On a shared machine a busy neighbour then slows every variant alike, so their ratio holds.
    `setups[i]` runs before each call of fns[i], outside the timed region.
    """
    setups = setups or [None] * len(fns)
    # warm-up, estimate
    probes = [time_fn(fn, device, budget_s / 10, setup=setup).median / 1e3
              for fn, setup in zip(fns, setups, strict=True)]
    repeats = int(min(500, max(3, budget_s / max(max(probes), 1e-6))))
    names = {str(i): fn for i, fn in enumerate(fns)}
    done = interleaved(names, repeats, device, setups={str(i): st for i, st in enumerate(setups) if st},
                       max_time_s=budget_s * len(fns))
    return [done.stats(str(i)) for i in range(len(fns))]


def stats_cols(st: Summary) -> dict[str, float | int]:
    """Timing columns of a table row (the number of samples, min, max and mean stay out: tables stay readable)."""
    return {"median_ms": st.median, "p10_ms": st.p10, "p90_ms": st.p90}


def rel_err(x: torch.Tensor, ref: torch.Tensor) -> float:
    """||x - ref|| / ||ref||, on x's device, in float64 if either side is float64 (else float32: enough for 1e-5)."""
    dtype = torch.float64 if torch.float64 in (x.dtype, ref.dtype) else torch.float32
    x, ref = x.detach().to(dtype), ref.detach().to(device=x.device, dtype=dtype)
    return float((x - ref).norm() / ref.norm().clamp_min(1e-30))


def cpu_peak_gflops(threads: int) -> float | None:
    """The CPU's FP32 spec peak, scaled to the physical cores `threads` can occupy."""
    peak, _ = peak_for(resolve_device("cpu"), "fp32")
    phys = cpu_cores()["physical"]
    return peak * min(threads, phys) / phys if peak else None


def _pct(x: float | None, peak: float | None) -> float | None:
    return 100 * x / peak if x is not None and peak else None


