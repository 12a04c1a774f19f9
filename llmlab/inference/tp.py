"""Tensor parallelism on torch.distributed: a Megatron-style sharded Llama decode, collectives timed, ranks launched.

- `ShardedLlama`: one rank's share of an HF Llama-family model, sliced from the model's own weights.
  Attention heads are column-split (q/k/v rows; GQA KV heads split with their query groups), o_proj
  row-split; gate/up column-split, down row-split: one all-reduce after attention, one after the
  MLP (Shoeybi et al., "Megatron-LM", 2019, section 3). Embeddings, final norm and LM head are
  replicated on every rank (simple, costs memory, no communication). HF's own rotary embedding and
  RMSNorm modules are reused; the KV cache is a list of (K, V) tensors per layer. On CUDA the device
  is synchronized around every all-reduce at every TP degree (TP = 1 too), so a speed-up compares
  like with like; `align = True` puts a barrier before each all-reduce and times it apart (`wait_s`):
  the wait for the slower rank, which a step's all-reduce time otherwise includes.
- `time_collective`: all-reduce / all-gather / reduce-scatter timed as nccl-tests does, with its
  algbw and busbw (NVIDIA/nccl-tests doc/PERFORMANCE.md: algbw = S / t; busbw = algbw x 2(n-1)/n
  for all-reduce, x (n-1)/n for all-gather and reduce-scatter, S the whole array's bytes).
- `launch`: starts `nproc` ranks with torch.multiprocessing's spawn context (MASTER_ADDR 127.0.0.1,
  a free port), gathers rank 0's result through a queue, and watches every rank against a deadline:
  a rank that dies or hangs is named in a MeasurementError (exit 3), and every rank is terminated
  and reaped before it returns (no orphans). Under an outside `torchrun` the ranks already exist:
  `in_torchrun()` tells, and the caller runs the worker in-process. `layout()` reads a rank's place
  (rank, local rank, ranks per node, nodes) and `scope_groups` makes the intra-node and inter-node
  subgroups a sweep across nodes times apart.
"""

from __future__ import annotations

import os
import queue as queue_mod
import socket
import time
import traceback
from collections.abc import Callable
from typing import TYPE_CHECKING

from llmlab.core.errors import MeasurementError

if TYPE_CHECKING:
    import torch

# torch (and inference.llama, which needs it) is imported inside the functions that use it: the
# formulas, the lab's planning and the launcher's parent import this module without torch.

OPS = ("all_reduce", "all_gather", "reduce_scatter")
LAST_PIDS: list[int] = []  # the pids of the ranks the last launch() started (tests check that none survives)
_STAGES: dict = {}  # in a spawned rank: {"q": the parent's queue, "rank": r}; empty elsewhere (torchrun, tests)


# ---------------------------------------------------------------- nccl-tests' bandwidths


def bus_factor(op: str, n: int) -> float:
    """nccl-tests' correction from algbw to busbw: all-reduce 2(n-1)/n, all-gather and reduce-scatter (n-1)/n."""
    if op == "all_reduce":
        return 2 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter"):
        return (n - 1) / n
    raise ValueError(f"unknown collective {op!r}")


def bandwidths(op: str, size_bytes: float, time_s: float, n: int) -> tuple[float, float]:
    """(algbw, busbw) in GB/s; size_bytes is S, the whole array (for all-gather: the gathered output)."""
    alg = size_bytes / time_s / 1e9
    return alg, alg * bus_factor(op, n)


def divisible_sizes(heads: int, kv_heads: int, limit: int = 64) -> list[int]:
    """TP degrees (>= 2) that divide both the query heads and the KV heads."""
    return [t for t in range(2, limit + 1) if heads % t == 0 and kv_heads % t == 0]


# ---------------------------------------------------------------- the sharded model


class ShardedLlama:
    """Rank `rank` of `world`'s share of an HF Llama-family causal LM (weights sliced, not copied into new modules)."""

    def __init__(self, model, rank: int, world: int, group=None):
        from llmlab.inference.llama import head_counts, layers_of

        c = model.config
        heads, kv, _ = head_counts(c)
        if heads % world or kv % world or c.intermediate_size % world:
            raise ValueError(f"TP {world} does not divide {heads} query heads, {kv} KV heads and {c.intermediate_size} "
                             f"MLP columns: TP sizes that divide: {divisible_sizes(heads, kv)}")
        self.rank, self.world, self.group = rank, world, group
        self.layers = layers_of(model, rank, world)  # q/k/v, gate/up column-split; o, down row-split
        self.embed, self.norm, self.lm_head = model.model.embed_tokens, model.model.norm, model.lm_head  # replicated
        self.rotary, self.eps = model.model.rotary_emb, c.rms_norm_eps
        self.comm_s = 0.0  # seconds spent inside all-reduce since the last reset
        # seconds spent in the barrier before each all-reduce (align=True): the wait for the slowest rank
        self.wait_s = 0.0
        self.comm_calls = 0
        self.align = False  # True: a barrier before each all-reduce, so comm_s is the all-reduce alone
        self.sync = model.device.type == "cuda"

    def _all_reduce(self, x: torch.Tensor) -> None:
        """The all-reduce of a partial sum, timed. The device is synchronized around it at every TP degree,
        TP = 1 included (where there is nothing to reduce): both sides of the speed-up pay the same syncs."""
        import torch
        import torch.distributed as dist

        if self.sync:
            torch.cuda.synchronize()
        if self.world == 1:
            if self.sync:
                torch.cuda.synchronize()
            return
        t0 = time.perf_counter()
        if self.align:
            dist.barrier(group=self.group)
            t1 = time.perf_counter()
            self.wait_s += t1 - t0
            t0 = t1
        dist.all_reduce(x, group=self.group)
        if self.sync:
            torch.cuda.synchronize()
        self.comm_s += time.perf_counter() - t0
        self.comm_calls += 1

    def new_cache(self) -> list:
        return [None] * len(self.layers)

    def forward(self, ids: torch.Tensor, cache: list) -> torch.Tensor:
        """Logits of every position of `ids` (B, T), appending to `cache`; a prefill starts from an empty cache."""
        import torch

        from llmlab.inference.llama import layer_forward, rope

        B, T = ids.shape
        past = 0 if cache[0] is None else cache[0][0].shape[2]
        if T > 1 and past:
            raise ValueError("a multi-token step needs an empty cache (prefill), then one token per step")
        x = self.embed(ids).view(B * T, -1)  # (B*T, H): rows, batch-major
        pos = torch.arange(past, past + T, device=ids.device).repeat(B)  # (B*T,)
        cos, sin = rope(self.rotary, x, pos)
        for i, layer in enumerate(self.layers):
            x = layer_forward(x, layer, cos, sin, self.eps, lambda q, k, v, i=i: self._attend(i, q, k, v, cache, B),
                              self._all_reduce)
        return self.lm_head(self.norm(x.view(B, T, -1)))  # (B, T, V)

    @staticmethod
    def _attend(i: int, q, k, v, cache: list, B: int) -> torch.Tensor:
        """Layer i's attention over its cache: q (B*T, hq, D), k/v (B*T, hkv, D) -> (B*T, hq, D)."""
        import torch
        import torch.nn.functional as F

        from llmlab.inference.llama import expand_kv

        T, hq, hkv, hd = q.shape[0] // B, q.shape[1], k.shape[1], q.shape[2]
        q = q.view(B, T, hq, hd).transpose(1, 2)  # (B, hq, T, D)
        k, v = k.view(B, T, hkv, hd).transpose(1, 2), v.view(B, T, hkv, hd).transpose(1, 2)  # (B, hkv, T, D)
        if cache[i] is not None:
            k, v = torch.cat([cache[i][0], k], 2), torch.cat([cache[i][1], v], 2)  # (B, hkv, past+T, D)
        cache[i] = (k, v)
        att = F.scaled_dot_product_attention(q, expand_kv(k, hq // hkv), expand_kv(v, hq // hkv), is_causal=T > 1)
        return att.transpose(1, 2).reshape(B * T, hq, hd)


# ---------------------------------------------------------------- collectives


def time_collective(op: str, size_bytes: int, device, warmup: int, iters: int, dtype=None, group=None) -> float:
    """Mean seconds of one `op` on an array of size_bytes (S, nccl-tests' size), the slowest rank's mean.

    nccl-tests times `iters` back-to-back operations after `warmup` and reports their mean; here each
    rank times its own loop and the max over ranks is kept (the operation ends when the last rank does).
    """
    import torch
    import torch.distributed as dist

    dtype = dtype or torch.float32
    n, elem = dist.get_world_size(group), torch.empty((), dtype=dtype).element_size()
    count = max(n, size_bytes // elem // n * n)  # whole elements, divisible by n
    buf = torch.ones(count, dtype=dtype, device=device)  # (count,)
    part = torch.empty(count // n, dtype=dtype, device=device)  # (count / n,)
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor  # the new name where torch has it
    scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    if op == "all_reduce":
        fn = lambda: dist.all_reduce(buf, group=group)  # noqa: E731
    elif op == "all_gather":
        fn = lambda: gather(buf, part, group=group)  # noqa: E731  (S = the gathered output)
    else:
        fn = lambda: scatter(part, buf, group=group)  # noqa: E731  (S = the whole input)
    sync = torch.cuda.synchronize if buf.is_cuda else (lambda: None)
    for _ in range(warmup):
        fn()
    sync()
    dist.barrier(group=group)
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    sync()
    t = torch.tensor([(time.perf_counter() - t0) / iters], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return float(t.item())


# ---------------------------------------------------------------- ranks over nodes


def layout() -> dict:
    """This process's place: rank, world, local rank and local world (torchrun's env; a spawned rank sets the
    same), nodes."""
    world = int(os.environ.get("WORLD_SIZE", 1))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    return dict(rank=int(os.environ.get("RANK", 0)), world=world, local_rank=int(os.environ.get("LOCAL_RANK", 0)),
                local_world=local_world, nodes=max(1, world // max(1, local_world)))


def scope_groups(world: int, local_world: int) -> dict:
    """{scope: this rank's process group} for the collective sweep: "world" (None: every rank); across nodes
    also "intra-node" (the ranks of one node: NVLink/PCIe) and "inter-node" (one rank per node, same local
    rank: the network).

    Every rank creates every subgroup (torch.distributed's rule), in the same order."""
    import torch.distributed as dist

    groups = {"world": None}
    if world == local_world:
        return groups
    nodes = world // local_world
    if local_world > 1:
        groups["intra-node"] = dist.new_subgroups_by_enumeration(
            [list(range(n * local_world, (n + 1) * local_world)) for n in range(nodes)])[0]
    groups["inter-node"] = dist.new_subgroups_by_enumeration(
        [list(range(lr, world, local_world)) for lr in range(local_world)])[0]
    return groups


# ---------------------------------------------------------------- launching ranks


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def in_torchrun() -> bool:
    """True when an outside launcher (torchrun) already started this process as one rank."""
    return all(k in os.environ for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"))


def stage(name: str) -> None:
    """A rank says which part it starts; at a timeout the parent names the rank that fell behind."""
    if _STAGES:
        _STAGES["q"].put(("stage", _STAGES["rank"], name))


def _rank_main(rank: int, world: int, port: int, worker: Callable, args: tuple, q) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world))
    _STAGES.update(q=q, rank=rank)
    try:
        out = worker(rank, world, *args)
        if rank == 0:
            q.put(("result", rank, out))
        q.put(("done", rank, None))
    except BaseException as exc:  # noqa: BLE001  (reported to the parent, then this rank exits non-zero)
        q.put(("error", rank, f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
                              f" [{traceback.extract_tb(exc.__traceback__)[-1].name if exc.__traceback__ else ''}]"))
        raise SystemExit(1) from None


def _reap(procs) -> None:
    for p in procs:
        if p.is_alive():
            p.terminate()
    deadline = time.monotonic() + 3
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
        if p.is_alive():
            p.kill()
            p.join(2)


def launch(worker: Callable, nproc: int, args: tuple = (), timeout_s: float = 120.0):
    """Run worker(rank, world, *args) on `nproc` spawned ranks; rank 0's return value comes back.

    Raises MeasurementError naming the rank that died (killed, crashed, or raised) or the ranks still
    running at the deadline; every rank is terminated and joined first, so none is left behind.
    """
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_rank_main, args=(r, nproc, port, worker, args, q), daemon=True) for r in range(nproc)]
    for p in procs:
        p.start()
    LAST_PIDS[:] = [p.pid for p in procs]
    result, done, errors, failure, stages = None, set(), {}, None, {r: ["start"] for r in range(nproc)}
    deadline = time.monotonic() + timeout_s
    try:
        while len(done) < nproc:
            try:
                kind, rank, payload = q.get(timeout=0.1)
                if kind == "result":
                    result = payload
                elif kind == "stage":
                    stages[rank].append(payload)
                elif kind == "done":
                    done.add(rank)
                else:
                    errors[rank] = payload
            except queue_mod.Empty:
                pass
            dead = [r for r, p in enumerate(procs) if p.exitcode not in (None, 0)]
            if dead or errors:
                time.sleep(0.5)  # let the peers of a dead rank fail too, then blame the first cause
                while True:
                    try:
                        kind, rank, payload = q.get_nowait()
                        if kind == "error":
                            errors[rank] = payload
                    except queue_mod.Empty:
                        break
                dead = [r for r, p in enumerate(procs) if p.exitcode not in (None, 0)]
                silent = [r for r in dead if r not in errors]  # killed or crashed without a Python error: the cause
                if silent:
                    r = silent[0]
                    code = procs[r].exitcode
                    how = f"killed by signal {-code}" if code < 0 else f"exited with code {code}"
                    failure = f"rank {r} died ({how}); the other ranks were stopped"
                else:
                    r = min(errors)
                    failure = f"rank {r} failed: {errors[r]}"
                break
            if time.monotonic() > deadline:
                hung = [r for r in range(nproc) if r not in done]
                depth = {r: len(stages[r]) for r in hung}
                behind = [r for r in hung if depth[r] == min(depth.values())]
                if len(behind) < len(hung):  # one rank fell behind: the others wait for it in a collective
                    failure = "; ".join(f"rank {r} hung in '{stages[r][-1]}'" for r in behind) + (
                        f" (the other ranks wait for it in a collective) after --timeout-s {timeout_s:g} s; all ranks "
                        f"were stopped"
                    )
                else:
                    failure = (f"rank(s) {', '.join(map(str, hung))} still running after --timeout-s {timeout_s:g} s "
                               f"(last in '{stages[hung[0]][-1]}'); all ranks were stopped")
                break
    finally:
        _reap(procs)
        q.close()
        q.join_thread()
    if failure:
        raise MeasurementError(failure)
    return result
