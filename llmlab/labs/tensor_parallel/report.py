"""The tensor-parallel lab's report: the terminal views."""

from __future__ import annotations

from llmlab.core.results import Chart, Col, LabResult, View


def views(result: LabResult) -> list[View]:
    coll = result.tables.get("collectives")
    scope = (Col("scope", "scope",
                 "text"),) if coll is not None and "scope" in coll and coll.scope.nunique() > 1 else ()
    return [
        View("1. The sharded model, exact first", "Does the split model compute what one process computes?",
             "exactness",
             (Col("tp", "TP", "int"), Col("max_abs_logit_diff", "max |logit diff|", ".1e"),
              Col("greedy_equal", "greedy same", "text"),
              Col("tokens", "tokens", "int"))),
        View("2. Collectives", "What does an all-reduce cost, small to large (nccl-tests' busbw)?", "collectives",
             (*scope, Col("op", "op", "text"), Col("size_bytes", "bytes", "int"), Col("time_us", "time us"),
              Col("algbw_GBps", "algbw GB/s"), Col("busbw_GBps", "busbw GB/s")),
             rows=lambda d: d[d.op == "all_reduce"] if "op" in d else d,
             chart=Chart("all-reduce busbw vs message size", "collectives", "size_bytes", "busbw_GBps", series="op",
                         logx=True, logy=True, xlabel="bytes (log)", ylabel="GB/s")),
        View("   ... the link", "What would the hardware allow (each rank's own link)?", "link",
             (Col("rank", "rank", "int"), Col("scope", "scope", "text"), Col("link", "link", "text"),
              Col("spec_GBps", "GB/s"))),
        View("3. Where a decode step's time goes",
             "Compute vs all-reduce per step, TP 1 vs TP n; the wait for the slower rank apart",
             "steps",
             (Col("tp", "TP", "int"), Col("batch", "batch", "int"), Col("step_ms", "step ms"),
              Col("comm_share", "comm", "%"),
              Col("aligned_comm_share", "aligned", "%"), Col("wait_share", "wait", "%"),
              Col("predicted_comm_share", "comm pred.", "%"), Col("msg_bytes", "msg B", "int"),
              Col("efficiency", "scaling eff.", "%"))),
        View("4. What fits on 80 GB GPUs (formula)", "Minimum TP for the context x batch; KV tokens left per GPU",
             "fits",
             (Col("tp", "TP", "int"), Col("weights_GB_per_gpu", "weights GB", ".1f"),
              Col("kv_needed_GB_per_gpu", "KV needed GB", ".1f"),
              Col("kv_tokens_left_per_gpu", "KV tokens left", "int"),
              Col("fits", "fits", "text"))),
    ]
