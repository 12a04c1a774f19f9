"""The kvcache-growth lab's verdicts and headline, from the tables alone (a saved run re-judges the same)."""

from __future__ import annotations

from llmlab.core.results import Claim, LabResult
from llmlab.labs.kvcache_growth.formula import MiB

MIN_FIT_TOKENS = 16  # fewer generated tokens than this cannot tell n^2 from n (a busy CPU's budget cut it)


def judge(result: LabResult) -> list[Claim]:
    """Pure: the claims from result.tables alone (a saved run re-judges the same)."""
    T = result.tables
    claims = []
    if "real_cache" in T:
        claims += [_judge_bytes(T["real_cache"]), _judge_outweighs(T["real_cache"], result.config.get("model", "?"))]
    if "sliding_window" in T:
        claims.append(_judge_window(T["sliding_window"]))
    claims.append(_judge_allocator(T.get("allocator"), result.skipped.get("allocator", "")))
    if "registry" in T:
        claims.append(_judge_gqa(T["registry"]))
    if "generation_fits" in T:
        claims += _judge_trap(T["generation_fits"])
    return claims


def _judge_bytes(df) -> Claim:
    n_match = int((df["measured_bytes"] == df["formula_bytes"]).sum())
    worst = float((df["measured_bytes"] / df["formula_bytes"] - 1).abs().max())
    per_tok = df["formula_bytes"].iloc[0] / (df["batch"].iloc[0] * df["cached_tokens"].iloc[0])
    return Claim("kvcache_growth.bytes_match_formula", "measured cache bytes equal the formula at every length",
                 f"every row exactly 2 x layers x kv_heads x head_dim x bytes = {per_tok:.0f} B/tok x tokens",
                 f"{n_match}/{len(df)} rows exact (worst off by {worst:.2g})", n_match == len(df))


def _judge_outweighs(df, model: str) -> Claim:
    """Measured cache bytes cross the weights exactly where batch x cached tokens crosses the formula's N."""
    dyn = df[df["cache"] == "dynamic"]
    over = dyn["measured_bytes"] > dyn["weights_bytes"]
    predicted = dyn["batch"] * dyn["cached_tokens"] > dyn["tokens_to_outweigh"]
    n_star = float(dyn["tokens_to_outweigh"].iloc[0])
    first = dyn[over].sort_values(["batch", "seq_len"]).head(1)
    text = f"the cache outweighs the weights past N tokens ({model})"
    expected = f"every row on its side of N = weights / bytes per token = {n_star:,.0f} (batch x tokens)"
    if not over.any():
        return Claim("kvcache_growth.cache_outweighs_weights", text, expected,
                     f"largest cache {dyn['cache_over_weights'].max():.2f}x the weights", None,
                     note="not measured: no grid point reached N (raise --batches or --lengths)")
    r = first.iloc[0]
    agree = int((over == predicted).sum())
    return Claim("kvcache_growth.cache_outweighs_weights", text, expected,
                 f"first at b={int(r['batch'])} x {int(r['seq_len'])} ({r['cache_over_weights']:.2f}x); "
                 f"{agree}/{len(dyn)} rows on the predicted side", agree == len(dyn))


def _judge_window(sw) -> Claim:
    w = int(sw["window"].iloc[0])
    ok = (sw["cached_tokens"] == sw["formula_tokens"]) & (sw["measured_bytes"] == sw["formula_bytes"])
    capped = int(sw["cached_tokens"].max())
    return Claim("kvcache_growth.sliding_window_caps", "a sliding window caps the cache (Mistral skeleton)",
                 f"every length exactly min(length, window - 1 = {w - 1}) tokens (HF's rule)",
                 f"<= {capped} tokens to length {int(sw['seq_len'].max())}; {int(ok.sum())}/{len(sw)} rows exact",
                 bool(ok.all()))


def _judge_allocator(alloc, why: str) -> Claim:
    cid, text = "kvcache_growth.dynamic_cache_copies", "a DynamicCache copies itself each step; a StaticCache not"
    expected = "dynamic's largest step peak > static's"
    if alloc is None or alloc.empty:
        return Claim(cid, text, expected, "-", None, note=f"not measured: {why or 'no allocator rows'}")
    ok = alloc[~alloc["oom"].astype(bool)]
    dyn, sta = ok[ok["cache"] == "dynamic"], ok[ok["cache"] == "static"]
    if dyn.empty or sta.empty:
        return Claim(cid, text, expected, "-", None, note="not measured: out of memory before both caches had a row")
    d, s = dyn["step_peak_extra_bytes"].max(), sta["step_peak_extra_bytes"].max()
    return Claim(cid, text, expected, f"step peak: dynamic {d / MiB:.1f} MiB, static {s / MiB:.1f} MiB", bool(d > s))


def _judge_gqa(reg) -> Claim:
    r = reg.set_index("model")
    l2, l3 = r.loc["llama-2-7b"], r.loc["llama-3-8b"]
    ratio = l2["measured_bf16_KiB_per_token"] / l3["measured_bf16_KiB_per_token"]
    formula = l2["bf16_KiB_per_token"] / l3["bf16_KiB_per_token"]
    return Claim("kvcache_growth.gqa_4x_smaller", "Llama 3 8B needs 4x less KV per token than Llama 2 7B",
                 f"exactly 4x, measured and formula ({l2['bf16_KiB_per_token']:.0f} vs "
                 f"{l3['bf16_KiB_per_token']:.0f} KiB: 32 vs 8 KV heads)",
                 f"HF caches {l2['measured_bf16_KiB_per_token']:.0f} vs {l3['measured_bf16_KiB_per_token']:.0f} "
                 f"KiB/token: {ratio:.2f}x",
                 bool(abs(ratio - 4.0) < 1e-9 and abs(formula - 4.0) < 1e-9))


def _judge_trap(fits) -> list[Claim]:
    f = fits.set_index("mode")
    nc, wc = f.loc["without cache"], f.loc["with cache"]
    n = int(nc["n_max"])
    text = "without a cache, total generation time grows quadratically"
    text += f" ({nc['model']})" if "model" in nc.index else ""
    expected = "fit a n^2 + b n + c: a > 0 and its squared residual <= 0.5x a line's"
    measured = (f"a = {nc['quad_a_s_per_tok2'] * 1e6:.1f} us/tok^2, residual {nc['quad_ssr'] / nc['lin_ssr']:.2f}x; "
                f"{n} tokens")
    if n < MIN_FIT_TOKENS:
        quad = Claim("kvcache_growth.no_cache_quadratic", text, expected, measured, None,
                     note=f"not measured: {n} tokens (< {MIN_FIT_TOKENS}) cannot tell n^2 from n (time budget)")
    else:
        quad = Claim("kvcache_growth.no_cache_quadratic", text, expected, measured,
                     bool(nc["quad_a_s_per_tok2"] > 0 and nc["quad_ssr"] <= 0.5 * nc["lin_ssr"]))
    eq, total = int(wc["tokens_equal"]), int(wc["tokens_compared"])
    same = Claim("kvcache_growth.cache_same_output", "the cache changes the speed, not the output (greedy)",
                 f"{total}/{total} tokens equal", f"{eq}/{total} tokens equal", eq == total)
    return [quad, same]


def headline(result: LabResult, claims: list[Claim]) -> str:
    """The one thing this run found."""
    T = result.tables
    parts = []
    if "real_cache" in T:
        df = T["real_cache"]
        per_tok = df["formula_bytes"].iloc[0] / (df["batch"].iloc[0] * df["cached_tokens"].iloc[0])
        exact = bool((df["measured_bytes"] == df["formula_bytes"]).all())
        parts.append(f"The KV cache is {'exactly' if exact else 'not'} the formula: {per_tok:,.0f} B per token here, "
                     "growing linearly with length x batch.")
    if "generation_fits" in T:
        nc = T["generation_fits"].set_index("mode").loc["without cache"]
        wc = T["generation_fits"].set_index("mode").loc["with cache"]
        if nc["n_max"] < MIN_FIT_TOKENS:
            parts.append(f"The quadratic trap reached only {int(nc['n_max'])} tokens in its time budget "
                         "(a slow or busy CPU): too few to judge.")
        else:
            parts.append(f"Without it each token recomputes the prefix: {nc['step_ms_first']:.1f} -> "
                         f"{nc['step_ms_last']:.1f} ms per token vs {wc['step_ms_last']:.1f} ms with it.")
    return " ".join(parts)

