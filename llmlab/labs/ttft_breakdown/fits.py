"""TTFT against prompt length: the curve in-process (a + bT + cT^2) and the line at an endpoint (a + bT).

Both fit each length's fastest sample (contention on a shared machine only ever adds time) on
relative error (llmlab.core.fit), so a is the fixed cost and b the time per prompt token.
"""

from __future__ import annotations

import math

import numpy as np

from llmlab.core.fit import fit_poly


def growth_fit(x, y) -> dict:
    """y ~ a + bT + cT^2, every term >= 0 (a description, not a verdict), and where the T^2 term adds 10%
    to the linear one."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    a, b, c = fit_poly(x, y, 2, relative=True, nonneg=True).coef
    if c * x.max() ** 2 <= 1e-9 * y.max():  # round-off, not a T^2 term
        c = 0.0
    n10 = 0.1 * b / c if c > 0 else math.inf
    return {"a_ms": a, "b_ms_per_tok": b, "c_ms_per_tok2": c, "t2_adds_10pct_at_tokens": n10}


def growth_at(fit: dict, t: float) -> float:
    """The growth fit's TTFT at t prompt tokens, ms."""
    return fit["a_ms"] + fit["b_ms_per_tok"] * t + fit["c_ms_per_tok2"] * t * t


def linear_fit(x, y) -> dict:
    """y = a + b x (ms, tokens); tok_per_s = 1000 / b; worst_rel_err = the largest |fit - y| / y: a line or a
    curve. NaN everywhere when fewer than two distinct lengths or a time <= 0 leave it undetermined."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    if len(x) < 2 or np.ptp(x) == 0 or (y <= 0).any():
        return {"a_ms": math.nan, "b_ms_per_tok": math.nan, "tok_per_s": math.nan, "worst_rel_err": math.nan}
    f = fit_poly(x, y, 1, relative=True)
    a, b = f.coef
    return {"a_ms": a, "b_ms_per_tok": b, "tok_per_s": 1e3 / b if b > 0 else math.nan, "worst_rel_err": f.worst_rel_err}
