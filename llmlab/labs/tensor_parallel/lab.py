"""The tensor-parallel lab's run: the ranks spawned (or joined under torchrun), their tables derived."""

from __future__ import annotations

from typing import TYPE_CHECKING

from llmlab.core.device import Device, cpu_load
from llmlab.core.results import LabResult
from llmlab.inference.tp import in_torchrun, launch
from llmlab.labs.tensor_parallel.config import LAB, VERSION, Config
from llmlab.labs.tensor_parallel.formulas import fits_rows, predicted_comm_ms
from llmlab.labs.tensor_parallel.plan import Plan, check_heads, check_ranks
from llmlab.labs.tensor_parallel.worker import _worker

if TYPE_CHECKING:
    import pandas as pd

# ---------------------------------------------------------------- run


def _derive_steps(steps: pd.DataFrame, coll: pd.DataFrame) -> None:
    """Prediction, the skew split, speed-up and efficiency, added to the steps table."""
    steps["predicted_comm_ms"] = [predicted_comm_ms(coll, m, a) if t > 1 else 0.0
                                  for m, a, t in zip(steps.msg_bytes, steps.allreduces, steps.tp, strict=True)]
    steps["predicted_comm_share"] = steps.predicted_comm_ms / steps.step_ms
    steps["aligned_comm_share"] = steps.aligned_comm_ms / steps.step_ms  # the all-reduce alone, ranks aligned first
    steps["wait_ms"] = steps.comm_ms - steps.aligned_comm_ms  # the rest of a step's all-reduce time: the slower rank
    steps["wait_share"] = steps.wait_ms / steps.step_ms
    base = steps[steps.tp == 1].set_index("batch").step_ms
    steps["speedup"] = [base[b] / s for b, s in zip(steps.batch, steps.step_ms, strict=True)]
    steps["efficiency"] = steps.speedup / steps.tp


def _add_links(res: LabResult, out: dict, plan: Plan) -> None:
    if out.get("links"):
        res.add_table("link", out["links"])
    elif plan.note:
        res.skip("link", "the ranks ran on the CPU (fewer GPUs than ranks): gloo over loopback TCP has no link spec")
    else:
        res.skip("link", "no GPU (gloo over TCP on the CPU: no link spec)")


def run(cfg: Config, device: Device, progress=None) -> LabResult:
    """Measures. Spawns the ranks (or is one of them under torchrun); never prints, never judges."""
    from llmlab.core.device import cuda_device_count
    from llmlab.core.models import load_config
    from llmlab.inference.tp import layout

    c = load_config(cfg.model)
    place = layout() if in_torchrun() else dict(world=cfg.nproc, local_world=cfg.nproc, nodes=1, rank=0)
    world = place["world"]
    plan = check_ranks(place["local_world"], cfg.backend, device.is_cuda, cuda_device_count(), device.index or 0)
    check_heads(c.num_attention_heads, getattr(c, "num_key_value_heads", None) or c.num_attention_heads, world,
                c.intermediate_size)
    res = LabResult.new(LAB, VERSION, cfg)
    load, cores = cpu_load()  # before the ranks start: their own load is not the machine's
    res.env["cpu_load_before"] = load
    with res.guard():
        if in_torchrun():
            out = _worker(place["rank"], world, cfg, plan)
            if place["rank"] != 0:
                raise SystemExit(0)  # only rank 0 renders and saves
            res.note(f"ranks started by an outside launcher (torchrun): {out['nodes']} node(s) x "
                     f"{out['ranks_per_node']} ranks, env:// rendezvous")
        else:
            out = launch(_worker, world, (cfg, plan), cfg.timeout_s)
        res.env["tp"] = dict(backend=out["backend"], ranks=world, nodes=out["nodes"],
                             ranks_per_node=out["ranks_per_node"],
                             on_gpus=plan.on_cuda, first_gpu=plan.first_gpu if plan.on_cuda else None,
                             threads_per_rank=None if plan.on_cuda else 1, plan_note=plan.note)
        res.add_table("exactness", out["exactness"])
        coll = res.add_table("collectives", out["collectives"])
        _derive_steps(res.add_table("steps", out["steps"]), coll)
        res.add_table("fits", fits_rows(cfg))
        _add_links(res, out, plan)
        if plan.note:
            res.note(plan.note)
        res.note(f"{world} ranks on {out['backend']}; embeddings and LM head replicated on every rank")
        if not plan.on_cuda and load is not None and load >= cores:
            res.note(f"CPU load average {load:.1f} on {cores} cores: these times are partly the scheduler's")
    return res
