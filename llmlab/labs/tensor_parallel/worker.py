"""A rank's work in the tensor-parallel lab: the exactness check, the collectives sweep, the timed decode steps."""

from __future__ import annotations

import os
import signal
import statistics
import time

from llmlab.inference.tp import OPS, bandwidths, stage
from llmlab.labs.tensor_parallel.config import Config
from llmlab.labs.tensor_parallel.links import gpu_link_rows, nic_row
from llmlab.labs.tensor_parallel.plan import Plan

# ---------------------------------------------------------------- the rank's work


def _fault(cfg: Config, rank: int) -> None:
    if not cfg.fault:
        return
    kind, r = cfg.fault.split(":")
    if int(r) == rank:
        if kind == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(10**6)  # hang


def _exactness(model, sharded, cfg: Config, dev) -> dict:
    import torch

    from llmlab.inference.decode import decode_one_token, new_cache, prefill

    gen = torch.Generator().manual_seed(cfg.seed)
    ids = torch.randint(0, model.config.vocab_size, (1, cfg.prompt_len), generator=gen).to(dev)  # (1, T)
    cache = new_cache(model)
    ref = [prefill(model, ids, cache)]  # (1, V) per step
    for _ in range(cfg.new_tokens - 1):
        ref.append(decode_one_token(model, ref[-1].argmax(-1, keepdim=True), cache))
    sc = sharded.new_cache()
    got = [sharded.forward(ids, sc)[:, -1].float()]
    for _ in range(cfg.new_tokens - 1):
        got.append(sharded.forward(got[-1].argmax(-1, keepdim=True), sc)[:, -1].float())
    diff = max(float((a - b).abs().max()) for a, b in zip(ref, got, strict=True))
    same = all(bool((a.argmax(-1) == b.argmax(-1)).all()) for a, b in zip(ref, got, strict=True))
    return dict(tp=sharded.world, max_abs_logit_diff=diff, greedy_equal=same, tokens=cfg.new_tokens,
                logit_scale=float(ref[0].abs().max()))


def _collectives(cfg: Config, dev, sizes: tuple[int, ...], groups: dict) -> list[dict]:
    """Part 2 on every scope's group ("world"; across nodes also "intra-node" and "inter-node"): rank 0's rows."""
    import torch
    import torch.distributed as dist

    from llmlab.inference.tp import time_collective

    rows = []
    for scope, group in groups.items():
        n = dist.get_world_size(group)
        for op in OPS:
            for size in sizes:
                if size < 4 * n:
                    continue
                try:
                    one = time_collective(op, size, dev, warmup=cfg.warmup, iters=1, group=group)
                except (RuntimeError, NotImplementedError) as exc:  # e.g. a backend without this collective
                    rows.append(dict(scope=scope, op=op, size_bytes=size, error=str(exc).splitlines()[0][:80]))
                    break
                iters = int(max(3, min(cfg.max_iters, cfg.point_s / max(one, 1e-7))))
                t = torch.tensor([iters], device=dev)
                dist.all_reduce(t, op=dist.ReduceOp.MIN, group=group)  # every rank of the group runs the same count
                per = max(1, int(t.item()) // cfg.blocks)
                sec = min(time_collective(op, size, dev, warmup=0, iters=per, group=group) for _ in range(cfg.blocks))
                alg, bus = bandwidths(op, size, sec, n)
                rows.append(dict(scope=scope, op=op, ranks=n, size_bytes=size, iters=per * cfg.blocks,
                                 time_us=sec * 1e6,
                                 algbw_GBps=alg, busbw_GBps=bus))
    return rows


def _step_times(sh, tok, cache, cfg: Config, sync) -> tuple[list[float], list[float], list[float]]:
    """(step, all-reduce, wait) seconds of cfg.steps timed decode steps after one warm-up step."""
    times, comms, waits = [], [], []
    for _ in range(cfg.steps + 1):
        sh.comm_s, sh.wait_s, sh.comm_calls = 0.0, 0.0, 0
        sync()
        t0 = time.perf_counter()
        tok = sh.forward(tok, cache)[:, -1:].argmax(-1)
        sync()
        times.append(time.perf_counter() - t0)
        comms.append(sh.comm_s)
        waits.append(sh.wait_s)
    return times[1:], comms[1:], waits[1:]


def _steps(model, cfg: Config, dev, rank: int, world: int) -> list[dict]:
    """Part 3: decode steps at TP 1 (rank 0) and TP world, as they are and with the ranks aligned before each
    all-reduce."""
    import torch
    import torch.distributed as dist

    from llmlab.inference.tp import ShardedLlama

    rows, c = [], model.config
    elem = next(model.parameters()).element_size()
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    med = statistics.median
    for tp in (1, world):
        if rank < tp:
            sh = ShardedLlama(model, rank, tp)
            for b in cfg.batches:
                gen = torch.Generator().manual_seed(cfg.seed + b)
                ids = torch.randint(0, c.vocab_size, (b, cfg.context), generator=gen).to(dev)  # (B, T)
                sh.align = False
                cache = sh.new_cache()
                times, comms, _ = _step_times(sh, sh.forward(ids, cache)[:, -1:].argmax(-1), cache, cfg, sync)
                sh.align = True  # the same steps, a barrier before each all-reduce: the wait for the slower rank apart
                cache = sh.new_cache()
                a_times, a_comms, a_waits = _step_times(sh, sh.forward(ids, cache)[:, -1:].argmax(-1), cache, cfg, sync)
                step, comm = med(times), med(comms)
                rows.append(dict(tp=tp, batch=b, step_ms=step * 1e3, comm_ms=comm * 1e3, compute_ms=(step - comm) * 1e3,
                                 comm_share=comm / step, allreduces=sh.comm_calls, msg_bytes=b * c.hidden_size * elem,
                                 tokens_per_s=b / step, aligned_step_ms=med(a_times) * 1e3,
                                 aligned_comm_ms=med(a_comms) * 1e3, barrier_ms=med(a_waits) * 1e3))
        dist.barrier()
    return rows


def exactness_worker(rank: int, world: int, cfg: Config) -> dict | None:
    """Part 1 alone on gloo ranks (what the tests run): the exactness row on rank 0."""
    import torch
    import torch.distributed as dist

    from llmlab.core.models import load
    from llmlab.inference.tp import ShardedLlama

    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        with torch.inference_mode():
            model = load(cfg.model, "cpu", dtype="float32").model
            row = _exactness(model, ShardedLlama(model, rank, world), cfg, torch.device("cpu"))
        return row if rank == 0 else None
    finally:
        dist.destroy_process_group()


def _rank_device(plan: Plan, local_rank: int):
    import torch

    if not plan.on_cuda:
        torch.set_num_threads(1)  # one core per rank: ranks must not fight over the cores
        return torch.device("cpu")
    dev = torch.device(f"cuda:{plan.first_gpu + local_rank}")
    torch.cuda.set_device(dev)
    return dev


def _links(plan: Plan, dev, place: dict) -> list[dict] | None:
    """Every rank's own link rows (its GPU by UUID; the node's network port on local rank 0 across nodes), on rank 0."""
    import torch.distributed as dist

    mine = []
    if plan.on_cuda:
        try:
            mine = gpu_link_rows(dev.index)
        except Exception as exc:  # noqa: BLE001  (NVML missing or unsupported: say so, keep the rest)
            mine = [dict(scope="intra-node", link=f"unknown ({type(exc).__name__}: {str(exc)[:60]})", spec_GBps=None)]
        if place["nodes"] > 1 and place["local_rank"] == 0:
            mine.append(nic_row())
    got = [None] * place["world"]
    dist.all_gather_object(got, [r | dict(rank=place["rank"]) for r in mine])
    return [r for rows in got for r in rows] if place["rank"] == 0 else None


def _worker(rank: int, world: int, cfg: Config, plan: Plan) -> dict | None:
    """One rank: forms the group, runs parts 1-3, returns the rows on rank 0 (None elsewhere)."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    from llmlab.core.models import load
    from llmlab.inference.tp import ShardedLlama, layout, scope_groups

    place = layout()
    dev = _rank_device(plan, place["local_rank"])
    dist.init_process_group(plan.backend, rank=rank, world_size=world, timeout=timedelta(seconds=cfg.timeout_s))
    try:
        stage("group formed")
        _fault(cfg, rank)
        torch.manual_seed(cfg.seed)
        groups = scope_groups(world, place["local_world"])
        with torch.inference_mode():
            model = load(cfg.model, str(dev), dtype="float32").model
            stage("part 1: exactness")
            exact = _exactness(model, ShardedLlama(model, rank, world), cfg, dev)
            stage("part 2: collectives")
            coll = _collectives(cfg, dev, cfg.gpu_sizes if plan.on_cuda else cfg.sizes, groups)
            stage("part 3: decode steps")
            steps = _steps(model, cfg, dev, rank, world)
        links = _links(plan, dev, place)
        dist.barrier()
        return dict(exactness=[exact], collectives=coll, steps=steps, links=links,
                    layers=model.config.num_hidden_layers,
                    backend=plan.backend, nodes=place["nodes"],
                    ranks_per_node=place["local_world"]) if rank == 0 else None
    finally:
        dist.destroy_process_group()
