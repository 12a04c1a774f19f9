"""4. Temperature, 5. draft-length policies, 6. a token tree against chains, 7. batch size: each at one
draft budget, greedy where the comparison needs the identity check."""

from __future__ import annotations

import statistics

import torch

from llmlab.core.results import LabResult
from llmlab.inference import speculative as S
from llmlab.labs.speculative.config import Config
from llmlab.labs.speculative.harness import identity_rows, merged, plain_fn, spec_fn, speed_row, timed, tree_fn
from llmlab.labs.speculative.pair import Pair, prompt_set, sampling_params


def part_temperature_sweep(res: LabResult, pair: Pair, cfg: Config, gen, progress) -> None:
    prompts = pair.prompts[:2]
    fns = {}
    for t in cfg.temperatures:
        p = sampling_params(cfg, t)
        fns[f"plain T={t}"] = plain_fn(pair, cfg.new_tokens, p, gen, prompts)
        fns[f"spec T={t}"] = spec_fn(pair, cfg.new_tokens, p, gen, prompts, gamma=cfg.gamma)
    if cfg.sweep_repeats == 0:
        fns = {k: f for k, f in fns.items() if k.startswith("spec")}
    first, secs = timed(pair, fns, cfg.sweep_repeats, progress, "temperature sweep")
    tokens = cfg.new_tokens * len(prompts)
    rows = []
    for t in cfg.temperatures:
        m = S.acceptance_metrics(merged(first[f"spec T={t}"]))
        rows.append(dict(temperature=t, gamma=cfg.gamma, alpha=m["alpha"], beta=m["beta"], beta_se=m["beta_se"],
                         examined=m["examined"], tau=m["tau"],
                         **speed_row(secs, f"spec T={t}", f"plain T={t}", tokens)))
    res.add_table("temperature_sweep", rows)


# ---------------------------------------------------------------- 5. policies


def part_policies(res: LabResult, pair: Pair, cfg: Config, gen, refs: list, identity: list, progress) -> None:
    """Greedy, so the oracle is defined (it drafts exactly the tokens the target will accept). Every policy
    gets the same draft budget: at most max(gammas) tokens per round."""
    params, n = sampling_params(cfg, 0.0), cfg.new_tokens
    runs = [S.oracle_run_lengths(pair.draft, ids, ref) for ids, ref in zip(pair.prompts, refs, strict=True)]
    top = max(cfg.gammas)
    make = {
        f"constant {cfg.gamma}": (cfg.gamma, lambda i: S.ConstantGamma(cfg.gamma)),
        "heuristic +2/-1": (top, lambda i: S.HeuristicGamma(cfg.gamma, max_gamma=top)),
        f"confidence < {cfg.confidence}": (top, lambda i: S.ConfidenceGamma(cfg.confidence, max_gamma=top)),
        "oracle": (top, lambda i: S.OracleGamma(runs[i], max_gamma=top)),
    }

    def policy_fn(mk):
        return lambda rec: [S.speculative_generate(pair.target, pair.draft, ids, n, params=params, policy=mk(i))
                            for i, ids in enumerate(pair.prompts)]

    fns = ({"plain": plain_fn(pair, n, params, gen)} if cfg.sweep_repeats else {}) \
        | {k: policy_fn(mk) for k, (_, mk) in make.items()}
    first, secs = timed(pair, fns, cfg.sweep_repeats, progress, "draft-length policies")
    tokens = n * len(pair.prompts)
    rows = []
    for k, (max_g, _) in make.items():
        stats = merged(first[k])
        m = S.acceptance_metrics(stats)
        rows.append(dict(policy=k, max_gamma=max_g, tokens_per_target_forward=m["tokens_per_target_forward"],
                         draft_forwards_per_token=stats.draft_forwards / tokens,
                         mean_drafted=statistics.fmean(stats.drafted),
                         alpha=m["alpha"], **speed_row(secs, k, "plain", tokens)))
        identity += identity_rows(f"policy {k}", [o.tokens for o in first[k]], refs)
    res.add_table("policies", rows)


# ---------------------------------------------------------------- 6. tree


def part_tree(res: LabResult, pair: Pair, cfg: Config, gen, refs: list, identity: list, progress) -> None:
    """The tree against two chains: one as deep (which the greedy tree contains, so it cannot lose on
    tokens per forward) and one that verifies as many positions per forward (the same verify budget)."""
    n, depth, nodes = cfg.new_tokens, len(cfg.tree), S.tree_shape(cfg.tree).size
    t_s = cfg.temperature or 1.0
    fns = {}
    labels = {"greedy": sampling_params(cfg, 0.0)}
    if cfg.tree_sampled:
        labels[f"T={t_s}"] = sampling_params(cfg, t_s)
    for label, p in labels.items():
        if cfg.sweep_repeats:
            fns[f"plain {label}"] = plain_fn(pair, n, p, gen)
        fns[f"chain {depth} {label}"] = spec_fn(pair, n, p, gen, gamma=depth)
        fns[f"chain {nodes} {label}"] = spec_fn(pair, n, p, gen, gamma=nodes)
        fns[f"tree {label}"] = tree_fn(pair, n, p, gen, cfg.tree)
    first, secs = timed(pair, fns, cfg.sweep_repeats, progress, "tree vs chain")
    tokens = n * len(pair.prompts)
    rows = []
    for label in labels:
        for kind, verified, budget in ((f"chain {depth}", depth + 1, "same depth"),
                                       (f"chain {nodes}", nodes + 1, "same verify budget"),
                                       ("tree", nodes + 1, f"tree {cfg.tree}")):
            m = S.acceptance_metrics(merged(first[f"{kind} {label}"]))
            rows.append(dict(sampling=label, method=kind if kind == "tree" else f"chain gamma={kind.split()[1]}",
                             compared=budget, verified_per_forward=verified,
                             tokens_per_target_forward=m["tokens_per_target_forward"],
                             **speed_row(secs, f"{kind} {label}", f"plain {label}", tokens)))
    identity += identity_rows(f"tree {cfg.tree}", [o.tokens for o in first["tree greedy"]], refs)
    res.add_table("tree", rows)


# ---------------------------------------------------------------- 7. batch


def part_batch(res: LabResult, pair: Pair, cfg: Config, progress) -> None:
    """Greedy speed-up vs batch size, distinct prompts cut to one length (no padding)."""
    if not cfg.batch_sizes:
        res.skip("batch", "not in --quick (timed batches take minutes)")
        return
    if cfg.sweep_repeats == 0:
        res.skip("batch", "sweep_repeats 0: the batch part is a timing")
        return
    toks = prompt_set(cfg, pair, max(cfg.batch_sizes))
    s = min(t.shape[1] for t in toks)
    params, n = sampling_params(cfg, 0.0), cfg.batch_tokens
    fns = {}
    for b in cfg.batch_sizes:
        ids = torch.cat([t[:, :s] for t in toks[:b]])
        fns[f"plain B={b}"] = plain_fn(pair, n, params, None, [ids])
        fns[f"spec B={b}"] = spec_fn(pair, n, params, None, [ids], gamma=cfg.gamma)
    first, secs = timed(pair, fns, cfg.sweep_repeats, progress, "batch sweep")
    rows = []
    for b in cfg.batch_sizes:
        m = S.acceptance_metrics(merged(first[f"spec B={b}"]))
        rows.append(dict(batch=b, distinct_prompts=len({tuple(t[0, :s].tolist()) for t in toks[:b]}), prompt_tokens=s,
                         alpha_per_row=m["alpha"], tau_per_row=m["tau"],
                         tokens_per_round_min_rule=m["tokens_per_target_forward"],
                         plain_tokens_per_s=statistics.median(b * n / x for x in secs[f"plain B={b}"]),
                         **speed_row(secs, f"spec B={b}", f"plain B={b}", b * n)))
    res.add_table("batch", rows)
