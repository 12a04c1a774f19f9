"""The in-process lab: one worker serves the requests, `pipeline.time_request` stamps their phases.

Parts, in the order they run: one request phase by phase and the attribution check; the prompt
sweep against its napkin (FLOPs over a matmul rate measured at the same token count); a RAG
request; Poisson arrivals and a burst into one FCFS worker; the cold start (cold.py). Every request
is a `metrics.Trace`; the tables read only Traces.

torch is imported inside the functions that use it: `llmlab --help` imports this package (for its Config).
"""

from __future__ import annotations

import itertools
import math
import time
from contextlib import nullcontext
from dataclasses import dataclass

import numpy as np
import pandas as pd

from llmlab.core.device import Device, cpu_load, torch_threads
from llmlab.core.models import load, load_tokenizer
from llmlab.core.render import track
from llmlab.core.results import LabResult
from llmlab.core.roofs import gemm_operands, matmul_fn, time_blocks
from llmlab.core.stats import summary
from llmlab.inference.retrieval import BM25, builtin_passages
from llmlab.labs.ttft_breakdown import cold, pipeline
from llmlab.labs.ttft_breakdown.config import Config
from llmlab.labs.ttft_breakdown.fits import growth_at, growth_fit
from llmlab.labs.ttft_breakdown.pipeline import QUESTIONS, Request
from llmlab.loadgen import arrivals, metrics, queueing
from llmlab.loadgen.metrics import PHASES, Trace
from llmlab.serving import chat

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

    def time_request(self, req: Request, retrieve=None, tokenizer=None) -> Trace:
        """The trace source: one request through the in-process worker (`tokenizer` replaces the real one)."""
        return pipeline.time_request(self.model, tokenizer or self.tokenizer, self.device, req, retrieve)

    def ask(self, i: int, new_tokens: int | None = None, send_ns: int = 0) -> Request:
        return Request(QUESTIONS[i % len(QUESTIONS)], new_tokens=new_tokens or self.cfg.new_tokens,
                       max_prompt_tokens=self.max_prompt, send_ns=send_ns)


def _setup(cfg: Config, device: Device, res: LabResult) -> Ctx:
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

    if device.is_cuda:
        return 0
    if cfg.threads:
        return cfg.threads
    load, cores = cpu_load()
    if load is not None and load >= cores and torch.get_num_threads() > 1:
        res.note(f"CPU oversubscribed (load {load:.1f} on {cores} cores): torch ran with 1 thread "
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
        ctx.time_request(ctx.ask(i))
    return [ctx.time_request(ctx.ask(i)) for i in range(ctx.cfg.chat_repeats)]


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
            base.append(ctx.time_request(ctx.ask(i, new_tokens=2)).breakdown())
            tok, slowed = hooks[target]()
            with slowed:
                slow.append(ctx.time_request(ctx.ask(i, new_tokens=2), tokenizer=tok).breakdown())
        row = {"injected_into": target, "delay_ms": 0.0 if target == "none" else ctx.cfg.attribution_delay_ms,
               "n": len(base), "base_ttft_ms": float(np.median([b["ttft_ms"] for b in base]))}
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

    c = ctx.model.config
    k, n = c.hidden_size, getattr(c, "intermediate_size", 4 * c.hidden_size)
    dtype = {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(next(ctx.model.parameters()).dtype, "fp32")
    gen = torch.Generator(device=ctx.device.torch).manual_seed(0)
    a, w, out = gemm_operands(t, n, k, dtype, ctx.device, gen)  # (T, H) @ (H, I) -> (T, I)
    st, _ = time_blocks(matmul_fn("torch", a, w, out), ctx.device, blocks=blocks, min_block_s=0.01)
    return 2.0 * t * k * n / (st.median / 1e3) / 1e9


def prompt_sweep(ctx: Ctx, lengths: list[int], progress) -> tuple[list[dict], dict[int, list[Trace]]]:
    ids = ctx.tokenizer(_long_text(ctx.tokenizer, max(lengths) + 64), add_special_tokens=False)["input_ids"]
    p_layers, layers, d_attn = _layer_params(ctx.model)
    rows, traces = [], {}
    for n in track(progress, lengths, "prompt-length sweep"):
        # corpus text of ~n tokens (so tokenizing it costs what an n-token prompt costs), templated, then cut to
        # exactly its last n tokens
        req = Request(ctx.tokenizer.decode(ids[: n + 8]), new_tokens=1, max_prompt_tokens=n)
        ctx.time_request(req)  # warm-up at this length (allocator, cache sizes)
        rate = matmul_gflops(ctx, n)  # measured just before its prefills
        ts, t0 = [], time.perf_counter()
        while len(ts) < ctx.cfg.sweep_repeats and (not ts or time.perf_counter() - t0 < ctx.cfg.sweep_max_s):
            ts.append(ctx.time_request(req))
        traces[n] = ts
        ttft = summary([t.ttft_ms for t in ts])
        prefill = summary([t.phase_ms("prefill") for t in ts])
        flops = napkin_flops(p_layers, layers, d_attn, n)
        napkin_ms = flops / (rate * 1e9) * 1e3
        rows.append({
            "prompt_tokens": ts[0].prompt_tokens, "n": ttft.n, "ttft_median_ms": ttft.median,
            "ttft_p10_ms": ttft.p10, "ttft_p90_ms": ttft.p90, "ttft_min_ms": ttft.min,
            "prefill_ms": prefill.median, "prefill_tok_per_s": n / (prefill.median / 1e3), "napkin_gflop": flops / 1e9,
            "matmul_gflop_per_s": rate, "napkin_prefill_ms": napkin_ms, "napkin_tok_per_s": n / napkin_ms * 1e3,
            "rate_vs_napkin": napkin_ms / prefill.median, "achieved_gflop_per_s": flops / (prefill.median / 1e3) / 1e9,
        })
    return rows, traces



# ---------------------------------------------------------------- 3. RAG


def make_retriever(cfg: Config):
    """(retrieve(question) -> user message with context, index build seconds, passages)."""
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
    ctx.time_request(ctx.ask(0), retrieve)  # warm-up at the RAG prompt length
    return [ctx.time_request(ctx.ask(i), retrieve) for i in range(ctx.cfg.chat_repeats)]


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
        return ctx.time_request(ctx.ask(next(order), send_ns=send_ns))

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


# ---------------------------------------------------------------- the run


def measure(cfg: Config, device: Device, res: LabResult, progress=None) -> None:
    """Every in-process part into `res`, with the torch thread count this machine's load allows."""
    ctx = _setup(cfg, device, res)
    ctx.threads = _threads(cfg, device, res)
    if ctx.threads:
        res.env["torch_threads"] = ctx.threads
    with torch_threads(ctx.threads or None):
        _run_parts(ctx, res, progress)


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
    fit = growth_fit([r["prompt_tokens"] for r in rows], [r["ttft_min_ms"] for r in rows])
    for r in rows:  # fit the fastest sample of each length: contention on a shared machine only ever adds time
        r["fit_ms"] = growth_at(fit, r["prompt_tokens"])
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
        res.add_table("cold_start", cold.cold_start(cfg, ctx.device, ctx.threads, progress, res))
    else:
        res.skip("cold_start", "--cold-starts 0")

    groups = {"chat (warm, idle)": chat, f"RAG ({rag[0].prompt_tokens} tok)": rag,
              f"long prompt ({top} tok)": sweep[top], **{f"chat, {k}": v for k, v in runs.items()}}
    res.add_table("scenarios", scenarios(groups, res.tables.get("cold_start")))
    streams = {k: v for k, v in groups.items() if not k.startswith("long prompt")}  # 1-token requests: no TPOT
    res.add_table("streaming", [{"requests": k, "metric": m, **p} for k, ts in streams.items()
                                for m, p in metrics.vllm_metrics(ts).items()])
    pick = poisson[-1] if poisson else None
    loaded = metrics.tool_metrics(runs[pick] if pick else chat)
    res.add_table("metric_definitions", [{"requests": pick or "chat", **r} for r in loaded]
                  + [{"requests": "chat (idle)", **r} for r in metrics.tool_metrics(chat)])


def _stamp_cost_ns(n: int = 20000) -> float:
    t0 = time.perf_counter_ns()
    for _ in range(n):
        time.perf_counter_ns()
    return (time.perf_counter_ns() - t0) / n


# ---------------------------------------------------------------- the waterfall


def scenario_bar(name: str, traces: list[Trace], cold_ms: float = 0.0, short: str = "") -> dict:
    """Mean of each layer over the requests: queue, cold start, retrieval, prefill, and the rest of the
    measured phases (template + tokenize + first sample + detokenize); `unattributed_ms` is what no stamp covered."""
    b = [t.breakdown() for t in traces]

    def m(k):
        return float(np.mean([r[k] for r in b]))

    return {"scenario": name, "bar": short or name, "queue_ms": m("queue_ms"), "cold_start_ms": cold_ms,
            "retrieval_ms": m("retrieval_ms"), "prefill_ms": m("prefill_ms"),
            "other_ms": m("template_tokenize_ms") + m("first_token_ms"), "unattributed_ms": m("unattributed_ms"),
            "ttft_ms": m("ttft_ms") + cold_ms, "n": len(traces)}


def scenarios(groups: dict[str, list[Trace]], cold: pd.DataFrame | None) -> list[dict]:
    """One stacked bar per scenario (means, so a bar's layers add up to its mean TTFT)."""
    rows = [scenario_bar(k, v, short=s) for (k, v), s in zip(groups.items(), _short(groups), strict=True)]
    if cold is not None and len(cold):  # everything before the warm request in a fresh process, then its phases
        c = cold.set_index("step")["median_ms"]
        cold_ms = c["spawn_to_first_token"] - c["warm_ttft"]
        rows.append(scenario_bar("chat, cold start", groups["chat (warm, idle)"], cold_ms, "cold"))
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


