"""8. Prompt lookup on input-grounded text (stdlib source quoted again, a function to rewrite), and whether
the target copies a passage it just read: lookup's drafts pay only where the model itself would copy."""

from __future__ import annotations

import statistics

import torch

from llmlab.core.results import LabResult
from llmlab.inference import speculative as S
from llmlab.inference import verify_cost as V
from llmlab.inference import workloads
from llmlab.labs.speculative.config import COPY_TOKENS, Config
from llmlab.labs.speculative.harness import identity_rows, lookup_fn, lookup_row, plain_fn, timed
from llmlab.labs.speculative.pair import Pair, prompt_lookup, sampling_params


def workload_prompts(pair: Pair, kind: str, n: int) -> list[torch.Tensor]:
    return [pair.tokenizer(t, return_tensors="pt", add_special_tokens=False)["input_ids"].to(pair.device.torch)
            for t in workloads.prompts(kind, n)]


def copy_accuracy(model, prompts: list[torch.Tensor], n: int = COPY_TOKENS) -> dict:
    """Greedy next-token accuracy on an n-token passage read once, then read again right after itself. A model
    that copies (induction heads) predicts the repeat almost perfectly, and that is what lookup's drafts need on
    input-grounded text: they are accepted only where the model itself would copy. n stays inside the built-in
    pair's 128-token training window."""
    first, second = [], []
    with torch.no_grad():
        for ids in prompts:
            p = ids[:, :n]
            k = p.shape[1]
            x = torch.cat([p, p], 1)
            hit = (model(x).logits[0, :-1].argmax(-1) == x[0, 1:]).float()  # hit[i]: position i predicts x[i + 1]
            first.append(hit[: k - 1].mean().item())
            second.append(hit[k:].mean().item())  # k - 1 predicts the repeat's first token: no cue yet, left out
    return dict(passages=len(prompts), tokens=k, first_read=statistics.fmean(first),
                second_read=statistics.fmean(second))


def part_lookup(res: LabResult, pair: Pair, speed: Pair, cfg: Config, costs: dict, identity: list, progress) -> None:
    """Greedy prompt lookup against plain decoding on input-grounded prompts (stdlib source quoted again, a
    function to rewrite), beside the open-ended control measured in the speed part (same interleaving).
    Whether the model copies is the trained target's; the timings are the timing pair's."""
    rows = []
    if cfg.workload_prompts:
        params, n = sampling_params(cfg, 0.0), cfg.new_tokens
        sets = {k: workload_prompts(pair, k, cfg.workload_prompts) for k in ("quote", "edit")}
        res.add_table("copy", [copy_accuracy(pair.target, sets["quote"])])
        fns = {}
        for k, ps in sets.items():
            fns[f"plain {k}"] = plain_fn(speed, n, params, None, ps)
            fns[f"lookup {k}"] = lookup_fn(speed, n, params, None, prompt_lookup(cfg), ps)
        first, secs = timed(speed, fns, max(cfg.repeats, 1), progress, "prompt lookup: quote, edit")
        for k, ps in sets.items():
            refs = first[f"plain {k}"]
            rows.append(dict(lookup_row(k, first[f"lookup {k}"], refs, secs, f"lookup {k}", f"plain {k}", n * len(ps)),
                             prompt_tokens=statistics.fmean(p.shape[1] for p in ps)))
            identity += identity_rows(f"prompt lookup, {k}", [o.tokens for o in first[f"lookup {k}"]], refs)
    if "lookup_open" in costs:
        rows.append(dict(costs["lookup_open"], prompt_tokens=statistics.fmean(p.shape[1] for p in pair.prompts)))
    curve = costs.get("curve", {})
    for r in rows:  # Leviathan with c = 0, on rounds that drafted, and the verify cost over the mean drafted length + 1
        if curve and r["alpha"] == r["alpha"]:
            g, f = r["mean_drafted"], r["found_share"]
            tau = f * S.expected_tau(r["alpha"], max(1, round(g))) + (1 - f)  # a round without a draft: 1 token
            r["predicted_speedup"] = tau / (f * V.interpolate(curve, g + 1) + (1 - f))
    res.add_table("lookup", rows)
