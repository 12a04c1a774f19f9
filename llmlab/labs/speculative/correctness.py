"""1. Same output: the tree forward equals plain forwards of each path, and B = 1 sampled runs follow the
target's exact joint law of their first tokens (a chi-square test), chain and tree."""

from __future__ import annotations

import torch

from llmlab.core import stats as st
from llmlab.core.results import LabResult
from llmlab.inference import speculative as S
from llmlab.inference.decode import SamplingParams
from llmlab.labs.speculative.config import DIST_TOKENS, TREE_TOL, Config
from llmlab.labs.speculative.pair import Pair, sampling_params


def part_tree_check(res: LabResult, pair: Pair, cfg: Config) -> bool:
    """The target's logits at every tree node, from one tree forward, equal a plain forward of that node's path."""
    shape = S.tree_shape(cfg.tree)
    ids = pair.prompts[0]
    with torch.inference_mode():
        (d_cache, t_cache), last = S.prefill([pair.draft, pair.target], ids)
        nodes, _ = S.draft_tree(pair.draft, d_cache, last, shape, sampling_params(cfg, 0.0))  # (1, N)
        tree = S.tree_forward(pair.target, torch.cat([last, nodes], 1), t_cache, shape.with_root(),
                              shape.positions(ids.shape[1] - 1, ids.device))  # (1, 1 + N, V)
        worst = 0.0
        for j in range(shape.size):
            path, k = [], j
            while k >= 0:
                path.insert(0, int(nodes[0, k]))
                k = shape.parent[k]
            want = pair.target(input_ids=torch.cat([ids, torch.tensor([path], device=ids.device)], 1)).logits[0, -1]
            worst = max(worst, float((tree[0, 1 + j] - want.float()).abs().max()))
    tol = TREE_TOL
    res.add_table("tree_check", [dict(branching=str(cfg.tree), nodes=shape.size, max_abs_logit_diff=worst,
                                      tolerance=tol, match=worst <= tol)])
    return worst <= tol


def coverage(stats: S.SpecStats, upto: int) -> dict:
    """What a B = 1 run exercised within its first `upto` tokens: rounds that accepted >= 2 drafts, residual
    draws (a rejection) at output positions 2..upto, and bonus tokens after a fully accepted round."""
    multi = residual = bonus = 0
    produced = 0
    for g, ns, emitted in zip(stats.drafted, stats.accepted, stats.emitted, strict=True):
        n = ns[0]
        if g > 0:
            multi += n >= 2
            residual += n < g and 2 <= produced + n + 1 <= upto
            bonus += n == g and produced + g + 1 <= upto
        produced += emitted
    return dict(multi_accept_rounds=multi, residual_draws=residual, bonus_tokens=bonus)


def part_distribution(res: LabResult, pair: Pair, cfg: Config) -> None:
    """B = 1 sampled runs, one seed each, against the target's exact law of its first tokens (chi-square).

    A one-token prompt: every new token comes out of a verification. The chain drafts 3 tokens, so a
    round can accept several (positions 1-3), reject at 2-3 (a residual draw) or accept all (the bonus
    at 4); the tree (the lab's shape cut to depth 3, children sampled from q) the same, per node.
    """
    params = SamplingParams(temperature=cfg.temperature or 1.0, top_k=cfg.dist_top_k, top_p=cfg.top_p)
    prompt = pair.prompts[0][:, :1]  # (1, 1)
    law = S.exact_law(pair.target, prompt, DIST_TOKENS, params)
    first3 = _marginal(law, (0, 1, 2))
    gen = torch.Generator(device=pair.device.torch)
    methods = {
        "chain gamma=3": lambda: S.speculative_generate(pair.target, pair.draft, prompt, DIST_TOKENS, gamma=3,
                                                        params=params, generator=gen),
        f"tree {cfg.tree[:3]}": lambda: S.tree_generate(pair.target, pair.draft, prompt, DIST_TOKENS,
                                                         branching=cfg.tree[:3], params=params, generator=gen),
    }
    rows = []
    for name, fn in methods.items():
        toks, cov = [], dict(multi_accept_rounds=0, residual_draws=0, bonus_tokens=0)
        for s in range(cfg.dist_samples):
            gen.manual_seed(cfg.seed * 1_000_003 + s)
            out = fn()
            toks.append(tuple(out.tokens[0].tolist()))
            for k, v in coverage(out.stats, DIST_TOKENS).items():
                cov[k] += v
        for label, keep, exact in (("tokens 1-3 jointly", (0, 1, 2), first3),
                                   (f"tokens 1-{DIST_TOKENS} jointly", tuple(range(DIST_TOKENS)), law)):
            counts: dict = {}
            for row in toks:
                key = tuple(row[i] for i in keep)
                counts[key] = counts.get(key, 0) + 1
            pv, cells = st.chisquare_pvalue(counts, exact, len(toks))
            rows.append(dict(method=name, outcome=label, samples=len(toks), cells=cells, p_value=pv,
                             significance=st.SIGNIFICANCE, detectable_w=st.detectable_effect(cells, len(toks)),
                             passes=pv > st.SIGNIFICANCE, **cov))
    res.add_table("distribution", rows)


def _marginal(law: dict, keep: tuple[int, ...]) -> dict:
    out: dict = {}
    for k, v in law.items():
        key = tuple(k[i] for i in keep)
        out[key] = out.get(key, 0.0) + v
    return out
