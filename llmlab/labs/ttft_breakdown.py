"""Lab: where time to first token goes — queueing, cold start, prompt length (prefill), RAG.

Two chatbots can take the same 4 s for an answer while one feels snappy: its first word arrives
in 200 ms. TTFT hides four layers, and this lab measures each on your machine:

1. one request, phase by phase (template + tokenize, queue, prefill, first sample + detokenize),
   each phase with its own stamps, so the phases must add up to the client-measured TTFT and the
   remainder is the harness's own overhead;
2. cold start in a fresh process: interpreter, imports, tokenizer, weights, device, first forward;
3. prompt length: TTFT from 16 tokens to --prompt-len, fitted as a + bT + cT^2;
4. queueing: Poisson arrivals at rising utilisation (and a burst) in front of one FCFS worker,
   against M/D/1; and a RAG request (BM25 retrieval + long context) next to the plain chat.

Streaming metrics follow vLLM's benchmark_serving; see llmlab/inference/serving.py for the
definitions and how GenAI-Perf, llmperf and guidellm differ.

References:
- vLLM benchmarks/benchmark_serving.py (TTFT, TPOT, ITL, E2EL; Poisson arrivals, burstiness)
- Kleinrock, Queueing Systems vol. 1 (1975): M/D/1 and M/M/1 mean waits (Pollaczek-Khinchine)
- Robertson & Zaragoza (2009), BM25
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass

import numpy as np

from llmlab.core.device import Device, torch_threads
from llmlab.core.render import track
from llmlab.core.results import Chart, LabResult
from llmlab.core.timing import summarize
from llmlab.inference import serving
from llmlab.inference.serving import Request, Trace

LAB = "ttft-breakdown"
VERSION = 1

# The chat questions every scenario asks (cycled), so chat, RAG and the queue serve the same work.
QUESTIONS = (
    "What does the with statement do with __enter__ and __exit__?",
    "How does a for loop use the iterator protocol?",
    "What is the difference between is and == when comparing objects?",
    "How do keyword-only arguments work in a function definition?",
    "What happens when an exception is raised inside a try statement with finally?",
)
NVME_GBPS = 2.0  # an assumed cold read from a PCIe 3 NVMe SSD, for the weight-loading napkin math


@dataclass(frozen=True)
class Config:
    model: str = "tiny"  # the built-in trained pair's target: loads offline in seconds
    prompt_len: int = 4096  # the longest prompt of the sweep (the article's `--prompt-len 4096`)
    sweep_points: int = 7  # prompt lengths, geometric from 16 to prompt_len: enough to fit a + bT + cT^2
    sweep_repeats: int = 3  # TTFT samples per prompt length (median, p10/p90)
    sweep_max_s: float = 30.0  # stop repeating a prompt length after this long (at least one sample)
    chat_repeats: int = 7  # warm repeats of the plain chat and the RAG request
    new_tokens: int = 16  # streamed tokens per request (TPOT and ITL need at least 2)
    utilizations: tuple[float, ...] = (0.3, 0.5, 0.7, 0.8, 0.9, 0.95)  # rho targets; rate = rho / measured service time
    rates: tuple[float, ...] = ()  # explicit arrival rates (requests/s): replace the utilisation sweep when given
    requests_per_rate: int = 30  # bounded, so rho = 0.95 still ends in about n x service / rho
    burst: int = 12  # requests arriving at the same instant (0 = skip)
    rag_top_k: int = 6  # BM25 passages put into the RAG prompt
    rag_context_tokens: int = 1536  # budget for the retrieved context (~4 characters per token)
    cold_starts: int = 3  # fresh-process cold starts, each several seconds (0 = skip)
    threads: int = 0  # torch CPU threads; 0 = auto: torch's default, or 1 when the CPU is oversubscribed
    seed: int = 0  # arrival schedules and the M/D/1 simulation

    def __post_init__(self):
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
        if not (self.rates or self.utilizations):
            raise ValueError("give at least one arrival rate or utilisation")
        for name, lo in (("new_tokens", 2), ("threads", 0), ("requests_per_rate", 2), ("sweep_points", 1), ("sweep_repeats", 1),
                         ("chat_repeats", 1), ("rag_top_k", 1), ("rag_context_tokens", 16), ("burst", 0),
                         ("cold_starts", 0)):
            if getattr(self, name) < lo:
                raise ValueError(f"{name} must be at least {lo}, got {getattr(self, name)}")

    @classmethod
    def quick(cls) -> Config:
        return cls(sweep_points=4, sweep_repeats=2, sweep_max_s=1.5, chat_repeats=3, new_tokens=8, utilizations=(0.3, 0.95),
                   requests_per_rate=16, burst=6, rag_top_k=4, rag_context_tokens=512, cold_starts=1)


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

    def serve(self, req: Request, retrieve=None) -> Trace:
        return serving.serve(self.model, self.tokenizer, self.device, req, retrieve)

    def ask(self, i: int, new_tokens: int | None = None, send_ns: int = 0) -> Request:
        return Request(QUESTIONS[i % len(QUESTIONS)], new_tokens=new_tokens or self.cfg.new_tokens,
                       max_prompt_tokens=self.max_prompt, send_ns=send_ns)


def _setup(cfg: Config, device: Device, res: LabResult) -> Ctx:
    from llmlab.core.models import load, load_tokenizer

    lm = load(cfg.model, device)
    tokenizer = lm.tokenizer
    if tokenizer is None:  # arch: random weights
        tokenizer = load_tokenizer("tiny")
        res.note(f"{cfg.model} has random weights: timings only, never a quality claim; the text side "
                 "uses the built-in tiny tokenizer (its ids fit any registry vocabulary)")
    ctx_len = int(getattr(lm.config, "max_position_embeddings", 0) or 2048)
    tokenizer.model_max_length = 2**62  # we clamp to the context ourselves (Request.max_prompt_tokens): no warning
    res.env["model"] = {"ref": cfg.model, "kind": lm.kind, "n_params": lm.n_params, "context": ctx_len,
                        "timing_only": lm.timing_only}
    text, how = serving.render_chat(tokenizer, serving.SYSTEM, "{user}")
    if how != "tokenizer":
        res.note("the tokenizer has no chat template: prompts use llmlab's plain-text template "
                 + repr(serving.CHAT_TEMPLATE) + " (its markers are ordinary text to this tokenizer)")
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
        res.note(f"the CPU is oversubscribed (load average {load:.1f} on {cores} cores): torch runs with 1 thread, "
                 "since OpenMP threads that wait for descheduled peers make every forward many times slower "
                 "(--threads N overrides)")
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


def _phase_row(scenario: str, traces: list[Trace]) -> dict:
    rows = [t.breakdown() for t in traces]
    med = {k: float(np.median([r[k] for r in rows])) for k in rows[0]}
    worst = max(rows, key=lambda r: abs(r["unattributed_pct"]))["unattributed_pct"]
    return {"scenario": scenario, "n": len(traces), "prompt_tokens": int(np.median([t.prompt_tokens for t in traces])),
            **{k: v for k, v in med.items() if k != "unattributed_pct"}, "worst_unattributed_pct": worst}


def single_request(ctx: Ctx, res: LabResult) -> list[Trace]:
    """Warm up, then the same plain chat request `chat_repeats` times, idle server."""
    for i in range(2):
        ctx.serve(ctx.ask(i))
    return [ctx.serve(ctx.ask(i)) for i in range(ctx.cfg.chat_repeats)]


# ---------------------------------------------------------------- 2. prompt length


def _layer_params(model) -> tuple[int, int, int]:
    """(parameters inside the decoder layers, layers, heads x head_dim): the napkin FLOP terms."""
    c = model.config
    p = sum(t.numel() for n, t in model.named_parameters() if ".layers." in n)
    heads = c.num_attention_heads
    return p, c.num_hidden_layers, heads * (getattr(c, "head_dim", None) or c.hidden_size // heads)


def prompt_sweep(ctx: Ctx, lengths: list[int], res: LabResult, progress) -> tuple[list[dict], dict[int, list[Trace]]]:
    from llmlab.core.specs import peak_for

    ids = ctx.tokenizer(_long_text(ctx.tokenizer, max(lengths) + 64), add_special_tokens=False)["input_ids"]
    p_layers, layers, d_attn = _layer_params(ctx.model)
    peak, _ = peak_for(ctx.device, "fp32")
    if peak and ctx.threads:  # the share of the chip's peak that this many threads can reach
        from llmlab.core.device import cpu_cores

        peak *= min(ctx.threads, cpu_cores()["physical"]) / cpu_cores()["physical"]
    rows, traces = [], {}
    for n in track(progress, lengths, "prompt-length sweep"):
        # corpus text of ~n tokens (so tokenizing it costs what an n-token prompt costs), templated, then cut to
        # exactly its last n tokens
        req = Request(ctx.tokenizer.decode(ids[: n + 8]), new_tokens=1, max_prompt_tokens=n)
        ts, t0 = [], time.perf_counter()
        while len(ts) < ctx.cfg.sweep_repeats and (not ts or time.perf_counter() - t0 < ctx.cfg.sweep_max_s):
            ts.append(ctx.serve(req))
        traces[n] = ts
        ttft = summarize([t.ttft_ms for t in ts])
        prefill = summarize([t.phase_ms("prefill") for t in ts])
        flops = 2 * p_layers * n + 2 * layers * d_attn * n * n  # matmuls + causal attention (QK^T and AV)
        rows.append({
            "prompt_tokens": ts[0].prompt_tokens, "n": ttft.n, "ttft_median_ms": ttft.median_ms, "ttft_p10_ms": ttft.p10_ms,
            "ttft_p90_ms": ttft.p90_ms, "ttft_min_ms": ttft.min_ms, "prefill_ms": prefill.median_ms,
            "prefill_tok_per_s": n / prefill.median_s, "napkin_gflop": flops / 1e9,
            "gflops_achieved": flops / prefill.median_s / 1e9,
            "pct_of_peak": 100 * flops / prefill.median_s / 1e9 / peak if peak else math.nan,
        })
    return rows, traces


def fit_growth(x, y) -> dict:
    """Non-negative least squares on relative error: y ~ a + bT + cT^2, and the linear-only fit."""
    from scipy.optimize import nnls

    x, y = np.asarray(x, float), np.asarray(y, float)
    w = 1.0 / y
    A = np.stack([np.ones_like(x), x, x * x], 1)
    (a, b, c), _ = nnls(A * w[:, None], y * w)
    (a1, b1), _ = nnls(A[:, :2] * w[:, None], y * w)
    if c * x.max() ** 2 <= 1e-9 * y.max():  # round-off, not a T^2 term
        c = 0.0
    n10 = 0.1 * b / c if c > 0 else math.inf  # where the T^2 term adds 10% to the linear one
    return {"a_ms": a, "b_ms_per_tok": b, "c_ms_per_tok2": c, "a_lin_ms": a1, "b_lin_ms_per_tok": b1,
            "linear_until_tokens": n10}


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
        return serving.RAG_USER.format(context=context, question=question)

    return retrieve, build_s, docs, index


def rag_requests(ctx: Ctx, retrieve) -> list[Trace]:
    ctx.serve(ctx.ask(0), retrieve)  # warm-up at the RAG prompt length
    return [ctx.serve(ctx.ask(i), retrieve) for i in range(ctx.cfg.chat_repeats)]


# ---------------------------------------------------------------- 4. queueing


def queueing(ctx: Ctx, res: LabResult, progress) -> tuple[list[dict], dict[str, list[Trace]]]:
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
    unit = serving.poisson_offsets(1.0, cfg.requests_per_rate, rng)
    for target in track(progress, list(cfg.rates or cfg.utilizations), "Poisson arrivals"):
        service_s = float(np.median(recent))
        rate = target if cfg.rates else target / service_s
        offsets = unit / rate
        ts = serving.run_fcfs(offsets, one)
        row = _queue_row("poisson", rate, offsets, ts, rng)
        runs[f"rho={row['rho']:.2f}"] = ts
        rows.append({**row, "target": target})
        recent = [t.service_ms / 1e3 for t in ts]
    if cfg.burst:
        ts = serving.run_fcfs(serving.burst_offsets(cfg.burst), one)
        runs[f"burst of {cfg.burst}"] = ts
        rows.append(_queue_row("burst", math.inf, np.zeros(cfg.burst), ts, rng))
    return rows, runs


def _queue_row(kind: str, rate: float, offsets, ts: list[Trace], rng) -> dict:
    waits = [t.queue_ms for t in ts]
    svc_s = np.array([t.service_ms for t in ts]) / 1e3
    D = float(svc_s.mean())
    lind = serving.lindley(offsets, svc_s) * 1e3
    row = {"arrivals": kind, "n": len(ts), "rate_per_s": rate, "rho": math.nan, "service_ms": 1e3 * D,
           "service_cv": float(svc_s.std() / D),
           **{f"wait_{k}": v for k, v in serving.pct(waits).items() if k != "n"}}
    if kind == "burst":
        row["expected_mean_ms"] = 1e3 * D * (len(ts) - 1) / 2  # the k-th waits k services
    else:
        rho = rate * D  # measured: the arrival rate x this run's mean service time
        row.update(rho=rho, expected_mean_ms=1e3 * serving.finite_run_waits(rate, svc_s, len(ts), 2000, rng)["mean_s"],
                   schedule_md1_ms=1e3 * float(serving.lindley(offsets, np.full(len(ts), D)).mean()),
                   md1_ms=1e3 * serving.md1_wait(rho, D), mg1_ms=1e3 * serving.mg1_wait(rate, svc_s),
                   mm1_ms=1e3 * serving.mm1_wait(rho, D))
    # the harness check: FCFS waits are Lindley's recursion of the measured services, plus the worker's own
    # gap between a request's end (or its arrival, when idle: the wake-up lateness) and the next start
    diff = np.abs(lind - waits)
    gaps = [(t.start_ns - max(t.send_ns, ts[k - 1].end_ns if k else 0)) / 1e6 for k, t in enumerate(ts)]
    row.update(lindley_p90_diff_ms=float(np.quantile(diff, 0.9)), harness_gap_p50_ms=float(np.median(gaps)),
               harness_gap_max_ms=float(max(gaps)))
    return {k: (math.nan if isinstance(v, float) and math.isinf(v) else v) for k, v in row.items()}


# ---------------------------------------------------------------- 5. cold start


def cold_start(ctx: Ctx, res: LabResult, progress) -> tuple[list[dict], dict]:
    cfg = ctx.cfg
    runs = [serving.cold_start(cfg.model, ctx.device.spec, QUESTIONS[0], cfg.new_tokens, 3, ctx.threads)
            for _ in track(progress, range(cfg.cold_starts), "cold starts (fresh processes)")]
    steps = ["start", "import_torch", "import_transformers", "import_llmlab", "device_init", "load_tokenizer",
             "read_weights", "to_device", "first_token"]
    labels = {"start": "interpreter start (spawn -> first line)", "import_torch": "import torch",
              "import_transformers": "import transformers",
              "import_llmlab": "import llmlab + transformers' model classes (lazy)",
              "device_init": "device init (CUDA context)", "load_tokenizer": "load tokenizer",
              "read_weights": "read weights + build model", "to_device": "move weights to device",
              "first_token": "first request (first forward: warm-up)"}
    wb = runs[0]["weight_bytes"]
    warm_ttft = float(np.median([w["ttft_ms"] for r in runs for w in r["warm"]]))
    warm_prefill = float(np.median([w["prefill_ms"] for r in runs for w in r["warm"]]))
    expected = {"read_weights": f"{wb / 1e6:.1f} MB at {NVME_GBPS:g} GB/s (cold NVMe) = {wb / NVME_GBPS / 1e6:.1f} ms",
                "first_token": f"warm TTFT {warm_ttft:.1f} ms", "to_device": "0 on the CPU (no copy)"}
    rows = []
    for i, step in enumerate(steps):  # each step lasts from the previous stamp (the spawn for the first) to its own
        ms = [(r["stamps"][step] - (r["stamps"][steps[i - 1]] if i else r["spawn_ns"])) / 1e6 for r in runs]
        rows.append({"phase": labels[step], **_stats(ms), "expected": expected.get(step, "")})
    totals = {
        "spawn -> first token (parent clock)": [(r["stamps"]["first_token"] - r["spawn_ns"]) / 1e6 for r in runs],
        "spawn -> process exit (parent wall)": [(r["exit_ns"] - r["spawn_ns"]) / 1e6 for r in runs],
        "first forward's extra (cold - warm prefill)": [r["cold"]["prefill_ms"] - warm_prefill for r in runs],
        "the same request, warm (in the child)": [w["ttft_ms"] for r in runs for w in r["warm"]],
    }
    rows += [{"phase": k, **_stats(v), "expected": ""} for k, v in totals.items()]
    summary = {"to_first_token_ms": float(np.median(totals["spawn -> first token (parent clock)"])),
               "warm_ttft_ms": warm_ttft, "warm_prefill_ms": warm_prefill, "weight_bytes": wb, "n": len(runs)}
    return rows, summary


def _stats(ms: list[float]) -> dict:
    return {"median_ms": float(np.median(ms)), "min_ms": float(min(ms)), "max_ms": float(max(ms)), "n": len(ms)}


# ---------------------------------------------------------------- the run


def run(cfg: Config, device: Device, progress=None) -> LabResult:
    """Measures. Returns data. Never prints."""

    res = LabResult.new(LAB, VERSION, cfg)
    with res.guard():
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
    found: dict = {"all": []}  # every served request, for the "phases add up" check

    chat = single_request(ctx, res)
    found["chat"] = chat
    found["all"] += chat
    phases = [_phase_row("chat (warm, idle)", chat)]
    res.add_table("phases", phases)
    res.note(f"harness: one perf_counter_ns stamp costs {_stamp_cost_ns():.0f} ns; a request takes "
             "2 stamps per phase, and the client stamps each token as it is received")

    rows, sweep = prompt_sweep(ctx, lengths, res, progress)
    found["all"] += [t for ts in sweep.values() for t in ts]
    # fit the fastest sample of each length: contention on a shared machine only ever adds time
    fit = fit_growth([r["prompt_tokens"] for r in rows], [r["ttft_min_ms"] for r in rows])
    for r in rows:
        t = r["prompt_tokens"]
        r["fit_ms"] = _fit_at(fit, t)
        r["linear_fit_ms"] = fit["a_lin_ms"] + fit["b_lin_ms_per_tok"] * t
    res.add_table("prompt_sweep", rows)
    res.note("prompt_sweep: napkin_gflop = 2 P T (decoder-layer matmuls) + 2 L d T^2 (causal QK^T and AV); "
             "pct_of_peak is against the FP32 peak of the cores torch uses (threads / cores x the chip's peak)")
    res.add_table("prompt_fit", [fit])
    res.charts.append(Chart("TTFT vs prompt length (measured median and min, a+bT+cT^2 fit of the min)",
                            "prompt_sweep", "prompt_tokens", ["ttft_median_ms", "ttft_min_ms", "fit_ms", "linear_fit_ms"],
                            logx=True, logy=True,
                            xlabel="prompt tokens (log)", ylabel="TTFT ms (log)"))
    top = max(sweep)
    phases.append(_phase_row(f"long prompt ({top} tokens)", sweep[top]))

    retrieve, build_s, docs, _ = make_retriever(cfg)
    rag = rag_requests(ctx, retrieve)
    found["rag"] = rag
    found["all"] += rag
    phases.append(_phase_row(f"RAG (BM25 top-{cfg.rag_top_k})", rag))
    res.note(f"RAG: BM25 index over {len(docs)} passages of the built-in corpus's help topics, built once in "
             f"{1e3 * build_s:.0f} ms (not part of any request); each request retrieves, then prompts with the context")
    res.add_table("phases", phases)

    qrows, runs = queueing(ctx, res, progress)
    found["queue"] = runs
    found["all"] += [t for ts in runs.values() for t in ts]
    res.add_table("queueing", qrows)
    res.charts.append(Chart("queue wait vs utilisation (one FCFS worker)", "queueing", "rho",
                            ["wait_mean_ms", "wait_p90_ms", "expected_mean_ms", "md1_ms"], kind="line",
                            xlabel="utilisation rho = lambda x mean service time", ylabel="queue wait ms"))
    poisson = [k for k in runs if k.startswith("rho")]
    if poisson:
        phases.append(_phase_row(f"queued at {poisson[-1]}", runs[poisson[-1]]))
    res.add_table("phases", phases)

    cold_rows, cold = cold_start(ctx, res, progress) if cfg.cold_starts else ([], None)
    if cold_rows:
        res.add_table("cold_start", cold_rows)
        res.note("cold start: the weights are most likely in the OS page cache (read before by this run), so "
                 "'read weights' is the best case; a cold disk adds bytes / disk bandwidth (the napkin column)")

    res.add_table("scenarios", scenarios(found, cold, top, sweep[top]))
    res.charts.append(Chart("where TTFT goes, per scenario (ms)", "scenarios", "scenario",
                            ["queue_ms", "cold_start_ms", "retrieval_ms", "prefill_ms", "other_ms"], kind="stacked"))
    res.add_table("streaming", streaming_rows(found))
    pick = runs[poisson[-1]] if poisson else chat
    res.add_table("metric_definitions", [{"requests": poisson[-1] if poisson else "chat", **r}
                                         for r in serving.tool_metrics(pick)]
                  + [{"requests": "chat (idle)", **r} for r in serving.tool_metrics(chat)])
    res.note("definitions: TTFT = first token received - sent; TPOT = (E2EL - TTFT)/(n - 1); ITL = each gap between "
             "tokens, pooled; E2EL = last token - sent (vLLM benchmark_serving). GenAI-Perf's 'inter token latency' "
             "is vLLM's TPOT; llmperf's inter_token_latency and guidellm's time_per_output_token include the TTFT "
             "(divided by n); guidellm's inter_token_latency_ms is vLLM's TPOT. Table metric_definitions shows "
             "all of them on the same requests: under queueing they disagree by the queue wait / n")
    claims(res, found, fit, rows, qrows, cold, ctx, len(docs))
    res.note(diagnosis(found, cold, rows, qrows, phases))


def _stamp_cost_ns(n: int = 20000) -> float:
    t0 = time.perf_counter_ns()
    for _ in range(n):
        time.perf_counter_ns()
    return (time.perf_counter_ns() - t0) / n


# ---------------------------------------------------------------- summaries


def _bar(name: str, traces: list[Trace], cold_ms: float = 0.0) -> dict:
    b = [t.breakdown() for t in traces]

    def m(k):
        return float(np.mean([r[k] for r in b]))

    ttft = m("ttft_ms") + cold_ms
    parts = {"queue_ms": m("queue_ms"), "cold_start_ms": cold_ms, "retrieval_ms": m("retrieval_ms"),
             "prefill_ms": m("prefill_ms")}
    return {"scenario": name, **parts, "other_ms": ttft - sum(parts.values()), "ttft_ms": ttft, "n": len(traces)}


def scenarios(found: dict, cold: dict | None, top: int, long: list[Trace]) -> list[dict]:
    """One stacked bar per scenario (means, so the parts add up to the mean TTFT)."""
    rows = [_bar("chat (warm, idle)", found["chat"]), _bar(f"RAG chat (BM25, {found['rag'][0].prompt_tokens} tok)", found["rag"]),
            _bar(f"long prompt ({top} tok)", long)]
    rows += [_bar(f"chat, {k}", v) for k, v in found["queue"].items()]
    if cold:  # the warm request's parts + everything before it in a fresh process
        rows.append(_bar("chat, cold start", found["chat"], cold["to_first_token_ms"] - cold["warm_ttft_ms"]))
    return rows


def streaming_rows(found: dict) -> list[dict]:
    groups = {"chat (warm, idle)": found["chat"], "RAG chat": found["rag"], **found["queue"]}
    rows = []
    for name, ts in groups.items():
        for metric, p in serving.vllm_metrics(ts).items():
            rows.append({"requests": name, "metric": metric, **p})
    return rows


# ---------------------------------------------------------------- claims and diagnosis


def claims(res: LabResult, found: dict, fit: dict, sweep_rows: list[dict], qrows: list[dict], cold: dict | None,
           ctx: Ctx, retrieval_docs: int) -> None:
    allt = found["all"]
    pcts = np.array([100 * t.unattributed_ms / t.ttft_ms for t in allt])
    within = float(np.mean(np.abs(pcts) <= 2.0))
    res.claim("The phases add up to the measured TTFT",
              "within 2% for (at least 95% of) the requests: each phase has its own stamps, the remainder is "
              "harness code between them, and the OS descheduling the process there",
              f"{100 * within:.1f}% of {len(allt)} requests within 2%; median remainder {np.median(pcts):+.3f}% "
              f"({np.median([t.unattributed_ms * 1e3 for t in allt]):.0f} us); worst {pcts[np.argmax(np.abs(pcts))]:+.2f}%",
              within >= 0.95)

    p_layers, layers, d_attn = _layer_params(ctx.model)
    napkin_n = 0.1 * p_layers / (layers * d_attn)
    top = sweep_rows[-1]["prompt_tokens"]
    n_fit = fit["linear_until_tokens"]
    if len(sweep_rows) < 3:
        res.claim("TTFT grows linearly with prompt length here up to N tokens", f"~{napkin_n:.0f} tokens (napkin)",
                  "needs 3+ prompt lengths", None, "not measured: the sweep has fewer than 3 points")
    else:
        resid = max(abs(r["fit_ms"] / r["ttft_min_ms"] - 1) for r in sweep_rows)
        shown = f"{n_fit:.0f}" if math.isfinite(n_fit) else f"{top} (no T^2 term found)"
        knee = f"T^2 adds 10% at {n_fit:.0f} tokens ({n_fit / napkin_n:.1f}x the napkin)" if math.isfinite(n_fit) \
            else f"no T^2 term up to {top}"
        res.claim(f"TTFT grows linearly with prompt length here up to ~{shown} tokens",
                  f"a + bT + cT^2 fits; if attention (2 L d T^2 = {2 * layers * d_attn} T^2 FLOPs) and the matmuls "
                  f"(2 P T = {2 * p_layers / 1e6:.1f}M T) ran at the same FLOP rate, T^2 would add 10% at "
                  f"0.1 P/(L d) = {napkin_n:.0f} tokens",
                  f"a = {fit['a_ms']:.1f} ms, b = {fit['b_ms_per_tok'] * 1e3:.1f} us/token, c = "
                  f"{fit['c_ms_per_tok2'] * 1e6:.2f} ns/token^2: {knee}; worst fit residual {100 * resid:.0f}%",
                  resid <= 0.20, "verdict: the fit is within 20% at every prompt length (of the fastest sample; "
                  "short prompts vary by 10-15% from run to run on a shared CPU)")

    pois = sorted((r for r in qrows if r["arrivals"] == "poisson"), key=lambda r: r["rho"])
    if len(pois) >= 2:
        lo, hi = pois[0], pois[-1]
        exp_ratio = hi["schedule_md1_ms"] / max(lo["schedule_md1_ms"], 1e-6)
        ratio = hi["wait_mean_ms"] / max(lo["wait_mean_ms"], 1e-3)
        res.claim("Queue wait explodes as utilisation nears 1",
                  f"steady state M/D/1 Wq = rho D/(2(1-rho)): {lo['md1_ms']:.0f} -> {hi['md1_ms']:.0f} ms (the knee: "
                  f"Wq = D at rho = 2/3); {hi['n']} arrivals into an empty queue: {lo['expected_mean_ms']:.0f} -> "
                  f"{hi['expected_mean_ms']:.0f} ms on average over arrival patterns, {lo['schedule_md1_ms']:.0f} -> "
                  f"{hi['schedule_md1_ms']:.0f} ms ({exp_ratio:.1f}x) for these arrival times and a constant service",
                  f"mean wait {lo['wait_mean_ms']:.0f} ms at rho = {lo['rho']:.2f} -> {hi['wait_mean_ms']:.0f} ms at "
                  f"rho = {hi['rho']:.2f} ({ratio:.1f}x); p99 {lo['wait_p99_ms']:.0f} -> {hi['wait_p99_ms']:.0f} ms "
                  f"(service {hi['service_ms']:.0f} ms)",
                  (ratio >= 0.5 * exp_ratio and hi["wait_mean_ms"] > lo["wait_mean_ms"]) if exp_ratio >= 2 else None,
                  "verdict: at least half the growth an ideal M/D/1 server shows on the same arrival times"
                  if exp_ratio >= 2 else f"not measured: the utilisations reached ({lo['rho']:.2f}-{hi['rho']:.2f}; the "
                  "service time moved with the machine's load) span too little load to test it")
    else:
        res.claim("Queue wait explodes as utilisation nears 1", "Wq = rho D/(2(1-rho))", "one rate only", None,
                  "not measured: needs two or more arrival rates")
    lind = max(r["lindley_p90_diff_ms"] for r in qrows)
    gap = float(np.median([r["harness_gap_p50_ms"] for r in qrows]))
    worst = max(r["harness_gap_max_ms"] for r in qrows)
    svc = float(np.median([r["service_ms"] for r in qrows]))
    res.claim("The worker adds almost nothing of its own: queue waits follow Lindley's recursion of the measured services",
              "the worker's gap between one request's end (or an arrival) and the next start under 1 ms; "
              "Lindley within 5% of a service at p90",
              f"gap median {gap * 1e3:.0f} us, worst {worst:.1f} ms (the OS descheduling the process); Lindley p90 "
              f"difference {lind:.2f} ms (service ~{svc:.0f} ms)", gap <= 1.0 and lind <= 0.05 * svc)

    if cold:
        x = cold["to_first_token_ms"] / cold["warm_ttft_ms"]
        res.claim(f"Cold start costs {x:.0f}x a warm request",
                  ">= 10x: importing torch + transformers alone takes seconds, a warm request tens of ms",
                  f"spawn -> first token {cold['to_first_token_ms'] / 1e3:.2f} s vs warm TTFT "
                  f"{cold['warm_ttft_ms']:.1f} ms (median of {cold['n']} cold starts)", x >= 10)
    else:
        res.claim("Cold start costs Nx a warm request", ">= 10x", "skipped", None, "not measured: --cold-starts 0")

    chat, rag = found["chat"], found["rag"]
    retr = float(np.median([t.phase_ms("retrieval") for t in rag]))
    extra = float(np.median([t.phase_ms("prefill") for t in rag]) - np.median([t.phase_ms("prefill") for t in chat]))
    res.claim("In the RAG chatbot the long context's prefill costs more than the retrieval itself",
              f"BM25 over {retrieval_docs} passages in Python: ~1 ms; +{rag[0].prompt_tokens - chat[0].prompt_tokens} "
              f"prompt tokens of prefill: {_fit_at(fit, rag[0].prompt_tokens) - _fit_at(fit, chat[0].prompt_tokens):.0f} ms "
              "by the prompt-length fit",
              f"retrieval {retr:.2f} ms vs extra prefill {extra:.1f} ms ({extra / max(retr, 1e-6):.0f}x)", extra > retr)


def _fit_at(fit: dict, t: float) -> float:
    return fit["a_ms"] + fit["b_ms_per_tok"] * t + fit["c_ms_per_tok2"] * t * t


def diagnosis(found: dict, cold: dict | None, sweep_rows: list[dict], qrows: list[dict], phases: list[dict]) -> str:
    """The article's flowchart, in words, with this run's numbers: which layer dominates TTFT."""
    base = float(np.mean([t.ttft_ms for t in found["chat"]]))
    pois = [r for r in qrows if r["arrivals"] == "poisson"]
    layers = {
        "cold start (first request after a start)": (cold["to_first_token_ms"] - cold["warm_ttft_ms"]) if cold else 0.0,
        "queueing (traffic near capacity)": max(r["wait_p90_ms"] for r in pois) if pois else 0.0,
        "prompt length (prefill)": sweep_rows[-1]["ttft_median_ms"] - sweep_rows[0]["ttft_median_ms"],
        "extra steps (RAG)": float(np.mean([t.ttft_ms for t in found["rag"]])) - base,
    }
    ranked = sorted(layers.items(), key=lambda kv: -kv[1])
    worst, worst_ms = ranked[0]
    return (
        "diagnosis (the flowchart): 1) only the first request after a deploy or scale-up is slow -> cold start "
        "(keep replicas warm, load weights faster, pre-compile); 2) TTFT grows with traffic while prefill stays flat "
        "-> queueing (more replicas, batching, admission control); 3) TTFT grows with prompt tokens -> prefill "
        "(shorter prompts, prefix caching, chunked prefill); 4) time passes before the model sees the prompt -> extra "
        f"steps such as retrieval (cache, parallelise, fewer passages). This run: a warm idle chat request takes "
        f"{base:.0f} ms; added on top by each layer at the worst point measured: "
        + "; ".join(f"{k} +{v:.0f} ms" for k, v in ranked)
        + f". The dominant layer here is {worst} (+{worst_ms:.0f} ms, {worst_ms / base:.0f}x the warm request)."
    )
