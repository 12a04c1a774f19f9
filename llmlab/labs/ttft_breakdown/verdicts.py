"""The in-process lab's verdicts, from the tables alone (a saved run re-judges the same)."""

from __future__ import annotations

import pandas as pd

from llmlab.core.results import Claim, LabResult, empty_table
from llmlab.labs.ttft_breakdown.cold import COLD_RESIDENT_MAX

# Judge tolerances, stated in the claims.
HARNESS_PCT = 2.0  # the phases must add up to the TTFT within this many percent ...
HARNESS_SHARE = 0.95  # ... for this share of the requests (the OS may deschedule the process between stamps)
ATTRIBUTION_TOL = 0.10  # the injected delay lands in its phase within 10%, and no other phase gains 10% of it
# (one-sided: a leak adds time; a phase that ran faster after a busy-wait is the scheduler, not the stamps)
NAPKIN_BAND = (1 / 3, 1.25)  # measured prefill rate / napkin rate at the longest prompt: attention and
# the small q/k/v GEMMs run below the MLP matmul's rate (so < 1), but not 3x below; above 1.25x the napkin is wrong
COLD_MIN_X = 10  # imports alone take seconds, a warm request tens of ms
QUEUE_SHARE = 0.5  # the measured growth must reach half the ideal M/D/1 growth on the same arrival times


def judge(result: LabResult) -> list[Claim]:
    t = result.tables
    claims = [_harness(t.get("requests")), _attribution(t.get("attribution")), _napkin(t.get("prompt_sweep")),
              _queue_knee(t.get("queueing")), _worker(t.get("queueing")), _cold(t.get("cold_start"), result.skipped),
              _cold_read(t.get("cold_read"), result.skipped), _rag(t.get("phases"))]
    return claims


def _harness(req: pd.DataFrame | None) -> Claim:
    cid, text = "ttft_breakdown.phases_sum_to_ttft", "Harness check: the phases add up to the client's TTFT"
    exp = f">= {HARNESS_SHARE:.0%} of requests within {HARNESS_PCT:g}%"
    if empty_table(req):
        return Claim(cid, text, exp, "no requests", None, "no requests table")
    pct = req["unattributed_pct"].abs()
    share = float((pct <= HARNESS_PCT).mean())
    return Claim(cid, text, exp, f"{share:.0%} of {len(req)}; worst {pct.max():.2f}%", share >= HARNESS_SHARE,
                 "adjacent stamps: fails only when the OS deschedules the process between them")


def _attribution(att: pd.DataFrame | None) -> Claim:
    cid, text = "ttft_breakdown.attribution", "A delay put into one component lands in its phase only"
    if empty_table(att):
        return Claim(cid, text, "", "no attribution run", None, "no attribution table")
    null, att = att[att["injected_into"] == "none"], att[att["injected_into"] != "none"]
    delay = float(att["delay_ms"].max())
    tol = ATTRIBUTION_TOL * delay
    exp = f"+{delay:g} ms within {ATTRIBUTION_TOL:.0%} there; others gain < {tol:g} ms"
    phases = [c[2:] for c in att.columns if c.startswith("d_") and c != "d_ttft_ms"]
    noise = float(null[[f"d_{p}" for p in phases]].abs().max().max()) if len(null) else 0.0
    if noise >= tol:  # plain against plain already moves a phase by the tolerance: the machine is too noisy to tell
        return Claim(cid, text, exp, f"no delay: a phase moved {noise:.1f} ms", None,
                     f"the machine's noise exceeds {tol:g} ms (raise attribution_delay_ms)")
    worst_in, worst_out, ok = 0.0, 0.0, True
    for _, r in att.iterrows():
        hit = float(r[f"d_{r['injected_into']}_ms"])
        off = max(float(r[f"d_{p}"]) for p in phases if p != f"{r['injected_into']}_ms")  # the largest gain
        miss = abs(hit - r["delay_ms"]) / r["delay_ms"]
        worst_in, worst_out = max(worst_in, miss), max(worst_out, off)
        ok &= bool(miss <= ATTRIBUTION_TOL and off < ATTRIBUTION_TOL * r["delay_ms"])
    return Claim(cid, text, exp, f"{len(att)} phases: worst {worst_in:.1%} off; others gain <= {worst_out:.2f} ms", ok,
                 "a phase's stamps do not bracket the component that ran in it")


def _napkin(sw: pd.DataFrame | None) -> Claim:
    cid, text = "ttft_breakdown.prefill_rate_vs_napkin", "Long-prompt prefill runs near its napkin rate"
    lo, hi = NAPKIN_BAND
    exp = f"{lo:.2f}x-{hi:g}x of FLOPs / matmul rate"
    if empty_table(sw):
        return Claim(cid, text, exp, "no sweep", None, "no prompt-length sweep")
    r = sw.sort_values("prompt_tokens").iloc[-1]
    x = float(r["rate_vs_napkin"])
    return Claim(cid, text, exp, f"{x:.2f}x at {int(r['prompt_tokens'])} tok ({r['prefill_tok_per_s']:,.0f} vs "
                 f"{r['napkin_tok_per_s']:,.0f} tok/s)", lo <= x <= hi,
                 "below: overheads or attention far slower than GEMMs; above: the FLOP count misses work")


def _queue_knee(q: pd.DataFrame | None) -> Claim:
    cid, text = "ttft_breakdown.queue_knee", "Queue wait explodes as utilisation nears 1"
    pois = None if empty_table(q) else q[q["arrivals"] == "poisson"].sort_values("rho")
    if pois is None or len(pois) < 2:
        return Claim(cid, text, "Wq = rho D / (2 (1 - rho))", "one rate only", None, "needs 2+ arrival rates")
    lo, hi = pois.iloc[0], pois.iloc[-1]
    want = hi["schedule_md1_ms"] / max(lo["schedule_md1_ms"], 1e-6)
    got = hi["wait_mean_ms"] / max(lo["wait_mean_ms"], 1e-3)
    exp = f">= {QUEUE_SHARE:.0%} of ideal M/D/1's {want:.1f}x"
    meas = (f"{lo['wait_mean_ms']:.0f} -> {hi['wait_mean_ms']:.0f} ms ({got:.1f}x), "
            f"rho {lo['rho']:.2f} -> {hi['rho']:.2f}")
    if want < 2:
        return Claim(cid, text, exp, meas, None, "the utilisations reached span too little load")
    return Claim(cid, text, exp, meas, bool(got >= QUEUE_SHARE * want and hi["wait_mean_ms"] > lo["wait_mean_ms"]),
                 "the worker or the arrivals are not what the model assumes")


def _worker(q: pd.DataFrame | None) -> Claim:
    cid, text = "ttft_breakdown.fcfs_worker_overhead", "Harness check: queue waits follow Lindley's recursion"
    if empty_table(q):
        return Claim(cid, text, "", "no queueing run", None, "no queueing table")
    svc = float(q["service_ms"].median())
    gap, lind = float(q["harness_gap_p50_ms"].median()), float(q["lindley_p90_diff_ms"].max())
    return Claim(cid, text, "worker gap < 1 ms; p90 within 5% of a service",
                 f"gap {gap * 1e3:.0f} us; p90 off {lind:.2f} ms of {svc:.0f} ms", gap <= 1.0 and lind <= 0.05 * svc,
                 "the worker adds its own wait between requests")


def _cold(cold: pd.DataFrame | None, skipped: dict) -> Claim:
    cid, text = "ttft_breakdown.cold_start_ratio", "Cold start costs many warm requests"
    exp = f">= {COLD_MIN_X}x a warm TTFT"
    if empty_table(cold):
        return Claim(cid, text, exp, "skipped", None, skipped.get("cold_start", "no cold start run"))
    c = cold.set_index("step")["median_ms"]
    x = c["spawn_to_first_token"] / c["warm_ttft"]
    return Claim(cid, f"Cold start costs {x:.0f}x a warm request", exp,
                 f"{c['spawn_to_first_token'] / 1e3:.2f} s vs {c['warm_ttft']:.1f} ms", x >= COLD_MIN_X,
                 "" if x >= COLD_MIN_X else "a cold start this cheap means imports and weights were already warm")


def _cold_read(cr: pd.DataFrame | None, skipped: dict) -> Claim:
    cid, text = "ttft_breakdown.cold_read_from_disk", "The cold start read its weights from disk, not the page cache"
    exp = f"<= {COLD_RESIDENT_MAX:.0%} of the weights' pages cached after the drop (mincore)"
    rows = None if empty_table(cr) else cr.set_index("item")["value"]
    if rows is None or "resident_after_drop" not in rows:
        why = skipped.get("cold_start") or "no weight files (arch: random weights)"
        return Claim(cid, text, exp, "-", None, why)
    left = rows["resident_after_drop"] / 100
    meas = f"{left:.0%} cached; disk read {rows['disk_read']:.2f} GB/s"
    return Claim(cid, text, exp, meas, left <= COLD_RESIDENT_MAX,
                 "" if left <= COLD_RESIDENT_MAX else "the page cache kept the weights: the cold start read them warm")


def _rag(ph: pd.DataFrame | None) -> Claim:
    cid, text = "ttft_breakdown.rag_prefill_over_retrieval", "RAG: the long context's prefill costs more than retrieval"
    rag = None if empty_table(ph) else ph[ph["scenario"].str.startswith("RAG")]
    chat = None if empty_table(ph) else ph[ph["scenario"].str.startswith("chat")]
    if rag is None or not len(rag) or not len(chat):
        return Claim(cid, text, "extra prefill > retrieval", "no RAG run", None, "no RAG scenario")
    r, c = rag.iloc[0], chat.iloc[0]
    extra, retr = float(r["prefill_ms"] - c["prefill_ms"]), float(r["retrieval_ms"])
    return Claim(cid, text, "extra prefill > retrieval (BM25 ~1 ms)",
                 f"+{extra:.1f} ms prefill vs {retr:.2f} ms BM25 ({extra / max(retr, 1e-6):.0f}x)", extra > retr,
                 "retrieval, not the long prompt, is the cost here")


