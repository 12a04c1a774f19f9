"""Sampling: from a row of logits over the vocabulary to one token, batched over (B, V).

Logits processors (each returns logits with the removed tokens at -inf):
    temperature -> top_k -> top_p -> min_p        (the order Hugging Face applies them)
Samplers (each returns token ids, (B,)):
    greedy, sample_multinomial, sample_gumbel, top_p_sorting_free, top_k_sorting_free

A row with no token left (every logit -inf, or NaN; as probabilities: all zero or NaN) has no
distribution to sample from. Every entry point raises one ValueError for it (`NoTokenError`),
naming the row, instead of NaN, a raw torch error or token 0.

`SamplingParams` is what a caller asks for (the decode loop, the engine's requests, speculative
decoding): temperature 0 is greedy, otherwise the processors above in HF's order.

References:
- Holtzman et al. 2019, "The Curious Case of Neural Text Degeneration" (top-p / nucleus).
- Fan et al. 2018, "Hierarchical Neural Story Generation" (top-k).
- Nguyen et al. 2024, "Turning Up the Heat: Min-p Sampling for Creative and Coherent LLM Outputs".
- transformers `generation/logits_process.py`: TemperatureLogitsWarper, TopKLogitsWarper,
  TopPLogitsWarper, MinPLogitsWarper. The kept sets here equal theirs, ties included: top-p
  follows the same ascending sort and cumulative sum, so the float rounding at the cut matches.
- Gumbel-max / exponential race: argmax_i p_i / E_i with E_i ~ Exp(1) is a sample from p
  (Maddison et al. 2014, "A* Sampling"); no cumulative sum, no host sync.
- FlashInfer, "Sorting-Free GPU Kernels for LLM Sampling" (2025) and
  include/flashinfer/sampling.cuh: top-p / top-k by rejection with two pivots instead of a sort;
  proposals by inverse CDF over {p > low}, one uniform per row per round. Here in eager torch,
  with finished rows dropped between rounds.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

NEG_INF = float("-inf")


@dataclass(frozen=True)
class SamplingParams:
    """How to choose a token: temperature 0 = greedy; otherwise HF's order: temperature, top-k, top-p, min-p.

    top_k 0, top_p 1.0 and min_p 0.0 are off. Out-of-range values raise ValueError naming the field.
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0

    def __post_init__(self):
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 = off), got {self.top_k}")
        if not 0.0 <= self.min_p <= 1.0:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        """logits (B, V) -> the processed distribution (B, V) these parameters sample from (temperature > 0)."""
        return probs(logits, temperature=self.temperature, top_k=self.top_k, top_p=self.top_p, min_p=self.min_p)


# ----------------------------------------------------------------------------- checks


def _check_min_keep(min_tokens_to_keep: int) -> None:
    if not isinstance(min_tokens_to_keep, int) or min_tokens_to_keep < 1:
        raise ValueError(f"min_tokens_to_keep must be a positive integer, got {min_tokens_to_keep!r}")


def _check_2d(x: torch.Tensor) -> None:
    if x.dim() != 2:
        raise ValueError(f"expected a (B, V) tensor, got shape {tuple(x.shape)}")


class NoTokenError(ValueError):
    """A row has no token left to sample: every logit is -inf (or NaN), or every probability is 0."""


def _raise_empty_rows(bad: torch.Tensor) -> None:
    """bad: (...) bool, one per row. One host sync: raise NoTokenError naming the first bad row."""
    if bool(bad.any()):
        rows = bad.reshape(-1).nonzero()[:, 0].tolist()
        more = f" (and {len(rows) - 1} more)" if len(rows) > 1 else ""
        raise NoTokenError(f"row {rows[0]}{more} has no token to sample: every logit is -inf "
                           "(or NaN; as probabilities: all 0 or NaN). Were all tokens masked?")


def _check_logit_rows(row_max: torch.Tensor) -> None:
    """row_max (...): each row's largest logit. -inf (every token masked) or NaN leaves nothing to sample."""
    _raise_empty_rows(~(row_max > NEG_INF))


def _check_prob_rows(row_sum: torch.Tensor) -> None:
    """row_sum (...): each row's total probability (or its largest). 0 or NaN leaves nothing to sample."""
    _raise_empty_rows(~(row_sum > 0))


# ----------------------------------------------------------------------------- processors


def greedy(logits: torch.Tensor) -> torch.Tensor:
    """(B, V) -> (B,) the argmax token ids (the first one on ties)."""
    top, ids = logits.max(dim=-1)  # (B,), (B,): one pass gives the check's maximum for free
    _check_logit_rows(top)
    return ids


def temperature(logits: torch.Tensor, t: float) -> torch.Tensor:
    """Divide the logits by t > 0: t < 1 sharpens, t > 1 flattens. t -> 0 is greedy."""
    if not t > 0:
        raise ValueError(f"temperature must be > 0 (temperature 0 is greedy decoding: use greedy()), got {t}")
    _check_logit_rows(logits.amax(dim=-1))
    return logits / t


def top_k(logits: torch.Tensor, k: int, min_tokens_to_keep: int = 1) -> torch.Tensor:
    """Keep the k highest logits per row (all tokens tied with the k-th are kept), the rest at -inf."""
    if not isinstance(k, int) or k < 1:
        raise ValueError(f"top_k must be a positive integer, got {k!r}")
    _check_min_keep(min_tokens_to_keep)
    k = min(max(k, min_tokens_to_keep), logits.size(-1))
    vals = torch.topk(logits, k, dim=-1).values  # (B, k) descending
    _check_logit_rows(vals[..., 0])
    kth = vals[..., -1:]  # (B, 1) the k-th largest logit
    return logits.masked_fill(logits < kth, NEG_INF)


def top_p(logits: torch.Tensor, p: float, min_tokens_to_keep: int = 1) -> torch.Tensor:
    """Keep the smallest set of most likely tokens whose probability adds up to at least p.

    Sorted ascending, a token is removed when the mass at or below it is <= 1 - p, i.e. when the
    tokens strictly more likely than it already hold >= p. The top min_tokens_to_keep always stay.
    """
    p = float(p)
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"top_p must be in [0, 1], got {p}")
    _check_min_keep(min_tokens_to_keep)
    sorted_logits, order = torch.sort(logits, descending=False)  # (B, V) ascending
    _check_logit_rows(sorted_logits[..., -1])
    cum = sorted_logits.softmax(dim=-1).cumsum(dim=-1)  # (B, V) mass at or below each token
    remove_sorted = cum <= (1.0 - p)
    remove_sorted[..., -min_tokens_to_keep:] = False
    remove = remove_sorted.scatter(-1, order, remove_sorted)  # back to vocabulary order
    return logits.masked_fill(remove, NEG_INF)


def min_p(logits: torch.Tensor, p: float, min_tokens_to_keep: int = 1) -> torch.Tensor:
    """Keep tokens whose probability is at least p times the top token's probability."""
    p = float(p)
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"min_p must be in [0, 1], got {p}")
    _check_min_keep(min_tokens_to_keep)
    pr = logits.softmax(dim=-1)  # (B, V)
    top = pr.amax(dim=-1, keepdim=True)  # (B, 1); NaN where the row is all -inf
    _check_prob_rows(top[..., 0])
    remove = pr < p * top
    keep_top = torch.topk(pr, min(min_tokens_to_keep, pr.size(-1)), dim=-1).indices
    remove.scatter_(-1, keep_top, False)
    return logits.masked_fill(remove, NEG_INF)


def validate(
    temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0, min_tokens_to_keep: int = 1
) -> None:
    """Raise ValueError with one clear line on a bad setting (0 / 1.0 / 0.0 mean off)."""
    if not temperature > 0:
        raise ValueError(
            f"temperature must be > 0, got {temperature} (temperature 0 means greedy decoding: use greedy)"
        )
    if not isinstance(top_k, int) or isinstance(top_k, bool) or top_k < 0:
        raise ValueError(f"top_k must be a non-negative integer (0 = off), got {top_k!r}")
    if not 0.0 < float(top_p) <= 1.0:
        raise ValueError(f"top_p must be in (0, 1] (1.0 = off), got {top_p}")
    if not 0.0 <= float(min_p) <= 1.0:
        raise ValueError(f"min_p must be in [0, 1] (0.0 = off), got {min_p}")
    _check_min_keep(min_tokens_to_keep)


def process_logits(
    logits: torch.Tensor,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    min_p: float = 0.0,
    min_tokens_to_keep: int = 1,
) -> torch.Tensor:
    """Temperature, top-k, top-p, min-p in Hugging Face's order; 1.0 / 0 / 1.0 / 0.0 switch one off."""
    validate(temperature, top_k, top_p, min_p, min_tokens_to_keep)
    out = logits
    if temperature == 1.0 and top_k == 0 and top_p == 1.0 and min_p == 0.0:
        _check_logit_rows(logits.amax(dim=-1))  # every step is off: check here (each one checks its input)
    if temperature != 1.0:
        out = _temperature(out, temperature)
    if top_k > 0:
        out = _top_k(out, top_k, min_tokens_to_keep)
    if top_p < 1.0:
        out = _top_p(out, top_p, min_tokens_to_keep)
    if min_p > 0.0:
        out = _min_p(out, min_p, min_tokens_to_keep)
    return out


# process_logits' keyword names shadow the functions; keep module-level aliases for it.
_temperature, _top_k, _top_p, _min_p = temperature, top_k, top_p, min_p


def probs(logits: torch.Tensor, **kwargs) -> torch.Tensor:
    """Softmax of process_logits(logits, **kwargs) in float32: (B, V), removed tokens at 0."""
    return process_logits(logits.float(), **kwargs).softmax(dim=-1)


# ----------------------------------------------------------------------------- samplers


def sample_multinomial(probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """(B, V) probabilities -> (B,) token ids with torch.multinomial (inverse CDF per row)."""
    _check_2d(probs)
    _check_prob_rows(probs.sum(dim=-1))
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


def _exponential(like: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """Exp(1) noise shaped like `like` (float32).

    On the CPU, Tensor.exponential_ is serial (~25 ns an element) while uniform_ + log runs on
    all threads, 3-5x faster for a large (B, V); below ~64K elements the thread pool's wake-up
    costs more than the work, so small tensors take exponential_. U is clamped away from 0, so
    no E is infinite (a key of 0 could never win the race).
    """
    out = torch.empty_like(like, dtype=torch.float32)
    if like.is_cuda or like.numel() <= _SERIAL_NOISE_MAX:
        return out.exponential_(generator=generator)
    return out.uniform_(generator=generator).clamp_min_(torch.finfo(torch.float32).tiny).log_().neg_()


_SERIAL_NOISE_MAX = 1 << 16


def sample_gumbel(
    logits_or_probs: torch.Tensor, generator: torch.Generator | None = None, *, is_probs: bool | None = None
) -> torch.Tensor:
    """(B, V) -> (B,) by the exponential race: argmax_i p_i / E_i, E_i ~ Exp(1) (= Gumbel-max).

    Logits go through a softmax first (argmax softmax(x) / E = argmax x - log E, without a
    log over (B, V)). `is_probs=None` decides on the device (rows non-negative and summing to
    1), so there is no host sync either way; pass True/False to skip that check.
    """
    _check_2d(logits_or_probs)
    x = logits_or_probs.float()
    if is_probs is None:
        looks_like_probs = (x >= 0).all() & ((x.sum(dim=-1) - 1).abs() < 1e-3).all()  # 0-d, on the device
        pr = torch.where(looks_like_probs, x, x.softmax(dim=-1))
    else:
        pr = x if is_probs else x.softmax(dim=-1)
    _check_prob_rows(pr.sum(dim=-1))  # the softmax of an all -inf row is NaN; all-zero probabilities sum to 0
    return (pr / _exponential(pr, generator)).argmax(dim=-1)


def sample(
    logits: torch.Tensor, *, generator: torch.Generator | None = None, method: str = "multinomial", **kwargs
) -> torch.Tensor:
    """One sampling step, (B, V) logits -> (B,) ids; kwargs are process_logits'. temperature=0 is greedy.

    method: "multinomial" (softmax + torch.multinomial) or "gumbel" (exponential race).
    """
    if kwargs.get("temperature", 1.0) == 0:
        return greedy(logits)
    pr = probs(logits, **kwargs)
    if method == "multinomial":
        return sample_multinomial(pr, generator)
    if method == "gumbel":
        return sample_gumbel(pr, generator, is_probs=True)
    raise ValueError(f"method must be 'multinomial' or 'gumbel', got {method!r}")


# ----------------------------------------------------------------------------- sorting-free


def _pivot_search(
    probs: torch.Tensor,
    accept_fn,
    generator: torch.Generator | None,
    max_rounds: int,
    fallback_fn,
) -> tuple[torch.Tensor, int]:
    """Rejection sampling with two pivots, FlashInfer's loop in eager torch (see top_p_sorting_free).

    accept_fn(mass_gt, above) -> bool (A,): is a token with `mass_gt` probability strictly above
    it (and `above`, the (A, V) mask of those tokens) in the kept set? Returns (ids (B,), rounds).
    Rows are compacted as they finish, so later rounds only touch the few rows still searching.
    """
    _check_2d(probs)
    P = probs.float()
    _check_prob_rows(P.sum(dim=-1))
    B, V = P.shape
    out = torch.empty(B, dtype=torch.long, device=P.device)
    rows = torch.arange(B, device=P.device)  # (A,) the rows still searching
    low = high = None  # (A, 1): every kept token has p > low; the cut is at most high
    rounds = 0
    while rounds < max_rounds:
        rounds += 1
        # propose j ~ p restricted to {p > low}: inverse CDF, one uniform per row
        cdf = (P if low is None else torch.where(P > low, P, 0.0)).cumsum(dim=-1)  # (A, V)
        u = torch.rand(P.size(0), 1, generator=generator, device=P.device) * cdf[:, -1:]
        j = torch.searchsorted(cdf, u, right=True).clamp_max_(V - 1)  # (A, 1)
        pivot0 = P.gather(-1, j)  # (A, 1)
        # a proposal at or below low can only come from float rounding at the top of the CDF: redraw it
        valid = (pivot0 > (0.0 if low is None else low))[:, 0]
        above0 = P > pivot0  # (A, V)
        ok = valid & accept_fn(_mass(P, above0), above0)
        out[rows[ok]] = j[ok, 0]
        rejected = ~ok
        if not bool(rejected.any()):
            return out, rounds
        # pivot0 is not kept, so nothing at or below it is: low = pivot0. The second pivot,
        # halfway to `high`: if it is kept the cut lies in (pivot0, pivot1], else nothing at or
        # below pivot1 is kept either, so the interval holding the cut at least halves.
        rows, P, pivot0, valid = rows[rejected], P[rejected], pivot0[rejected], valid[rejected]
        if high is None:
            high, low = P.amax(dim=-1, keepdim=True), torch.zeros_like(pivot0)
        else:
            high, low = high[rejected], low[rejected]
        pivot1 = (pivot0 + high) * 0.5
        above1 = P > pivot1
        ok1 = accept_fn(_mass(P, above1), above1)[:, None]
        new_low, new_high = torch.where(ok1, pivot0, pivot1), torch.where(ok1, pivot1, high)
        keep = ~valid[:, None]  # a redrawn row keeps its interval
        low, high = torch.where(keep, low, new_low), torch.where(keep, high, new_high)
    # a pathological row (e.g. many exact ties) after max_rounds: finish it exactly
    out[rows] = fallback_fn(P)
    return out, rounds


def _mass(P: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(A, V), (A, V) bool -> (A,) the probability mass under the mask."""
    return torch.where(mask, P, 0.0).sum(dim=-1)  # 2x faster than P * mask (no bool -> float copy)


def top_p_sorting_free(
    probs: torch.Tensor,
    p: float,
    generator: torch.Generator | None = None,
    min_tokens_to_keep: int = 1,
    max_rounds: int = 64,
    return_rounds: bool = False,
):
    """Sample from the top-p renormalised distribution without sorting: (B, V) probs -> (B,) ids.

    A token j is in the top-p set S iff the tokens strictly more likely than j hold < p of the
    mass (the same set as top_p(), up to ties at the cut). Rejection sampling (FlashInfer):
      round: propose j ~ p restricted to {p_i > low} (inverse CDF: a cumsum and a binary search,
      one uniform per row). If mass(p > p_j) < p, j is in S: accept it; accepted proposals are
      distributed as p restricted to S. Else every token with p_i <= p_j is out: low = p_j.
      A second pivot halfway to `high` (the dual pivot) halves the interval holding the cut
      each round, so rounds stay few even when proposals keep landing just below it.
    Each round is a few passes over V (cumsum, compare, masked sum), no O(V log V) sort. A
    proposal is accepted with chance mass(S) / mass(p > low) >= p, so rounds ~ 1/p; rows that
    finish are dropped, so round 2 touches only the ~(1 - p) of rows that need it.
    """
    p = float(p)
    if not 0.0 < p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], got {p}")
    _check_min_keep(min_tokens_to_keep)

    def accept(mass_gt, above):
        ok = mass_gt < p
        if min_tokens_to_keep > 1:
            ok |= above.sum(-1) < min_tokens_to_keep
        return ok

    def fallback(rows_probs):
        return _race_in_set(rows_probs, top_p(rows_probs.log(), p, min_tokens_to_keep), generator)

    ids, rounds = _pivot_search(probs, accept, generator, max_rounds, fallback)
    return (ids, rounds) if return_rounds else ids


def top_k_sorting_free(
    probs: torch.Tensor,
    k: int,
    generator: torch.Generator | None = None,
    method: str = "window",
    max_rounds: int = 64,
    return_rounds: bool = False,
):
    """Sample from the top-k renormalised distribution without sorting: (B, V) probs -> (B,) ids.

    Token j is in the top-k set iff fewer than k tokens are strictly more likely (ties at the
    k-th kept, as TopKLogitsWarper does).
    method="window": torch.topk's partial selection (O(V), no full sort) gives the k-token
      window; the race runs over those k only. Rows where tokens tied with the k-th fall outside
      the window (exact ties) race over every token >= the k-th instead.
    method="pivot": FlashInfer's dual-pivot rejection on counts, as in top_p_sorting_free. On a
      GPU it is one kernel; in eager torch each round is a pass over V, and a small k in a large
      flat vocabulary takes many rounds, so the window is the CPU default.
    """
    if not isinstance(k, int) or k < 1:
        raise ValueError(f"top_k must be a positive integer, got {k!r}")
    _check_2d(probs)
    _check_prob_rows(probs.float().sum(dim=-1))
    if k >= probs.size(-1):
        ids = sample_gumbel(probs, generator, is_probs=True)
        return (ids, 0) if return_rounds else ids
    if method == "window":
        ids = _top_k_window(probs.float(), k, generator)
        return (ids, 1) if return_rounds else ids
    if method != "pivot":
        raise ValueError(f"method must be 'window' or 'pivot', got {method!r}")

    def accept(_mass_gt, above):
        return above.sum(-1) < k

    def fallback(rows_probs):
        return _race_in_set(rows_probs, top_k(rows_probs.log(), k), generator)

    ids, rounds = _pivot_search(probs, accept, generator, max_rounds, fallback)
    return (ids, rounds) if return_rounds else ids


def _top_k_window(P: torch.Tensor, k: int, generator) -> torch.Tensor:
    vals, idx = torch.topk(P, k, dim=-1, sorted=False)  # (B, k) the window, unordered
    kth = vals.amin(dim=-1, keepdim=True)  # (B, 1) the k-th largest probability
    j = (vals / _exponential(vals, generator)).argmax(dim=-1, keepdim=True)  # race inside the window
    ids = idx.gather(-1, j)[:, 0]
    ties_outside = (P >= kth).sum(-1) > k  # (B,) exact ties at the k-th beyond the window
    if bool(ties_outside.any()):
        rows = ties_outside.nonzero()[:, 0]
        ids[rows] = sample_gumbel(torch.where(P[rows] >= kth[rows], P[rows], 0.0), generator, is_probs=True)
    return ids


def _race_in_set(rows_probs: torch.Tensor, kept_logits: torch.Tensor, generator) -> torch.Tensor:
    """Exact fallback: exponential race over the kept set found by the sort-based processor."""
    masked = torch.where(torch.isfinite(kept_logits), rows_probs, 0.0)
    return sample_gumbel(masked, generator, is_probs=True)
