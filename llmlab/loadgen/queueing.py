"""Queueing theory for one server, first come first served.

M/D/1 mean wait Wq = rho / (2 mu (1 - rho)) = rho D / (2 (1 - rho)) (Pollaczek-Khinchine with
deterministic service D = 1/mu); M/M/1 Wq = rho D / (1 - rho). M/G/1 (any service distribution):
Wq = lambda E[S^2] / (2 (1 - rho)). Lindley's recursion W[k] = max(0, W[k-1] + S[k-1] - (A[k] - A[k-1]))
gives the exact FCFS waits of any arrival sequence A and service times S.
"""

from __future__ import annotations

import math

import numpy as np


def md1_wait(rho: float, service_s: float) -> float:
    """M/D/1 mean queue wait (s): rho D / (2 (1 - rho)); inf at rho >= 1."""
    return rho * service_s / (2 * (1 - rho)) if rho < 1 else math.inf


def mm1_wait(rho: float, service_s: float) -> float:
    """M/M/1 mean queue wait (s): rho D / (1 - rho); inf at rho >= 1."""
    return rho * service_s / (1 - rho) if rho < 1 else math.inf


def lindley(arrivals_s, services_s) -> np.ndarray:
    """Exact FCFS single-server waits for these arrival times and service times (s)."""
    a, s = np.asarray(arrivals_s, float), np.asarray(services_s, float)
    w = np.zeros(len(a))
    for k in range(1, len(a)):
        w[k] = max(0.0, w[k - 1] + s[k - 1] - (a[k] - a[k - 1]))
    return w


def mg1_wait(rate: float, services_s) -> float:
    """M/G/1 mean queue wait (s), Pollaczek-Khinchine: lambda E[S^2] / (2 (1 - rho)); inf at rho >= 1."""
    s = np.asarray(services_s, float)
    rho = rate * s.mean()
    return rate * float(np.mean(s * s)) / (2 * (1 - rho)) if rho < 1 else math.inf


def finite_run_waits(rate: float, services_s, n: int, reps: int, rng: np.random.Generator) -> dict[str, float]:
    """Queue waits of n Poisson arrivals into an EMPTY single-server FCFS queue, over `reps` simulated runs.

    Service times are drawn from `services_s` (one value: M/D/1; measured samples: M/G/1 with the
    measured distribution). A short run starts empty and never reaches the steady state the
    formulas describe (the relaxation time grows like D / (1 - rho)^2), so this is the fair
    expectation for n requests.
    """
    gaps = rng.exponential(1.0 / rate, size=(reps, n))  # (R, n)
    svc = rng.choice(np.atleast_1d(np.asarray(services_s, float)), size=(reps, n))  # (R, n)
    w = np.zeros((reps, n))
    for k in range(1, n):
        w[:, k] = np.maximum(0.0, w[:, k - 1] + svc[:, k - 1] - gaps[:, k])
    return {"mean_s": float(w.mean()), "p50_s": float(np.median(w)), "p90_s": float(np.quantile(w, 0.9)),
            "p99_s": float(np.quantile(w, 0.99))}
