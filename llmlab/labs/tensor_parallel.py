"""Lab: when one GPU is not enough — collectives and a sharded decode on torch.distributed.

1. A sharded decode, exact first: the built-in `tiny` split Megatron-style over the ranks
   (llmlab.inference.tp.ShardedLlama: heads and GQA KV heads column-split, o_proj row-split,
   gate/up column-split, down row-split, one all-reduce after attention and one after the MLP;
   embeddings and LM head replicated). Its logits must equal the single-process HF forward within
   1e-5 (FP32) and its greedy tokens must be identical, before anything is timed.
2. Collectives: all-reduce, all-gather, reduce-scatter from 8 B to 64 MiB: time, algbw and busbw as
   nccl-tests defines them (NVIDIA/nccl-tests, doc/PERFORMANCE.md: algbw = S/t; busbw = algbw x
   2(n-1)/n for all-reduce, (n-1)/n for all-gather and reduce-scatter). On GPUs busbw is compared
   with the link's spec read from NVML (NVLink links x 25 GB/s per direction for NVLink 2-4, or
   PCIe generation x width); on the CPU gloo runs over loopback TCP and has no link spec.
3. Where the time goes: one decode step at batch 1 and 16 for TP = 1 and TP = nproc, with the
   all-reduces timed inside the step (compute = step - communication); the all-reduce message
   (batch x hidden x bytes), 2 x layers all-reduces per token, the comm predicted from part 2,
   and the scaling efficiency (speed-up / TP).
4. What fits, by formula: arch:llama-3.1-70b in BF16 on 80 GB GPUs (llmlab.core.models
   param_count, kv_bytes_per_token): the minimum TP for a context x batch and the KV tokens left.

Ranks: `--nproc N` spawns them (torch.multiprocessing, MASTER_ADDR 127.0.0.1, a free port), gloo
with one thread per rank on the CPU, NCCL on GPUs; rank 0 gathers and returns the tables. Under an
outside `torchrun --nproc-per-node N -m llmlab tensor-parallel` every rank runs the worker and
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
VERSION = 1
JUDGE_VERSION = 1
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
    sizes: tuple[int, ...] = tuple(8 * 4**k for k in range(12)) + (64 * MiB,)  # 8 B .. 32 MiB x4 apart, then 64 MiB
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
        if not self.sizes or any(s < 8 or s > 2**30 for s in self.sizes):
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
                   steps=6, context=32, new_tokens=6)


# ---------------------------------------------------------------- checks before any rank starts


def check_ranks(nproc: int, backend: str, cuda: bool, gpus: int) -> str:
    """The backend to use, or UsageError: nccl needs CUDA and one GPU per rank."""
    backend = ("nccl" if cuda else "gloo") if backend == "auto" else backend
    if backend == "nccl" and not cuda:
        raise UsageError("--backend nccl needs CUDA GPUs: on the CPU use gloo (or auto)")
    if cuda and nproc > gpus:
        raise UsageError(f"--nproc {nproc}: only {gpus} CUDA GPU(s) here, one rank per GPU")
    return backend


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


def _collectives(cfg: Config, dev, world: int) -> list[dict]:
    import torch
    import torch.distributed as dist

    from llmlab.inference.tp import time_collective

    rows = []
    for op in OPS:
        for size in cfg.sizes:
            if size < 4 * world:
                continue
            try:
                one = time_collective(op, size, dev, warmup=cfg.warmup, iters=1)
            except (RuntimeError, NotImplementedError) as exc:  # e.g. a backend without this collective
                rows.append(dict(op=op, size_bytes=size, error=str(exc).splitlines()[0][:80]))
                break
            iters = int(max(3, min(cfg.max_iters, cfg.point_s / max(one, 1e-7))))
            t = torch.tensor([iters], device=dev)
            dist.all_reduce(t, op=dist.ReduceOp.MIN)  # every rank runs the same count
            per = max(1, int(t.item()) // cfg.blocks)
            sec = min(time_collective(op, size, dev, warmup=0, iters=per) for _ in range(cfg.blocks))
            alg, bus = bandwidths(op, size, sec, world)
            rows.append(dict(op=op, ranks=world, size_bytes=size, iters=per * cfg.blocks, time_us=sec * 1e6,
                             algbw_GBps=alg, busbw_GBps=bus))
    return rows


def _steps(model, cfg: Config, dev, rank: int, world: int) -> list[dict]:
    import torch
    import torch.distributed as dist

    from llmlab.inference.tp import ShardedLlama

    rows, c = [], model.config
    elem = next(model.parameters()).element_size()
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    for tp in (1, world):
        if rank < tp:
            sh = ShardedLlama(model, rank, tp)
            for b in cfg.batches:
                gen = torch.Generator().manual_seed(cfg.seed + b)
                ids = torch.randint(0, c.vocab_size, (b, cfg.context), generator=gen).to(dev)  # (B, T)
                cache = sh.new_cache()
                tok = sh.forward(ids, cache)[:, -1:].argmax(-1)  # (B, 1)
                times, comms = [], []
                for _ in range(cfg.steps + 1):  # the first step is warm-up
                    sh.comm_s, sh.comm_calls = 0.0, 0
                    sync()
                    t0 = time.perf_counter()
                    tok = sh.forward(tok, cache)[:, -1:].argmax(-1)
                    sync()
                    times.append(time.perf_counter() - t0)
                    comms.append(sh.comm_s)
                step, comm = statistics.median(times[1:]), statistics.median(comms[1:])
                rows.append(dict(tp=tp, batch=b, step_ms=step * 1e3, comm_ms=comm * 1e3, compute_ms=(step - comm) * 1e3,
                                 comm_share=comm / step, allreduces=sh.comm_calls, msg_bytes=b * c.hidden_size * elem,
                                 tokens_per_s=b / step))
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


def _worker(rank: int, world: int, cfg: Config, backend: str, cuda: bool) -> dict | None:
    """One rank: forms the group, runs parts 1-3, returns the rows on rank 0 (None elsewhere)."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    from llmlab.core.models import load
    from llmlab.inference.tp import ShardedLlama

    if cuda:
        dev = torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', rank))}")
        torch.cuda.set_device(dev)
    else:
        dev = torch.device("cpu")
        torch.set_num_threads(1)  # one core per rank: ranks must not fight over the cores
    dist.init_process_group(backend, rank=rank, world_size=world, timeout=timedelta(seconds=cfg.timeout_s))
    try:
        stage("group formed")
        _fault(cfg, rank)
        torch.manual_seed(cfg.seed)
        with torch.inference_mode():
            model = load(cfg.model, str(dev), dtype="float32").model
            stage("part 1: exactness")
            exact = _exactness(model, ShardedLlama(model, rank, world), cfg, dev)
            stage("part 2: collectives")
            coll = _collectives(cfg, dev, world)
            stage("part 3: decode steps")
            steps = _steps(model, cfg, dev, rank, world)
        dist.barrier()
        return dict(exactness=[exact], collectives=coll, steps=steps, layers=model.config.num_hidden_layers,
                    backend=backend) if rank == 0 else None
    finally:
        dist.destroy_process_group()


# ---------------------------------------------------------------- formulas (parent process)


def predicted_comm_ms(coll: pd.DataFrame, msg_bytes: float, calls: int) -> float:
    """calls x the all-reduce time at msg_bytes, interpolated log-log in part 2's sweep."""
    import numpy as np

    ar = coll[coll.op == "all_reduce"].dropna(subset=["time_us"]).sort_values("size_bytes")
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


def link_rows(device: Device) -> list[dict]:
    """The link between GPU 0 and its peers from NVML: NVLink links x 25 GB/s (NVLink 2-4) or PCIe gen x width."""
    import pynvml as nv  # noqa: PLC0415  (only on CUDA)

    nv.nvmlInit()
    h = nv.nvmlDeviceGetHandleByIndex(device.index or 0)
    links = 0
    for i in range(18):
        try:
            links += nv.nvmlDeviceGetNvLinkState(h, i) == 1
        except nv.NVMLError:
            break
    if links:
        return [dict(link=f"NVLink x{links} (spec)", spec_GBps=25.0 * links)]
    gen, width = nv.nvmlDeviceGetCurrPcieLinkGeneration(h), nv.nvmlDeviceGetCurrPcieLinkWidth(h)
    per_lane = {3: 0.985, 4: 1.969, 5: 3.938, 6: 7.563}.get(gen, math.nan)  # GB/s per lane per direction
    return [dict(link=f"PCIe {gen} x{width} (spec)", spec_GBps=per_lane * width)]


# ---------------------------------------------------------------- run


def run(cfg: Config, device: Device, progress=None) -> LabResult:
    """Measures. Spawns the ranks (or is one of them under torchrun); never prints, never judges."""
    from llmlab.core.device import cuda_device_count
    from llmlab.core.models import load_config

    c = load_config(cfg.model)
    world = int(os.environ["WORLD_SIZE"]) if in_torchrun() else cfg.nproc
    backend = check_ranks(world, cfg.backend, device.is_cuda, cuda_device_count())
    check_heads(c.num_attention_heads, getattr(c, "num_key_value_heads", None) or c.num_attention_heads, world,
                c.intermediate_size)
    res = LabResult.new(LAB, VERSION, cfg)
    load, cores = cpu_load()  # before the ranks start: their own load is not the machine's
    res.env["cpu_load_before"] = load
    with res.guard():
        if in_torchrun():
            rank = int(os.environ["RANK"])
            out = _worker(rank, world, cfg, backend, device.is_cuda)
            if rank != 0:
                raise SystemExit(0)  # only rank 0 renders and saves
            res.note(f"ranks started by an outside launcher (torchrun): {world} ranks")
        else:
            out = launch(_worker, world, (cfg, backend, device.is_cuda), cfg.timeout_s)
        res.env["tp"] = dict(backend=out["backend"], ranks=world, threads_per_rank=None if device.is_cuda else 1)
        res.add_table("exactness", out["exactness"])
        coll = res.add_table("collectives", out["collectives"])
        steps = res.add_table("steps", out["steps"])
        steps["predicted_comm_ms"] = [predicted_comm_ms(coll, m, a) if t > 1 else 0.0
                                      for m, a, t in zip(steps.msg_bytes, steps.allreduces, steps.tp, strict=True)]
        steps["predicted_comm_share"] = steps.predicted_comm_ms / steps.step_ms
        base = steps[steps.tp == 1].set_index("batch").step_ms
        steps["speedup"] = [base[b] / s for b, s in zip(steps.batch, steps.step_ms, strict=True)]
        steps["efficiency"] = steps.speedup / steps.tp
        res.add_table("fits", fits_rows(cfg))
        if device.is_cuda:
            try:
                res.add_table("link", link_rows(device))
            except Exception as exc:  # noqa: BLE001  (NVML missing or unsupported: say so, keep the rest)
                res.skip("link", f"NVML could not read the link ({type(exc).__name__})")
        else:
            res.skip("link", "no GPU (gloo over loopback TCP has no link spec)")
        res.note(f"{world} ranks on {out['backend']}; embeddings and LM head replicated on every rank")
        if not device.is_cuda and load is not None and load >= cores:
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


def judge(result: LabResult) -> list[Claim]:
    claims, n = [], "tensor_parallel."
    ex = _t(result, "exactness")
    if ex is None:
        claims.append(Claim(n + "sharded_logits_equal", "the sharded model computes the same logits",
                            f"max |diff| <= {EXACT_TOL:g} (FP32), same greedy tokens", "-", None, "no exactness table"))
    else:
        r = ex.iloc[0]
        claims.append(Claim(n + "sharded_logits_equal", "the sharded model computes the same logits",
                            f"max |diff| <= {EXACT_TOL:g} (FP32), same greedy tokens",
                            f"TP {int(r.tp)}: max |diff| {r.max_abs_logit_diff:.1e}; greedy equal: {bool(r.greedy_equal)}",
                            bool(r.max_abs_logit_diff <= EXACT_TOL and r.greedy_equal)))
    coll = _t(result, "collectives")
    link = _t(result, "link")
    text = "all-reduce busbw reaches the link's spec"
    if coll is None or "busbw_GBps" not in coll:
        claims.append(Claim(n + "allreduce_busbw", text, f">= {LINK_SHARE:.0%} of spec", "-", None, "no collectives table"))
        claims.append(Claim(n + "latency_floor", "small messages cost about the same time: a latency floor",
                            f"t(<= {FLOOR_BYTES} B) within {FLOOR_RATIO:g}x", "-", None, "no collectives table"))
    else:
        p = plateau(coll)
        if link is None:
            why = result.skipped.get("link", "no link spec")
            claims.append(Claim(n + "allreduce_busbw", text, f">= {LINK_SHARE:.0%} of the link spec",
                                f"plateau {p:.2f} GB/s busbw", None, f"not measured: {why}"))
        else:
            spec = float(link.spec_GBps.iloc[0])
            claims.append(Claim(n + "allreduce_busbw", text, f">= {LINK_SHARE:.0%} of {spec:.0f} GB/s ({link.link.iloc[0]})",
                                f"plateau {p:.1f} GB/s = {p / spec:.0%} of spec", bool(p >= LINK_SHARE * spec)))
        ar = coll[coll.op == "all_reduce"].dropna(subset=["time_us"]).sort_values("size_bytes")
        small = ar[ar.size_bytes <= FLOOR_BYTES]
        if len(small) >= 2:
            ratio = small.time_us.iloc[-1] / small.time_us.iloc[0]
            claims.append(Claim(n + "latency_floor", "small messages cost about the same time: a latency floor",
                                f"t({int(small.size_bytes.iloc[-1])} B) <= {FLOOR_RATIO:g}x t({int(small.size_bytes.iloc[0])} B) (not "
                                f"{small.size_bytes.iloc[-1] / small.size_bytes.iloc[0]:.0f}x)",
                                f"{small.time_us.iloc[0]:.0f} -> {small.time_us.iloc[-1]:.0f} us ({ratio:.2f}x)",
                                bool(ratio <= FLOOR_RATIO)))
        else:
            claims.append(Claim(n + "latency_floor", "small messages cost about the same time: a latency floor",
                                f"t(<= {FLOOR_BYTES} B) within {FLOOR_RATIO:g}x", "-", None, "fewer than 2 small sizes"))
    st = _t(result, "steps")
    row = None if st is None else st[(st.tp > 1) & (st.batch == 1)]
    text = "at batch 1, communication is a large share of a TP=2 step"
    if row is None or row.empty or "predicted_comm_share" not in row:
        claims.append(Claim(n + "comm_share_tp2_b1", text, "2L all-reduces x part 2's time", "-", None, "no TP step at batch 1"))
    else:
        r = row.iloc[0]
        ratio = r.comm_share / r.predicted_comm_share if r.predicted_comm_share > 0 else math.inf
        claims.append(Claim(n + "comm_share_tp2_b1", text,
                            f"{int(r.allreduces)} all-reduces x part 2 = {r.predicted_comm_share:.0%} (within {PREDICT_TOL:g}x)",
                            f"{r.comm_share:.0%} of {r.step_ms:.2f} ms ({r.comm_ms:.2f} ms in all-reduce)",
                            bool(1 / PREDICT_TOL <= ratio <= PREDICT_TOL),
                            note="" if ratio <= PREDICT_TOL else "in the step an all-reduce also waits for the slower rank; "
                            "the sweep's ranks arrive together"))
    return claims


def headline(result: LabResult, claims: list[Claim]) -> str:
    st = _t(result, "steps")
    if st is None or not (st.tp > 1).any():
        return ""
    r = st[st.tp > 1].iloc[0]
    return (f"At batch {int(r.batch)} a TP={int(r.tp)} step spends {r.comm_share:.0%} of its time in "
            f"{int(r.allreduces)} all-reduces of {int(r.msg_bytes)} B, and runs at {r.speedup:.2f}x the one-rank step.")


def views(result: LabResult) -> list[View]:
    return [
        View("1. The sharded model, exact first", "Does the split model compute what one process computes?", "exactness",
             (Col("tp", "TP", "int"), Col("max_abs_logit_diff", "max |logit diff|", ".1e"), Col("greedy_equal", "greedy same", "text"),
              Col("tokens", "tokens", "int"))),
        View("2. Collectives", "What does an all-reduce cost, small to large (nccl-tests' busbw)?", "collectives",
             (Col("op", "op", "text"), Col("size_bytes", "bytes", "int"), Col("time_us", "time us"),
              Col("algbw_GBps", "algbw GB/s"), Col("busbw_GBps", "busbw GB/s")),
             rows=lambda d: d[d.op == "all_reduce"] if "op" in d else d,
             chart=Chart("all-reduce busbw vs message size", "collectives", "size_bytes", "busbw_GBps", series="op",
                         logx=True, logy=True, xlabel="bytes (log)", ylabel="GB/s")),
        View("   ... the link", "What would the hardware allow?", "link", (Col("link", "link", "text"), Col("spec_GBps", "GB/s"))),
        View("3. Where a decode step's time goes", "Compute vs all-reduce per step, TP 1 vs TP n", "steps",
             (Col("tp", "TP", "int"), Col("batch", "batch", "int"), Col("step_ms", "step ms"), Col("comm_share", "comm", "%"),
              Col("predicted_comm_share", "comm pred.", "%"), Col("msg_bytes", "msg B", "int"),
              Col("efficiency", "scaling eff.", "%"))),
        View("4. What fits on 80 GB GPUs (formula)", "Minimum TP for the context x batch; KV tokens left per GPU", "fits",
             (Col("tp", "TP", "int"), Col("weights_GB_per_gpu", "weights GB", ".1f"),
              Col("kv_needed_GB_per_gpu", "KV needed GB", ".1f"), Col("kv_tokens_left_per_gpu", "KV tokens left", "int"),
              Col("fits", "fits", "text"))),
    ]
