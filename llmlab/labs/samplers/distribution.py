"""Part 3 of the samplers lab: the sorting-free top-p draws against the sort-based law (chi-square)."""

from __future__ import annotations

import torch

from llmlab.core.results import LabResult
from llmlab.inference import sampling as S
from llmlab.labs.samplers.config import Config

# ----------------------------------------------------------------------------- 3. distribution


def part_distribution(res: LabResult, cfg: Config, logits: torch.Tensor) -> None:
    """Chi-square: the sorting-free top-p sampler draws the sort-based (HF-parity) distribution."""
    from llmlab.core.stats import detectable_effect

    target = S.probs(logits, top_p=cfg.top_p)[0]  # (V,) sort-based, identical kept set to HF
    n = cfg.chi2_samples
    gen = torch.Generator(device=logits.device).manual_seed(cfg.seed + 1)
    ids = S.top_p_sorting_free(logits.softmax(-1).expand(n, -1).contiguous(), cfg.top_p, gen)
    outside = int((target[ids] == 0).sum())
    bins = mass_bins(target, n_bins=20)  # (V,) bin of each kept token, -1 elsewhere
    nb = int(bins.max()) + 1
    expected = torch.zeros(nb, dtype=torch.float64).index_add_(0, bins[bins >= 0].cpu(),
                                                               target[bins >= 0].double().cpu())
    observed = torch.bincount(bins[ids].cpu().clamp_min(0), minlength=nb).double()
    stat = float(((observed - n * expected) ** 2 / (n * expected)).sum())
    pvalue = float(torch.special.gammaincc(torch.tensor((nb - 1) / 2, dtype=torch.float64),
                                           torch.tensor(stat / 2, dtype=torch.float64)))
    tv = 0.5 * float((observed / n - expected).abs().sum())
    res.add_table("distribution", [{
        "top_p": cfg.top_p, "kept_tokens": int((target > 0).sum()), "samples": n, "bins": nb, "chi2": stat,
        "dof": nb - 1, "p_value": pvalue, "tv_distance": tv, "samples_outside_kept_set": outside,
        # Cohen's w the test catches with power 0.8: a pass means little above it
        "detectable_w": detectable_effect(nb, n),
    }])


def mass_bins(target: torch.Tensor, n_bins: int) -> torch.Tensor:
    """Group kept tokens, most likely first, into bins of about 1/n_bins of the mass each."""
    order = target.argsort(descending=True)
    cum = target[order].cumsum(0)
    b = (cum / cum[-1] * n_bins - 1e-9).floor().clamp(0, n_bins - 1).long()
    b = torch.unique_consecutive(b, return_inverse=True)[1]  # renumber the bins that are used
    out = torch.full_like(order, -1)
    out[order] = torch.where(target[order] > 0, b, -1)
    return out
