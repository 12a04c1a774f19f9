"""The samplers lab's verdicts and headline, from the tables alone."""

from __future__ import annotations

import math

from llmlab.core.results import Claim, LabResult
from llmlab.labs.samplers.config import GOAL
from llmlab.labs.samplers.fates import spearman

ARTICLE_RATIO = 9.0  # "top-p costs about 9x greedy" (the article)


# ----------------------------------------------------------------------------- judge: every verdict from the tables

PARITY_TOL = 1e-5  # kept logits may differ by float rounding of the temperature division only
SHARE_MAX = 0.10  # "a small part of a decode step"
CHI2_ALPHA = 1e-3  # a correct sampler fails the chi-square test 1 run in 1,000 (core.stats.SIGNIFICANCE)


def judge(result: LabResult) -> list[Claim]:
    """Pure: the claims from result.tables alone (a saved run re-judges the same)."""
    T = result.tables
    claims = []
    if "sure_vs_unsure" in T:
        claims.append(_judge_min_p(T["sure_vs_unsure"], result.config.get("top_k", 40)))
    if "hf_parity" in T:
        claims.append(_judge_parity(T["hf_parity"]))
    if "distribution" in T:
        claims.append(_judge_distribution(T["distribution"]))
    if "latency" in T and not T["latency"].empty:
        lat = T["latency"]
        claims += [_judge_nine_x(lat), _judge_faster(lat), _judge_goal(lat)]
    if "decode_share" in T and not T["decode_share"].empty:
        claims.append(_judge_share(T["decode_share"]))
    return claims


def confidence_quarters(df):
    """sure_vs_unsure (T rows) -> 4 rows: the positions by quarter of the top token's probability, median kept
    counts."""
    import pandas as pd

    if len(df) < 4:  # too few positions (a run stopped early) for quarters
        q = pd.Series("all", index=df.index)
    else:
        q = pd.qcut(df["top_prob"].rank(method="first"), 4, labels=["least sure", "2nd", "3rd", "most sure"])
    g = df.groupby(q, observed=True)
    out = g[["top_prob", "kept_top_k", "kept_top_p", "kept_min_p"]].median()
    out["positions"] = g.size()
    return out.reset_index(names="quarter")


def _judge_min_p(df, top_k: int) -> Claim:
    rho = spearman(df["top_prob"], df["kept_min_p"])
    q = confidence_quarters(df).set_index("quarter")
    unsure, sure = q.loc["least sure", "kept_min_p"], q.loc["most sure", "kept_min_p"]
    return Claim("samplers.min_p_adapts", "min-p keeps more tokens when the model is unsure",
                 "Spearman rho(top p, kept) < -0.5 and least-sure quarter keeps more than most-sure",
                 f"rho {rho:.2f} over {len(df)} positions; kept {unsure:.0f} vs {sure:.0f}",
                 bool(rho < -0.5 and unsure > sure), note=f"top-k keeps {top_k} at every position by design")


def _judge_parity(df) -> Claim:
    same = int(df["rows_same_kept_set"].sum())
    total = int(df["rows"].sum())
    diff = float(df["max_abs_logit_diff"].max())
    return Claim("samplers.hf_parity", "our processors keep exactly HF's tokens (real logits)",
                 f"every row the same kept set, max logit diff <= {PARITY_TOL:g}",
                 f"{same}/{total} rows ({len(df)} processors), max diff {diff:.1g}",
                 bool(same == total and diff <= PARITY_TOL))


def _judge_distribution(df) -> Claim:
    d = df.iloc[0]
    return Claim("samplers.sorting_free_same_distribution", "sorting-free top-p samples the sort-based distribution",
                 f"chi-square p > {CHI2_ALPHA:g}, no draw outside the kept set",
                 f"p = {d['p_value']:.3f} (chi2 {d['chi2']:.1f}, {int(d['dof'])} dof), "
                 f"{int(d['samples_outside_kept_set'])} outside",
                 bool(d["p_value"] > CHI2_ALPHA and d["samples_outside_kept_set"] == 0),
                 note=f"{int(d['samples'])} draws in {int(d['bins'])} bins of ~equal mass; TV {d['tv_distance']:.3f}"
                      + (f"; detects w >= {d['detectable_w']:.2f}" if "detectable_w" in d else ""))


def headline_cell(df) -> tuple[int, int]:
    """(V, B) the claims read: V = 128256 if measured (else the largest), B = 32 if measured (else the largest
    <= 32)."""
    V = 128256 if (df["vocab"] == 128256).any() else int(df["vocab"].max())
    bs = sorted(df[df["vocab"] == V]["batch"].unique())
    B = 32 if 32 in bs else max([b for b in bs if b <= 32] or bs)
    return int(V), int(B)


def _ms(df, V, B, strategy, impl) -> float:
    r = df[(df["vocab"] == V) & (df["batch"] == B) & (df["strategy"] == strategy) & (df["impl"] == impl)]
    return float(r["latency_median_ms"].iloc[0]) if len(r) else float("nan")


def _judge_nine_x(df) -> Claim:
    V, B = headline_cell(df)
    greedy = _ms(df, V, B, "greedy", "argmax")
    ratio = _ms(df, V, B, "top_p", "hf+multinomial") / greedy
    ours = _ms(df, V, B, "top_p", "ours sorting-free") / greedy
    return Claim("samplers.top_p_cost_vs_greedy", "top-p costs about 9x greedy",
                 f"HF top-p / argmax in {ARTICLE_RATIO / 2:.1f}-{ARTICLE_RATIO * 2:.0f}x (the article's "
                 f"~{ARTICLE_RATIO:.0f}x; sort ~ {math.log2(V):.0f} passes)",
                 f"HF top-p {ratio:.1f}x argmax (V={V:,}, B={B}); ours {ours:.1f}x",
                 bool(ARTICLE_RATIO / 2 <= ratio <= ARTICLE_RATIO * 2))


def _judge_faster(df) -> Claim:
    V, B = headline_cell(df)
    ours = _ms(df, V, B, "top_p", "ours sorting-free")
    vs_hf, vs_sort = _ms(df, V, B, "top_p", "hf+multinomial") / ours, _ms(df, V, B, "top_p", "ours+race") / ours
    return Claim("samplers.sorting_free_faster", "sorting-free top-p is faster than a sort-based one",
                 "> 1x HF and > 1x our sorted",
                 f"{vs_hf:.1f}x HF, {vs_sort:.1f}x our sorted (V={V:,}, B={B})", bool(vs_hf > 1 and vs_sort > 1))


def _judge_goal(df) -> Claim:
    kind = str(df["device"].iloc[0]) if "device" in df else "cpu"
    goal = GOAL.get(kind, GOAL["cpu"])
    hf, ours = _ms(df, 128256, 32, "top_p", "hf+multinomial"), _ms(df, 128256, 32, "top_p", "ours sorting-free")
    text = f"sorting-free top-p >= {goal}x HF at V=128,256, B=32 ({kind.upper()})"
    if math.isnan(hf) or math.isnan(ours):
        return Claim("samplers.sorting_free_goal", text, f"HF / ours >= {goal}x", "-", None,
                     note="not measured: no B=32 in this grid (--quick); the full run has it")
    return Claim("samplers.sorting_free_goal", text, f"HF / ours >= {goal}x",
                 f"{hf / ours:.2f}x ({hf:.1f} vs {ours:.1f} ms)",
                 bool(hf / ours >= goal))


def _judge_share(df) -> Claim:
    worst = df.loc[df["sampler_share"].idxmax()]
    return Claim("samplers.sampler_small_share", "the sampler is a small part of a decode step (own vocab)",
                 f"every strategy < {SHARE_MAX:.0%} of sampler + forward at B=1, V={int(worst['vocab']):,}",
                 f"{worst['strategy']} {worst['impl']} {worst['sampler_ms']:.2f} of {worst['forward_ms']:.1f} ms "
                 f"= {worst['sampler_share']:.1%}", bool(worst["sampler_share"] < SHARE_MAX))


def headline(result: LabResult, claims: list[Claim]) -> str:
    """The one thing this run found."""
    T = result.tables
    parts = []
    if "fates" in T:
        f = T["fates"].set_index("strategy")
        parts.append(f"On {result.config.get('prompt', 'the prompt')!r} top-p keeps "
                     f"{int(f.loc['top_p', 'kept_tokens']):,} "
                     f"tokens, min-p {int(f.loc['min_p', 'kept_tokens']):,}, top-k "
                     f"{int(f.loc['top_k', 'kept_tokens']):,}.")
    if "latency" in T and not T["latency"].empty:
        lat = T["latency"]
        V, B = headline_cell(lat)
        greedy = _ms(lat, V, B, "greedy", "argmax")
        ratio = _ms(lat, V, B, "top_p", "hf+multinomial") / greedy
        parts.append(f"At V={V:,}, B={B} HF top-p costs {ratio:.1f}x greedy here; sorting-free top-p "
                     f"{_ms(lat, V, B, 'top_p', 'ours sorting-free') / greedy:.1f}x.")
        if ratio > 2 * ARTICLE_RATIO and lat["device"].iloc[0] == "cpu":
            parts.append("A CPU sort is ~log2 V passes of branchy compares; the 9x is a GPU figure.")
    return " ".join(parts)
