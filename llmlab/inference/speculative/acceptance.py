"""The acceptance rule: a drafted token is kept with probability min(1, p / q), a rejection draws from the
residual norm(max(0, p - q)), and a fully accepted draft earns a bonus token from p (Leviathan; Chen).

Every function here is pure in the models: it takes the target's (and the draft's) distributions and
returns how many drafted tokens are accepted and the token that comes next. Greedy verification is
the temperature-0 limit: accept while the draft equals the target's argmax.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from llmlab.inference import sampling
from llmlab.inference.decode import SamplingParams

# ---------------------------------------------------------------- distributions


def probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """logits (..., V) -> processed probabilities (..., V): temperature, top-k, top-p, min-p, alike for p and q."""
    shape = logits.shape
    p = sampling.probs(logits.reshape(-1, shape[-1]), temperature=params.temperature, top_k=params.top_k,
                       top_p=params.top_p, min_p=params.min_p)
    return p.reshape(shape)


def beta(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Leviathan's acceptance probability of one drafted position: sum_x min(p, q). (..., V) -> (...)."""
    return torch.minimum(p, q).sum(-1)


def one_hot_q(drafts: torch.Tensor, vocab: int) -> torch.Tensor:
    """A deterministic draft as a proposal distribution: (B, g) -> (B, g, V) one-hot. Verified with it,
    x is accepted with probability p(x) and a rejection draws from norm(max(0, p - onehot(x)))."""
    return torch.nn.functional.one_hot(drafts, vocab).float()


# Every random choice of the loops goes through these two functions. `generator` is a torch.Generator
# (or None), or any object with `categorical(probs, k)` and `bernoulli(p)`: the tests pass one that walks
# every branch with its exact probability, so the real loops' output law can be enumerated.


def draw(p: torch.Tensor, generator=None, k: int = 1) -> torch.Tensor:
    """k i.i.d. draws from each row of p (R, V) -> (R, k) token ids."""
    if hasattr(generator, "categorical"):
        return generator.categorical(p, k)
    return torch.multinomial(p, k, replacement=True, generator=generator)


def coin(p: torch.Tensor, generator=None) -> torch.Tensor:
    """Independent Bernoulli(p) for each element of p (...) -> bool (...)."""
    if hasattr(generator, "bernoulli"):
        return generator.bernoulli(p)
    return torch.rand(p.shape, generator=generator, device=p.device) < p


# ---------------------------------------------------------------- one chain of drafted tokens


def rejection_plan(draft_tokens: torch.Tensor, draft_probs: torch.Tensor, target_probs: torch.Tensor):
    """The exact law of one verification, without drawing anything.

    draft_tokens (B, g) drawn from draft_probs (B, g, V); target_probs (B, g + 1, V).
    Returns accept (B, g) = min(1, p(x_i) / q(x_i)) and next_dist (B, g + 1, V): row i < g is the
    residual norm(max(0, p_i - q_i)) sampled at a rejection at i, row g is p_g (the bonus token).
    """
    g = draft_tokens.shape[1]
    x = draft_tokens.unsqueeze(-1)  # (B, g, 1)
    px = target_probs[:, :g].gather(-1, x).squeeze(-1)  # (B, g)
    qx = draft_probs.gather(-1, x).squeeze(-1)  # (B, g), > 0 for a token drawn from q
    accept = torch.where(px >= qx, torch.ones_like(px), px / qx.clamp_min(torch.finfo(qx.dtype).tiny))
    residual = (target_probs[:, :g] - draft_probs).clamp_min(0)  # (B, g, V)
    mass = residual.sum(-1, keepdim=True)
    # mass 0 means p == q there: accept is then 1 and the residual is never drawn; keep p as a valid row
    residual = torch.where(mass > 0, residual / mass.clamp_min(torch.finfo(mass.dtype).tiny), target_probs[:, :g])
    return accept, torch.cat([residual, target_probs[:, g:]], dim=1)


def verify_rows(draft_tokens, draft_probs, target_probs, generator: torch.Generator | None = None):
    """Rejection sampling on B rows at once: (B, g), (B, g, V), (B, g + 1, V) -> n_accepted (B,), next (B, 1)."""
    accept, next_dist = rejection_plan(draft_tokens, draft_probs, target_probs)
    n = coin(accept, generator).int().cumprod(dim=1).sum(dim=1)  # accepted prefix length, (B,)
    rows = torch.arange(n.shape[0], device=n.device)
    return n, draw(next_dist[rows, n], generator)


def verify(draft_tokens: torch.Tensor, draft_probs: torch.Tensor, target_probs: torch.Tensor,
           generator: torch.Generator | None = None) -> tuple[int, int]:
    """Leviathan / Chen verification of one draft: (g,), (g, V), (g + 1, V) -> (n_accepted, next_token).

    Accept x_i with probability min(1, p_i(x_i) / q_i(x_i)) until the first rejection; there draw
    from norm(max(0, p - q)); when all g are accepted, draw a bonus token from p_g. The emitted
    tokens x_1..x_n, next are distributed exactly as g + 1 tokens drawn from the target.
    """
    n, nxt = verify_rows(draft_tokens.unsqueeze(0), draft_probs.unsqueeze(0), target_probs.unsqueeze(0), generator)
    return int(n[0]), int(nxt[0, 0])


def verify_greedy_rows(draft_tokens: torch.Tensor, target_logits: torch.Tensor):
    """Greedy verification: (B, g), (B, g + 1, V) -> n_accepted (B,), next (B, 1) = the target's argmax there."""
    best = target_logits.argmax(dim=-1)  # (B, g + 1)
    g = draft_tokens.shape[1]
    n = (draft_tokens == best[:, :g]).int().cumprod(dim=1).sum(dim=1)
    return n, best.gather(1, n.unsqueeze(1))


def verify_greedy(draft_tokens: torch.Tensor, target_logits: torch.Tensor) -> tuple[int, int]:
    """(g,), (g + 1, V) -> (n_accepted, next_token): accept while the draft equals the target's argmax."""
    n, nxt = verify_greedy_rows(draft_tokens.unsqueeze(0), target_logits.unsqueeze(0))
    return int(n[0]), int(nxt[0, 0])


def verify_round(drafts: torch.Tensor, q: torch.Tensor | None, logits: torch.Tensor, params: SamplingParams,
                 generator=None) -> tuple[torch.Tensor, torch.Tensor]:
    """One round's verification of drafts (B, g) against the target's logits (B, g + 1, V): (n (B,), next (B, 1)).

    Greedy params: `verify_greedy_rows`. Sampled: `verify_rows` with the draft's q (B, g, V); with g = 0
    (nothing drafted) the round is a plain step that draws the next token from p.
    """
    if params.greedy:
        return verify_greedy_rows(drafts, logits)
    p = probs(logits, params)
    if drafts.shape[1] == 0:
        return torch.zeros(drafts.shape[0], dtype=torch.long, device=logits.device), draw(p[:, 0], generator)
    return verify_rows(drafts, q, p, generator)


def min_rule(drafts: torch.Tensor, n: torch.Tensor, nxt: torch.Tensor) -> tuple[torch.Tensor, list[int], int]:
    """A batch advances by its smallest accepted count m: returns (emitted (B, m + 1), n as a list, m).

    A row that accepted more than m emits its own (accepted) draft token at position m, which is still a
    correct sample: the decision to stop depends only on earlier positions. `n.tolist()` is the round's one
    host sync.
    """
    n_list = n.tolist()
    m = min(n_list)
    if m < max(n_list):
        nxt = torch.where((n > m).unsqueeze(1), drafts[:, m : m + 1], nxt)
    return torch.cat([drafts[:, :m], nxt], dim=1), n_list, m


# ---------------------------------------------------------------- one node of a token tree


def multi_candidate_verify(p: torch.Tensor, candidates: Sequence[int], generator: torch.Generator | None = None,
                           proposal: torch.Tensor | None = None):
    """Multi-candidate speculative sampling at one tree node under the target's p (V,).

    proposal None (EAGLE): the candidates are deterministic (the draft's top-k), each a one-hot
    proposal: accept c_i with probability p'(c_i); on rejection remove c_i from p' and renormalise.
    proposal q (SpecInfer): the candidates were drawn i.i.d. from q: accept c_i with probability
    min(1, p'(c_i) / q(c_i)); on rejection p' <- norm(max(0, p' - q)).
    Either way each step is a rejection sampler whose output law is p', so the whole is p (lossless).
    When all are rejected, draw from what is left. Returns (index of the accepted candidate or -1, token).
    """
    cur = p.clone()
    for i, c in enumerate(candidates):
        pc = float(cur[c])
        qc = 1.0 if proposal is None else float(proposal[c])
        accept = torch.tensor(min(1.0, pc / qc) if qc > 0 else 1.0, dtype=p.dtype, device=p.device)  # min(1, p'/q)
        if bool(coin(accept, generator)):
            return i, int(c)
        if proposal is None:
            cur[c] = 0.0
        else:
            cur = (cur - proposal).clamp_min_(0)
        mass = float(cur.sum())
        if mass <= 0.0:  # p' == q: the candidate is accepted with probability 1, so only float error gets here
            cur = p.clone()
            break
        cur /= mass
    return -1, int(draw(cur[None], generator)[0, 0])
