"""The two ranks of the disaggregated-prefill experiment (`serving.disagg`): rank 0 prefills, rank 1 decodes.

The hand-off is a pull, as KV-transfer libraries do it (the decode worker reads when it is ready): rank 0
announces a request on a side channel, a TCPStore key per hand-off (its index, the first token, the blocks
it ships, the first token's stamp), which rank 1 checks between two of its engine steps without blocking; rank 1 then
sends a one-element "ready" over the process group, and only then does rank 0 send the K/V. So the receiver
times a transfer of which nothing was in flight before: one small message's latency plus bytes / rate, the
model the link probe measures with the same pull. (A posted gloo irecv cannot be polled: its
`is_completed()` stays False until `wait()` is called, hence the store.) The K/V of every full prompt block
travels as one (2, layers, blocks, block_size, kv_heads, head_dim) tensor; rank 1 writes it into fresh blocks
of its pool registered as prefix-cached (`BlockManager.import_prefix`) and submits prompt + first token, so its
engine computes only the prompt's last partial block and the first token, beside the replies it runs.

Rank 1 also runs the colocated baseline first, on the same device, threads and engine configuration, so both
modes are measured in one process. Both ranks read one monotonic clock (`time.perf_counter_ns`): they must run
on one host.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from llmlab.core.errors import UsageError
from llmlab.core.flops import kv_bytes_per_token
from llmlab.core.models import load
from llmlab.inference.tp import stage
from llmlab.serving.disagg import Workload
from llmlab.serving.engine.llm_engine import Engine, EngineConfig
from llmlab.serving.engine.scheduler import RequestParams, Sequence

now_ns = time.perf_counter_ns
START_MARGIN_NS = 50_000_000  # t0 this far after the ranks agree on it: both are asleep, waiting for it, by then


def placement(device: str) -> dict:
    """Where the two ranks run and how they talk: nccl on two GPUs, else gloo (host memory)."""
    if device == "cpu":
        return dict(backend="gloo", devices=["cpu", "cpu"], note="both ranks on the CPU, gloo over loopback TCP")
    n = torch.cuda.device_count()
    if n >= 2:
        return dict(backend="nccl", devices=["cuda:0", "cuda:1"], note="one GPU per rank, nccl")
    if n == 1:
        return dict(backend="gloo", devices=["cuda:0", "cuda:0"],
                    note="one GPU: both ranks share it, and the K/V goes through host memory over gloo")
    raise UsageError("--device cuda needs a CUDA GPU")


@dataclass
class Link:
    """Where sent tensors live (the GPU with nccl, host memory with gloo), and the store hand-offs are
    announced on."""

    comm: torch.device
    store: dist.TCPStore

    def sync(self) -> None:
        if self.comm.type == "cuda":
            torch.cuda.synchronize(self.comm)

    def tensor(self, values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.int64, device=self.comm)


def push(payload: torch.Tensor, link: Link) -> None:
    """Rank 0: wait for rank 1's "ready", then send."""
    dist.recv(link.tensor([0]), src=1)
    dist.send(payload, dst=1)


def pull(buf: torch.Tensor, link: Link) -> float:
    """Rank 1: say "ready", receive into `buf`; seconds from the "ready" to the last byte in."""
    link.sync()
    t = time.perf_counter()
    dist.send(link.tensor([1]), dst=0)
    dist.recv(buf, src=0)
    link.sync()
    return time.perf_counter() - t


def probe(rank: int, w: Workload, link: Link) -> dict | None:
    """The pull of 1 byte (its latency) and of `probe_bytes` (the rate), each the median of `probe_iters`
    after one warm-up; rate = bytes / the large pull's time, its latency left in (a share of it that the
    large buffer makes small). The row on rank 1, None on rank 0."""
    times = {}
    for name, n in (("small", 1), ("big", w.probe_bytes)):
        buf = torch.zeros(n, dtype=torch.uint8, device=link.comm)
        ts = [push(buf, link) if rank == 0 else pull(buf, link) for _ in range(w.probe_iters + 1)]
        times[name] = statistics.median(ts[1:]) if rank == 1 else None
    if rank == 0:
        return None
    lat, big = times["small"], times["big"]
    return dict(probe_bytes=w.probe_bytes, iters=w.probe_iters, latency_us=lat * 1e6, big_ms=big * 1e3,
                rate_GBps=w.probe_bytes / big / 1e9)


# ---------------------------------------------------------------- engines and their stamps


def params(n: int) -> RequestParams:
    return RequestParams(max_tokens=n, ignore_eos=True)


def sleep_until(t_ns: int) -> None:
    time.sleep(max(0.0, (t_ns - now_ns()) / 1e9))


def warm_engine(model, w: Workload, budget: int, vocab: int) -> Engine:
    """An engine of the workload's pool and `budget` tokens per step, warmed on other prompts than the timed
    ones (a long prompt, it again plus a token: a prefix hit, and short replies), its statistics reset."""
    eng = Engine(model, EngineConfig(block_size=w.block_size, num_blocks=w.num_blocks(),
                                     max_num_batched_tokens=budget))
    running, long = w.prompts(vocab, salt=1)
    eng.generate([long[0]], params(2))
    eng.generate([long[0] + [5]], params(2))
    eng.generate(running, params(4))
    eng.reset_stats()
    return eng


def stamps(seq: Sequence) -> dict:
    return dict(arrival_ns=seq.arrival_ns, token_ns=list(seq.token_ns), tokens=list(seq.output_ids),
                prompt_tokens=len(seq.prompt_ids), cached_tokens=seq.num_cached_prompt)


def start_running(eng: Engine, w: Workload, running: list[list[int]], t0: int) -> list[Sequence]:
    sleep_until(t0)
    return [eng.add_request(p, params(w.running_tokens), arrival_ns=t0) for p in running]


def agree_start(link: Link) -> int:
    """Rank 0's clock + a margin, broadcast: the shared t0 of the disaggregated run."""
    t0 = link.tensor([now_ns() + START_MARGIN_NS])
    dist.broadcast(t0, src=0)
    return int(t0.item())


# ---------------------------------------------------------------- the colocated baseline (rank 1 alone)


def stop_running(eng: Engine, running: list[Sequence]) -> None:
    """The running replies are the load the long requests meet: stopped once every long reply is done."""
    for seq in running:
        eng.abort(seq)


def colocated(model, w: Workload, vocab: int) -> dict:
    """One engine with chunked prefill (`chunk_budget` tokens per step): the running replies from t0, each long
    prompt admitted at its arrival, until every long reply is done."""
    eng = warm_engine(model, w, w.chunk_budget, vocab)
    running_p, long_p = w.prompts(vocab)
    t0 = now_ns() + START_MARGIN_NS
    arrive = [t0 + int(ms * 1e6) for ms in w.long_at_ms]
    running = start_running(eng, w, running_p, t0)
    longs, i = [], 0
    while i < len(arrive) or any(s.finish_reason is None for s in longs):
        while i < len(arrive) and arrive[i] <= now_ns():
            longs.append(eng.add_request(long_p[i], params(w.long_tokens), arrival_ns=arrive[i]))
            i += 1
        if eng.has_work():
            eng.step()
        else:
            sleep_until(arrive[i])
    stop_running(eng, running)
    return dict(t0_ns=t0, running=[stamps(s) for s in running], long=[stamps(s) for s in longs])


# ---------------------------------------------------------------- disaggregated: rank 0 prefills


def ship(eng: Engine, n: int, j: int, seq: Sequence, link: Link) -> dict:
    """Announce request j as hand-off n, then send (on rank 1's "ready") the K/V of its full prompt blocks."""
    r, bs = eng.runner, eng.cfg.block_size
    layers, _, kv_heads, head_dim = r.k_cache.shape
    nb = len(seq.prompt_ids) // bs
    idx = torch.tensor(seq.block_table[:nb], device=r.device)
    kv = torch.stack([c.view(layers, -1, bs, kv_heads, head_dim)[:, idx] for c in (r.k_cache, r.v_cache)])
    kv = kv.to(link.comm)  # (2, layers, nb, bs, kv_heads, head_dim)
    link.sync()
    header = [j, seq.output_ids[0], nb, seq.token_ns[0]]
    link.store.set(f"handoff/{n}", ",".join(map(str, header)))
    push(kv, link)
    return dict(request=j, arrival_ns=seq.arrival_ns, prefill_start_ns=seq.first_chunk_ns,
                first_ns=seq.token_ns[0], first_token=seq.output_ids[0], sent_ns=now_ns())


def prefill_side(model, w: Workload, vocab: int, link: Link) -> list[dict]:
    """Each long prompt prefilled whole (in one step) at its arrival; its first token and K/V shipped at once,
    then the request is dropped here (its blocks stay in this pool's prefix cache)."""
    _, long_p = w.prompts(vocab)
    eng = warm_engine(model, w, sum(map(len, long_p)) + 1, vocab)  # every prompt arrived so far, whole
    t0 = agree_start(link)
    arrive = [t0 + int(ms * 1e6) for ms in w.long_at_ms]
    live, sent, i = {}, [], 0
    while i < len(arrive) or live:
        while i < len(arrive) and arrive[i] <= now_ns():
            live[i] = eng.add_request(long_p[i], params(2), arrival_ns=arrive[i])
            i += 1
        if not eng.has_work():
            sleep_until(arrive[i])
            continue
        eng.step()
        for j in [j for j, s in live.items() if s.output_ids]:
            sent.append(ship(eng, len(sent), j, live[j], link))
            eng.abort(live.pop(j))
    return sent


# ---------------------------------------------------------------- disaggregated: rank 1 decodes


def staging_buffer(eng: Engine, w: Workload, link: Link) -> torch.Tensor:
    """Flat, written once before the run: what a hand-off lands in, so no transfer pays the first touch of its
    pages (transfer engines register their memory once, too)."""
    layers, _, kv_heads, head_dim = eng.runner.k_cache.shape
    blocks = w.long_prompt // w.block_size
    return torch.zeros(2 * layers * blocks * w.block_size * kv_heads * head_dim, dtype=eng.runner.dtype,
                       device=link.comm)


def receive(eng: Engine, w: Workload, header: list[int], long_p: list[list[int]], arrive: list[int],
            link: Link, staging: torch.Tensor) -> tuple[dict, Sequence, list[int]]:
    """Pull one request's K/V (through `staging`) into fresh prefix-cached blocks; submit prompt + first token
    for the rest of its reply. Returns (the hand-off's row, the sequence, the blocks held until it is
    admitted)."""
    j, tok, nb, first_ns = header
    seen = now_ns()
    r, bs = eng.runner, eng.cfg.block_size
    layers, _, kv_heads, head_dim = r.k_cache.shape
    shape = (2, layers, nb, bs, kv_heads, head_dim)
    buf = staging[: math.prod(shape)].view(shape)
    secs = pull(buf, link)
    received = now_ns()
    held = eng.blocks.import_prefix(long_p[j][: nb * bs])
    assert len(held) == nb, f"request {j}: {nb} blocks shipped, {len(held)} imported"
    idx, kv = torch.tensor(held, device=r.device), buf.to(r.device)
    for c, part in zip((r.k_cache, r.v_cache), kv, strict=True):
        c.view(layers, -1, bs, kv_heads, head_dim)[:, idx] = part
    seq = eng.add_request(long_p[j] + [tok], params(w.long_tokens - 1), arrival_ns=arrive[j])
    row = dict(request=j, blocks=nb, shipped_tokens=nb * bs, kv_bytes=buf.numel() * buf.element_size(),
               transfer_s=secs, first_ns=first_ns, seen_ns=seen, received_ns=received, first_token=tok)
    return row, seq, held


def decode_side(model, w: Workload, vocab: int, link: Link) -> dict:
    """The running replies from t0; between two steps, a request announced in the store is pulled in (when
    nothing runs, the store is waited on); until every long reply is done."""
    running_p, long_p = w.prompts(vocab)
    eng = warm_engine(model, w, w.chunk_budget, vocab)
    t0 = agree_start(link)
    arrive = [t0 + int(ms * 1e6) for ms in w.long_at_ms]
    staging = staging_buffer(eng, w, link)
    running = start_running(eng, w, running_p, t0)
    handoffs, longs, holds = [], {}, []
    while len(handoffs) < len(arrive) or any(s.finish_reason is None for s in longs.values()):
        key = f"handoff/{len(handoffs)}"
        if len(handoffs) < len(arrive) and (not eng.has_work() or link.store.check([key])):
            header = [int(x) for x in link.store.get(key).decode().split(",")]  # get() waits for the key
            row, seq, held = receive(eng, w, header, long_p, arrive, link, staging)
            handoffs.append(row)
            longs[row["request"]] = seq
            holds.append((seq, held))
        if eng.has_work():
            eng.step()
            for seq, held in [h for h in holds if h[0].num_cached_prompt >= 0]:  # admitted: its hit holds them
                eng.blocks.release(held)
                holds.remove((seq, held))
    stop_running(eng, running)
    return dict(t0_ns=t0, running=[stamps(s) for s in running], handoffs=handoffs,
                long=[stamps(longs[j]) for j in sorted(longs)])


# ---------------------------------------------------------------- one rank


def worker(rank: int, world: int, w: Workload, plan: dict) -> dict | None:
    """One rank: the link probe, the colocated baseline (rank 1), the disaggregated run; every row on rank 0."""
    dev = torch.device(plan["devices"][rank])
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    else:
        torch.set_num_threads(w.threads)
    dist.init_process_group(plan["backend"], rank=rank, world_size=world, timeout=timedelta(seconds=w.timeout_s))
    try:
        with torch.inference_mode():
            model = load(w.model, str(dev), dtype=w.dtype).model
            vocab = model.config.vocab_size
            store = dist.TCPStore("127.0.0.1", plan["store_port"], world, rank == 0,
                                  timeout=timedelta(seconds=w.timeout_s))
            link = Link(dev if plan["backend"] == "nccl" else torch.device("cpu"), store)
            stage("link probe")
            mine = dict(link=probe(rank, w, link))
            stage("colocated baseline")
            if rank == 1:
                mine["colocated"] = colocated(model, w, vocab)
            dist.barrier()  # rank 0 waits, idle, while the baseline runs
            stage("disaggregated")
            mine["disagg"] = (prefill_side if rank == 0 else decode_side)(model, w, vocab, link)
            elem = next(model.parameters()).element_size()
            mine |= dict(elem=elem, kv_bytes_per_token=kv_bytes_per_token(model.config, elem))
        got = [mine if rank == 1 else None]
        dist.broadcast_object_list(got, src=1)
        if rank != 0:
            return None
        return dict(plan=plan, link=got[0]["link"], colocated=got[0]["colocated"], decode=got[0]["disagg"],
                    prefill=mine["disagg"], elem=elem, kv_bytes_per_token=mine["kv_bytes_per_token"])
    finally:
        dist.destroy_process_group()
