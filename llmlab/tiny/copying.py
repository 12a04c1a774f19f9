"""The copying phase: before any text, the target learns to copy on windows of random ids.

What predicts the second reading of a passage is an induction head: a previous-token head that
writes each token's predecessor into its position, and a later head whose query is the current token
and whose key is that predecessor, so it attends to the token after the last occurrence of the
current one and copies it (Olsson et al. 2022). On random ids nothing else predicts anything, so a
model that copies nothing sits at ln V nats.

The head forms in a phase change whose onset grows with the context and the span to copy. On the
target's shape (6 x 256) on one CPU thread, windows of 128-512 tokens with one repeated span stayed
at ln V for 20 k steps. What formed it (results/benchmarks/tiny-retrain-20261203.md): windows tiled
with pairs (A A) of fresh random spans, the loss on the second readings only, and window lengths
unlocked one at a time from 32 tokens as the copy probe passes a bar, the newest length half the
steps and the shorter ones the rest. The head that copies 12-token spans in 32-token windows then
carries to 64-token passages within a few hundred steps of longer windows.

References:
- Olsson et al. 2022, In-context Learning and Induction Heads:
  https://transformer-circuits.pub/2022/in-context-learning-and-induction-heads/
- Aoyama, Wilcox and Schneider 2025, Predicting the Formation of Induction Heads (the onset grows
  with batch and context): https://arxiv.org/abs/2511.16893
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


def span_max(window: int) -> int:
    """The longest span of a pair in a window of this length: 12 tokens up to 48, then a quarter, at most 64."""
    return min(64, max(12, window // 4))


def pair_windows(window: int, tokens: int, vocab_size: int, g) -> tuple[torch.Tensor, torch.Tensor]:
    """(x, mask), each (B, window + 1) with B = tokens // window: random ids 1..vocab_size - 1 (never
    end-of-text) tiled with pairs (A A) of fresh spans of 4..span_max(window) ids, 0-3 fresh ids apart;
    mask marks the tokens the loss counts: a second reading after its first token (the first one has
    no cue yet)."""
    import torch

    rows = max(1, tokens // window)
    x = torch.randint(1, vocab_size, (rows, window + 1), generator=g)
    mask = torch.zeros(rows, window + 1, dtype=torch.bool)
    hi = span_max(window)
    for row in range(rows):
        pos = int(torch.randint(0, 4, (1,), generator=g))
        while True:
            length = min(int(torch.randint(4, hi + 1, (1,), generator=g)), (window + 1 - pos) // 2)
            if length < 4:
                break
            x[row, pos + length:pos + 2 * length] = x[row, pos:pos + length]
            mask[row, pos + length + 1:pos + 2 * length] = True
            pos += 2 * length + int(torch.randint(0, 4, (1,), generator=g))
    return x, mask


def masked_ce(model, x, mask):
    """Next-token cross-entropy of x (B, T + 1) over the targets mask (B, T + 1) marks."""
    import torch.nn.functional as F

    logits = model(input_ids=x[:, :-1]).logits
    ce = F.cross_entropy(logits.flatten(0, 1), x[:, 1:].flatten(), reduction="none")
    keep = mask[:, 1:].flatten().float()
    return (ce * keep).sum() / keep.sum().clamp(min=1.0)


def probe_copy(model, vocab_size: int, span: int, passages: int = 8) -> float:
    """The share of the second reading of random passages of span ids that the model predicts (greedy)."""
    from llmlab.tiny.evaluate import random_passages, repeat_accuracy

    was_training = model.training
    model.eval()
    share = repeat_accuracy(model, random_passages(vocab_size, n=passages, length=span, seed=5))["second_read"]
    model.train(was_training)
    return share


def copy_phase(model, cfg, optimizer, on_step=None, budget_s: float | None = None, probe=probe_copy) -> dict:
    """Train model in place on pair windows (cfg.copy_*; see TrainConfig) until the probe at the last
    level reaches cfg.copy_goal, cfg.copy_max_steps pass, budget_s seconds pass, or, with cfg.copy_steps
    set, exactly that many steps. Returns {"steps", "seconds", "losses", "probes": [(step, window, span,
    share)], "level": the last window length unlocked}."""
    import torch

    g = torch.Generator().manual_seed(cfg.seed + 200)
    levels = cfg.copy_levels  # ((window, probe span), ...)
    level, step, losses, probes = 0, 0, [], []
    t0 = time.perf_counter()
    cap = cfg.copy_steps if cfg.copy_steps is not None else cfg.copy_max_steps
    done = cap == 0
    model.train()
    while not done:
        for group in optimizer.param_groups:
            group["lr"] = cfg.copy_lr * min(1.0, (step + 1) / cfg.warmup_steps)
        newest = level == 0 or float(torch.rand(1, generator=g)) < 0.5
        window = levels[level][0] if newest else levels[int(torch.randint(0, level, (1,), generator=g))][0]
        loss = masked_ce(model, *pair_windows(window, cfg.copy_tokens, cfg.vocab_size, g))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        optimizer.step()
        step += 1
        losses.append(loss.item())
        share = None
        if step % cfg.copy_probe_every == 0:
            span = levels[level][1]
            share = probe(model, cfg.vocab_size, span)
            probes.append((step, levels[level][0], span, share))
            last = level + 1 == len(levels)
            if not last and share >= cfg.copy_promote:
                level += 1
            elif last and share >= cfg.copy_goal and cfg.copy_steps is None:
                done = True
        if on_step:
            on_step("copy", step, cap, losses[-1], share)
        out_of_time = budget_s is not None and cfg.copy_steps is None and time.perf_counter() - t0 > budget_s
        done = done or step >= cap or out_of_time
    return {"steps": step, "seconds": time.perf_counter() - t0, "losses": losses, "probes": probes,
            "level": levels[level][0]}


def with_pairs(text_batches, cfg):
    """The text phase's batches with every cfg.copy_maintain_every-th one a pair batch (x, mask) of the
    longest copy level, so the copying learned first is kept while text is learned (0: text only)."""
    import torch

    g = torch.Generator().manual_seed(cfg.seed + 300)
    window = cfg.copy_levels[-1][0]
    for i, batch in enumerate(text_batches, start=1):
        if cfg.copy_maintain_every and i % cfg.copy_maintain_every == 0:
            yield pair_windows(window, cfg.copy_tokens, cfg.vocab_size, g)  # in place of this text batch
        else:
            yield batch
