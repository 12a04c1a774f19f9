"""`llmlab ttft --endpoint URL` against a real `llmlab serve` subprocess over real HTTP (no mocks):
the waterfall joined from the server's timings, exact prompt lengths through /tokenize, the same
phases from /metrics deltas, the fit, the prefix probe, the load metrics, the key never written,
bad input (exit 2), every request failing (exit 3, still saved) and Ctrl-C (exit 130, saved)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest
from conftest import ROOT, free_port, start_serve, stop_serve
from prometheus_client.parser import text_string_to_metric_families

from llmlab.core.results import LabResult
from llmlab.labs.ttft_breakdown import endpoint as E
from llmlab.loadgen import probe

SECRET = "sk-test-never-written-0123456789"


@pytest.fixture(scope="module")
def server():
    base, proc = start_serve("--max-num-seqs", "8", "--kv-blocks", "64")
    yield base
    stop_serve(proc)


def ttft(*args: str, env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "80", "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.run([sys.executable, "-m", "llmlab", "ttft", *args], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=ROOT)


@pytest.fixture(scope="module")
def run(server, tmp_path_factory):
    out = tmp_path_factory.mktemp("endpoint")
    p = ttft("--endpoint", server, "--quick", "--prompt-len", "256", "--num-requests", "8", "--out", str(out),
             env={"OPENAI_API_KEY": SECRET})
    return p, out


def saved(out) -> LabResult:
    return LabResult.from_json(next((out / "ttft-breakdown").glob("*.json")).read_text())


def rows(res: LabResult, table: str) -> list[dict]:
    return res.tables[table].to_dict("records")


def test_endpoint_run_end_to_end(run):
    p, out = run
    assert p.returncode == 0, p.stderr[-3000:]
    res = saved(out)
    req = rows(res, "endpoint_requests")
    assert req and all(r["error"] is None for r in req)
    # exact prompt lengths through /tokenize: the server counted exactly what was asked
    sweep = [r for r in req if r["scenario"].startswith("prompt ")]
    assert sweep and all(r["prompt_tokens"] == r["target_tokens"] for r in sweep)
    assert res.env["server"]["tokenize"] == "vllm" and res.env["server"]["timings"] == "yes"
    # the waterfall: the server's phases fit inside the client's TTFT, and the parts add up to it
    for r in req:
        assert r["phases_from"] == "timings"
        assert r["prefill_ms"] <= r["ttft_ms"] and r["client_net_ms"] >= 0
        assert abs(r["client_net_ms"] + r["queue_ms"] + r["prefill_ms"] - r["ttft_ms"]) < 1e-6
    # the fit and the prefix probe
    fit = rows(res, "endpoint_fit")[0]
    assert fit["points"] >= 3 and fit["tok_per_s"] > 0 and fit["server_tok_per_s"] > 0
    probe_rows = rows(res, "prefix_probe")
    assert len(probe_rows) == 2
    for r in probe_rows:
        assert r["first_cached"] == 0 and r["second_cached"] >= 0.9 * r["prompt_tokens"] - 16
        assert r["second_ttft_ms"] < r["first_ttft_ms"]
    # load: vLLM's metrics, every request counted
    load = rows(res, "endpoint_load")[0]
    assert load["completed"] == 8 and load["failed"] == 0 and load["total_output_tokens"] == 8 * 8
    assert [r["metric"] for r in rows(res, "endpoint_latency")] == ["TTFT", "TPOT", "ITL", "E2EL"]
    holds = {c.id: c.holds for c in res.claims}
    assert {"ttft_breakdown.endpoint_no_failed_requests", "ttft_breakdown.endpoint_prefix_reuse"} <= set(holds)
    assert holds["ttft_breakdown.endpoint_phases_within_ttft"] is True


def test_the_key_is_never_written(run):
    p, out = run
    written = [p.stdout, p.stderr] + [f.read_text() for f in out.rglob("*") if f.is_file()]
    assert not any(SECRET in w for w in written)


def test_the_report_reads_in_80_columns(run):
    p, _ = run
    lines = p.stdout.splitlines()
    assert len(lines) <= 120 and max(map(len, lines)) <= 80
    assert "Where TTFT goes at this endpoint" in p.stdout and "What this run found" in p.stdout


def test_metrics_deltas_give_the_same_phases_as_timings(server):
    """The /metrics path (vLLM-style histograms around a request run alone) against the request's own timings."""
    srv = probe.discover(server, "tiny", None)
    assert srv.metrics_prefix == "llmlab"

    async def go():
        async with httpx.AsyncClient(timeout=60) as c:
            prompts = probe.Prompts(srv, probe.corpus_text(4000), probe.run_tag(0))
            return await probe.alone(c, srv, await prompts.make(c, 200), 4, 0, 60.0)

    rec, delta = asyncio.run(go())
    assert rec.ok and delta is not None
    assert delta["queue_ms"] == pytest.approx(rec.timings["queue_ms"], abs=0.01)
    assert delta["prefill_ms"] == pytest.approx(rec.timings["prompt_ms"], abs=0.01)
    assert delta["prefix_cache_queries"] == 200
    row = probe.waterfall(dataclasses.replace(rec, timings=None), delta)  # no timings: the deltas stand in
    assert row["phases_from"] == "/metrics" and row["prefill_ms"] == pytest.approx(delta["prefill_ms"])
    assert probe.waterfall(dataclasses.replace(rec, timings=None))["phases_from"] == "not reported"


def test_text_prompts_are_calibrated_from_usage_without_tokenize(server):
    srv = probe.discover(server, "tiny", None)
    srv.tokenize = ""  # as a server without /tokenize: text prompts, counts from usage

    async def go():
        async with httpx.AsyncClient(timeout=60) as c:
            prompts = probe.Prompts(srv, probe.corpus_text(8000), probe.run_tag(0))
            counts = []
            for _ in range(3):
                p = await prompts.make(c, 300)
                rec, _ = await probe.alone(c, srv, p, 1, 0, 60.0)
                prompts.calibrate(p, rec)
                counts.append(rec.prompt_tokens)
            return counts

    counts = asyncio.run(go())
    assert abs(counts[-1] - 300) <= 0.05 * 300, counts


def test_fit_and_judge_can_fail():
    res = LabResult.new("ttft-breakdown", 2, {})
    res.config["endpoint"] = "http://x"
    rows = [{"scenario": f"prompt {n}", "target_tokens": n, "prompt_tokens": n, "ttft_ms": 10 + 0.5 * n,
             "prefill_ms": 0.2 * n, "prompt_n": n, "error": None} for n in (16, 64, 256, 1024)]
    import pandas as pd

    srows, fit = E.sweep_rows(pd.DataFrame(rows))
    assert fit["tok_per_s"] == pytest.approx(2000) and fit["worst_rel_err"] < 1e-9
    assert fit["server_tok_per_s"] == pytest.approx(5000)
    bent_rows = [{**r, "ttft_ms": 10 + 0.5 * r["prompt_tokens"] + 1e-3 * r["prompt_tokens"] ** 2} for r in rows]
    _, bent = E.sweep_rows(pd.DataFrame(bent_rows))
    res.add_table("endpoint_fit", [bent])  # attention's T^2: a line no longer fits
    assert {x.id: x.holds for x in E.judge(res)}["ttft_breakdown.endpoint_ttft_linear_in_prompt"] is False
    res.add_table("endpoint_fit", [fit])
    res.add_table("endpoint_requests", [{**r, "client_net_ms": r["ttft_ms"] - r["prefill_ms"]} for r in rows])
    res.add_table("prefix_probe", [{"prompt_tokens": 1000, "drop": 0.05, "second_cached": 0, "error": None}])
    c = {x.id: x.holds for x in E.judge(res)}
    assert c["ttft_breakdown.endpoint_ttft_linear_in_prompt"] is True
    assert c["ttft_breakdown.endpoint_slope_is_prefill"] is False  # 2.5x the server's slope: something besides prefill
    assert c["ttft_breakdown.endpoint_prefix_reuse"] is False
    assert c["ttft_breakdown.endpoint_phases_within_ttft"] is True
    res.add_table("endpoint_requests", [{**rows[0], "client_net_ms": -3.0, "error": None},
                                        {**rows[1], "client_net_ms": 1.0, "error": "HTTP 500: x"}])
    c = {x.id: x.holds for x in E.judge(res)}
    assert c["ttft_breakdown.endpoint_phases_within_ttft"] is False
    assert c["ttft_breakdown.endpoint_no_failed_requests"] is False


class _NoStream(BaseHTTPRequestHandler):
    """A real HTTP server that lists a model but answers completions with plain JSON, never SSE."""

    def _send(self, body: dict):
        raw = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def do_GET(self):  # noqa: N802
        self._send({"object": "list", "data": [{"id": "m", "object": "model"}]})

    def do_POST(self):  # noqa: N802
        self.rfile.read(int(self.headers.get("content-length", 0)))
        self._send({"choices": [{"text": "hi", "index": 0}], "usage": {"prompt_tokens": 1, "completion_tokens": 1}})

    def log_message(self, *a):
        pass


@pytest.fixture
def non_streaming():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _NoStream)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


@pytest.mark.parametrize("args, says", [
    (["--endpoint", "http://127.0.0.1:PORT"], "not reachable"),
    (["--endpoint", "http://127.0.0.1:PORT", "--concurrency", "0"], "--concurrency"),  # the flags are checked first
])
def test_bad_input_exits_2_with_one_line(args, says, tmp_path, cli):
    args = [a.replace("PORT", str(free_port())) for a in args]
    r = cli("ttft", *args, "--out", str(tmp_path), columns=200)
    code, err = r.returncode, r.stderr
    lines = [x for x in err.splitlines() if x.strip()]
    assert code == 2 and len(lines) == 1 and says in lines[0] and "Traceback" not in err, err


@pytest.mark.parametrize("kw, says", [(dict(endpoint="ftp://127.0.0.1:1"), "http(s) URL"),
                                      (dict(concurrency=0), "--concurrency"),
                                      (dict(request_rate=-1.0), "--request-rate"),
                                      (dict(burstiness=0.0), "--burstiness"),
                                      (dict(request_timeout=0.0), "--request-timeout")])
def test_bad_options_are_value_errors_naming_the_flag(kw, says):
    """run_lab turns a Config ValueError into one line and exit 2 (tests/test_cli.py checks that path)."""
    from llmlab.labs.ttft_breakdown import Config

    with pytest.raises(ValueError, match=says.replace("(", r"\(").replace(")", r"\)")):
        Config(**{"endpoint": "http://127.0.0.1:1", **kw})


def test_a_server_that_does_not_stream_exits_2(non_streaming, tmp_path, cli):
    r = cli("ttft", "--endpoint", non_streaming, "--out", str(tmp_path), columns=200)
    code, err = r.returncode, r.stderr
    lines = [x for x in err.splitlines() if x.strip()]
    assert code == 2 and len(lines) == 1 and "does not stream" in lines[0], err


def test_every_request_failing_exits_3_and_still_saves(server, tmp_path):
    p = ttft("--endpoint", server, "--quick", "--prompt-len", "64", "--num-requests", "2", "--request-timeout", "0.001",
             "--out", str(tmp_path))
    assert p.returncode == 3, (p.returncode, p.stderr[-6000:])
    assert "every request" in p.stderr and "Traceback" not in p.stderr
    req = rows(saved(tmp_path), "endpoint_requests")
    assert req and all("timeout" in r["error"] for r in req)


def _finished(server: str) -> float:
    """Requests the server has finished, from its /metrics."""
    families = text_string_to_metric_families(httpx.get(server + "/metrics").text)
    return sum(s.value for f in families for s in f.samples if s.name == "llmlab:e2e_request_latency_seconds_count")


def test_ctrl_c_keeps_what_was_measured(server, tmp_path):
    env = {**os.environ, "COLUMNS": "80", "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    before = _finished(server)
    proc = subprocess.Popen([sys.executable, "-m", "llmlab", "ttft", "--endpoint", server, "--quick",
                             "--prompt-len", "64", "--num-requests", "2000", "--concurrency", "1",
                             "--out", str(tmp_path)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # even under `make test &`
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:  # until the load part has finished a few requests
        done = _finished(server)
        if done >= before + 17 + 3:  # 2 warm-up, 3 alone, 4 lengths x 2, 2 probe pairs; then 3 of the load
            break
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err[-2000:]
    res = saved(tmp_path)
    req = rows(res, "endpoint_requests")
    assert res.interrupted and any(r["scenario"] == "load" for r in req)  # the load's finished requests were kept
    assert all(r["error"] is None for r in req if r["scenario"] != "load")


def test_client_net_is_what_the_server_does_not_report():
    from llmlab.loadgen.client import RequestRecord

    rec = RequestRecord(0, send_ns=0, chunk_ns=[50_000_000, 60_000_000],
                        timings={"queue_ms": 5.0, "prompt_ms": 30.0, "cache_n": 0})
    w = probe.waterfall(rec)
    assert w["ttft_ms"] == 50.0 and w["client_net_ms"] == 15.0 and w["first_decode_ms"] == 10.0
    assert w["phases_from"] == "timings"
    # llama.cpp: no queue
    llama = RequestRecord(0, send_ns=0, chunk_ns=[50_000_000], timings={"prompt_ms": 30.0, "cache_n": 7})
    w = probe.waterfall(llama)
    assert w["queue_ms"] is None and w["client_net_ms"] == 20.0 and w["cache_n"] == 7 and w["first_decode_ms"] is None


def test_the_key_goes_only_into_the_header(monkeypatch):
    monkeypatch.setenv("MY_KEY", SECRET)
    srv = probe.Server("http://x", "m", None, "", "", False, False, headers={"Authorization": f"Bearer {SECRET}"})
    assert SECRET not in json.dumps(srv.card()) and SECRET not in repr(srv)


def test_ttft_help_teaches_the_endpoint_options(cli):
    r = cli("ttft", "--help", columns=200)
    code, out = r.returncode, r.stdout
    assert code == 0
    for opt in ("--endpoint", "--concurrency", "--request-rate", "--burstiness", "--api-key-env", "--request-timeout",
                "--tokenizer"):
        assert opt in out



def test_the_endpoint_is_asked_once_per_run(monkeypatch):
    """check() asks the server what it is before the run and returns the Config with the answer; run() measures
    that server instead of asking again, and the answer (it holds the API key's header) is never saved."""
    from types import SimpleNamespace

    from llmlab.labs import ttft_breakdown
    from llmlab.loadgen import probe

    class Stop(Exception):
        pass

    def card():
        raise Stop  # the first thing the run does with the server: far enough to see which one it used

    asked = []
    monkeypatch.setattr(probe, "discover", lambda *key: asked.append(key) or SimpleNamespace(card=card))
    cfg = ttft_breakdown.Config(endpoint="http://127.0.0.1:1")
    found = ttft_breakdown.check(cfg)
    assert found.endpoint_found is not None and found == cfg  # the same options, with what check() found
    assert "endpoint_found" not in found.saved() and "endpoint_found" not in repr(found)
    with pytest.raises(Stop):
        ttft_breakdown.run(found, None, None)
    assert asked == [("http://127.0.0.1:1", cfg.model, cfg.api_key_env)]
    with pytest.raises(Stop):  # a run without check() first still asks
        ttft_breakdown.run(cfg, None, None)
    assert len(asked) == 2
