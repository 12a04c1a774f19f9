"""The verdicts: every claim from the saved tables alone."""

from __future__ import annotations

import math
import re

import pandas as pd

from llmlab.core.results import Claim, LabResult, empty_table
from llmlab.core.roofs import batch_knee
from llmlab.labs.roofline.whatif import SPEC


def _row(df: pd.DataFrame, **eq) -> pd.Series | None:
    sub = df
    for k, v in eq.items():
        sub = sub[sub[k] == v]
    return sub.iloc[0] if len(sub) else None


def _num(x) -> float | None:
    return None if x is None or (isinstance(x, float) and math.isnan(x)) or pd.isna(x) else float(x)


def judge(result: LabResult) -> list[Claim]:
    """Pure: every verdict from result.tables alone."""
    t = result.tables
    claims = [_bandwidth_claim(t["roofs"])] if "roofs" in t else []
    if "roofs" in t:
        claims += [_peak_claim(t["roofs"], d) for d in ("fp32", "bf16")]
    if "bandwidth_sweep" in t and "roofs" in t:
        claims.append(_cache_claim(t["bandwidth_sweep"], t["roofs"]))
    if "intensity_sweep" in t:
        claims.append(_sweep_claim(t["intensity_sweep"]))
    if "decode_model" in t:
        claims += _decode_claims(t["decode_model"].iloc[0], t.get("decode"))
    if "whatif" in t:
        claims.append(_whatif_memory_bound(t["whatif"]))
        claims.append(_whatif_ceiling(t.get("decode"), t.get("decode_model"), t.get("roofs")))
    return claims


def _bandwidth_claim(roofs: pd.DataFrame) -> Claim:
    r = _row(roofs, roof="bandwidth")
    spec, got = _num(r["spec"]), float(r["measured_median"])
    cid, text = "roofline.bandwidth_vs_spec", "the best STREAM kernel's roof reaches >= 90% of the bandwidth spec"
    if spec is None:
        return Claim(cid, text, ">= 90% of spec", f"{got:.1f} GB/s, no spec", None,
                     "a CPU's bandwidth spec depends on its DIMMs")
    pct = 100 * got / spec
    note = "" if pct <= 100 else "above 100%: the spec sheet's figure is below what this part delivered"
    return Claim(cid, text, f">= 90% of {spec:.0f} GB/s", f"{pct:.0f}% ({got:.0f} GB/s, {r['how']})", pct >= 90, note)


def _peak_claim(roofs: pd.DataFrame, dtype: str) -> Claim:
    cid, text = f"roofline.{dtype}_peak_vs_spec", f"the {dtype.upper()} matmul peak is close to the spec sheet's"
    r = _row(roofs, roof="compute", dtype=dtype)
    if r is None:
        return Claim(cid, text, "a measured peak", "-", None, f"no {dtype} matmul here")
    spec, want, got = _num(r["spec"]), _num(r["want_pct"]), float(r["measured_median"])
    if spec is None or want is None:
        bound = f"no BF16 unit: {_short_source(r['spec_source'], dtype)} is a bound"
        why = "no spec for this device" if spec is None else bound
        return Claim(cid, text, "a spec to compare with", f"{got:.0f} GFLOP/s", None, why)
    pct = 100 * got / spec
    note = ""
    if pct > 100:  # a share above 100% always says why
        note = f"above 100%: {_over_spec_why(str(r['spec_source']))} ({_short_source(r['spec_source'], dtype)})"
    elif pct < want:
        load = _num(r.get("loadavg_1m"))
        note = f"spec: {_short_source(r['spec_source'], dtype)}" + (f"; load {load:.0f}" if load else "")
    return Claim(cid, text, f">= {want:.0f}% of {spec:.0f} GFLOP/s{spec_clock(str(r['spec_source']))}",
                 f"{pct:.0f}% ({got:.0f} GFLOP/s)",
                 pct >= want, note)


def spec_clock(how: str) -> str:
    """" (at 3.50 GHz, max boost clock)": the clock a CPU spec assumes, from its derivation; "" for a GPU datasheet."""
    m = re.search(r"x ([\d.]+ GHz) \((max boost clock|clock from /proc/cpuinfo)", how)
    if not m:
        return ""
    clock = "max boost clock" if m.group(2).startswith("max") else "the clock /proc/cpuinfo reports: no max boost"
    return f" (at {m.group(1)}, {clock})"


def _over_spec_why(how: str) -> str:
    """Why a measured peak beat its spec (core.specs.over_spec_note's reasons, short)."""
    if "max boost" in how:
        return "spec at max boost: suspect FLOP/cycle or timing"
    if "GHz" in how:
        return "the spec's clock is below the boost clock"
    return "check the spec row and the timing"


def _short_source(src, dtype: str = "fp32") -> str:
    """The spec's derivation without its asides: "2 cores x 3.50 GHz x 64 FP32 FLOP/cycle"."""
    src = str(src)
    while re.search(r"\([^()]*\)", src):  # innermost asides first: they nest
        src = re.sub(r"\s*\([^()]*\)", "", src)
    parts = [p.strip() for p in src.split(";")]
    if dtype in ("bf16", "fp16") and len(parts) > 1 and "GHz" in parts[0]:  # "BF16 x 1024" of "cores x GHz x ..."
        cores, ghz = parts[0].split(" x ")[:2]
        return f"{cores} x {ghz} x {parts[1].removeprefix('BF16 x ')} BF16 FLOP/cycle"[:60]
    return parts[0][:60]


def _cache_claim(sweep: pd.DataFrame, roofs: pd.DataFrame) -> Claim:
    cid, text = "roofline.cache_above_dram", "in-cache working sets stream >= 1.5x faster than DRAM"
    dram = float(_row(roofs, roof="bandwidth")["measured_median"])
    tri = sweep[(sweep["kernel"] == "triad") & ~sweep["level"].isin(["DRAM", "HBM"])]
    if tri.empty:
        return Claim(cid, text, ">= 1.5x the DRAM roof", "-", None, "no sweep point fits in a cache")
    best = tri.loc[tri["median_GBps"].idxmax()]
    ratio = float(best["median_GBps"]) / dram
    return Claim(cid, text, f">= 1.5x {dram:.1f} GB/s",
                 f"{ratio:.1f}x ({float(best['median_GBps']):.0f} GB/s, {best['level']})", ratio >= 1.5)


def _sweep_claim(sweep: pd.DataFrame) -> Claim:
    fr = sweep["fraction_of_roof"]
    return Claim("roofline.gemm_traces_roofline", "a GEMM sweep over M traces the roofline (at or under it)",
                 "every M <= 1.25x its roof, median >= 0.5x",
                 f"{fr.min():.2f}-{fr.max():.2f}x, median {fr.median():.2f}x",
                 bool(fr.max() <= 1.25 and fr.median() >= 0.5))


def _decode_claims(m: pd.Series, dec: pd.DataFrame | None) -> list[Claim]:
    ridge, ai1 = float(m["ridge"]), float(m["b1_intensity"])
    knee_pred = _num(m["predicted_knee"])  # inf is saved as null: the knee is never reached
    knee_pred = math.inf if knee_pred is None else knee_pred
    share_text = "decode at batch 1 uses under 5% of peak compute"
    share_exp = f"< 5% (roof: <= {100 * min(1, ai1 / ridge):.1f}%)"
    knee_text = "decode turns compute-bound near the predicted batch"
    knee_exp = (f"knee within 0.5-2x of B ~{knee_pred:.0f} (step >= 2x B=1's by the last batch)"
                if math.isfinite(knee_pred) else "never (KV reads grow with B)")
    if dec is None or not len(dec):
        why = "the model's decode was not timed (see skipped)"
        return [Claim("roofline.decode_b1_compute_share", share_text, share_exp, "-", None, why),
                Claim("roofline.decode_knee_vs_ridge", knee_text, knee_exp, "-", None, why)]
    one = dec.iloc[0]
    frac = float(one["pct_of_peak_compute"]) / 100
    share = Claim("roofline.decode_b1_compute_share", share_text, share_exp,
                  f"{100 * frac:.2f}% ({float(one['achieved_gflops']):.1f} GFLOP/s)", frac < 0.05,
                  "" if frac < 0.05 else "per-op dispatch or a cache-resident model can lift it")
    knee, reached = batch_knee(list(dec["batch"]), list(dec["median_ms"]))
    last = dec.iloc[-1]
    growth = float(last["median_ms"]) / float(one["median_ms"])
    if reached:
        holds = math.isfinite(knee_pred) and 0.5 <= knee / knee_pred <= 2
        meas, note = f"B ~{knee:.0f} (B={int(last['batch'])}: {growth:.1f}x B=1)", ""
    else:
        holds = False if math.isfinite(knee_pred) and knee_pred <= float(last["batch"]) else None
        meas = f"not reached by B={int(last['batch'])} ({growth:.1f}x B=1)"
        note = "" if holds is False else "the predicted knee is past the largest batch"
    if holds is False and reached:
        note = "knee: where the flat B=1 time meets the ray through the largest batch"
    return [share, Claim("roofline.decode_knee_vs_ridge", knee_text, knee_exp, meas, holds, note)]


WHATIF_RIDGE_X = 50  # batch-1 decode must sit this many times below the ridge on every GPU of the what-if table
WHATIF_CEILING_X = 1.1  # a measured decode may beat its napkin ceiling by timing noise only


def _whatif_memory_bound(w: pd.DataFrame) -> Claim:
    cid, text = "roofline.whatif_decode_memory_bound", "batch-1 decode sits far below the ridge on every GPU listed"
    exp = f"decode FLOP/byte <= ridge / {WHATIF_RIDGE_X} for every GPU x model x format (spec sheets)"
    spec = w[w["source"] == SPEC].dropna(subset=["ridge"])
    if spec.empty:
        return Claim(cid, text, exp, "-", None, "no spec rows")
    below = spec["ridge"] / spec["decode_intensity"]
    r = spec.loc[below.idxmin()]
    meas = (f"{len(spec)} rows; closest {below.min():.0f}x below ({r['gpu']}, {r['model']}, {r['format']}: "
            f"{r['decode_intensity']:.2f} vs ridge {r['ridge']:.0f})")
    ok = bool(below.min() >= WHATIF_RIDGE_X)
    return Claim(cid, text, exp, meas, ok, "" if ok else "a spec row's FLOP/s or bandwidth is off, or the bytes")


def _whatif_ceiling(dec: pd.DataFrame | None, model: pd.DataFrame | None, roofs: pd.DataFrame | None) -> Claim:
    cid = "roofline.whatif_ceiling_bounds_measured"
    text = "the napkin decode ceiling (bandwidth / bytes per token) bounds the measured batch-1 decode"
    exp = f"measured B=1 tokens/s <= {WHATIF_CEILING_X:g}x the measured GB/s / bytes one step reads"
    if empty_table(dec) or empty_table(model) or empty_table(roofs):
        return Claim(cid, text, exp, "-", None, "the model's decode was not timed (see skipped)")
    one, m = dec.iloc[0], model.iloc[0]
    ceiling = float(_row(roofs, roof="bandwidth")["measured_median"]) * 1e9 / float(one["bytes"])
    x = float(one["tokens_per_s"]) / ceiling
    meas = f"{float(one['tokens_per_s']):,.1f} tok/s = {x:.0%} of the {ceiling:,.1f} tok/s ceiling"
    if bool(m["fits_llc"]):
        return Claim(cid, text, exp, meas, None, "weights in cache: the DRAM ceiling does not bind (see Notes)")
    ok = x <= WHATIF_CEILING_X
    return Claim(cid, text, exp, meas, ok, "" if ok else "faster than memory allows: the bytes per step are "
                 "overcounted, or part of the weights stayed in a cache")

