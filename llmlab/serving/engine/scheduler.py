"""Sequences and the iteration-level scheduler: which tokens of which sequences run in the next step.

One step has a token budget (`max_num_batched_tokens`) and a cap on running sequences
(`max_num_seqs`). Order, as in vLLM v1 and Sarathi-Serve: running decodes first (one token each),
then running sequences whose prompt is still being prefilled, then waiting sequences first come,
first served. A prompt longer than what is left of the budget is cut into chunks (chunked prefill).
When a running sequence needs a block and none is free, the newest running sequence is preempted:
its blocks are freed and it goes back to the front of the queue, to be recomputed later (prompt
and the tokens it had already produced); each preemption is counted.

References:
- Yu et al. 2022, "Orca: A Distributed Serving System for Transformer-Based Generative Models"
  (iteration-level scheduling).
- Agrawal et al. 2024, "Taming Throughput-Latency Tradeoff in LLM Inference with Sarathi-Serve"
  (chunked prefill, decodes first).
- nano-vllm `engine/scheduler.py` (preempt the newest running sequence, requeue at the front).
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from enum import Enum

import torch

from llmlab.inference.sampling import SamplingParams
from llmlab.serving.engine.block_manager import BlockManager

now_ns = time.perf_counter_ns


@dataclass(frozen=True)
class RequestParams:
    """What one request asks for: how to sample each token (greedy by default), how many, when to stop."""

    max_tokens: int = 16
    sampling: SamplingParams = SamplingParams()
    seed: int | None = None  # None: the engine's shared generator; an int: the request's own stream
    ignore_eos: bool = False  # True: always produce max_tokens (what benchmarks use, like vLLM's ignore_eos)
    logprobs: int | None = None  # None: none; k: each token's log-probability and the k most likely alternatives
    stop_token_ids: frozenset[int] = frozenset()  # vLLM's: finish ("stop") on any of these, ignore_eos or not
    # what logits_processors applies to the row before the token is chosen
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, added to its logit)
    min_tokens: int = 0  # vLLM's: EOS and the stop token ids are impossible before this many tokens
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0

    def __post_init__(self):
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {self.max_tokens}")
        if self.logprobs is not None and self.logprobs < 0:
            raise ValueError(f"logprobs must be at least 0, got {self.logprobs}")
        if not 0 <= self.min_tokens <= self.max_tokens:
            raise ValueError(f"min_tokens must be in [0, max_tokens = {self.max_tokens}], got {self.min_tokens}")
        if self.repetition_penalty <= 0:
            raise ValueError(f"repetition_penalty must be > 0, got {self.repetition_penalty}")

    @property
    def changes_logits(self) -> bool:
        return bool(self.logit_bias or self.min_tokens or self.repetition_penalty != 1.0 or self.frequency_penalty
                    or self.presence_penalty)


class Status(Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class Sequence:
    """One request inside the engine. Token ids = prompt + output; the first `num_computed` have KV in the cache."""

    seq_id: int
    prompt_ids: list[int]
    params: RequestParams
    generator: torch.Generator | None = None
    output_ids: list[int] = field(default_factory=list)
    status: Status = Status.WAITING
    block_table: list[int] = field(default_factory=list)
    num_computed: int = 0  # positions whose K/V are in the cache
    num_hashed: int = 0  # full blocks registered in the prefix cache
    num_cached_prompt: int = -1  # prompt tokens hit in the prefix cache at first admission (-1: not admitted yet)
    num_preemptions: int = 0
    finish_reason: str | None = None  # "stop" (EOS), "length", "abort"
    # time.perf_counter_ns stamps
    arrival_ns: int = 0
    tokenized_ns: int = 0
    scheduled_ns: int = 0  # first admitted: the queue ends
    first_chunk_ns: int = 0  # the first prefill chunk's forward starts
    token_ns: list[int] = field(default_factory=list)  # each output token sampled
    # params.logprobs set: per output token, (its log-probability, [(id, log-probability)] of the top k)
    logprobs: list[tuple[float, list[tuple[int, float]]]] = field(default_factory=list)
    finished_ns: int = 0
    # recorded runs: (first position, (n, V) logits) per step
    debug_logits: list[tuple[int, torch.Tensor]] | None = None

    @property
    def token_ids(self) -> list[int]:
        return self.prompt_ids + self.output_ids

    def __len__(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def first_token_ns(self) -> int:
        return self.token_ns[0] if self.token_ns else 0

    @property
    def in_prefill(self) -> bool:
        return self.num_computed < len(self) - 1 or not self.output_ids


@dataclass
class Scheduled:
    seq: Sequence
    n_tokens: int  # new positions computed this step

    @property
    def samples(self) -> bool:
        """The step reaches the sequence's last token, so its logits give the next token."""
        return self.seq.num_computed + self.n_tokens == len(self.seq)


class Scheduler:
    def __init__(self, blocks: BlockManager, max_num_seqs: int, max_num_batched_tokens: int):
        self.blocks = blocks
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # admission order: the last one is the newest
        self.num_preemptions = 0
        self.prefix_queries = 0  # prompt tokens looked up in the prefix cache
        self.prefix_hits = 0  # of which found

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.blocks.release(seq.block_table)
        seq.num_computed = seq.num_hashed = 0
        seq.status = Status.WAITING
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(seq)

    def finish(self, seq: Sequence, reason: str) -> None:
        if seq.status == Status.RUNNING:
            self.running.remove(seq)
        elif seq.status == Status.WAITING:
            self.waiting.remove(seq)
        self.blocks.release(seq.block_table)
        seq.status, seq.finish_reason, seq.finished_ns = Status.FINISHED, reason, now_ns()

    def schedule(self) -> list[Scheduled]:
        budget = self.max_num_batched_tokens
        out: list[Scheduled] = []
        # 1. running sequences: decodes first, then prompts still being prefilled (chunk by chunk)
        for seq in sorted(self.running, key=lambda s: s.in_prefill):
            if budget == 0:
                break
            if seq.status != Status.RUNNING:  # preempted below by an earlier sequence of this loop
                continue
            n = min(len(seq) - seq.num_computed, budget)
            while not self.blocks.can_grow(seq.block_table, seq.num_computed + n):
                victim = self.running[-1]
                self.preempt(victim)
                out = [s for s in out if s.seq is not victim]
                budget = self.max_num_batched_tokens - sum(s.n_tokens for s in out)
                if victim is seq:
                    break
            else:
                self.blocks.grow(seq.block_table, seq.num_computed + n)
                out.append(Scheduled(seq, n))
                budget -= n
        budget = self.max_num_batched_tokens - sum(s.n_tokens for s in out)
        # 2. waiting sequences, first come first served, while budget, slots and blocks last
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            hit = self.blocks.match_prefix(seq.block_table, seq.token_ids)
            n = min(len(seq) - hit, budget)
            if not self.blocks.can_grow(seq.block_table, hit + n):
                self.blocks.release(seq.block_table)  # give the hit blocks back; wait for blocks to free up
                break
            self.blocks.grow(seq.block_table, hit + n)
            self.waiting.popleft()
            seq.num_computed, seq.num_hashed = hit, hit // self.blocks.block_size
            if seq.num_cached_prompt < 0:
                seq.num_cached_prompt = hit
                seq.scheduled_ns = now_ns()
            if self.blocks.enable_prefix_cache:
                self.prefix_queries += len(seq)
                self.prefix_hits += hit
            seq.status = Status.RUNNING
            self.running.append(seq)
            out.append(Scheduled(seq, n))
            budget -= n
        return out
