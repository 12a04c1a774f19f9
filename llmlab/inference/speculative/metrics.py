"""What a speculative run is judged by: acceptance counted from its rounds, Leviathan's predictions, and
the exact law of a model's first sampled tokens (what the distribution tests compare against).

Leviathan, Kalman, Matias 2023 (arXiv 2211.17192): beta = sum_x min(p, q), expected tokens per round
(1 - a^(g+1)) / (1 - a) and speed-up (1 - a^(g+1)) / ((1 - a)(g c + 1)).
"""

from __future__ import annotations

import math

import torch

from llmlab.inference.decode import SamplingParams
from llmlab.inference.speculative.acceptance import probs
from llmlab.inference.speculative.rounds import SpecStats


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
