"""Least-squares polynomial fits of a measured curve: time against prompt length or tokens generated.

One rule for every lab: y ~ c0 + c1 x + ... + c_d x^d, fitted on absolute error (each point's
residual counts as it is) or on relative error (weights 1 / y: a 16-token prompt's 20 ms counts as
much as a 4,096-token prompt's 2 s, so c0 is the fixed cost, not an artefact of the longest point),
optionally with every coefficient >= 0 (non-negative least squares: a time has no negative term).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class PolyFit:
    """A fitted polynomial: `coef[k]` multiplies x^k; the residuals describe how well it follows y."""

    coef: tuple[float, ...]  # ascending: c0 (the fixed cost), c1 (per x), c2 (per x^2) ...
    pred: np.ndarray  # the fit at each x
    ssr: float  # sum of squared residuals, in y's units squared (unweighted)
    r2: float  # 1 - ssr / total sum of squares (nan when y is constant)
    worst_rel_err: float  # the largest |fit - y| / y

    def at(self, x: float) -> float:
        return float(sum(c * x**k for k, c in enumerate(self.coef)))


def fit_poly(x, y, degree: int, *, relative: bool = False, nonneg: bool = False) -> PolyFit:
    """Fit y ~ sum_k c_k x^k for k <= degree by least squares (weights 1 / y when `relative`; every
    c_k >= 0 when `nonneg`). A relative fit needs y > 0."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    design = np.stack([x**k for k in range(degree + 1)], 1)  # (n, degree + 1)
    w = 1.0 / y if relative else np.ones_like(y)
    a = design * w[:, None]
    scale = np.linalg.norm(a, axis=0)  # unit columns, as numpy's polyfit: x^2 at 10^4 tokens is 10^8
    scale[scale == 0] = 1.0
    if nonneg:
        from scipy.optimize import nnls  # scipy only where a fit asks for it: it costs start-up time

        coef, _ = nnls(a / scale, y * w)
    else:
        coef, *_ = np.linalg.lstsq(a / scale, y * w, rcond=None)
    coef = coef / scale
    pred = design @ coef
    ssr = float(np.sum((y - pred) ** 2))
    ss_tot = float(np.sum((y - y.mean()) ** 2))
    worst = float(np.max(np.abs(pred - y) / y)) if (y > 0).all() else math.nan
    return PolyFit(tuple(float(c) for c in coef), pred, ssr, 1 - ssr / ss_tot if ss_tot > 0 else math.nan, worst)
