"""Draft-model speculative decoding with a chain: the draft guesses g tokens, the target verifies all in one forward.

A round drafts g tokens, runs the target once over [last, x_1..x_g] (g + 1 positions,
`logits_to_keep=g+1`), keeps the accepted prefix and one more token, and crops both caches back past
the first rejection. Batches use the min rule (`acceptance.min_rule`): every row advances by the smallest
accepted count, so the caches stay rectangular.
"""

from __future__ import annotations

import torch

from llmlab.inference import decode
from llmlab.inference.decode import SamplingParams
from llmlab.inference.speculative.acceptance import beta, draw, min_rule, probs, verify_round
from llmlab.inference.speculative.lookup import PromptLookup, lookup_generate
from llmlab.inference.speculative.policies import ConstantGamma
from llmlab.inference.speculative.rounds import Rounds, SpecGeneration, check_vocabulary, prefill


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
    if isinstance(draft, PromptLookup):  # a draft source without a model
        return lookup_generate(target, input_ids, max_new_tokens, draft, params, generator, eos_token_id)
    rounds = Rounds(input_ids, max_new_tokens, eos_token_id)
    check_vocabulary(target, draft)
    policy = policy or ConstantGamma(gamma)
    (t_cache, d_cache), last = prefill([target, draft], input_ids)
    pending = last  # tokens the draft has not seen, (B, k)
    while rounds.running():
        g = max(0, min(policy.next_gamma(rounds.produced), rounds.room))
        t_len = t_cache.get_seq_length()
        if g > 0:
            drafts, q = draft_chain(draft, d_cache, pending, g, params, generator, policy)
            g = drafts.shape[1]
            rounds.stats.draft_forwards += g
        else:
            drafts, q = last[:, :0], None
        logits = decode.forward(target, torch.cat([last, drafts], dim=1), t_cache, logits_to_keep=g + 1).float()
        rounds.stats.target_forwards += 1  # logits (B, g + 1, V)
        emitted, n_list, m = min_rule(drafts, *verify_round(drafts, q, logits, params, generator))
        nxt = emitted[:, -1:]
        if record_beta and g > 0:
            rounds.stats.betas.append(_round_betas(logits, q, drafts, params, n_list[0]))
        policy.update(n_list[0], g)
        # keep [.. last, x_1..x_m]; the draft keeps what it saw of that
        decode.crop(t_cache, t_len + 1 + m)
        if g > 0:
            decode.crop(d_cache, t_len + 1 + m)
            pending = torch.cat([drafts[:, g - 1 :], nxt], dim=1) if m == g else nxt
        else:
            pending = torch.cat([pending, nxt], dim=1)
        last = nxt
        rounds.add(emitted, g, n_list)
    return rounds.result()


def _round_betas(logits, q, drafts, params: SamplingParams, n0: int) -> list[float]:
    """beta = sum min(p, q) at the positions row 0 examined this round (accepted ones + the first rejection)."""
    g = drafts.shape[1]
    k = min(n0 + 1, g)
    if params.greedy:  # p and q are one-hot: beta is 1 where the argmaxes agree
        return [float(v) for v in (drafts[0, :k] == logits[0, :k].argmax(-1)).tolist()]
    p = probs(logits[:1, :k], params)
    return beta(p[0], q[0, :k]).tolist()
