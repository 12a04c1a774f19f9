"""What a client measures of a streamed request, and how each benchmark tool defines its metrics.

A `Trace` holds one request's perf_counter_ns stamps: sent, picked up, each phase before the first
token, each token received. Everything after it reads only Traces, so the same metrics describe an
in-process worker and a remote server.

Metric definitions (read from each tool's source):
- vLLM `benchmarks/benchmark_serving.py` (`calculate_metrics`): TTFT = first token - send;
  E2EL = last token - send; TPOT = (E2EL - TTFT) / (n - 1) per request; ITL = every gap between
  consecutive chunks, pooled over requests.
- GenAI-Perf (triton-inference-server/perf_analyzer, `llm_profile_data_parser.py`): its
  "inter_token_latency" is (request latency - TTFT) / (n - 1) per request, i.e. vLLM's TPOT.
- llmperf (ray-project/llmperf, `openai_chat_completions_client.py` + `token_benchmark_ray.py`):
  inter_token_latency = sum(time_to_next_token) / n, where the list starts with the TTFT, so it
  is (last token - send) / n: the first token's wait is inside the "inter-token" number.
- guidellm (vllm-project/guidellm, `schemas/request_stats.py`): time_per_output_token_ms =
  (last token - start) / n (includes TTFT); inter_token_latency_ms = (last - first) / (n - 1).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

# a request's phases before its first token, in order
PHASES = ("retrieval", "template_tokenize", "prefill", "first_token")


@dataclass
class Trace:
    """What one request did, in perf_counter_ns stamps."""

    send_ns: int
    start_ns: int = 0  # the worker picked it up: queue wait = start - send
    phases: dict[str, tuple[int, int]] = field(default_factory=dict)  # name -> (start, end), before the first token
    token_ns: list[int] = field(default_factory=list)  # when the client received each token
    step_ns: list[tuple[int, int]] = field(default_factory=list)  # each decode step (start, end)
    end_ns: int = 0  # the worker is free again
    prompt_tokens: int = 0
    template: str = ""
    tokens: list[int] = field(default_factory=list)  # the streamed token ids
    text: str = ""

    # -- the vLLM-benchmark metrics, in ms
    @property
    def ttft_ms(self) -> float:
        return (self.token_ns[0] - self.send_ns) / 1e6

    @property
    def e2e_ms(self) -> float:
        return (self.token_ns[-1] - self.send_ns) / 1e6

    @property
    def n(self) -> int:
        return len(self.token_ns)

    @property
    def tpot_ms(self) -> float:
        return (self.e2e_ms - self.ttft_ms) / (self.n - 1) if self.n > 1 else math.nan

    @property
    def itl_ms(self) -> list[float]:
        return [(b - a) / 1e6 for a, b in zip(self.token_ns[:-1], self.token_ns[1:], strict=True)]

    @property
    def service_ms(self) -> float:
        """How long the worker was busy with this request."""
        return (self.end_ns - self.start_ns) / 1e6

    # -- the breakdown
    @property
    def queue_ms(self) -> float:
        return (self.start_ns - self.send_ns) / 1e6

    def phase_ms(self, name: str) -> float:
        a, b = self.phases.get(name, (0, 0))
        return (b - a) / 1e6

    @property
    def attributed_ms(self) -> float:
        return self.queue_ms + sum(self.phase_ms(p) for p in self.phases)

    @property
    def unattributed_ms(self) -> float:
        """TTFT minus its phases: the harness's own time between the stamps."""
        return self.ttft_ms - self.attributed_ms

    def breakdown(self) -> dict[str, float]:
        row = {"queue_ms": self.queue_ms}
        row.update({f"{p}_ms": self.phase_ms(p) for p in PHASES})
        row.update(sum_of_phases_ms=self.attributed_ms, ttft_ms=self.ttft_ms, unattributed_ms=self.unattributed_ms,
                   unattributed_pct=100 * self.unattributed_ms / self.ttft_ms)
        return row


def named_stats(xs, stats=("mean", "p50", "p90", "p99"), scale: float = 1.0) -> dict[str, float]:
    """Named statistics of the values of `xs` that are not NaN, times `scale`: "mean", "median", "min", "max",
    "pNN" (numpy's linear interpolation, as vLLM's benchmark uses), "n"; NaN each (n 0) when none is left.
    Flat, named columns for a benchmark's tables (its p99 and mean); core.stats.Summary is a timer's summary."""
    xs = np.asarray([x for x in xs if not math.isnan(x)], float) * scale
    if xs.size == 0:
        return {s: 0 if s == "n" else math.nan for s in stats}
    named = {"mean": np.mean, "median": np.median, "min": np.min, "max": np.max}
    return {s: int(xs.size) if s == "n" else float(named[s](xs) if s in named else np.percentile(xs, int(s[1:])))
            for s in stats}


def pct(xs, qs=(50, 90, 99)) -> dict[str, float]:
    """p50/p90/p99 and the mean of the values in ms, and how many there were."""
    return {k if k == "n" else f"{k}_ms": v for k, v in named_stats(xs, (*(f"p{q}" for q in qs), "mean", "n")).items()}


def vllm_metrics(traces: list[Trace]) -> dict[str, dict[str, float]]:
    """TTFT, TPOT, ITL, E2EL as vLLM's benchmark_serving computes them (ITL pooled over requests)."""
    return {
        "TTFT": pct([t.ttft_ms for t in traces]),
        "TPOT": pct([t.tpot_ms for t in traces]),
        "ITL": pct([g for t in traces for g in t.itl_ms]),
        "E2EL": pct([t.e2e_ms for t in traces]),
    }


def tool_metrics(traces: list[Trace]) -> list[dict]:
    """The "per-token latency" each tool would report for the same requests (mean over requests, ms)."""

    def mean(f):
        return float(np.mean([f(t) for t in traces]))

    first = lambda t: (t.token_ns[0] - t.send_ns) / 1e6  # noqa: E731
    last = lambda t: (t.token_ns[-1] - t.send_ns) / 1e6  # noqa: E731
    return [
        dict(tool="vLLM benchmark_serving", metric="TPOT", formula="(E2EL - TTFT) / (n - 1)",
             value_ms=mean(lambda t: t.tpot_ms)),
        dict(tool="vLLM benchmark_serving", metric="ITL (mean of pooled gaps)", formula="every token gap, pooled",
             value_ms=float(np.mean([g for t in traces for g in t.itl_ms]))),
        dict(tool="GenAI-Perf", metric="inter_token_latency", formula="(request latency - TTFT) / (n - 1)",
             value_ms=mean(lambda t: (last(t) - first(t)) / (t.n - 1))),
        dict(tool="llmperf", metric="inter_token_latency", formula="(TTFT + sum of gaps) / n = (last - send) / n",
             value_ms=mean(lambda t: last(t) / t.n)),
        dict(tool="guidellm", metric="time_per_output_token_ms", formula="(last - start) / n",
             value_ms=mean(lambda t: last(t) / t.n)),
        dict(tool="guidellm", metric="inter_token_latency_ms", formula="(last - first) / (n - 1)",
             value_ms=mean(lambda t: (last(t) - first(t)) / (t.n - 1))),
    ]


