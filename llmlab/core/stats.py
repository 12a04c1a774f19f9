"""Statistics every lab shares: one summary of n values, the chi-square test of a sampler, and its power.

`Summary` is the one summary class: median, p10, p90, min, max and mean in the values' own unit,
which the producer names (`core.timing` returns per-call times in milliseconds; a lab summarising
tokens/s says so in its column names through `as_dict(prefix, suffix)`).

A sampler is judged against an exact law with Pearson's chi-square. A pass means little unless
the test could have failed: `detectable_effect` says how large a departure (Cohen's w) the
sample size detects with power 0.8, `samples_for_effect` how many samples a given w needs.

References:
- Cohen 1988, "Statistical Power Analysis for the Behavioral Sciences", ch. 7: the effect size
  w = sqrt(sum (p' - p)^2 / p) and the noncentral chi-square with lambda = n w^2.
- scipy.stats.chisquare, scipy.stats.ncx2.
- Cochran's rule: pool cells expected below 5 so the chi-square approximation holds.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass

SIGNIFICANCE = 1e-3  # a correct sampler fails a chi-square test with this probability: 1 run in 1,000


@dataclass(frozen=True)
class Summary:
    """Median, p10, p90, min, max, mean of n values, in the values' own unit (name the unit at the caller)."""

    median: float
    p10: float
    p90: float
    min: float
    max: float
    mean: float
    n: int

    def as_dict(self, prefix: str = "", suffix: str = "") -> dict[str, float]:
        """Flat keys with the unit attached by the caller: as_dict("latency_", "_ms") -> latency_median_ms, ...

        The count keeps its own name: {prefix}n, without the suffix.
        """
        return {f"{prefix}{k}{'' if k == 'n' else suffix}": v for k, v in asdict(self).items()}

    def divided(self, k: float) -> Summary:
        """Every value divided by k, n unchanged: per-call values of samples that each covered k calls."""
        return Summary(self.median / k, self.p10 / k, self.p90 / k, self.min / k, self.max / k, self.mean / k, self.n)


def quantile(sorted_xs: list[float], q: float) -> float:
    """Linear-interpolated quantile (numpy's default method) of sorted values, q in [0, 1]."""
    if len(sorted_xs) == 1:
        return sorted_xs[0]
    pos = q * (len(sorted_xs) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(sorted_xs) - 1)
    return sorted_xs[lo] + (sorted_xs[hi] - sorted_xs[lo]) * (pos - lo)


def summary(values: Iterable[float]) -> Summary:
    """Median, p10, p90, min, max, mean. Raises ValueError on no values."""
    xs = sorted(float(x) for x in values)
    if not xs:
        raise ValueError("no values to summarise")
    return Summary(median=statistics.median(xs), p10=quantile(xs, 0.10), p90=quantile(xs, 0.90),
                   min=xs[0], max=xs[-1], mean=statistics.fmean(xs), n=len(xs))


# ---------------------------------------------------------------- chi-square against an exact law


def chisquare_pvalue(counts: Mapping, law: Mapping, n: int) -> tuple[float, int]:
    """Pearson chi-square of observed `counts` (outcome -> count) against an exact `law` (outcome -> prob).

    Cells expected below 5 are pooled into one, together with anything observed outside the law's
    support (which a correct sampler never produces). Returns (p-value, cells tested).
    """
    from scipy import stats as sps

    obs, exp, pool_o, pool_e = [], [], 0, 0.0
    for key, pr in law.items():
        if pr * n >= 5:
            obs.append(counts.get(key, 0))
            exp.append(pr * n)
        else:
            pool_o += counts.get(key, 0)
            pool_e += pr * n
    pool_o += sum(c for k, c in counts.items() if k not in law)
    if pool_o > 0 or pool_e > 0:
        obs.append(pool_o)
        exp.append(max(pool_e, 1e-12))
    if len(obs) < 2:
        return 1.0, len(obs)
    scale = sum(obs) / sum(exp)  # float rounding of the law: expected and observed totals must agree
    return float(sps.chisquare(obs, [e * scale for e in exp]).pvalue), len(obs)


def _noncentrality(cells: int, significance: float, power: float) -> float:
    """The smallest lambda at which a chi-square test on `cells` cells rejects with `power`."""
    from scipy import stats as sps

    df = max(1, cells - 1)
    crit = sps.chi2.ppf(1 - significance, df)
    lam = 1.0
    while sps.ncx2.sf(crit, df, lam) < power:
        lam *= 1.02
    return lam


def power(cells: int, n: int, w: float, significance: float = SIGNIFICANCE) -> float:
    """Probability that n samples reject a law that is off by Cohen's w (noncentral chi-square, lambda = n w^2)."""
    from scipy import stats as sps

    df = max(1, cells - 1)
    return float(sps.ncx2.sf(sps.chi2.ppf(1 - significance, df), df, n * w**2))


def detectable_effect(cells: int, n: int, significance: float = SIGNIFICANCE, power: float = 0.8) -> float:
    """Cohen's w = sqrt(sum (p' - p)^2 / p) that n samples detect with `power` at `significance`."""
    return math.sqrt(_noncentrality(cells, significance, power) / n)


def samples_for_effect(cells: int, w: float = 0.1, significance: float = SIGNIFICANCE, power: float = 0.8) -> int:
    """Samples needed to detect Cohen's w with `power` at `significance` (noncentral chi-square)."""
    return math.ceil(_noncentrality(cells, significance, power) / w**2)


def cohens_w(p: Mapping, q: Mapping) -> float:
    """Cohen's w of law `p` against reference law `q`: sqrt(sum over q's support of (p - q)^2 / q)."""
    return math.sqrt(sum((p.get(k, 0.0) - qk) ** 2 / qk for k, qk in q.items() if qk > 0))
