"""Part 4 of the samplers lab: the cost of one sampling step, ours and Hugging Face's, and its share of a decode
step."""

from __future__ import annotations

import time

import torch

from llmlab.core.device import Device, cpu_load
from llmlab.core.render import track
from llmlab.core.results import LabResult
from llmlab.core.timing import LATENCY, measure
from llmlab.inference import decode
from llmlab.inference import sampling as S
from llmlab.labs.samplers.config import GOAL, Config
from llmlab.labs.samplers.fates import strategy_kwargs

# ----------------------------------------------------------------------------- 4. latency


def step_fns(cfg: Config, gen: torch.Generator) -> dict[tuple[str, str], callable]:
    """One sampling step (B, V) logits -> (B,) ids per (strategy, implementation)."""
    from transformers.generation.logits_process import (
        MinPLogitsWarper,
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    hf_warpers = {
        "temperature": TemperatureLogitsWarper(cfg.temperature), "top_k": TopKLogitsWarper(cfg.top_k),
        "top_p": TopPLogitsWarper(cfg.top_p), "min_p": MinPLogitsWarper(cfg.min_p),
    }
    fns = {("greedy", "argmax"): S.greedy}
    for name, w in hf_warpers.items():
        kw = strategy_kwargs(cfg, name)
        fns[(name, "hf+multinomial")] = lambda x, w=w: torch.multinomial(w(None, x).softmax(-1), 1, generator=gen)
        fns[(name, "ours+race")] = lambda x, kw=kw: S.sample_gumbel(S.process_logits(x, **kw), gen, is_probs=False)
    fns[("top_k", "ours sorting-free")] = lambda x: S.top_k_sorting_free(x.softmax(-1), cfg.top_k, gen)
    fns[("top_p", "ours sorting-free")] = lambda x: S.top_p_sorting_free(x.softmax(-1), cfg.top_p, gen)
    return fns


def time_step(fn, x: torch.Tensor, device: Device, budget: float):
    """Per-call times of fn(x): many calls when it is fast, a few when it is slow (one sample each)."""
    t0 = time.perf_counter()
    fn(x)  # warm-up, and a probe of the cost
    device.synchronize()
    probe = time.perf_counter() - t0
    repeats = max(3, min(50, int(budget / max(probe, 1e-6))))
    return measure(lambda: fn(x), device, mode=LATENCY, warmup=1 if probe < 0.05 else 0, repeats=repeats,
                   max_time_s=budget)


def part_latency(res: LabResult, cfg: Config, lm, device: Device, prompt_logits: torch.Tensor, progress) -> None:
    V_model = lm.config.vocab_size
    vocabs = sorted({V_model if v == 0 else v for v in cfg.vocab_sizes})
    cells = sorted(((V, B) for V in vocabs for B in cfg.batch_sizes), key=lambda c: c[0] * c[1])
    scale = float(prompt_logits.std())  # synthetic logits spread like the model's real ones
    gen = torch.Generator(device=device.torch).manual_seed(cfg.seed + 2)
    fns = step_fns(cfg, gen)
    note_busy_cpu(res, device)
    rows, started = [], time.perf_counter()
    for V, B in track(progress, cells, "latency: vocab x batch"):
        if time.perf_counter() - started > cfg.latency_budget_s:
            res.note(f"latency sweep stopped before V={V:,}, B={B} (its {cfg.latency_budget_s:.0f} s budget)")
            break
        x = torch.randn(B, V, generator=gen, device=device.torch) * scale  # (B, V)
        cell = []
        for (name, impl), fn in fns.items():
            st = time_step(fn, x, device, cfg.sample_budget_s)
            cell.append({"vocab": V, "batch": B, "strategy": name, "impl": impl, **st.as_dict("latency_", "_ms")})
        greedy_ms = cell[0]["latency_median_ms"]
        for r in cell:
            r["vs_greedy"] = r["latency_median_ms"] / greedy_ms
            r["us_per_row"] = r["latency_median_ms"] * 1e3 / B
            r["device"] = "cuda" if device.is_cuda else "cpu"
        rows += cell
    if not rows:
        return
    df = res.add_table("latency", rows)
    res.env["synthetic_logit_std"] = scale
    if not device.is_cuda:
        res.skip("latency_gpu", f"no GPU (the >= {GOAL['cuda']:g}x GPU goal)")
    part_decode_share(res, cfg, lm, device, df[(df["vocab"] == V_model) & (df["batch"] == 1)])


def note_busy_cpu(res: LabResult, device: Device) -> None:
    """Say so when other processes compete for the cores the timed parts run on."""
    load, cores = cpu_load()
    threads = torch.get_num_threads()
    if not device.is_cuda and load is not None and load > cores:
        why = "timings include waiting for a core" if threads == 1 else \
            "threaded ops wait for workers (OMP_NUM_THREADS=1 is steadier)"
        res.note(f"CPU busy: load {load:.1f} on {cores} cores, {threads} torch thread(s): {why}")


@torch.inference_mode()
def part_decode_share(res: LabResult, cfg: Config, lm, device: Device, small) -> None:
    """The sampler's share of one decode step of the model at batch 1 (KV cache, one new token)."""
    ids = lm.tokenizer(cfg.prompt, return_tensors="pt").input_ids.to(device.torch)
    cache = decode.new_cache(lm.model)
    logits = decode.prefill(lm.model, ids, cache)
    tok = logits.argmax(-1, keepdim=True)
    L = cache.get_seq_length()

    def step():
        decode.decode_one_token(lm.model, tok, cache)
        decode.crop(cache, L)  # keep the context length fixed across repeats

    fwd = measure(step, device, mode=LATENCY, warmup=2, repeats=cfg.decode_repeats, max_time_s=0.2 * cfg.decode_repeats)
    rows = [{"strategy": r.strategy, "impl": r.impl, "sampler_ms": r.latency_median_ms, "forward_ms": fwd.median,
             "forward_p10_ms": fwd.p10, "forward_p90_ms": fwd.p90, "n_params": lm.n_params,
             "vocab": lm.config.vocab_size,
             "sampler_share": r.latency_median_ms / (r.latency_median_ms + fwd.median)} for r in small.itertuples()]
    res.add_table("decode_share", rows)
