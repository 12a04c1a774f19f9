"""The roofline traced and an LLM placed on it: the GEMM intensity sweep, the per-op overlay, the timed decode step."""

from __future__ import annotations

import math
from contextlib import nullcontext

import numpy as np
import pandas as pd
import torch

from llmlab.core.device import Device, is_oom, torch_threads
from llmlab.core.flops import Shape, kv_bytes_per_token, shape
from llmlab.core.render import track
from llmlab.core.results import LabResult
from llmlab.core.roofs import gemm_operands, matmul_fn, tf32, torch_dtype
from llmlab.core.specs import bandwidth_spec_GBps, peak_for
from llmlab.core.stats import Summary
from llmlab.core.timing import LATENCY, L2Flusher, measure
from llmlab.inference.decode import decode_one_token, new_cache, prefill
from llmlab.labs.roofline.config import DTYPES, Config
from llmlab.labs.roofline.measure import (
    Roofs,
    device_generator,
    matmul_backends,
    pick_fastest,
    pick_threads,
    thread_counts,
)

# ---------------------------------------------------------------- 4. intensity sweep


def gemm_intensity(m: int, k: int, n: int, elem: int) -> tuple[int, int, float]:
    """(FLOPs, bytes, FLOP/byte) of (M,K) @ (K,N): A, B and C each moved once."""
    flops = 2 * m * k * n
    nbytes = elem * (m * k + k * n + m * n)
    return flops, nbytes, flops / nbytes


def measure_intensity(cfg: Config, device: Device, dtype: str, roofs: Roofs, progress=None) -> pd.DataFrame:
    flush = L2Flusher(device)
    gen = device_generator(device, cfg.seed + 1)
    k = n = cfg.intensity_kn_gpu if device.is_cuda else cfg.intensity_kn
    elem = torch_dtype(dtype).itemsize
    rows = []
    with tf32(dtype == "tf32") if device.is_cuda else nullcontext():
        _, w, _ = gemm_operands(1, k, n, dtype, device, gen)  # (N, K) weight, nn.Linear's layout, shared by every M
        for m in track(progress, cfg.intensity_batches, "intensity sweep"):
            x, _, out = gemm_operands(m, n, k, dtype, device, gen)  # (M, K) activations, (M, N) out
            cands = {(b, t): (matmul_fn(b, x, w.t(), out), t or torch.get_num_threads())  # x @ W^T, as F.linear does
                     for b, t in matmul_backends(device, dtype)}
            backend, threads = pick_fastest(cands, device)  # per M: small M wants other kernels than large M
            with torch_threads(cands[(backend, threads)][1]):
                s = measure(cands[(backend, threads)][0], device, mode=LATENCY, warmup=0 if not device.is_cuda else 1,
                            repeats=cfg.intensity_repeats, setup=flush)
            flops, nbytes, ai = gemm_intensity(m, k, n, elem)
            roof = roofs.attainable(dtype, ai)
            rows.append(dict(m=m, k=k, n=n, dtype=dtype, backend=backend, threads=threads or "blas default",
                             flops=flops, bytes=nbytes, intensity=ai,
                             median_gflops=flops / (s.median / 1e3) / 1e9,
                             best_gflops=flops / (s.min / 1e3) / 1e9,
                             roof_gflops=roof, fraction_of_roof=flops / (s.median / 1e3) / 1e9 / roof,
                             bound="memory" if ai < roofs.ridge(dtype) else "compute", median_ms=s.median))
    return pd.DataFrame(rows)


# ---------------------------------------------------------------- 5. the LLM overlay


def attention_cost(config, tokens: int, context: int, elem: int, prefill: bool) -> tuple[int, int]:
    """(FLOPs, bytes) of QK^T and PV over all layers: Q, K, V, O each moved once (flash-attention style)."""
    s = shape(config)
    q, kv, hd, L = s["heads"], s["kv_heads"], s["head_dim"], s["layers"]
    pairs = tokens * (tokens + 1) // 2 if prefill else tokens * context  # causal prefill; decode sees the context
    flops = 4 * q * hd * pairs * L  # 2 FLOPs x (QK^T + PV)
    kv_tokens = tokens if prefill else tokens * context
    nbytes = elem * L * (2 * tokens * q * hd + 2 * kv_tokens * kv * hd)
    return flops, nbytes


def overlay_table(config, roofs: Roofs, dtype: str, prefill_tokens: int, batches, context: int) -> pd.DataFrame:
    """Analytic: each matmul of prefill (M = S, lm_head on the last position only) and decode (M = B)."""
    elem = torch_dtype(dtype).itemsize
    phases = [("prefill", prefill_tokens)] + [("decode", b) for b in batches]
    rows = []
    for phase, m in phases:
        for name, k, n, count in Shape.of(config).matmuls():
            mm = 1 if (phase == "prefill" and name == "lm_head") else m  # logits_to_keep=1
            flops, nbytes, ai = gemm_intensity(mm, k, n, elem)
            rows.append(_overlay_row(phase, m, name, mm, k, n, count, flops, nbytes, roofs, dtype))
        flops, nbytes = attention_cost(config, m, context, elem, prefill=phase == "prefill")
        rows.append(_overlay_row(phase, m, "attention", m, None, None, 1, flops, nbytes, roofs, dtype))
    return pd.DataFrame(rows)


def _overlay_row(phase, tokens, op, m, k, n, count, flops, nbytes, roofs: Roofs, dtype) -> dict:
    ai = flops / nbytes
    roof = roofs.attainable(dtype, ai)
    total_flops = flops * count
    return dict(phase=phase, tokens=tokens, op=op, m=m, k=k, n=n, count=count, flops=total_flops,
                bytes=nbytes * count, intensity=ai, attainable_gflops=roof,
                bound="memory" if ai < roofs.ridge(dtype) else "compute", roof_us=total_flops / roof / 1e3)


def step_cost(config, batch: int, context: float, elem: int) -> dict:
    """One decode step at batch B: weights read once, KV read per sequence, 2 x matmul params x B FLOPs."""
    mm_params = Shape.of(config).matmul_params
    weight_bytes = elem * mm_params
    kv_bytes = batch * context * kv_bytes_per_token(config, elem)
    attn_flops, _ = attention_cost(config, batch, int(round(context)), elem, prefill=False)
    return dict(matmul_params=mm_params, weight_bytes=weight_bytes, kv_bytes=int(kv_bytes),
                bytes=int(weight_bytes + kv_bytes), flops=2 * mm_params * batch + attn_flops)


def predicted_knee(config, roofs: Roofs, dtype: str, context: float) -> float:
    """Batch where decode intensity reaches the ridge: B = R*W / (f1 - R*b1), inf if it never does."""
    elem = torch_dtype(dtype).itemsize
    one, two = step_cost(config, 1, context, elem), step_cost(config, 2, context, elem)
    f1, b1 = two["flops"] - one["flops"], two["bytes"] - one["bytes"]  # per extra sequence
    w = one["bytes"] - b1
    r = roofs.ridge(dtype)
    return r * w / (f1 - r * b1) if f1 > r * b1 else math.inf


def decode_budget_bytes(cfg: Config, device: Device) -> int:
    return int(0.5 * device.free_memory_bytes()) if device.is_cuda else int(cfg.decode_max_gib * 2**30)


def measure_decode(cfg: Config, device: Device, lm, dtype: str, roofs: Roofs, res: LabResult,
                   progress=None) -> pd.DataFrame:
    model, config = lm.model, lm.config
    elem = torch_dtype(DTYPES[dtype]).itemsize
    peak = roofs.peak_gflops[DTYPES[dtype]]
    gen = torch.Generator().manual_seed(cfg.seed + 2)
    rows, threads = [], None  # the thread count is probed at the first batch and kept (a busy CPU makes probes costly)
    for batch in track(progress, cfg.decode_batches, "decode steps"):
        try:
            s, threads = time_decode_step(model, batch, cfg.decode_context, cfg.decode_steps, device, gen, threads)
        except RuntimeError as exc:
            if is_oom(exc):
                res.note(f"decode sweep stopped at batch {batch}: out of memory")
                break
            raise
        context = cfg.decode_context + 2 + cfg.decode_steps / 2  # mean cache length over the timed steps
        c = step_cost(config, batch, context, elem)
        gflops = c["flops"] / (s.median / 1e3) / 1e9
        roof_ms = max(c["bytes"] / roofs.bandwidth_GBps / 1e6, c["flops"] / peak / 1e6)
        rows.append(dict(batch=batch, threads=threads, context=context, median_ms=s.median, p10_ms=s.p10,
                         p90_ms=s.p90,
                         weight_bytes=c["weight_bytes"], kv_bytes=c["kv_bytes"], bytes=c["bytes"], flops=c["flops"],
                         intensity=c["flops"] / c["bytes"], achieved_GBps=c["bytes"] / (s.median / 1e3) / 1e9,
                         pct_of_bandwidth=100 * c["bytes"] / (s.median / 1e3) / 1e9 / roofs.bandwidth_GBps,
                         achieved_gflops=gflops, pct_of_peak_compute=100 * gflops / peak,
                         roof_ms=roof_ms, measured_over_roof=s.median / roof_ms, tokens_per_s=batch / (s.median / 1e3)))
    return pd.DataFrame(rows)


def time_decode_step(model, batch: int, context: int, steps: int, device: Device, gen: torch.Generator,
                     threads: int | None = None) -> tuple[Summary, int]:
    """Prefill `context` random tokens per sequence, then time `steps` decode steps (the cache grows by one each)
    at `threads` (None: probe for the faster count)."""
    vocab = model.config.vocab_size
    cache = new_cache(model)
    ids = torch.randint(0, vocab, (batch, context), generator=gen).to(device.torch)  # (B, S)
    with torch_threads(min(thread_counts(device))):  # not timed: the cheap way (one thread wins on a busy CPU)
        prefill(model, ids, cache)  # fills the KV cache
    tok = torch.randint(0, vocab, (batch, 1), generator=gen).to(device.torch)  # (B, 1)
    step = lambda: decode_one_token(model, tok, cache)  # noqa: E731
    threads = threads or pick_threads(step, device)
    with torch_threads(threads):
        return measure(step, device, mode=LATENCY, warmup=1, repeats=steps), threads


# ---------------------------------------------------------------- the chart


def chart_table(roofs: Roofs, dtype: str, device: Device, sweep: pd.DataFrame, overlay: pd.DataFrame,
                dec: pd.DataFrame | None) -> pd.DataFrame:
    pts = [sweep["intensity"], overlay["intensity"]] + ([dec["intensity"]] if dec is not None and len(dec) else [])
    lo = min(float(p.min()) for p in pts) / 16  # room on the left: the legend covers the top-left corner
    hi = max(max(float(p.max()) for p in pts), roofs.ridge(dtype)) * 2
    grid = np.geomspace(lo, hi, 60)
    rows = [dict(series=f"measured roof ({dtype})", intensity=x, gflops=roofs.attainable(dtype, x)) for x in grid]
    spec, _ = peak_for(device, dtype)
    spec_bw, _ = bandwidth_spec_GBps(device)
    if spec:  # sparse points: a dashed line
        label = "spec roof" if spec_bw else "spec peak"
        rows += [dict(series=label, intensity=x, gflops=min(spec, x * spec_bw) if spec_bw else spec) for x in grid[::4]]
    rows += [dict(series="GEMM sweep", intensity=r.intensity, gflops=r.median_gflops) for r in sweep.itertuples()]
    decode = overlay[overlay["phase"] == "decode"]
    ops = pd.concat([overlay[overlay["phase"] == "prefill"], decode[decode["tokens"] == decode["tokens"].min()]])
    rows += [dict(series="LLM matmuls (on roof)", intensity=r.intensity, gflops=r.attainable_gflops)
             for r in ops.itertuples()]
    if dec is not None:
        rows += [dict(series="decode steps", intensity=r.intensity, gflops=r.achieved_gflops) for r in dec.itertuples()]
    return pd.DataFrame(rows)


