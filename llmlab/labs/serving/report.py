"""The serving lab's report: the terminal views."""

from __future__ import annotations

from llmlab.core.results import Chart, Col, LabResult, View, empty_table

MIN_CURVE_POINTS = 4  # fewer concurrency levels (a --quick run's 3) draw no curve: the table above says it all


def _concurrency_chart(result: LabResult) -> Chart | None:
    df = result.tables.get("concurrency")
    if empty_table(df) or len(df) < MIN_CURVE_POINTS:
        return None
    return Chart("output tokens/s vs clients", "concurrency", "concurrency", "output_tokens_per_s", logx=True,
                 xlabel="clients (log)", ylabel="tokens/s")


def views(result: LabResult) -> list[View]:
    return [
        View("1. Concurrency: batching is the lever",
             "What do more clients buy in tokens/s, and what do they cost in latency?",
             "concurrency", (Col("concurrency", "clients", "int"), Col("output_tokens_per_s", "tokens / s"),
                             Col("p50_ttft_ms", "TTFT p50 ms"), Col("p99_ttft_ms", "TTFT p99 ms"),
                             Col("p50_itl_ms", "ITL p50 ms"),
                             Col("compute_util", "FLOPs use", "%"), Col("device_busy", "busy", "%")),
             chart=_concurrency_chart(result)),
        View("   ... step time vs batch", "Where does a decode step stop being free to widen?", "step_time",
             (Col("decodes", "decodes / step", "int"), Col("step_ms", "step ms"), Col("ms_per_token", "ms / token"))),
        View("2. Static vs continuous batching", "Same Poisson arrivals, short and long replies mixed: who wins?",
             "static_vs_continuous", (Col("mode", "mode"), Col("max_wait_ms", "wait ms", ".0f"),
                                      Col("output_tokens_per_s", "tokens / s"), Col("p50_ttft_ms", "TTFT p50 ms"),
                                      Col("p99_ttft_ms", "TTFT p99 ms"), Col("wasted_slots", "wasted slots", "int"))),
        View("3. KV capacity limits concurrency",
             "How many long conversations fit in KV pools of each size, the weights fixed?", "capacity",
             (Col("kv_blocks", "KV blocks", "int"), Col("blocks_per_seq", "blocks / conv.", "int"),
              Col("formula_max_seqs", "formula", "int"), Col("admission_bound", "at admission", "int"),
              Col("peak_running", "peak running", "int"),
              Col("preemptions", "preempted", "int"))),
        View("   ... on an 80 GB GPU, by formula (4k-token conversations)", "Why does GQA fit 4x the conversations?",
             "capacity_formula",
             (Col("model", "model"), Col("kv_heads", "KV heads", "int"), Col("weights_GB", "weights GB", ".1f"),
                                  Col("kv_KiB_per_token", "KiB / token", "int"),
                                  Col("conversations", "conversations", "int"))),
        View("4. Prefix reuse", "A shared system prompt, cache off vs on: what is not recomputed?", "prefix",
             (Col("prefix_tokens", "shared tokens", "int"), Col("prefix_cache", "cache"),
              Col("p50_ttft_ms", "TTFT p50 ms"),
              Col("hit_tokens", "hit tokens", "int"), Col("prefill_tokens_computed", "prefill computed", "int"))),
        View("5. Chunked prefill vs decode interference", "A long prompt arrives while 4 replies stream: who waits?",
             "chunked", (Col("mode", "long prompt's prefill"), Col("itl_before_ms", "ITL before ms"),
                         Col("itl_max_during_ms", "worst ITL during ms"), Col("long_prompt_ttft_ms", "its TTFT ms"))),
        View("6. Cost per token", "What does batching do to $ per 1M output tokens (example price)?", "cost",
             (Col("concurrency", "clients", "int"), Col("output_tokens_per_s", "tokens / s"),
              Col("usd_per_million_tokens", "$ / 1M tokens", ".2f"),
              Col("step_usd_per_million_tokens", "by step time", ".2f"), Col("over_step_cost", "x step", ".2f"))),
    ]
