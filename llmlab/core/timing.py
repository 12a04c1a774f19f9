"""Timing: warm-up, synchronise, CUDA events or perf_counter_ns, robust statistics.

Every timer returns a `core.stats.Summary` of per-call times in milliseconds.

References:
- torch.utils.benchmark (Timer.blocked_autorange): the right tool for sub-millisecond kernels,
  it picks the number of calls per block so timer overhead vanishes. `autorange` wraps it.
- CUDA events measure on the GPU's own clock, with no host sync inside the timed region.
- Stas Bekman's mamf-finder: flush L2 between repeats of a kernel whose data fits in cache.
- `interleaved`: methods compared on a shared machine take turns (a, b, b, a, a, b, ...), so a
  load drift hits every method alike and the per-round ratios stay honest.

Two kinds of row, and `measure` asks which one a lab means (`mode=`):
- LATENCY: one call from an idle stream. The device is synchronised before the call (after any
  `setup`), so a GPU sample holds the launch latency of the call's kernels: what one request
  waits for (a TTFT, one decode step, one sampler call).
- THROUGHPUT: a block of calls back to back, one timer (or CUDA event pair) per block, the
  sample = block time / calls. Each launch overlaps the previous call's work, as in a loop that
  keeps the device busy (a bandwidth or FLOP/s roof). `setup` runs once before each block.
A GPU sample's launch latency then depends on the mode, never on whether a setup kernel happened
to run before it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Mapping
from typing import NamedTuple

from llmlab.core.device import Device
from llmlab.core.stats import Summary, summary

LATENCY = "latency"  # one call from an idle (synchronised) stream: launch latency inside each sample
THROUGHPUT = "throughput"  # a block of calls back to back: launch latency overlapped, per call = block / calls
MODES = (LATENCY, THROUGHPUT)


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
    mode: str,
    warmup: int = 3,
    repeats: int = 10,
    setup: Callable[[], object] | None = None,
    max_time_s: float | None = None,
    min_block_s: float = 0.02,
    calls: int | None = None,
) -> Summary:
    """Time `fn()` after `warmup` calls: `repeats` samples, each a LATENCY or a THROUGHPUT sample.

    - mode=LATENCY: a sample is one call from an idle stream (`setup`, then a device synchronise,
      then the call between CUDA events on the device's stream, or perf_counter_ns on the CPU).
    - mode=THROUGHPUT: a sample is a block of calls back to back, its time / calls; the calls per
      block are `calls`, or picked from a probe so a block lasts at least `min_block_s`. `setup`
      runs before each block, untimed (it cannot run between calls of a block).
    `max_time_s` stops early (keeping at least 3 samples) when the samples are slow.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    with device.activate():
        for _ in range(warmup):
            if setup:
                setup()
            fn()
        device.synchronize()
        if mode == LATENCY:
            calls = 1
        elif calls is None:
            calls = calls_per_block(fn, device, min_block_s, setup)
        call = fn if calls == 1 else (lambda: [fn() for _ in range(calls)])
        samples: list[float] = []
        t_start = time.perf_counter()
        for _ in range(repeats):
            if setup:
                setup()
            device.synchronize()  # the stream is idle when the sample starts, whatever setup launched
            _, sec = timed_call(call, device)
            samples.append(sec * 1e3 / calls)
            if max_time_s and len(samples) >= 3 and time.perf_counter() - t_start > max_time_s:
                break
    return summary(samples)


def calls_per_block(fn: Callable[[], object], device: Device, min_block_s: float,
                    setup: Callable[[], object] | None = None) -> int:
    """Calls in a THROUGHPUT block: enough that one block lasts >= min_block_s, from one synchronised probe call."""
    if setup:
        setup()
    device.synchronize()
    t0 = time.perf_counter()
    fn()
    device.synchronize()
    return max(1, math.ceil(min_block_s / max(time.perf_counter() - t0, 1e-7)))


def timed_call(fn: Callable[[], object], device: Device) -> tuple[object, float]:
    """(fn's return value, seconds it took): CUDA events on the device's current stream, else perf_counter_ns.

    The events are recorded on `torch.cuda.current_stream(device)`, so with `--gpu 3` they bracket
    the work on GPU 3 even if another device is the current one. The caller synchronises before.
    """
    if device.is_cuda:
        import torch

        stream = torch.cuda.current_stream(device.torch)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record(stream)
        out = fn()
        end.record(stream)
        end.synchronize()
        return out, start.elapsed_time(end) / 1e3
    t0 = time.perf_counter_ns()
    out = fn()
    return out, (time.perf_counter_ns() - t0) / 1e9


def graph_replay(fn: Callable[[], object], device: Device, calls: int) -> Callable[[], None]:
    """`calls` calls of `fn` captured once in a CUDA graph; the returned callable replays them all.

    A replay launches the whole block with one host call, so kernels of a few microseconds run
    back to back on the GPU instead of waiting on the host's per-call dispatch (eager launches
    of sub-millisecond kernels time the dispatch, not the kernel). `fn` is warmed up on a side
    stream first, as torch.cuda.graphs requires; the tensors it touches must outlive the replay.
    """
    import torch

    with device.activate():  # torch.cuda.graph captures on the current device
        side = torch.cuda.Stream(device.torch)
        main = torch.cuda.current_stream(device.torch)
        side.wait_stream(main)
        with torch.cuda.stream(side):
            for _ in range(3):
                fn()
        main.wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(calls):
                fn()
    return graph.replay


class Interleaved(NamedTuple):
    """What `interleaved` returns; unpacks as `outputs, seconds = interleaved(...)`."""

    outputs: dict[str, object]  # method -> the return value of its untimed first pass
    seconds: dict[str, list[float]]  # method -> one wall time per round, in round order

    def stats(self, name: str) -> Summary:
        """Per-call time of `name` over the rounds, in ms."""
        return summary(s * 1e3 for s in self.seconds[name])

    def ratios(self, base: str, name: str) -> list[float]:
        """Per-round speed-up of `name` over `base` (base time / name time), paired round by round."""
        return [b / s for b, s in zip(self.seconds[base], self.seconds[name], strict=True)]


def interleaved(
    fns: Mapping[str, Callable[[], object]],
    repeats: int,
    device: Device,
    *,
    first: Mapping[str, Callable[[], object]] | None = None,
    setups: Mapping[str, Callable[[], object]] | None = None,
    max_time_s: float | None = None,
    min_rounds: int = 3,
    rounds: Callable[[Iterable[int]], Iterable[int]] | None = None,
) -> Interleaved:
    """Time several methods in turns: one untimed pass each, then `repeats` timed rounds.

    - The first pass calls `first[name]` (default: `fns[name]`) once per method, untimed: it warms
      up allocators and kernels and its return values come back (for identity checks, acceptance).
    - Round r calls every method once, in the given order when r is even and reversed when odd,
      so a load drift on a shared machine (and "who ran first" effects) hit every method alike.
    - Each call is a LATENCY sample: `setups[name]` runs first (untimed), then a device synchronise,
      then the call timed by `timed_call` (CUDA events on the device's current stream, or perf_counter_ns).
    - `max_time_s` stops after the round in which the timed rounds passed that budget, but never
      before `min_rounds` rounds. `rounds` wraps the round iterator (e.g. a progress bar).
    """
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    names = list(fns)
    setups = setups or {}
    first = first or fns
    with device.activate():
        outputs: dict[str, object] = {}
        for name in names:
            if name in setups:
                setups[name]()
            outputs[name] = first[name]()
        device.synchronize()
        seconds: dict[str, list[float]] = {name: [] for name in names}
        t_start = time.perf_counter()
        it: Iterable[int] = range(repeats)
        for r in rounds(it) if rounds else it:
            for name in names if r % 2 == 0 else reversed(names):
                if name in setups:
                    setups[name]()
                device.synchronize()
                _, sec = timed_call(fns[name], device)
                seconds[name].append(sec)
            if max_time_s is not None and r + 1 >= min_rounds and time.perf_counter() - t_start > max_time_s:
                break
    return Interleaved(outputs, seconds)


def autorange(fn: Callable[[], object], device: Device, *, min_run_time: float = 0.2) -> Summary:
    """Time a fast `fn` with torch.utils.benchmark.Timer.blocked_autorange: THROUGHPUT samples.

    Each sample is the mean per-call time of one block of many calls, so the statistics are
    over blocks (n = number of blocks). The Timer synchronises the *current* CUDA device, so the
    call runs with `device` made current (`Device.activate`): `--gpu 3` syncs GPU 3, not GPU 0.
    """
    from torch.utils import benchmark

    with device.activate():
        fn()  # warm-up: allocator, caches, lazy init
        device.synchronize()
        m = benchmark.Timer(stmt="fn()", globals={"fn": fn}, num_threads=_threads()).blocked_autorange(
            min_run_time=min_run_time
        )
    return summary(t * 1e3 for t in m.times)


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
