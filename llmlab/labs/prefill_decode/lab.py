"""The lab's measuring run: every part in turn, on the first model and then the others."""

from __future__ import annotations

from dataclasses import replace

import pandas as pd
import torch

from llmlab.core.device import Device, cpu_load, torch_threads
from llmlab.core.errors import MeasurementError, UsageError
from llmlab.core.flops import Shape
from llmlab.core.models import load, load_config
from llmlab.core.results import LabResult
from llmlab.core.timing import Stopwatch
from llmlab.labs.prefill_decode.config import LAB, VERSION, Config
from llmlab.labs.prefill_decode.disagg import measure_handoff
from llmlab.labs.prefill_decode.measure import gpu_models, lengths_for, measure_roofs, model_dtype, pick_threads
from llmlab.labs.prefill_decode.parts import (
    chart_tables,
    decode_floor_row,
    disagg_rows,
    flop_check_rows,
    intensity_rows,
    measure_crossover,
    measure_decode_share,
    measure_e2e,
    measure_phases,
    share_replies,
)
from llmlab.labs.prefill_decode.verdicts import _roof


def run(cfg: Config, device: Device, progress=None) -> LabResult:
    """Measures. Fills tables, env, notes, skipped. Never prints, never judges."""
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
    plan = {ref: lengths_for(cfg, ref, int(getattr(c, "max_position_embeddings", 2048)), res)
            for ref, c in configs.items()}
    if not plan[cfg.models[0]]:
        raise UsageError(f"--prompt-lens {','.join(map(str, cfg.prompt_lens))}: every length is beyond "
                         f"{cfg.models[0]}'s context ({configs[cfg.models[0]].max_position_embeddings} "
                         "with the replies)")
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
                floors.append(decode_floor_row(cfg, device, lm, shape, elem, dtype, min(plan[ref]), rows, peak,
                                               bw, gen))
            with sw.phase(f"flop count {ref}"):
                checks += flop_check_rows(lm, shape, plan[ref])
            if i == 0:  # the crossover, E2E, the decode share and the hand-off on the first (built-in) model
                first_model_parts(res, sw, cfg, device, lm, (shape, elem, peak, bw), plan[ref], rows, gen, progress)
            del lm
        res.add_table("intensity", pd.concat(inten, ignore_index=True))
        res.add_table("decode_floor", pd.DataFrame(floors))
        res.add_table("flop_check", pd.DataFrame(checks))
        tps, roofline = chart_tables(res.tables["phases"], res.tables["intensity"], peak, bw)
        res.add_table("tokens_chart", tps)
        res.add_table("roofline_chart", roofline)
    load_txt = f", load {load_avg:.1f} on {cores} CPUs" if load_avg is not None else ""
    res.note(f"{threads} thread(s), {dtype}{load_txt}; bytes: llmlab/core/flops.py")
    if res.env["timing_only"]:
        res.note(f"{', '.join(res.env['timing_only'])}: random weights, timings only (never a quality claim)")
    return res


def first_model_parts(res: LabResult, sw: Stopwatch, cfg: Config, device: Device, lm, cost, lens: list[int],
                      rows: list[dict], gen, progress) -> None:
    """Parts 3-6 on the first model: the batch crossover, E2E from the parts, decode's share of a long reply,
    and the KV hand-off. `cost` is (shape, bytes per element, peak GFLOP/s, GB/s)."""
    shape, elem, peak, bw = cost
    with sw.phase("crossover"), torch.inference_mode():
        res.add_table("crossover", measure_crossover(cfg, device, lm, shape, elem, peak, bw, gen, progress))
    with sw.phase("e2e"):
        res.add_table("e2e", measure_e2e(cfg, device, lm, lens, gen, progress))
    replies = share_replies(cfg, int(getattr(lm.config, "max_position_embeddings", 2048)), res)
    if replies:
        with sw.phase("decode share"), torch.inference_mode():
            res.add_table("decode_share", measure_decode_share(cfg, device, lm, replies, gen, progress))
    else:
        res.skip("decode_share", f"no reply length fits after the {cfg.share_prompt}-token prompt")
    res.add_table("disagg", disagg_rows(cfg, rows, shape, elem))
    with sw.phase("hand-off"):
        measure_handoff(res, cfg, device, lm.ref, res.env["dtype"])

