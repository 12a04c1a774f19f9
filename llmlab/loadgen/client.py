"""A streaming client for any OpenAI-compatible /v1/completions endpoint (vLLM, SGLang, TGI,
llama.cpp, `llmlab serve`), and the metrics of a run as one pure function.

Reading order: `RequestRecord` (one request's stamps) -> `stream_completion` (one streamed request,
every SSE chunk stamped with time.perf_counter_ns on arrival) -> `arrival_gaps` (request rate with
burstiness) -> `run_load` (warm-up, then concurrency and/or rate) -> `calculate_metrics` (pure:
records -> one flat dataclass with machine keys such as `p99_ttft_ms`).

Definitions, as vLLM's `bench serve` computes them (benchmarks/serve.py `calculate_metrics` and
`endpoint_request_func.py` for OpenAI completions):
- TTFT  = arrival of the first chunk with choices - send;
- ITL   = every gap between consecutive chunks with choices, pooled over requests;
- E2EL  = arrival of the last chunk with choices - send;
- TPOT  = (E2EL - TTFT) / (output tokens - 1) per request, requests with one token left out;
- output tokens = `usage.completion_tokens` from the final chunk (the client asks for
  `stream_options.include_usage`); a chunk is not a token. Without usage, a `count_tokens`
  callable the caller gives (a tokenizer), else the chunk count, and the record says which.
- request throughput = completed / duration, output throughput = output tokens / duration, with
  duration = first timed send -> last timed completion.
Failed requests (HTTP 4xx/5xx, a stream that ends without `data: [DONE]`, a timeout) are kept with
their error and count in the error rate, never in the latency percentiles.

Arrivals at `request_rate` R follow vLLM: gaps ~ Gamma(shape = burstiness, scale = 1 / (R *
burstiness)): mean 1/R always; burstiness 1 is a Poisson process, < 1 burstier, > 1 more even.

The API key is read from the environment variable the caller names (default OPENAI_API_KEY) and
only ever put in the Authorization header: never in a record, an error or a log.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from llmlab.loadgen.metrics import named_stats

now_ns = time.perf_counter_ns


@dataclass
class RequestRecord:
    index: int
    warmup: bool = False
    send_ns: int = 0  # perf_counter_ns just before the request went out
    chunk_ns: list[int] = field(default_factory=list)  # arrival of every chunk with choices
    text: str = ""
    prompt_tokens: int | None = None  # from usage
    output_tokens: int | None = None
    output_tokens_source: str = ""  # "usage" | "tokenizer" | "chunks"
    usage: dict | None = None
    timings: dict | None = None  # the server's own phases (llmlab serve, llama.cpp), when it reports them
    status: int | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def ttft_s(self) -> float:
        return (self.chunk_ns[0] - self.send_ns) / 1e9 if self.chunk_ns else math.nan

    @property
    def e2el_s(self) -> float:
        return (self.chunk_ns[-1] - self.send_ns) / 1e9 if self.chunk_ns else math.nan

    @property
    def itl_s(self) -> list[float]:
        return [(b - a) / 1e9 for a, b in zip(self.chunk_ns, self.chunk_ns[1:])]  # noqa: B905 (lengths differ by one)

    @property
    def tpot_s(self) -> float:
        n = self.output_tokens or 0
        return (self.e2el_s - self.ttft_s) / (n - 1) if n > 1 else math.nan


def api_headers(api_key_env: str | None) -> dict:
    key = os.environ.get(api_key_env) if api_key_env else None
    return {"Authorization": f"Bearer {key}"} if key else {}


async def stream_completion(client, url: str, payload: dict, index: int = 0, headers: dict | None = None,
                            timeout_s: float = 60.0, count_tokens: Callable[[str], int] | None = None,
                            warmup: bool = False) -> RequestRecord:
    """POST one streamed completion and stamp every chunk. Never raises for a failed request: the record holds
    the error."""
    import httpx

    rec = RequestRecord(index, warmup)
    body = {**payload, "stream": True, "stream_options": {"include_usage": True}}
    done = False

    async def go():
        nonlocal done
        rec.send_ns = now_ns()
        async with client.stream("POST", url, json=body, headers=headers or {}) as resp:
            rec.status = resp.status_code
            if resp.status_code != 200:
                raw = (await resp.aread()).decode(errors="replace")
                try:
                    msg = json.loads(raw)["error"]["message"]
                except (ValueError, KeyError, TypeError):
                    msg = raw[:200]
                rec.error = f"HTTP {resp.status_code}: {msg}"
                return
            async for line in resp.aiter_lines():
                t = now_ns()
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    done = True
                    break
                chunk = json.loads(data)
                if chunk.get("choices"):
                    rec.chunk_ns.append(t)
                    c = chunk["choices"][0]
                    rec.text += c.get("text") or (c.get("delta") or {}).get("content") or ""
                if chunk.get("usage"):
                    rec.usage = chunk["usage"]
                if chunk.get("timings"):
                    rec.timings = chunk["timings"]

    try:
        await asyncio.wait_for(go(), timeout_s)
        if rec.error is None and not done:
            rec.error = "the stream ended without data: [DONE]"
    except (asyncio.TimeoutError, httpx.TimeoutException):
        rec.error = f"timeout after {timeout_s:g} s"
    except (httpx.HTTPError, json.JSONDecodeError, OSError) as exc:
        rec.error = f"{type(exc).__name__}: {str(exc)[:200]}"
    if rec.error is None and not rec.chunk_ns:
        rec.error = "no chunk with choices"
    if rec.usage and rec.usage.get("completion_tokens") is not None:
        rec.output_tokens, rec.output_tokens_source = int(rec.usage["completion_tokens"]), "usage"
        rec.prompt_tokens = rec.usage.get("prompt_tokens")
    elif count_tokens is not None:
        rec.output_tokens, rec.output_tokens_source = count_tokens(rec.text), "tokenizer"
    else:
        rec.output_tokens, rec.output_tokens_source = len(rec.chunk_ns), "chunks"
    return rec


def arrival_gaps(n: int, request_rate: float, burstiness: float = 1.0, seed: int = 0) -> list[float]:
    """Seconds between consecutive sends: all 0 at an infinite rate, else Gamma(burstiness, 1 / (rate * burstiness))."""
    if request_rate <= 0 or burstiness <= 0:
        raise ValueError(f"request_rate and burstiness must be > 0, got {request_rate} and {burstiness}")
    if math.isinf(request_rate):
        return [0.0] * n
    rng = np.random.default_rng(seed)
    return rng.gamma(shape=burstiness, scale=1.0 / (request_rate * burstiness), size=n).tolist()


@dataclass
class LoadRun:
    records: list[RequestRecord]  # warm-up ones first (warmup=True), then the timed ones in index order
    duration_s: float  # first timed send -> last timed completion


async def run_load(url: str, payloads: list[dict], *, concurrency: int | None = None, request_rate: float = math.inf,
                   burstiness: float = 1.0, warmup: int = 0, timeout_s: float = 60.0,
                   api_key_env: str | None = "OPENAI_API_KEY", count_tokens: Callable[[str], int] | None = None,
                   seed: int = 0, sink: list | None = None) -> LoadRun:
    """Send `warmup` requests one by one (excluded), then every payload at `request_rate` with at most
    `concurrency` in flight.

    `sink`, when given, gets every record as it completes: what a Ctrl-C (which cancels this coroutine) leaves
    measured."""
    import httpx

    if concurrency is not None and concurrency < 1:
        raise ValueError(f"concurrency must be at least 1, got {concurrency}")
    headers = api_headers(api_key_env)
    limits = httpx.Limits(max_connections=max(concurrency or len(payloads), 1) + 1, max_keepalive_connections=None)
    async with httpx.AsyncClient(timeout=httpx.Timeout(timeout_s), limits=limits) as client:
        sink = [] if sink is None else sink
        records = []
        for i in range(warmup):
            payload = payloads[i % len(payloads)]
            records.append(await stream_completion(client, url, payload, i, headers, timeout_s, count_tokens, True))
            sink.append(records[-1])
        sem = asyncio.Semaphore(concurrency) if concurrency else None

        async def one(i: int, payload: dict) -> RequestRecord:
            async with sem or contextlib.nullcontext():
                rec = await stream_completion(client, url, payload, i, headers, timeout_s, count_tokens)
            sink.append(rec)
            return rec

        tasks = []
        t0 = time.perf_counter()
        gaps = arrival_gaps(len(payloads), request_rate, burstiness, seed)
        for i, (p, gap) in enumerate(zip(payloads, gaps, strict=True)):
            if gap > 0 and i > 0:
                await asyncio.sleep(gap)
            tasks.append(asyncio.create_task(one(i, p)))
        timed = list(await asyncio.gather(*tasks))
        duration = time.perf_counter() - t0
    return LoadRun(records + timed, duration)


# ---------------------------------------------------------------- metrics (pure)


@dataclass(frozen=True)
class ServingMetrics:
    completed: int
    failed: int
    error_rate: float
    duration_s: float
    total_input_tokens: int
    total_output_tokens: int
    request_throughput: float  # completed requests / s
    output_throughput: float  # output tokens / s
    total_token_throughput: float  # (input + output) tokens / s
    mean_ttft_ms: float
    p50_ttft_ms: float
    p90_ttft_ms: float
    p99_ttft_ms: float
    mean_tpot_ms: float
    p50_tpot_ms: float
    p90_tpot_ms: float
    p99_tpot_ms: float
    mean_itl_ms: float
    p50_itl_ms: float
    p90_itl_ms: float
    p99_itl_ms: float
    mean_e2el_ms: float
    p50_e2el_ms: float
    p90_e2el_ms: float
    p99_e2el_ms: float


def _ms_stats(name: str, xs_s: list[float]) -> dict:
    """mean/p50/p90/p99 of seconds, in ms, keyed as vLLM's bench serve names them (`p99_ttft_ms`)."""
    return {f"{k}_{name}_ms": v for k, v in named_stats(xs_s, scale=1e3).items()}


def calculate_metrics(records: list[RequestRecord], duration_s: float) -> ServingMetrics:
    """vLLM bench serve's metrics from the timed records (warm-up ones are left out here)."""
    timed = [r for r in records if not r.warmup]
    good = [r for r in timed if r.ok]
    n_in = sum(r.prompt_tokens or 0 for r in good)
    n_out = sum(r.output_tokens or 0 for r in good)
    dur = duration_s if duration_s > 0 else math.nan
    return ServingMetrics(
        completed=len(good), failed=len(timed) - len(good),
        error_rate=(len(timed) - len(good)) / len(timed) if timed else math.nan,
        duration_s=duration_s, total_input_tokens=n_in, total_output_tokens=n_out,
        request_throughput=len(good) / dur, output_throughput=n_out / dur, total_token_throughput=(n_in + n_out) / dur,
        **_ms_stats("ttft", [r.ttft_s for r in good]), **_ms_stats("tpot", [r.tpot_s for r in good]),
        **_ms_stats("itl", [x for r in good for x in r.itl_s]), **_ms_stats("e2el", [r.e2el_s for r in good]),
    )
