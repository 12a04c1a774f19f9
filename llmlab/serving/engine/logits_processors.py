"""Per-request changes to a sequence's row of logits before its token is chosen, in vLLM's order:
the logit bias and min_tokens first, then the repetition, frequency and presence penalties.

Rules:
- Only rows whose request asks for a change are touched, on a copy: the raw logits stay as the
  model made them (logprobs are read from them). Greedy rows take the argmax of the changed row.
- logit_bias adds its value to each named token's logit (OpenAI's [-100, 100]; -100 bans, +100
  all but forces).
- min_tokens: until that many tokens are out, EOS and the stop token ids are impossible (-inf).
- repetition_penalty r (CTRL's, as in HF and vLLM), over every token of the prompt and the output:
  a positive logit is divided by r, a negative one multiplied by r.
- frequency_penalty f and presence_penalty p (OpenAI's), over the output tokens only (as vLLM):
  logit -= f * count + p * (count > 0).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from llmlab.serving.engine.scheduler import Sequence


def apply(logits: torch.Tensor, seqs: list[Sequence], eos_ids: set[int]) -> torch.Tensor:
    """logits (M, V), one row per sequence -> the logits the sequences choose from (the same tensor if none asks)."""
    rows = [i for i, s in enumerate(seqs) if s.params.changes_logits]
    if not rows:
        return logits
    out = logits.clone()
    for i in rows:
        change_row(out[i], seqs[i], eos_ids)
    return out


def change_row(row: torch.Tensor, seq: Sequence, eos_ids: set[int]) -> None:
    """One sequence's row (V,), in place."""
    p, dev = seq.params, row.device
    if p.logit_bias:
        ids, values = zip(*p.logit_bias, strict=True)
        row[list(ids)] += torch.tensor(values, device=dev, dtype=row.dtype)
    if len(seq.output_ids) < p.min_tokens:
        banned = sorted(eos_ids | p.stop_token_ids)
        if banned:
            row[banned] = float("-inf")
    if p.repetition_penalty != 1.0:
        seen = torch.tensor(sorted(set(seq.token_ids)), device=dev)
        x = row[seen]
        row[seen] = torch.where(x > 0, x / p.repetition_penalty, x * p.repetition_penalty)
    if (p.frequency_penalty or p.presence_penalty) and seq.output_ids:
        counts = torch.bincount(torch.tensor(seq.output_ids, device=dev), minlength=row.shape[0])[: row.shape[0]]
        row -= p.frequency_penalty * counts.to(row.dtype) + p.presence_penalty * (counts > 0).to(row.dtype)
