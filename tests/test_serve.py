"""`llmlab serve` over real HTTP (a subprocess on 127.0.0.1, a free port) driven by the streaming
client: SSE format and usage, timings against the client's own stamps, /metrics counts, prefix
hits, batching, a disconnect freeing blocks, bad requests, and vLLM's metric definitions.

Then any request: each reliability rule is checked by sending the request to the real server and a
normal request after it (seeds, temperatures, body and prompt sizes, clients that leave, stop
strings, idle gauges, undecodable bodies, options it cannot honour, loose types, n, echo, logprobs
(against log_softmax of HF's forward), the Host / cross-origin / API-key guard), plus in-process
checks of what needs a fault planted or torch.cuda patched (an engine fault, dtype auto, the pool
from a GPU's free memory)."""

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

from llmlab.loadgen.client import RequestRecord, calculate_metrics, run_load, stream_completion

KV_BLOCKS = 64  # a 1024-token context: small enough to send a prompt past it


@pytest.fixture(scope="module")
def server():
    base, proc = start_serve("--max-num-seqs", "8", "--kv-blocks", str(KV_BLOCKS))
    yield base, proc
    stop_serve(proc)


def post(base, path, body, headers=None, **kw):
    return httpx.post(base + path, content=body if isinstance(body, str) else json.dumps(body),
                      headers={"content-type": "application/json", **(headers or {})}, timeout=120, **kw)


def metrics(base, **labels) -> dict:
    """Every series summed over its labels but the histogram buckets' `le`; with labels, only the samples
    carrying them."""
    out = {}
    for fam in text_string_to_metric_families(httpx.get(base + "/metrics").text):
        for s in fam.samples:
            if "le" not in s.labels and labels.items() <= s.labels.items():
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
    r2 = post(
        base, "/v1/completions", {"prompt": "def add(a, b):", "max_tokens": 6, "temperature": 0, "ignore_eos": True}
    )
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
    r = post(
        base,
        "/v1/chat/completions",
        {"messages": msgs, "max_tokens": 3, "temperature": 0, "ignore_eos": True, "stream": True},
    )
    events = sse_events(r.text)
    first = json.loads(events[0])
    assert first["object"] == "chat.completion.chunk" and first["choices"][0]["delta"]["role"] == "assistant"
    assert events[-1] == "[DONE]" and json.loads(events[-2])["choices"][0]["finish_reason"] == "length"


def test_timings_consistent_with_client_stamps(server):
    base, _ = server

    async def go():
        async with httpx.AsyncClient(timeout=120) as c:
            return await stream_completion(
                c,
                base + "/v1/completions",
                {"prompt": "import os\nimport sys\n", "max_tokens": 8, "temperature": 0, "ignore_eos": True},
            )
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
    assert (
        after["llmlab:inter_token_latency_seconds_count"] - before.get("llmlab:inter_token_latency_seconds_count", 0)
        == 11 * sent
    )
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
    ({"prompt": "hi", "max_tokens": "many"}, 400),
    ({"max_tokens": 3}, 400),  # no prompt
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
    # usage: 4 tokens in 2 chunks
    b = RequestRecord(1, send_ns=0, chunk_ns=[200 * ms, 240 * ms], output_tokens=4, prompt_tokens=5)
    c = RequestRecord(2, error="HTTP 500: boom")
    w = RequestRecord(3, warmup=True, send_ns=0, chunk_ns=[9000 * ms], output_tokens=1)
    m = calculate_metrics([a, b, c, w], duration_s=2.0)
    assert (m.completed, m.failed) == (2, 1) and math.isclose(m.error_rate, 1 / 3)
    assert math.isclose(m.mean_ttft_ms, 150) and math.isclose(m.p50_ttft_ms, 150)
    assert math.isclose(m.mean_itl_ms, (10 + 20 + 40) / 3)  # pooled gaps between chunks
    assert math.isclose(m.mean_tpot_ms, ((130 - 100) / 2 + (240 - 200) / 3) / 2)  # (E2EL - TTFT) / (tokens - 1)
    assert math.isclose(m.mean_e2el_ms, (130 + 240) / 2)
    assert (
        m.total_output_tokens == 7
        and math.isclose(m.output_throughput, 3.5)
        and math.isclose(m.request_throughput, 1.0)
    )


def test_a_port_in_use_exits_2_with_one_line(server):
    base, _ = server
    port = base.rsplit(":", 1)[1]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    r = subprocess.run([sys.executable, "-m", "llmlab", "serve", "--device", "cpu", "--port", port], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "cannot listen" in r.stderr and "Traceback" not in r.stderr


def test_serving_lab_endpoint_mode_has_the_in_process_definitions(server):
    """`llmlab serving --endpoint` measures a real server with the same metric definitions as the
    in-process engine: both turn their stamps into RequestRecords and go through one calculate_metrics."""
    import random

    from llmlab.core.models import load
    from llmlab.core.results import LabResult
    from llmlab.labs import serving as S
    from llmlab.serving.engine.llm_engine import Engine, EngineConfig
    from llmlab.serving.engine.scheduler import RequestParams

    base, _ = server
    cfg = S.Config(
        concurrencies=(1, 2), max_concurrency=2, requests_per_level=1, prompt_len=8, output_len=6, endpoint=base
    )
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
    assert (
        m.completed == 1 and m.total_output_tokens == 4 and set(vars(m)) >= {"p50_ttft_ms", "p99_itl_ms", "p50_tpot_ms"}
    )


# ------------------------------------------------------------- any request: a 4xx or its answer, then a normal request


def normal(base, **kw) -> dict:
    """A normal greedy request succeeds (what every reliability test checks after its bad request)."""
    r = post(
        base,
        "/v1/completions",
        {"prompt": "def add(a, b):", "max_tokens": 3, "temperature": 0, "ignore_eos": True},
        **kw,
    )
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == 3
    return r.json()


def wait_idle(base, timeout=30.0) -> dict:
    """/metrics once nothing runs, waits or holds a block (the gauges, as an idle server must show them)."""
    deadline = time.monotonic() + timeout
    while True:
        m = metrics(base)
        idle = (
            m["llmlab:num_requests_running"],
            m["llmlab:num_requests_waiting"],
            m["llmlab:kv_cache_usage_perc"],
        ) == (0, 0, 0)
        if idle or time.monotonic() > deadline:
            return m
        time.sleep(0.1)


@pytest.mark.parametrize("seed, status", [(2**64, 400), (2**63, 400), (-(2**63) - 1, 400), (2**63 - 1, 200), (-5, 200)])
def test_a_seed_out_of_int64_is_400_and_the_engine_lives(server, seed, status):
    base, _ = server
    r = post(base, "/v1/completions", {"prompt": "x = ", "max_tokens": 2, "temperature": 1.0, "seed": seed})
    assert r.status_code == status, r.text
    if status == 400:
        assert r.json()["error"]["param"] == "seed"
    normal(base)
    assert httpx.get(base + "/health").json() == {"status": "ok"}


def test_a_vanishing_temperature_is_greedy_and_the_engine_lives(server):
    base, _ = server
    body = {"prompt": "def add(a, b):", "max_tokens": 5, "ignore_eos": True}
    greedy = post(base, "/v1/completions", {**body, "temperature": 0}).json()["choices"][0]["text"]
    for t in (1e-40, 5e-324, 1e-6):  # below vLLM's 1e-5: greedy (dividing the logits by it overflows)
        r = post(base, "/v1/completions", {**body, "temperature": t})
        assert r.status_code == 200 and r.json()["choices"][0]["text"] == greedy, r.text
    normal(base)
    assert httpx.get(base + "/health").json() == {"status": "ok"}


def test_a_body_over_the_cap_is_413_before_it_is_read(server):
    base, _ = server
    from llmlab.serving.server.protocol import MAX_BODY_BYTES

    big = json.dumps({"prompt": "a" * (MAX_BODY_BYTES + 10), "max_tokens": 1})
    r = post(base, "/v1/completions", big)
    assert (
        r.status_code == 413 and r.json()["error"]["code"] == 413 and r.json()["error"]["type"] == "request_too_large"
    )
    def chunks():  # no Content-Length: the streamed count stops it
        for _ in range(MAX_BODY_BYTES // 65536 + 2):
            yield b" " * 65536
    r = httpx.post(base + "/v1/completions", content=chunks(), headers={"content-type": "application/json"}, timeout=60)
    assert r.status_code == 413
    normal(base)


def test_a_prompt_far_past_the_context_is_refused_before_it_is_tokenized(server):
    base, _ = server
    t0 = time.perf_counter()
    r = post(base, "/v1/completions", {"prompt": "def f(x):\n    return x\n" * 40_000, "max_tokens": 1})  # ~1 MB
    assert r.status_code == 400 and "characters" in r.json()["error"]["message"], r.text
    assert r.json()["error"]["param"] == "prompt"
    r = post(
        base, "/v1/chat/completions", {"messages": [{"role": "user", "content": "word " * 200_000}], "max_tokens": 1}
    )
    assert r.status_code == 400 and "characters" in r.json()["error"]["message"]
    # just past the context in tokens, within the character bound: counted exactly (off the event loop)
    r = post(base, "/v1/completions", {"prompt": " x" * (KV_BLOCKS * 16 + 5), "max_tokens": 1})
    assert r.status_code == 400 and "tokens" in r.json()["error"]["message"]
    normal(base)
    assert time.perf_counter() - t0 < 120


def test_a_non_streamed_request_whose_client_leaves_is_aborted(server):
    base, _ = server
    before = metrics(base, finished_reason="abort").get("llmlab:request_success_total", 0)
    body = {"prompt": "class Foo:", "max_tokens": 900, "temperature": 0, "ignore_eos": True}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(base + "/v1/completions", json=body, timeout=1.0)  # 900 tokens take seconds: the client leaves first
    m = wait_idle(base)
    assert (m["llmlab:num_requests_running"], m["llmlab:kv_cache_usage_perc"]) == (0, 0)
    # not "length": cut short
    assert metrics(base, finished_reason="abort")["llmlab:request_success_total"] == before + 1
    normal(base)


def stream_pieces(base, body) -> tuple[list[str], list]:
    r = post(base, "/v1/completions", {**body, "stream": True})
    chunks = [json.loads(e) for e in sse_events(r.text)[:-1]]
    choices = [c["choices"][0] for c in chunks if c["choices"]]
    return [c["text"] for c in choices], [c["finish_reason"] for c in choices]


def test_a_stop_string_across_tokens_is_trimmed_exactly(server):
    base, _ = server
    body = {"prompt": "class Foo:", "max_tokens": 24, "temperature": 0, "ignore_eos": True}
    pieces, _ = stream_pieces(base, body)
    full = "".join(pieces)
    i = next(i for i in range(1, len(pieces)) if len(pieces[i - 1]) >= 2 and len(pieces[i]) >= 2)  # a token boundary
    stop = pieces[i - 1][-2:] + pieces[i][:2]  # spans it
    want = full[: full.index(stop)]
    n_want = next(k for k in range(1, len(pieces) + 1) if stop in "".join(pieces[:k]))  # the token that completes it
    before = metrics(base)
    r = post(base, "/v1/completions", {**body, "stop": [stop, "\x00never"]}).json()
    assert r["choices"][0]["text"] == want and r["choices"][0]["finish_reason"] == "stop"
    assert r["usage"]["completion_tokens"] == n_want == r["timings"]["predicted_n"]
    got, reasons = stream_pieces(base, {**body, "stop": stop})
    assert "".join(got) == want and reasons[-1] == "stop" and set(reasons[:-1]) <= {None}
    m = wait_idle(base)
    assert m["llmlab:request_success_total"] - before["llmlab:request_success_total"] == 2
    assert metrics(base, finished_reason="stop")["llmlab:request_success_total"] >= 2
    # the tokens the engine made past the stop are not counted: generated == what usage said, twice
    assert m["llmlab:generation_tokens_total"] - before["llmlab:generation_tokens_total"] == 2 * n_want


def test_the_gauges_return_to_zero_once_idle(server):
    base, _ = server
    body = {"prompt": "import os\n", "max_tokens": 300, "temperature": 0, "ignore_eos": True, "stream": True}
    for _ in range(3):  # streams left mid-way, and stop strings
        with httpx.Client(timeout=60) as c, c.stream("POST", base + "/v1/completions", json=body) as r:
            next(r.iter_lines())
    for stop in ("e", "\n", " "):
        post(base, "/v1/completions", {**body, "stream": False, "stop": stop})
    m = wait_idle(base)
    assert (m["llmlab:num_requests_running"], m["llmlab:num_requests_waiting"], m["llmlab:kv_cache_usage_perc"]) == (
        0,
        0,
        0,
    )
    assert stats(base)["blocks_in_use"] == 0
    normal(base)


@pytest.mark.parametrize("raw", [
    '{"prompt": "\\ud800", "max_tokens": 1}',  # a lone surrogate
    '{"messages": [{"role": "user", "content": "a\\udfffb"}]}',
    '{"prompt": ' + "[" * 100_000 + "]" * 100_000 + "}",  # nested past Python's recursion limit
    '{"prompt": "hi", "temperature": NaN}',
    '{"prompt": "hi", "temperature": Infinity}',
    '{"prompt": "hi", "temperature": 1e400}',
    '["not", "an", "object"]',
    '\xff\xfe',
])
def test_undecodable_bodies_are_400_in_openai_shape(server, raw):
    base, _ = server
    path = "/v1/chat/completions" if "messages" in raw else "/v1/completions"
    r = post(base, path, raw)
    assert r.status_code == 400 and r.headers["content-type"] == "application/json", r.text
    assert r.json()["error"]["code"] == 400 and r.json()["error"]["message"]
    normal(base)


def test_unknown_routes_and_methods_are_openai_shaped(server):
    base, _ = server
    for r, status in ((httpx.get(base + "/v1/nothing"), 404), (httpx.put(base + "/v1/completions"), 405),
                      (httpx.get(base + "/v1/completions"), 405)):
        assert r.status_code == status and r.json()["error"]["code"] == status


@pytest.mark.parametrize("path, extra, field", [
    ("/v1/completions", {"logprobs": 1, "echo": True}, "logprobs"),  # the prompt's logprobs
    ("/v1/completions", {"logprobs": 21}, "logprobs"),  # at most 20 alternatives
    ("/v1/completions", {"logprobs": True}, "logprobs"),  # completions' logprobs is a count
    ("/v1/chat/completions", {"top_logprobs": 3}, "top_logprobs"),  # without logprobs: true
    ("/v1/chat/completions", {"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ("/v1/completions", {"best_of": 3}, "best_of"),
    ("/v1/completions", {"logit_bias": {"abc": 1.0}}, "logit_bias"),  # keys are token ids
    ("/v1/completions", {"logit_bias": {"4096": 1.0}}, "logit_bias"),  # of this vocabulary
    ("/v1/completions", {"logit_bias": {"5": 101.0}}, "logit_bias"),  # OpenAI's [-100, 100]
    ("/v1/completions", {"frequency_penalty": 2.5}, "frequency_penalty"),
    ("/v1/chat/completions", {"repetition_penalty": 0}, "repetition_penalty"),
    ("/v1/completions", {"min_tokens": 3}, "min_tokens"),  # more than max_tokens
    ("/v1/completions", {"stop_token_ids": [5000]}, "stop_token_ids"),
    ("/v1/completions", {"suffix": "end"}, "suffix"),
    ("/v1/chat/completions", {"echo": True}, "echo"),  # echo is a completions option
    ("/v1/chat/completions", {"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
    ("/v1/completions", {"frobnicate": 1}, "frobnicate"),  # not an OpenAI option at all
])
def test_options_it_cannot_honour_and_values_it_cannot_take_are_400_naming_the_field(server, path, extra, field):
    base, _ = server
    body = {
        "max_tokens": 2,
        **({"messages": [{"role": "user", "content": "hi"}]} if "chat" in path else {"prompt": "hi"}),
    }
    r = post(base, path, {**body, **extra})
    assert r.status_code == 400 and r.json()["error"]["param"] == field and field in r.json()["error"]["message"], (
        r.text
    )
    normal(base)


def test_no_op_values_of_those_options_are_served(server):
    base, _ = server
    noop = {
        "n": 1,
        "logprobs": None,
        "best_of": 1,
        "frequency_penalty": 0,
        "presence_penalty": 0.0,
        "logit_bias": {},
        "user": "u1",
    }
    r = post(base, "/v1/completions", {"prompt": "hi", "max_tokens": 2, **noop})
    assert r.status_code == 200, r.text
    r = post(base, "/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
                                            "max_tokens": 2, "logprobs": False, "top_logprobs": 0, "n": 1})
    assert r.status_code == 200, r.text


@pytest.fixture(scope="module")
def tiny_hf():
    from llmlab.core.models import load

    loaded = load("tiny", "cpu")
    return loaded.model, loaded.tokenizer


def hf_logprobs(model, ids: list[int], n_prompt: int):
    """log_softmax of HF's own forward at each output position: (outputs, V)."""
    import torch

    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([ids])).logits[0].float()
    return logits.log_softmax(-1)[n_prompt - 1 : len(ids) - 1]


@pytest.mark.parametrize("sampling", [{"temperature": 0}, {"temperature": 1.5, "top_k": 8, "seed": 3}])
def test_completion_logprobs_are_log_softmax_of_hfs_forward(server, tiny_hf, sampling):
    """Raw logprobs (whatever the sampling settings), the top k in order with the sampled token beside them,
    offsets into the text, and the same numbers streamed token by token."""
    base, _ = server
    model, tok = tiny_hf
    body = {"prompt": "def add(a, b):", "max_tokens": 6, "ignore_eos": True, "logprobs": 3, **sampling}
    choice = post(base, "/v1/completions", body).json()["choices"][0]
    lp = choice["logprobs"]
    prompt = post(base, "/tokenize", {"prompt": body["prompt"]}).json()["tokens"]
    as_ids = post(base, "/v1/completions", {**body, "return_tokens_as_token_ids": True}).json()["choices"][0]
    out = [int(t.removeprefix("token_id:")) for t in as_ids["logprobs"]["tokens"]]  # the ids, not a re-tokenizing
    assert as_ids["text"] == choice["text"] == tok.decode(out) and [tok.decode([t]) for t in out] == lp["tokens"]
    ref = hf_logprobs(model, prompt + out, len(prompt))
    assert lp["token_logprobs"] == pytest.approx([float(ref[i, t]) for i, t in enumerate(out)], abs=1e-4)
    for i, (t, top) in enumerate(zip(out, lp["top_logprobs"], strict=True)):
        # the 3 most likely (by value: robust to near-ties) and the sampled token beside them
        assert sorted(top.values(), reverse=True)[:3] == pytest.approx(ref[i].topk(3).values.tolist(), abs=1e-4)
        assert top[tok.decode([t])] == pytest.approx(float(ref[i, t]), abs=1e-4) and len(top) <= 4
    assert lp["text_offset"] == [sum(map(len, lp["tokens"][:i])) for i in range(6)]
    r = post(base, "/v1/completions", {**body, "stream": True})
    streamed = [c["choices"][0]["logprobs"] for c in map(json.loads, sse_events(r.text)[:-1]) if c["choices"]]
    joined = {k: [x for s in streamed for x in s[k]] for k in lp}
    assert joined == lp
    normal(base)


def test_chat_logprobs_and_top_logprobs(server, tiny_hf):
    base, _ = server
    model, tok = tiny_hf
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "temperature": 0, "ignore_eos": True,
            "logprobs": True, "top_logprobs": 2}
    choice = post(base, "/v1/chat/completions", body).json()["choices"][0]
    content = choice["logprobs"]["content"]
    assert "".join(c["token"] for c in content) == choice["message"]["content"] and len(content) == 4
    for c in content:
        assert c["bytes"] == list(c["token"].encode()) and len(c["top_logprobs"]) == 2
        assert c["top_logprobs"][0]["token"] == c["token"]  # greedy: the sampled token is the most likely
        assert c["top_logprobs"][0]["logprob"] == pytest.approx(c["logprob"], abs=1e-6)
        assert c["top_logprobs"][0]["logprob"] >= c["top_logprobs"][1]["logprob"]
    alone = post(base, "/v1/chat/completions", {**body, "top_logprobs": 0}).json()["choices"][0]["logprobs"]
    assert [c["top_logprobs"] for c in alone["content"]] == [[]] * 4
    assert post(base, "/v1/chat/completions", {**body, "logprobs": False, "top_logprobs": 0}).json()["choices"][0][
        "logprobs"] is None
    normal(base)


def test_logit_bias_penalties_min_tokens_and_stop_token_ids_are_served(server):
    """Each option reaches the engine (whose tests hold them to their definitions): a +100 bias makes every token
    the biased one, a stop token id ends the text before itself, min_tokens holds back an EOS biased to win, and
    the penalties change a greedy text that repeats itself."""
    base, _ = server
    body = {"prompt": "class Foo:", "max_tokens": 12, "temperature": 0, "logprobs": 0,
            "return_tokens_as_token_ids": True}

    def run(**extra):
        c = post(base, "/v1/completions", {**body, **extra}).json()["choices"][0]
        return c["text"], [int(t.removeprefix("token_id:")) for t in c["logprobs"]["tokens"]], c["finish_reason"]

    text, ids, _ = run(ignore_eos=True)
    assert run(logit_bias={"42": 100}, ignore_eos=True)[1] == [42] * 12
    stop = ids[3]
    cut = ids.index(stop)
    got_text, got, reason = run(stop_token_ids=[stop], ignore_eos=True)
    assert got == ids[: cut + 1] and reason == "stop"
    assert got_text == post(base, "/detokenize", {"tokens": ids[:cut]}).json()["prompt"]
    eos = 0  # tiny's
    assert run(logit_bias={str(eos): 100}, min_tokens=5)[1:] == (run(ignore_eos=True, max_tokens=5)[1] + [eos], "stop")
    for penalty in ({"frequency_penalty": 2.0}, {"presence_penalty": 2.0}, {"repetition_penalty": 2.0}):
        assert run(ignore_eos=True, **penalty)[0] != text, penalty
    normal(base)


def test_n_choices_are_n_sequences_choice_i_sampled_with_seed_plus_i(server):
    base, _ = server
    body = {"prompt": "def add(a, b):", "max_tokens": 6, "temperature": 1.0, "ignore_eos": True}
    alone = [post(base, "/v1/completions", {**body, "seed": 7 + i}).json()["choices"][0]["text"] for i in range(3)]
    r = post(base, "/v1/completions", {**body, "seed": 7, "n": 3}).json()
    assert [c["index"] for c in r["choices"]] == [0, 1, 2] and [c["text"] for c in r["choices"]] == alone
    assert (
        r["usage"]["completion_tokens"] == 18
        and r["usage"]["prompt_tokens"] == post(base, "/tokenize", {"prompt": body["prompt"]}).json()["count"]
    )
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "temperature": 1.0, "seed": 7, "n": 2,
            "ignore_eos": True}
    s = post(base, "/v1/chat/completions", {**chat, "stream": True, "stream_options": {"include_usage": True}})
    chunks = [json.loads(e) for e in sse_events(s.text)[:-1]]
    text, reasons, roles = {0: "", 1: ""}, {0: [], 1: []}, {0: [], 1: []}
    for c in chunks:
        for ch in c["choices"]:
            text[ch["index"]] += ch["delta"].get("content", "")
            reasons[ch["index"]].append(ch["finish_reason"])
            roles[ch["index"]].append(ch["delta"].get("role"))
    assert (
        all(reasons[i][-1] == "length" and roles[i][0] == "assistant" for i in (0, 1))
        and chunks[-1]["usage"]["completion_tokens"] == 8
    )
    whole = post(base, "/v1/chat/completions", chat).json()  # the same request, not streamed
    assert [c["message"]["content"] for c in whole["choices"]] == [text[0], text[1]]
    assert wait_idle(base)["llmlab:num_requests_running"] == 0


def test_n_sequences_share_the_prompts_blocks(server):
    """Choices 1..n-1 start once choice 0's prompt is computed: its full blocks are prefix-cache hits for them."""
    base, _ = server
    prompt = list(range(300, 340))  # 40 ids no other test sends: two full blocks
    body = {"prompt": prompt, "max_tokens": 3, "temperature": 1.0, "seed": 5, "ignore_eos": True, "n": 3}
    before = metrics(base)
    r = post(base, "/v1/completions", body).json()
    after = metrics(base)
    assert after["llmlab:prefix_cache_hits_total"] - before["llmlab:prefix_cache_hits_total"] == 2 * 32
    assert after["llmlab:prefix_cache_queries_total"] - before["llmlab:prefix_cache_queries_total"] == 3 * 40
    alone = post(base, "/v1/completions", {**body, "n": 1, "seed": 7}).json()["choices"][0]["text"]
    assert r["choices"][2]["text"] == alone and r["usage"]["completion_tokens"] == 9
    assert wait_idle(base)["llmlab:num_requests_running"] == 0


def test_echo_returns_the_prompt_before_the_completion(server):
    base, _ = server
    body = {"prompt": "def add(a, b):", "max_tokens": 4, "temperature": 0, "ignore_eos": True}
    plain = post(base, "/v1/completions", body).json()["choices"][0]["text"]
    echoed = post(base, "/v1/completions", {**body, "echo": True}).json()
    assert echoed["choices"][0]["text"] == body["prompt"] + plain and echoed["usage"]["completion_tokens"] == 4
    got, _ = stream_pieces(base, {**body, "echo": True})
    assert "".join(got) == body["prompt"] + plain


@pytest.mark.parametrize(
    "extra, field",
    [
        ({"max_tokens": "5"}, "max_tokens"),
        ({"max_tokens": True}, "max_tokens"),
        ({"max_tokens": 5.0}, "max_tokens"),
        ({"stream": "yes"}, "stream"),
        ({"stream": 1}, "stream"),
        ({"temperature": "0.5"}, "temperature"),
        ({"temperature": 2.5}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"seed": 1.5}, "seed"),
        ({"stop": [1]}, "stop"),
        ({"prompt": [1, True]}, "prompt"),
        ({"ignore_eos": "true"}, "ignore_eos"),
        ({"stream_options": {"include_usage": 1}}, "stream_options"),
    ],
)
def test_loose_types_and_out_of_range_values_are_400(server, extra, field):
    base, _ = server
    r = post(base, "/v1/completions", {"prompt": "hi", "max_tokens": 2, **extra})
    err = r.json()["error"]
    assert r.status_code == 400 and err["param"] == field and field in err["message"], r.text
    if field == "temperature" and extra[field] == 2.5:
        assert "2" in err["message"]  # OpenAI's range, said
    normal(base)


def test_metrics_carry_the_model_name_label(server):
    base, _ = server
    normal(base)
    samples = [s for f in text_string_to_metric_families(httpx.get(base + "/metrics").text) for s in f.samples]
    assert samples and all(s.labels.get("model_name") == "tiny" for s in samples)
    assert metrics(base, model_name="tiny")["llmlab:e2e_request_latency_seconds_count"] >= 1


@pytest.mark.parametrize("headers, status", [
    ({"host": "attacker.example"}, 400),  # DNS rebinding: the page's own host name
    ({"host": "attacker.example:8000"}, 400),
    ({"origin": "http://attacker.example", "content-type": "text/plain"}, 403),  # a simple request: no preflight
    ({"origin": "null"}, 403),
    ({"sec-fetch-site": "cross-site"}, 403),
    ({"host": "localhost"}, 200),
])
def test_host_header_and_cross_origin_posts_are_checked(server, headers, status):
    base, _ = server
    body = json.dumps({"prompt": "hi", "max_tokens": 1})
    r = httpx.post(
        base + "/v1/completions", content=body, headers={"content-type": "application/json", **headers}, timeout=60
    )
    assert r.status_code == status, r.text
    if status != 200:
        assert r.json()["error"]["code"] == status
    same = {"origin": base}  # a page the server itself served may post
    assert (
        httpx.post(
            base + "/v1/completions", content=body, headers={"content-type": "application/json", **same}
        ).status_code
        == 200
    )


def test_an_api_key_guards_every_route_but_health_and_is_never_printed(monkeypatch):
    key = "sk-llmlab-test-" + os.urandom(8).hex()
    monkeypatch.setenv("LLMLAB_API_KEY", key)
    base, proc = start_serve("--kv-blocks", "32")
    try:
        assert httpx.get(base + "/health").status_code == 200
        for path in ("/v1/models", "/metrics", "/v1/engine/stats"):
            r = httpx.get(base + path)
            assert r.status_code == 401 and r.json()["error"]["code"] == 401, path
        body = {"prompt": "hi", "max_tokens": 1}
        for auth in (None, "Bearer wrong", key, "Basic " + key):
            r = httpx.post(base + "/v1/completions", json=body, headers={"authorization": auth} if auth else {})
            assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
        normal(base, headers={"authorization": f"Bearer {key}"})
    finally:
        stop_serve(proc)
        proc.log.seek(0)
        log = proc.log.read()
    assert "API key required" in log and key not in log


def test_serve_rejects_a_bad_dtype_and_a_missing_gpu_with_one_line(cli):
    from conftest import free_port

    for args, words in ((["--dtype", "float8"], "unknown dtype"), (["--gpu", "3"], "not available")):
        r = cli("serve", "--device", "auto", "--port", str(free_port()), *args)
        assert r.returncode == 2 and words in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_serve_help_names_the_key_variable_never_its_value(cli):
    r = cli("serve", "--help", columns=200, env={"LLMLAB_API_KEY": "sk-never-shown-123"})
    assert r.returncode == 0 and "LLMLAB_API_KEY" in r.stdout and "sk-never-shown-123" not in r.stdout + r.stderr


def test_dtype_auto_is_bf16_on_a_gpu_and_fp32_on_the_cpu(monkeypatch):
    import torch

    from llmlab.serving.server import launch

    assert launch.resolve_dtype("auto", "cpu") == "float32" and launch.resolve_dtype("bfloat16", "cpu") == "bfloat16"
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    assert launch.resolve_dtype("auto", "cuda") == "bfloat16"
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    assert launch.resolve_dtype("auto", "cuda") == "float16"


def test_the_pool_on_cuda_is_what_the_served_gpus_free_memory_holds(monkeypatch):
    import math
    import types

    import torch

    from llmlab.core.device import Device
    from llmlab.core.errors import UsageError
    from llmlab.core.models import load
    from llmlab.serving.engine.llm_engine import kv_bytes_per_block, step_reserve_bytes
    from llmlab.serving.server import launch

    model = load("tiny", "cpu").model
    gib, asked = 2**30, []
    free = [8 * gib]
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda i=None: asked.append(i) or (free[0], 16 * gib))
    monkeypatch.setattr(
        torch.cuda,
        "get_device_properties",
        lambda i=None: asked.append(i) or types.SimpleNamespace(total_memory=16 * gib),
    )
    dev = Device("cuda:1")
    n = launch.size_pool(model, dev, None, 16, 0.9, 64, 512)
    assert set(asked) == {1}  # the GPU it serves on, not cuda:0
    ctx = model.config.max_position_embeddings
    budget = 0.9 * 16 * gib - (16 * gib - 8 * gib) - step_reserve_bytes(model, 64, 512, ctx)  # vLLM's rule
    assert n == math.floor(budget / kv_bytes_per_block(model, 16)) > 0
    assert launch.size_pool(model, dev, 77, 16, 0.9, 64, 512) == 77  # --kv-blocks wins
    assert launch.size_pool(model, Device("cpu"), None, 16, 0.9, 64, 512) == launch.CPU_KV_BLOCKS
    free[0] = 1 * gib  # 0.9 x 16 GiB already taken by others and the weights: no room
    with pytest.raises(UsageError, match="cuda:1"):
        launch.size_pool(model, dev, None, 16, 0.9, 64, 512)


def test_an_engine_fault_fails_its_batch_alone_and_the_engine_goes_on():
    """A step that raises (a sampling error, a bug) fails the requests in that step's batch (and a choice waiting
    for a failed one's prompt), is counted, and later requests are served; every torch call runs on the one thread
    the server hands the engine."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    from llmlab.core.models import load
    from llmlab.inference.sampling import NoTokenError
    from llmlab.serving.engine.llm_engine import Engine, EngineConfig
    from llmlab.serving.engine.scheduler import RequestParams
    from llmlab.serving.server.async_engine import AsyncEngine, Fault, Handle
    from llmlab.serving.server.metrics import Metrics

    pool = ThreadPoolExecutor(1)
    torch_thread = pool.submit(threading.get_ident).result()
    engine = Engine(load("tiny", "cpu").model, EngineConfig(num_blocks=32))
    threads, real_sample, fail_next = set(), engine.sample, [True]

    def sample(logits, seqs):  # after the step has scheduled and run its batch, as a sampling error happens
        threads.add(threading.get_ident())
        if fail_next[0]:
            fail_next[0] = False
            raise NoTokenError("row 0 has no token to sample")
        return real_sample(logits, seqs)

    engine.sample = sample
    aeng = AsyncEngine(engine, Metrics("tiny"), pool)

    async def drain(h):
        out = []
        while (ev := await h.events.get()) is not None and not isinstance(ev, Fault):
            out.append(ev)
        aeng.close(h, "abort" if isinstance(ev, Fault) else h.seq.finish_reason, len(out))
        return ev, out

    async def one(prompt, followers=0):
        new = lambda: Handle(prompt, RequestParams(max_tokens=3, ignore_eos=True), 0, 0, asyncio.get_running_loop())  # noqa: E731
        h = new()
        h.followers = [new() for _ in range(followers)]
        aeng.submit(h)
        return await asyncio.gather(*map(drain, [h, *h.followers]))

    async def go():
        first = await one([5, 6, 7], followers=1)
        return first, (await one([8, 9, 10]))[0]

    aeng.start()
    try:
        ((ev1, _), (ev_follower, _)), (ev2, out2) = asyncio.run(go())
    finally:
        aeng.shutdown()
        pool.shutdown()
    assert isinstance(ev1, Fault) and "NoTokenError" in ev1.message and ev_follower == ev1
    assert ev2 is None and len(out2) == 3  # the next request is served
    assert aeng.num_faults == 1 and "NoTokenError" in aeng.last_fault and threads == {torch_thread}
    assert engine.blocks.num_used == 0 and not engine.has_work()


def test_ctrl_c_shuts_down_cleanly(server):  # last: it stops the module's server
    base, proc = server
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=30) == 0
