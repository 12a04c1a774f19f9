"""The timing harness: the two phases timed on a model, the roofs, which models and lengths a run takes."""

from __future__ import annotations

import copy

import pandas as pd
import torch
from transformers import AutoModelForCausalLM

from llmlab.core import roofs
from llmlab.core.device import Device, cpu_load, last_level_cache_bytes
from llmlab.core.models import torch_dtype
from llmlab.core.results import LabResult
from llmlab.core.roofs import gpu_speed_model
from llmlab.core.stats import Summary
from llmlab.core.timing import LATENCY, measure
from llmlab.inference.decode import crop, decode_one_token, new_cache, prefill
from llmlab.labs.prefill_decode.config import Config


def model_dtype(cfg: Config, device: Device) -> str:
    return cfg.dtype if cfg.dtype != "auto" else ("bfloat16" if device.is_cuda else "float32")


def pick_threads(cfg: Config, device: Device) -> int:
    """--threads, else torch's count, or 1 on an oversubscribed CPU (an OpenMP region waits for its slowest thread)."""
    if cfg.threads or device.is_cuda:
        return cfg.threads or torch.get_num_threads()
    load, cores = cpu_load()
    return 1 if load is not None and load >= cores else torch.get_num_threads()


def fill_cache(model, batch: int, context: int, gen: torch.Generator):
    """A KV cache of `context` random positions per sequence: what a prefill leaves, without the prefill's cost."""

    c, dev, dt = model.config, model.device, model.dtype
    kv, hd = c.num_key_value_heads, getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    cache = new_cache(model)
    for layer in range(c.num_hidden_layers):
        k = torch.randn(batch, kv, context, hd, generator=gen).to(dev, dt)  # (B, KV, T, D)
        cache.update(k, torch.randn_like(k), layer)
    return cache


def time_prefill(model, tokens: int, device: Device, cfg: Config, gen: torch.Generator) -> Summary:
    """Prefill forward + choosing the first token (= TTFT without tokenising or queueing), a fresh cache each call."""

    ids = torch.randint(0, model.config.vocab_size, (1, tokens), generator=gen).to(device.torch)  # (1, T)
    box = {}
    setup = lambda: box.update(cache=new_cache(model))  # noqa: E731  (outside the timed call)
    fn = lambda: prefill(model, ids, box["cache"]).argmax(-1)  # noqa: E731
    return measure(fn, device, mode=LATENCY, warmup=1, repeats=cfg.repeats, setup=setup, max_time_s=cfg.max_point_s)


def time_decode(model, context: int, batch: int, device: Device, cfg: Config, gen: torch.Generator) -> Summary:
    """One decode step + choosing the token (= ITL) at exactly `context` cached positions (cropped back each call)."""

    cache = fill_cache(model, batch, context, gen)
    tok = torch.randint(0, model.config.vocab_size, (batch, 1), generator=gen).to(device.torch)  # (B, 1)
    fn = lambda: decode_one_token(model, tok, cache).argmax(-1)  # noqa: E731
    return measure(fn, device, mode=LATENCY, warmup=1, repeats=max(cfg.repeats, 5), setup=lambda: crop(cache, context),
                   max_time_s=cfg.max_point_s)


def overhead_twin(config, device: Device, dtype: str):
    """The same architecture (layers, every op in the same order) with every size shrunk to a few dozen:
    its decode step moves ~no bytes and does ~no FLOPs, so its time is the fixed per-step cost."""


    c = copy.deepcopy(config)
    gqa = c.num_key_value_heads < c.num_attention_heads
    c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim = 32, 2, 1 if gqa else 2, 16
    c.intermediate_size, c.vocab_size = 32, 64
    with torch.device(device.torch):
        return AutoModelForCausalLM.from_config(c, dtype=torch_dtype(dtype)).eval()


def measure_roofs(cfg: Config, device: Device, dtype: str, threads: int) -> pd.DataFrame:
    """Bandwidth (STREAM read and triad, the best) and the matmul peak, with the roofline's kernels, at `threads`."""

    spec = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}[dtype]
    roofs.warm_up(device)
    bufs = roofs.bandwidth_buffers(device, roof_llc_multiple(cfg, device))
    bws = [roofs.measure_bandwidth(device, k, bufs=bufs, blocks=cfg.roof_blocks, threads=threads)
           for k in ("read", "triad")]
    del bufs
    # CPU: 4-8 GFLOP, ~0.2 s each
    shapes = (roofs.GPU_SHAPES if device.is_cuda else roofs.CPU_SHAPES[1:])[:cfg.roof_shapes]
    peak = roofs.matmul_peak_gflops(device, spec, shapes=shapes, repeats=cfg.roof_repeats, threads=threads)
    bw = max(bws, key=lambda b: b.median_GBps)
    return pd.DataFrame([
        dict(roof="bandwidth", value=bw.median_GBps, unit="GB/s",
             how=f"STREAM {bw.kernel}, {bw.buffer_bytes / 2**20:.0f} MiB buffers, {threads} threads"),
        dict(roof="compute", value=peak, unit="GFLOP/s",
             how=f"{spec} matmul, best median of {len(shapes)} shapes, {threads} threads"),
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
    first, why = gpu_speed_model(cfg.models[0], cfg.cuda_model, device, dtype)
    return tuple(dict.fromkeys((first, *cfg.models))), why


def lengths_for(cfg: Config, ref: str, max_pos: int, res: LabResult) -> list[int]:
    """The prompt lengths a model can take: within its context (room left for the replies) and arch_max_len."""
    room = max(cfg.output_lens)
    cap = max_pos - room if not ref.startswith("arch:") else min(max_pos - room, cfg.arch_max_len)
    lens = sorted({int(t) for t in cfg.prompt_lens if t <= cap})
    dropped = sorted({int(t) for t in cfg.prompt_lens if t > cap})
    if dropped:
        why = (f"arch: shapes are timed up to {cap}" if cap < max_pos - room
               else f"context {max_pos} minus {room} reply tokens")
        res.note(f"{ref}: T = {', '.join(map(str, dropped))} clamped away ({why})")
    return lens
