"""The quantization lab's verdicts and headline, from the tables alone."""

from __future__ import annotations

from llmlab.core.results import Claim, LabResult

INT8_BYTES_MAX = 0.55  # "halves BF16": values 1 B vs 2 B, plus FP32 row scales and FP32 norms
INT8_LOSS_MAX = 0.01  # nats: LLM.int8()-style per-channel INT8 weight-only is near-lossless
INT4_PPL_MAX = 0.05  # GPTQ/AWQ: INT4 g128 within a few % perplexity (large models; a 5M model is more fragile)
NVFP4_FP8_MAX = 0.6  # "roughly halves": 0.5 B + 1/16 B of block scale per value against 1 B
NVFP4_PPL_MAX = 0.01  # the article's "<1% accuracy loss", read as <1% perplexity (a proxy)
TRACK_FRACTION = 0.7  # speed-up tracks bytes: at least 70% of the bytes ratio, real kernels only


# ---------------------------------------------------------------- judge


def _rows(result: LabResult, table: str):
    df = result.tables.get(table)
    return None if df is None or df.empty else df


def _none(cid: str, text: str, expected: str, result: LabResult, table: str) -> Claim:
    return Claim(cid, text, expected, "-", None, note=result.skipped.get(table, f"no {table} table in this run"))


def judge(result: LabResult) -> list[Claim]:
    """Every verdict from the tables alone."""
    w, kvb, kvq = _rows(result, "weights"), _rows(result, "kv_bytes"), _rows(result, "kv_quality")
    return [*_weight_claims(result, w, kvb), _speed_claim(result, _rows(result, "speed")),
            *_kv_claims(result, kvb, kvq)]


def _row_claim(result: LabResult, df, table: str, fmt: str, cid: str, text: str, expected: str, verdict) -> Claim:
    """A claim read off one format's row of `table` by `verdict(row) -> (measured, holds, note)`; not measured
    where the run has no such row."""
    if df is None or fmt not in set(df.format):
        return _none(cid, text, expected, result, table)
    measured, holds, note = verdict(df.set_index("format").loc[fmt])
    return Claim(cid, text, expected, measured, bool(holds), note=note)


def _weight_claims(result: LabResult, w, kvb) -> list[Claim]:
    claims = [_row_claim(
        result, w, "weights", "fp32", "quantization.fp32_identity", "FP32 -> FP32 'quantization' is the identity",
        "loss delta = 0, agreement = 100%, KL = 0, 32 bits, exactly",
        lambda r: (f"delta {r.loss_delta:.2g}, agreement {r.agreement:.1%}, KL {r.kl:.2g}, {r.bits_per_param:g} bits",
                   r.loss_delta == 0 and r.agreement == 1 and r.kl == 0 and r.bits_per_param == 32, None))]

    t, e = "bytes counted from the tensors equal the formula", "packed bytes = bits x params / 8 + scales, exactly, " \
        "every format"
    tabs = [df for df in (w, kvb) if df is not None]
    if not tabs:
        claims.append(_none("quantization.bytes_match_formula", t, e, result, "weights"))
    else:
        bad = [f for df in tabs for f, ok in zip(df.format, df.bytes_match, strict=True) if not ok]
        n = sum(len(df) for df in tabs)
        claims.append(Claim("quantization.bytes_match_formula", t, e,
                            f"{n - len(bad)} of {n} formats exact" + (f"; off: {', '.join(bad)}" if bad else ""),
                            not bad))

    claims.append(_row_claim(
        result, w, "weights", "int8", "quantization.int8_halves_memory",
        "INT8 weights halve BF16's memory at a small loss cost",
        f"<= {INT8_BYTES_MAX}x BF16's bytes, |loss delta| <= {INT8_LOSS_MAX} nats",
        lambda r: (f"{r.x_bf16:.3f}x BF16, loss delta {r.loss_delta:+.4f}, agreement {r.agreement:.1%}",
                   r.x_bf16 <= INT8_BYTES_MAX and abs(r.loss_delta) <= INT8_LOSS_MAX, None)))

    t, e = "INT4 group-wise weights keep perplexity within a few %", \
        f"the best INT4 format's perplexity delta <= +{INT4_PPL_MAX:.0%}"
    int4 = w[w.format.str.startswith("int4")] if w is not None else None
    if int4 is None or int4.empty:
        claims.append(_none("quantization.int4_perplexity", t, e, result, "weights"))
    else:
        best = int4.loc[int4.ppl_delta.idxmin()]
        claims.append(Claim("quantization.int4_perplexity", t, e,
                            f"{best.format}: {best.ppl_delta:+.1%} ({best.bits_per_param:.2f} bits/param)",
                            bool(best.ppl_delta <= INT4_PPL_MAX),
                            note="a 5M-parameter model has little redundancy; the papers measure 7B+ models"))
    return claims


def _speed_claim(result: LabResult, speed) -> Claim:
    t = "decode speed-up tracks the weight bytes ratio (memory-bound)"
    e = f"speed-up >= {TRACK_FRACTION:.0%} x bytes ratio: real kernels, smallest batch, the model with most bytes"
    sp = None if speed is None else \
        speed[(speed.format != "fp32") & speed.real_kernel & (speed.batch == speed.batch.min())]
    if sp is None or sp.empty:
        return _none("quantization.speedup_tracks_bytes", t, e, result, "speed")
    big = sp[sp.linear_bytes == sp.linear_bytes.max()] if not sp.fits_in_cache.all() else sp
    big = sp[sp.model == big.model.iloc[0]]
    frac = big.speedup / big.bytes_ratio
    worst = big.loc[frac.idxmin()]
    holds = bool((frac >= TRACK_FRACTION).all())
    return Claim("quantization.speedup_tracks_bytes", t, e,
                 f"{worst.format}: {worst.speedup:.2f}x for {worst.bytes_ratio:.1f}x fewer bytes ({worst.model}, "
                 f"batch {int(worst.batch)})", holds, note=_speed_note(big, holds))


def _kv_claims(result: LabResult, kvb, kvq) -> list[Claim]:
    t = "NVFP4 KV roughly halves FP8's KV memory (NVIDIA)"
    e = f"NVFP4 / FP8 bytes counted from the packed tensors of one cache <= {NVFP4_FP8_MAX} (article: -50%)"
    if kvb is None or not {"fp8", "nvfp4"} <= set(kvb.format):
        halves = _none("quantization.nvfp4_kv_vs_fp8", t, e, result, "kv_bytes")
    else:
        x = _nvfp4_over_fp8(kvb)
        halves = Claim("quantization.nvfp4_kv_vs_fp8", t, e, f"{x:.4f}x -> {1 / x:.2f}x the tokens in the same memory",
                       bool(x <= NVFP4_FP8_MAX), note="the E4M3 scale per 16 values adds 1/16 B per value")
    quality = _row_claim(
        result, kvq, "kv_quality", "nvfp4", "quantization.nvfp4_kv_quality", "NVFP4 KV costs < 1% accuracy (NVIDIA)",
        f"perplexity delta < +{NVFP4_PPL_MAX:.0%} (NVFP4 K, V in the cache; a proxy)",
        lambda r: (f"{r.ppl_delta:+.2%} perplexity, agreement {r.agreement:.1%} (tiny)", r.ppl_delta < NVFP4_PPL_MAX,
                   "the article measured benchmark accuracy of large models, not tiny's perplexity"))
    return [halves, quality]


def _nvfp4_over_fp8(kvb) -> float:
    """NVFP4 / FP8 bytes of the same cache, as counted from the packed tensors (the `bytes` column)."""
    k = kvb.set_index("format")
    return float(k.loc["nvfp4", "bytes"] / k.loc["fp8", "bytes"])


def _where(speed) -> tuple[str, str]:
    """(the device's cache, its memory) in words, from the speed table's device column."""
    gpu = "device" in speed and (speed.device == "cuda").any()
    return ("the GPU's L2", "HBM") if gpu else ("the CPU's cache", "DRAM")


def _speed_note(rows, holds: bool) -> str:
    cache, memory = _where(rows)
    if rows.fits_in_cache.all():
        return f"the weights fit in {cache}: decode is not bound by {memory} bytes"
    return (f"beyond {cache}: fewer bytes from {memory}, and " +
            ("the kernels turn them into speed" if holds else "this device's kernels do not turn them into speed"))


def headline(result: LabResult, claims: list[Claim]) -> str:
    w, kvb, speed = _rows(result, "weights"), _rows(result, "kv_bytes"), _rows(result, "speed")
    if w is None or kvb is None or "int8" not in set(w.format) or not {"fp8", "nvfp4"} <= set(kvb.format):
        return ""
    r = w.set_index("format").loc["int8"]
    text = (f"INT8: {r.x_bf16:.2f}x BF16's bytes, loss delta {r.loss_delta:+.4f} nats; NVFP4 KV: "
            f"{1 / _nvfp4_over_fp8(kvb):.2f}x FP8's tokens.")
    verdict = next((c.holds for c in claims if c.id == "quantization.speedup_tracks_bytes"), None)
    if speed is None or verdict is None:
        return text
    on = "a GPU" if _where(speed)[1] == "HBM" else "a CPU"
    return text + (f" Decode on {on} tracked the bytes." if verdict else f" Decode on {on} followed the kernel, not "
                                                                         "the bytes.")
