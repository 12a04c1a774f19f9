"""Prompt lookup: a draft without a model (Saxena 2023; HF `prompt_lookup_num_tokens`; vLLM's ngram
speculator). The draft is the text that followed the context's last n tokens where they occurred
before, in the prompt or the output so far; the target verifies it as it verifies a model's draft.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from llmlab.inference import decode
from llmlab.inference.decode import SamplingParams
from llmlab.inference.speculative.acceptance import min_rule, one_hot_q, verify_round
from llmlab.inference.speculative.rounds import Rounds, SpecGeneration, prefill


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
    """Prompt-lookup drafting: the settings of the n-gram match.

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
    rounds = Rounds(input_ids, max_new_tokens, eos_token_id, draft=False)
    (cache,), last = prefill([target], input_ids)
    indexes = [lookup.index(row) for row in input_ids.tolist()]
    vocab = target.config.vocab_size
    while rounds.running():
        props = [ix.propose(min(lookup.num_draft, rounds.room)) for ix in indexes]
        g = max(map(len, props))
        t_len = cache.get_seq_length()
        drafts = torch.tensor([p + [0] * (g - len(p)) for p in props], dtype=torch.long, device=input_ids.device)
        logits = decode.forward(target, torch.cat([last, drafts], dim=1), cache, logits_to_keep=g + 1).float()
        rounds.stats.target_forwards += 1
        q = None if params.greedy else one_hot_q(drafts, vocab)
        emitted, n_list, m = min_rule(drafts, *verify_round(drafts, q, logits, params, generator))
        decode.crop(cache, t_len + 1 + m)
        last = emitted[:, -1:]
        emitted = rounds.add(emitted, g, n_list)
        for ix, row in zip(indexes, emitted.tolist(), strict=True):
            ix.extend(row)
    return rounds.result()
