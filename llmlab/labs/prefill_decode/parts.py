"""The parts of the run, each a table: phases, intensity, FLOP check, decode floor, crossover, E2E, hand-off."""

from __future__ import annotations

import statistics
import time

import pandas as pd
import torch

from llmlab.core.device import Device, is_oom, last_level_cache_bytes
from llmlab.core.flops import crossover_batch, decode_cost, kv_bytes, prefill_cost
from llmlab.core.render import track
from llmlab.inference.decode import decode_one_token, generate, new_cache, prefill
from llmlab.inference.flopcount import counted_flops
from llmlab.labs.prefill_decode.config import LINKS
from llmlab.labs.prefill_decode.measure import overhead_twin, time_decode, time_prefill


def measure_phases(cfg, device, lm, shape, elem, lens, gen, progress) -> list[dict]:
    rows = []
    for t in track(progress, lens, f"{lm.ref}: prefill and decode"):
        p = time_prefill(lm.model, t, device, cfg, gen)
        d = time_decode(lm.model, t, 1, device, cfg, gen)
        pc, dc = prefill_cost(shape, t, 1, elem), decode_cost(shape, t, 1, elem)
        rows.append(dict(model=lm.ref, tokens=t, prefill_ms=p.median, prefill_p10_ms=p.p10,
                         prefill_p90_ms=p.p90,
                         decode_ms=d.median, decode_p10_ms=d.p10, decode_p90_ms=d.p90,
                         prefill_tok_s=t / (p.median / 1e3), decode_tok_s=1 / (d.median / 1e3),
                         prefill_ms_per_token=p.median / t, ratio=(t / (p.median / 1e3)) * (d.median / 1e3),
                         prefill_flops=pc.flops, prefill_bytes=pc.bytes, decode_flops=dc.flops, decode_bytes=dc.bytes))
    return rows


def intensity_rows(phases: pd.DataFrame, peak: float, bw: float) -> pd.DataFrame:
    """Both phases of every measured point, long: FLOP/byte and the achieved share of each roof."""
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
    """The formula (dense attention, as the counter counts it) against FlopCounterMode: the longest prefill, its
    decode step.

    Random-weight arch: models are counted on the meta device (the same ops, seconds instead of a real forward)."""
    t = max(lens)
    rows = []
    for phase, tokens, context, formula in (("prefill", t, 0, prefill_cost(shape, t, causal=False).flops),
                                            ("decode", 1, t, decode_cost(shape, t).flops)):
        # arch: on meta, no arithmetic
        counted = counted_flops(lm.config if lm.timing_only else lm.model, tokens, context)
        total = sum(counted.values())
        rows.append(dict(model=lm.ref, phase=phase, tokens=t, formula_flops=formula, counted_flops=total,
                         ratio=total / formula, counted_ops=", ".join(sorted(counted))))
    return rows


def decode_floor_row(cfg, device, lm, shape, elem, dtype, context, phases: list[dict], peak, bw, gen) -> dict:
    """What bounds a batch-1 decode step: the shrunk twin's time (per-step overhead), the DRAM roof, the compute
    roof."""
    twin = overhead_twin(lm.config, device, dtype)
    s = time_decode(twin, context, 1, device, cfg, gen)
    c = decode_cost(shape, context, 1, elem)
    measured = next(r["decode_ms"] for r in phases if r["tokens"] == context)
    return dict(model=lm.ref, tokens=context, measured_ms=measured, overhead_ms=s.median,
                memory_ms=c.bytes / bw / 1e6,
                compute_ms=c.flops / peak / 1e6, weights_MiB=c.weight_bytes / 2**20, kv_MiB=c.kv_bytes / 2**20,
                llc_MiB=last_level_cache_bytes(device) / 2**20)


def measure_crossover(cfg, device, lm, shape, elem, peak, bw, gen, progress) -> pd.DataFrame:
    """Decode at batch B (batch_context cached positions each): time per step against the formula's crossover."""

    rows = []
    for b in track(progress, cfg.batch_sizes, "decode batch sweep"):
        try:
            s = time_decode(lm.model, cfg.batch_context, b, device, cfg, gen)
        except RuntimeError as exc:
            if not is_oom(exc):
                raise
            break  # the sweep stops at the batch that does not fit; the table ends there
        c = decode_cost(shape, cfg.batch_context, b, elem)
        rows.append(dict(batch=b, context=cfg.batch_context, ms=s.median, p10_ms=s.p10, p90_ms=s.p90,
                         tok_s=b / (s.median / 1e3), flops=c.flops, bytes=c.bytes, intensity=c.intensity,
                         achieved_gflops=c.flops / (s.median / 1e3) / 1e9,
                         share_of_peak=c.flops / (s.median / 1e3) / 1e9 / peak,
                         roof_ms=max(c.flops / peak, c.bytes / bw) / 1e6,
                         formula_crossover=crossover_batch(shape, peak / bw, cfg.batch_context, elem),
                         napkin_crossover=peak / bw * elem / 2))  # intensity ~ 2B/elem FLOP per weight byte
    return pd.DataFrame(rows)


def timed(device: Device, fn, *args) -> float:
    """Milliseconds of one call, the device synchronised on both sides."""
    device.synchronize()
    t0 = time.perf_counter_ns()
    fn(*args)
    device.synchronize()
    return (time.perf_counter_ns() - t0) / 1e6


def time_reply(device: Device, model, ids, n: int, repeats: int) -> tuple[list[float], list[float], list[float]]:
    """(TTFT, ITL and whole-generation times in ms) of an n-token reply to `ids`, timed in turn: a prefill, n - 1
    single decode steps on its cache (the contexts the reply's steps see), then one whole generation; `repeats`
    rounds after a warm-up round, so that a change in machine load moves parts and whole alike."""
    first = lambda ids, cache: prefill(model, ids, cache).argmax(-1)  # noqa: E731  (TTFT: token 1 from the logits)
    step = lambda tok, cache: decode_one_token(model, tok, cache).argmax(-1)  # noqa: E731  (ITL)
    tok = ids[:, -1:]  # (1, 1)
    ttft, itl, whole = [], [], []
    for r in range(repeats + 1):  # round 0 is a warm-up
        cache = new_cache(model)
        a = timed(device, first, ids, cache)
        b = [timed(device, step, tok, cache) for _ in range(n - 1)]
        c = timed(device, generate, model, ids, n)
        if r:
            ttft.append(a)
            itl += b
            whole.append(c)
    return ttft, itl, whole


def measure_e2e(cfg, device, lm, lens, gen, progress) -> pd.DataFrame:
    """Generation timed end to end against TTFT + (n - 1) ITL from the parts (`time_reply`). TTFT and ITL are the
    medians of their own calls."""
    rows = []
    jobs = [(t, n) for t in lens for n in cfg.output_lens]
    for t, n in track(progress, jobs, "end to end"):
        ids = torch.randint(0, lm.model.config.vocab_size, (1, t), generator=gen).to(device.torch)  # (1, T)
        ttft, itl, e2e = time_reply(device, lm.model, ids, n, cfg.e2e_repeats)
        ttft_ms, itl_ms, measured = statistics.median(ttft), statistics.median(itl), statistics.median(e2e)
        pred = ttft_ms + (n - 1) * itl_ms
        rows.append(dict(model=lm.ref, tokens=t, new_tokens=n, ttft_ms=ttft_ms, itl_ms=itl_ms, predicted_e2e_ms=pred,
                         measured_e2e_ms=measured, error=pred / measured - 1, decode_share=(n - 1) * itl_ms / pred,
                         repeats=cfg.e2e_repeats))
    return pd.DataFrame(rows)


def share_replies(cfg, max_pos: int, res) -> list[int]:
    """The reply lengths of the decode-share part that fit after its prompt in the model's context."""
    fit = [int(n) for n in cfg.share_output_lens if cfg.share_prompt + int(n) <= max_pos]
    dropped = sorted(set(map(int, cfg.share_output_lens)) - set(fit))
    if dropped:
        res.note(f"decode share: n = {', '.join(map(str, dropped))} clamped away (T = {cfg.share_prompt} + n is "
                 f"beyond the context of {max_pos})")
    return fit


def measure_decode_share(cfg, device, lm, replies: list[int], gen, progress) -> pd.DataFrame:
    """Decode's share of a whole generation at long replies: a `share_prompt`-token prompt, then n tokens.

    Predicted from the parts timed in turn with the whole (`time_reply`): share = (n - 1) ITL / (TTFT + (n - 1)
    ITL), with TTFT the median prefill and ITL the median step of the reply (a step's attention grows linearly
    with its context, so the median step is the mean one, and a step the OS descheduled does not move it). The
    timed whole's own share is 1 - TTFT / E2E.
    """
    t = cfg.share_prompt
    ids = torch.randint(0, lm.model.config.vocab_size, (1, t), generator=gen).to(device.torch)  # (1, T)
    rows = []
    for n in track(progress, replies, "decode share"):
        ttft, itl, whole = time_reply(device, lm.model, ids, n, cfg.share_repeats)
        rows.append(decode_share_row(lm.ref, t, n, statistics.median(ttft), statistics.median(itl),
                                     statistics.median(whole), cfg.share_repeats))
    return pd.DataFrame(rows)


def decode_share_row(ref: str, t: int, n: int, ttft_ms: float, itl_ms: float, whole_ms: float, repeats: int) -> dict:
    """One reply length of the decode-share part: the share predicted from TTFT and ITL, and the timed whole's."""
    pred = ttft_ms + (n - 1) * itl_ms
    return dict(model=ref, tokens=t, new_tokens=n, ttft_ms=ttft_ms, itl_ms=itl_ms, predicted_e2e_ms=pred,
                measured_e2e_ms=whole_ms, error=pred / whole_ms - 1,
                predicted_share=(n - 1) * itl_ms / pred, measured_share=1 - ttft_ms / whole_ms, repeats=repeats)


def disagg_rows(cfg, phases: list[dict], shape, elem) -> pd.DataFrame:
    """KV bytes of one request after its prefill, moved over each link, against that prefill and one ITL."""
    links = (("--link-GBps (given)", cfg.link_GBps),) if cfg.link_GBps > 0 else LINKS
    rows = []
    for r in phases:
        kv = kv_bytes(shape, r["tokens"], elem)
        for name, gbps in links:
            ms = kv / gbps / 1e6
            rows.append(dict(model=r["model"], tokens=r["tokens"], link=name, link_GBps=gbps, kv_bytes=kv,
                             transfer_ms=ms,
                             transfer_us=1e3 * ms, prefill_ms=r["prefill_ms"], itl_ms=r["decode_ms"],
                             transfer_over_prefill=ms / r["prefill_ms"], transfer_over_itl=ms / r["decode_ms"]))
    return pd.DataFrame(rows)


def chart_tables(phases: pd.DataFrame, inten: pd.DataFrame, peak: float,
                 bw: float) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Long tables for the two charts: tokens/s per (model, phase) vs T; the roof line and both phases' points."""
    many = phases["model"].nunique() > 1
    name = lambda m, p: f"{m} {p}" if many else p  # noqa: E731
    tps = [dict(series=name(r.model, ph), tokens=r.tokens, tok_s=getattr(r, f"{ph}_tok_s"))
           for ph in ("prefill", "decode") for r in phases.itertuples()]
    lo = min(float(inten["intensity"].min()), peak / bw) / 4
    hi = max(float(inten["intensity"].max()), peak / bw) * 4
    grid = (lo * (hi / lo) ** (i / 40) for i in range(41))
    roof = [dict(series="measured roof", intensity=x, gflops=min(peak, x * bw)) for x in grid]
    pts = [dict(series=name(r.model, r.phase), intensity=r.intensity, gflops=r.achieved_gflops)
           for r in inten.itertuples()]
    return pd.DataFrame(tps), pd.DataFrame(roof + pts)
