"""The tensor-parallel lab's verdicts and headline, from the tables alone."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from llmlab.core.results import Claim, LabResult
from llmlab.labs.tensor_parallel.formulas import in_scope

if TYPE_CHECKING:
    import pandas as pd

EXACT_TOL = 1e-5  # FP32 logits: a split that sums the same products differs only by rounding
FLOOR_BYTES = 4096  # messages up to 4 KiB: the latency floor
FLOOR_RATIO = 3.0  # "about the same time": within 3x of the 8 B time while the size grows 512x (bandwidth-bound: 512x)
PREDICT_TOL = 2.0  # comm share predicted from part 2 within 2x of the one timed in the step
LINK_SHARE = 0.5  # busbw plateau >= half the link's per-direction spec


# ---------------------------------------------------------------- judge


def _t(result: LabResult, name: str):
    df = result.tables.get(name)
    return None if df is None or df.empty else df


def plateau(coll: pd.DataFrame, op: str = "all_reduce") -> float:
    """The bandwidth plateau: the best busbw of the sweep (reached at the large messages)."""
    d = coll[coll.op == op].dropna(subset=["busbw_GBps"])
    return float(d.busbw_GBps.max()) if len(d) else math.nan


def _exact_claim(ex) -> Claim:
    cid, text, exp = "tensor_parallel.sharded_logits_equal", "the sharded model computes the same logits", \
        f"max |diff| <= {EXACT_TOL:g} (FP32), same greedy tokens"
    if ex is None:
        return Claim(cid, text, exp, "-", None, "no exactness table")
    r = ex.iloc[0]
    return Claim(cid, text, exp,
                 f"TP {int(r.tp)}: max |diff| {r.max_abs_logit_diff:.1e}; greedy equal: {bool(r.greedy_equal)}",
                 bool(r.max_abs_logit_diff <= EXACT_TOL and r.greedy_equal))


def _busbw_claim(result: LabResult, coll, link, scope: str, hop: str, cid: str, text: str) -> Claim:
    """The scope's busbw plateau >= LINK_SHARE x the slowest rank's spec for the hop it crosses (a ring runs at its
    slowest link); on one node the "world" scope crosses the "intra-node" hop."""
    exp = f"best busbw of the sweep >= {LINK_SHARE:.0%} of the link spec"
    rows = None if coll is None or "busbw_GBps" not in coll else in_scope(coll, scope)
    if rows is None or rows.empty:
        return Claim(cid, text, exp, "-", None, f"this run has no {scope} collectives")
    p = plateau(rows)
    specs = None if link is None else \
        (link[link.scope == hop] if "scope" in link else link).dropna(subset=["spec_GBps"])
    if specs is None or specs.empty:
        why = result.skipped.get("link", "no link spec") if link is None else f"the {hop} link's spec is unknown"
        return Claim(cid, text, exp, f"plateau {p:.2f} GB/s busbw", None, f"not measured: {why}")
    slow = specs.loc[specs.spec_GBps.idxmin()]
    spec = float(slow.spec_GBps)
    return Claim(cid, text, f"best busbw of the sweep >= {LINK_SHARE:.0%} of {spec:.0f} GB/s ({slow.link}, the "
                            "slowest rank's)",
                 f"plateau {p:.1f} GB/s = {p / spec:.0%} of spec", bool(p >= LINK_SHARE * spec))


def _floor_claim(coll) -> Claim:
    cid, text = "tensor_parallel.latency_floor", "small messages cost about the same time: a latency floor"
    if coll is None or "time_us" not in coll:
        return Claim(cid, text, f"t(<= {FLOOR_BYTES} B) within {FLOOR_RATIO:g}x", "-", None, "no collectives table")
    ar = in_scope(coll, "world")
    ar = ar[ar.op == "all_reduce"].dropna(subset=["time_us"]).sort_values("size_bytes")
    small = ar[ar.size_bytes <= FLOOR_BYTES]
    if len(small) < 2:
        return Claim(cid, text, f"t(<= {FLOOR_BYTES} B) within {FLOOR_RATIO:g}x", "-", None, "fewer than 2 small sizes")
    lo, hi = small.iloc[0], small.iloc[-1]
    ratio = hi.time_us / lo.time_us
    return Claim(cid, text, f"t({int(hi.size_bytes)} B) <= {FLOOR_RATIO:g}x t({int(lo.size_bytes)} B) (not "
                 f"{hi.size_bytes / lo.size_bytes:.0f}x)", f"{lo.time_us:.0f} -> {hi.time_us:.0f} us ({ratio:.2f}x)",
                 bool(ratio <= FLOOR_RATIO))


def _comm_claim(st) -> Claim:
    """At batch 1 the all-reduce time of a step, ranks aligned by a barrier first, against part 2's prediction."""
    cid, text = "tensor_parallel.comm_share_tp2_b1", "at batch 1, a TP step's all-reduces cost what part 2 predicts"
    row = None if st is None else st[(st.tp > 1) & (st.batch == 1)]
    if row is None or row.empty or "predicted_comm_ms" not in row:
        return Claim(cid, text, "2L all-reduces x part 2's time", "-", None, "no TP step at batch 1")
    r = row.iloc[0]
    aligned = r.aligned_comm_ms if "aligned_comm_ms" in r else r.comm_ms  # a run before the aligned steps: the raw time
    ratio = aligned / r.predicted_comm_ms if r.predicted_comm_ms > 0 else math.inf
    skew = (f"; unaligned, {r.comm_share:.0%} of the step is in all-reduce, {r.wait_share:.0%} waiting for the "
            "slower rank") if "wait_share" in r else ""
    return Claim(cid, text, f"all-reduce time (ranks aligned by a barrier) within {PREDICT_TOL:g}x of "
                            f"{int(r.allreduces)} x "
                 f"part 2's all-reduce at {int(r.msg_bytes)} B = {r.predicted_comm_ms:.2f} ms",
                 f"{aligned:.2f} ms ({ratio:.2f}x) of a {r.step_ms:.2f} ms step{skew}",
                 bool(1 / PREDICT_TOL <= ratio <= PREDICT_TOL),
                 note="" if ratio <= PREDICT_TOL else "with the skew taken out, a step's all-reduces still cost "
                                                      f"{ratio:.1f}x "
                 "the sweep's back-to-back mean: the wait for the slower rank is not the whole gap")


def judge(result: LabResult) -> list[Claim]:
    coll, link = _t(result, "collectives"), _t(result, "link")
    across = coll is not None and "scope" in coll and (coll.scope == "inter-node").any()
    claims = [_exact_claim(_t(result, "exactness")),
              _busbw_claim(result, coll, link, "intra-node" if across else "world", "intra-node",
                           "tensor_parallel.allreduce_busbw",
                           "all-reduce busbw reaches the link's spec"),
              _floor_claim(coll), _comm_claim(_t(result, "steps"))]
    if across:  # torchrun over several nodes: the network hop against the node's port
        claims.insert(2, _busbw_claim(result, coll, link, "inter-node", "inter-node", "tensor_parallel.internode_busbw",
                                      "across nodes, all-reduce busbw reaches the network port's spec"))
    return claims


def headline(result: LabResult, claims: list[Claim]) -> str:
    st = _t(result, "steps")
    if st is None or not (st.tp > 1).any():
        return ""
    r = st[st.tp > 1].iloc[0]
    split = ""
    if "wait_share" in r:
        wait = (f"{r.wait_share:.0%} waiting for the slower rank" if r.wait_share >= 0 else
                "no measurable wait for the slower rank (aligned, they took longer)")
        split = (f": {r.aligned_comm_share:.0%} in the all-reduces themselves (ranks aligned by a barrier first) "
                 f"and {wait}")
    tp = result.env.get("tp", {})
    where = f" across {tp['nodes']} nodes" if tp.get("nodes", 1) > 1 else ""
    cpu = " (on gloo over the CPU: fewer GPUs than ranks)" if tp.get("plan_note") else ""
    return (f"At batch {int(r.batch)} a TP={int(r.tp)} step{where}{cpu} spends {r.comm_share:.0%} of its time in "
            f"{int(r.allreduces)} all-reduces of {int(r.msg_bytes)} B{split}; it runs at {r.speedup:.2f}x the "
            "one-rank step.")
