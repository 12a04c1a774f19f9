"""Disaggregated prefill, run: one process prefills, ships the request's KV blocks, another decodes.

Two ranks on torch.distributed (gloo on the CPU, nccl when each rank has its own GPU), each with its own
llmlab `Engine`. A few replies are already running on rank 1 when long prompts arrive at fixed offsets.
Rank 0 prefills each long prompt whole, in one step, and ships its first token and the K/V of its full
prompt blocks to rank 1, which puts them into its pool as prefix-cached blocks and decodes the rest of the
reply beside the running ones (`disagg_ranks` has the protocol). The baseline is the same engine colocated,
with chunked prefill (`chunk_budget` tokens per step), under the same arrivals, in rank 1's process.

Measured: each long request's TTFT (the first token at the engine that decodes it: for disaggregation, when
its K/V has arrived on rank 1), the p50 and worst ITL of the running replies while the prefills happen (the
gaps that end between the first long arrival and the last long request's second token), the KV bytes moved
per request and their transfer time, and the link itself: the pull's latency (1 byte) and rate (a large
buffer), so a transfer is predicted as latency + bytes / rate. The formula's bytes are
2 x layers x kv_heads x head_dim x tokens x bytes per element, counted over the tokens shipped: whole blocks,
the prompt rounded down to a multiple of the block size (the partial last block is recomputed on rank 1, as
a prefix-cache hit never covers it). A long prompt that is a multiple of the block size ships every token.
Exactness: the disaggregated reply's greedy tokens are compared with the colocated reply's.

References:
- Zhong et al. 2024, "DistServe: Disaggregating Prefill and Decoding for Goodput-optimized Large Language
  Model Serving"; Patel et al. 2024, "Splitwise: Efficient Generative LLM Inference Using Phase Splitting".
- Qin et al. 2024, "Mooncake: A KVCache-centric Disaggregated Architecture for LLM Serving" (the decode
  side pulls the KV cache when it is ready).
"""

from __future__ import annotations

import math
import random
import statistics
from dataclasses import dataclass
from itertools import pairwise

from llmlab.inference.tp import free_port, launch

MODES = ("colocated, chunked prefill", "disaggregated")


@dataclass(frozen=True)
class Workload:
    """The experiment's model, arrivals, engines and link probe (both modes run the same one)."""

    model: str = "tiny"  # a model reference `core.models.load` takes; each rank loads its own copy
    dtype: str = "float32"  # weights and KV cache
    device: str = "cpu"  # "cpu" or "cuda" (two GPUs: nccl; one: both ranks share it, gloo through the host)
    running: int = 4  # replies already decoding when the long prompts arrive
    running_prompt: int = 32  # their prompt tokens
    running_tokens: int = 1024  # their reply cap: they decode until every long reply is done, then stop
    long_prompt: int = 512  # tokens of each long prompt: a multiple of block_size ships every token's K/V
    long_tokens: int = 8  # reply tokens of each long request (>= 2: the first comes from the prefill)
    long_at_ms: tuple[float, ...] = (30.0, 90.0)  # each long prompt's arrival, ms after the running replies start
    chunk_budget: int = 64  # tokens per engine step on the decoding engines: the colocated prefill's chunk
    block_size: int = 16  # tokens per KV block (the engine's default)
    probe_bytes: int = 32 << 20  # the link probe's large buffer: the rate
    probe_iters: int = 5  # pulls per probe size (median), after one warm-up
    threads: int = 1  # torch threads per rank on the CPU
    seed: int = 0  # the prompts' random tokens
    timeout_s: float = 300.0  # both ranks are stopped past this

    def __post_init__(self):
        if self.device not in ("cpu", "cuda"):
            raise ValueError(f"device must be cpu or cuda, got {self.device!r}")
        for name in ("running", "running_prompt", "running_tokens", "chunk_budget", "block_size", "probe_bytes",
                     "probe_iters", "threads"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.long_prompt < self.block_size:
            raise ValueError(f"long_prompt must be at least one block ({self.block_size} tokens)")
        if self.long_tokens < 2:
            raise ValueError("long_tokens must be at least 2: the first token comes from the prefill")
        if not self.long_at_ms or any(not 0 <= t < math.inf for t in self.long_at_ms):
            raise ValueError("long_at_ms needs at least one arrival offset >= 0 ms")

    def prompts(self, vocab: int, salt: int = 0) -> tuple[list[list[int]], list[list[int]]]:
        """(running prompts, long prompts) of random ids in [4, vocab): the same on both ranks for one salt."""
        rng = random.Random(self.seed * 1_000_003 + salt)
        draw = lambda n: [rng.randrange(4, vocab) for _ in range(n)]  # noqa: E731
        return [draw(self.running_prompt) for _ in range(self.running)], [draw(self.long_prompt)
                                                                           for _ in self.long_at_ms]

    def num_blocks(self) -> int:
        """A pool that holds every request of the run at once, twice over (the warm-up's blocks stay cached)."""
        per = lambda tokens: -(-tokens // self.block_size)  # noqa: E731
        need = self.running * per(self.running_prompt + self.running_tokens)
        need += len(self.long_at_ms) * per(self.long_prompt + self.long_tokens + 1)
        return 2 * need + per(self.long_prompt + 2) + 8


def measure(w: Workload) -> dict[str, list[dict]]:
    """Run both modes on two spawned ranks; the tables of `tables`."""
    from llmlab.serving import disagg_ranks  # imports torch: this module and its Workload stay light without it

    plan = disagg_ranks.placement(w.device) | dict(store_port=free_port())  # the hand-offs' side channel
    return tables(w, launch(disagg_ranks.worker, 2, (w, plan), timeout_s=w.timeout_s))


# ---------------------------------------------------------------- the tables


def _ms(a_ns: int, b_ns: int) -> float:
    return (b_ns - a_ns) / 1e6


def _gaps(running: list[dict], lo: int, hi: int) -> list[float]:
    """ms between consecutive tokens of the running replies, for the gaps that end in [lo, hi]."""
    return [_ms(a, b) for r in running for a, b in pairwise(r["token_ns"]) if lo <= b <= hi]


def _p50(xs: list[float]) -> float:
    return statistics.median(xs) if xs else math.nan


def mode_row(mode: str, t0: int, running: list[dict], arrivals: list[int], ttft: list[float],
             second_ns: list[int], answered: bool) -> dict:
    """One mode's running-reply ITL before and during the prefills (the first long arrival to the last long
    request's second token), its long requests' TTFT; answered: every long reply got all its tokens;
    running_through: every running reply still decoded at the window's end (the load lasted)."""
    lo, hi = min(arrivals), max(second_ns)
    during, before = _gaps(running, lo, hi), _gaps(running, t0, lo - 1)
    return dict(mode=mode, running=len(running), long_requests=len(arrivals), window_ms=_ms(lo, hi),
                gaps=len(during), itl_p50_before_ms=_p50(before), itl_p50_ms=_p50(during),
                itl_max_ms=max(during, default=math.nan), ttft_p50_ms=statistics.median(ttft), ttft_max_ms=max(ttft),
                answered=answered, running_through=all(r["token_ns"] and r["token_ns"][-1] >= hi for r in running))


def handoff_rows(w: Workload, raw: dict, link: dict, equal: list[bool]) -> list[dict]:
    """Per long request: what was shipped (blocks, bytes, the formula's bytes), its transfer against
    latency + bytes / rate, what rank 1 hit in its prefix cache and computed, and the exactness."""
    rows = []
    for h, r, eq in zip(raw["decode"]["handoffs"], raw["decode"]["long"], equal, strict=True):
        predicted = link["latency_us"] / 1e3 + h["kv_bytes"] / (link["rate_GBps"] * 1e6)
        rows.append(dict(request=h["request"], prompt_tokens=w.long_prompt, blocks=h["blocks"],
                         shipped_tokens=h["shipped_tokens"], kv_bytes=h["kv_bytes"],
                         formula_bytes=raw["kv_bytes_per_token"] * h["shipped_tokens"],
                         prompt_formula_bytes=raw["kv_bytes_per_token"] * w.long_prompt,
                         transfer_ms=h["transfer_s"] * 1e3, predicted_ms=predicted,
                         transfer_over_predicted=h["transfer_s"] * 1e3 / predicted, hit_tokens=r["cached_tokens"],
                         recomputed_tokens=r["prompt_tokens"] - r["cached_tokens"], tokens_equal=eq))
    return rows


def request_rows(raw: dict, dis_tokens: list[list[int]]) -> list[dict]:
    """Per mode and long request: arrival, TTFT and second token (ms after arrival); for disaggregation also
    rank 0's prefill and first token, the wait until rank 1 took the hand-off, and the transfer."""
    co, dec, pre = raw["colocated"], raw["decode"], {r["request"]: r for r in raw["prefill"]}
    rows = [dict(mode=MODES[0], request=j, arrival_ms=_ms(co["t0_ns"], r["arrival_ns"]),
                 ttft_ms=_ms(r["arrival_ns"], r["token_ns"][0]), second_token_ms=_ms(r["arrival_ns"], r["token_ns"][1]),
                 reply_tokens=len(r["tokens"])) for j, r in enumerate(co["long"])]
    for h, r, toks in zip(dec["handoffs"], dec["long"], dis_tokens, strict=True):
        p = pre[h["request"]]
        rows.append(dict(mode=MODES[1], request=h["request"], arrival_ms=_ms(dec["t0_ns"], r["arrival_ns"]),
                         ttft_ms=_ms(r["arrival_ns"], h["received_ns"]),
                         second_token_ms=_ms(r["arrival_ns"], r["token_ns"][0]), reply_tokens=len(toks),
                         prefill_ms=_ms(p["prefill_start_ns"], p["first_ns"]),
                         prefill_ttft_ms=_ms(r["arrival_ns"], p["first_ns"]),
                         wait_ms=_ms(h["first_ns"], h["seen_ns"]), transfer_ms=h["transfer_s"] * 1e3))
    return rows


def tables(w: Workload, raw: dict) -> dict[str, list[dict]]:
    """Rank 0's raw stamps -> link, handoff, requests and modes rows (long requests in arrival order)."""
    raw = dict(raw, decode=dict(raw["decode"]))
    order = sorted(range(len(raw["decode"]["handoffs"])), key=lambda i: raw["decode"]["handoffs"][i]["request"])
    raw["decode"]["handoffs"] = [raw["decode"]["handoffs"][i] for i in order]
    co, dec = raw["colocated"], raw["decode"]
    plan = raw["plan"]
    link = raw["link"] | dict(backend=plan["backend"], devices=" + ".join(plan["devices"]), note=plan["note"])
    co_tokens = [r["tokens"] for r in co["long"]]
    dis_tokens = [[h["first_token"]] + r["tokens"] for h, r in zip(dec["handoffs"], dec["long"], strict=True)]
    equal = [a == b for a, b in zip(dis_tokens, co_tokens, strict=True)]
    requests = request_rows(raw, dis_tokens)
    n, done = len(co_tokens), lambda replies: all(len(t) == w.long_tokens for t in replies)  # noqa: E731
    modes = [
        mode_row(MODES[0], co["t0_ns"], co["running"], [r["arrival_ns"] for r in co["long"]],
                 [q["ttft_ms"] for q in requests[:n]], [r["token_ns"][1] for r in co["long"]], done(co_tokens))
        | dict(chunk_budget=w.chunk_budget, tokens_equal=None),
        mode_row(MODES[1], dec["t0_ns"], dec["running"], [r["arrival_ns"] for r in dec["long"]],
                 [q["ttft_ms"] for q in requests[n:]], [r["token_ns"][0] for r in dec["long"]], done(dis_tokens))
        | dict(chunk_budget=None, tokens_equal=all(equal)),
    ]
    return dict(link=[link], handoff=handoff_rows(w, raw, link, equal), requests=requests, modes=modes)
