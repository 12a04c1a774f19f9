"""Part 6 of the serving lab: what a token costs, and a whole training run against a year of serving.

Cost per million output tokens = price per hour / (3600 x output tokens/s) x 1e6, at every level of the
concurrency sweep. A decode step takes the same time whether it carries one reply or many, so each token
pays price x step time / decodes in the step: the cost falls as 1 / throughput while more clients widen the
step, up to the KV-capacity knee (the pool's blocks / blocks per request conversations), past which more
clients wait in the queue instead of joining the step (part 3 measures that knee).

The training run against serving is a napkin with one measured input, and the table says which is which:
- napkin: the training FLOPs 6 N D (N: train_model's parameters, D: train_tokens), the MFU, the BF16 dense peak
  of train_gpu (the spec registry), and the price per GPU-hour (yours, or the example);
- measured: the compute use (2 N FLOPs per token x tokens/s over the peak) the engine reached here at its best
  concurrency, applied to train_model on train_gpu: serving tokens/s = use x peak / (2 N).
Training is paid once; serving is paid by the hour, for the tokens it serves: they cross after the training
run's GPU-hours of serving, whatever the price (it cancels), and the measured rate says how many tokens that is.
"""

from __future__ import annotations

import math

from llmlab.labs.serving.config import BLOCK, Config

HOURS_PER_YEAR = 24 * 365


def kv_knee(cfg: Config, num_blocks: int) -> int:
    """Conversations part 1's KV pool holds: its blocks over the blocks one request holds by its end."""
    return num_blocks // -(-(cfg.prompt_len + cfg.output_len) // BLOCK)


def cost_rows(conc, price: float, knee: int | None) -> list[dict]:
    """$ per 1M output tokens at each concurrency, measured end to end and from the decode step's time."""
    rows = []
    for r in conc.itertuples():
        step_ms, decodes = getattr(r, "decode_step_ms", math.nan), getattr(r, "decodes_per_step", math.nan)
        by_step = price * step_ms / 1e3 / 3600 / decodes * 1e6 if decodes and decodes > 0 else math.nan
        usd = price / (3600 * r.output_tokens_per_s) * 1e6
        rows.append(dict(concurrency=int(r.concurrency), output_tokens_per_s=r.output_tokens_per_s,
                         price_per_hour=price,
                         usd_per_million_tokens=usd, step_usd_per_million_tokens=by_step,
                         over_step_cost=usd / by_step if by_step > 0 else math.nan, kv_knee=knee if knee else math.nan,
                         below_knee=knee is None or int(r.concurrency) <= knee))
    return rows


def train_serve_rows(cfg: Config, conc, gpu_peak_tflops: float, gpu_name: str) -> list[dict]:
    """The training run (napkin), a GPU-year of serving at the measured compute use, and where they cross."""
    from llmlab.core.flops import param_count
    from llmlab.core.models import arch_config

    n = param_count(arch_config(cfg.train_model))
    peak = gpu_peak_tflops * 1e12
    best = conc.loc[conc.output_tokens_per_s.idxmax()]
    use = float(best.compute_util)
    flops = 6 * n * cfg.train_tokens
    train_h = flops / (cfg.train_mfu * peak) / 3600
    serve_tps = use * peak / (2 * n)
    year_tokens = serve_tps * 3600 * HOURS_PER_YEAR
    usd_per_token = cfg.price_per_hour / (3600 * serve_tps)
    common = dict(model=cfg.train_model, params=n, gpu=gpu_name, gpu_peak_tflops=gpu_peak_tflops,
                  price_per_hour=cfg.price_per_hour, serve_tokens_per_s=serve_tps, compute_use=use,
                  at_concurrency=int(best.concurrency))
    return [
        dict(expense="training run (once)", tokens=cfg.train_tokens, flops=flops, gpu_hours=train_h,
             usd=train_h * cfg.price_per_hour,
             basis=f"napkin: 6 N D at {cfg.train_mfu:.0%} MFU of {gpu_peak_tflops:,.0f} TFLOP/s", **common),
        dict(expense="serving, one GPU-year", tokens=year_tokens, flops=2 * n * year_tokens, gpu_hours=HOURS_PER_YEAR,
             usd=HOURS_PER_YEAR * cfg.price_per_hour,
             basis=f"measured: {use:.2%} of peak at {int(best.concurrency)} clients -> {serve_tps:,.0f} tok/s",
             **common),
        dict(expense="crossover", tokens=train_h * cfg.price_per_hour / usd_per_token, flops=math.nan,
             gpu_hours=train_h,
             usd=train_h * cfg.price_per_hour, basis="serving spend = the training run's", **common),
    ]
