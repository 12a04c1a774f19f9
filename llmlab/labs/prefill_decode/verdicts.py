"""The verdicts: every claim from the saved tables alone."""

from __future__ import annotations

import math

import pandas as pd

from llmlab.core.results import Claim, LabResult, empty_table
from llmlab.core.roofs import batch_knee
from llmlab.labs.prefill_decode.config import BOUND_SHARE, DECODE_SHARE, E2E_TOL, FLOP_TOL
from llmlab.labs.prefill_decode.disagg import handoff_claims


def _roof(tables, name: str) -> float:
    t = tables["roofs"]
    return float(t.loc[t["roof"] == name, "value"].iloc[0])


def _first_model(t: pd.DataFrame) -> pd.DataFrame:
    return t[t["model"] == t["model"].iloc[0]] if "model" in t else t


def judge(result: LabResult) -> list[Claim]:
    """Pure: every verdict from result.tables alone."""
    T = result.tables
    claims = []
    # a part not measured (or cut short by Ctrl-C) gives no verdict
    has = {n for n, t in T.items() if not empty_table(t)}
    if not {"roofs", "intensity"} <= has:
        return claims + _later_claims(T, has, None)
    inten = _first_model(T["intensity"])
    peak, bw = _roof(T, "compute"), _roof(T, "bandwidth")
    ridge = peak / bw
    pre = inten[inten["phase"] == "prefill"].sort_values("tokens").iloc[-1]
    dec = inten[inten["phase"] == "decode"].sort_values("tokens").iloc[0]
    m = pre["model"]

    # 1. prefill: above the ridge and at least half the compute roof
    holds = pre["intensity"] > ridge and pre["share_of_peak"] >= BOUND_SHARE
    claims.append(Claim("prefill_decode.prefill_compute_bound",
                        f"prefill ({m}, T={int(pre['tokens'])}) is compute-bound",
                        f"> ridge {ridge:.1f} FLOP/B, >= {BOUND_SHARE:.0%} of peak",
                        f"{pre['intensity']:.0f} FLOP/B, {pre['share_of_peak']:.0%} of {peak:.0f} GFLOP/s", holds,
                        note="" if holds else _why_not_compute(pre, ridge)))

    # 2. decode: below the ridge and at least half the bandwidth roof; the note says what bounds it
    holds = dec["intensity"] < ridge and dec["share_of_bandwidth"] >= BOUND_SHARE
    claims.append(Claim("prefill_decode.decode_memory_bound", f"decode ({m}, batch 1) is memory-bound",
                        f"< ridge {ridge:.1f} FLOP/B, >= {BOUND_SHARE:.0%} of {bw:.1f} GB/s",
                        f"{dec['intensity']:.2f} FLOP/B, {dec['share_of_bandwidth']:.0%} "
                        f"({dec['achieved_GBps']:.2f} GB/s)",
                        holds, note=_decode_bound(T, m)))

    # 3. tokens/s ratio: at least half the roofline's (decode on the bandwidth roof, prefill on its roof)
    if "phases" in has:
        ph = _first_model(T["phases"]).sort_values("tokens").iloc[-1]
        napkin = float(ph["tokens"]) * (float(dec["bytes"]) / bw / 1e6) / float(pre["roof_ms"])
        claims.append(Claim("prefill_decode.prefill_tokens_per_s_ratio",
                            f"prefill makes far more tokens/s than decode (T={int(ph['tokens'])})",
                            f">= 0.5x the roofline's {napkin:.1f}x, i.e. >= {0.5 * napkin:.1f}x",
                            f"{ph['ratio']:.0f}x ({ph['prefill_tok_s']:.0f} vs {ph['decode_tok_s']:.1f} tok/s)",
                            ph["ratio"] >= 0.5 * napkin,
                            note="under half the roofline's ratio: prefill runs far below its roof"))
    return claims + _later_claims(T, has, ridge)


def _later_claims(T: dict[str, pd.DataFrame], has: set[str], ridge: float | None) -> list[Claim]:
    claims = []
    # 4. the crossover batch
    if ridge is not None:
        claims.append(_crossover_claim(T.get("crossover"), ridge))

    # 5. TTFT grows with T, ITL barely does
    ph1 = _first_model(T["phases"]).sort_values("tokens") if "phases" in has else ()
    cid = "prefill_decode.ttft_grows_itl_flat"
    if len(ph1) >= 2:
        a, b = ph1.iloc[0], ph1.iloc[-1]
        ttft_x, itl_x = b["prefill_ms"] / a["prefill_ms"], b["decode_ms"] / a["decode_ms"]
        flop_x, byte_x = b["prefill_flops"] / a["prefill_flops"], b["decode_bytes"] / a["decode_bytes"]
        holds = ttft_x >= 2 * itl_x and itl_x <= 1.5
        claims.append(Claim(cid, f"T {int(a['tokens'])} -> {int(b['tokens'])}: TTFT grows, ITL barely moves",
                            f"TTFT x >= 2 x ITL x, ITL x <= 1.5 (formula: TTFT x{flop_x:.0f}, ITL x{byte_x:.2f})",
                            f"TTFT x{ttft_x:.1f}, ITL x{itl_x:.2f}",
                            holds, note="ITL grew > 1.5x: the KV cache is large next to the weights" if itl_x > 1.5 else
                            "TTFT grew < 2x ITL's growth: fixed costs dominate short prompts"))
    else:
        claims.append(Claim(cid, "TTFT grows with T, ITL barely moves", "two prompt lengths", "-", None,
                            note="not measured: one prompt length only"))

    # 6. E2E from the parts
    e2e = T.get("e2e")
    if e2e is not None and len(e2e):
        w = e2e.loc[e2e["error"].abs().idxmax()]
        claims.append(Claim("prefill_decode.e2e_from_parts", "E2E = TTFT + (n - 1) x ITL, from the parts",
                            f"every (T, n) within {E2E_TOL:.0%}",
                            f"worst {w['error']:+.1%} (T={int(w['tokens'])}, n={int(w['new_tokens'])})",
                            abs(w["error"]) <= E2E_TOL, note="parts and whole timed apart: a busy CPU moves them"))

    # 7. the FLOP formula against FlopCounterMode
    if "flop_check" in has:
        fc = T["flop_check"]
        w = fc.loc[(fc["ratio"] - 1).abs().idxmax()]
        claims.append(Claim("prefill_decode.flops_formula", "FLOPs from the shape = FlopCounterMode's count",
                            f"both phases within {FLOP_TOL:.0%}",
                            f"worst {w['ratio']:.4f}x ({w['model']} {w['phase']})",
                            abs(w["ratio"] - 1) <= FLOP_TOL, note="the formula misses (or adds) an op the model runs"))

    # 9. decode's share of a whole generation at long replies
    claims.append(decode_share_claim(T.get("decode_share")))

    # 10. the hand-off, run: bytes at the link rate, the running replies' ITL, the TTFT it costs
    claims += handoff_claims(T)
    return claims


def _why_not_compute(pre, ridge) -> str:
    if pre["intensity"] <= ridge:
        return "below the ridge: by the formula memory bounds it"
    return (f"above the ridge but at {pre['share_of_peak']:.0%} of peak: the forward's small ops run far below the "
            "matmul roof")


def decode_bound(fl_row) -> tuple[str, float]:
    """(what bounds a batch-1 decode step, the share of the measured time it explains) from a decode_floor row.

    The DRAM roof applies only when the weights and KV do not fit in the last-level cache."""
    r = fl_row
    est = {"per-step overhead": r["overhead_ms"], "compute": r["compute_ms"]}
    if r["weights_MiB"] + r["kv_MiB"] > r["llc_MiB"]:
        est["memory bandwidth"] = r["memory_ms"]
    top = max(est, key=est.get)
    return top, est[top] / r["measured_ms"]


def _decode_bound(T, model) -> str:
    fl = T.get("decode_floor")
    if fl is None or not len(fl[fl["model"] == model]):
        return ""
    r = fl[fl["model"] == model].iloc[0]
    top, share = decode_bound(r)
    cached = r["weights_MiB"] + r["kv_MiB"] <= r["llc_MiB"]
    where = "in cache, " if cached else ""
    return f"{where}{top} bounds it: {share:.0%} of {r['measured_ms']:.1f} ms"


def _crossover_claim(cx, ridge) -> Claim:
    cid, text = "prefill_decode.crossover_batch", "decode turns compute-bound near the formula's batch"
    if cx is None or len(cx) < 2:
        return Claim(cid, text, "a batch sweep", "-", None, note="not measured: fewer than two batch sizes")
    cx = cx.sort_values("batch")
    pred, napkin = float(cx.iloc[0]["formula_crossover"]), float(cx.iloc[0]["napkin_crossover"])
    knee, reached = batch_knee(list(cx["batch"]), list(cx["ms"]))
    bmax, grow = int(cx.iloc[-1]["batch"]), cx.iloc[-1]["ms"] / cx.iloc[0]["ms"]
    expected = (f"knee within 0.5-2x of B ~{pred:.0f} (napkin ~{napkin:.0f}: ridge {ridge:.1f} FLOP/B)"
                if math.isfinite(pred) else "never (the KV grows as fast as the FLOPs)")
    note = "within 2x holds; a late knee: fixed per-step costs hide the compute until large batches"
    if reached:
        holds = math.isfinite(pred) and 0.5 <= knee / pred <= 2
        measured = f"B ~{knee:.0f} (step x{grow:.1f} at B={bmax})"
        if math.isfinite(pred) and knee < pred / 2:
            note = "within 2x holds; an early knee: the step grew before compute binds (load, or per-sequence costs)"
    else:
        holds = False if math.isfinite(pred) and pred <= bmax else None
        measured = f"not by B={bmax} (step x{grow:.1f})"
        if holds is None:
            note = "not measured: the sweep ends before the formula's batch (add larger --batch-sizes)"
    return Claim(cid, text, expected, measured, holds, note=note)


def decode_share_claim(ds: pd.DataFrame | None) -> Claim:
    """"Decode is ~95% of generation time", tested at the reply lengths measured: at every n the share predicted
    from the parts, (n - 1) ITL / (TTFT + (n - 1) ITL), reaches DECODE_SHARE, and the whole generation timed end
    to end lands within E2E_TOL of TTFT + (n - 1) ITL (else the prediction is not what the model does)."""
    cid = "prefill_decode.decode_share_of_generation"
    if empty_table(ds):
        return Claim(cid, "decode is ~95% of generation time at long replies",
                     f">= {DECODE_SHARE:.0%} of the time at every reply length", "-", None,
                     note="not measured: no reply length fits after the prompt")
    ds = ds.sort_values("new_tokens")
    t, ns = int(ds["tokens"].iloc[0]), "/".join(str(int(n)) for n in ds["new_tokens"])
    text = f"decode is ~95% of generation time (T={t}, n={ns})"
    expected = f"(n - 1) ITL / E2E >= {DECODE_SHARE:.0%} at every n; the timed E2E within {E2E_TOL:.0%}"
    measured = ", ".join(f"n={int(r.new_tokens)}: {r.predicted_share:.1%} (timed {r.measured_share:.1%}, "
                         f"E2E {r.error:+.0%})" for r in ds.itertuples())
    share_ok = bool((ds["predicted_share"] >= DECODE_SHARE).all())
    whole_ok = bool((ds["error"].abs() <= E2E_TOL).all())
    note = ""
    if not share_ok:
        note = "prefill takes more than a tenth here: a short reply after a long prompt, or a decode step this cheap"
    elif not whole_ok:
        note = "the parts do not add up to the timed whole: the prediction misses what the generation does"
    return Claim(cid, text, expected, measured, share_ok and whole_ok, note=note)

