"""ttft-breakdown: BM25 against its formula, queueing against Lindley / M/D/1, the streaming loop
against HF generate, metric definitions on known stamps, the lab end to end and its bad inputs."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

from llmlab.core.device import resolve_device
from llmlab.core.results import LabResult
from llmlab.inference import retrieval, serving
from llmlab.inference.serving import Request, Trace
from llmlab.labs import ttft_breakdown as lab

CPU = resolve_device("cpu")


# ---------------------------------------------------------------- BM25


def _bm25_brute(docs, query, k1=1.5, b=0.75):
    toks = [retrieval.words(d) for d in docs]
    avgdl = sum(map(len, toks)) / len(toks)
    out = []
    for t in toks:
        s = 0.0
        for term in set(retrieval.words(query)):
            df = sum(term in d for d in toks)
            idf = math.log(1 + (len(docs) - df + 0.5) / (df + 0.5))
            tf = t.count(term)
            s += idf * tf * (k1 + 1) / (tf + k1 * (1 - b + b * len(t) / avgdl))
        out.append(s)
    return out


def test_bm25_matches_the_formula():
    docs = ["the cat sat on the mat", "a dog and a cat", "dogs bark", "mat mat mat cat", "nothing here at all"]
    index = retrieval.BM25(docs)
    for q in ("cat mat", "dog", "the cat", "zebra"):
        want = _bm25_brute(docs, q)
        got = index.scores(q)
        for i, w in enumerate(want):
            assert got.get(i, 0.0) == pytest.approx(w, abs=1e-12)
    assert index.search("zebra") == []
    assert index.search("mat")[0][0] == 3  # highest tf wins


def test_bm25_finds_the_with_statement_in_the_builtin_corpus():
    docs = retrieval.builtin_passages()
    assert len(docs) > 100 and max(map(len, docs)) <= 4 * 1200
    (i, _), *_ = retrieval.BM25(docs).search("with statement __enter__ __exit__ context manager", 3)
    assert "__enter__" in docs[i]


def test_passages_keep_paragraphs_under_the_limit():
    doc = "\n\n".join(f"paragraph {i} " + "x" * 50 for i in range(40))
    ps = retrieval.passages([doc], max_chars=200)
    assert all(len(p) <= 200 for p in ps)
    assert "".join(ps).count("paragraph") == 40


# ---------------------------------------------------------------- queueing


def _fcfs_brute(arrivals, services):
    """Event simulation of one FCFS server: start = max(arrival, previous end)."""
    free, waits = 0.0, []
    for a, s in zip(arrivals, services, strict=True):
        start = max(a, free)
        waits.append(start - a)
        free = start + s
    return np.array(waits)


def test_lindley_equals_an_event_simulation():
    rng = np.random.default_rng(1)
    a = np.cumsum(rng.exponential(1.0, 500))
    s = rng.uniform(0.2, 1.6, 500)
    np.testing.assert_allclose(serving.lindley(a, s), _fcfs_brute(a, s), atol=1e-9)


def test_md1_and_mm1_formulas_and_the_long_run_simulation():
    assert serving.md1_wait(0.5, 1.0) == pytest.approx(0.5)  # rho D / (2 (1 - rho))
    assert serving.mm1_wait(0.5, 1.0) == pytest.approx(1.0)  # twice M/D/1
    assert math.isinf(serving.md1_wait(1.0, 1.0))
    rng = np.random.default_rng(0)
    long = serving.finite_run_waits(0.6, 1.0, 4000, 40, rng)["mean_s"]
    assert long == pytest.approx(serving.md1_wait(0.6, 1.0), rel=0.1)
    short = serving.finite_run_waits(0.95, 1.0, 10, 2000, rng)["mean_s"]
    assert short < 0.5 * serving.md1_wait(0.95, 1.0)  # a short run from empty stays far below steady state
    assert serving.mg1_wait(0.5, [1.0]) == pytest.approx(serving.md1_wait(0.5, 1.0))  # M/G/1 with D = M/D/1
    expo = rng.exponential(1.0, 400_000)
    assert serving.mg1_wait(0.5, expo) == pytest.approx(serving.mm1_wait(0.5, 1.0), rel=0.02)  # E[S^2] = 2 D^2
    mg = serving.finite_run_waits(0.5, expo, 3000, 40, rng)["mean_s"]
    assert mg == pytest.approx(serving.mm1_wait(0.5, 1.0), rel=0.1)


def test_poisson_offsets():
    rng = np.random.default_rng(0)
    off = serving.poisson_offsets(4.0, 20000, rng)
    assert np.all(np.diff(off) >= 0)
    assert np.mean(np.diff(off)) == pytest.approx(0.25, rel=0.03)
    with pytest.raises(ValueError):
        serving.poisson_offsets(0.0, 3, rng)


def test_fcfs_worker_waits_match_lindley():
    def serve_one(send_ns):
        tr = Trace(send_ns=send_ns, start_ns=time.perf_counter_ns())
        time.sleep(0.004)
        tr.token_ns.append(time.perf_counter_ns())
        tr.end_ns = time.perf_counter_ns()
        return tr

    offsets = np.array([0.0, 0.001, 0.002, 0.030, 0.031, 0.080])
    traces = serving.run_fcfs(offsets, serve_one)
    waits = np.array([t.queue_ms for t in traces])
    want = serving.lindley(offsets, [t.service_ms / 1e3 for t in traces]) * 1e3
    assert np.max(np.abs(waits - want)) < 6.0  # ms: the harness between requests and the wake-up (ms when loaded)
    assert waits[2] > waits[1] > waits[0]  # the 2nd and 3rd queue behind the 1st


# ---------------------------------------------------------------- metrics on known stamps


def test_streaming_metric_definitions():
    ms = 1_000_000
    t = Trace(send_ns=0, start_ns=10 * ms, token_ns=[100 * ms, 120 * ms, 150 * ms, 160 * ms], end_ns=161 * ms)
    t.phases = {"template_tokenize": (10 * ms, 11 * ms), "prefill": (11 * ms, 98 * ms), "first_token": (98 * ms, 99 * ms)}
    assert t.ttft_ms == 100 and t.e2e_ms == 160 and t.n == 4
    assert t.tpot_ms == pytest.approx(20.0)  # (160 - 100) / 3
    assert t.itl_ms == [20, 30, 10]
    assert t.queue_ms == 10 and t.unattributed_ms == pytest.approx(1.0)
    m = {(r["tool"], r["metric"]): r["value_ms"] for r in serving.tool_metrics([t])}
    assert m[("GenAI-Perf", "inter_token_latency")] == pytest.approx(20.0)
    assert m[("llmperf", "inter_token_latency")] == pytest.approx(40.0)  # 160 / 4: includes the TTFT
    assert m[("guidellm", "time_per_output_token_ms")] == pytest.approx(40.0)
    assert m[("guidellm", "inter_token_latency_ms")] == pytest.approx(20.0)
    p = serving.vllm_metrics([t])
    assert p["ITL"]["p50_ms"] == 20 and p["TTFT"]["n"] == 1


def test_fit_recovers_linear_and_quadratic_terms():
    x = np.array([16, 64, 256, 1024, 4096])
    fit = lab.fit_growth(x, 5 + 0.5 * x + 1e-4 * x * x)
    assert fit["a_ms"] == pytest.approx(5, rel=1e-6) and fit["b_ms_per_tok"] == pytest.approx(0.5, rel=1e-6)
    assert fit["linear_until_tokens"] == pytest.approx(0.1 * 0.5 / 1e-4, rel=1e-4)
    assert math.isinf(lab.fit_growth(x, 3 + 0.2 * x)["linear_until_tokens"])


# ---------------------------------------------------------------- the streaming loop vs HF


@pytest.fixture(scope="module")
def small_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    from llmlab.core.models import load_tokenizer

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=4096, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    return LlamaForCausalLM(cfg).eval(), load_tokenizer("tiny")


def test_serve_streams_what_hf_generate_would(small_llama):
    from llmlab.inference.decode import hf_generate

    model, tok = small_llama
    tr = serving.serve(model, tok, CPU, Request("How does a for loop work?", new_tokens=6))
    text, _ = serving.render_chat(tok, serving.SYSTEM, "How does a for loop work?")
    ids = tok(text, return_tensors="pt", add_special_tokens=False)["input_ids"]
    assert tr.prompt_tokens == ids.shape[1] and tr.n == 6
    assert tr.tokens == hf_generate(model, ids, 6)[0].tolist()
    assert set(tr.phases) == {"template_tokenize", "prefill", "first_token"}
    assert abs(tr.unattributed_ms) <= 0.02 * tr.ttft_ms
    short = serving.serve(model, tok, CPU, Request("x " * 400, new_tokens=2, max_prompt_tokens=100))
    assert short.prompt_tokens == 100


def test_config_validation_and_context_clamp():
    for bad in (dict(prompt_len=0), dict(prompt_len=-3), dict(rates=(0.0,)), dict(rates=(2.0, -1.0)),
                dict(utilizations=(0.0,)), dict(new_tokens=1)):
        with pytest.raises(ValueError):
            lab.Config(**bad)
    from llmlab.core.results import LabResult

    res = LabResult.new(lab.LAB, lab.VERSION, lab.Config())
    ctx = lab.Ctx(None, None, CPU, max_prompt=1000, cfg=lab.Config(prompt_len=10**6, sweep_points=4))
    lengths = lab._sweep_lengths(ctx.cfg, ctx, res)
    assert lengths[0] == 16 and lengths[-1] == 1000 and any("clamped to 1000" in n for n in res.notes)
    assert lab._sweep_lengths(lab.Config(prompt_len=8), ctx, res) == [8]


# ---------------------------------------------------------------- the CLI


def _cli(*args, timeout=600):
    return subprocess.run([sys.executable, "-m", "llmlab", *args], capture_output=True, text=True, timeout=timeout)


def test_cli_end_to_end_quick():
    p = _cli("ttft", "--prompt-len", "256", "--device", "cpu", "--quick", "--json", "--no-save")
    assert p.returncode == 0, p.stderr[-2000:]
    d = json.loads(p.stdout)
    assert d["lab"] == "ttft-breakdown" and not d["interrupted"]
    res = LabResult.from_dict(d)
    for name in ("phases", "prompt_sweep", "prompt_fit", "queueing", "cold_start", "scenarios", "streaming",
                 "metric_definitions"):
        assert len(res.tables[name]), name
    assert res.tables["prompt_sweep"]["prompt_tokens"].tolist() == [16, 40, 102, 256]  # reaches --prompt-len
    sc = res.tables["scenarios"]
    parts = sc[["queue_ms", "cold_start_ms", "retrieval_ms", "prefill_ms", "other_ms"]].sum(axis=1)
    np.testing.assert_allclose(parts, sc["ttft_ms"], rtol=1e-9)  # each bar adds up to its TTFT
    assert (sc["ttft_ms"] > 0).all() and sc["cold_start_ms"].iloc[-1] > 0
    claims = {c.text: c for c in res.claims}
    assert claims["The phases add up to the measured TTFT"].holds
    assert all(c.measured for c in res.claims)
    assert any(n.startswith("diagnosis") for n in res.notes)


@pytest.mark.parametrize("args", [("--prompt-len", "0"), ("--prompt-len", "-5"), ("--rate", "0"), ("--rate", "-2")])
def test_cli_bad_input_exits_2(args):
    p = _cli("ttft-breakdown", "--device", "cpu", "--no-save", *args, timeout=120)
    assert p.returncode == 2
    assert "Traceback" not in p.stderr and len(p.stderr.strip().splitlines()) == 1


def test_both_names_have_help():
    for name in ("ttft", "ttft-breakdown"):
        p = _cli(name, "--help", timeout=60)
        assert p.returncode == 0 and "--prompt-len" in p.stdout
