"""Draft-length policies: how many tokens the draft guesses each round.

A policy answers three questions of the chain loop: `next_gamma(position)` before a round,
`stop_after(confidence)` after each drafted token (the draft's top probability), and
`update(n_accepted, n_drafted)` after the verification. The schedules follow transformers'
candidate generator (num_assistant_tokens, the "heuristic" +2/-1 schedule,
assistant_confidence_threshold); the oracle is the upper bound no real policy can pass.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


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
