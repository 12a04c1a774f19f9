"""Speculative decoding over Hugging Face causal LMs: a draft proposes, the target verifies in one forward.

Reading order: distributions -> verification (`rejection_plan`, `verify`, `verify_greedy`) ->
draft-length policies -> the chain loop (`draft_chain` -> `speculative_generate`) -> token trees
(`TreeShape` -> `tree_attention_mask` -> `tree_generate`) -> metrics -> the HF peer.

State between rounds (gpt-fast style): the target's KV cache holds every token but the last emitted
one (`last`); the draft's cache may lag a token behind after a fully accepted round (`pending` is
what it has not seen). A round drafts g tokens, runs the target once over [last, x_1..x_g]
(g + 1 positions, `logits_to_keep=g+1`), keeps the accepted prefix and one more token, and crops
both caches back past the first rejection. The prompt's last token starts as `last`, so even the
first new token comes out of a verification (as in HF assisted generation).

Batches use the min rule: every row advances by the smallest accepted count in the batch. A row
that accepted more emits its (accepted) draft token at that position, which is still a correct
sample (the decision to stop depends only on earlier positions), and caches stay rectangular.

References:
- Leviathan, Kalman, Matias 2023, "Fast Inference from Transformers via Speculative Decoding"
  (arXiv 2211.17192): algorithm 1, beta = sum_x min(p, q), expected tokens per round
  (1 - a^(g+1)) / (1 - a) and speed-up (1 - a^(g+1)) / ((1 - a)(g c + 1)).
- Chen et al. 2023, "Accelerating Large Language Model Decoding with Speculative Sampling"
  (arXiv 2302.01318): the modified rejection sampling, residual norm(max(0, p - q)).
- Miao et al. 2024, "SpecInfer" (arXiv 2305.09781): token-tree verification in one forward with a
  tree attention mask; multi-candidate speculative sampling.
- Li et al. 2024, "EAGLE" / "EAGLE-2" (arXiv 2401.15077, 2406.16858): top-k trees from the draft,
  depth-based position ids, KV compaction to the accepted path.
- gpt-fast generate.py `speculative_decode`; transformers `generation/candidate_generator.py`
  (num_assistant_tokens, the "heuristic" +2/-1 schedule, assistant_confidence_threshold).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache

import torch

from llmlab.inference import decode
from llmlab.inference.decode import SamplingParams

# ---------------------------------------------------------------- distributions


def probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """logits (..., V) -> processed probabilities (..., V): temperature, top-k, top-p, min-p, alike for p and q."""
    from llmlab.inference import sampling

    shape = logits.shape
    p = sampling.probs(logits.reshape(-1, shape[-1]), temperature=params.temperature, top_k=params.top_k,
                       top_p=params.top_p, min_p=params.min_p)
    return p.reshape(shape)


def beta(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Leviathan's acceptance probability of one drafted position: sum_x min(p, q). (..., V) -> (...)."""
    return torch.minimum(p, q).sum(-1)


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


# ---------------------------------------------------------------- verification


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


# ---------------------------------------------------------------- draft-length policies


class ConstantGamma:
    """Draft exactly gamma tokens every round (Leviathan; HF's "constant" schedule)."""

    name = "constant"

    def __init__(self, gamma: int):
        self.gamma = gamma

    def next_gamma(self, position: int) -> int:
        return self.gamma

    def stop_after(self, confidence: float) -> bool:
        return False

    def update(self, n_accepted: int, n_drafted: int) -> None:
        pass


class HeuristicGamma(ConstantGamma):
    """HF's "heuristic" schedule: +2 after a fully accepted round, -1 (not below 1) otherwise."""

    name = "heuristic +2/-1"

    def __init__(self, gamma: int, max_gamma: int = 16):
        super().__init__(gamma)
        self.max_gamma = max_gamma

    def update(self, n_accepted: int, n_drafted: int) -> None:
        self.gamma = min(self.max_gamma, self.gamma + 2) if n_accepted == n_drafted else max(1, self.gamma - 1)


class ConfidenceGamma(ConstantGamma):
    """Stop drafting as soon as the draft's top probability falls below `threshold` (up to max_gamma)."""

    name = "confidence"

    def __init__(self, threshold: float, max_gamma: int = 8):
        super().__init__(max_gamma)
        self.threshold = threshold

    def stop_after(self, confidence: float) -> bool:
        return confidence < self.threshold


class OracleGamma(ConstantGamma):
    """The upper bound: draft exactly the tokens the target will accept (greedy), known in advance.

    `run_lengths[i]` = how many consecutive draft guesses agree with the target's greedy output from
    output position i on (from `oracle_run_lengths`). No draft forward is ever wasted.
    """

    name = "oracle"

    def __init__(self, run_lengths: Sequence[int], max_gamma: int = 16):
        super().__init__(max_gamma)
        self.run_lengths = list(run_lengths)

    def next_gamma(self, position: int) -> int:
        return min(self.gamma, self.run_lengths[position]) if position < len(self.run_lengths) else 0


@torch.inference_mode()
def oracle_run_lengths(draft, prompt: torch.Tensor, reference: torch.Tensor) -> list[int]:
    """For each output position i of the target's greedy `reference` (1, N): the draft's agreement run from i.

    The draft's teacher-forced argmax at each position (one forward over prompt + reference) says
    which guesses would be right; run_lengths[i] counts consecutive right guesses starting at output i.
    """
    seq = torch.cat([prompt, reference], dim=1)
    logits = draft(input_ids=seq, use_cache=False).logits  # (1, S + N, V)
    guess = logits[0, prompt.shape[1] - 1 : -1].argmax(-1)  # guess for output position i, (N,)
    right = (guess == reference[0]).tolist()
    runs, run = [0] * len(right), 0
    for i in range(len(right) - 1, -1, -1):
        run = run + 1 if right[i] else 0
        runs[i] = run
    return runs


# ---------------------------------------------------------------- the chain loop


@dataclass
class SpecStats:
    """What happened in each round: drafted length, accepted count per row, emitted tokens, analytic beta."""

    drafted: list[int] = field(default_factory=list)  # g of each round
    accepted: list[list[int]] = field(default_factory=list)  # n_accepted of each row, each round (before the min rule)
    emitted: list[int] = field(default_factory=list)  # tokens each row emitted that round
    betas: list[list[float]] = field(default_factory=list)  # sum min(p, q) at each examined position of row 0
    target_forwards: int = 0  # prefill included
    draft_forwards: int = 0  # prefill included

    def merge(self, other: SpecStats) -> None:
        self.drafted += other.drafted
        self.accepted += other.accepted
        self.emitted += other.emitted
        self.betas += other.betas
        self.target_forwards += other.target_forwards
        self.draft_forwards += other.draft_forwards


@dataclass
class SpecGeneration:
    tokens: torch.Tensor  # (B, n) new tokens only
    stats: SpecStats
    total_s: float

    @property
    def n_new(self) -> int:
        return int(self.tokens.shape[1])


def _check_pair(target, draft) -> None:
    vt, vd = target.config.vocab_size, draft.config.vocab_size
    if vt != vd:
        from llmlab.core.errors import UsageError

        raise UsageError(f"the draft's vocabulary ({vd} tokens) differs from the target's ({vt} tokens): "
                         "speculative decoding needs both models to share one tokenizer")


@torch.inference_mode()
def _start(target, draft, input_ids: torch.Tensor):
    """Prefill both caches with all but the prompt's last token, which becomes the first `last`."""
    t_cache, d_cache = decode.new_cache(target), decode.new_cache(draft)
    if input_ids.shape[1] > 1:
        decode.forward(target, input_ids[:, :-1], t_cache)
        decode.forward(draft, input_ids[:, :-1], d_cache)
    return t_cache, d_cache, input_ids[:, -1:]


@torch.inference_mode()
def draft_chain(draft, cache, pending: torch.Tensor, g: int, params: SamplingParams,
                generator: torch.Generator | None = None, policy=None):
    """Draft up to g tokens after `pending` (B, k) (tokens the draft has not seen yet).

    Returns tokens (B, g') and q (B, g', V) (None when greedy), g' <= g (a policy may stop early).
    """
    tokens, qs = [], []
    x = pending
    for i in range(g):
        logits = decode.forward(draft, x, cache)[:, -1].float()  # (B, V)
        if params.greedy:
            x = logits.argmax(dim=-1, keepdim=True)  # (B, 1)
            q = None
        else:
            q = probs(logits, params)
            x = draw(q, generator)
            qs.append(q)
        tokens.append(x)
        if policy is not None and i < g - 1 and policy.stop_after(_confidence(logits, q)):
            break
    return torch.cat(tokens, dim=1), (torch.stack(qs, dim=1) if qs else None)


def _confidence(logits: torch.Tensor, q: torch.Tensor | None) -> float:
    """The draft's top probability (row 0; one host sync): what the confidence policy looks at."""
    top = q[0].max() if q is not None else logits[0].softmax(-1).max()
    return float(top)


def _apply_eos(emitted: torch.Tensor, done: torch.Tensor, eos: int):
    """Tokens after a row's first EOS (or in finished rows) become EOS. Returns (emitted, done, first EOS index or -1)."""
    is_eos = emitted == eos
    after = (is_eos.int().cumsum(1) - is_eos.int()) > 0
    emitted = emitted.masked_fill(after | done.unsqueeze(1), eos)
    hit = is_eos.any(1) & ~done
    first = torch.where(hit, is_eos.int().argmax(1), torch.full_like(hit, -1, dtype=torch.long))
    return emitted, done | is_eos.any(1), first


def _finish_round(emitted: torch.Tensor, done: torch.Tensor, eos: int | None):
    """EOS handling of one round's tokens (B, k): returns (emitted, done, finished).

    When every row is done, the round is cut right after the last row's first EOS, so the output
    has the length plain decoding gives (which stops once every row has emitted EOS).
    """
    if eos is None:
        return emitted, done, False
    emitted, done, first = _apply_eos(emitted, done, eos)
    if not bool(done.all()):
        return emitted, done, False
    return (emitted[:, : int(first.max()) + 1] if bool((first >= 0).any()) else emitted[:, :1]), done, True


@torch.inference_mode()
def speculative_generate(
    target,
    draft,
    input_ids: torch.Tensor,
    max_new_tokens: int,
    gamma: int = 4,
    params: SamplingParams = SamplingParams(),
    generator: torch.Generator | None = None,
    eos_token_id: int | None = None,
    policy=None,
    record_beta: bool = False,
) -> SpecGeneration:
    """Draft-and-verify from `input_ids` (B, S) for up to `max_new_tokens` new tokens.

    `draft` is a model sharing the target's tokenizer, or a `PromptLookup` (no model: `lookup_generate`).

    Greedy (temperature 0) output equals the target's plain greedy decoding token for token;
    sampled output has the target's distribution (`verify`). Stops early when every row has
    emitted `eos_token_id`; a finished row is padded with EOS, as in `decode.generate`.
    """
    if isinstance(draft, PromptLookup):  # a draft source without a model: see lookup_generate
        return lookup_generate(target, input_ids, max_new_tokens, draft, params, generator, eos_token_id)
    if max_new_tokens < 1:
        raise ValueError("max_new_tokens must be at least 1")
    _check_pair(target, draft)
    policy = policy or ConstantGamma(gamma)
    stats = SpecStats()
    t_start = time.perf_counter()
    t_cache, d_cache, last = _start(target, draft, input_ids)
    stats.target_forwards = stats.draft_forwards = int(input_ids.shape[1] > 1)
    pending = last  # tokens the draft has not seen, (B, k)
    B = input_ids.shape[0]
    done = torch.zeros(B, dtype=torch.bool, device=input_ids.device)
    out: list[torch.Tensor] = []
    produced = 0
    while produced < max_new_tokens:
        g = max(0, min(policy.next_gamma(produced), max_new_tokens - produced - 1))
        t_len = t_cache.get_seq_length()
        if g > 0:
            drafts, q = draft_chain(draft, d_cache, pending, g, params, generator, policy)
            g = drafts.shape[1]
            stats.draft_forwards += g
            verify_in = torch.cat([last, drafts], dim=1)  # (B, g + 1)
        else:
            drafts, q, verify_in = last[:, :0], None, last
        logits = decode.forward(target, verify_in, t_cache, logits_to_keep=g + 1).float()  # (B, g + 1, V)
        stats.target_forwards += 1
        if params.greedy:
            n, nxt = verify_greedy_rows(drafts, logits)
        else:
            p = probs(logits, params)
            n, nxt = (verify_rows(drafts, q, p, generator) if g > 0
                      else (torch.zeros(B, dtype=torch.long, device=logits.device), draw(p[:, 0], generator)))
        n_list = n.tolist()  # the round's one host sync
        m = min(n_list)
        if m < max(n_list):  # min rule: rows that accepted more emit their accepted draft token at m
            nxt = torch.where((n > m).unsqueeze(1), drafts[:, m : m + 1], nxt)
        emitted = torch.cat([drafts[:, :m], nxt], dim=1)  # (B, m + 1)
        if record_beta and g > 0:
            stats.betas.append(_round_betas(logits, q, drafts, params, n_list[0]))
        stats.drafted.append(g)
        stats.accepted.append(n_list)
        stats.emitted.append(m + 1)
        policy.update(n_list[0], g)
        # keep [.. last, x_1..x_m]; the draft keeps what it saw of that
        decode.crop(t_cache, t_len + 1 + m)
        if g > 0:
            decode.crop(d_cache, t_len + 1 + m)
            pending = torch.cat([drafts[:, g - 1 :], nxt], dim=1) if m == g else nxt
        else:
            pending = torch.cat([pending, nxt], dim=1)
        last = nxt
        emitted, done, finished = _finish_round(emitted, done, eos_token_id)
        out.append(emitted)
        produced += emitted.shape[1]
        if finished:
            break
    return SpecGeneration(torch.cat(out, dim=1), stats, time.perf_counter() - t_start)


def _round_betas(logits, q, drafts, params: SamplingParams, n0: int) -> list[float]:
    """beta = sum min(p, q) at the positions row 0 examined this round (accepted ones + the first rejection)."""
    g = drafts.shape[1]
    k = min(n0 + 1, g)
    if params.greedy:  # p and q are one-hot: beta is 1 where the argmaxes agree
        return [float(v) for v in (drafts[0, :k] == logits[0, :k].argmax(-1)).tolist()]
    p = probs(logits[:1, :k], params)
    return beta(p[0], q[0, :k]).tolist()


# ---------------------------------------------------------------- prompt lookup: a draft without a model


class NgramIndex:
    """One sequence's n-gram index: for each n in [min_n, max_n], n-gram -> where its latest continuation starts.

    An n-gram is entered when the token after it arrives, so the sequence's own suffix is never its own
    match, and a later occurrence overwrites an earlier one (the most recent context wins). Appending a
    token costs (max_n - min_n + 1) dict writes; a lookup at most as many dict reads: no scan of the context.
    """

    def __init__(self, tokens: Sequence[int], min_n: int, max_n: int):
        self.tokens: list[int] = []
        self.ns = range(max_n, min_n - 1, -1)  # longest first
        self.table: dict[int, dict[tuple[int, ...], int]] = {n: {} for n in self.ns}
        self.extend(tokens)

    def extend(self, new: Sequence[int]) -> None:
        toks, table = self.tokens, self.table
        for t in new:
            i = len(toks)  # t lands at i: every n-gram ending at i - 1 now has a continuation starting at i
            for n in self.ns:
                if i >= n:
                    table[n][tuple(toks[i - n : i])] = i
            toks.append(t)

    def propose(self, k: int) -> list[int]:
        """Up to k tokens that followed the latest earlier occurrence of the longest matching suffix n-gram."""
        toks, size = self.tokens, len(self.tokens)
        if k <= 0:
            return []
        for n in self.ns:
            if size >= n:
                start = self.table[n].get(tuple(toks[size - n :]))
                if start is not None:
                    return toks[start : start + k]
        return []


@dataclass(frozen=True)
class PromptLookup:
    """Prompt-lookup drafting (Saxena 2023; HF `prompt_lookup_num_tokens`; vLLM's ngram speculator).

    The draft is the text that followed the last `n` tokens where they occurred before, in the prompt
    or the output so far, trying n = max_ngram down to min_ngram. No model, no draft forward: c = 0.
    A draft is a deterministic function of the context, so for sampling it is a one-hot q.
    """

    max_ngram: int = 3  # longer matches are rarer but more often right
    min_ngram: int = 1  # 1 lets a single repeated token find its continuation; 2 is stricter
    num_draft: int = 10  # tokens drafted on a match (HF's default prompt_lookup_num_tokens is 10)

    def __post_init__(self):
        if not 1 <= self.min_ngram <= self.max_ngram or self.num_draft < 1:
            raise ValueError(f"prompt lookup needs 1 <= min_ngram <= max_ngram and num_draft >= 1, got {self}")

    def index(self, tokens: Sequence[int]) -> NgramIndex:
        return NgramIndex(tokens, self.min_ngram, self.max_ngram)


def one_hot_q(drafts: torch.Tensor, vocab: int) -> torch.Tensor:
    """A deterministic draft as a proposal distribution: (B, g) -> (B, g, V) one-hot. Verified with it,
    x is accepted with probability p(x) and a rejection draws from norm(max(0, p - onehot(x)))."""
    return torch.nn.functional.one_hot(drafts, vocab).float()


@torch.inference_mode()
def lookup_generate(
    target,
    input_ids: torch.Tensor,
    max_new_tokens: int,
    lookup: PromptLookup = PromptLookup(),
    params: SamplingParams = SamplingParams(),
    generator: torch.Generator | None = None,
    eos_token_id: int | None = None,
) -> SpecGeneration:
    """Speculative decoding with prompt-lookup drafts, verified by the target as a model draft is.

    The target's cache holds everything but `last`, as in `speculative_generate`. A round looks up a
    draft per row (padded to the longest with token 0: a deterministic pad is a valid one-hot draft);
    when no row finds one, the round is a plain decode step (one token, no verify overhead).
    Greedy output equals plain greedy; sampled output has the target's law (`verify` with one-hot q).
    """
    if max_new_tokens < 1:
        raise ValueError("max_new_tokens must be at least 1")
    stats = SpecStats()
    t_start = time.perf_counter()
    cache = decode.new_cache(target)
    if input_ids.shape[1] > 1:
        decode.forward(target, input_ids[:, :-1], cache)
    stats.target_forwards = int(input_ids.shape[1] > 1)
    last = input_ids[:, -1:]
    indexes = [lookup.index(row) for row in input_ids.tolist()]
    B, dev = input_ids.shape[0], input_ids.device
    vocab = target.config.vocab_size
    done = torch.zeros(B, dtype=torch.bool, device=dev)
    out: list[torch.Tensor] = []
    produced = 0
    while produced < max_new_tokens:
        room = min(lookup.num_draft, max_new_tokens - produced - 1)
        props = [ix.propose(room) for ix in indexes]
        g = max(map(len, props))
        t_len = cache.get_seq_length()
        if g > 0:
            drafts = torch.tensor([p + [0] * (g - len(p)) for p in props], dtype=torch.long, device=dev)  # (B, g)
            logits = decode.forward(target, torch.cat([last, drafts], dim=1), cache, logits_to_keep=g + 1).float()
            if params.greedy:
                n, nxt = verify_greedy_rows(drafts, logits)
            else:
                n, nxt = verify_rows(drafts, one_hot_q(drafts, vocab), probs(logits, params), generator)
            n_list = n.tolist()
            m = min(n_list)
            if m < max(n_list):  # min rule, as in speculative_generate
                nxt = torch.where((n > m).unsqueeze(1), drafts[:, m : m + 1], nxt)
            emitted = torch.cat([drafts[:, :m], nxt], dim=1)  # (B, m + 1)
            decode.crop(cache, t_len + 1 + m)
        else:  # nothing to draft: one plain decode step
            logits = decode.forward(target, last, cache)[:, -1].float()  # (B, V)
            emitted = logits.argmax(-1, keepdim=True) if params.greedy else draw(probs(logits, params), generator)
            n_list, m = [0] * B, 0
        stats.target_forwards += 1
        stats.drafted.append(g)
        stats.accepted.append(n_list)
        stats.emitted.append(m + 1)
        last = emitted[:, -1:]
        emitted, done, finished = _finish_round(emitted, done, eos_token_id)
        for ix, row in zip(indexes, emitted.tolist(), strict=True):
            ix.extend(row)
        out.append(emitted)
        produced += emitted.shape[1]
        if finished:
            break
    return SpecGeneration(torch.cat(out, dim=1), stats, time.perf_counter() - t_start)


# ---------------------------------------------------------------- token trees


@dataclass(frozen=True)
class TreeShape:
    """A static token tree: `branching[d]` children per node at depth d (top-k of the draft there).

    Nodes are numbered breadth-first; the root (the last emitted token) is not a node.
    """

    branching: tuple[int, ...]
    parent: tuple[int, ...]  # parent node of each node, -1 for the root
    depth: tuple[int, ...]  # 1-based depth of each node

    @property
    def size(self) -> int:
        return len(self.parent)

    @property
    def max_depth(self) -> int:
        return len(self.branching)

    def level(self, d: int) -> range:
        """Node indices at depth d (1-based), contiguous in BFS order."""
        start = sum(1 for x in self.depth if x < d)
        return range(start, start + sum(1 for x in self.depth if x == d))

    def children(self, node: int) -> list[int]:
        return [j for j, par in enumerate(self.parent) if par == node]

    @torch.inference_mode()
    def ancestors(self) -> torch.Tensor:
        """(N, N) bool: [j, k] is True when node k is node j or one of its ancestors."""
        n = self.size
        anc = torch.zeros(n, n, dtype=torch.bool, device="cpu")  # built on the host, element by element
        for j in range(n):
            k = j
            while k >= 0:
                anc[j, k] = True
                k = self.parent[k]
        return anc


@lru_cache(maxsize=64)
def tree_shape(branching: tuple[int, ...]) -> TreeShape:
    if not branching or any(int(b) < 1 for b in branching):
        raise ValueError(f"tree branching must be positive integers per depth, got {branching}")
    parent, depth, frontier = [], [], [-1]
    for d, k in enumerate(branching, start=1):
        nxt = []
        for par in frontier:
            for _ in range(k):
                parent.append(par)
                depth.append(d)
                nxt.append(len(parent) - 1)
        frontier = nxt
    return TreeShape(tuple(branching), tuple(parent), tuple(depth))


def tree_attention_mask(anc_rows: torch.Tensor, prefix_len: int, dtype: torch.dtype) -> torch.Tensor:
    """A 4D additive mask (1, 1, Q, prefix_len + K): every query sees the whole prefix, then its tree ancestors.

    anc_rows (Q, K) bool: which of the K tree positions appended after the prefix each query may see.
    transformers passes a 4D mask through unchanged (masking_utils._preprocess_mask_arguments).
    """
    q, dev = anc_rows.shape[0], anc_rows.device
    allowed = torch.cat([torch.ones(q, prefix_len, dtype=torch.bool, device=dev), anc_rows], dim=1)
    mask = torch.zeros(allowed.shape, dtype=dtype, device=dev).masked_fill_(~allowed, torch.finfo(dtype).min)
    return mask[None, None]


@torch.inference_mode()
def tree_forward(model, tokens: torch.Tensor, cache, anc_rows: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Forward tree tokens (B, Q) appended to `cache` with ancestor-only attention; returns logits (B, Q, V)."""
    prefix = cache.get_seq_length() - (anc_rows.shape[1] - anc_rows.shape[0])
    mask = tree_attention_mask(anc_rows.to(tokens.device), prefix, next(model.parameters()).dtype)
    pos = positions.to(tokens.device).unsqueeze(0).expand(tokens.shape[0], -1)
    return decode.forward(model, tokens, cache, logits_to_keep=tokens.shape[1], attention_mask=mask,
                          position_ids=pos).float()


def compact_cache(cache, keep: torch.Tensor) -> None:
    """Keep only positions `keep` (B, L) of every layer (per row), in order: the accepted tree path."""
    for layer in cache.layers:
        if type(layer).__name__ != "DynamicLayer":
            raise ValueError(f"tree speculation needs a plain DynamicCache, got a {type(layer).__name__}")
        idx = keep[:, None, :, None].expand(-1, layer.keys.shape[1], -1, layer.keys.shape[-1])
        layer.keys = layer.keys.gather(2, idx)
        layer.values = layer.values.gather(2, idx)


@torch.inference_mode()
def draft_tree(draft, cache, pending: torch.Tensor, shape: TreeShape, params: SamplingParams,
               children: str = "topk", generator: torch.Generator | None = None):
    """Grow the tree level by level: one draft forward per depth (all nodes of a level at once).

    children "topk": each node's children are the draft's top-k (greedy, EAGLE); "sample": drawn
    i.i.d. from q (SpecInfer). Returns node tokens (B, N) and, for "sample", q at the root and at
    every node of depth < max_depth (B, 1 + N_inner, V), else None. The draft's cache ends with the
    prefix, the root, and the nodes of depth < max_depth in BFS order (the deepest level is never fed).
    """
    B = pending.shape[0]
    qs = []
    logits = decode.forward(draft, pending, cache)[:, -1:].float()  # (B, 1, V) at the root
    root_pos = cache.get_seq_length() - 1
    anc = shape.ancestors()
    tokens = torch.empty(B, shape.size, dtype=torch.long, device=pending.device)
    for d in range(1, shape.max_depth + 1):
        k = shape.branching[d - 1]
        scores = logits if params.greedy else probs(logits, params)  # (B, n_parents, V)
        if children == "sample" and not params.greedy:
            qs.append(scores)
            flat = draw(scores.reshape(-1, scores.shape[-1]), generator, k)
            kids = flat.reshape(B, -1, k)
        else:
            kids = scores.topk(k, dim=-1).indices  # (B, n_parents, k), in the BFS order of their parents
        lvl = shape.level(d)
        tokens[:, lvl.start : lvl.stop] = kids.reshape(B, -1)
        if d == shape.max_depth:
            break
        rows = anc[lvl.start : lvl.stop, : lvl.stop]  # (Q, nodes so far)
        positions = torch.full((len(lvl),), root_pos + d, dtype=torch.long, device=pending.device)
        logits = tree_forward(draft, tokens[:, lvl.start : lvl.stop], cache, rows, positions)
    return tokens, (torch.cat(qs, dim=1) if qs else None)


def _walk_greedy(shape: TreeShape, tokens: list[int], best: list[int]) -> tuple[list[int], int]:
    """Follow the target's argmax down the tree: (accepted path of node indices, next token)."""
    path, node = [], -1
    while True:
        want = best[node + 1]  # argmax at the root is row 0, at node j row j + 1
        child = next((c for c in shape.children(node) if tokens[c] == want), None)
        if child is None:
            return path, want
        path.append(child)
        node = child


def _walk_sampled(shape: TreeShape, tokens: list[int], p: torch.Tensor, generator,
                  q: torch.Tensor | None = None) -> tuple[list[int], int]:
    """Multi-candidate rejection down the tree: p (1 + N, V) are the target's rows; q (1 + N_inner, V) the
    draft's at the root and inner nodes when the children were sampled from it (None: top-k children)."""
    path, node = [], -1
    while True:
        kids = shape.children(node)
        if not kids:
            return path, int(draw(p[node + 1][None], generator)[0, 0])
        prop = None if q is None else q[node + 1]
        i, tok = multi_candidate_verify(p[node + 1], [tokens[c] for c in kids], generator, prop)
        if i < 0:
            return path, tok
        path.append(kids[i])
        node = kids[i]


@torch.inference_mode()
def tree_generate(
    target,
    draft,
    input_ids: torch.Tensor,
    max_new_tokens: int,
    branching: Sequence[int] = (2, 2, 1, 1),
    params: SamplingParams = SamplingParams(),
    generator: torch.Generator | None = None,
    eos_token_id: int | None = None,
    children: str = "sample",
) -> SpecGeneration:
    """Tree speculation: the draft grows a token tree, the target scores all of it in one forward.

    Greedy: top-k children, and the longest path on which every node is the target's argmax.
    Sampled: multi-candidate rejection at each node (lossless), with children drawn from q
    ("sample", SpecInfer) or the draft's top-k ("topk", EAGLE). Caches are compacted to the accepted path.
    """
    if children not in ("sample", "topk"):
        raise ValueError(f"children must be 'sample' or 'topk', got {children!r}")
    if max_new_tokens < 1:
        raise ValueError("max_new_tokens must be at least 1")
    _check_pair(target, draft)
    full = tree_shape(tuple(int(b) for b in branching))
    stats = SpecStats()
    t_start = time.perf_counter()
    t_cache, d_cache, last = _start(target, draft, input_ids)
    stats.target_forwards = stats.draft_forwards = int(input_ids.shape[1] > 1)
    pending = last
    B = input_ids.shape[0]
    dev = input_ids.device
    done = torch.zeros(B, dtype=torch.bool, device=dev)
    out: list[torch.Tensor] = []
    produced = 0
    while produced < max_new_tokens:
        depth = min(full.max_depth, max_new_tokens - produced - 1)
        t_len = t_cache.get_seq_length()  # the root `last` goes at position t_len
        if depth == 0:  # one plain step at the length limit
            logits = decode.forward(target, last, t_cache).float()
            stats.target_forwards += 1
            nxt = (logits[:, -1].argmax(-1, keepdim=True) if params.greedy
                   else draw(probs(logits[:, -1], params), generator))
            paths, m, tokens = [[] for _ in range(B)], 0, last[:, :0]
            pending = torch.cat([pending, nxt], dim=1)
        else:
            shape = tree_shape(full.branching[:depth])
            tokens, q = draft_tree(draft, d_cache, pending, shape, params, children, generator)  # (B, N)
            stats.draft_forwards += shape.max_depth
            rows = torch.zeros(1 + shape.size, 1 + shape.size, dtype=torch.bool, device="cpu")  # root, then the nodes
            rows[:, 0] = True
            rows[1:, 1:] = shape.ancestors()
            positions = torch.tensor([t_len] + [t_len + d for d in shape.depth], device=dev)
            verify_in = torch.cat([last, tokens], dim=1)  # (B, 1 + N)
            decode_logits = tree_forward(target, verify_in, t_cache, rows, positions)  # (B, 1 + N, V)
            stats.target_forwards += 1
            tok_lists = tokens.tolist()
            if params.greedy:
                best = decode_logits.argmax(-1).tolist()
                walks = [_walk_greedy(shape, tok_lists[b], best[b]) for b in range(B)]
            else:
                p = probs(decode_logits, params)
                walks = [_walk_sampled(shape, tok_lists[b], p[b], generator, None if q is None else q[b])
                         for b in range(B)]
            paths = [w[0] for w in walks]
            m = min(len(pth) for pth in paths)
            nxt = torch.tensor([[w[1] if len(w[0]) == m else tok_lists[b][w[0][m]]] for b, w in enumerate(walks)],
                               dtype=torch.long, device=dev)
            keep = torch.tensor([list(range(t_len + 1)) + [t_len + 1 + j for j in pth[:m]] for pth in paths], device=dev)
            compact_cache(t_cache, keep)
            in_draft = [[j for j in pth[:m] if shape.depth[j] < shape.max_depth] for pth in paths]
            d_keep = torch.tensor([list(range(t_len + 1)) + [t_len + 1 + j for j in kept] for kept in in_draft], device=dev)
            compact_cache(d_cache, d_keep)
            lag = m - len(in_draft[0])  # 1 when the path reached the deepest level (never fed to the draft)
            pending = torch.cat([_path_tokens(tokens, paths, m)[:, m - lag :], nxt], dim=1)
        accepted = [len(pth) for pth in paths]
        emitted = torch.cat([_path_tokens(tokens, paths, m), nxt], dim=1)  # (B, m + 1)
        stats.accepted.append(accepted)
        stats.emitted.append(m + 1)
        stats.drafted.append(depth)
        last = nxt
        emitted, done, finished = _finish_round(emitted, done, eos_token_id)
        out.append(emitted)
        produced += emitted.shape[1]
        if finished:
            break
    return SpecGeneration(torch.cat(out, dim=1), stats, time.perf_counter() - t_start)


def _path_tokens(tokens: torch.Tensor, paths: list[list[int]], m: int) -> torch.Tensor:
    """The first m accepted node tokens of each row: (B, m)."""
    if m == 0:
        return tokens[:, :0]
    idx = torch.tensor([pth[:m] for pth in paths], dtype=torch.long, device=tokens.device)
    return tokens.gather(1, idx)


# ---------------------------------------------------------------- metrics


def acceptance_metrics(stats: SpecStats) -> dict:
    """alpha (prefix-causal), tau (mean accepted + 1), per-position acceptance, histogram, mean beta.

    Only rounds with g >= 1 count. A row examined position i in a round when it accepted
    positions 0..i-1; alpha = accepted / examined over all rows and rounds.
    """
    accepted = examined = rounds = 0
    tau_sum = 0
    g_max = max(stats.drafted, default=0)
    pos_acc, pos_seen = [0] * g_max, [0] * g_max
    hist: dict[int, int] = {}
    for g, ns in zip(stats.drafted, stats.accepted, strict=True):
        if g == 0:
            continue
        for n in ns:
            rounds += 1
            accepted += n
            examined += min(n + 1, g)
            tau_sum += n + 1
            hist[n] = hist.get(n, 0) + 1
            for i in range(min(n + 1, g)):
                pos_seen[i] += 1
                pos_acc[i] += int(i < n)
    betas = [b for row in stats.betas for b in row]
    return dict(
        alpha=accepted / examined if examined else float("nan"),
        tau=tau_sum / rounds if rounds else float("nan"),
        rounds=rounds,
        examined=examined,
        accepted=accepted,
        per_position=[a / s if s else float("nan") for a, s in zip(pos_acc, pos_seen, strict=True)],
        per_position_n=pos_seen,
        histogram=dict(sorted(hist.items())),
        beta=sum(betas) / len(betas) if betas else float("nan"),
        # if each examined position is accepted with its own probability b_i, the count's standard error
        beta_se=math.sqrt(sum(b * (1 - b) for b in betas)) / len(betas) if betas else float("nan"),
        tokens_per_target_forward=sum(stats.emitted) / max(1, len(stats.emitted)),
    )


def expected_tau(alpha: float, gamma: int) -> float:
    """Expected tokens per round (bonus included) for i.i.d. acceptance alpha: (1 - a^(g+1)) / (1 - a)."""
    return float(gamma + 1) if alpha >= 1 else (1 - alpha ** (gamma + 1)) / (1 - alpha)


def predicted_speedup(alpha: float, gamma: int, c: float, verify_cost: float = 1.0) -> float:
    """Leviathan's speed-up (1 - a^(g+1)) / ((1 - a)(g c + 1)); verify_cost > 1 charges the longer verify forward."""
    return expected_tau(alpha, gamma) / (gamma * c + verify_cost)


# ---------------------------------------------------------------- distribution tests

# The chi-square test and its power live in llmlab.core.stats; these names stay importable from here.
from llmlab.core.stats import (  # noqa: E402, F401
    SIGNIFICANCE,
    _noncentrality,
    chisquare_pvalue,
    detectable_effect,
    samples_for_effect,
)


@torch.inference_mode()
def exact_law(model, prompt: torch.Tensor, length: int, params: SamplingParams) -> dict:
    """The exact law of the model's first `length` sampled tokens after `prompt` (1, S): outcome tuple -> prob.

    One batched forward (no cache) per position over every context with non-zero probability,
    so keep the support small (top-k) and `length` short.
    """
    law = {(): 1.0}
    for _ in range(length):
        ctxs = list(law)
        tail = torch.tensor(ctxs, dtype=torch.long, device=prompt.device).reshape(len(ctxs), -1)
        ids = torch.cat([prompt.expand(len(ctxs), -1), tail], 1)
        pr = probs(model(input_ids=ids).logits[:, -1].float(), params).double().cpu()
        pr = pr / pr.sum(-1, keepdim=True)
        nxt = {}
        for ctx, row in zip(ctxs, pr, strict=True):
            support = row.nonzero().flatten().tolist()
            for y in support:
                nxt[ctx + (y,)] = law[ctx] * float(row[y])
        law = nxt
    return law


# ---------------------------------------------------------------- the HF peer


def hf_assisted_generate(target, draft, input_ids: torch.Tensor, max_new_tokens: int, gamma: int | None,
                         schedule: str | None = "constant", confidence: float | None = 0.0, **kw) -> torch.Tensor:
    """HF assisted generation with the same draft.

    By default a constant gamma with the confidence stop off, as our chain loop drafts. `gamma`,
    `schedule` ("constant" | "heuristic" | "heuristic_transient") or `confidence` None keep HF's own
    default for that setting (transformers 5: 20 tokens, "constant", an adaptive confidence stop
    starting at 0.4). HF reads these from the assistant's generation_config and adapts some of them
    in place across calls; they are restored afterwards, so every call starts from the same state.
    Batch size 1 only (an HF limit).
    """
    from transformers.utils import logging as hf_logging

    gc = draft.generation_config
    saved = (gc.num_assistant_tokens, gc.num_assistant_tokens_schedule, gc.assistant_confidence_threshold)
    for name, value in (("num_assistant_tokens", gamma), ("num_assistant_tokens_schedule", schedule),
                        ("assistant_confidence_threshold", confidence)):
        if value is not None:
            setattr(gc, name, value)
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # HF's candidate generator warns about the arguments it passes its assistant
    try:
        return decode.hf_generate(target, input_ids, max_new_tokens, assistant_model=draft, **kw)
    finally:
        hf_logging.set_verbosity(verbosity)
        gc.num_assistant_tokens, gc.num_assistant_tokens_schedule, gc.assistant_confidence_threshold = saved
