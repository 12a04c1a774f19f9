"""Part 5 of the prefill-decode lab's report (5, 5b): disaggregated prefill, run (`llmlab.serving.disagg`).

Two ranks, each with its own engine: rank 0 prefills each long prompt and ships its first token and KV
blocks to rank 1, which decodes it beside replies already running; the baseline is the same engine
colocated with chunked prefill under the same arrivals. Measured: the KV bytes moved and their transfer
time against the link probed on the same path, the running replies' ITL while the prefills happen, and each
long request's TTFT. Three claims, each from the saved tables alone:

- `handoff_bytes_at_link_rate`: every hand-off moves exactly the formula's bytes
  (2 x layers x kv_heads x head_dim x shipped tokens x bytes per element) in a time within
  HANDOFF_BAND of latency + bytes / rate, both measured by the link probe;
- `disagg_lowers_running_itl`: the running replies' worst ITL during the prefills is lower disaggregated
  than colocated with chunked prefill (not judged when both ranks share one GPU: the prefill then still
  competes with the decodes for it);
- `disagg_ttft_cost`: what disaggregation adds to TTFT over the prefill itself is the hand-off: rank 1
  takes it within one of its steps (the wait is at most its worst ITL), so TTFT - the prefill worker's
  TTFT = wait + transfer; the TTFT against colocated chunked prefill is reported beside it.
"""

from __future__ import annotations

import pandas as pd

from llmlab.core.device import Device
from llmlab.core.results import Claim, Col, LabResult, View, empty_table
from llmlab.labs.prefill_decode.config import Config
from llmlab.serving.disagg import MODES, Workload, measure

HANDOFF_BAND = (0.5, 2.0)  # transfer / (latency + bytes / rate): a loaded host's scheduling moves it by ~2x
FIRST_ARRIVAL_MS, ARRIVAL_GAP_MS = 100.0, 200.0  # the running replies reach steady decode first; then one each gap
WAIT_SLACK_MS = 1.0  # the hand-off's pick-up is measured against one decode step: the clock reads around it
TABLES = ("handoff_link", "handoff", "handoff_modes", "handoff_requests")


def workload(cfg: Config, device: Device, model: str, dtype: str) -> Workload:
    """The hand-off experiment from the lab's Config: `model` and `dtype` are the lab's first model's."""
    return Workload(model=model, dtype=dtype, device="cuda" if device.is_cuda else "cpu",
                    running=cfg.handoff_running, long_prompt=cfg.handoff_prompt,
                    long_at_ms=tuple(FIRST_ARRIVAL_MS + ARRIVAL_GAP_MS * i for i in range(cfg.handoff_requests)),
                    chunk_budget=cfg.handoff_chunk, seed=cfg.seed)


def measure_handoff(res: LabResult, cfg: Config, device: Device, model: str, dtype: str) -> None:
    """Run both modes on two spawned ranks; add the four hand-off tables."""
    t = measure(workload(cfg, device, model, dtype))
    for name, key in zip(TABLES, ("link", "handoff", "modes", "requests"), strict=True):
        res.add_table(name, t[key])
    if not t["modes"][1]["tokens_equal"]:
        why = "random weights: near-tied logits" if model.startswith("arch:") else "a near-tie, or a broken import"
        res.note(f"hand-off: a disaggregated reply's greedy tokens differ from the colocated reply's ({why}; "
                 "see the handoff table)")


# ---------------------------------------------------------------- the claims


def handoff_claims(T: dict[str, pd.DataFrame]) -> list[Claim]:
    """The three hand-off claims from the saved tables (none when the part did not run)."""
    if any(empty_table(T.get(n)) for n in TABLES):
        return []
    return [_bytes_claim(T["handoff"], T["handoff_link"].iloc[0]), _itl_claim(T["handoff_modes"], T["handoff_link"]),
            _ttft_claim(T["handoff_modes"], T["handoff_requests"])]


def _bytes_claim(h: pd.DataFrame, link) -> Claim:
    lo, hi = HANDOFF_BAND
    exact = bool((h["kv_bytes"] == h["formula_bytes"]).all())
    r = h["transfer_over_predicted"]
    holds = exact and bool(r.between(lo, hi).all())
    why = ("" if holds else "off the probed link: busy host or size-dependent rate" if exact
           else "the bytes sent are not the formula's: the export or the import is wrong")
    return Claim(
        "prefill_decode.handoff_bytes_at_link_rate",
        "the hand-off moves the formula's bytes at the probed link rate",
        f"bytes = the KV formula; transfer {lo:g}-{hi:g}x latency + bytes / rate",
        f"{int(h['kv_bytes'].iloc[0]):,} B ({'= formula' if exact else 'NOT the formula'}); transfer "
        f"{r.min():.2f}-{r.max():.2f}x predicted",
        holds, note=why)


def _itl_claim(m: pd.DataFrame, link: pd.DataFrame) -> Claim:
    co, dis = (m[m["mode"] == mode].iloc[0] for mode in MODES)
    devices = str(link["devices"].iloc[0]).split(" + ")
    shared_gpu = devices[0].startswith("cuda") and devices[0] == devices[1]
    holds = None if shared_gpu else bool(dis["itl_max_ms"] < co["itl_max_ms"])
    note = ("both ranks share one GPU: the prefill still competes with the decodes for it (needs two GPUs)"
            if shared_gpu else "" if holds else
            "the decode rank was slowed by something else than prefill: both ranks share the host's cores")
    return Claim(
        "prefill_decode.disagg_lowers_running_itl", "disaggregation lowers the running replies' worst ITL",
        f"worst ITL in prefills: disaggregated < colocated ({int(co['chunk_budget'])}-token chunks)",
        f"worst {dis['itl_max_ms']:.1f} ms disaggregated vs {co['itl_max_ms']:.1f} ms colocated", holds, note=note)


def _ttft_claim(m: pd.DataFrame, req: pd.DataFrame) -> Claim:
    co, dis = (m[m["mode"] == mode].iloc[0] for mode in MODES)
    d = req[req["mode"] == MODES[1]]
    over = (d["ttft_ms"] - d["prefill_ttft_ms"]).max()  # wait + transfer
    holds = bool((d["wait_ms"] <= dis["itl_max_ms"] + WAIT_SLACK_MS).all())
    diff = dis["ttft_p50_ms"] - co["ttft_p50_ms"]
    return Claim(
        "prefill_decode.disagg_ttft_cost", "disaggregation's TTFT cost over its prefill is the hand-off",
        f"TTFT - prefill's TTFT = wait + transfer, wait <= worst ITL + {WAIT_SLACK_MS:g} ms",
        f"adds <= {over:.1f} ms (wait {d['wait_ms'].max():.1f}, transfer {d['transfer_ms'].max():.1f}); p50 TTFT "
        f"{dis['ttft_p50_ms']:.0f} vs {co['ttft_p50_ms']:.0f} ms colocated ({diff:+.0f} ms)",
        holds, note="" if holds else "the decode worker took longer than one of its steps to pick a hand-off up")


# ---------------------------------------------------------------- the views


def handoff_views(result: LabResult) -> list[View]:
    """The hand-off's two views: the modes side by side, then each hand-off against the link."""
    link = result.tables.get("handoff_link")
    how = ""
    if not empty_table(link):
        r = link.iloc[0]
        how = f" (link {r['backend']} {r['devices']}: {r['rate_GBps']:.2f} GB/s, {r['latency_us']:.0f} us)"
    return [
        View("5. Disaggregation, run", "Moving prefill to another worker: the running replies' ITL, and TTFT (ms)",
             "handoff_modes",
             (Col("mode", "mode", "text", 26), Col("itl_p50_ms", "ITL p50 during"), Col("itl_max_ms", "worst ITL"),
              Col("ttft_p50_ms", "TTFT p50"), Col("ttft_max_ms", "TTFT max"))),
        View("5b. The hand-off", "KV bytes and transfer time" + how, "handoff",
             (Col("prompt_tokens", "T", "int"), Col("kv_bytes", "KV bytes", "int"),
              Col("formula_bytes", "formula", "int"), Col("transfer_ms", "transfer ms"),
              Col("predicted_ms", "predicted ms"), Col("tokens_equal", "same tokens", "text"))),
    ]
