"""The lab's measuring run: the roofs, the sweeps, the overlay and the timed decode step, in order."""

from __future__ import annotations

from dataclasses import replace

from llmlab.core.device import Device, cpu_load, last_level_cache_bytes
from llmlab.core.errors import UsageError
from llmlab.core.models import estimate_bytes, load, load_config
from llmlab.core.results import LabResult
from llmlab.core.roofs import bandwidth_buffers, gpu_speed_model, torch_dtype, warm_up
from llmlab.core.timing import Stopwatch
from llmlab.labs.roofline.config import DTYPES, LAB, VERSION, Config
from llmlab.labs.roofline.measure import (
    Roofs,
    compute_dtypes,
    measure_bandwidth,
    measure_compute,
    measure_sweep,
    overlay_dtype,
    roofs_from,
    roofs_table,
)
from llmlab.labs.roofline.overlay import (
    chart_table,
    decode_budget_bytes,
    measure_decode,
    measure_intensity,
    overlay_table,
    predicted_knee,
    step_cost,
)
from llmlab.labs.roofline.whatif import whatif_table


def run(cfg: Config, device: Device, progress=None) -> LabResult:
    """Measures. Fills tables, env, notes, skipped. Never prints, never judges."""
    dtype_name = overlay_dtype(cfg, device)
    ref, why = gpu_speed_model(cfg.model, cfg.cuda_model, device, dtype_name)
    cfg = replace(cfg, model=ref)  # the model that runs is the one the result records
    res = LabResult.new(LAB, VERSION, cfg)
    if why:
        res.note(f"the overlay and the decode step use {why}")
    dtype = DTYPES[dtype_name]
    if not device.is_cuda and dtype == "fp16":
        raise UsageError("--dtype float16 on a CPU: no FP16 matmul unit to measure; use float32 or bfloat16")
    config = load_config(cfg.model)  # a bad --model fails here, before any measuring
    res.env["overlay"] = dict(model=cfg.model, dtype=dtype_name, timing_only=cfg.model.startswith("arch:"))
    sw = Stopwatch(device)
    res.env["phases_ms"] = sw.phases_ms  # wall time per part (ms), filled as the parts run
    if not device.is_cuda:
        res.skipped["gpu_roofs"] = "TF32, FP16 and HBM roofs: no GPU"
    with res.guard():
        with sw.phase("bandwidth"):
            res.env["warm_up_s"] = warm_up(device, cfg.warmup_s)  # clocks boosted before the roofs
            bufs = bandwidth_buffers(device, cfg.llc_multiple)
            if bufs.note:
                res.note(bufs.note)
            bw = res.add_table("bandwidth", measure_bandwidth(cfg, device, bufs, progress))
        with sw.phase("compute"):
            comp = res.add_table("compute", measure_compute(cfg, device, compute_dtypes(device, dtype_name), progress))
        roofs = roofs_from(bw, comp)
        res.add_table("roofs", roofs_table(roofs, bw, comp, device))
        res.add_table("whatif", whatif_table(res.tables["roofs"], device.total_memory_bytes(), device.name,
                                             cfg.whatif_context))
        with sw.phase("intensity_sweep"):
            sweep = res.add_table("intensity_sweep", measure_intensity(cfg, device, dtype, roofs, progress))
        overlay = res.add_table("overlay", overlay_table(config, roofs, dtype, cfg.prefill_tokens, cfg.decode_batches,
                                                         cfg.decode_context))
        need = estimate_bytes(config, dtype_name)
        timed = need <= decode_budget_bytes(cfg, device)
        res.add_table("decode_model", [decode_model_row(cfg, config, roofs, dtype, need, timed, device)])
        dec = None
        if timed:
            with sw.phase("decode"):
                lm = load(cfg.model, device, dtype_name)
                dec = res.add_table("decode", measure_decode(cfg, device, lm, dtype_name, roofs, res, progress))
                del lm
        else:
            res.skipped["decode"] = (f"{cfg.model} needs {need / 2**30:.1f} GiB of weights in {dtype_name} "
                                     f"(budget {decode_budget_bytes(cfg, device) / 2**30:.1f} GiB): "
                                     "the overlay is analytic only")
        with sw.phase("bandwidth_sweep"):  # last: the roofs and the sweeps compared with them run back to back
            res.add_table("bandwidth_sweep", measure_sweep(cfg, device, bufs, roofs.bandwidth_threads, progress))
            del bufs
        res.add_table("roofline_chart", chart_table(roofs, dtype, device, sweep, overlay, dec))
        _notes(res, cfg, device, roofs, dtype_name, dec)
    return res


def decode_model_row(cfg: Config, config, roofs: Roofs, dtype: str, need: int, timed: bool, device: Device) -> dict:
    """The roofline's prediction for the model's decode step, from its config (what judge compares with)."""
    elem = torch_dtype(dtype).itemsize
    ctx = cfg.decode_context + 2 + cfg.decode_steps / 2  # the mean cache length over the timed steps
    c1 = step_cost(config, 1, ctx, elem)
    return dict(model=cfg.model, dtype=dtype, weight_bytes=c1["weight_bytes"],
                fits_llc=c1["weight_bytes"] <= last_level_cache_bytes(device),
                timed=timed, context=ctx, b1_intensity=c1["flops"] / c1["bytes"], ridge=roofs.ridge(dtype),
                predicted_knee=predicted_knee(config, roofs, dtype, ctx), largest_batch=max(cfg.decode_batches))


def _notes(res: LabResult, cfg: Config, device: Device, roofs: Roofs, dtype_name: str, dec) -> None:
    if not device.is_cuda:
        load, cores = cpu_load()
        if load is not None and load > cores:
            res.note(f"busy CPU (load {load:.1f} on {cores} CPUs): roofs are what this process got")
    if dec is not None and len(dec):
        w = float(dec.iloc[0]["weight_bytes"])
        if w <= last_level_cache_bytes(device):
            res.note(f"{cfg.model}'s {w / 2**20:.0f} MiB of weights fit in cache: for DRAM-bound decode "
                     "use --model arch:qwen2.5-0.5b")
    if cfg.model.startswith("arch:"):
        res.note(f"{cfg.model} has random weights: timings only")
