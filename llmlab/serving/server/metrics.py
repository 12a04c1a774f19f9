"""Prometheus metrics with vLLM's names and buckets, every series labelled `model_name` (as vLLM labels
them, so a dashboard can filter), and llama.cpp-style per-request timings.

A request's generated tokens are counted once, when they are known to be the client's: per step for
a request without stop strings, at its finish for one with them (the tokens the engine produced past
a stop string are not the client's, and `usage` does not count them either).

References: vLLM `v1/metrics/loggers.py` (names, buckets); llama.cpp `tools/server/README.md` (`timings`).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from llmlab.serving.engine.scheduler import Sequence

now_ns = time.perf_counter_ns

# vLLM's buckets (v1/metrics/loggers.py), in seconds
TTFT_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0]
ITL_BUCKETS = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
               40.0, 80.0]
REQUEST_BUCKETS = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
                   240.0, 480.0, 960.0, 1920.0, 7680.0]


class Metrics:
    """Prometheus metrics in a registry of their own (several apps can live in one process)."""

    def __init__(self, model_name: str):
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = r = CollectorRegistry()
        label = {"model_name": model_name}

        def h(name, doc, buckets):
            return Histogram(f"llmlab:{name}", doc, ["model_name"], buckets=buckets, registry=r).labels(**label)

        def one(kind, name, doc):
            return kind(f"llmlab:{name}", doc, ["model_name"], registry=r).labels(**label)

        self.ttft = h("time_to_first_token_seconds", "Arrival to first token.", TTFT_BUCKETS)
        self.queue = h(
            "request_queue_time_seconds", "Arrival to scheduled (time in the waiting queue).", REQUEST_BUCKETS
        )
        self.prefill = h("request_prefill_time_seconds", "Scheduled to first token.", REQUEST_BUCKETS)
        self.decode = h("request_decode_time_seconds", "First token to finished.", REQUEST_BUCKETS)
        self.itl = h("inter_token_latency_seconds", "Gap between consecutive tokens of a request.", ITL_BUCKETS)
        self.e2e = h("e2e_request_latency_seconds", "Arrival to finished.", REQUEST_BUCKETS)
        self.running = one(Gauge, "num_requests_running", "Requests in the running batch.")
        self.waiting = one(Gauge, "num_requests_waiting", "Requests waiting to be scheduled.")
        self.kv_usage = one(Gauge, "kv_cache_usage_perc", "Fraction of KV blocks in use (1 = full).")
        self.prefix_queries = one(Counter, "prefix_cache_queries", "Prompt tokens looked up in the prefix cache.")
        self.prefix_hits = one(Counter, "prefix_cache_hits", "Prompt tokens found in the prefix cache.")
        self.preemptions = one(Counter, "num_preemptions", "Sequences preempted (blocks freed, recomputed later).")
        self.prompt_tokens = one(Counter, "prompt_tokens", "Prompt tokens of finished requests.")
        self.generation_tokens = one(Counter, "generation_tokens", "Generated tokens the clients got.")
        self.engine_faults = one(
            Counter, "engine_faults", "Engine steps that raised (their requests failed; the engine went on)."
        )
        self._success = Counter(
            "llmlab:request_success", "Finished requests by reason.", ["model_name", "finished_reason"], registry=r
        )
        self._label = model_name

    def finished(self, s: Sequence, reason: str) -> None:
        if s.first_token_ns:
            self.ttft.observe((s.first_token_ns - s.arrival_ns) / 1e9)
            self.prefill.observe((s.first_token_ns - s.scheduled_ns) / 1e9)
            self.decode.observe(((s.finished_ns or now_ns()) - s.first_token_ns) / 1e9)
        if s.scheduled_ns:
            self.queue.observe((s.scheduled_ns - s.arrival_ns) / 1e9)
        self.e2e.observe(((s.finished_ns or now_ns()) - s.arrival_ns) / 1e9)
        self.prompt_tokens.inc(len(s.prompt_ids))
        self._success.labels(self._label, reason).inc()


def timings(s: Sequence, n_out: int | None = None, end_ns: int | None = None) -> dict:
    """llama.cpp-style timings of one request (+ queue_ms), from the engine's stamps; n_out: the tokens the
    client got."""
    end = s.finished_ns or end_ns or now_ns()
    cache_n = max(s.num_cached_prompt, 0)
    prompt_n = len(s.prompt_ids) - cache_n
    prompt_ms = (s.first_token_ns - s.scheduled_ns) / 1e6 if s.first_token_ns else 0.0
    predicted_n = len(s.output_ids) if n_out is None else n_out
    if n_out is not None and 0 < n_out < len(s.token_ns):
        end = s.token_ns[n_out - 1]  # the client's last token, not what the engine made past a stop string
    predicted_ms = (end - s.first_token_ns) / 1e6 if s.first_token_ns else 0.0
    return {
        "queue_ms": (s.scheduled_ns - s.arrival_ns) / 1e6 if s.scheduled_ns else 0.0,
        "cache_n": cache_n, "prompt_n": prompt_n, "prompt_ms": prompt_ms,
        "prompt_per_token_ms": prompt_ms / prompt_n if prompt_n else 0.0,
        "prompt_per_second": 1e3 * prompt_n / prompt_ms if prompt_ms else 0.0,
        "predicted_n": predicted_n, "predicted_ms": predicted_ms,
        "predicted_per_token_ms": predicted_ms / (predicted_n - 1) if predicted_n > 1 else 0.0,
        "predicted_per_second": 1e3 * (predicted_n - 1) / predicted_ms if predicted_ms else 0.0,
    }
