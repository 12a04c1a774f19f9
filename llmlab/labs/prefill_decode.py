"""Lab: one request, two personalities — prefill (reading the prompt) and decode (writing the reply).

The article's argument, each step turned into a measurement:
1. The two phases timed: a prefill of T tokens and a decode step at context T, on the built-in
   `tiny` (and `arch:` shapes with random weights: timings only). Tokens/s of each and their ratio.
2. Why: FLOPs and bytes of each phase from the model's shape (`llmlab.core.flops`, cross-checked
   with `torch.utils.flop_counter.FlopCounterMode`), FLOP/byte against this machine's ridge point
   measured with the roofline's own kernels (`llmlab.core.roofs`), and the achieved FLOP/s and
   GB/s as shares of the measured roofs. What bounds decode when it is not memory: per-op
   dispatch, estimated as (ops per step) x (the time of one tiny op).
3. The crossover: decode at batch B = 1 .. 256 against prefill at T: where decode's intensity
   reaches the ridge (the formula) and where its step time stops being flat (measured).
4. TTFT and ITL: TTFT = the prefill forward plus choosing the first token (the prefill's logits
   are the first token's), ITL = one decode step; E2E = TTFT + (n - 1) ITL predicted from the parts
   against generation timed end to end.
5. Disaggregation in napkin form: KV bytes per request, moved over a link (PCIe 4.0 x16, NVLink:
   spec values, or --link-GBps), against the prefill it replaces. The interference it removes
   needs the serving engine (chunked prefill): not measured here.

How bytes are counted: see llmlab/core/flops.py (weights once per forward, KV read/written once,
matmul inputs and outputs once). A model that fits in the last-level cache is read from cache,
not DRAM: the DRAM roof is then an upper bound on time, and the report says so.

References:
- "AI Inference, Optimizations & Evals", part 3 (prefill vs decode); vLLM's benchmark metrics
  (TTFT, ITL, E2E = TTFT + (n - 1) TPOT).
- Zhong et al., "DistServe: Disaggregating Prefill and Decoding" (OSDI 2024); Patel et al.,
  "Splitwise" (ISCA 2024): KV transfer cost against phase interference.
- Williams, Waterman, Patterson, "Roofline" (CACM 2009); Chen, "Transformer Inference Arithmetic".
- PCI-SIG PCIe 4.0: 16 GT/s x 16 lanes ~ 32 GB/s per direction; NVIDIA H100 NVLink 4:
  900 GB/s total, 450 GB/s per direction.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from llmlab.core.device import Device, cpu_load, last_level_cache_bytes, torch_threads
from llmlab.core.errors import MeasurementError, UsageError
from llmlab.core.flops import Shape, crossover_batch, decode_cost, kv_bytes, prefill_cost
from llmlab.core.timing import LATENCY, Stats, Stopwatch, measure
from llmlab.inference.flopcount import counted_flops

if TYPE_CHECKING:  # torch and pandas load inside the functions: the CLI reads Config's defaults for --help
    import pandas as pd
    import torch

    from llmlab.core.results import Claim, LabResult, View  # noqa: F401

LAB = "prefill-decode"
VERSION = 1
JUDGE_VERSION = 1
LINKS = (("PCIe 4 x16 (spec)", 32.0), ("NVLink 4 (spec)", 450.0))  # GB/s per direction: PCIe 4.0 x16; H100 NVLink 4
BOUND_SHARE = 0.5  # a phase is "bound" by a roof when it reaches >= half of it
E2E_TOL = 0.10  # the tolerance for E2E predicted from the parts
FLOP_TOL = 0.05  # formula vs FlopCounterMode
INTERFERENCE = "needs the serving engine's chunked prefill"


@dataclass(frozen=True)
class Config:
    models: tuple[str, ...] = ("tiny", "arch:qwen2.5-0.5b")  # the built-in, and a real shape 85x its size (random weights)
    prompt_lens: tuple[int, ...] = (16, 64, 256, 1024, 4096)  # the 16 ... 4096, x4 apart
    arch_max_len: int = 512  # arch: shapes are timed up to here (a 0.5B prefill of 512 tokens is ~0.5 TFLOP)
    dtype: str = "auto"  # auto = float32 on a CPU (no fast BF16 path), bfloat16 on a GPU
    repeats: int = 5  # timed calls per point: median with p10/p90
    max_point_s: float = 4.0  # stop a point's repeats early (>= 3 kept) past this many seconds
    batch_sizes: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256)  # decode batch sweep, across the ridge
    batch_context: int = 128  # cached positions per sequence in the batch sweep
    output_lens: tuple[int, ...] = (8, 64)  # generated tokens per request for E2E (short and long replies)
    e2e_repeats: int = 3  # end-to-end generations per (T, n)
    link_GBps: float = 0.0  # 0: the spec links (PCIe 4.0 x16, NVLink 4); > 0: that link only
    threads: int = 0  # 0: torch's count, or 1 when the CPU is oversubscribed (one thread waits on nobody)
    roof_llc_multiple: int = 8  # bandwidth buffers 8x the last-level cache: DRAM, not cache
    roof_blocks: int = 10  # timed blocks per bandwidth kernel
    roof_repeats: int = 5  # timed matmuls per shape for the compute roof
    roof_shapes: int = 2  # matmul shapes for the compute roof (the best median wins)
    cuda_model: str = "auto"  # GPU: auto = a registry arch: of >= 32x the L2 replaces the first model when it fits in L2 (tiny does)
    seed: int = 0  # the CLI sets it from --seed

    def __post_init__(self):
        if not self.models:
            raise ValueError("--model: give at least one model")
        if not self.prompt_lens or any(int(t) < 1 for t in self.prompt_lens):
            raise ValueError("--prompt-lens must be one or more positive token counts")
        if not self.batch_sizes or any(int(b) < 1 for b in self.batch_sizes):
            raise ValueError("--batch-sizes must be one or more positive batch sizes")
        if not self.output_lens or any(int(n) < 2 for n in self.output_lens):
            raise ValueError("--output-lens must be token counts >= 2 (E2E = TTFT + (n - 1) ITL needs an ITL)")
        if self.repeats < 3 or self.e2e_repeats < 1:
            raise ValueError("repeats must be >= 3 (a median needs samples) and e2e_repeats >= 1")
        if self.link_GBps < 0 or not math.isfinite(self.link_GBps):
            raise ValueError("--link-GBps must be a positive bandwidth in GB/s (0 = the spec links)")
        if self.dtype not in ("auto", "float32", "bfloat16", "float16"):
            raise ValueError(f"--dtype {self.dtype}: use auto, float32, bfloat16 or float16")
        if self.batch_context < 1 or self.arch_max_len < 1 or self.threads < 0:
            raise ValueError("batch_context and arch_max_len must be >= 1, threads >= 0")

    @classmethod
    def quick(cls) -> Config:
        return cls(models=("tiny",), prompt_lens=(32, 128, 512), repeats=3, max_point_s=1.5, batch_sizes=(1, 4, 16, 64),
                   batch_context=32, output_lens=(8,), e2e_repeats=3, roof_llc_multiple=2, roof_blocks=3, roof_repeats=3,
                   roof_shapes=1)


# ---------------------------------------------------------------- helpers


def model_dtype(cfg: Config, device: Device) -> str:
    return cfg.dtype if cfg.dtype != "auto" else ("bfloat16" if device.is_cuda else "float32")


def pick_threads(cfg: Config, device: Device) -> int:
    """--threads, else torch's count, or 1 on an oversubscribed CPU (an OpenMP region waits for its slowest thread)."""
    import torch

    if cfg.threads or device.is_cuda:
        return cfg.threads or torch.get_num_threads()
    load, cores = cpu_load()
    return 1 if load is not None and load >= cores else torch.get_num_threads()


def fill_cache(model, batch: int, context: int, gen: torch.Generator):
    """A KV cache of `context` random positions per sequence: what a prefill leaves, without the prefill's cost."""
    import torch

    from llmlab.inference.decode import new_cache

    c, dev, dt = model.config, model.device, model.dtype
    kv, hd = c.num_key_value_heads, getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    cache = new_cache(model)
    for layer in range(c.num_hidden_layers):
        k = torch.randn(batch, kv, context, hd, generator=gen).to(dev, dt)  # (B, KV, T, D)
        cache.update(k, torch.randn_like(k), layer)
    return cache


def time_prefill(model, tokens: int, device: Device, cfg: Config, gen: torch.Generator) -> Stats:
    """Prefill forward + choosing the first token (= TTFT without tokenising or queueing), a fresh cache each call."""
    import torch

    from llmlab.inference.decode import new_cache, prefill

    ids = torch.randint(0, model.config.vocab_size, (1, tokens), generator=gen).to(device.torch)  # (1, T)
    box = {}
    setup = lambda: box.update(cache=new_cache(model))  # noqa: E731  (outside the timed call)
    fn = lambda: prefill(model, ids, box["cache"]).argmax(-1)  # noqa: E731
    return measure(fn, device, mode=LATENCY, warmup=1, repeats=cfg.repeats, setup=setup, max_time_s=cfg.max_point_s)


def time_decode(model, context: int, batch: int, device: Device, cfg: Config, gen: torch.Generator) -> Stats:
    """One decode step + choosing the token (= ITL) at exactly `context` cached positions (cropped back each call)."""
    import torch

    from llmlab.inference.decode import crop, decode_one_token

    cache = fill_cache(model, batch, context, gen)
    tok = torch.randint(0, model.config.vocab_size, (batch, 1), generator=gen).to(device.torch)  # (B, 1)
    fn = lambda: decode_one_token(model, tok, cache).argmax(-1)  # noqa: E731
    return measure(fn, device, mode=LATENCY, warmup=1, repeats=max(cfg.repeats, 5), setup=lambda: crop(cache, context),
                   max_time_s=cfg.max_point_s)


def overhead_twin(config, device: Device, dtype: str):
    """The same architecture (layers, every op in the same order) with every size shrunk to a few dozen:
    its decode step moves ~no bytes and does ~no FLOPs, so its time is the fixed per-step cost."""
    import copy

    import torch
    from transformers import AutoModelForCausalLM

    from llmlab.core.models import torch_dtype

    c = copy.deepcopy(config)
    gqa = c.num_key_value_heads < c.num_attention_heads
    c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim = 32, 2, 1 if gqa else 2, 16
    c.intermediate_size, c.vocab_size = 32, 64
    with torch.device(device.torch):
        return AutoModelForCausalLM.from_config(c, dtype=torch_dtype(dtype)).eval()


def measure_roofs(cfg: Config, device: Device, dtype: str, threads: int) -> pd.DataFrame:
    """Bandwidth (STREAM read and triad, the best) and the matmul peak, with the roofline's kernels, at `threads`."""
    import pandas as pd

    from llmlab.core import roofs

    spec = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}[dtype]
    roofs.warm_up(device)
    bufs = roofs.bandwidth_buffers(device, roof_llc_multiple(cfg, device))
    bws = [roofs.measure_bandwidth(device, k, bufs=bufs, blocks=cfg.roof_blocks, threads=threads) for k in ("read", "triad")]
    del bufs
    shapes = (roofs.GPU_SHAPES if device.is_cuda else roofs.CPU_SHAPES[1:])[:cfg.roof_shapes]  # CPU: 4-8 GFLOP, ~0.2 s each
    peak = roofs.matmul_peak_gflops(device, spec, shapes=shapes, repeats=cfg.roof_repeats, threads=threads)
    bw = max(bws, key=lambda b: b.median_GBps)
    return pd.DataFrame([
        dict(roof="bandwidth", value=bw.median_GBps, unit="GB/s",
             how=f"STREAM {bw.kernel}, {bw.buffer_bytes / 2**20:.0f} MiB buffers, {threads} threads"),
        dict(roof="compute", value=peak, unit="GFLOP/s", how=f"{spec} matmul, best median of {len(shapes)} shapes, {threads} threads"),
        dict(roof="ridge", value=roofs.ridge_point(peak, bw.median_GBps), unit="FLOP/byte", how="peak / bandwidth"),
        dict(roof="last-level cache", value=last_level_cache_bytes(device) / 2**20, unit="MiB", how="device card"),
    ])


def roof_llc_multiple(cfg: Config, device: Device) -> int:
    """Bandwidth buffers in LLCs: --quick's 2x is enough for a CPU's DRAM, but a GPU's L2 serves part of a 2x
    buffer, so on CUDA they are >= 8x the L2 (core.roofs caps them at 1/8 of the free HBM)."""
    return max(cfg.roof_llc_multiple, 8) if device.is_cuda else cfg.roof_llc_multiple


def gpu_models(cfg: Config, device: Device, dtype: str) -> tuple[tuple[str, ...], str]:
    """(the models to time, why the first changed or ""): on a GPU the first model, which the crossover, E2E and
    every verdict use, is one whose weights leave L2 behind (core.roofs.gpu_speed_model)."""
    from llmlab.core.roofs import gpu_speed_model

    first, why = gpu_speed_model(cfg.models[0], cfg.cuda_model, device, dtype)
    return tuple(dict.fromkeys((first, *cfg.models))), why


def _roof(tables, name: str) -> float:
    t = tables["roofs"]
    return float(t.loc[t["roof"] == name, "value"].iloc[0])


def lengths_for(cfg: Config, ref: str, max_pos: int, res: LabResult) -> list[int]:
    """The prompt lengths a model can take: within its context (room left for the replies) and arch_max_len."""
    room = max(cfg.output_lens)
    cap = max_pos - room if not ref.startswith("arch:") else min(max_pos - room, cfg.arch_max_len)
    lens = sorted({int(t) for t in cfg.prompt_lens if t <= cap})
    dropped = sorted({int(t) for t in cfg.prompt_lens if t > cap})
    if dropped:
        why = f"arch: shapes are timed up to {cap}" if cap < max_pos - room else f"context {max_pos} minus {room} reply tokens"
        res.note(f"{ref}: T = {', '.join(map(str, dropped))} clamped away ({why})")
    return lens


# ---------------------------------------------------------------- parts


def measure_phases(cfg, device, lm, shape, elem, lens, gen, progress) -> list[dict]:
    from llmlab.core.render import track

    rows = []
    for t in track(progress, lens, f"{lm.ref}: prefill and decode"):
        p = time_prefill(lm.model, t, device, cfg, gen)
        d = time_decode(lm.model, t, 1, device, cfg, gen)
        pc, dc = prefill_cost(shape, t, 1, elem), decode_cost(shape, t, 1, elem)
        rows.append(dict(model=lm.ref, tokens=t, prefill_ms=p.median_ms, prefill_p10_ms=p.p10_ms, prefill_p90_ms=p.p90_ms,
                         decode_ms=d.median_ms, decode_p10_ms=d.p10_ms, decode_p90_ms=d.p90_ms,
                         prefill_tok_s=t / p.median_s, decode_tok_s=1 / d.median_s,
                         prefill_ms_per_token=p.median_ms / t, ratio=(t / p.median_s) * d.median_s,
                         prefill_flops=pc.flops, prefill_bytes=pc.bytes, decode_flops=dc.flops, decode_bytes=dc.bytes))
    return rows


def intensity_rows(phases: pd.DataFrame, peak: float, bw: float) -> pd.DataFrame:
    """Both phases of every measured point, long: FLOP/byte and the achieved share of each roof."""
    import pandas as pd

    rows = []
    for r in phases.itertuples():
        for phase in ("prefill", "decode"):
            flops, nbytes, ms = getattr(r, f"{phase}_flops"), getattr(r, f"{phase}_bytes"), getattr(r, f"{phase}_ms")
            gflops, gbps = flops / ms / 1e6, nbytes / ms / 1e6
            rows.append(dict(model=r.model, phase=phase, tokens=r.tokens, label=f"{phase} T={r.tokens}", flops=flops,
                             bytes=nbytes, intensity=flops / nbytes, ridge=peak / bw, ms=ms, achieved_gflops=gflops,
                             share_of_peak=gflops / peak, achieved_GBps=gbps, share_of_bandwidth=gbps / bw,
                             roof_ms=max(flops / peak, nbytes / bw) / 1e6))
    return pd.DataFrame(rows)


def flop_check_rows(lm, shape, lens) -> list[dict]:
    """The formula (dense attention, as the counter counts it) against FlopCounterMode: the longest prefill, its decode step.

    Random-weight arch: models are counted on the meta device (the same ops, seconds instead of a real forward)."""
    t = max(lens)
    rows = []
    for phase, tokens, context, formula in (("prefill", t, 0, prefill_cost(shape, t, causal=False).flops),
                                            ("decode", 1, t, decode_cost(shape, t).flops)):
        counted = counted_flops(lm.config if lm.timing_only else lm.model, tokens, context)  # arch: on meta, no arithmetic
        total = sum(counted.values())
        rows.append(dict(model=lm.ref, phase=phase, tokens=t, formula_flops=formula, counted_flops=total,
                         ratio=total / formula, counted_ops=", ".join(sorted(counted))))
    return rows


def decode_floor_row(cfg, device, lm, shape, elem, dtype, context, phases: list[dict], peak, bw, gen) -> dict:
    """What bounds a batch-1 decode step: the shrunk twin's time (per-step overhead), the DRAM roof, the compute roof."""
    twin = overhead_twin(lm.config, device, dtype)
    s = time_decode(twin, context, 1, device, cfg, gen)
    c = decode_cost(shape, context, 1, elem)
    measured = next(r["decode_ms"] for r in phases if r["tokens"] == context)
    return dict(model=lm.ref, tokens=context, measured_ms=measured, overhead_ms=s.median_ms, memory_ms=c.bytes / bw / 1e6,
                compute_ms=c.flops / peak / 1e6, weights_MiB=c.weight_bytes / 2**20, kv_MiB=c.kv_bytes / 2**20,
                llc_MiB=last_level_cache_bytes(device) / 2**20)


def measure_crossover(cfg, device, lm, shape, elem, peak, bw, gen, progress) -> pd.DataFrame:
    """Decode at batch B (batch_context cached positions each): time per step against the formula's crossover."""
    import pandas as pd

    from llmlab.core.device import is_oom
    from llmlab.core.render import track

    rows = []
    for b in track(progress, cfg.batch_sizes, "decode batch sweep"):
        try:
            s = time_decode(lm.model, cfg.batch_context, b, device, cfg, gen)
        except RuntimeError as exc:
            if not is_oom(exc):
                raise
            break  # the sweep stops at the batch that does not fit; the table ends there
        c = decode_cost(shape, cfg.batch_context, b, elem)
        rows.append(dict(batch=b, context=cfg.batch_context, ms=s.median_ms, p10_ms=s.p10_ms, p90_ms=s.p90_ms,
                         tok_s=b / s.median_s, flops=c.flops, bytes=c.bytes, intensity=c.intensity,
                         achieved_gflops=c.flops / s.median_s / 1e9, share_of_peak=c.flops / s.median_s / 1e9 / peak,
                         roof_ms=max(c.flops / peak, c.bytes / bw) / 1e6,
                         formula_crossover=crossover_batch(shape, peak / bw, cfg.batch_context, elem),
                         napkin_crossover=peak / bw * elem / 2))  # intensity ~ 2B/elem FLOP per weight byte
    return pd.DataFrame(rows)


def measure_e2e(cfg, device, lm, lens, gen, progress) -> pd.DataFrame:
    """Generation timed end to end against TTFT + (n - 1) ITL from the parts, timed in turn (a prefill,
    n - 1 single decode steps, then one whole generation; repeated), so that a change in machine load
    moves parts and whole alike. TTFT and ITL are the medians of their own calls."""
    import statistics

    import pandas as pd
    import torch

    from llmlab.core.render import track
    from llmlab.inference.decode import decode_one_token, generate, new_cache, prefill

    def timed(fn, *args) -> float:
        device.synchronize()
        t0 = time.perf_counter_ns()
        fn(*args)
        device.synchronize()
        return (time.perf_counter_ns() - t0) / 1e6

    first = lambda model, ids, cache: prefill(model, ids, cache).argmax(-1)  # noqa: E731  (TTFT: the prefill's logits pick token 1)
    step = lambda model, tok, cache: decode_one_token(model, tok, cache).argmax(-1)  # noqa: E731  (ITL)

    rows = []
    jobs = [(t, n) for t in lens for n in cfg.output_lens]
    for t, n in track(progress, jobs, "end to end"):
        ids = torch.randint(0, lm.model.config.vocab_size, (1, t), generator=gen).to(device.torch)  # (1, T)
        tok = ids[:, -1:]  # (1, 1)
        ttft, itl, e2e = [], [], []
        for r in range(cfg.e2e_repeats + 1):  # round 0 is a warm-up
            cache = new_cache(lm.model)
            a = timed(first, lm.model, ids, cache)
            b = [timed(step, lm.model, tok, cache) for _ in range(n - 1)]  # the contexts the reply's steps see
            c = timed(generate, lm.model, ids, n)
            if r:
                ttft.append(a)
                itl += b
                e2e.append(c)
        ttft_ms, itl_ms, measured = statistics.median(ttft), statistics.median(itl), statistics.median(e2e)
        pred = ttft_ms + (n - 1) * itl_ms
        rows.append(dict(model=lm.ref, tokens=t, new_tokens=n, ttft_ms=ttft_ms, itl_ms=itl_ms, predicted_e2e_ms=pred,
                         measured_e2e_ms=measured, error=pred / measured - 1, decode_share=(n - 1) * itl_ms / pred,
                         repeats=cfg.e2e_repeats))
    return pd.DataFrame(rows)


def disagg_rows(cfg, phases: list[dict], shape, elem) -> pd.DataFrame:
    """KV bytes of one request after its prefill, moved over each link, against that prefill and one ITL."""
    import pandas as pd

    links = (("--link-GBps (given)", cfg.link_GBps),) if cfg.link_GBps > 0 else LINKS
    rows = []
    for r in phases:
        kv = kv_bytes(shape, r["tokens"], elem)
        for name, gbps in links:
            ms = kv / gbps / 1e6
            rows.append(dict(model=r["model"], tokens=r["tokens"], link=name, link_GBps=gbps, kv_bytes=kv, transfer_ms=ms,
                             transfer_us=1e3 * ms, prefill_ms=r["prefill_ms"], itl_ms=r["decode_ms"],
                             transfer_over_prefill=ms / r["prefill_ms"], transfer_over_itl=ms / r["decode_ms"]))
    return pd.DataFrame(rows)


def chart_tables(phases: pd.DataFrame, inten: pd.DataFrame, peak: float, bw: float) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Long tables for the two charts: tokens/s per (model, phase) vs T; the roof line and both phases' points."""
    import pandas as pd

    many = phases["model"].nunique() > 1
    name = lambda m, p: f"{m} {p}" if many else p  # noqa: E731
    tps = [dict(series=name(r.model, ph), tokens=r.tokens, tok_s=getattr(r, f"{ph}_tok_s"))
           for ph in ("prefill", "decode") for r in phases.itertuples()]
    lo = min(float(inten["intensity"].min()), peak / bw) / 4
    hi = max(float(inten["intensity"].max()), peak / bw) * 4
    roof = [dict(series="measured roof", intensity=x, gflops=min(peak, x * bw)) for x in (lo * (hi / lo) ** (i / 40) for i in range(41))]
    pts = [dict(series=name(r.model, r.phase), intensity=r.intensity, gflops=r.achieved_gflops) for r in inten.itertuples()]
    return pd.DataFrame(tps), pd.DataFrame(roof + pts)


# ---------------------------------------------------------------- the lab


def run(cfg: Config, device: Device, progress=None) -> LabResult:
    """Measures. Fills tables, env, notes, skipped. Never prints, never judges."""
    import pandas as pd
    import torch

    from llmlab.core.models import load, load_config
    from llmlab.core.results import LabResult

    dtype = model_dtype(cfg, device)
    models, why = gpu_models(cfg, device, dtype)
    cfg = replace(cfg, models=models)  # the models that run are the ones the result records
    res = LabResult.new(LAB, VERSION, cfg)
    if why:
        res.note(f"first model: {why}")
    if not device.is_cuda and dtype == "float16":
        raise UsageError("--dtype float16 on a CPU: no FP16 matmul path to measure; use float32 or bfloat16")
    elem = {"float32": 4, "bfloat16": 2, "float16": 2}[dtype]
    configs = {ref: load_config(ref) for ref in cfg.models}  # a bad --model fails here, before any measuring
    plan = {ref: lengths_for(cfg, ref, int(getattr(c, "max_position_embeddings", 2048)), res) for ref, c in configs.items()}
    if not plan[cfg.models[0]]:
        raise UsageError(f"--prompt-lens {','.join(map(str, cfg.prompt_lens))}: every length is beyond "
                         f"{cfg.models[0]}'s context ({configs[cfg.models[0]].max_position_embeddings} with the replies)")
    threads = pick_threads(cfg, device)
    gen = torch.Generator().manual_seed(cfg.seed)
    sw = Stopwatch(device)
    load_avg, cores = cpu_load()
    res.env.update(dtype=dtype, threads=threads, phases_ms=sw.phases_ms, load_1m=load_avg, cores=cores,
                   timing_only=[m for m in cfg.models if m.startswith("arch:")])
    phases, inten, checks, floors = [], [], [], []
    with res.guard(), torch_threads(threads):
        with sw.phase("roofs"):
            res.add_table("roofs", measure_roofs(cfg, device, dtype, threads))
        peak, bw = _roof(res.tables, "compute"), _roof(res.tables, "bandwidth")
        for i, ref in enumerate(cfg.models):
            if not plan[ref]:
                continue
            with sw.phase(f"load {ref}"):
                try:
                    lm = load(ref, device, dtype)
                except RuntimeError as exc:
                    raise MeasurementError(f"cannot load {ref}: {str(exc).splitlines()[0]}") from None
            shape = Shape.of(lm.config)
            with sw.phase(f"phases {ref}"), torch.inference_mode():
                rows = measure_phases(cfg, device, lm, shape, elem, plan[ref], gen, progress)
                phases += rows
                res.add_table("phases", pd.DataFrame(phases))
                inten.append(intensity_rows(pd.DataFrame(rows), peak, bw))
                floors.append(decode_floor_row(cfg, device, lm, shape, elem, dtype, min(plan[ref]), rows, peak, bw, gen))
            with sw.phase(f"flop count {ref}"):
                checks += flop_check_rows(lm, shape, plan[ref])
            if i == 0:  # the crossover, E2E and disaggregation on the first (built-in) model
                with sw.phase("crossover"), torch.inference_mode():
                    res.add_table("crossover", measure_crossover(cfg, device, lm, shape, elem, peak, bw, gen, progress))
                with sw.phase("e2e"):
                    res.add_table("e2e", measure_e2e(cfg, device, lm, plan[ref], gen, progress))
                res.add_table("disagg", disagg_rows(cfg, rows, shape, elem))
            del lm
        res.add_table("intensity", pd.concat(inten, ignore_index=True))
        res.add_table("decode_floor", pd.DataFrame(floors))
        res.add_table("flop_check", pd.DataFrame(checks))
        tps, roofline = chart_tables(res.tables["phases"], res.tables["intensity"], peak, bw)
        res.add_table("tokens_chart", tps)
        res.add_table("roofline_chart", roofline)
    res.skip("interference", INTERFERENCE)
    load_txt = f", load {load_avg:.1f} on {cores} CPUs" if load_avg is not None else ""
    res.note(f"{threads} thread(s), {dtype}{load_txt}; bytes: llmlab/core/flops.py")
    if res.env["timing_only"]:
        res.note(f"{', '.join(res.env['timing_only'])}: random weights, timings only (never a quality claim)")
    return res


# ---------------------------------------------------------------- judging


def _first_model(t: pd.DataFrame) -> pd.DataFrame:
    return t[t["model"] == t["model"].iloc[0]] if "model" in t else t


def judge(result: LabResult) -> list[Claim]:
    """Pure: every verdict from result.tables alone."""
    from llmlab.core.results import Claim, empty_table

    T = result.tables
    claims = []
    has = {n for n, t in T.items() if not empty_table(t)}  # a part not measured (or cut short by Ctrl-C) gives no verdict
    if not {"roofs", "intensity"} <= has:
        return claims + _later_claims(T, has, None)
    inten = _first_model(T["intensity"])
    peak, bw = _roof(T, "compute"), _roof(T, "bandwidth")
    ridge = peak / bw
    pre = inten[inten["phase"] == "prefill"].sort_values("tokens").iloc[-1]
    dec = inten[inten["phase"] == "decode"].sort_values("tokens").iloc[0]
    m = pre["model"]

    # 1. prefill: above the ridge and at least half the compute roof
    holds = pre["intensity"] > ridge and pre["share_of_peak"] >= BOUND_SHARE
    claims.append(Claim("prefill_decode.prefill_compute_bound", f"prefill ({m}, T={int(pre['tokens'])}) is compute-bound",
                        f"> ridge {ridge:.1f} FLOP/B, >= {BOUND_SHARE:.0%} of peak",
                        f"{pre['intensity']:.0f} FLOP/B, {pre['share_of_peak']:.0%} of {peak:.0f} GFLOP/s", holds,
                        note="" if holds else _why_not_compute(pre, ridge)))

    # 2. decode: below the ridge and at least half the bandwidth roof; the note says what bounds it
    holds = dec["intensity"] < ridge and dec["share_of_bandwidth"] >= BOUND_SHARE
    claims.append(Claim("prefill_decode.decode_memory_bound", f"decode ({m}, batch 1) is memory-bound",
                        f"< ridge {ridge:.1f} FLOP/B, >= {BOUND_SHARE:.0%} of {bw:.1f} GB/s",
                        f"{dec['intensity']:.2f} FLOP/B, {dec['share_of_bandwidth']:.0%} ({dec['achieved_GBps']:.2f} GB/s)",
                        holds, note=_decode_bound(T, m)))

    # 3. tokens/s ratio: at least half the roofline's (decode on the bandwidth roof, prefill on its roof)
    if "phases" in has:
        ph = _first_model(T["phases"]).sort_values("tokens").iloc[-1]
        napkin = float(ph["tokens"]) * (float(dec["bytes"]) / bw / 1e6) / float(pre["roof_ms"])
        claims.append(Claim("prefill_decode.prefill_tokens_per_s_ratio",
                            f"prefill makes far more tokens/s than decode (T={int(ph['tokens'])})",
                            f">= 0.5x the roofline's {napkin:.1f}x, i.e. >= {0.5 * napkin:.1f}x",
                            f"{ph['ratio']:.0f}x ({ph['prefill_tok_s']:.0f} vs {ph['decode_tok_s']:.1f} tok/s)",
                            ph["ratio"] >= 0.5 * napkin, note="under half the roofline's ratio: prefill runs far below its roof"))
    return claims + _later_claims(T, has, ridge)


def _later_claims(T: dict[str, pd.DataFrame], has: set[str], ridge: float | None) -> list[Claim]:
    from llmlab.core.results import Claim

    claims = []
    # 4. the crossover batch
    if ridge is not None:
        claims.append(_crossover_claim(T.get("crossover"), ridge))

    # 5. TTFT grows with T, ITL barely does
    ph1 = _first_model(T["phases"]).sort_values("tokens") if "phases" in has else ()
    cid = "prefill_decode.ttft_grows_itl_flat"
    if len(ph1) >= 2:
        a, b = ph1.iloc[0], ph1.iloc[-1]
        ttft_x, itl_x = b["prefill_ms"] / a["prefill_ms"], b["decode_ms"] / a["decode_ms"]
        flop_x, byte_x = b["prefill_flops"] / a["prefill_flops"], b["decode_bytes"] / a["decode_bytes"]
        holds = ttft_x >= 2 * itl_x and itl_x <= 1.5
        claims.append(Claim(cid, f"T {int(a['tokens'])} -> {int(b['tokens'])}: TTFT grows, ITL barely moves",
                            f"TTFT x >= 2 x ITL x, ITL x <= 1.5 (formula: TTFT x{flop_x:.0f}, ITL x{byte_x:.2f})",
                            f"TTFT x{ttft_x:.1f}, ITL x{itl_x:.2f}",
                            holds, note="ITL grew > 1.5x: the KV cache is large next to the weights" if itl_x > 1.5 else
                            "TTFT grew < 2x ITL's growth: fixed costs dominate short prompts"))
    else:
        claims.append(Claim(cid, "TTFT grows with T, ITL barely moves", "two prompt lengths", "-", None,
                            note="not measured: one prompt length only"))

    # 6. E2E from the parts
    e2e = T.get("e2e")
    if e2e is not None and len(e2e):
        w = e2e.loc[e2e["error"].abs().idxmax()]
        claims.append(Claim("prefill_decode.e2e_from_parts", "E2E = TTFT + (n - 1) x ITL, from the parts",
                            f"every (T, n) within {E2E_TOL:.0%}", f"worst {w['error']:+.1%} (T={int(w['tokens'])}, n={int(w['new_tokens'])})",
                            abs(w["error"]) <= E2E_TOL, note="parts and whole timed apart: a busy CPU moves them"))

    # 7. the FLOP formula against FlopCounterMode
    if "flop_check" in has:
        fc = T["flop_check"]
        w = fc.loc[(fc["ratio"] - 1).abs().idxmax()]
        claims.append(Claim("prefill_decode.flops_formula", "FLOPs from the shape = FlopCounterMode's count",
                            f"both phases within {FLOP_TOL:.0%}", f"worst {w['ratio']:.4f}x ({w['model']} {w['phase']})",
                            abs(w["ratio"] - 1) <= FLOP_TOL, note="the formula misses (or adds) an op the model runs"))

    # 8. disaggregation: moving the KV costs less than recomputing it; the interference it removes is not measured
    dis = T.get("disagg")
    if dis is not None and len(dis):
        w = dis.loc[dis["transfer_over_prefill"].idxmax()]
        claims.append(Claim("prefill_decode.kv_move_cheaper_than_prefill", "moving a request's KV costs less than its prefill",
                            "every T and link < 1x its prefill", f"worst {w['transfer_over_prefill']:.1e}x prefill (T={int(w['tokens'])}, {w['link'].split()[0]})",
                            w["transfer_over_prefill"] < 1, note="this link is slower than recomputing the prompt"))
    return claims


def _why_not_compute(pre, ridge) -> str:
    if pre["intensity"] <= ridge:
        return "below the ridge: by the formula memory bounds it"
    return f"above the ridge but at {pre['share_of_peak']:.0%} of peak: the forward's small ops run far below the matmul roof"


def decode_bound(fl_row) -> tuple[str, float]:
    """(what bounds a batch-1 decode step, the share of the measured time it explains) from a decode_floor row.

    The DRAM roof applies only when the weights and KV do not fit in the last-level cache."""
    r = fl_row
    est = {"per-step overhead": r["overhead_ms"], "compute": r["compute_ms"]}
    if r["weights_MiB"] + r["kv_MiB"] > r["llc_MiB"]:
        est["memory bandwidth"] = r["memory_ms"]
    top = max(est, key=est.get)
    return top, est[top] / r["measured_ms"]


def _decode_bound(T, model) -> str:
    fl = T.get("decode_floor")
    if fl is None or not len(fl[fl["model"] == model]):
        return ""
    r = fl[fl["model"] == model].iloc[0]
    top, share = decode_bound(r)
    cached = r["weights_MiB"] + r["kv_MiB"] <= r["llc_MiB"]
    where = f"weights in the {r['llc_MiB']:.0f} MiB cache: " if cached else ""
    return (f"{where}{top} bounds it ({share:.0%} of {r['measured_ms']:.1f} ms; overhead {r['overhead_ms']:.1f}, "
            f"DRAM {r['memory_ms']:.1f}, compute {r['compute_ms']:.2f} ms)")


def measured_knee(cx: pd.DataFrame) -> tuple[float, bool]:
    """Where the flat batch-1 step time meets the ray through the largest batch's: t1 x Bmax / t(Bmax).

    Reached only when the largest batch took at least twice the batch-1 time (compute shows)."""
    t1, last = float(cx.iloc[0]["ms"]), cx.iloc[-1]
    return t1 * float(last["batch"]) / float(last["ms"]), float(last["ms"]) >= 2 * t1


def _crossover_claim(cx, ridge) -> Claim:
    from llmlab.core.results import Claim

    cid, text = "prefill_decode.crossover_batch", "decode turns compute-bound near the formula's batch"
    if cx is None or len(cx) < 2:
        return Claim(cid, text, "a batch sweep", "-", None, note="not measured: fewer than two batch sizes")
    cx = cx.sort_values("batch")
    pred, napkin = float(cx.iloc[0]["formula_crossover"]), float(cx.iloc[0]["napkin_crossover"])
    knee, reached = measured_knee(cx)
    bmax, grow = int(cx.iloc[-1]["batch"]), cx.iloc[-1]["ms"] / cx.iloc[0]["ms"]
    expected = (f"knee within 0.5-2x of B ~{pred:.0f} (napkin ~{napkin:.0f}: ridge {ridge:.1f} FLOP/B)" if math.isfinite(pred)
                else "never (the KV grows as fast as the FLOPs)")
    note = "within 2x holds; a late knee: fixed per-step costs hide the compute until large batches"
    if reached:
        holds = math.isfinite(pred) and 0.5 <= knee / pred <= 2
        measured = f"B ~{knee:.0f} (step x{grow:.1f} at B={bmax})"
        if math.isfinite(pred) and knee < pred / 2:
            note = "within 2x holds; an early knee: the step grew before compute binds (load, or per-sequence costs)"
    else:
        holds = False if math.isfinite(pred) and pred <= bmax else None
        measured = f"not by B={bmax} (step x{grow:.1f})"
        if holds is None:
            note = "not measured: the sweep ends before the formula's batch (add larger --batch-sizes)"
    return Claim(cid, text, expected, measured, holds, note=note)


# ---------------------------------------------------------------- the report


def views(result: LabResult) -> list[View]:
    """The report's parts, in the order of the article."""
    from llmlab.core.results import Chart, Col, View

    many = "phases" in result.tables and result.tables["phases"]["model"].nunique() > 1
    dis = result.tables.get("disagg")
    links = list(dict.fromkeys(zip(dis["link"], dis["link_GBps"], strict=True))) if dis is not None and len(dis) else []
    model = (Col("model", "model", "text", 12),) if many else ()
    return [
        View("1. The two phases timed", "How many tokens/s does reading the prompt make, and writing the reply?", "phases",
             (*model, Col("tokens", "T", "int"), Col("prefill_ms", "prefill ms"), Col("prefill_tok_s", "prefill tok/s", "int"),
              Col("decode_ms", "decode ms/token"), Col("decode_tok_s", "decode tok/s", ".1f"),
              Col("ratio", "prefill / decode", "x")),
             chart=Chart("tokens/s vs T (log-log)", "tokens_chart", "tokens", "tok_s", kind="line", series="series",
                         logx=True, logy=True, xlabel="prompt length T (log)", ylabel="tokens/s (log)")),
        View("2. Why: arithmetic intensity per phase", "Where does each phase sit against this machine's ridge point?",
             "intensity", (Col("label", "phase", "text", 14), Col("intensity", "FLOP/byte"), Col("ridge", "ridge"),
                           Col("achieved_gflops", "GFLOP/s"), Col("share_of_peak", "% of peak", "%"),
                           Col("achieved_GBps", "GB/s"), Col("share_of_bandwidth", "% of GB/s", "%")),
             rows=_ends,
             chart=Chart("both phases on the measured roofline (log-log)", "roofline_chart", "intensity", "gflops",
                         kind="scatter", series="series", logx=True, logy=True,
                         xlabel="FLOP/byte (log)", ylabel="GFLOP/s (log)")),
        View("3. Where the crossover is", "At which decode batch does the step stop being flat (compute-bound)?",
             "crossover", (Col("batch", "batch", "int"), Col("ms", "ms / step"), Col("tok_s", "tok/s", "int"),
                           Col("intensity", "FLOP/byte"), Col("share_of_peak", "% of peak", "%"), Col("roof_ms", "roof ms"))),
        View("4. The two numbers: TTFT and ITL", "Does E2E = TTFT + (n - 1) x ITL, from the parts, match the whole?", "e2e",
             (Col("tokens", "T", "int"), Col("new_tokens", "n", "int"), Col("ttft_ms", "TTFT ms"), Col("itl_ms", "ITL ms"),
              Col("predicted_e2e_ms", "E2E pred. ms"), Col("measured_e2e_ms", "E2E ms"), Col("error", "error", "%"))),
        View("5. Disaggregation, napkin form", "What does moving one request's KV cost next to its prefill? (links: "
             + ", ".join(f"{name} {gbps:g} GB/s" for name, gbps in links) + ")", "disagg",
             (Col("tokens", "T", "int"), Col("kv_bytes", "KV bytes", "int"),
              *(Col(f"us_{i}", f"{name.split()[0]} us", ".3g") for i, (name, _) in enumerate(links)),
              Col("prefill_ms", "prefill ms"), Col("itl_ms", "ITL ms")), rows=_by_tokens),
    ]


def _ends(df: pd.DataFrame) -> pd.DataFrame:
    """The smallest and the largest T of each phase (the chart shows every point)."""
    df = _first_model(df)
    keep = df["tokens"].isin([df["tokens"].min(), df["tokens"].max()])
    return df[keep].sort_values(["phase", "tokens"], ascending=[False, True])


def _by_tokens(df: pd.DataFrame) -> pd.DataFrame:
    """One row per T, the transfer time over each link in its own column (us_0, us_1, ...)."""
    df = _first_model(df)
    out = df.drop_duplicates("tokens")[["tokens", "kv_bytes", "prefill_ms", "itl_ms"]].reset_index(drop=True)
    for i, link in enumerate(dict.fromkeys(df["link"])):
        g = df[df["link"] == link]
        out[f"us_{i}"] = out["tokens"].map(dict(zip(g["tokens"], g["transfer_us"], strict=True)))
    return out


def headline(result: LabResult, claims: list[Claim]) -> str:
    """The ratio of the two phases, and what bounds decode here."""
    from llmlab.core.results import empty_table

    if empty_table(result.tables.get("phases")):
        return ""
    ph = _first_model(result.tables["phases"]).sort_values("tokens").iloc[-1]
    text = (f"{ph['model']}: prefill (T={int(ph['tokens'])}) makes {ph['ratio']:.0f}x the tokens/s of decode "
            f"({ph['prefill_tok_s']:.0f} vs {ph['decode_tok_s']:.1f}).")
    fl = result.tables.get("decode_floor")
    if fl is not None and len(fl):
        r = fl.iloc[0]
        top, share = decode_bound(r)
        if top != "memory bandwidth":
            text += (f" Decode is bound by {top} ({share:.0%} of its {r['measured_ms']:.1f} ms), not memory"
                     + (": the weights sit in cache." if r["weights_MiB"] + r["kv_MiB"] <= r["llc_MiB"] else "."))
    return text


def figures(result: LabResult) -> list[tuple[str, object]]:
    """Extra matplotlib figures for the HTML report: TTFT and ITL vs T, and the decode batch crossover."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = []
    ph = result.tables.get("phases")
    if ph is not None and len(ph):
        fig, ax = plt.subplots(figsize=(6, 4))
        for model, g in ph.groupby("model", sort=False):
            ax.plot(g["tokens"], g["prefill_ms"], "o-", label=f"{model} TTFT (prefill)")
            ax.plot(g["tokens"], g["decode_ms"], "s--", label=f"{model} ITL (decode step)")
        ax.set(xscale="log", yscale="log", xlabel="prompt length T (tokens)", ylabel="ms", title="TTFT grows with T, ITL barely")
        ax.legend(fontsize=8)
        out.append(("TTFT and ITL vs prompt length", fig))
    cx = result.tables.get("crossover")
    if cx is not None and len(cx):
        fig, ax = plt.subplots(figsize=(6, 4))
        ax.plot(cx["batch"], cx["ms"], "o-", label="decode step (measured)")
        ax.plot(cx["batch"], cx["roof_ms"], ":", label="roofline: max(FLOPs/peak, bytes/BW)")
        b = float(cx["formula_crossover"].iloc[0])
        if math.isfinite(b):
            ax.axvline(b, color="grey", linestyle="--", label=f"formula crossover B ~{b:.0f}")
        ax.set(xscale="log", yscale="log", xlabel="decode batch B", ylabel="ms per step", title="where decode turns compute-bound")
        ax.legend(fontsize=8)
        out.append(("decode batch crossover", fig))
    return out
