"""The measuring harness every part shares: untimed then interleaved timed passes, speed-up rows, identity rows.

Each method is a function of `record` (True on the untimed pass, whose outputs come back) that runs one
pass over the pair's prompts; `timed` interleaves them so a shared machine's drift hits all alike.
"""

from __future__ import annotations

import math
import statistics

import torch

from llmlab.core import stats as st
from llmlab.core.render import track
from llmlab.core.timing import interleaved
from llmlab.inference import decode
from llmlab.inference import speculative as S
from llmlab.inference.decode import SamplingParams
from llmlab.labs.speculative.pair import Pair


def timed(pair: Pair, fns: dict, repeats: int, progress, label: str):
    """One untimed pass per method (its outputs come back: identity, acceptance), then `repeats`
    interleaved timed rounds (core.timing.interleaved). repeats 0: the untimed pass only."""
    first = {k: (lambda f=f: f(True)) for k, f in fns.items()}
    if repeats == 0:
        return {k: f() for k, f in first.items()}, None
    out = interleaved({k: (lambda f=f: f(False)) for k, f in fns.items()}, repeats, pair.device, first=first,
                      rounds=lambda it: track(progress, it, label, total=repeats))
    return out.outputs, out.seconds


def speed_row(secs: dict | None, name: str, base: str, tokens: int) -> dict:
    """tokens/s (median, p10, p90 over rounds) and the speed-up vs `base` as the median of per-round ratios."""
    if secs is None:
        return dict(tokens_per_s=math.nan, speedup=math.nan, speedup_p10=math.nan, speedup_p90=math.nan)
    tps = st.summary(tokens / s for s in secs[name])
    ratio = st.summary(b / s for b, s in zip(secs[base], secs[name], strict=True))
    return dict(tokens_per_s=tps.median, tokens_per_s_p10=tps.p10, tokens_per_s_p90=tps.p90,
                speedup=ratio.median, speedup_p10=ratio.p10, speedup_p90=ratio.p90)


def merged(outs) -> S.SpecStats:
    stats = S.SpecStats()
    for o in outs:
        stats.merge(o.stats)
    return stats


def plain_fn(pair: Pair, n: int, params: SamplingParams, gen, prompts=None):
    return lambda rec: pair.run(lambda ids: decode.generate(pair.target, ids, n, params, gen).tokens, prompts)


def spec_fn(pair: Pair, n: int, params: SamplingParams, gen, prompts=None, **kw):
    return lambda rec: pair.run(lambda ids: S.speculative_generate(pair.target, pair.draft, ids, n, params=params,
                                                                    generator=gen, record_beta=rec, **kw), prompts)


def lookup_fn(pair: Pair, n: int, params: SamplingParams, gen, lookup: S.PromptLookup, prompts=None):
    return lambda rec: pair.run(lambda ids: S.lookup_generate(pair.target, ids, n, lookup, params, gen), prompts)


def lookup_row(workload: str, outs: list, refs: list, secs, name: str, base: str, tokens: int) -> dict:
    """A workload's prompt-lookup figures: acceptance, tokens per target forward, rounds that found a draft,
    and the speed-up over plain decoding; its prediction from the measured verify cost is added later."""
    stats = merged(outs)
    m = S.acceptance_metrics(stats)
    found = sum(g > 0 for g in stats.drafted) / max(1, len(stats.drafted))
    mean_g = statistics.fmean([g for g in stats.drafted if g > 0] or [0])
    identical = all(torch.equal(o.tokens, r) for o, r in zip(outs, refs, strict=True))
    return dict(workload=workload, prompts=len(outs), alpha=m["alpha"],
                tokens_per_target_forward=m["tokens_per_target_forward"],
                found_share=found, mean_drafted=mean_g, identical=identical, predicted_speedup=math.nan,
                **speed_row(secs, name, base, tokens))


def tree_fn(pair: Pair, n: int, params: SamplingParams, gen, branching: tuple[int, ...], prompts=None):
    return lambda rec: pair.run(lambda ids: S.tree_generate(pair.target, pair.draft, ids, n, branching=branching,
                                                             params=params, generator=gen), prompts)


def identity_rows(check: str, outs: list[torch.Tensor], refs: list[torch.Tensor]) -> list[dict]:
    """One row per prompt: identical or the first divergence (every token: no side handles EOS)."""
    rows = []
    for i, (out, ref) in enumerate(zip(outs, refs, strict=True)):
        a, b = out.flatten().tolist(), ref.flatten().tolist()
        div = next((j for j, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), -1)
        if div < 0 and len(a) != len(b):
            div = min(len(a), len(b))
        rows.append(dict(check=check, prompt=i, tokens=len(b), identical=div < 0, first_divergence=div))
    return rows
