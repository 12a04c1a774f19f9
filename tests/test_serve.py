"""`llmlab serve` over real HTTP (a subprocess on 127.0.0.1, a free port) driven by the streaming
client: SSE format and usage, timings against the client's own stamps, /metrics counts, prefix
hits, batching, a disconnect freeing blocks, bad requests, and vLLM's metric definitions."""

from __future__ import annotations

import asyncio
import json
import math
import os
import signal
import subprocess
import sys
import time

import httpx
import pytest
from conftest import ROOT, start_serve, stop_serve
from prometheus_client.parser import text_string_to_metric_families

from llmlab.serving.client import RequestRecord, calculate_metrics, run_load, stream_completion

KV_BLOCKS = 64  # a 1024-token context: small enough to send a prompt past it


@pytest.fixture(scope="module")
def server():
    base, proc = start_serve("--max-num-seqs", "8", "--kv-blocks", str(KV_BLOCKS))
    yield base, proc
    stop_serve(proc)


def post(base, path, body, **kw):
    return httpx.post(base + path, content=body if isinstance(body, str) else json.dumps(body),
                      headers={"content-type": "application/json"}, timeout=120, **kw)


def metrics(base) -> dict:
    out = {}
    for fam in text_string_to_metric_families(httpx.get(base + "/metrics").text):
        for s in fam.samples:
            if not s.labels or s.name.endswith("_total"):
                out[s.name] = out.get(s.name, 0) + s.value
    return out


def stats(base) -> dict:
    return httpx.get(base + "/v1/engine/stats").json()


def sse_events(text: str) -> list[str]:
    return [line[len("data: "):] for line in text.splitlines() if line.startswith("data: ")]


def test_models_and_health(server):
    base, _ = server
    assert httpx.get(base + "/health").json() == {"status": "ok"}
    (m,) = httpx.get(base + "/v1/models").json()["data"]
    assert m["id"] == "tiny" and m["max_model_len"] == KV_BLOCKS * 16


def test_stream_format_usage_and_timings(server):
    base, _ = server
    r = post(base, "/v1/completions", {"model": "tiny", "prompt": "def add(a, b):", "max_tokens": 6, "temperature": 0,
                                        "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = sse_events(r.text)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    with_choices = [c for c in chunks if c["choices"]]
    assert len(with_choices) == 6  # one chunk per token here
    assert [c["choices"][0]["finish_reason"] for c in with_choices] == [None] * 5 + ["length"]
    usage_chunk = chunks[-1]
    assert usage_chunk["choices"] == [] and usage_chunk["usage"]["completion_tokens"] == 6
    t = usage_chunk["timings"]
    assert t["predicted_n"] == 6 and t["prompt_n"] + t["cache_n"] == usage_chunk["usage"]["prompt_tokens"]
    assert t["queue_ms"] >= 0 and t["prompt_ms"] > 0 and t["predicted_ms"] > 0
    # the same request without streaming gives the same greedy text
    r2 = post(base, "/v1/completions", {"prompt": "def add(a, b):", "max_tokens": 6, "temperature": 0, "ignore_eos": True})
    body = r2.json()
    assert body["choices"][0]["text"] == "".join(c["choices"][0]["text"] for c in with_choices)
    assert body["usage"]["completion_tokens"] == 6 and "timings" in body


def test_chat_completions(server):
    base, _ = server
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is a tuple?"}]
    r = post(base, "/v1/chat/completions", {"model": "tiny", "messages": msgs, "max_tokens": 5, "temperature": 0})
    body = r.json()
    assert r.status_code == 200 and body["object"] == "chat.completion"
    assert body["choices"][0]["message"]["role"] == "assistant" and body["usage"]["completion_tokens"] <= 5
    r = post(base, "/v1/chat/completions", {"messages": msgs, "max_tokens": 3, "temperature": 0, "ignore_eos": True, "stream": True})
    events = sse_events(r.text)
    first = json.loads(events[0])
    assert first["object"] == "chat.completion.chunk" and first["choices"][0]["delta"]["role"] == "assistant"
    assert events[-1] == "[DONE]" and json.loads(events[-2])["choices"][0]["finish_reason"] == "length"


def test_timings_consistent_with_client_stamps(server):
    base, _ = server

    async def go():
        async with httpx.AsyncClient(timeout=120) as c:
            return await stream_completion(c, base + "/v1/completions", {"prompt": "import os\nimport sys\n", "max_tokens": 8,
                                                                          "temperature": 0, "ignore_eos": True})
    rec = asyncio.run(go())
    assert rec.ok and rec.output_tokens == 8 and rec.output_tokens_source == "usage"
    t = rec.timings
    assert t["prompt_ms"] <= rec.ttft_s * 1e3  # the server's prefill sits inside the client's TTFT
    assert t["queue_ms"] + t["prompt_ms"] <= rec.ttft_s * 1e3
    assert t["predicted_ms"] <= rec.e2el_s * 1e3
    assert len(rec.itl_s) == 7 and rec.tpot_s > 0


def test_concurrent_requests_are_batched_and_counted(server):
    base, _ = server
    before = metrics(base)
    payloads = [{"prompt": f"def f{i}(x):", "max_tokens": 12, "temperature": 0, "ignore_eos": True} for i in range(6)]
    run = asyncio.run(run_load(base + "/v1/completions", payloads, concurrency=6, warmup=1))
    m = calculate_metrics(run.records, run.duration_s)
    assert m.completed == 6 and m.failed == 0 and m.error_rate == 0
    assert m.total_output_tokens == 72 and m.output_throughput > 0 and m.p50_ttft_ms > 0 and m.p99_itl_ms > 0
    assert stats(base)["max_seqs_in_a_step"] > 1
    after = metrics(base)
    sent = 7  # six timed + one warm-up
    for name in ("llmlab:e2e_request_latency_seconds_count", "llmlab:time_to_first_token_seconds_count",
                 "llmlab:request_queue_time_seconds_count", "llmlab:request_prefill_time_seconds_count",
                 "llmlab:request_decode_time_seconds_count"):
        assert after[name] - before.get(name, 0) == sent, name
    assert after["llmlab:generation_tokens_total"] - before.get("llmlab:generation_tokens_total", 0) == 12 * sent
    assert after["llmlab:inter_token_latency_seconds_count"] - before.get("llmlab:inter_token_latency_seconds_count", 0) == 11 * sent
    assert after["llmlab:num_requests_running"] == 0


def test_prefix_cache_hits_on_a_repeated_prefix(server):
    base, _ = server
    prompt = list(range(100, 150))  # 50 token ids: three full blocks can hit
    body = {"prompt": prompt, "max_tokens": 2, "temperature": 0, "ignore_eos": True}
    before = metrics(base)
    first = post(base, "/v1/completions", body).json()
    second = post(base, "/v1/completions", body).json()
    assert first["timings"]["cache_n"] == 0
    assert second["timings"]["cache_n"] == 48 and second["timings"]["prompt_n"] == 2
    assert second["choices"][0]["text"] == first["choices"][0]["text"]
    after = metrics(base)
    assert after["llmlab:prefix_cache_hits_total"] - before["llmlab:prefix_cache_hits_total"] == 48
    assert after["llmlab:prefix_cache_queries_total"] - before["llmlab:prefix_cache_queries_total"] == 100


def test_disconnect_frees_blocks(server):
    base, _ = server
    body = {"prompt": "class Foo:", "max_tokens": 900, "temperature": 0, "ignore_eos": True, "stream": True}
    with httpx.Client(timeout=60) as c, c.stream("POST", base + "/v1/completions", json=body) as r:
        lines, n = r.iter_lines(), 0
        while n < 3:  # (breaking out of iter_lines would already close the connection)
            n += next(lines).startswith("data: ")
        assert stats(base)["blocks_in_use"] > 0 and stats(base)["running"] == 1
    # leaving the block closed the connection mid-stream, 897 tokens early
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        s = stats(base)
        if s["blocks_in_use"] == 0 and s["running"] == 0:
            break
        time.sleep(0.2)
    assert s["blocks_in_use"] == 0 and s["running"] == 0


@pytest.mark.parametrize("body, status", [
    ({"model": "gpt-4", "prompt": "hi"}, 404),
    ({"prompt": "hi", "max_tokens": 0}, 400),
    ({"prompt": "hi", "max_tokens": KV_BLOCKS * 16}, 400),  # prompt + max_tokens beyond the context
    ({"prompt": [5] * (KV_BLOCKS * 16 + 10), "max_tokens": 1}, 400),  # prompt longer than the context
    ('{"prompt": "hi", ', 400),  # malformed JSON
    ({"prompt": "hi", "temperature": -0.5}, 400),
    ({"prompt": "hi", "max_tokens": "many"}, 422),
    ({"max_tokens": 3}, 422),  # no prompt
])
def test_bad_requests_get_openai_errors(server, body, status):
    base, _ = server
    r = post(base, "/v1/completions", body)
    assert r.status_code == status
    err = r.json()["error"]
    assert err["code"] == status and err["message"]
    assert httpx.get(base + "/health").status_code == 200  # still serving


def test_client_keeps_failed_requests_and_never_writes_the_key(server, monkeypatch):
    base, _ = server
    monkeypatch.setenv("LLMLAB_TEST_KEY", "sk-secret-123")
    payloads = [{"prompt": "x = 1", "max_tokens": 2, "temperature": 0}, {"prompt": "x = 1", "max_tokens": 0}]
    run = asyncio.run(run_load(base + "/v1/completions", payloads, api_key_env="LLMLAB_TEST_KEY"))
    ok, bad = run.records
    assert ok.ok and not bad.ok and bad.status == 400 and bad.error.startswith("HTTP 400")
    assert calculate_metrics(run.records, run.duration_s).error_rate == 0.5
    assert "sk-secret-123" not in repr(run.records)


def test_calculate_metrics_follows_vllm_definitions():
    ms = 1_000_000
    a = RequestRecord(0, send_ns=0, chunk_ns=[100 * ms, 110 * ms, 130 * ms], output_tokens=3, prompt_tokens=5)
    b = RequestRecord(1, send_ns=0, chunk_ns=[200 * ms, 240 * ms], output_tokens=4, prompt_tokens=5)  # usage: 4 tokens in 2 chunks
    c = RequestRecord(2, error="HTTP 500: boom")
    w = RequestRecord(3, warmup=True, send_ns=0, chunk_ns=[9000 * ms], output_tokens=1)
    m = calculate_metrics([a, b, c, w], duration_s=2.0)
    assert (m.completed, m.failed) == (2, 1) and math.isclose(m.error_rate, 1 / 3)
    assert math.isclose(m.mean_ttft_ms, 150) and math.isclose(m.p50_ttft_ms, 150)
    assert math.isclose(m.mean_itl_ms, (10 + 20 + 40) / 3)  # pooled gaps between chunks
    assert math.isclose(m.mean_tpot_ms, ((130 - 100) / 2 + (240 - 200) / 3) / 2)  # (E2EL - TTFT) / (tokens - 1)
    assert math.isclose(m.mean_e2el_ms, (130 + 240) / 2)
    assert m.total_output_tokens == 7 and math.isclose(m.output_throughput, 3.5) and math.isclose(m.request_throughput, 1.0)


def test_a_port_in_use_exits_2_with_one_line(server):
    base, _ = server
    port = base.rsplit(":", 1)[1]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    r = subprocess.run([sys.executable, "-m", "llmlab", "serve", "--device", "cpu", "--port", port], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "cannot listen" in r.stderr and "Traceback" not in r.stderr


def test_serving_lab_endpoint_mode_has_the_in_process_definitions(server):
    """Issue 14: `llmlab serving --endpoint` measures a real server with the same metric definitions as the
    in-process engine: both turn their stamps into RequestRecords and go through one calculate_metrics."""
    import random

    from llmlab.core.models import load
    from llmlab.core.results import LabResult
    from llmlab.labs import serving as S
    from llmlab.serving.engine import Engine, EngineConfig
    from llmlab.serving.scheduler import RequestParams

    base, _ = server
    cfg = S.Config(concurrencies=(1, 2), max_concurrency=2, requests_per_level=1, prompt_len=8, output_len=6, endpoint=base)
    res = LabResult.new(S.LAB, S.VERSION, cfg)
    S.part_endpoint(res, cfg, 4096, random.Random(0))
    ep = res.tables["concurrency"].set_index("concurrency")
    assert list(ep.index) == [1, 2] and (ep.error_rate == 0).all()
    assert (ep.p50_ttft_ms > 0).all() and (ep.p50_itl_ms > 0).all() and (ep.output_tokens_per_s > 0).all()
    eng = Engine(load("tiny", "cpu").model, EngineConfig(num_blocks=64))
    seq = eng.generate([[5, 6, 7, 8]], RequestParams(max_tokens=4, ignore_eos=True))[0]
    rec = S.records([seq])[0]
    assert rec.ttft_s == pytest.approx((seq.token_ns[0] - seq.arrival_ns) / 1e9)  # TTFT: first token - arrival/send
    assert rec.itl_s == pytest.approx([(b - a) / 1e9 for a, b in zip(seq.token_ns, seq.token_ns[1:])])  # noqa: B905
    m = calculate_metrics([rec], 1.0)
    assert m.completed == 1 and m.total_output_tokens == 4 and set(vars(m)) >= {"p50_ttft_ms", "p99_itl_ms", "p50_tpot_ms"}


def test_ctrl_c_shuts_down_cleanly(server):  # last: it stops the module's server
    base, proc = server
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=30) == 0
