"""Arrival schedules and a single FCFS worker that plays them.

Arrivals: a Poisson process (exponential gaps of mean 1/rate) or a burst. `run_fcfs` plays a fixed
schedule on one thread: idle, it sleeps until the next arrival; busy, the next request waits, and its
send time stays its arrival time, so the wait is counted as queueing.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from llmlab.loadgen.metrics import Trace

now_ns = time.perf_counter_ns


def poisson_offsets(rate: float, n: int, rng: np.random.Generator) -> np.ndarray:
    """Arrival times (s from the start) of a Poisson process: exponential gaps of mean 1/rate."""
    if rate <= 0:
        raise ValueError("the arrival rate must be > 0 requests/s")
    return np.cumsum(rng.exponential(1.0 / rate, size=n))


def burst_offsets(n: int) -> np.ndarray:
    """n requests that all arrive at once."""
    return np.zeros(n)


def sleep_until(t_ns: int, spin_ns: int = 2_000_000) -> None:
    """Sleep to `spin_ns` before t_ns, then spin: time.sleep overshoots by ~0.1 ms idle, by
    milliseconds on a loaded machine, and the overshoot would count as queue wait."""
    while (left := t_ns - now_ns()) > 0:
        if left > spin_ns:
            time.sleep((left - spin_ns) / 1e9)


def run_fcfs(offsets_s, serve_one: Callable[[int], Trace], lead_s: float = 0.005) -> list[Trace]:
    """One worker, first come first served: request k arrives at t0 + offsets_s[k].

    The schedule is fixed in advance; a single thread plays both the arrivals and the worker: when
    idle it sleeps until the next arrival, when busy the next request waits (its send time stays
    its arrival time). `serve_one(send_ns)` serves one request and returns its Trace.
    """
    t0 = now_ns() + int(lead_s * 1e9)
    traces = []
    for off in sorted(float(o) for o in offsets_s):
        arrival = t0 + int(off * 1e9)
        sleep_until(arrival)  # returns at once when the worker is late (the request queued)
        traces.append(serve_one(arrival))
    return traces
