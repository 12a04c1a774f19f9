"""Lab: where time to first token goes — queueing, cold start, prompt length (prefill), RAG.

Two chatbots can take the same 4 s for an answer while one feels snappy: its first word arrives
in 200 ms. TTFT hides four layers, and this lab measures each on your machine:

1. one request, phase by phase (template + tokenize, queue, prefill, first sample + detokenize),
   each phase with its own stamps; then the attribution check: a known delay put into one
   component (the tokenizer, the model's forward, the detokenizer) must show up in its phase;
2. prompt length: prefill time from 16 tokens to --prompt-len against the napkin time, FLOPs
   (2 P T + 2 L d T^2) over a matmul rate measured at the same token count;
3. queueing: Poisson arrivals at rising utilisation (and a burst) in front of one FCFS worker,
   against M/D/1 on the same arrival times; a RAG request (BM25 + long context) next to the chat;
4. cold start in a fresh process: interpreter, imports, tokenizer, weights, device, first forward.

Every request comes from one trace source, `Ctx.serve` (the in-process worker of
llmlab/inference/serving.py), as a `metrics.Trace`; everything after it reads only Traces, so
another source of traces (a streaming client against a server) can stand in its place.
Streaming metrics follow vLLM's benchmark_serving; see serving.py for the definitions and how
GenAI-Perf, llmperf and guidellm differ.

References:
- vLLM benchmarks/benchmark_serving.py (TTFT, TPOT, ITL, E2EL; Poisson arrivals, burstiness)
- Kleinrock, Queueing Systems vol. 1 (1975): M/D/1 and M/M/1 mean waits (Pollaczek-Khinchine)
- Kaplan et al. (2020), "Scaling Laws for Neural Language Models": 2 N FLOPs per token forward
- Robertson & Zaragoza (2009), BM25
"""

from __future__ import annotations

import itertools
import math
import shutil
import tempfile
import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from llmlab.core import disk
from llmlab.core.device import Device, torch_threads
from llmlab.core.models import classify
from llmlab.core.render import track
from llmlab.core.results import Chart, Claim, Col, LabResult, View, empty_table
from llmlab.core.timing import summarize
from llmlab.labs.ttft_breakdown import endpoint as _ttft_endpoint
from llmlab.labs.ttft_breakdown import pipeline
from llmlab.labs.ttft_breakdown.pipeline import Request
from llmlab.loadgen import arrivals, metrics, queueing
from llmlab.loadgen.metrics import PHASES, Trace
from llmlab.serving import chat

LAB = "ttft-breakdown"
VERSION = 2  # 2: the attribution check, the matmul rate per prompt length, one row per request
JUDGE_VERSION = 1  # --endpoint runs are told apart by config.endpoint (their own tables and claims)

# The chat questions every scenario asks (cycled), so chat, RAG and the queue serve the same work.
QUESTIONS = (
    "What does the with statement do with __enter__ and __exit__?",
    "How does a for loop use the iterator protocol?",
    "What is the difference between is and == when comparing objects?",
    "How do keyword-only arguments work in a function definition?",
    "What happens when an exception is raised inside a try statement with finally?",
)
# Judge tolerances (stated in the claims): see judge().
HARNESS_PCT = 2.0  # the phases must add up to the TTFT within this many percent ...
HARNESS_SHARE = 0.95  # ... for this share of the requests (the OS may deschedule the process between stamps)
ATTRIBUTION_TOL = 0.10  # the injected delay lands in its phase within 10%, and no other phase gains 10% of it
# (one-sided: a leak adds time; a phase that ran faster after a busy-wait is the scheduler, not the stamps)
NAPKIN_BAND = (1 / 3, 1.25)  # measured prefill rate / napkin rate at the longest prompt: attention and
# the small q/k/v GEMMs run below the MLP matmul's rate (so < 1), but not 3x below; above 1.25x the napkin is wrong
COLD_MIN_X = 10  # imports alone take seconds, a warm request tens of ms
COLD_RESIDENT_MAX = 0.05  # a cold read finds at most 5% of the weights' pages still in the page cache
COPY_MAX_BYTES = 8 << 30  # copy weights fresh (when the originals cannot be dropped) only up to 8 GiB
DISK_PROBE_BYTES = 2 << 30  # the disk's read rate from at most 2 GiB of the weights
NAPKIN_MODEL_PARAMS = 70e9  # the "90-second" cold start of a 70B model, from this machine's disk and link
QUEUE_SHARE = 0.5  # the measured growth must reach half the ideal M/D/1 growth on the same arrival times


@dataclass(frozen=True)
class Config:
    model: str = "tiny"  # the built-in trained pair's target: loads offline in seconds
    prompt_len: int = 4096  # the longest prompt of the sweep (the article's `--prompt-len 4096`)
    sweep_points: int = 7  # prompt lengths, geometric from 16 to prompt_len: a curve, not two points
    sweep_repeats: int = 3  # TTFT samples per prompt length (median, p10/p90)
    sweep_max_s: float = 30.0  # stop repeating a prompt length after this long (at least one sample)
    chat_repeats: int = 7  # warm repeats of the plain chat and the RAG request
    new_tokens: int = 16  # streamed tokens per request (TPOT and ITL need at least 2)
    attribution_delay_ms: float = 100.0  # the known delay: ~8x a warm tiny chat TTFT on an idle 2-core CPU, so
    # its 10% (10 ms) stands above the jitter of the fastest of a few samples of any other phase
    attribution_repeats: int = 5  # plain/delayed pairs per injected phase (the fastest of each is compared)
    utilizations: tuple[float, ...] = (0.3, 0.5, 0.7, 0.8, 0.9, 0.95)  # rho targets; rate = rho / measured service time
    rates: tuple[float, ...] = ()  # explicit arrival rates (requests/s): replace the utilisation sweep when given
    requests_per_rate: int = 30  # bounded, so rho = 0.95 still ends in about n x service / rho
    burst: int = 12  # requests arriving at the same instant (0 = skip)
    rag_top_k: int = 6  # BM25 passages put into the RAG prompt
    rag_context_tokens: int = 1536  # budget for the retrieved context (~4 characters per token)
    cold_starts: int = 3  # fresh-process cold starts, each several seconds (0 = skip)
    threads: int = 0  # torch CPU threads; 0 = auto: torch's default, or 1 when the CPU is oversubscribed
    seed: int = 0  # arrival schedules and the M/D/1 simulation
    # --endpoint URL: measure a running OpenAI-compatible server instead (labs/_ttft_endpoint.py)
    endpoint: str | None = None
    concurrency: int = 8  # requests in flight at most during the load part
    request_rate: float = math.inf  # arrivals per second of the load part (inf: as fast as concurrency allows)
    burstiness: float = 1.0  # gamma shape of the gaps: 1 = Poisson, < 1 burstier, > 1 more even
    load_requests: int = 32  # requests of the load part (0 = skip)
    warmup: int = 2  # requests sent first and left out of every table
    prefix_probes: int = 3  # pairs of requests sharing one long prefix
    request_timeout: float = 60.0  # seconds before a request counts as failed
    api_key_env: str = "OPENAI_API_KEY"  # the NAME of the variable holding the key (the key is never saved)
    tokenizer: str | None = None  # counts output tokens when the server sends no usage

    def __post_init__(self):
        if self.endpoint is not None and not self.endpoint.startswith(("http://", "https://")):
            raise ValueError(f"--endpoint {self.endpoint!r}: give an http(s) URL, e.g. http://127.0.0.1:8000")
        if self.concurrency < 1:
            raise ValueError(f"--concurrency must be at least 1 request in flight, got {self.concurrency}")
        if not self.request_rate > 0:
            raise ValueError(f"--request-rate must be > 0 requests/s (leave it out for no limit), got {self.request_rate}")
        if not self.burstiness > 0:
            raise ValueError(f"--burstiness must be > 0 (1 = Poisson), got {self.burstiness}")
        if not self.request_timeout > 0:
            raise ValueError(f"--request-timeout must be > 0 seconds, got {self.request_timeout}")
        if self.prompt_len < 1:
            raise ValueError(f"--prompt-len must be a positive number of tokens, got {self.prompt_len}")
        bad = [r for r in self.rates if not r > 0]
        if bad:
            raise ValueError(f"an arrival rate must be > 0 requests/s, got {bad[0]}")
        bad = [u for u in self.utilizations if not 0 < u < 2]
        if bad:
            raise ValueError(f"a utilisation must be in (0, 2), got {bad[0]}")
        if not self.sweep_max_s > 0:
            raise ValueError(f"sweep_max_s must be > 0 seconds, got {self.sweep_max_s}")
        if not self.attribution_delay_ms > 0:
            raise ValueError(f"attribution_delay_ms must be > 0, got {self.attribution_delay_ms}")
        if not (self.rates or self.utilizations):
            raise ValueError("give at least one arrival rate or utilisation")
        for name, lo in (("new_tokens", 2), ("threads", 0), ("requests_per_rate", 2), ("sweep_points", 1),
                         ("sweep_repeats", 1), ("chat_repeats", 1), ("rag_top_k", 1), ("rag_context_tokens", 16),
                         ("burst", 0), ("cold_starts", 0), ("attribution_repeats", 1), ("load_requests", 0), ("warmup", 0),
                         ("prefix_probes", 0)):
            if getattr(self, name) < lo:
                raise ValueError(f"{name} must be at least {lo}, got {getattr(self, name)}")

    @classmethod
    def quick(cls) -> Config:
        # 1,024 tokens: 16x less prefill than 4,096, still long enough that compute dominates (the napkin claim)
        return cls(prompt_len=1024, sweep_points=4, sweep_repeats=2, sweep_max_s=1.5, chat_repeats=3, new_tokens=8, utilizations=(0.3, 0.95),
                   requests_per_rate=16, burst=6, rag_top_k=4, rag_context_tokens=512, cold_starts=1,
                   attribution_repeats=4, concurrency=4, load_requests=12, prefix_probes=2)


# ---------------------------------------------------------------- setup


@dataclass
class Ctx:
    """What every part needs: the model, its tokenizer, the device, and the limits."""

    model: object
    tokenizer: object
    device: Device
    max_prompt: int  # context length minus the streamed tokens
    cfg: Config

    threads: int = 0  # torch CPU threads in use (0 on a GPU: not set)

    def serve(self, req: Request, retrieve=None, tokenizer=None) -> Trace:
        """The trace source: one request through the in-process worker (`tokenizer` replaces the real one)."""
        return pipeline.serve(self.model, tokenizer or self.tokenizer, self.device, req, retrieve)

    def ask(self, i: int, new_tokens: int | None = None, send_ns: int = 0) -> Request:
        return Request(QUESTIONS[i % len(QUESTIONS)], new_tokens=new_tokens or self.cfg.new_tokens,
                       max_prompt_tokens=self.max_prompt, send_ns=send_ns)


def _setup(cfg: Config, device: Device, res: LabResult) -> Ctx:
    from llmlab.core.models import load, load_tokenizer

    lm = load(cfg.model, device)
    tokenizer = lm.tokenizer
    if tokenizer is None:  # arch: random weights
        tokenizer = load_tokenizer("tiny")
        res.note(f"{cfg.model} has random weights: timings only, never a quality claim (text: the tiny tokenizer)")
    ctx_len = int(getattr(lm.config, "max_position_embeddings", 0) or 2048)
    tokenizer.model_max_length = 2**62  # we clamp to the context ourselves (Request.max_prompt_tokens): no warning
    p_layers, layers, d_attn = _layer_params(lm.model)
    res.env["model"] = {"ref": cfg.model, "kind": lm.kind, "n_params": lm.n_params, "context": ctx_len,
                        "timing_only": lm.timing_only, "layer_params": p_layers, "layers": layers, "d_attn": d_attn}
    _, how = chat.render_chat(tokenizer, pipeline.SYSTEM, "{user}")
    res.env["chat_template"] = how
    return Ctx(lm.model, tokenizer, device, ctx_len - cfg.new_tokens, cfg)


def _threads(cfg: Config, device: Device, res: LabResult) -> int:
    """The torch thread count for this run (CPU only): oversubscription makes OpenMP threads wait for
    each other (a descheduled thread stalls every parallel region), 10x slower forwards here."""
    import torch

    from llmlab.core.device import cpu_load

    if device.is_cuda:
        return 0
    if cfg.threads:
        return cfg.threads
    load, cores = cpu_load()
    if load is not None and load >= cores and torch.get_num_threads() > 1:
        res.note(f"CPU oversubscribed (load {load:.1f} on {cores} cores): torch ran with 1 thread (--threads N overrides)")
        return 1
    return torch.get_num_threads()


def _sweep_lengths(cfg: Config, ctx: Ctx, res: LabResult) -> list[int]:
    top = cfg.prompt_len
    if top > ctx.max_prompt:
        res.note(f"--prompt-len {top} is beyond the model's context ({ctx.max_prompt + cfg.new_tokens} positions "
                 f"less {cfg.new_tokens} streamed tokens): clamped to {ctx.max_prompt}")
        top = ctx.max_prompt
    lo = min(16, top)
    pts = np.geomspace(lo, top, cfg.sweep_points) if cfg.sweep_points > 1 else np.array([top])
    return sorted({int(round(p)) for p in pts} | {top})


def _long_text(tokenizer, n_tokens: int) -> str:
    """Corpus text (the English help topics) of at least n_tokens tokens."""
    from llmlab.inference.retrieval import builtin_passages

    text = "\n\n".join(builtin_passages())
    while len(tokenizer(text[: 8 * n_tokens], add_special_tokens=False)["input_ids"]) < n_tokens:
        text = text + "\n\n" + text
    return text[: 8 * n_tokens]


# ---------------------------------------------------------------- 1. one request, phase by phase


def request_row(scenario: str, t: Trace) -> dict:
    """One served request as a table row: its phases, TTFT, what the stamps did not cover, its stream."""
    b = t.breakdown()
    return {"scenario": scenario, "prompt_tokens": t.prompt_tokens, **{k: v for k, v in b.items()},
            "service_ms": t.service_ms, "tpot_ms": t.tpot_ms, "e2e_ms": t.e2e_ms}


def phase_row(scenario: str, traces: list[Trace]) -> dict:
    """Medians of each phase over the requests of one scenario."""
    rows = [t.breakdown() for t in traces]
    med = {k: float(np.median([r[k] for r in rows])) for k in rows[0] if k != "unattributed_pct"}
    return {"scenario": scenario, "n": len(traces), "prompt_tokens": int(np.median([t.prompt_tokens for t in traces])),
            **med}


def single_request(ctx: Ctx) -> list[Trace]:
    """Warm up, then the same plain chat request `chat_repeats` times, idle server."""
    for i in range(2):
        ctx.serve(ctx.ask(i))
    return [ctx.serve(ctx.ask(i)) for i in range(ctx.cfg.chat_repeats)]


def attribution(ctx: Ctx, progress=None) -> list[dict]:
    """Put a known delay into one component at a time and measure how each phase moves.

    template_tokenize: the tokenizer's encode; prefill: the model's forward (a pre-hook); first_token:
    the detokenizer. Plain and delayed requests alternate; each phase's shift is the fastest delayed
    sample minus the fastest plain one: contention on a shared machine only ever adds time, and the
    delay is a busy-wait to a deadline, so the minima keep it exact while they shed the noise.
    """
    delay_s = ctx.cfg.attribution_delay_ms / 1e3
    hooks = {
        "none": lambda: (None, nullcontext()),  # plain against plain: the noise floor of the comparison
        "template_tokenize": lambda: (pipeline.Delayed(ctx.tokenizer, delay_s, "__call__"), nullcontext()),
        "prefill": lambda: (None, pipeline.slowed_forward(ctx.model, delay_s)),
        "first_token": lambda: (pipeline.Delayed(ctx.tokenizer, delay_s, "decode"), nullcontext()),
    }
    rows = []
    for target in track(progress, list(hooks), "attribution check"):
        base, slow = [], []
        for i in range(ctx.cfg.attribution_repeats):
            base.append(ctx.serve(ctx.ask(i, new_tokens=2)).breakdown())
            tok, slowed = hooks[target]()
            with slowed:
                slow.append(ctx.serve(ctx.ask(i, new_tokens=2), tokenizer=tok).breakdown())
        row = {"injected_into": target, "delay_ms": 0.0 if target == "none" else ctx.cfg.attribution_delay_ms, "n": len(base),
               "base_ttft_ms": float(np.median([b["ttft_ms"] for b in base]))}
        for k in ("queue_ms", *(f"{p}_ms" for p in PHASES if p != "retrieval"), "ttft_ms"):
            row[f"d_{k}"] = min(s[k] for s in slow) - min(b[k] for b in base)
        rows.append(row)
    return rows


# ---------------------------------------------------------------- 2. prompt length


def _layer_params(model) -> tuple[int, int, int]:
    """(parameters inside the decoder layers, layers, heads x head_dim): the napkin FLOP terms."""
    c = model.config
    p = sum(t.numel() for n, t in model.named_parameters() if ".layers." in n)
    heads = c.num_attention_heads
    return p, c.num_hidden_layers, heads * (getattr(c, "head_dim", None) or c.hidden_size // heads)


def napkin_flops(p_layers: int, layers: int, d_attn: int, t: int) -> float:
    """Prefill FLOPs of t tokens: 2 P t (every layer weight once per token) + 2 L d t^2 (causal QK^T and AV:
    each 2 t^2 d / 2 per layer, half of the square under the causal mask)."""
    return 2.0 * p_layers * t + 2.0 * layers * d_attn * t * t


def matmul_gflops(ctx: Ctx, t: int, blocks: int = 5) -> float:
    """The device's matmul rate at this token count: (t, hidden) @ (hidden, intermediate), the MLP's
    up-projection, in the model's dtype, timed in blocks of back-to-back calls by core.roofs.time_blocks
    (operands warm in cache, as inside a prefill: its activations stay hot). GFLOP/s."""
    import torch

    from llmlab.core.roofs import gemm_operands, matmul_fn, time_blocks

    c = ctx.model.config
    k, n = c.hidden_size, getattr(c, "intermediate_size", 4 * c.hidden_size)
    dtype = {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(next(ctx.model.parameters()).dtype, "fp32")
    gen = torch.Generator(device=ctx.device.torch).manual_seed(0)
    a, w, out = gemm_operands(t, n, k, dtype, ctx.device, gen)  # (T, H) @ (H, I) -> (T, I)
    st, _ = time_blocks(matmul_fn("torch", a, w, out), ctx.device, blocks=blocks, min_block_s=0.01)
    return 2.0 * t * k * n / st.median_s / 1e9


def prompt_sweep(ctx: Ctx, lengths: list[int], progress) -> tuple[list[dict], dict[int, list[Trace]]]:
    ids = ctx.tokenizer(_long_text(ctx.tokenizer, max(lengths) + 64), add_special_tokens=False)["input_ids"]
    p_layers, layers, d_attn = _layer_params(ctx.model)
    rows, traces = [], {}
    for n in track(progress, lengths, "prompt-length sweep"):
        # corpus text of ~n tokens (so tokenizing it costs what an n-token prompt costs), templated, then cut to
        # exactly its last n tokens
        req = Request(ctx.tokenizer.decode(ids[: n + 8]), new_tokens=1, max_prompt_tokens=n)
        ctx.serve(req)  # warm-up at this length (allocator, cache sizes)
        rate = matmul_gflops(ctx, n)  # measured just before its prefills
        ts, t0 = [], time.perf_counter()
        while len(ts) < ctx.cfg.sweep_repeats and (not ts or time.perf_counter() - t0 < ctx.cfg.sweep_max_s):
            ts.append(ctx.serve(req))
        traces[n] = ts
        ttft = summarize([t.ttft_ms for t in ts])
        prefill = summarize([t.phase_ms("prefill") for t in ts])
        flops = napkin_flops(p_layers, layers, d_attn, n)
        napkin_ms = flops / (rate * 1e9) * 1e3
        rows.append({
            "prompt_tokens": ts[0].prompt_tokens, "n": ttft.n, "ttft_median_ms": ttft.median_ms,
            "ttft_p10_ms": ttft.p10_ms, "ttft_p90_ms": ttft.p90_ms, "ttft_min_ms": ttft.min_ms,
            "prefill_ms": prefill.median_ms, "prefill_tok_per_s": n / prefill.median_s, "napkin_gflop": flops / 1e9,
            "matmul_gflop_per_s": rate, "napkin_prefill_ms": napkin_ms, "napkin_tok_per_s": n / napkin_ms * 1e3,
            "rate_vs_napkin": napkin_ms / prefill.median_ms, "achieved_gflop_per_s": flops / prefill.median_s / 1e9,
        })
    return rows, traces


def fit_growth(x, y) -> dict:
    """Non-negative least squares on relative error: y ~ a + bT + cT^2 (a description, not a verdict)."""
    from scipy.optimize import nnls

    x, y = np.asarray(x, float), np.asarray(y, float)
    w = 1.0 / y
    A = np.stack([np.ones_like(x), x, x * x], 1)
    (a, b, c), _ = nnls(A * w[:, None], y * w)
    if c * x.max() ** 2 <= 1e-9 * y.max():  # round-off, not a T^2 term
        c = 0.0
    n10 = 0.1 * b / c if c > 0 else math.inf  # where the T^2 term adds 10% to the linear one
    return {"a_ms": a, "b_ms_per_tok": b, "c_ms_per_tok2": c, "t2_adds_10pct_at_tokens": n10}


# ---------------------------------------------------------------- 3. RAG


def make_retriever(cfg: Config):
    """(retrieve(question) -> user message with context, index build seconds, passages)."""
    from llmlab.inference.retrieval import BM25, builtin_passages

    docs = builtin_passages()
    t0 = time.perf_counter()
    index = BM25(docs)
    build_s = time.perf_counter() - t0
    budget = 4 * cfg.rag_context_tokens  # ~4 characters per BPE token

    def retrieve(question: str) -> str:
        context = "\n\n".join(docs[i] for i, _ in index.search(question, cfg.rag_top_k))[:budget]
        return pipeline.RAG_USER.format(context=context, question=question)

    return retrieve, build_s, docs


def rag_requests(ctx: Ctx, retrieve) -> list[Trace]:
    ctx.serve(ctx.ask(0), retrieve)  # warm-up at the RAG prompt length
    return [ctx.serve(ctx.ask(i), retrieve) for i in range(ctx.cfg.chat_repeats)]


# ---------------------------------------------------------------- 4. queueing


def queueing_part(ctx: Ctx, progress) -> tuple[list[dict], dict[str, list[Trace]]]:
    """Poisson arrivals at each target utilisation (or rate), then a burst, into one FCFS worker.

    The service time drifts with the machine's load, so each rate is set from the latest measured
    services (3 probe requests first, then the previous run's); the table reports the
    utilisation each run actually had: its arrival rate x its own mean service time.
    """
    cfg = ctx.cfg
    rng = np.random.default_rng(cfg.seed)
    order = itertools.count()  # which question each arriving request asks

    def one(send_ns: int) -> Trace:
        return ctx.serve(ctx.ask(next(order), send_ns=send_ns))

    recent = [one(0).service_ms / 1e3 for _ in range(3)]  # probe: the service time right now
    rows, runs = [], {}
    # common random numbers: one set of exponential gaps, scaled by 1/rate for every rate, so the rates
    # differ only in load, not in luck (a standard variance reduction for comparing a queue across loads)
    unit = arrivals.poisson_offsets(1.0, cfg.requests_per_rate, rng)
    for target in track(progress, list(cfg.rates or cfg.utilizations), "Poisson arrivals"):
        service_s = float(np.median(recent))
        rate = target if cfg.rates else target / service_s
        offsets = unit / rate
        ts = arrivals.run_fcfs(offsets, one)
        row = queue_row("poisson", rate, offsets, ts, rng)
        runs[f"rho={row['rho']:.2f}"] = ts
        rows.append({**row, "target_rate_per_s": target if cfg.rates else math.nan,
                     "target_rho": math.nan if cfg.rates else target})
        recent = [t.service_ms / 1e3 for t in ts]
    if cfg.burst:
        ts = arrivals.run_fcfs(arrivals.burst_offsets(cfg.burst), one)
        runs[f"burst of {cfg.burst}"] = ts
        rows.append(queue_row("burst", math.inf, np.zeros(cfg.burst), ts, rng))
    return rows, runs


def queue_row(kind: str, rate: float, offsets, ts: list[Trace], rng) -> dict:
    waits = [t.queue_ms for t in ts]
    svc_s = np.array([t.service_ms for t in ts]) / 1e3
    D = float(svc_s.mean())
    lind = queueing.lindley(offsets, svc_s) * 1e3
    row = {"arrivals": kind, "n": len(ts), "rate_per_s": rate, "rho": math.nan, "service_ms": 1e3 * D,
           "service_cv": float(svc_s.std() / D),
           **{f"wait_{k}": v for k, v in metrics.pct(waits).items() if k != "n"}}
    if kind == "burst":
        row["expected_mean_ms"] = 1e3 * D * (len(ts) - 1) / 2  # the k-th waits k services
    else:
        rho = rate * D  # measured: the arrival rate x this run's mean service time
        row.update(rho=rho, expected_mean_ms=1e3 * queueing.finite_run_waits(rate, svc_s, len(ts), 2000, rng)["mean_s"],
                   schedule_md1_ms=1e3 * float(queueing.lindley(offsets, np.full(len(ts), D)).mean()),
                   md1_ms=1e3 * queueing.md1_wait(rho, D), mg1_ms=1e3 * queueing.mg1_wait(rate, svc_s),
                   mm1_ms=1e3 * queueing.mm1_wait(rho, D))
    # the harness check: FCFS waits are Lindley's recursion of the measured services, plus the worker's own
    # gap between a request's end (or its arrival, when idle: the wake-up lateness) and the next start
    diff = np.abs(lind - waits)
    gaps = [(t.start_ns - max(t.send_ns, ts[k - 1].end_ns if k else 0)) / 1e6 for k, t in enumerate(ts)]
    row.update(lindley_p90_diff_ms=float(np.quantile(diff, 0.9)), harness_gap_p50_ms=float(np.median(gaps)),
               harness_gap_max_ms=float(max(gaps)))
    return {k: (math.nan if isinstance(v, float) and math.isinf(v) else v) for k, v in row.items()}


# ---------------------------------------------------------------- 5. cold start

COLD_STEPS = {  # stamp -> what happened since the previous one, in the order they run
    "start": "interpreter start", "import_torch": "import torch", "import_transformers": "import transformers",
    "import_llmlab": "import llmlab + model classes", "device_init": "device init (CUDA context)",
    "load_tokenizer": "load tokenizer", "read_weights": "read weights + build model",
    "to_device": "move weights to device", "first_token": "first request (cold)",
}


def cold_start(ctx: Ctx, progress, res: LabResult) -> list[dict]:
    cfg = ctx.cfg
    cold = ColdWeights.prepare(cfg.model)
    read = cold.rows(ctx.device)
    res.add_table("cold_read", read)
    val = {r["item"]: r["value"] for r in read}
    gbps = val.get("disk_read")
    runs = []
    for _ in track(progress, range(cfg.cold_starts), "cold starts (fresh processes)"):
        cold.drop()  # each fresh process reads its weights from disk, not from the page cache
        runs.append(pipeline.cold_start(cold.ref, ctx.device.spec, QUESTIONS[0], cfg.new_tokens, 3, ctx.threads))
    cold.cleanup()
    wb = runs[0]["weight_bytes"]
    warm = [w["ttft_ms"] for r in runs for w in r["warm"]]
    warm_prefill = float(np.median([w["prefill_ms"] for r in runs for w in r["warm"]]))
    upload = val.get("napkin_70b_upload")
    expected = {"read_weights": f"{wb / 1e6:.0f} MB at {gbps:.2f} GB/s = {wb / gbps / 1e6:.0f} ms" if gbps else "",
                "first_token": f"warm TTFT {float(np.median(warm)):.1f} ms",
                "to_device": f"70B: {upload:,.0f} s at the upload rate" if upload else "0 on the CPU (no copy)",
                "device_init": "the CUDA context, once" if ctx.device.is_cuda else "0 on the CPU",
                # the measured small model beside the napkin of a big one, from this disk
                "spawn_to_first_token": f"70B (BF16) read: {val['napkin_70b_read']:,.0f} s" if gbps else ""}
    rows, steps = [], list(COLD_STEPS)
    for i, step in enumerate(steps):  # each step lasts from the previous stamp (the spawn for the first) to its own
        ms = [(r["stamps"][step] - (r["stamps"][steps[i - 1]] if i else r["spawn_ns"])) / 1e6 for r in runs]
        rows.append({"step": step, "phase": COLD_STEPS[step], **_stats(ms), "expected": expected.get(step, "")})
    totals = {
        "spawn_to_first_token": ("spawn -> first token", [(r["stamps"]["first_token"] - r["spawn_ns"]) / 1e6 for r in runs]),
        "warm_ttft": ("the same request, warm", warm),
        "spawn_to_exit": ("spawn -> process exit", [(r["exit_ns"] - r["spawn_ns"]) / 1e6 for r in runs]),
        "first_forward_extra": ("cold - warm prefill", [r["cold"]["prefill_ms"] - warm_prefill for r in runs]),
    }
    rows += [{"step": k, "phase": label, **_stats(v), "expected": expected.get(k, "")} for k, (label, v) in totals.items()]
    return rows


@dataclass
class ColdWeights:
    """The model's weight files made cold: dropped from the page cache, or copied fresh where another
    process maps the originals (its pages cannot be dropped), then checked with mincore."""

    ref: str  # what the cold-start child loads: the model, or the fresh copy's folder
    files: list[Path]
    source: str
    tmp: Path | None = None

    @classmethod
    def prepare(cls, model: str) -> ColdWeights:
        kind, loc = classify(model)
        files = _weight_files(loc) if kind in ("builtin", "path") else []
        cold = cls(model, files, "the model's own files")
        if files and cold.drop() > COLD_RESIDENT_MAX and sum(f.stat().st_size for f in files) <= COPY_MAX_BYTES:
            tmp = Path(tempfile.mkdtemp(prefix="llmlab-cold-"))
            shutil.copytree(loc, tmp / "model")
            # another process maps the originals, so their pages cannot be dropped: a copy can be
            cold = cls(str(tmp / "model"), _weight_files(str(tmp / "model")), "fresh copy (originals mapped)", tmp)
        return cold

    def drop(self) -> float:
        """Drop the files from the page cache; the share still resident afterwards (1.0 when unknown)."""
        if not self.files or not disk.drop_page_cache(self.files):
            return 1.0
        left = disk.resident_fraction(self.files)
        return 1.0 if left is None else left

    def rows(self, device: Device) -> list[dict]:
        """The disk's cold read rate, the link's upload rate, and the napkin of a 70B model's cold start."""
        if not self.files:
            return [{"item": "weight_files", "what": "weight files", "value": math.nan, "unit": "",
                     "how": "none (arch: random weights)"}]
        size = sum(f.stat().st_size for f in self.files)
        left = self.drop()
        n, sec = disk.timed_read(self.files, DISK_PROBE_BYTES)
        gbps = n / sec / 1e9
        link = _upload_gbps(device)
        big = NAPKIN_MODEL_PARAMS * 2  # BF16
        rows = [("weights", "weights", size / 1e6, "MB", self.source),
                ("resident_after_drop", "cached after drop", 100 * left, "%", "mincore after fadvise DONTNEED"),
                ("disk_read", "disk read, cold", gbps, "GB/s", f"{n / 1e6:.0f} MB in 16 MiB reads"),
                ("upload", "upload to device", link or math.nan, "GB/s",
                 "pinned, 256 MiB" if link else "none: the CPU computes from RAM"),
                ("napkin_70b_read", "70B: read weights", big / gbps / 1e9, "s", f"{big / 1e9:.0f} GB (BF16) / disk rate")]
        if link:
            rows.append(("napkin_70b_upload", "70B: upload", big / link / 1e9, "s", f"{big / 1e9:.0f} GB / upload rate"))
        return [dict(zip(("item", "what", "value", "unit", "how"), r, strict=True)) for r in rows]

    def cleanup(self) -> None:
        if self.tmp is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)


def _weight_files(loc: str) -> list[Path]:
    return sorted(p for p in Path(loc).iterdir() if p.suffix in (".safetensors", ".bin"))


def _upload_gbps(device: Device) -> float | None:
    """Best of 3 pinned 256 MiB host-to-device copies, in GB/s; None on the CPU."""
    if not device.is_cuda:
        return None
    import torch

    host = torch.empty(256 << 20, dtype=torch.uint8, pin_memory=True)
    best = math.inf
    for _ in range(3):
        device.synchronize()
        t0 = time.perf_counter()
        host.to(device.torch, non_blocking=True)
        device.synchronize()
        best = min(best, time.perf_counter() - t0)
    return host.numel() / best / 1e9


def _stats(ms: list[float]) -> dict:
    return {"median_ms": float(np.median(ms)), "min_ms": float(min(ms)), "max_ms": float(max(ms)), "n": len(ms)}


# ---------------------------------------------------------------- the run


def run(cfg: Config, device: Device, progress=None) -> LabResult:
    """Measures. Fills tables, env, notes, skipped. Never prints, never judges."""
    res = LabResult.new(LAB, VERSION, cfg)
    with res.guard():
        if cfg.endpoint:  # a running server: the client's stamps joined to the server's own phases
            _ttft_endpoint.run_parts(cfg, res, progress)
            return res
        ctx = _setup(cfg, device, res)
        ctx.threads = _threads(cfg, device, res)
        if ctx.threads:
            res.env["torch_threads"] = ctx.threads
        with torch_threads(ctx.threads or None):
            _run_parts(ctx, res, progress)
    return res


def _run_parts(ctx: Ctx, res: LabResult, progress) -> None:
    cfg = ctx.cfg
    lengths = _sweep_lengths(cfg, ctx, res)
    requests: list[dict] = []  # every served request, one row each (the harness check reads them)
    res.env["stamp_cost_ns"] = _stamp_cost_ns()

    chat = single_request(ctx)
    requests += [request_row("chat", t) for t in chat]
    phases = [phase_row("chat (warm, idle)", chat)]
    res.add_table("phases", phases)
    res.add_table("requests", requests)
    res.add_table("attribution", attribution(ctx, progress))

    rows, sweep = prompt_sweep(ctx, lengths, progress)
    requests += [request_row(f"prompt {n}", t) for n, ts in sweep.items() for t in ts]
    fit = fit_growth([r["prompt_tokens"] for r in rows], [r["ttft_min_ms"] for r in rows])
    for r in rows:  # fit the fastest sample of each length: contention on a shared machine only ever adds time
        r["fit_ms"] = _fit_at(fit, r["prompt_tokens"])
    res.add_table("prompt_sweep", rows)
    res.add_table("prompt_fit", [fit])
    top = max(sweep)
    phases.append(phase_row(f"long prompt ({top} tok)", sweep[top]))

    retrieve, build_s, docs = make_retriever(cfg)
    rag = rag_requests(ctx, retrieve)
    requests += [request_row("rag", t) for t in rag]
    phases.append(phase_row(f"RAG (BM25 top-{cfg.rag_top_k})", rag))
    res.env["rag"] = {"passages": len(docs), "index_build_ms": 1e3 * build_s, "top_k": cfg.rag_top_k}
    res.add_table("phases", phases)
    res.add_table("requests", requests)

    qrows, runs = queueing_part(ctx, progress)
    requests += [request_row(k, t) for k, ts in runs.items() for t in ts]
    res.add_table("queueing", qrows)
    poisson = [k for k in runs if k.startswith("rho")]
    if poisson:
        phases.append(phase_row(f"queued at {poisson[-1]}", runs[poisson[-1]]))
    res.add_table("phases", phases)
    res.add_table("requests", requests)

    if cfg.cold_starts:
        res.add_table("cold_start", cold_start(ctx, progress, res))
    else:
        res.skip("cold_start", "--cold-starts 0")

    groups = {"chat (warm, idle)": chat, f"RAG ({rag[0].prompt_tokens} tok)": rag, f"long prompt ({top} tok)": sweep[top],
              **{f"chat, {k}": v for k, v in runs.items()}}
    res.add_table("scenarios", scenarios(groups, res.tables.get("cold_start")))
    streams = {k: v for k, v in groups.items() if not k.startswith("long prompt")}  # 1-token requests: no TPOT
    res.add_table("streaming", [{"requests": k, "metric": m, **p} for k, ts in streams.items()
                                for m, p in metrics.vllm_metrics(ts).items()])
    pick = poisson[-1] if poisson else None
    res.add_table("metric_definitions", [{"requests": pick or "chat", **r} for r in metrics.tool_metrics(runs[pick] if pick else chat)]
                  + [{"requests": "chat (idle)", **r} for r in metrics.tool_metrics(chat)])


def _stamp_cost_ns(n: int = 20000) -> float:
    t0 = time.perf_counter_ns()
    for _ in range(n):
        time.perf_counter_ns()
    return (time.perf_counter_ns() - t0) / n


def _fit_at(fit: dict, t: float) -> float:
    return fit["a_ms"] + fit["b_ms_per_tok"] * t + fit["c_ms_per_tok2"] * t * t


# ---------------------------------------------------------------- the waterfall


def scenario_bar(name: str, traces: list[Trace], cold_ms: float = 0.0, short: str = "") -> dict:
    """Mean of each layer over the requests: queue, cold start, retrieval, prefill, and the rest of the
    measured phases (template + tokenize + first sample + detokenize); `unattributed_ms` is what no stamp covered."""
    b = [t.breakdown() for t in traces]

    def m(k):
        return float(np.mean([r[k] for r in b]))

    return {"scenario": name, "bar": short or name, "queue_ms": m("queue_ms"), "cold_start_ms": cold_ms, "retrieval_ms": m("retrieval_ms"),
            "prefill_ms": m("prefill_ms"), "other_ms": m("template_tokenize_ms") + m("first_token_ms"),
            "unattributed_ms": m("unattributed_ms"), "ttft_ms": m("ttft_ms") + cold_ms, "n": len(traces)}


def scenarios(groups: dict[str, list[Trace]], cold: pd.DataFrame | None) -> list[dict]:
    """One stacked bar per scenario (means, so a bar's layers add up to its mean TTFT)."""
    rows = [scenario_bar(k, v, short=s) for (k, v), s in zip(groups.items(), _short(groups), strict=True)]
    if cold is not None and len(cold):  # everything before the warm request in a fresh process, then its phases
        c = cold.set_index("step")["median_ms"]
        rows.append(scenario_bar("chat, cold start", groups["chat (warm, idle)"], c["spawn_to_first_token"] - c["warm_ttft"],
                                 "cold"))
    return rows


def _short(groups) -> list[str]:
    """Bar labels a terminal chart can print under every bar: "chat", "RAG", "4096 tok", "rho 0.94", "burst 6"."""
    out = []
    for k in groups:
        k = k.removeprefix("chat, ")
        k = k.split(" (")[0] if k.startswith(("chat", "RAG")) else k
        k = k.replace("long prompt (", "").rstrip(")").replace("rho=", "rho ").replace("burst of", "burst")
        out.append(k)
    return out


# ---------------------------------------------------------------- judge: verdicts from the tables alone


def judge(result: LabResult) -> list[Claim]:
    if result.config.get("endpoint"):
        return _ttft_endpoint.judge(result)
    t = result.tables
    claims = [_harness(t.get("requests")), _attribution(t.get("attribution")), _napkin(t.get("prompt_sweep")),
              _queue_knee(t.get("queueing")), _worker(t.get("queueing")), _cold(t.get("cold_start"), result.skipped),
              _cold_read(t.get("cold_read"), result.skipped), _rag(t.get("phases"))]
    return claims


def _harness(req: pd.DataFrame | None) -> Claim:
    cid, text = "ttft_breakdown.phases_sum_to_ttft", "Harness check: the phases add up to the client's TTFT"
    exp = f">= {HARNESS_SHARE:.0%} of requests within {HARNESS_PCT:g}%"
    if empty_table(req):
        return Claim(cid, text, exp, "no requests", None, "no requests table")
    pct = req["unattributed_pct"].abs()
    share = float((pct <= HARNESS_PCT).mean())
    return Claim(cid, text, exp, f"{share:.0%} of {len(req)}; worst {pct.max():.2f}%", share >= HARNESS_SHARE,
                 "adjacent stamps: fails only when the OS deschedules the process between them")


def _attribution(att: pd.DataFrame | None) -> Claim:
    cid, text = "ttft_breakdown.attribution", "A delay put into one component lands in its phase only"
    if empty_table(att):
        return Claim(cid, text, "", "no attribution run", None, "no attribution table")
    null, att = att[att["injected_into"] == "none"], att[att["injected_into"] != "none"]
    delay = float(att["delay_ms"].max())
    tol = ATTRIBUTION_TOL * delay
    exp = f"+{delay:g} ms within {ATTRIBUTION_TOL:.0%} there; others gain < {tol:g} ms"
    phases = [c[2:] for c in att.columns if c.startswith("d_") and c != "d_ttft_ms"]
    noise = float(null[[f"d_{p}" for p in phases]].abs().max().max()) if len(null) else 0.0
    if noise >= tol:  # plain against plain already moves a phase by the tolerance: the machine is too noisy to tell
        return Claim(cid, text, exp, f"no delay: a phase moved {noise:.1f} ms", None,
                     f"the machine's noise exceeds {tol:g} ms (raise attribution_delay_ms)")
    worst_in, worst_out, ok = 0.0, 0.0, True
    for _, r in att.iterrows():
        hit = float(r[f"d_{r['injected_into']}_ms"])
        off = max(float(r[f"d_{p}"]) for p in phases if p != f"{r['injected_into']}_ms")  # the largest gain
        miss = abs(hit - r["delay_ms"]) / r["delay_ms"]
        worst_in, worst_out = max(worst_in, miss), max(worst_out, off)
        ok &= bool(miss <= ATTRIBUTION_TOL and off < ATTRIBUTION_TOL * r["delay_ms"])
    return Claim(cid, text, exp, f"{len(att)} phases: worst {worst_in:.1%} off; others gain <= {worst_out:.2f} ms", ok,
                 "a phase's stamps do not bracket the component that ran in it")


def _napkin(sw: pd.DataFrame | None) -> Claim:
    cid, text = "ttft_breakdown.prefill_rate_vs_napkin", "Long-prompt prefill runs near its napkin rate"
    lo, hi = NAPKIN_BAND
    exp = f"{lo:.2f}x-{hi:g}x of FLOPs / matmul rate"
    if empty_table(sw):
        return Claim(cid, text, exp, "no sweep", None, "no prompt-length sweep")
    r = sw.sort_values("prompt_tokens").iloc[-1]
    x = float(r["rate_vs_napkin"])
    return Claim(cid, text, exp, f"{x:.2f}x at {int(r['prompt_tokens'])} tok ({r['prefill_tok_per_s']:,.0f} vs "
                 f"{r['napkin_tok_per_s']:,.0f} tok/s)", lo <= x <= hi,
                 "below: overheads or attention far slower than GEMMs; above: the FLOP count misses work")


def _queue_knee(q: pd.DataFrame | None) -> Claim:
    cid, text = "ttft_breakdown.queue_knee", "Queue wait explodes as utilisation nears 1"
    pois = None if empty_table(q) else q[q["arrivals"] == "poisson"].sort_values("rho")
    if pois is None or len(pois) < 2:
        return Claim(cid, text, "Wq = rho D / (2 (1 - rho))", "one rate only", None, "needs 2+ arrival rates")
    lo, hi = pois.iloc[0], pois.iloc[-1]
    want = hi["schedule_md1_ms"] / max(lo["schedule_md1_ms"], 1e-6)
    got = hi["wait_mean_ms"] / max(lo["wait_mean_ms"], 1e-3)
    exp = f">= {QUEUE_SHARE:.0%} of ideal M/D/1's {want:.1f}x"
    meas = f"{lo['wait_mean_ms']:.0f} -> {hi['wait_mean_ms']:.0f} ms ({got:.1f}x), rho {lo['rho']:.2f} -> {hi['rho']:.2f}"
    if want < 2:
        return Claim(cid, text, exp, meas, None, "the utilisations reached span too little load")
    return Claim(cid, text, exp, meas, bool(got >= QUEUE_SHARE * want and hi["wait_mean_ms"] > lo["wait_mean_ms"]),
                 "the worker or the arrivals are not what the model assumes")


def _worker(q: pd.DataFrame | None) -> Claim:
    cid, text = "ttft_breakdown.fcfs_worker_overhead", "Harness check: queue waits follow Lindley's recursion"
    if empty_table(q):
        return Claim(cid, text, "", "no queueing run", None, "no queueing table")
    svc = float(q["service_ms"].median())
    gap, lind = float(q["harness_gap_p50_ms"].median()), float(q["lindley_p90_diff_ms"].max())
    return Claim(cid, text, "worker gap < 1 ms; p90 within 5% of a service",
                 f"gap {gap * 1e3:.0f} us; p90 off {lind:.2f} ms of {svc:.0f} ms", gap <= 1.0 and lind <= 0.05 * svc,
                 "the worker adds its own wait between requests")


def _cold(cold: pd.DataFrame | None, skipped: dict) -> Claim:
    cid, text = "ttft_breakdown.cold_start_ratio", "Cold start costs many warm requests"
    exp = f">= {COLD_MIN_X}x a warm TTFT"
    if empty_table(cold):
        return Claim(cid, text, exp, "skipped", None, skipped.get("cold_start", "no cold start run"))
    c = cold.set_index("step")["median_ms"]
    x = c["spawn_to_first_token"] / c["warm_ttft"]
    return Claim(cid, f"Cold start costs {x:.0f}x a warm request", exp,
                 f"{c['spawn_to_first_token'] / 1e3:.2f} s vs {c['warm_ttft']:.1f} ms", x >= COLD_MIN_X,
                 "" if x >= COLD_MIN_X else "a cold start this cheap means imports and weights were already warm")


def _cold_read(cr: pd.DataFrame | None, skipped: dict) -> Claim:
    cid, text = "ttft_breakdown.cold_read_from_disk", "The cold start read its weights from disk, not the page cache"
    exp = f"<= {COLD_RESIDENT_MAX:.0%} of the weights' pages cached after the drop (mincore)"
    rows = None if empty_table(cr) else cr.set_index("item")["value"]
    if rows is None or "resident_after_drop" not in rows:
        why = skipped.get("cold_start") or "no weight files (arch: random weights)"
        return Claim(cid, text, exp, "-", None, why)
    left = rows["resident_after_drop"] / 100
    return Claim(cid, text, exp, f"{left:.0%} cached; disk read {rows['disk_read']:.2f} GB/s", left <= COLD_RESIDENT_MAX,
                 "" if left <= COLD_RESIDENT_MAX else "the page cache kept the weights: the cold start read them warm")


def _rag(ph: pd.DataFrame | None) -> Claim:
    cid, text = "ttft_breakdown.rag_prefill_over_retrieval", "RAG: the long context's prefill costs more than retrieval"
    rag = None if empty_table(ph) else ph[ph["scenario"].str.startswith("RAG")]
    chat = None if empty_table(ph) else ph[ph["scenario"].str.startswith("chat")]
    if rag is None or not len(rag) or not len(chat):
        return Claim(cid, text, "extra prefill > retrieval", "no RAG run", None, "no RAG scenario")
    r, c = rag.iloc[0], chat.iloc[0]
    extra, retr = float(r["prefill_ms"] - c["prefill_ms"]), float(r["retrieval_ms"])
    return Claim(cid, text, "extra prefill > retrieval (BM25 ~1 ms)",
                 f"+{extra:.1f} ms prefill vs {retr:.2f} ms BM25 ({extra / max(retr, 1e-6):.0f}x)", extra > retr,
                 "retrieval, not the long prompt, is the cost here")


# ---------------------------------------------------------------- the report


def check(cfg: Config) -> None:
    """Before the run starts: an endpoint must answer, speak OpenAI's API and stream (else one line, exit 2)."""
    if cfg.endpoint:
        _ttft_endpoint.discover(cfg)


def exit_code(result: LabResult) -> tuple[int, str] | None:
    return _ttft_endpoint.exit_code(result) if result.config.get("endpoint") else None


def views(result: LabResult) -> list[View]:
    if result.config.get("endpoint"):
        return _ttft_endpoint.views(result)

    def by_rho(df):
        return df.sort_values("rho", na_position="last")

    def cold_rows(df):  # the steps, then spawn -> first token against the same request warm; no empty device steps
        idle = df["step"].isin(["device_init", "to_device"]) & (df["median_ms"] < 5)
        return df[~df["step"].isin(["spawn_to_exit", "first_forward_extra"]) & ~idle]

    return [
        View("1. One request, phase by phase", "Where do a request's milliseconds go before the first token?",
             "phases", (Col("scenario", "scenario", "text", 24), Col("queue_ms", "queue ms", ",.2f"),
                        Col("template_tokenize_ms", "tokenize ms", ",.2f"), Col("prefill_ms", "prefill ms", ",.1f"),
                        Col("first_token_ms", "sample ms", ",.2f"), Col("ttft_ms", "TTFT ms", ",.1f"))),
        View("2. Attribution check", "A known delay goes into one component: how far does each phase move (ms)?",
             "attribution",
             (Col("injected_into", "delay put into", "text"), Col("delay_ms", "delay", ".0f"),
              Col("d_template_tokenize_ms", "tokenize", ".2f"), Col("d_prefill_ms", "prefill", ".2f"),
              Col("d_first_token_ms", "sample", ".2f"), Col("d_ttft_ms", "TTFT", ".1f"))),
        View("3. Prompt length", "Does prefill run at the rate its FLOPs and the matmul rate predict?", "prompt_sweep",
             (Col("prompt_tokens", "prompt tokens", "int"), Col("ttft_median_ms", "TTFT ms"),
              Col("prefill_ms", "prefill ms"), Col("napkin_prefill_ms", "napkin ms"),
              Col("rate_vs_napkin", "rate / napkin", ".2f"), Col("matmul_gflop_per_s", "matmul GFLOP/s", ".0f"))),
        View("4. Queueing", "How does the wait grow as utilisation nears 1 (one FCFS worker)?", "queueing",
             (Col("arrivals", "arrivals", "text"), Col("rho", "rho", ".2f"), Col("wait_mean_ms", "mean wait ms"),
              Col("wait_p90_ms", "p90 wait ms"), Col("schedule_md1_ms", "ideal M/D/1 ms"),
              Col("expected_mean_ms", "expected mean ms")), rows=by_rho),
        View("5. Cold start", "What does a fresh process spend before its first token (weights read cold)?", "cold_start",
             (Col("phase", "step", "text", 30), Col("median_ms", "median ms", "int"),
              Col("expected", "napkin", "text", 30)), rows=cold_rows),
        View("6. Where TTFT goes", "Which layer dominates TTFT in each scenario (means, ms)?", "scenarios",
             (Col("scenario", "scenario", "text", 22), Col("queue_ms", "queue", ",.1f"),
              Col("cold_start_ms", "cold", ",.0f"), Col("retrieval_ms", "retrieval", ",.1f"),
              Col("prefill_ms", "prefill", ",.1f"), Col("other_ms", "other", ",.1f"), Col("ttft_ms", "TTFT", ",.0f")),
             chart=Chart("TTFT waterfall per scenario (ms)", "scenarios", "bar",
                         ["queue_ms", "retrieval_ms", "prefill_ms", "other_ms"], kind="stacked", xlabel="scenario")),
    ]


def layers(result: LabResult) -> dict[str, float]:
    """What each layer adds to a warm idle chat request at the worst point measured (ms)."""
    t = result.tables
    sc = t["scenarios"].set_index("scenario")
    base = float(sc["ttft_ms"].iloc[0])
    out = {}
    if "chat, cold start" in sc.index:
        out["cold start"] = float(sc.loc["chat, cold start", "cold_start_ms"])
    q = t.get("queueing")
    if not empty_table(q) and (q["arrivals"] == "poisson").any():
        out["queueing"] = float(q.loc[q["arrivals"] == "poisson", "wait_p90_ms"].max())
    sw = t.get("prompt_sweep")
    if not empty_table(sw):
        out["prompt length"] = float(sw["ttft_median_ms"].iloc[-1] - sw["ttft_median_ms"].iloc[0])
    rag = [k for k in sc.index if k.startswith("RAG")]
    if rag:
        out["RAG"] = float(sc.loc[rag[0], "ttft_ms"] - base)
    return {"base": base, **dict(sorted(out.items(), key=lambda kv: -kv[1]))}


def headline(result: LabResult, claims: list[Claim]) -> str:
    """The article's flowchart with this run's numbers: which layer dominates TTFT here."""
    if result.config.get("endpoint"):
        return _ttft_endpoint.headline(result, claims)
    if empty_table(result.tables.get("scenarios")):
        return ""
    lay = layers(result)
    base = lay.pop("base")
    if not lay:
        return f"Warm idle chat: {base:.0f} ms to the first token."
    (worst, ms), *rest = lay.items()
    tail = ", ".join(f"{k} +{_ms(v)}" for k, v in rest)
    return (f"Warm idle chat: {base:.0f} ms to the first token; {worst} adds the most "
            f"(+{_ms(ms)}, {ms / base:.0f}x){', then ' + tail if tail else ''}.")


def _ms(v: float) -> str:
    return f"{v / 1e3:.2f} s" if abs(v) >= 1000 else f"{v:.0f} ms"


def figures(result: LabResult) -> list[tuple[str, object]]:
    """The TTFT waterfall for the HTML report: one horizontal stacked bar per scenario, layers in the
    order they happen, cold start included (log-free, so the cold bar dwarfs the rest: that is the finding)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sc = result.tables.get("scenarios")
    if empty_table(sc):
        return []
    parts = [("queue_ms", "queue"), ("cold_start_ms", "cold start"), ("retrieval_ms", "retrieval"),
             ("prefill_ms", "prefill"), ("other_ms", "tokenize + first token")]
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.5), gridspec_kw={"width_ratios": [3, 2]})
    warm = sc[sc["cold_start_ms"] == 0]
    for ax, df, title in ((axes[0], warm, "warm scenarios"), (axes[1], sc, "with the cold start")):
        left = np.zeros(len(df))
        for key, label in parts:
            v = df[key].to_numpy(float)
            ax.barh(df["scenario"], v, left=left, label=label)
            left += v
        ax.invert_yaxis()
        ax.set_xlabel("ms to first token")
        ax.set_title(title, fontsize=9)
        ax.tick_params(labelsize=7)
    axes[1].set_yticklabels([])
    axes[0].legend(fontsize=7, loc="lower right")
    fig.suptitle("TTFT waterfall: where the time to first token goes", fontsize=10)
    fig.tight_layout()
    out = [("TTFT waterfall", fig)]
    sw = result.tables.get("prompt_sweep")
    if not empty_table(sw):  # prefill against its napkin time, log-log: the gap closes as compute takes over
        fig2, ax = plt.subplots(figsize=(6, 3.5))
        ax.loglog(sw["prompt_tokens"], sw["prefill_ms"], "o-", label="prefill, measured (median)")
        ax.loglog(sw["prompt_tokens"], sw["napkin_prefill_ms"], "s--", label="napkin: FLOPs / matmul rate")
        ax.set_xlabel("prompt tokens")
        ax.set_ylabel("ms")
        ax.legend(fontsize=7)
        ax.set_title("Prefill vs the napkin time", fontsize=10)
        fig2.tight_layout()
        out.append(("Prefill vs napkin", fig2))
    return out
