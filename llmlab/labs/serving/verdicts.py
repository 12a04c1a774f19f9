"""The serving lab's verdicts and headline, from the tables alone."""

from __future__ import annotations

import math

from llmlab.core.results import Claim, LabResult
from llmlab.labs.serving.config import BLOCK

COMPUTE_USE_MAX = 0.15  # one request at a time: under 15% of peak FLOPs ...
BUSY_MIN = 0.8  # ... while the device reads >= 80% busy
COMPUTE_RISE_MIN = 3.0  # batching raises compute use at least 3x at the best concurrency
# $ per token measured end to end / the decode step's price shared by its decodes: below 0.8 the tokens/s count
# tokens no step made; above 1.5 over a third of the time goes outside decode steps (prefill, scheduling, idle)
COST_BAND = (0.8, 1.5)


# ---------------------------------------------------------------- judge


def _t(result: LabResult, name: str):
    df = result.tables.get(name)
    return None if df is None or df.empty else df


def _has(df, *cols: str) -> bool:
    return df is not None and all(c in df for c in cols)


def _claim_exact(ex) -> Claim:
    r = ex.iloc[0]
    ok = r.max_abs_logit_diff <= r.atol and bool(r.greedy_tokens_equal)
    return Claim("serving.engine_exact", "the engine computes what HF computes",
                 f"max |logit diff| vs HF <= {r.atol:g} ({r['dtype']}) at every computed position; greedy = HF's "
                 "argmax",
                 f"{r.max_abs_logit_diff:.1e} at {int(r.positions)} positions ({int(r.decode_positions)} decode, "
                 f"{int(r.prefix_hit_tokens)} prefix-hit); greedy {'equal' if r.greedy_tokens_equal else 'differs'}",
                 bool(ok))


def _claim_idle(conc) -> Claim:
    one, best = conc.iloc[0], conc.loc[conc.output_tokens_per_s.idxmax()]
    rise = best.compute_util / one.compute_util
    busy = one.device_busy
    holds = None if math.isnan(busy) else \
        bool(one.compute_util < COMPUTE_USE_MAX and busy >= BUSY_MIN and rise >= COMPUTE_RISE_MIN)
    return Claim("serving.one_request_idle", "one request at a time wastes a busy-looking device's FLOPs",
                 f"at 1: compute < {COMPUTE_USE_MAX:.0%} of peak, busy ({one.busy_source}) >= {BUSY_MIN:.0%}; "
                 f"at the best >= {COMPUTE_RISE_MIN:g}x the compute",
                 f"{one.compute_util:.2%} of peak at 1, busy {busy:.0%}; {best.compute_util:.2%} at "
                 f"{int(best.concurrency)} ({rise:.1f}x)", holds,
                 note="not measured: no busy reading (NVML)" if holds is None else None)


def _claim_static(sc) -> Claim:
    static, c = sc[sc["mode"] == "static"], sc.set_index("mode").loc["continuous"]
    s = static.loc[static.p50_ttft_ms.idxmin()]  # static at its best max wait
    waits = ", ".join(f"{w:.0f}" for w in static.max_wait_ms)
    return Claim("serving.continuous_beats_static", "continuous batching beats static batching at its best",
                 f"continuous p50 and p99 TTFT < static's best (max wait {waits} ms)",
                 f"p50 {c.p50_ttft_ms:.0f} vs {s.p50_ttft_ms:.0f} ms, p99 {c.p99_ttft_ms:.0f} vs {s.p99_ttft_ms:.0f} "
                 "ms "
                 f"(static waits {s.max_wait_ms:.0f} ms, wastes {int(s.wasted_slots)} slots)",
                 bool(c.p50_ttft_ms < s.p50_ttft_ms and c.p99_ttft_ms < s.p99_ttft_ms),
                 note="below capacity both serve every arrival, so tokens/s match; the wait is what differs")


def _claim_capacity(cap) -> Claim:
    exact = bool((cap.peak_running == cap.formula_max_seqs).all())
    apart = bool((cap.admission_bound != cap.formula_max_seqs).any())
    col = lambda c: ", ".join(str(int(x)) for x in cap[c])  # noqa: E731
    return Claim("serving.kv_limits_concurrency", "the KV cache, not the weights, caps concurrent conversations",
                 "peak running = blocks // blocks per conversation, exactly, each pool (not the admission bound)",
                 f"peak {col('peak_running')} at {col('kv_blocks')} blocks; formula {col('formula_max_seqs')}; "
                 "admission "
                 f"{col('admission_bound')}", exact and apart)


def judge(result: LabResult) -> list[Claim]:
    """Every verdict from the tables alone."""
    claims = []
    ex = _t(result, "exactness")
    if _has(ex, "atol", "positions"):
        claims.append(_claim_exact(ex))
    conc = _t(result, "concurrency")
    if conc is not None and len(conc) > 1:
        one, best = conc.iloc[0], conc.loc[conc.output_tokens_per_s.idxmax()]
        x = best.output_tokens_per_s / one.output_tokens_per_s
        claims.append(Claim("serving.batching_is_the_lever", "batching multiplies throughput",
                            ">= 2x tokens/s at the best concurrency",
                            f"{x:.1f}x at concurrency {int(best.concurrency)} ({best.output_tokens_per_s:.0f} vs "
                            f"{one.output_tokens_per_s:.0f} tokens/s)", x >= 2))
        if _has(conc, "compute_util", "device_busy"):
            claims.append(_claim_idle(conc))
    sc = _t(result, "static_vs_continuous")
    if _has(sc, "max_wait_ms"):
        claims.append(_claim_static(sc))
    cap = _t(result, "capacity")
    if _has(cap, "admission_bound"):
        claims.append(_claim_capacity(cap))
    pre = _t(result, "prefix")
    if pre is not None:
        ok, parts = True, []
        for L, g in pre.groupby("prefix_tokens"):
            off, on = g.set_index("prefix_cache").loc[False], g.set_index("prefix_cache").loc[True]
            cut = off.prefill_tokens_computed - on.prefill_tokens_computed
            ok &= abs(cut - on.expected_hits) <= BLOCK * on.requests and on.p50_ttft_ms < off.p50_ttft_ms
            parts.append(f"L={L}: {int(cut)} fewer tokens, TTFT {off.p50_ttft_ms:.1f} -> {on.p50_ttft_ms:.1f} ms")
        claims.append(Claim("serving.prefix_cache_cuts_prefill", "a shared prefix is computed once",
                            f"prefill cut by the cached blocks' tokens (+-{BLOCK} a request); lower p50 TTFT",
                            "; ".join(parts), bool(ok)))
    ch = _t(result, "chunked")
    if ch is not None and len(ch) == 2:
        one, chunk = ch.iloc[0], ch.iloc[1]
        claims.append(Claim("serving.chunked_prefill_caps_itl", "chunked prefill keeps running decodes smooth",
                            "worst ITL of running decodes: chunks < one step (long prefill)",
                            f"worst ITL {chunk.itl_max_during_ms:.0f} vs {one.itl_max_during_ms:.0f} ms; TTFT "
                            f"{chunk.long_prompt_ttft_ms:.0f} vs {one.long_prompt_ttft_ms:.0f} ms",
                            chunk.itl_max_during_ms < one.itl_max_during_ms))
    cost = _t(result, "cost")
    if _has(cost, "step_usd_per_million_tokens", "below_knee"):
        claims.append(_claim_cost(cost))
    ts = _t(result, "train_vs_serve")
    if _has(ts, "expense", "serve_tokens_per_s"):
        claims.append(_claim_train_serve(ts))
    return claims


def _claim_cost(cost) -> Claim:
    """$ per 1M tokens falls as 1 / throughput: each token pays its share of the step it was made in."""
    lo, hi = COST_BAND
    judged = cost[cost.below_knee.astype(bool) & (cost.step_usd_per_million_tokens > 0)]
    exp = f"price x step / decodes within {lo:g}-{hi:g}x to the KV knee; falls"
    cid, text = "serving.cost_tracks_throughput", "$ per token falls as 1 / throughput"
    if len(judged) < 2:
        return Claim(cid, text, exp, "-", None, note="needs 2+ levels with decode steps below the KV knee")
    ratio = judged.over_step_cost
    one, best = judged.iloc[0], judged.loc[judged.output_tokens_per_s.idxmax()]
    knee = cost.kv_knee.iloc[0]
    past = int((~cost.below_knee.astype(bool)).sum())
    where = f"knee {int(knee)}" if knee == knee else "no knee"
    meas = (f"{ratio.min():.2f}-{ratio.max():.2f}x; ${one.usd_per_million_tokens:.2f} -> "
            f"${best.usd_per_million_tokens:.2f} ({where}{f', {past} past it' if past else ''})")
    return Claim(cid, text, exp, meas, bool(ratio.between(lo, hi).all() and
                                          best.usd_per_million_tokens < one.usd_per_million_tokens),
                 note="the sweep stays below the KV knee: part 3 shows the knee" if not past else None)


def _claim_train_serve(ts) -> Claim:
    """Training is paid once, serving by the hour: they cross after more tokens than one GPU serves in a year."""
    t = ts.set_index("expense")
    train, year, cross = t.loc["training run (once)"], t.loc["serving, one GPU-year"], t.loc["crossover"]
    return Claim("serving.training_vs_serving", "training is paid once, serving by the hour",
                 "> a GPU-year's tokens (8,760 GPU-hours)",
                 f"${train.usd:,.0f} = {cross.tokens:.2g} tokens = {cross.gpu_hours / year.gpu_hours:,.0f} GPU-years "
                 f"at {year.serve_tokens_per_s:,.0f} tok/s", bool(cross.tokens > year.tokens),
                 note="napkin: 6 N D, MFU, peak, price (it cancels in the verdict); measured: the compute use")


def headline(result: LabResult, claims: list[Claim]) -> str:
    conc, cost = _t(result, "concurrency"), _t(result, "cost")
    if conc is None or len(conc) < 2:
        return ""
    one, best = conc.iloc[0], conc.loc[conc.output_tokens_per_s.idxmax()]
    s = (f"Batching is the lever: {best.output_tokens_per_s / one.output_tokens_per_s:.1f}x the tokens/s at "
         "concurrency "
         f"{int(best.concurrency)} vs 1")
    if cost is not None:
        at_best = cost.loc[cost.output_tokens_per_s.idxmax(), "usd_per_million_tokens"]
        s += (f", so ${at_best:.2f} instead of ${cost.usd_per_million_tokens.iloc[0]:.2f} per 1M tokens at the "
              "example price")
    return s + "."
