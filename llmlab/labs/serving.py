"""Lab: serving — batching, concurrency, KV capacity, prefix reuse, chunked prefill, cost per token.

The series' production half, measured on llmlab's own paged, continuously batching engine
(llmlab.serving.engine.llm_engine, checked against HF at every computed position before any timing), or on
any OpenAI-compatible server with --endpoint URL (parts 1 and 4; the others need the engine's internals).

The model: the built-in `tiny` on a CPU. On CUDA the default `tiny` (23 MB) would sit in the GPU's
L2, where decode is not memory-bound as it is for a real model, so the engine's parts run an `arch:`
model (random weights: timings only) in BF16, as many of its layers as fit in half the free memory;
the output names it and its weights' size against the L2.

Parts:
1. concurrency sweep, closed loop (N clients, each sends its next request when the last ends):
   output tokens/s, TTFT / ITL / TPOT p50 and p99 (vLLM bench serve's definitions: the engine's
   per-request stamps go through the same `calculate_metrics` as an HTTP client's), step time vs
   decodes per step, and per level: compute utilisation (2 N FLOPs per token x tokens/s over peak),
   bandwidth utilisation (weights + KV read per step / step time over the bandwidth) and the device's
   own busy reading (NVML utilisation on a GPU; CPU time over wall time on a CPU): one request at a
   time leaves the FLOPs unused while the device looks busy.
2. static vs continuous batching under Poisson arrivals with mixed output lengths: static at its best
   (dynamic fill: whatever is queued when the engine is idle, up to B, after a max wait swept from 0),
   TTFT p50/p99, and static batching's wasted slots (finished-but-waiting rows) from the step records.
3. KV capacity: pools of several sizes at fixed weights, many long conversations; the peak of running
   sequences against blocks / blocks per conversation, and the preemptions past it; Llama 2 7B vs
   Llama 3 8B on an 80 GB GPU by formula.
4. prefix reuse: N requests sharing a system prompt of L tokens, prefix cache off and on.
5. chunked prefill: the ITL of running decodes while a long prompt is prefilled in one step vs in chunks.
6. cost per token: price per hour / (3600 x tokens/s), at concurrency 1 and at the best.

References: vLLM benchmarks/serve.py (metric definitions); "Inside vLLM: Anatomy of a
High-Throughput LLM Inference System" (2025: the step-time knee, chunked prefill); Orca (OSDI '22,
iteration-level scheduling); vLLM docs "Optimization and Tuning: chunked prefill" and
"Disaggregated prefilling"; nano-vllm.
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass

import numpy as np

from llmlab.core.device import Device, torch_threads
from llmlab.core.errors import UsageError
from llmlab.core.results import Chart, Claim, Col, LabResult, View

LAB = "serving"
VERSION = 2  # 2: exactness at every computed position, busy reading, static at its best, pools swept, GPU arch model
JUDGE_VERSION = 2
COMPUTE_USE_MAX = 0.15  # one request at a time: under 15% of peak FLOPs ...
BUSY_MIN = 0.8  # ... while the device reads >= 80% busy
COMPUTE_RISE_MIN = 3.0  # batching raises compute use at least 3x at the best concurrency
GPU_GB = 80  # the 80 GB GPU of the capacity-by-formula table
BLOCK = 16  # the engine's block size (EngineConfig's default)


@dataclass(frozen=True)
class Config:
    model: str = "tiny"  # the built-in model: loads offline, real weights (on CUDA: see gpu_arch)
    gpu_arch: str = "llama-3-8b"  # on CUDA the default tiny is replaced by this shape, BF16, as many layers as fit
    concurrencies: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)  # doubling up to --max-concurrency: where the knee is
    max_concurrency: int = 64  # the top of the sweep
    requests_per_level: int = 3  # requests per client at each concurrency (at least 8 requests a level)
    prompt_len: int = 64  # tokens per prompt of parts 1, 2 (vLLM's random dataset style: random ids)
    output_len: int = 64  # tokens per reply (ignore_eos, as benchmarks do)
    short_long: tuple[int, int] = (8, 256)  # part 2's mixed output lengths: where static batching wastes slots
    arrivals: int = 32  # part 2 requests (Poisson), rounded down to a multiple of the batch
    static_waits: tuple[float, ...] = (0.0, 1.0, 2.0)  # part 2: static's max wait for a fuller batch, in mean arrival gaps
    kv_blocks: int = 64  # part 3's smallest pool: 1,024 tokens of KV, a handful of long conversations
    kv_pool_multiples: tuple[int, ...] = (1, 2, 3)  # part 3's pools: kv_blocks x these, the weights fixed
    conversation: tuple[int, int] = (144, 16)  # part 3 (prompt, output): admitted at 9 blocks, 10 by the end
    prefix_lens: tuple[int, ...] = (128, 512, 2048)  # part 4's shared system prompts
    prefix_requests: int = 8  # requests sharing each prefix
    long_prompt: int = 1024  # part 5's prompt that arrives while decodes run
    chunk_budget: int = 64  # part 5's token budget per step with chunking on
    price_per_hour: float = 2.0  # an EXAMPLE price ($/hour) for part 6, never a market quote: pass yours
    endpoint: str | None = None  # an OpenAI-compatible server: parts 1 and 4 measure it instead of the engine
    threads: int = 1  # CPU threads: the engine's small ragged steps gain little from more on 2 cores
    seed: int = 0

    def __post_init__(self):
        if self.max_concurrency < 1:
            raise ValueError(f"--max-concurrency must be at least 1, got {self.max_concurrency}")
        if self.kv_blocks < -(-sum(self.conversation) // BLOCK):
            raise ValueError(f"--kv-blocks {self.kv_blocks} is smaller than one conversation needs "
                             f"({-(-sum(self.conversation) // BLOCK)} blocks of {BLOCK} tokens)")
        if not self.price_per_hour >= 0:
            raise ValueError(f"--price-per-hour must be >= 0, got {self.price_per_hour}")
        if self.prompt_len < 1 or self.output_len < 2 or self.requests_per_level < 1 or self.arrivals < 2:
            raise ValueError("prompt and output lengths, requests and arrivals must be positive (output >= 2)")
        if not self.kv_pool_multiples or min(self.kv_pool_multiples) < 1 or not self.static_waits or min(self.static_waits) < 0:
            raise ValueError("kv_pool_multiples must be >= 1 and static_waits >= 0, one of each at least")

    @classmethod
    def quick(cls) -> Config:
        return cls(concurrencies=(1, 4, 8), max_concurrency=8, requests_per_level=1, prompt_len=32, output_len=16,
                   short_long=(4, 24), arrivals=16, static_waits=(0.0, 1.0), kv_pool_multiples=(1, 2),
                   prefix_lens=(128,), prefix_requests=3, long_prompt=192, chunk_budget=32)

    def levels(self) -> list[int]:
        return [c for c in self.concurrencies if c <= self.max_concurrency] or [self.max_concurrency]

    def static_batch(self) -> int:
        return min(8, self.max_concurrency)


# ---------------------------------------------------------------- the model


def _dtype(device: Device):
    import torch

    if not device.is_cuda:
        return torch.float32
    return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16


def arch_model(name: str, device: Device, dtype, memory_share: float = 0.5):
    """`arch:name` with random weights (a timing only) in `dtype`: all its layers, or as many as fit in
    `memory_share` of the free memory (the rest is for the KV pools and the exactness check's HF forward)."""
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.initialization import no_init_weights

    from llmlab.core.models import _fill_random, arch_config, param_count

    conf = arch_config(name)
    elem = torch.empty(0, dtype=dtype).element_size()
    while conf.num_hidden_layers > 1 and elem * param_count(conf) > memory_share * device.free_memory_bytes():
        conf.num_hidden_layers -= 1
    with torch.device(device.torch), no_init_weights():
        model = AutoModelForCausalLM.from_config(conf, dtype=dtype)
    _fill_random(model)
    model.tie_weights()
    return model.eval(), f"arch:{name} x{conf.num_hidden_layers} layers (random weights)"


def speed_model(cfg: Config, device: Device):
    """(model, what it is): cfg.model, except that on CUDA the default tiny becomes cfg.gpu_arch (see the top)."""
    from llmlab.core.device import last_level_cache_bytes
    from llmlab.core.models import load

    dtype = _dtype(device)
    if device.is_cuda and cfg.model == "tiny":
        model, name = arch_model(cfg.gpu_arch, device, dtype)
    else:
        model, name = load(cfg.model, device, dtype=str(dtype).removeprefix("torch.")).model, cfg.model
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    cache = last_level_cache_bytes(device)
    return model, dict(model=name, dtype=str(dtype).removeprefix("torch."), weights_MB=weights / 1e6,
                       cache="L2" if device.is_cuda else "last-level cache", cache_MB=cache / 1e6,
                       weights_over_cache=weights / cache)


# ---------------------------------------------------------------- drivers


def _engine(model, **kw):
    from llmlab.serving.engine.llm_engine import Engine, EngineConfig

    return Engine(model, EngineConfig(**kw))


def _params(n: int):
    from llmlab.serving.engine.scheduler import RequestParams

    return RequestParams(max_tokens=n, ignore_eos=True)


def _prompts(n: int, length: int, vocab: int, rng: random.Random) -> list[list[int]]:
    return [[rng.randrange(4, vocab) for _ in range(length)] for _ in range(n)]


def records(seqs) -> list:
    """Engine sequences as the HTTP client's RequestRecords: one metric definition for both."""
    from llmlab.loadgen.client import RequestRecord

    return [RequestRecord(index=i, send_ns=s.arrival_ns, chunk_ns=list(s.token_ns), prompt_tokens=len(s.prompt_ids),
                          output_tokens=len(s.output_ids), output_tokens_source="engine", status=200) for i, s in enumerate(seqs)]


def closed_loop(engine, prompts: list[list[int]], concurrency: int, out_len: int):
    """N clients: each sends its next prompt when its last reply ends. Returns (sequences, wall seconds)."""
    todo, done = list(prompts), []
    for _ in range(min(concurrency, len(todo))):
        engine.add_request(todo.pop(0), _params(out_len))
    t0 = time.perf_counter()
    while engine.has_work():
        out = engine.step()
        for seq in out.finished if out else []:
            done.append(seq)
            if todo:
                engine.add_request(todo.pop(0), _params(out_len))
    return done, time.perf_counter() - t0


def busy_reading(device: Device, fn):
    """(fn(), busy share, source): the device's own reading of how busy it was while fn ran. GPU: NVML's
    utilisation (share of time a kernel ran), median over the run. CPU: CPU time over wall time, of the
    calling thread when torch runs on one thread (other threads of the process are not the engine's), else
    of the process over threads x wall."""
    import torch

    from llmlab.core.telemetry import Telemetry

    if device.is_cuda:
        with Telemetry(device) as tel:
            out = fn()
        util = tel.summary().get("gpu_util_pct")
        return out, (util["median"] / 100 if util else math.nan), "NVML GPU utilisation"
    n = torch.get_num_threads()
    clock = time.thread_time if n == 1 else time.process_time
    c0, t0 = clock(), time.perf_counter()
    out = fn()
    return out, (clock() - c0) / (n * (time.perf_counter() - t0)), "CPU time / wall time"


def open_loop(engine, prompts, outs: list[int], gaps_s: list[float], static_batch: int = 0, max_wait_s: float = 0.0):
    """Poisson arrivals in real time. static_batch B > 0: when the engine is idle it admits up to B queued
    requests once B are queued, the oldest has waited max_wait_s, or no more will arrive (max wait 0 = dynamic
    fill: whatever is queued), and admits nothing more until that batch is done. Returns (sequences, wall s,
    wasted slots counted per step (batch size - rows still running), the batches' reply lengths)."""
    t0 = time.perf_counter_ns()
    arrive = np.cumsum(gaps_s) * 1e9 + t0
    queue, i, done, wasted, batches, size = [], 0, [], 0, [], 0
    while i < len(prompts) or queue or engine.has_work():
        now = time.perf_counter_ns()
        while i < len(prompts) and arrive[i] <= now:
            queue.append(i)
            i += 1
        if not static_batch:
            admit, queue = queue, []
        elif not engine.has_work() and queue and (len(queue) >= static_batch or i == len(prompts)
                                                  or now - arrive[queue[0]] >= max_wait_s * 1e9):
            admit, queue = queue[:static_batch], queue[static_batch:]
            batches.append([outs[j] for j in admit])
            size = len(admit)
        else:
            admit = []
        done += [engine.add_request(prompts[j], _params(outs[j]), arrival_ns=int(arrive[j])) for j in admit]
        if engine.has_work():
            rec = engine.step().record
            wasted += size - rec.num_seqs if static_batch else 0
        elif i < len(prompts) or queue:
            wakes = ([arrive[i]] if i < len(prompts) else []) + ([arrive[queue[0]] + max_wait_s * 1e9] if queue else [])
            time.sleep(max(0.0, (min(wakes) - time.perf_counter_ns()) / 1e9))
    return done, (time.perf_counter_ns() - t0) / 1e9, wasted, batches


# ---------------------------------------------------------------- run


def run(cfg: Config, device: Device, progress=None) -> LabResult:
    """Measures. Fills tables; never prints, never judges."""
    import torch

    res = LabResult.new(LAB, VERSION, cfg)
    with torch_threads(None if device.is_cuda else cfg.threads), res.guard(), torch.inference_mode():
        model, about = speed_model(cfg, device)
        vocab = model.config.vocab_size
        rng = random.Random(cfg.seed)
        res.env["engine"] = about
        if about["model"] != cfg.model:
            res.note(f"the engine's parts ran {about['model']} in {about['dtype']} ({about['weights_MB']:,.0f} MB of weights, "
                     f"{about['weights_over_cache']:.0f}x the {about['cache_MB']:.0f} MB L2): tiny would sit in the L2")
        part_exact(res, model, vocab, rng)
        if cfg.endpoint:
            part_endpoint(res, cfg, vocab, rng)
        else:
            part_concurrency(res, cfg, model, device, vocab, rng)
            part_prefix(res, cfg, model, vocab, rng)
        for table, fn in (("static_vs_continuous", part_static), ("capacity", part_capacity), ("chunked", part_chunked)):
            if cfg.endpoint:
                res.skip(table, "needs the in-process engine (--endpoint measures parts 1 and 4)")
            else:
                fn(res, cfg, model, vocab, rng)
        res.add_table("capacity_formula", capacity_formula_rows())
        if "concurrency" in res.tables:
            res.add_table("cost", cost_rows(res.tables["concurrency"], cfg.price_per_hour))
        res.note(f"part 6 prices at ${cfg.price_per_hour:g}/hour, an example, not a market quote (--price-per-hour)")
    return res


def part_exact(res, model, vocab: int, rng) -> None:
    """The engine against HF at every position it computes (prefill chunks, decodes, prefix-hit follow-ups):
    the measured diff and greedy flag go into the table; the judge decides."""
    from llmlab.serving.engine.llm_engine import check_exact

    eng = _engine(model, enable_prefix_cache=True, max_num_batched_tokens=48)
    prompts = _prompts(3, 40, vocab, rng) + [_prompts(1, 20, vocab, rng)[0]]
    res.add_table("exactness", [check_exact(eng, prompts, max_new_tokens=6, strict=False)])


def _model_costs(model, device: Device) -> dict:
    from llmlab.core.flops import Shape
    from llmlab.core.specs import bandwidth_spec_GBps, peak_for

    shape = Shape.of(model.config)
    p = next(model.parameters())
    elem = p.element_size()
    dtype = {4: "fp32", 2: "fp16" if str(p.dtype) == "torch.float16" else "bf16"}.get(elem, "fp32")
    bw, bw_source = bandwidth_spec_GBps(device)[0], "spec sheet"
    if not bw:  # a CPU has no spec row: measure the STREAM triad (the roofline lab's kernel)
        from llmlab.core.roofs import bandwidth_GBps

        bw, bw_source = bandwidth_GBps(device, "triad"), "measured STREAM triad"
    peak, peak_source = peak_for(device, dtype)
    return dict(flops_per_token=2 * shape.matmul_params, weight_bytes=elem * shape.matmul_params,
                kv_bytes_per_token=elem * shape.kv_elems_per_token, peak_gflops=peak or float("nan"), peak_source=peak_source,
                bandwidth_GBps=bw, bandwidth_source=bw_source)


def part_concurrency(res, cfg: Config, model, device: Device, vocab: int, rng) -> None:
    from llmlab.loadgen.client import calculate_metrics

    costs = _model_costs(model, device)
    rows, steps = [], []
    for c in cfg.levels():
        eng = _engine(model, max_num_seqs=c, max_num_batched_tokens=max(512, c * 2), enable_prefix_cache=False)
        closed_loop(eng, _prompts(1, cfg.prompt_len, vocab, rng), 1, 2)  # warm-up
        eng.reset_stats()
        n = max(8, c * cfg.requests_per_level)
        prompts = _prompts(n, cfg.prompt_len, vocab, rng)
        (seqs, wall), busy, busy_source = busy_reading(device, lambda: closed_loop(eng, prompts, c, cfg.output_len))  # noqa: B023
        m = calculate_metrics(records(seqs), wall)
        dec = [s for s in eng.steps if s.num_prefill_tokens == 0 and s.num_decodes > 0]
        step_ms = float(np.median([s.step_ms for s in dec])) if dec else float("nan")
        batch = float(np.mean([s.num_decodes for s in dec])) if dec else float("nan")
        ctx = cfg.prompt_len + cfg.output_len / 2  # mean context a decode step reads
        rows.append(dict(concurrency=c, requests=n, output_tokens_per_s=m.output_throughput, requests_per_s=m.request_throughput,
                         p50_ttft_ms=m.p50_ttft_ms, p99_ttft_ms=m.p99_ttft_ms, p50_itl_ms=m.p50_itl_ms, p99_itl_ms=m.p99_itl_ms,
                         p50_tpot_ms=m.p50_tpot_ms, decode_step_ms=step_ms, decodes_per_step=batch,
                         compute_util=costs["flops_per_token"] * m.output_throughput / (costs["peak_gflops"] * 1e9),
                         bandwidth_util=(costs["weight_bytes"] + batch * ctx * costs["kv_bytes_per_token"]) / (step_ms / 1e3)
                         / (costs["bandwidth_GBps"] * 1e9), device_busy=busy, busy_source=busy_source,
                         peak_gflops=costs["peak_gflops"], bandwidth_GBps=costs["bandwidth_GBps"]))
        steps += [dict(concurrency=c, decodes=s.num_decodes, step_ms=s.step_ms) for s in dec]
        res.add_table("concurrency", rows)
        res.env.setdefault("engine", {})["attention_backends"] = eng.attention_backends  # SDPA calls of the last level, by kind
    st = res.add_table("steps", steps).groupby("decodes", as_index=False).step_ms.median()
    st["ms_per_token"] = st.step_ms / st.decodes
    res.add_table("step_time", st)
    res.env["model_costs"] = costs


def part_static(res, cfg: Config, model, vocab: int, rng) -> None:
    """Poisson arrivals at about 80% of the engine's batch-of-B capacity; static batches of B (dynamic fill,
    each max wait of the sweep) vs continuous. The request count is a multiple of B."""
    from llmlab.loadgen.client import calculate_metrics

    b = cfg.static_batch()
    n = max(b, cfg.arrivals // b * b)
    outs = [cfg.short_long[i % 2] for i in range(n)]
    prompts = _prompts(n, cfg.prompt_len, vocab, rng)
    eng = _engine(model, max_num_seqs=b, enable_prefix_cache=False)
    t = time.perf_counter()
    eng.generate(prompts[:b], _params(int(np.mean(outs))))  # calibration: one batch of B at the mean length
    rate = 0.8 * b / (time.perf_counter() - t)  # requests/s at ~80% of capacity
    gaps = list(np.random.default_rng(cfg.seed).exponential(1 / rate, n))
    rows = []
    for mode, sb, wait in [("static", b, w) for w in cfg.static_waits] + [("continuous", 0, 0.0)]:
        eng = _engine(model, max_num_seqs=b, enable_prefix_cache=False)
        seqs, wall, wasted, batches = open_loop(eng, prompts, outs, gaps, static_batch=sb, max_wait_s=wait / rate)
        m = calculate_metrics(records(seqs), wall)
        rows.append(dict(mode=mode, batch=b, requests=n, rate_per_s=rate, max_wait_gaps=wait if sb else None,
                         max_wait_ms=1e3 * wait / rate if sb else None, output_tokens_per_s=m.output_throughput,
                         p50_ttft_ms=m.p50_ttft_ms, p99_ttft_ms=m.p99_ttft_ms, steps=len(eng.steps), batches=len(batches),
                         mean_batch=float(np.mean([len(g) for g in batches])) if batches else None, wasted_slots=wasted,
                         wasted_from_lengths=sum(len(g) * max(g) - sum(g) for g in batches),
                         slot_use=sum(map(sum, batches)) / (sum(map(sum, batches)) + wasted) if batches else None))
    res.add_table("static_vs_continuous", rows)


def part_capacity(res, cfg: Config, model, vocab: int, rng) -> None:
    """Pools of kv_blocks x each multiple, the weights fixed; 3 x formula + 2 conversations each."""
    p, o = cfg.conversation
    rows = []
    for mult in cfg.kv_pool_multiples:
        blocks = cfg.kv_blocks * mult
        eng = _engine(model, num_blocks=blocks, max_num_seqs=256, max_num_batched_tokens=max(512, p + 1),
                      enable_prefix_cache=False)
        per_seq = -(-(p + o) // BLOCK)  # blocks one conversation holds by its end
        at_admission = -(-p // BLOCK)  # blocks it holds when admitted (its prompt)
        formula = blocks // per_seq
        n = 3 * formula + 2
        eng.generate(_prompts(n, p, vocab, rng), _params(o))
        running = [s.num_seqs for s in eng.steps if s.num_prefill_tokens == 0]
        rows.append(dict(kv_blocks=blocks, block_size=BLOCK, tokens_per_seq=p + o, blocks_per_seq=per_seq,
                         formula_max_seqs=formula, admission_bound=blocks // at_admission, max_num_seqs=256, conversations=n,
                         peak_running=max(running) if running else 0,
                         median_running=float(np.median(running)) if running else 0.0,
                         preemptions=eng.scheduler.num_preemptions))
    res.add_table("capacity", rows)


def capacity_formula_rows(context: int = 4096) -> list[dict]:
    """Conversations of `context` tokens that fit beside BF16 weights on one 80 GB GPU (formula)."""
    from llmlab.core.models import arch_config, kv_bytes_per_token, param_count

    rows = []
    for name in ("llama-2-7b", "llama-3-8b"):
        conf = arch_config(name)
        w, kv = 2 * param_count(conf), kv_bytes_per_token(conf, 2)
        free = GPU_GB * 1e9 - w
        rows.append(dict(model=name, kv_heads=conf.num_key_value_heads, weights_GB=w / 1e9, kv_KiB_per_token=kv / 1024,
                         context=context, conversations=int(free // (kv * context))))
    return rows


def part_prefix(res, cfg: Config, model, vocab: int, rng) -> None:
    """N requests = a shared system prompt of L tokens + 16 own tokens, one at a time; cache off, then on."""
    from llmlab.loadgen.client import calculate_metrics

    rows = []
    ctx = getattr(model.config, "max_position_embeddings", 8192)
    for L in [x for x in cfg.prefix_lens if x + 32 < ctx]:
        shared = _prompts(1, L, vocab, rng)[0]
        prompts = [shared + tail for tail in _prompts(cfg.prefix_requests, 16, vocab, rng)]
        for cache in (False, True):
            eng = _engine(model, enable_prefix_cache=cache, max_num_batched_tokens=max(512, L + 32))
            eng.generate([_prompts(1, 16, vocab, rng)[0]], _params(2))  # warm-up on another prompt
            eng.reset_stats()
            seqs = [eng.generate([p], _params(4))[0] for p in prompts]
            m = calculate_metrics(records(seqs), 1.0)
            computed = sum(s.num_prefill_tokens for s in eng.steps)
            rows.append(dict(prefix_tokens=L, prompt_tokens=L + 16, requests=len(prompts), prefix_cache=cache,
                             p50_ttft_ms=m.p50_ttft_ms, hit_tokens=eng.scheduler.prefix_hits,
                             query_tokens=eng.scheduler.prefix_queries, prefill_tokens_computed=computed,
                             expected_hits=(len(prompts) - 1) * (L // eng.cfg.block_size) * eng.cfg.block_size if cache else 0))
    res.add_table("prefix", rows)


def part_chunked(res, cfg: Config, model, vocab: int, rng) -> None:
    """4 decodes run; a long prompt arrives; its prefill in one step (chunking off) vs in budget-sized chunks."""
    rows = []
    long_p = min(cfg.long_prompt, getattr(model.config, "max_position_embeddings", 8192) - 8)
    for mode, budget in (("one step (chunking off)", long_p + 64), (f"chunks of {cfg.chunk_budget}", cfg.chunk_budget)):
        eng = _engine(model, max_num_batched_tokens=budget, enable_prefix_cache=False)
        runners = [eng.add_request(p, _params(40 + long_p // cfg.chunk_budget)) for p in _prompts(4, 16, vocab, rng)]
        for _ in range(6):
            eng.step()
        big = eng.add_request(_prompts(1, long_p, vocab, rng)[0], _params(2))
        while not big.token_ns:
            eng.step()
        window = (big.arrival_ns, big.token_ns[0])
        gaps = [(b - a) / 1e6 for r in runners for a, b in zip(r.token_ns, r.token_ns[1:], strict=False)
                if window[0] <= b <= window[1] + 1]
        before = [(b - a) / 1e6 for r in runners for a, b in zip(r.token_ns[:5], r.token_ns[1:6], strict=False)]
        rows.append(dict(mode=mode, budget=budget, long_prompt=long_p, running_decodes=len(runners),
                         itl_before_ms=float(np.median(before)), itl_max_during_ms=max(gaps) if gaps else float("nan"),
                         long_prompt_ttft_ms=(big.token_ns[0] - big.arrival_ns) / 1e6))
    res.add_table("chunked", rows)


def part_endpoint(res, cfg: Config, vocab: int, rng) -> None:
    """Parts 1 and 4 against an OpenAI-compatible server (client-side metrics, vLLM's definitions)."""
    import asyncio

    from llmlab.loadgen.client import calculate_metrics, run_load

    url = cfg.endpoint.rstrip("/") + "/v1/completions"
    words = "the of and to in is that for it as with was on be by this are or".split()

    def text(n: int) -> str:
        return " ".join(rng.choice(words) for _ in range(n))

    rows = []
    for c in cfg.levels():
        n = max(8, c * cfg.requests_per_level)
        payloads = [dict(model=cfg.model, prompt=text(cfg.prompt_len), max_tokens=cfg.output_len, stream=True,
                         ignore_eos=True, stream_options={"include_usage": True}) for _ in range(n)]
        run = asyncio.run(run_load(url, payloads, concurrency=c, warmup=1))
        m = calculate_metrics(run.records, run.duration_s)
        if m.completed == 0:
            raise UsageError(f"--endpoint {cfg.endpoint}: every request failed ({run.records[-1].error})")
        rows.append(dict(concurrency=c, requests=n, output_tokens_per_s=m.output_throughput, requests_per_s=m.request_throughput,
                         p50_ttft_ms=m.p50_ttft_ms, p99_ttft_ms=m.p99_ttft_ms, p50_itl_ms=m.p50_itl_ms, p99_itl_ms=m.p99_itl_ms,
                         p50_tpot_ms=m.p50_tpot_ms, error_rate=m.error_rate))
    res.add_table("concurrency", rows)
    res.skip("step_time", "the server's steps are not visible from a client")
    res.skip("prefix", "a server's prefix cache cannot be switched off from outside: `llmlab ttft --endpoint URL` "
                       "runs the prefix probe (one long prefix twice, checked against cache_n or the prefix counters)")


def cost_rows(conc, price: float) -> list[dict]:
    best = conc.loc[conc.output_tokens_per_s.idxmax()]
    first = conc.iloc[0]
    return [dict(at=f"concurrency {int(r.concurrency)}", output_tokens_per_s=r.output_tokens_per_s, price_per_hour=price,
                 usd_per_million_tokens=price / (3600 * r.output_tokens_per_s) * 1e6) for r in (first, best)]



# ---------------------------------------------------------------- judge


def _t(result: LabResult, name: str):
    df = result.tables.get(name)
    return None if df is None or df.empty else df


def _has(df, *cols: str) -> bool:
    return df is not None and all(c in df for c in cols)


def _claim_exact(ex) -> Claim:
    r = ex.iloc[0]
    ok = r.max_abs_logit_diff <= r.atol and bool(r.greedy_tokens_equal)
    return Claim("serving.engine_exact", "the engine computes what HF computes",
                 f"max |logit diff| vs HF <= {r.atol:g} ({r['dtype']}) at every computed position; greedy = HF's argmax",
                 f"{r.max_abs_logit_diff:.1e} at {int(r.positions)} positions ({int(r.decode_positions)} decode, "
                 f"{int(r.prefix_hit_tokens)} prefix-hit); greedy {'equal' if r.greedy_tokens_equal else 'differs'}", bool(ok))


def _claim_idle(conc) -> Claim:
    one, best = conc.iloc[0], conc.loc[conc.output_tokens_per_s.idxmax()]
    rise = best.compute_util / one.compute_util
    busy = one.device_busy
    holds = None if math.isnan(busy) else bool(one.compute_util < COMPUTE_USE_MAX and busy >= BUSY_MIN and rise >= COMPUTE_RISE_MIN)
    return Claim("serving.one_request_idle", "one request at a time wastes a busy-looking device's FLOPs",
                 f"at 1: compute < {COMPUTE_USE_MAX:.0%} of peak, busy ({one.busy_source}) >= {BUSY_MIN:.0%}; "
                 f"at the best >= {COMPUTE_RISE_MIN:g}x the compute",
                 f"{one.compute_util:.2%} of peak at 1, busy {busy:.0%}; {best.compute_util:.2%} at "
                 f"{int(best.concurrency)} ({rise:.1f}x)", holds,
                 note="not measured: no busy reading (NVML)" if holds is None else None)


def _claim_static(sc) -> Claim:
    static, c = sc[sc["mode"] == "static"], sc.set_index("mode").loc["continuous"]
    s = static.loc[static.p50_ttft_ms.idxmin()]  # static at its best max wait
    waits = ", ".join(f"{w:.0f}" for w in static.max_wait_ms)
    return Claim("serving.continuous_beats_static", "continuous batching beats static batching at its best",
                 f"continuous p50 and p99 TTFT < static's best (max wait {waits} ms)",
                 f"p50 {c.p50_ttft_ms:.0f} vs {s.p50_ttft_ms:.0f} ms, p99 {c.p99_ttft_ms:.0f} vs {s.p99_ttft_ms:.0f} ms "
                 f"(static waits {s.max_wait_ms:.0f} ms, wastes {int(s.wasted_slots)} slots)",
                 bool(c.p50_ttft_ms < s.p50_ttft_ms and c.p99_ttft_ms < s.p99_ttft_ms),
                 note="below capacity both serve every arrival, so tokens/s match; the wait is what differs")


def _claim_capacity(cap) -> Claim:
    exact = bool((cap.peak_running == cap.formula_max_seqs).all())
    apart = bool((cap.admission_bound != cap.formula_max_seqs).any())
    col = lambda c: ", ".join(str(int(x)) for x in cap[c])  # noqa: E731
    return Claim("serving.kv_limits_concurrency", "the KV cache, not the weights, caps concurrent conversations",
                 "peak running = blocks // blocks per conversation, exactly, at each pool (admission bound differing)",
                 f"peak {col('peak_running')} at {col('kv_blocks')} blocks; formula {col('formula_max_seqs')}; admission "
                 f"{col('admission_bound')}", exact and apart)


def judge(result: LabResult) -> list[Claim]:
    """Every verdict from the tables alone."""
    claims = []
    ex = _t(result, "exactness")
    if _has(ex, "atol", "positions"):
        claims.append(_claim_exact(ex))
    conc = _t(result, "concurrency")
    if conc is not None and len(conc) > 1:
        one, best = conc.iloc[0], conc.loc[conc.output_tokens_per_s.idxmax()]
        x = best.output_tokens_per_s / one.output_tokens_per_s
        claims.append(Claim("serving.batching_is_the_lever", "batching multiplies throughput", ">= 2x tokens/s at the best concurrency",
                            f"{x:.1f}x at concurrency {int(best.concurrency)} ({best.output_tokens_per_s:.0f} vs "
                            f"{one.output_tokens_per_s:.0f} tokens/s)", x >= 2))
        if _has(conc, "compute_util", "device_busy"):
            claims.append(_claim_idle(conc))
    sc = _t(result, "static_vs_continuous")
    if _has(sc, "max_wait_ms"):
        claims.append(_claim_static(sc))
    cap = _t(result, "capacity")
    if _has(cap, "admission_bound"):
        claims.append(_claim_capacity(cap))
    pre = _t(result, "prefix")
    if pre is not None:
        ok, parts = True, []
        for L, g in pre.groupby("prefix_tokens"):
            off, on = g.set_index("prefix_cache").loc[False], g.set_index("prefix_cache").loc[True]
            cut = off.prefill_tokens_computed - on.prefill_tokens_computed
            ok &= abs(cut - on.expected_hits) <= BLOCK * on.requests and on.p50_ttft_ms < off.p50_ttft_ms
            parts.append(f"L={L}: {int(cut)} fewer tokens, TTFT {off.p50_ttft_ms:.1f} -> {on.p50_ttft_ms:.1f} ms")
        claims.append(Claim("serving.prefix_cache_cuts_prefill", "a shared prefix is computed once",
                            f"prefill cut by the cached blocks' tokens (+-{BLOCK} a request); lower p50 TTFT",
                            "; ".join(parts), bool(ok)))
    ch = _t(result, "chunked")
    if ch is not None and len(ch) == 2:
        one, chunk = ch.iloc[0], ch.iloc[1]
        claims.append(Claim("serving.chunked_prefill_caps_itl", "chunked prefill keeps running decodes smooth",
                            "worst ITL of running decodes: chunks < one step (long prefill)",
                            f"worst ITL {chunk.itl_max_during_ms:.0f} vs {one.itl_max_during_ms:.0f} ms; TTFT "
                            f"{chunk.long_prompt_ttft_ms:.0f} vs {one.long_prompt_ttft_ms:.0f} ms",
                            chunk.itl_max_during_ms < one.itl_max_during_ms))
    return claims


def headline(result: LabResult, claims: list[Claim]) -> str:
    conc, cost = _t(result, "concurrency"), _t(result, "cost")
    if conc is None or len(conc) < 2:
        return ""
    one, best = conc.iloc[0], conc.loc[conc.output_tokens_per_s.idxmax()]
    s = (f"Batching is the lever: {best.output_tokens_per_s / one.output_tokens_per_s:.1f}x the tokens/s at concurrency "
         f"{int(best.concurrency)} vs 1")
    if cost is not None:
        s += f", so ${cost.usd_per_million_tokens.iloc[1]:.2f} instead of ${cost.usd_per_million_tokens.iloc[0]:.2f} per 1M tokens at the example price"
    return s + "."


def views(result: LabResult) -> list[View]:
    return [
        View("1. Concurrency: batching is the lever", "What do more clients buy in tokens/s, and what do they cost in latency?",
             "concurrency", (Col("concurrency", "clients", "int"), Col("output_tokens_per_s", "tokens / s"),
                             Col("p50_ttft_ms", "TTFT p50 ms"), Col("p99_ttft_ms", "TTFT p99 ms"), Col("p50_itl_ms", "ITL p50 ms"),
                             Col("compute_util", "FLOPs use", "%"), Col("device_busy", "busy", "%")),
             chart=Chart("output tokens/s vs clients", "concurrency", "concurrency", "output_tokens_per_s", logx=True,
                         xlabel="clients (log)", ylabel="tokens/s")),
        View("   ... step time vs batch", "Where does a decode step stop being free to widen?", "step_time",
             (Col("decodes", "decodes / step", "int"), Col("step_ms", "step ms"), Col("ms_per_token", "ms / token"))),
        View("2. Static vs continuous batching", "Same Poisson arrivals, short and long replies mixed: who wins?",
             "static_vs_continuous", (Col("mode", "mode"), Col("max_wait_ms", "wait ms", ".0f"),
                                      Col("output_tokens_per_s", "tokens / s"), Col("p50_ttft_ms", "TTFT p50 ms"),
                                      Col("p99_ttft_ms", "TTFT p99 ms"), Col("wasted_slots", "wasted slots", "int"))),
        View("3. KV capacity limits concurrency", "How many long conversations fit in KV pools of each size, the weights fixed?", "capacity",
             (Col("kv_blocks", "KV blocks", "int"), Col("blocks_per_seq", "blocks / conv.", "int"),
              Col("formula_max_seqs", "formula", "int"), Col("admission_bound", "at admission", "int"),
              Col("peak_running", "peak running", "int"),
              Col("preemptions", "preempted", "int"))),
        View("   ... on an 80 GB GPU, by formula (4k-token conversations)", "Why does GQA fit 4x the conversations?",
             "capacity_formula", (Col("model", "model"), Col("kv_heads", "KV heads", "int"), Col("weights_GB", "weights GB", ".1f"),
                                  Col("kv_KiB_per_token", "KiB / token", "int"), Col("conversations", "conversations", "int"))),
        View("4. Prefix reuse", "A shared system prompt, cache off vs on: what is not recomputed?", "prefix",
             (Col("prefix_tokens", "shared tokens", "int"), Col("prefix_cache", "cache"), Col("p50_ttft_ms", "TTFT p50 ms"),
              Col("hit_tokens", "hit tokens", "int"), Col("prefill_tokens_computed", "prefill computed", "int"))),
        View("5. Chunked prefill vs decode interference", "A long prompt arrives while 4 replies stream: who waits?",
             "chunked", (Col("mode", "long prompt's prefill"), Col("itl_before_ms", "ITL before ms"),
                         Col("itl_max_during_ms", "worst ITL during ms"), Col("long_prompt_ttft_ms", "its TTFT ms"))),
        View("6. Cost per token", "What does batching do to $ per 1M output tokens (example price)?", "cost",
             (Col("at", "at"), Col("output_tokens_per_s", "tokens / s"), Col("price_per_hour", "$ / hour", ".2f"),
              Col("usd_per_million_tokens", "$ / 1M tokens", ".2f"))),
    ]
