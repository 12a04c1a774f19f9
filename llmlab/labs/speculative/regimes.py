"""9. Verify cost, in cache and from DRAM: what one target forward over k tokens costs against one token,
and Leviathan's prediction for each regime from its own curve."""

from __future__ import annotations

import math

from llmlab.core.device import last_level_cache_bytes
from llmlab.core.results import LabResult
from llmlab.inference import speculative as S
from llmlab.inference import verify_cost as V
from llmlab.labs.speculative.config import Config
from llmlab.labs.speculative.harness import merged
from llmlab.labs.speculative.pair import Pair


def part_verify_curve(res: LabResult, pair: Pair, speed: Pair, cfg: Config, costs: dict) -> None:
    """Cost of one target forward over k tokens relative to one token, k = 1..16: the built-in target (in
    cache) and a DRAM-sized arch: model (random weights: a timing only): on CUDA the timing pair's target,
    else `dram_arch` with as many layers as reach dram_llc_multiple x the last-level cache this machine
    reports, or not measured where those do not fit in memory. Then Leviathan's prediction for each regime
    from the timing pair's alpha (at the lab's gamma), its c, and the regime's own verify cost."""
    dev, llc_mb = pair.device, last_level_cache_bytes(pair.device) / 1e6
    tiny_mb = 4 * sum(p.numel() for p in pair.target.parameters()) / 1e6
    regimes = [("in cache", dict(model=f"{cfg.model} (trained)", weights_MB=tiny_mb), pair.target)]
    if speed is not pair:
        m = res.env["speed_models"]
        regimes.append(("DRAM", dict(model=m["target"], weights_MB=m["target_MB"]), speed.target))
    else:
        try:
            big, info = V.dram_model(cfg.dram_arch, cfg.dram_llc_multiple, dev, cfg.seed,
                                     cfg.dram_max_mb * 1e6 or math.inf)
            regimes.append(("DRAM", info, big))
            if not info["llc_read"]:
                res.note(f"the last-level cache could not be read from sysfs: assumed {info['llc_MB']:.0f} MB")
        except (V.TooLarge, RuntimeError, MemoryError) as exc:  # the in-cache curve stands alone
            res.skip("verify_dram", f"no DRAM-sized model: {str(exc).splitlines()[0][:160]}")
    rows, pred = [], []
    for regime, meta, model in regimes:
        ms = V.verify_curve(model, dev, cfg.verify_ks, cfg.verify_samples)
        for k, t in ms.items():
            rows.append(dict(regime=regime, model=meta["model"], weights_MB=meta["weights_MB"], llc_MB=llc_mb,
                             weights_over_llc=meta["weights_MB"] / llc_mb, k=k, ms=t, relative_to_k1=t / ms[1]))
        rel = {k: t / ms[1] for k, t in ms.items()}
        alpha = costs.get("alpha_trained", costs["alpha"])
        pred.append(V.regime_prediction(regime, meta["model"], rel, dict(costs, alpha=alpha)))
        if model is speed.target:  # the timed loops' own verify cost, for the lookup predictions
            costs["curve"] = rel
    res.add_table("verify_curve", rows)
    res.add_table("regimes", pred)
    if not dev.is_cuda:
        res.skip("verify_gpu", "no GPU (--device cuda runs both regimes there)")
    if len(regimes) > 1:
        res.note(f"verify cost, DRAM regime: {regimes[1][1]['model']}, random weights: a timing only")


def trained_alpha(pair: Pair, cfg: Config) -> float:
    """The loaded pair's counted acceptance at the lab's gamma (greedy, untimed)."""
    outs = pair.run(lambda ids: S.speculative_generate(pair.target, pair.draft, ids, cfg.new_tokens, gamma=cfg.gamma))
    return S.acceptance_metrics(merged(outs))["alpha"]
