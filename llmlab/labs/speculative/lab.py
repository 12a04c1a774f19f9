"""run(): every part in the order of the article, on the loaded pair (correctness) and the timing pair."""

from __future__ import annotations

import torch

from llmlab.core.device import Device, torch_threads
from llmlab.core.results import LabResult
from llmlab.labs.speculative.config import LAB, VERSION, Config
from llmlab.labs.speculative.correctness import part_distribution, part_tree_check
from llmlab.labs.speculative.lookup import part_lookup
from llmlab.labs.speculative.pair import check_pair, load_pair, timing_pair
from llmlab.labs.speculative.regimes import part_verify_curve, trained_alpha
from llmlab.labs.speculative.speed import part_costs, part_speed
from llmlab.labs.speculative.sweeps import part_batch, part_policies, part_temperature_sweep, part_tree


def run(cfg: Config, device: Device, progress=None) -> LabResult:
    """Measures. Fills tables, env, notes and skipped. Never prints, never judges."""
    check_pair(cfg)
    res = LabResult.new(LAB, VERSION, cfg)
    with torch_threads(None if device.is_cuda else cfg.threads), res.guard():
        pair = load_pair(cfg, device)
        res.env["models"] = {"target": cfg.model, "draft": cfg.draft, "vocab": pair.target.config.vocab_size,
                             "target_params": sum(p.numel() for p in pair.target.parameters()),
                             "draft_params": sum(p.numel() for p in pair.draft.parameters())}
        res.env["torch_threads"] = torch.get_num_threads()
        gen = torch.Generator(device=device.torch).manual_seed(cfg.seed)
        identity: list[dict] = []
        try:
            tree_ok = part_tree_check(res, pair, cfg)  # correctness on the trained pair
            part_distribution(res, pair, cfg)
            speed = timing_pair(res, cfg, pair)  # every timed part on this pair
            costs = part_costs(res, speed, cfg)
            refs = part_speed(res, speed, cfg, gen, costs, identity, progress)
            part_temperature_sweep(res, speed, cfg, gen, progress)
            part_policies(res, speed, cfg, gen, refs, identity, progress)
            if tree_ok:
                part_tree(res, speed, cfg, gen, refs, identity, progress)
            else:
                res.skip("tree", "the tree forward check failed (see tree_check)")
            part_batch(res, speed, cfg, progress)
            if speed is not pair:  # the regimes' predictions take the trained pair's acceptance
                costs["alpha_trained"] = trained_alpha(pair, cfg)
            part_verify_curve(res, pair, speed, cfg, costs)
            part_lookup(res, pair, speed, cfg, costs, identity, progress)
        finally:
            res.add_table("identity", identity)
    return res
