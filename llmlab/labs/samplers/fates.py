"""Part 1 of the samplers lab: what each strategy keeps of the model's real next-token distribution."""

from __future__ import annotations

import torch

from llmlab.core.device import Device
from llmlab.core.results import LabResult
from llmlab.inference import sampling as S
from llmlab.labs.samplers.config import STRATEGIES, Config


def strategy_kwargs(cfg: Config, name: str) -> dict | None:
    """process_logits keywords of one strategy alone (None = greedy)."""
    return {
        "greedy": None,
        "temperature": {"temperature": cfg.temperature},
        "top_k": {"top_k": cfg.top_k},
        "top_p": {"top_p": cfg.top_p},
        "min_p": {"min_p": cfg.min_p},
    }[name]


def setting(cfg: Config, name: str) -> str:
    kw = strategy_kwargs(cfg, name)
    return "argmax" if kw is None else ", ".join(f"{k}={v}" for k, v in kw.items())


def show_token(tok: str) -> str:
    """A decoded token, readable in a table: spaces as '␣', newlines as '\\n'."""
    return tok.replace(" ", "␣").replace("\n", "\\n").replace("\t", "\\t") or "''"


def entropy(pr: torch.Tensor) -> torch.Tensor:
    """(..., V) probabilities -> (...) entropy in nats (0 log 0 = 0)."""
    return -(pr * pr.clamp_min(1e-30).log()).sum(-1)


# ----------------------------------------------------------------------------- 1. fates


def part_fates(res: LabResult, cfg: Config, lm, logits: torch.Tensor) -> None:
    p_model = logits.softmax(-1)[0]  # (V,)
    top = p_model.argsort(descending=True)[: cfg.bars]
    tok = lm.tokenizer
    rows = [{"rank": r + 1, "token": show_token(tok.decode([int(i)])), "token_id": int(i),
             "p_model": float(p_model[i])} for r, i in enumerate(top)]
    summary = []
    for name in STRATEGIES:
        kw = strategy_kwargs(cfg, name)
        if kw is None:
            pr = torch.zeros_like(p_model)
            pr[S.greedy(logits)[0]] = 1.0
        else:
            pr = S.probs(logits, **kw)[0]
        kept = pr > 0
        for r, i in zip(rows, top, strict=True):
            r[f"p_{name}"] = float(pr[i])
        summary.append({
            "strategy": name, "setting": setting(cfg, name), "kept_tokens": int(kept.sum()),
            "mass_kept": float(p_model[kept].sum()), "p_top_renorm": float(pr.max()),
            "entropy_nats": float(entropy(pr)),
        })
    for s in summary:
        s["vocab"] = p_model.numel()
        s["model_entropy_nats"] = float(entropy(p_model))
    res.add_table("fates", summary)
    res.add_table("fates_tokens", rows)


@torch.inference_mode()
def part_sure_vs_unsure(res: LabResult, cfg: Config, lm, device: Device) -> None:
    """Every position of a real passage: the model's confidence vs how many tokens each cut keeps."""
    import pydoc_data.topics

    text = pydoc_data.topics.topics["for"]  # real text every Python install carries
    ids = lm.tokenizer(text, return_tensors="pt").input_ids[:, : cfg.passage_tokens].to(device.torch)
    logits = lm.model(input_ids=ids).logits[0].float()  # (T, V): T next-token distributions
    pr = logits.softmax(-1)
    kept = {name: (S.process_logits(logits, **strategy_kwargs(cfg, name)) > S.NEG_INF).sum(-1) for name in ("top_k",
                                                                                                            "top_p",
                                                                                                            "min_p")}
    rows = [
        {"position": t, "top_prob": float(pr[t].max()), "entropy_nats": float(entropy(pr[t])),
         **{f"kept_{n}": int(k[t]) for n, k in kept.items()}}
        for t in range(ids.shape[1])
    ]
    res.add_table("sure_vs_unsure", rows)
    res.add_table("hf_parity", hf_parity_rows(cfg, logits))


def hf_parity_rows(cfg: Config, logits: torch.Tensor) -> list[dict]:
    """Our processors against transformers' warpers on real next-token distributions (T, V): kept sets and values."""
    from transformers.generation.logits_process import (
        LogitsProcessorList,
        MinPLogitsWarper,
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    hf = {"temperature": [TemperatureLogitsWarper(cfg.temperature)], "top_k": [TopKLogitsWarper(cfg.top_k)],
          "top_p": [TopPLogitsWarper(cfg.top_p)], "min_p": [MinPLogitsWarper(cfg.min_p)]}
    hf["all four"] = [w for ws in hf.values() for w in ws]
    rows = []
    for name, warpers in hf.items():
        kw = strategy_kwargs(cfg, name) if name != "all four" else {
            k: v for n in STRATEGIES[1:] for k, v in strategy_kwargs(cfg, n).items()}
        ours, theirs = S.process_logits(logits, **kw), LogitsProcessorList(warpers)(None, logits)  # (T, V) each
        kept_o, kept_t = ours > S.NEG_INF, theirs > S.NEG_INF
        same_set = (kept_o == kept_t).all(-1)  # (T,)
        diff = torch.where(kept_o & kept_t, (ours - theirs).abs(), 0.0).amax(-1)  # (T,)
        rows.append({"processor": name, "setting": ", ".join(f"{k}={v}" for k, v in kw.items()),
                     "rows": logits.shape[0],
                     "rows_same_kept_set": int(same_set.sum()), "max_abs_logit_diff": float(diff.max()),
                     "mean_kept": float(kept_o.sum(-1).float().mean())})
    return rows


def spearman(a, b) -> float:
    """Spearman rank correlation (Pearson on average ranks), without scipy."""
    return float(a.rank().corr(b.rank()))
