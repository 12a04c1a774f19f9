"""2. Costs and 3. speed: the draft/target cost ratio c and the verify cost, then plain against speculative
decoding (ours at each gamma, HF assisted, prompt lookup) in one interleaved set, with Leviathan's prediction."""

from __future__ import annotations

import time

import torch

from llmlab.core.results import LabResult
from llmlab.core.stats import summary
from llmlab.inference import decode
from llmlab.inference import speculative as S
from llmlab.labs.speculative.config import Config
from llmlab.labs.speculative.harness import (
    identity_rows,
    lookup_fn,
    lookup_row,
    merged,
    plain_fn,
    spec_fn,
    speed_row,
    timed,
)
from llmlab.labs.speculative.pair import Pair, prompt_lookup, sampling_params


def part_costs(res: LabResult, pair: Pair, cfg: Config) -> dict:
    """Cost of one draft forward, one target forward, and a target verify over g + 1 tokens, in alternation."""
    ids = pair.prompts[0]
    with torch.inference_mode():
        ctx = torch.cat([ids, decode.generate(pair.target, ids, cfg.new_tokens // 2).tokens], 1)
        caches = {m: decode.new_cache(model) for m, model in (("target", pair.target), ("draft", pair.draft))}
        decode.forward(pair.target, ctx, caches["target"])
        decode.forward(pair.draft, ctx, caches["draft"])
        n0 = ctx.shape[1]
        gs = sorted(set(cfg.gammas) | {cfg.gamma})
        shapes = [("target", 1), ("draft", 1)] + [("target", g + 1) for g in gs]
        samples = {s: [] for s in shapes}
        x = ctx[:, -9:].repeat(1, 2)  # real tokens to feed
        for _ in range(cfg.cost_samples):
            for model_name, t in shapes:
                model = pair.target if model_name == "target" else pair.draft
                pair.device.synchronize()
                t0 = time.perf_counter()
                decode.forward(model, x[:, :t], caches[model_name], logits_to_keep=t)
                pair.device.synchronize()
                samples[(model_name, t)].append((time.perf_counter() - t0) * 1e3)
                decode.crop(caches[model_name], n0)
    stats = {s: summary(v) for s, v in samples.items()}
    t1 = stats[("target", 1)].median
    rows = [dict(model=m, tokens=t, context=n0, **stats[(m, t)].as_dict(suffix="_ms"),
                 relative_to_target_step=stats[(m, t)].median / t1) for m, t in shapes]
    res.add_table("costs", rows)
    c = stats[("draft", 1)].median / t1
    return dict(c=c, verify={t - 1: stats[("target", t)].median / t1 for m, t in shapes if m == "target"})


def part_speed(res: LabResult, pair: Pair, cfg: Config, gen, costs: dict, identity: list, progress) -> list:
    """Plain (ours, HF generate), speculative at every gamma, HF assisted at the lab's gamma: one interleaved set.

    Returns greedy references of plain decoding on the pair's prompts (the policies and the tree check
    their identity against them)."""
    n, params = cfg.new_tokens, sampling_params(cfg)
    hf_kw = {} if params.greedy else dict(do_sample=True, temperature=params.temperature, top_k=params.top_k,
                                          top_p=params.top_p)
    gs = sorted(set(cfg.gammas) | {cfg.gamma})
    fns = {
        "plain (ours)": plain_fn(pair, n, params, gen),
        "HF generate": lambda rec: pair.run(lambda ids: decode.hf_generate(pair.target, ids, n, **hf_kw)),
        "HF assisted": lambda rec: pair.run(
            lambda ids: S.hf_assisted_generate(pair.target, pair.draft, ids, n, cfg.gamma, **hf_kw)),
        "prompt lookup": lookup_fn(pair, n, params, gen, prompt_lookup(cfg)),
    } | {f"g{g}": spec_fn(pair, n, params, gen, gamma=g) for g in gs}
    first, secs = timed(pair, fns, cfg.repeats, progress, "speed: plain vs speculative at each gamma")
    refs = first["plain (ours)"]
    tokens = n * len(pair.prompts)
    c = costs["c"]
    sweep = []
    for g in gs:
        m = S.acceptance_metrics(merged(first[f"g{g}"]))
        v = costs["verify"][g]
        sweep.append(dict(gamma=g, alpha=m["alpha"], tau=m["tau"], expected_tau=S.expected_tau(m["alpha"], g),
                          cost_ratio_c=c, verify_cost=v, **speed_row(secs, f"g{g}", "plain (ours)", tokens),
                          predicted_speedup=S.predicted_speedup(m["alpha"], g, c),
                          predicted_speedup_verify=S.predicted_speedup(m["alpha"], g, c, v)))
        if params.greedy:
            identity += identity_rows(f"chain gamma={g}", [o.tokens for o in first[f"g{g}"]], refs)
    res.add_table("gamma_sweep", sweep)
    main = next(r for r in sweep if r["gamma"] == cfg.gamma)
    lk = lookup_row("open (control)", first["prompt lookup"], refs, secs, "prompt lookup", "plain (ours)", tokens)
    costs["lookup_open"] = lk
    expected = {"plain (ours)": 1.0, "HF generate": 1.0, "speculative (ours)": main["predicted_speedup_verify"],
                "HF assisted": main["predicted_speedup_verify"], "prompt lookup (ours)": lk["predicted_speedup"]}
    rows = [dict(method=method, gamma=gamma, **speed_row(secs, key, "plain (ours)", tokens),
                 expected=expected[method], temperature=params.temperature, tokens=tokens, models=pair.label)
            for method, gamma, key in (("plain (ours)", 0, "plain (ours)"), ("HF generate", 0, "HF generate"),
                                       ("speculative (ours)", cfg.gamma, f"g{cfg.gamma}"),
                                       ("HF assisted", cfg.gamma, "HF assisted"),
                                       ("prompt lookup (ours)", cfg.lookup_tokens, "prompt lookup"))]
    res.add_table("speed", rows)
    m = S.acceptance_metrics(merged(first[f"g{cfg.gamma}"]))
    costs["alpha"] = m["alpha"]
    _acceptance_tables(res, m, main, params.temperature)
    if params.greedy:
        identity += identity_rows("HF assisted (the peer)", first["HF assisted"], refs)
        identity += identity_rows("prompt lookup, open", [o.tokens for o in first["prompt lookup"]], refs)
        return refs
    return pair.run(lambda ids: decode.generate(pair.target, ids, n).tokens)  # policies and tree need greedy refs


def _acceptance_tables(res: LabResult, m: dict, main: dict, temperature: float) -> None:
    """The lab's gamma in detail: acceptance beside the prediction, per drafted position, and the histogram."""
    res.add_table("acceptance", [dict(gamma=main["gamma"], temperature=temperature, rounds=m["rounds"],
                                      alpha=m["alpha"], beta=m["beta"], tau=m["tau"], expected_tau=main["expected_tau"],
                                      tokens_per_target_forward=m["tokens_per_target_forward"],
                                      cost_ratio_c=main["cost_ratio_c"], verify_cost=main["verify_cost"],
                                      predicted_speedup=main["predicted_speedup"],
                                      predicted_speedup_verify=main["predicted_speedup_verify"],
                                      measured_speedup=main["speedup"], measured_p10=main["speedup_p10"],
                                      measured_p90=main["speedup_p90"])])
    per_position = zip(m["per_position"], m["per_position_n"], strict=True)
    res.add_table("per_position", [dict(position=i + 1, acceptance=pa, examined=pn)
                                   for i, (pa, pn) in enumerate(per_position)])
    res.add_table("histogram", [dict(accepted=k, rounds=cnt, share=cnt / m["rounds"])
                                for k, cnt in m["histogram"].items()])
