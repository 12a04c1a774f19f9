"""The quadratic trap: greedy generation with the cache and without it (recomputing the whole prefix every
step), time per token and total time, and a least-squares fit of total time against n (llmlab.core.fit).

torch, transformers and llmlab.inference are imported inside the functions that use them: `llmlab --help`
imports this package (for its Config) and must not pay for them.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import replace

import numpy as np

from llmlab.core import models, roofs, timing
from llmlab.core.device import Device
from llmlab.core.fit import fit_poly
from llmlab.core.render import track
from llmlab.core.results import LabResult
from llmlab.labs.kvcache_growth.cache import random_ids
from llmlab.labs.kvcache_growth.config import Config


def generate_without_cache(model, ids, n: int, sync=None, max_s: float | None = None):
    """Greedy, recomputing the whole sequence every step (no cache). Returns (tokens (B, n), step seconds).

    `max_s` stops early (at least 8 tokens) once the loop has run that long: a slow machine's bound."""
    import torch

    seq, times = ids, []
    with torch.inference_mode():
        for _ in range(n):
            if max_s is not None and len(times) >= 8 and sum(times) > max_s:
                break
            t0 = time.perf_counter()
            logits = model(input_ids=seq, use_cache=False, logits_to_keep=1).logits[:, -1]  # (B, V)
            tok = logits.argmax(dim=-1, keepdim=True)  # (B, 1)
            if sync:
                sync()
            times.append(time.perf_counter() - t0)
            seq = torch.cat([seq, tok], dim=1)
    return seq[:, ids.shape[1] :], times


def generate_with_cache(model, ids, n: int, sync=None):
    """Greedy with a DynamicCache (llmlab.inference.decode). Returns (tokens (B, n), step seconds, prefill first)."""
    from llmlab.inference.decode import generate

    g = generate(model, ids, n, sync=sync)
    return g.tokens, [g.prefill_s, *g.step_s]


def fit_total_time(n: np.ndarray, total_s: np.ndarray) -> dict:
    """Least squares of total time vs n: a line (1) and a parabola (2), each with `coef` highest power first,
    R^2, residuals and its fit at each n; the n^2 term's share of the fitted total at n_max, and the n
    where the n^2 term overtakes the linear one (b / a)."""
    out = {}
    for deg in (1, 2):
        f = fit_poly(n, total_s, deg)
        out[deg] = dict(coef=np.array(f.coef[::-1]), r2=f.r2, ssr=f.ssr, pred=f.pred)
    a, b, _ = out[2]["coef"]
    n_max = float(n.max())
    out["quad_share"] = float(a * n_max**2 / np.polyval(out[2]["coef"], n_max))
    out["overtake_n"] = float(b / a) if a > 0 and b > 0 else math.nan
    return out


def is_quadratic(fit: dict) -> bool:
    """The rule: the n^2 coefficient is positive and the parabola leaves at most half the line's squared
    residual (the n^2 term is real, not noise). How much of the bill it is at n_max is reported beside."""
    return bool(fit[2]["coef"][0] > 0 and fit[2]["ssr"] <= 0.5 * fit[1]["ssr"])


def trap(model, device: Device, cfg: Config, progress=None) -> dict:
    """Time both loops `gen_repeats` times, interleaved (core.timing.interleaved); per-step medians, totals, fits.

    The untimed first pass runs the no-cache loop under its time budget: the tokens it reaches set n
    for every timed run (a slow or busy CPU gets fewer tokens, never a longer lab).
    """
    ids = random_ids(model.config.vocab_size, 1, cfg.gen_prompt, cfg.seed, device.torch)
    loops = {"without cache": generate_without_cache, "with cache": generate_with_cache}
    n_tokens = cfg.gen_tokens
    results: dict[str, list] = {mode: [] for mode in loops}  # mode -> [(tokens, step seconds)] per timed run

    def probe():
        nonlocal n_tokens
        _, times = generate_without_cache(model, ids, cfg.gen_tokens, device.synchronize,
                                          max_s=cfg.trap_budget_s / cfg.gen_repeats)
        n_tokens = len(times)

    def timed(mode):
        return lambda: results[mode].append(loops[mode](model, ids, n_tokens, device.synchronize))

    it = timing.interleaved({mode: timed(mode) for mode in loops}, cfg.gen_repeats, device,
                     first={"without cache": probe,
                            "with cache": lambda: generate_with_cache(model, ids, 4, device.synchronize)},
                     rounds=lambda r: track(progress, list(r), "quadratic trap: generate with / without cache"))
    steps = {mode: [times for _, times in runs] for mode, runs in results.items()}
    tokens = {mode: runs[0][0] for mode, runs in results.items()}
    totals = {mode: it.stats(mode) for mode in loops}  # wall time of each whole run, ms
    same = int((tokens["with cache"] == tokens["without cache"]).all(dim=0).sum())  # positions equal in every row
    out = {"tokens_match": same, "n_tokens": n_tokens,
           "modes": {}}
    for mode, runs in steps.items():
        per_step = np.median(np.array(runs), axis=0)  # (n,) seconds
        n = np.arange(1, len(per_step) + 1)
        total = np.cumsum(per_step)
        context = cfg.gen_prompt + n - 1  # tokens the step attends over (the prompt plus tokens so far)
        slope = np.polyfit(context, per_step * 1e3, 1)
        out["modes"][mode] = dict(per_step_s=per_step, runs=np.array(runs), n=n, total_s=total, context=context,
                                  fit=fit_total_time(n.astype(float), total), step_slope_ms_per_ktok=slope[0] * 1e3,
                                  total_stats=totals[mode])
    return out


def trap_tables(t: dict, points: int = 16) -> tuple[list[dict], list[dict], list[dict]]:
    steps, totals, fits = [], [], []
    for mode, m in t["modes"].items():
        n = m["n"]
        pick = sorted({int(i) for i in np.linspace(0, len(n) - 1, min(points, len(n)))})
        for i in pick:
            col = m["runs"][:, i] * 1e3
            steps.append(dict(mode=mode, step=int(n[i]), context_len=int(m["context"][i]),
                              step_ms=float(m["per_step_s"][i] * 1e3),
                              p10_ms=float(np.percentile(col, 10)), p90_ms=float(np.percentile(col, 90))))
            totals.append(dict(mode=mode, n_tokens=int(n[i]), total_s=float(m["total_s"][i]),
                               fit_linear_s=float(m["fit"][1]["pred"][i]),
                               fit_quadratic_s=float(m["fit"][2]["pred"][i])))
        f = m["fit"]
        c2, c1, c0 = f[2]["coef"]
        l1, l0 = f[1]["coef"]
        fits.append(dict(mode=mode, n_max=int(n[-1]), total_median_s=m["total_stats"].median / 1e3,
                         total_p10_s=m["total_stats"].p10 / 1e3, total_p90_s=m["total_stats"].p90 / 1e3,
                         quad_a_s_per_tok2=c2, quad_b_s_per_tok=c1, quad_c_s=c0, quad_r2=f[2]["r2"],
                         quad_ssr=f[2]["ssr"], lin_ssr=f[1]["ssr"],
                         lin_b_s_per_tok=l1, lin_c_s=l0, lin_r2=f[1]["r2"], quad_share_at_n_max=f["quad_share"],
                         n2_overtakes_at_n=f["overtake_n"],
                         step_ms_first=float(m["per_step_s"][1] * 1e3), step_ms_last=float(m["per_step_s"][-1] * 1e3),
                         step_slope_ms_per_1k_context=m["step_slope_ms_per_ktok"], quadratic=is_quadratic(f)))
    return steps, totals, fits



def part_trap(res: LabResult, model, device: Device, cfg: Config, progress) -> None:
    model, cfg = trap_setup(res, model, device, cfg)
    t = trap(model, device, cfg, progress)
    steps, totals, fits = trap_tables(t)
    res.add_table("generation_steps", steps)
    res.add_table("generation_totals", totals)
    res.add_table("generation_fits", [dict(f, tokens_equal=t["tokens_match"], tokens_compared=t["n_tokens"],
                                           model=res.env["trap_model"]) for f in fits])
    if t["n_tokens"] < cfg.gen_tokens:
        res.note(f"quadratic trap: the no-cache loop hit its {cfg.trap_budget_s:.0f} s budget at {t['n_tokens']} of "
                 f"{cfg.gen_tokens} tokens; every run generated that many")


def trap_setup(res: LabResult, model, device: Device, cfg: Config):
    """(model, cfg) for the trap. On a GPU: a model past L2 (core.roofs.gpu_speed_model) and a token count from
    the device (trap_tokens): 160 tokens of `tiny` on a GPU are flat and launch-bound. On a CPU nothing changes."""
    ref, why = roofs.gpu_speed_model(cfg.model, cfg.cuda_model, device, cfg.dtype or "bfloat16")
    res.env["trap_model"] = ref
    if ref != cfg.model:
        model = models.load(ref, device, cfg.dtype or "bfloat16").model
        res.note(f"quadratic trap on {why}")
    if device.is_cuda:
        n, why_n = trap_tokens(model, device, cfg)
        cfg = replace(cfg, gen_tokens=n)
        res.env["trap_tokens"] = why_n
        res.note(f"quadratic trap: {why_n}")
    return model, cfg


def trap_tokens(model, device: Device, cfg: Config, forward_ms=None) -> tuple[int, str]:
    """(tokens to generate, why): 4x the context n_x at which one no-cache forward takes twice the shortest one's time.

    Below n_x a step's fixed cost (launches, weight reads) hides the per-token work; a run to 4 n_x puts
    about two thirds of the total into the n^2 term. Doubling n from 64 up to max_trap_tokens / 4 (and
    the model's context); `forward_ms(n)` is one timed forward over n tokens (tests pass a stand-in)."""
    max_pos = int(getattr(model.config, "max_position_embeddings", 0) or cfg.max_trap_tokens)
    cap = max(cfg.gen_tokens, min(cfg.max_trap_tokens, max_pos - cfg.gen_prompt))
    forward_ms = forward_ms or (lambda n: _no_cache_forward_ms(model, device, n, cfg.seed))
    n, base = 64, forward_ms(64)
    while 4 * n < cap:
        n *= 2
        if forward_ms(n) >= 2 * base:
            tokens = max(cfg.gen_tokens, min(cap, 4 * n))
            return tokens, (f"{tokens} tokens from the device: a no-cache forward doubles its {base:.2f} ms by "
                            f"{n} tokens of context")
    return cap, f"{cap} tokens (the cap): a no-cache forward stays under twice its {base:.2f} ms up to {n} tokens"


def _no_cache_forward_ms(model, device: Device, n: int, seed: int) -> float:
    """The median of 3 synchronised no-cache forwards over n tokens (logits of the last position only), in ms."""
    import torch

    ids = random_ids(model.config.vocab_size, 1, n, seed, device.torch)
    times = []
    with torch.inference_mode():
        for _ in range(4):  # the first is a warm-up
            device.synchronize()
            t0 = time.perf_counter()
            model(input_ids=ids, use_cache=False, logits_to_keep=1)
            device.synchronize()
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times[1:])

