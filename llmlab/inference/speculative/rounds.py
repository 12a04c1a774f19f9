"""What every speculative loop shares: the caches' start, the round's record, EOS, and the output.

State between rounds (gpt-fast style): the target's KV cache holds every token but the last emitted
one (`last`); the draft's cache may lag a token behind (`pending` is what it has not seen). The
prompt's last token starts as `last`, so even the first new token comes out of a verification (as in
HF assisted generation).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from llmlab.core.errors import UsageError
from llmlab.inference import decode


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


def check_vocabulary(target, draft) -> None:
    """A draft must share the target's vocabulary: its token ids are the target's."""
    vt, vd = target.config.vocab_size, draft.config.vocab_size
    if vt != vd:
        raise UsageError(f"the draft's vocabulary ({vd} tokens) differs from the target's ({vt} tokens): "
                         "speculative decoding needs both models to share one tokenizer")


@torch.inference_mode()
def prefill(models, input_ids: torch.Tensor):
    """A cache per model, prefilled with all but the prompt's last token, which becomes the first `last`.

    Returns (caches, last (B, 1)). A one-token prompt leaves the caches empty.
    """
    caches = [decode.new_cache(m) for m in models]
    if input_ids.shape[1] > 1:
        for model, cache in zip(models, caches, strict=True):
            decode.forward(model, input_ids[:, :-1], cache)
    return caches, input_ids[:, -1:]


def _apply_eos(emitted: torch.Tensor, done: torch.Tensor, eos: int):
    """Tokens after a row's first EOS (or in finished rows) become EOS.

    Returns (emitted, done, the index of each row's first EOS or -1)."""
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


class Rounds:
    """A loop's output side: `while rounds.running()`, one `add` per round, then `result()`.

    Counts the prefill as one forward of the target and of the draft (`draft` False: a loop without a
    draft model), when the prompt has more than one token. Records each round in `stats`, applies EOS
    (a finished row is padded with EOS, as in `decode.generate`) and stops when every row has emitted
    EOS or `max_new_tokens` are out.
    """

    def __init__(self, input_ids: torch.Tensor, max_new_tokens: int, eos_token_id: int | None, draft: bool = True):
        if max_new_tokens < 1:
            raise ValueError("max_new_tokens must be at least 1")
        self.t_start = time.perf_counter()
        self.max_new_tokens, self.eos = max_new_tokens, eos_token_id
        self.stats = SpecStats()
        prefilled = int(input_ids.shape[1] > 1)
        self.stats.target_forwards, self.stats.draft_forwards = prefilled, prefilled if draft else 0
        self.done = torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)
        self.out: list[torch.Tensor] = []
        self.produced = 0
        self.finished = False

    def running(self) -> bool:
        return not self.finished and self.produced < self.max_new_tokens

    @property
    def room(self) -> int:
        """Tokens this round may draft: the verify adds one more, and the output must not pass max_new_tokens."""
        return self.max_new_tokens - self.produced - 1

    def add(self, emitted: torch.Tensor, drafted: int, accepted: list[int]) -> torch.Tensor:
        """Record a round that emitted (B, m + 1) tokens; returns them after EOS handling."""
        self.stats.drafted.append(drafted)
        self.stats.accepted.append(accepted)
        self.stats.emitted.append(emitted.shape[1])
        emitted, self.done, self.finished = _finish_round(emitted, self.done, self.eos)
        self.out.append(emitted)
        self.produced += emitted.shape[1]
        return emitted

    def result(self) -> SpecGeneration:
        return SpecGeneration(torch.cat(self.out, dim=1), self.stats, time.perf_counter() - self.t_start)
