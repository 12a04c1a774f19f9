"""Lab: when one GPU is not enough — collectives and a sharded decode on torch.distributed.

1. A sharded decode, exact first: the built-in `tiny` split Megatron-style over the ranks
   (llmlab.inference.tp.ShardedLlama: heads and GQA KV heads column-split, o_proj row-split,
   gate/up column-split, down row-split, one all-reduce after attention and one after the MLP;
   embeddings and LM head replicated). Its logits must equal the single-process HF forward within
   1e-5 (FP32) and its greedy tokens must be identical, before anything is timed.
2. Collectives: all-reduce, all-gather, reduce-scatter from 8 B to 64 MiB on the CPU, to 1 GiB on
   GPUs (nccl-tests' range: NVLink busbw plateaus near 256 MiB-1 GiB): time, algbw and busbw as
   nccl-tests defines them (NVIDIA/nccl-tests, doc/PERFORMANCE.md: algbw = S/t; busbw = algbw x
   2(n-1)/n for all-reduce, (n-1)/n for all-gather and reduce-scatter). On GPUs busbw is compared
   with each rank's link spec read from NVML through that rank's own device UUID (active NVLink links
   x the per-direction rate of the GPU's NVLink generation, which its architecture fixes: 20 GB/s
   NVLink 1, 25 GB/s NVLink 2-4, 50 GB/s NVLink 5; or the maximum PCIe generation x width, not
   the current one, which drops at idle); on the CPU gloo
   runs over loopback TCP and has no link spec. Across nodes (torchrun) the sweep also runs on the
   ranks of one node (NVLink/PCIe) and on one rank per node (the network), each with its own spec
   (the node's InfiniBand or Ethernet port rate from sysfs).
3. Where the time goes: one decode step at batch 1 and 16 for TP = 1 and TP = nproc, with the
   all-reduces timed inside the step (the device synchronized around each at every TP, TP = 1
   included); the all-reduce message (batch x hidden x bytes), 2 x layers all-reduces per token, the
   comm predicted from part 2, and the scaling efficiency (speed-up / TP). The steps run twice: as
   they are (the speed-up), and with a barrier before each all-reduce, which splits the all-reduce
   time of a step into the wait for the slower rank (the skew) and the all-reduce itself.
4. What fits, by formula: arch:llama-3.1-70b in BF16 on 80 GB GPUs (llmlab.core.models
   param_count, kv_bytes_per_token): the minimum TP for a context x batch and the KV tokens left.

Ranks: `--nproc N` spawns them (torch.multiprocessing, MASTER_ADDR 127.0.0.1, a free port), gloo
with one thread per rank on the CPU, NCCL on GPUs (rank r on cuda:(G + r) with --gpu G); with fewer
GPUs than ranks (and --backend auto) the ranks run on gloo over the CPU and the run says so. Rank 0
gathers and returns the tables. Under an outside `torchrun --nnodes M --nproc-per-node N -m llmlab
tensor-parallel` (env:// rendezvous) every rank runs the worker, local rank r on cuda:(G + r), and
rank 0 alone renders and saves.

References: Shoeybi et al., "Megatron-LM" (2019); NVIDIA/nccl-tests doc/PERFORMANCE.md; PyTorch
torch.distributed docs (gloo / NCCL backends, torchrun); Pope et al., "Efficiently Scaling
Transformer Inference" (2022) for the 2-all-reduces-per-layer cost at small batch.
"""

from __future__ import annotations

import math
import os
import signal
import statistics
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from llmlab.core.device import Device, cpu_load
from llmlab.core.errors import UsageError
from llmlab.core.results import Chart, Claim, Col, LabResult, View
from llmlab.inference.tp import OPS, bandwidths, divisible_sizes, in_torchrun, launch, stage

if TYPE_CHECKING:
    import pandas as pd

LAB = "tensor-parallel"
VERSION = 2  # 2: sizes to 1 GiB on GPUs, syncs at TP = 1 too, the aligned (barrier) steps, per-rank links, scopes
JUDGE_VERSION = 2
MiB = 2**20
EXACT_TOL = 1e-5  # the bar for FP32 logits
FLOOR_BYTES = 4096  # messages up to 4 KiB: the latency floor
FLOOR_RATIO = 3.0  # "about the same time": within 3x of the 8 B time while the size grows 512x (bandwidth-bound: 512x)
PREDICT_TOL = 2.0  # comm share predicted from part 2 within 2x of the one timed in the step
LINK_SHARE = 0.5  # busbw plateau >= half the link's per-direction spec
BACKENDS = ("auto", "gloo", "nccl")


@dataclass(frozen=True)
class Config:
    nproc: int = 2  # ranks = the TP degree; 2 is what a 2-core CPU holds (one thread each)
    backend: str = "auto"  # auto: nccl on CUDA, gloo on the CPU
    timeout_s: float = 600.0  # a rank still running after this is declared hung (exit 3)
    model: str = "tiny"  # the built-in: real weights, so the exactness check means something
    prompt_len: int = 16  # prompt tokens for the exactness check
    new_tokens: int = 8  # greedy tokens compared against the single-process forward
    sizes: tuple[int, ...] = tuple(8 * 4**k for k in range(12)) + (64 * MiB,)  # CPU: 8 B .. 32 MiB x4 apart, then 64 MiB
    gpu_sizes: tuple[int, ...] = tuple(8 * 4**k for k in range(14)) + (1024 * MiB,)  # GPUs: 8 B .. 512 MiB, then 1 GiB (nccl-tests)
    warmup: int = 2  # untimed collectives per size (connection setup, first-touch)
    max_iters: int = 50  # timed collectives per size at most (nccl-tests' default is 20)
    blocks: int = 3  # the timed iterations in 3 blocks, the fastest block's mean kept (timeit's rule: less scheduler noise)
    point_s: float = 0.3  # target seconds of timed collectives per size (fewer iterations for big messages)
    batches: tuple[int, ...] = (1, 16)  # decode batches: latency-bound 1 and a small server batch
    context: int = 64  # cached positions before the timed decode steps
    steps: int = 20  # timed decode steps per (TP, batch): the median is reported
    fit_model: str = "arch:llama-3.1-70b"  # part 4: a model that needs several 80 GB GPUs in BF16
    fit_context: int = 8192  # tokens per sequence for part 4
    fit_batch: int = 16  # sequences for part 4
    gpu_GB: float = 80.0  # H100/A100 80 GB
    usable: float = 0.9  # share of a GPU's memory for weights + KV (the rest: activations, runtime)
    fault: str = ""  # test hook: "kill:R" kills rank R, "hang:R" hangs it, right after the group forms
    seed: int = 0  # the CLI sets it from --seed

    def __post_init__(self):
        if self.nproc < 2:
            raise ValueError(f"--nproc {self.nproc}: tensor parallelism needs at least 2 ranks (one process has "
                             "nothing to split or all-reduce; the TP=1 baseline is measured anyway)")
        if self.backend not in BACKENDS:
            raise ValueError(f"--backend {self.backend!r}: use auto, gloo (CPU) or nccl (CUDA)")
        if not self.timeout_s > 0:
            raise ValueError("--timeout-s must be > 0 seconds")
        if not self.sizes or not self.gpu_sizes or any(s < 8 or s > 2**30 for s in self.sizes + self.gpu_sizes):
            raise ValueError("message sizes must be 8 B .. 1 GiB")
        if not self.batches or any(b < 1 for b in self.batches) or self.context < 1 or self.steps < 3 or self.blocks < 1:
            raise ValueError("batches, context and blocks must be >= 1, steps >= 3")
        if self.fault and (self.fault.split(":")[0] not in ("kill", "hang") or not self.fault.split(":")[-1].isdigit()):
            raise ValueError(f"fault {self.fault!r}: the test hook takes kill:RANK or hang:RANK")
        if self.fit_context < 1 or self.fit_batch < 1 or not 0 < self.usable <= 1 or self.gpu_GB <= 0:
            raise ValueError("--fit-context and --fit-batch must be >= 1, usable in (0, 1], gpu_GB > 0")

    @classmethod
    def quick(cls) -> Config:
        return cls(timeout_s=180.0, sizes=(8, 1024, 4096, 64 * 1024, 4 * MiB), max_iters=20, point_s=0.05,
                   gpu_sizes=(8, 1024, 4096, 64 * 1024, 4 * MiB, 64 * MiB, 256 * MiB), steps=6, context=32, new_tokens=6)


# ---------------------------------------------------------------- checks before any rank starts


@dataclass(frozen=True)
class Plan:
    """Where the ranks run: the backend, whether on GPUs, the first GPU, and why it differs from what was asked."""

    backend: str
    on_cuda: bool
    first_gpu: int = 0
    note: str = ""


def check_ranks(nproc: int, backend: str, cuda: bool, gpus: int, first_gpu: int = 0) -> Plan:
    """The plan for `nproc` ranks on this host, or UsageError. One rank per GPU from cuda:first_gpu on; with fewer
    GPUs than that and --backend auto, the ranks run on gloo over the CPU (the run says so); nccl needs the GPUs."""
    chosen = ("nccl" if cuda else "gloo") if backend == "auto" else backend
    if chosen == "nccl" and not cuda:
        raise UsageError("--backend nccl needs CUDA GPUs: on the CPU use gloo (or auto)")
    have = max(0, gpus - first_gpu)
    if cuda and nproc > have:
        if backend != "auto":
            raise UsageError(f"--nproc {nproc}: only {have} CUDA GPU(s) from cuda:{first_gpu} on, one rank per GPU "
                             f"(--backend auto runs the ranks on gloo over the CPU instead)")
        return Plan("gloo", False, first_gpu, f"only {have} CUDA GPU(s) from cuda:{first_gpu} for {nproc} ranks: the "
                    "collectives and the sharded decode ran on gloo over the CPU (one thread per rank), so no figure "
                    "here is a GPU's; run with one GPU per rank for NCCL")
    return Plan(chosen, cuda, first_gpu)


def check_heads(heads: int, kv_heads: int, tp: int, intermediate: int = 0) -> None:
    """UsageError unless TP divides the query heads, the KV heads (no KV-head replication here) and the MLP width."""
    if heads % tp or kv_heads % tp or (intermediate and intermediate % tp):
        ok = [t for t in divisible_sizes(heads, kv_heads) if not intermediate or intermediate % t == 0]
        raise UsageError(f"TP {tp} does not divide {heads} query heads and {kv_heads} KV heads"
                         f"{f' and {intermediate} MLP columns' if intermediate else ''}: "
                         f"TP sizes that divide: {', '.join(map(str, ok)) or 'none'}")


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
                rows.append(dict(scope=scope, op=op, ranks=n, size_bytes=size, iters=per * cfg.blocks, time_us=sec * 1e6,
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
    """Part 3: decode steps at TP 1 (rank 0) and TP world, as they are and with the ranks aligned before each all-reduce."""
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
        return dict(exactness=[exact], collectives=coll, steps=steps, links=links, layers=model.config.num_hidden_layers,
                    backend=plan.backend, nodes=place["nodes"], ranks_per_node=place["local_world"]) if rank == 0 else None
    finally:
        dist.destroy_process_group()


# ---------------------------------------------------------------- formulas (parent process)


def _scope(coll: pd.DataFrame, scope: str) -> pd.DataFrame:
    """The sweep's rows of one scope ("world", "intra-node", "inter-node"); a run without scopes is all "world"."""
    return coll[coll.scope == scope] if "scope" in coll else (coll if scope == "world" else coll.iloc[0:0])


def predicted_comm_ms(coll: pd.DataFrame, msg_bytes: float, calls: int) -> float:
    """calls x the all-reduce time at msg_bytes, interpolated log-log in part 2's sweep."""
    import numpy as np

    ar = _scope(coll, "world")
    ar = ar[ar.op == "all_reduce"].dropna(subset=["time_us"]).sort_values("size_bytes")
    if ar.empty:
        return math.nan
    t = np.exp(np.interp(np.log(msg_bytes), np.log(ar.size_bytes), np.log(ar.time_us)))
    return calls * float(t) / 1e3


def fits_rows(cfg: Config) -> list[dict]:
    from llmlab.core.models import kv_bytes_per_token, load_config, param_count, shape

    c = load_config(cfg.fit_model)
    s = shape(c)
    weights, kv_tok = param_count(c) * 2, kv_bytes_per_token(c, 2)  # BF16
    usable = cfg.usable * cfg.gpu_GB * 1e9
    need_kv = kv_tok * cfg.fit_context * cfg.fit_batch
    rows = []
    for tp in (1, 2, 4, 8):
        w, kv = weights / tp, kv_tok / tp  # everything split by TP (vLLM also splits the vocab)
        left = max(0.0, usable - w)
        rows.append(dict(model=cfg.fit_model, tp=tp, weights_GB_per_gpu=w / 1e9, kv_KiB_per_token_per_gpu=kv / 1024,
                         kv_needed_GB_per_gpu=need_kv / tp / 1e9, kv_tokens_left_per_gpu=int(left // kv),
                         kv_heads_divide=s["kv_heads"] % tp == 0, fits=w + need_kv / tp <= usable))
    return rows


# GB/s per link per direction by NVLink version: NVLink 1 (P100) 20, NVLink 2-4 (V100, A100, H100) 25, NVLink 5 (B200) 50
NVLINK_GBPS = {1: 20.0, 2: 25.0, 3: 25.0, 4: 25.0, 5: 50.0}
# GB/s per lane per direction by PCIe generation, after line coding: 2.5 and 5 GT/s with 8b/10b (gen 1-2),
# 8 / 16 / 32 GT/s with 128b/130b (gen 3-5), 64 GT/s PAM4 with FLIT (gen 6)
PCIE_LANE_GBPS = {1: 0.25, 2: 0.5, 3: 0.985, 4: 1.969, 5: 3.938, 6: 7.563}
NVLINK_MAX = 18  # links per GPU on an H100/H200/B200
# The NVLink generation of a GPU follows its architecture (compute capability major): Pascal 1, Volta 2, Ampere 3,
# Hopper 4, Blackwell 5. NVML's nvmlDeviceGetNvLinkVersion is not used for it: across drivers it returns either
# the version or an nvmlNvlinkVersion_t code (3.0 -> 4, 4.0 -> 6), and 5 would mean NVLink 5 or NVLink 3.1.
NVLINK_GEN_BY_CC = {6: 1, 7: 2, 8: 3, 9: 4, 10: 5}


def nvlink_spec(versions: list[int]) -> tuple[str, float | None]:
    """(label, GB/s per direction) for the active NVLink links' versions; None where a version is not in the table."""
    rates = [NVLINK_GBPS.get(v) for v in versions]
    if None in rates:
        return f"NVLink x{len(versions)} (generation unknown)", None
    return f"NVLink {max(versions)} x{len(versions)}", sum(rates)


def pcie_spec(gen: int, width: int) -> tuple[str, float | None]:
    """(label, GB/s per direction) of a PCIe link at its maximum generation and width."""
    lane = PCIE_LANE_GBPS.get(gen)
    return f"PCIe {gen} x{width}", (None if lane is None else lane * width)


def gpu_link_rows(index: int) -> list[dict]:
    """This rank's GPU (cuda:index, found in NVML by UUID: right under CUDA_VISIBLE_DEVICES) and its link spec."""
    import pynvml as nv  # noqa: PLC0415  (only on CUDA)
    import torch

    from llmlab.core.device import nvml_handle

    nv.nvmlInit()
    h, how = nvml_handle(nv, index)
    links = 0
    for i in range(NVLINK_MAX):
        try:
            links += nv.nvmlDeviceGetNvLinkState(h, i) == 1
        except nv.NVMLError:
            break
    if links:
        gen = NVLINK_GEN_BY_CC.get(torch.cuda.get_device_capability(index)[0], 0)
        label, spec = nvlink_spec([gen] * links)
    else:  # the maximum link, not the current one: PCIe drops generation and width at idle
        label, spec = pcie_spec(nv.nvmlDeviceGetMaxPcieLinkGeneration(h), nv.nvmlDeviceGetMaxPcieLinkWidth(h))
    return [dict(scope="intra-node", device=f"cuda:{index}", nvml=how, link=label + " (spec)", spec_GBps=spec)]


def nic_row(sys_root: str = "/sys") -> dict:
    """The node's fastest network port (InfiniBand port rate, else Ethernet link speed, from sysfs): the inter-node spec.

    One port per GPU is assumed (a DGX H100 has eight 400 Gb/s ports for eight GPUs), so one rank's share is one port."""
    from pathlib import Path

    root = Path(sys_root)
    ib = []
    for rate in root.glob("class/infiniband/*/ports/*/rate"):  # "400 Gb/sec (4X NDR)"
        try:
            ib.append(float(rate.read_text().split()[0]))
        except (OSError, ValueError, IndexError):
            continue
    if ib:
        return dict(scope="inter-node", link=f"InfiniBand {max(ib):g} Gb/s x{len(ib)} ports (spec per port)",
                    spec_GBps=max(ib) / 8)
    eth = []
    for speed in root.glob("class/net/*/speed"):  # Mb/s; -1 or unreadable when the link is down
        try:
            mbps = int(speed.read_text().strip())
        except (OSError, ValueError):
            continue
        if mbps > 0 and speed.parent.name != "lo":
            eth.append(mbps)
    if eth:
        return dict(scope="inter-node", link=f"Ethernet {max(eth) / 1000:g} Gb/s (spec)", spec_GBps=max(eth) / 8000)
    return dict(scope="inter-node", link="unknown (no InfiniBand or Ethernet speed in sysfs)", spec_GBps=None)


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
        res.env["tp"] = dict(backend=out["backend"], ranks=world, nodes=out["nodes"], ranks_per_node=out["ranks_per_node"],
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


# ---------------------------------------------------------------- judge


def _t(result: LabResult, name: str):
    df = result.tables.get(name)
    return None if df is None or df.empty else df


def plateau(coll: pd.DataFrame, op: str = "all_reduce") -> float:
    """The bandwidth plateau: the best busbw of the sweep (reached at the large messages)."""
    d = coll[coll.op == op].dropna(subset=["busbw_GBps"])
    return float(d.busbw_GBps.max()) if len(d) else math.nan


def _exact_claim(ex) -> Claim:
    cid, text, exp = "tensor_parallel.sharded_logits_equal", "the sharded model computes the same logits", \
        f"max |diff| <= {EXACT_TOL:g} (FP32), same greedy tokens"
    if ex is None:
        return Claim(cid, text, exp, "-", None, "no exactness table")
    r = ex.iloc[0]
    return Claim(cid, text, exp, f"TP {int(r.tp)}: max |diff| {r.max_abs_logit_diff:.1e}; greedy equal: {bool(r.greedy_equal)}",
                 bool(r.max_abs_logit_diff <= EXACT_TOL and r.greedy_equal))


def _busbw_claim(result: LabResult, coll, link, scope: str, hop: str, cid: str, text: str) -> Claim:
    """The scope's busbw plateau >= LINK_SHARE x the slowest rank's spec for the hop it crosses (a ring runs at its
    slowest link); on one node the "world" scope crosses the "intra-node" hop."""
    exp = f"best busbw of the sweep >= {LINK_SHARE:.0%} of the link spec"
    rows = None if coll is None or "busbw_GBps" not in coll else _scope(coll, scope)
    if rows is None or rows.empty:
        return Claim(cid, text, exp, "-", None, f"this run has no {scope} collectives")
    p = plateau(rows)
    specs = None if link is None else (link[link.scope == hop] if "scope" in link else link).dropna(subset=["spec_GBps"])
    if specs is None or specs.empty:
        why = result.skipped.get("link", "no link spec") if link is None else f"the {hop} link's spec is unknown"
        return Claim(cid, text, exp, f"plateau {p:.2f} GB/s busbw", None, f"not measured: {why}")
    slow = specs.loc[specs.spec_GBps.idxmin()]
    spec = float(slow.spec_GBps)
    return Claim(cid, text, f"best busbw of the sweep >= {LINK_SHARE:.0%} of {spec:.0f} GB/s ({slow.link}, the slowest rank's)",
                 f"plateau {p:.1f} GB/s = {p / spec:.0%} of spec", bool(p >= LINK_SHARE * spec))


def _floor_claim(coll) -> Claim:
    cid, text = "tensor_parallel.latency_floor", "small messages cost about the same time: a latency floor"
    if coll is None or "time_us" not in coll:
        return Claim(cid, text, f"t(<= {FLOOR_BYTES} B) within {FLOOR_RATIO:g}x", "-", None, "no collectives table")
    ar = _scope(coll, "world")
    ar = ar[ar.op == "all_reduce"].dropna(subset=["time_us"]).sort_values("size_bytes")
    small = ar[ar.size_bytes <= FLOOR_BYTES]
    if len(small) < 2:
        return Claim(cid, text, f"t(<= {FLOOR_BYTES} B) within {FLOOR_RATIO:g}x", "-", None, "fewer than 2 small sizes")
    lo, hi = small.iloc[0], small.iloc[-1]
    ratio = hi.time_us / lo.time_us
    return Claim(cid, text, f"t({int(hi.size_bytes)} B) <= {FLOOR_RATIO:g}x t({int(lo.size_bytes)} B) (not "
                 f"{hi.size_bytes / lo.size_bytes:.0f}x)", f"{lo.time_us:.0f} -> {hi.time_us:.0f} us ({ratio:.2f}x)",
                 bool(ratio <= FLOOR_RATIO))


def _comm_claim(st) -> Claim:
    """At batch 1 the all-reduce time of a step, ranks aligned by a barrier first, against part 2's prediction."""
    cid, text = "tensor_parallel.comm_share_tp2_b1", "at batch 1, a TP step's all-reduces cost what part 2 predicts"
    row = None if st is None else st[(st.tp > 1) & (st.batch == 1)]
    if row is None or row.empty or "predicted_comm_ms" not in row:
        return Claim(cid, text, "2L all-reduces x part 2's time", "-", None, "no TP step at batch 1")
    r = row.iloc[0]
    aligned = r.aligned_comm_ms if "aligned_comm_ms" in r else r.comm_ms  # a run before the aligned steps: the raw time
    ratio = aligned / r.predicted_comm_ms if r.predicted_comm_ms > 0 else math.inf
    skew = (f"; unaligned, {r.comm_share:.0%} of the step is in all-reduce, {r.wait_share:.0%} waiting for the "
            "slower rank") if "wait_share" in r else ""
    return Claim(cid, text, f"all-reduce time (ranks aligned by a barrier) within {PREDICT_TOL:g}x of {int(r.allreduces)} x "
                 f"part 2's all-reduce at {int(r.msg_bytes)} B = {r.predicted_comm_ms:.2f} ms",
                 f"{aligned:.2f} ms ({ratio:.2f}x) of a {r.step_ms:.2f} ms step{skew}",
                 bool(1 / PREDICT_TOL <= ratio <= PREDICT_TOL),
                 note="" if ratio <= PREDICT_TOL else f"with the skew taken out, a step's all-reduces still cost {ratio:.1f}x "
                 "the sweep's back-to-back mean: the wait for the slower rank is not the whole gap")


def judge(result: LabResult) -> list[Claim]:
    coll, link = _t(result, "collectives"), _t(result, "link")
    across = coll is not None and "scope" in coll and (coll.scope == "inter-node").any()
    claims = [_exact_claim(_t(result, "exactness")),
              _busbw_claim(result, coll, link, "intra-node" if across else "world", "intra-node", "tensor_parallel.allreduce_busbw",
                           "all-reduce busbw reaches the link's spec"),
              _floor_claim(coll), _comm_claim(_t(result, "steps"))]
    if across:  # torchrun over several nodes: the network hop against the node's port
        claims.insert(2, _busbw_claim(result, coll, link, "inter-node", "inter-node", "tensor_parallel.internode_busbw",
                                      "across nodes, all-reduce busbw reaches the network port's spec"))
    return claims


def headline(result: LabResult, claims: list[Claim]) -> str:
    st = _t(result, "steps")
    if st is None or not (st.tp > 1).any():
        return ""
    r = st[st.tp > 1].iloc[0]
    split = ""
    if "wait_share" in r:
        wait = (f"{r.wait_share:.0%} waiting for the slower rank" if r.wait_share >= 0 else
                "no measurable wait for the slower rank (aligned, they took longer)")
        split = f": {r.aligned_comm_share:.0%} in the all-reduces themselves (ranks aligned by a barrier first) and {wait}"
    tp = result.env.get("tp", {})
    where = f" across {tp['nodes']} nodes" if tp.get("nodes", 1) > 1 else ""
    cpu = " (on gloo over the CPU: fewer GPUs than ranks)" if tp.get("plan_note") else ""
    return (f"At batch {int(r.batch)} a TP={int(r.tp)} step{where}{cpu} spends {r.comm_share:.0%} of its time in "
            f"{int(r.allreduces)} all-reduces of {int(r.msg_bytes)} B{split}; it runs at {r.speedup:.2f}x the one-rank step.")


def views(result: LabResult) -> list[View]:
    coll = result.tables.get("collectives")
    scope = (Col("scope", "scope", "text"),) if coll is not None and "scope" in coll and coll.scope.nunique() > 1 else ()
    return [
        View("1. The sharded model, exact first", "Does the split model compute what one process computes?", "exactness",
             (Col("tp", "TP", "int"), Col("max_abs_logit_diff", "max |logit diff|", ".1e"), Col("greedy_equal", "greedy same", "text"),
              Col("tokens", "tokens", "int"))),
        View("2. Collectives", "What does an all-reduce cost, small to large (nccl-tests' busbw)?", "collectives",
             (*scope, Col("op", "op", "text"), Col("size_bytes", "bytes", "int"), Col("time_us", "time us"),
              Col("algbw_GBps", "algbw GB/s"), Col("busbw_GBps", "busbw GB/s")),
             rows=lambda d: d[d.op == "all_reduce"] if "op" in d else d,
             chart=Chart("all-reduce busbw vs message size", "collectives", "size_bytes", "busbw_GBps", series="op",
                         logx=True, logy=True, xlabel="bytes (log)", ylabel="GB/s")),
        View("   ... the link", "What would the hardware allow (each rank's own link)?", "link",
             (Col("rank", "rank", "int"), Col("scope", "scope", "text"), Col("link", "link", "text"), Col("spec_GBps", "GB/s"))),
        View("3. Where a decode step's time goes", "Compute vs all-reduce per step, TP 1 vs TP n; the wait for the slower rank apart",
             "steps",
             (Col("tp", "TP", "int"), Col("batch", "batch", "int"), Col("step_ms", "step ms"), Col("comm_share", "comm", "%"),
              Col("aligned_comm_share", "aligned", "%"), Col("wait_share", "wait", "%"),
              Col("predicted_comm_share", "comm pred.", "%"), Col("msg_bytes", "msg B", "int"),
              Col("efficiency", "scaling eff.", "%"))),
        View("4. What fits on 80 GB GPUs (formula)", "Minimum TP for the context x batch; KV tokens left per GPU", "fits",
             (Col("tp", "TP", "int"), Col("weights_GB_per_gpu", "weights GB", ".1f"),
              Col("kv_needed_GB_per_gpu", "KV needed GB", ".1f"), Col("kv_tokens_left_per_gpu", "KV tokens left", "int"),
              Col("fits", "fits", "text"))),
    ]
