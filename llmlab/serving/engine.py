"""A small paged, continuously batching inference engine (nano-vllm sized).

Reading order: `EngineConfig` -> `Engine.add_request` -> `Engine.step` (schedule -> build the
ragged batch -> forward -> sample -> stamp and finish) -> `Engine.generate` (run to completion)
-> `check_exact` (logits vs HF, greedy vs `inference.decode.generate`), which runs before any timing.

One step = one forward over every scheduled token (iteration-level continuous batching, Orca):
sequences join and leave between steps, so a finished request's slot is refilled at once instead
of waiting for the slowest member of a static batch.

Timestamps (time.perf_counter_ns) per request: arrival, tokenized, scheduled (the queue ends),
first prefill chunk, every token (the first is the first token), finished. Per step: decodes,
prefill tokens and sequences, blocks in use, waiting, preemptions so far, step time.

References:
- nano-vllm (GeeeekExplorer/nano-vllm): `llm_engine.py` step loop, block manager, scheduler.
- vLLM v1 ("Inside vLLM: Anatomy of a High-Throughput LLM Inference System", 2025): unified
  chunked prefill + decode step, prefix caching counted in tokens (queries / hits).
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from dataclasses import dataclass

import torch

from llmlab.inference import sampling
from llmlab.serving.block_manager import BlockManager
from llmlab.serving.model_runner import Batch, ModelRunner
from llmlab.serving.scheduler import RequestParams, Scheduled, Scheduler, Sequence, Status

now_ns = time.perf_counter_ns


@dataclass(frozen=True)
class EngineConfig:
    block_size: int = 16  # tokens per KV block: vLLM's default; small enough that little is wasted per sequence
    num_blocks: int = 1024  # KV pool: 16 K tokens; for tiny that is 96 MiB (FP32), plenty for 2-core CPU loads
    max_num_seqs: int = 64  # running sequences per step: past ~32 a CPU step is compute-bound anyway
    max_num_batched_tokens: int = 512  # token budget per step: a few prompts per step, decode steps not stalled long
    enable_prefix_cache: bool = True  # on by default, as in vLLM v1
    max_model_len: int | None = None  # None: the model's max_position_embeddings (and no more than the pool)

    def __post_init__(self):
        for name in ("block_size", "num_blocks", "max_num_seqs", "max_num_batched_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")


@dataclass(frozen=True)
class StepRecord:
    step: int
    start_ns: int
    step_ms: float
    num_decodes: int
    num_prefill_seqs: int
    num_prefill_tokens: int
    num_seqs: int  # sequences in this step's batch
    blocks_in_use: int
    num_waiting: int
    num_preemptions: int  # so far


@dataclass
class StepOutput:
    tokens: list[tuple[Sequence, int]]  # (sequence, new token) in batch order
    finished: list[Sequence]
    record: StepRecord


class Engine:
    def __init__(self, model, cfg: EngineConfig = EngineConfig(), eos_token_id: int | None = None):
        self.cfg = cfg
        self.model = model
        self.blocks = BlockManager(cfg.num_blocks, cfg.block_size, cfg.enable_prefix_cache)
        self.scheduler = Scheduler(self.blocks, cfg.max_num_seqs, cfg.max_num_batched_tokens)
        self.runner = ModelRunner(model, cfg.num_blocks, cfg.block_size)
        eos = model.config.eos_token_id if eos_token_id is None else eos_token_id
        self.eos_ids = set(eos) if isinstance(eos, list) else ({eos} if eos is not None else set())
        ctx = getattr(model.config, "max_position_embeddings", None) or 1 << 30
        self.max_model_len = min(ctx, cfg.max_model_len or ctx, cfg.num_blocks * cfg.block_size)
        self.steps: deque[StepRecord] = deque(maxlen=100_000)
        self.num_steps = 0
        self.record_logits = False
        self._ids = itertools.count()
        self._seeds = itertools.count(1_000_003)
        self.seqs: dict[int, Sequence] = {}

    # ---------------------------------------------------------------- requests

    def check_request(self, n_prompt: int, params: RequestParams) -> None:
        """ValueError with one line when a request can never run here."""
        if n_prompt < 1:
            raise ValueError("the prompt is empty")
        if n_prompt >= self.max_model_len:
            raise ValueError(f"the prompt has {n_prompt} tokens; this model's context is {self.max_model_len} tokens")
        if n_prompt + params.max_tokens > self.max_model_len:
            raise ValueError(f"max_tokens {params.max_tokens} + {n_prompt} prompt tokens is beyond the context of {self.max_model_len} tokens")

    def add_request(self, prompt_ids: list[int], params: RequestParams = RequestParams(), arrival_ns: int | None = None,
                    tokenized_ns: int | None = None) -> Sequence:
        self.check_request(len(prompt_ids), params)
        gen = None
        if params.temperature > 0:
            gen = torch.Generator(device=self.runner.device).manual_seed(params.seed if params.seed is not None else next(self._seeds))
        t = now_ns()
        seq = Sequence(next(self._ids), list(map(int, prompt_ids)), params, gen, arrival_ns=arrival_ns or t, tokenized_ns=tokenized_ns or t)
        if self.record_logits:
            seq.debug_logits = []
        self.seqs[seq.seq_id] = seq
        self.scheduler.add(seq)
        return seq

    def abort(self, seq: Sequence) -> None:
        """Stop a request (client gone, stop string found): its blocks go back to the pool now."""
        if seq.status != Status.FINISHED:
            self.scheduler.finish(seq, "abort")
        self.seqs.pop(seq.seq_id, None)

    def has_work(self) -> bool:
        return self.scheduler.has_work()

    # ---------------------------------------------------------------- one step

    def build_batch(self, sched: list[Scheduled]) -> Batch:
        """Plain Python lists, one tensor each at the end: small per-sequence tensors cost more than the lists."""
        bs = self.cfg.block_size
        ids, pos, slots, prefills, d_rows, d_tables, d_lens, logit_rows = [], [], [], [], [], [], [], []
        row = 0
        for s in sched:
            seq, a, n = s.seq, s.seq.num_computed, s.n_tokens
            table = seq.block_table[: -(-(a + n) // bs)]  # the blocks holding positions 0 .. a + n - 1
            ids.extend(seq.token_ids[a : a + n])
            pos.extend(range(a, a + n))
            slots.extend(table[p // bs] * bs + p % bs for p in range(a, a + n))  # where the new K/V go
            if n == 1:
                d_rows.append(row)
                d_tables.append(table)
                d_lens.append(a + 1)
            else:
                prefills.append((row, n, a + n, table))
            if self.record_logits:
                logit_rows.extend(range(row, row + n))
            elif s.samples:
                logit_rows.append(row + n - 1)
            row += n
        dev = self.runner.device
        long = lambda xs: torch.tensor(xs, dtype=torch.long, device=dev)  # noqa: E731
        nb = max((len(t) for t in d_tables), default=0)
        tables = long([t + [0] * (nb - len(t)) for t in d_tables]).view(len(d_tables), nb)  # (Nd, nb) padded with block 0 (masked)
        mask = torch.arange(nb * bs, device=dev)[None, :] < long(d_lens)[:, None]  # (Nd, nb * B)
        return Batch(
            input_ids=long(ids), positions=long(pos), slots=long(slots), prefills=[(r, n, c, long(t)) for r, n, c, t in prefills],
            decode_rows=long(d_rows), decode_tables=tables, decode_mask=mask, logit_rows=long(logit_rows),
        )

    def sample(self, logits: torch.Tensor, seqs: list[Sequence]) -> list[int]:
        """logits (M, V) -> one token per sequence: greedy rows in one argmax, the others one by one with their own generator."""
        out = logits.argmax(dim=-1).tolist()
        for i, seq in enumerate(seqs):
            p = seq.params
            if p.temperature > 0:
                out[i] = int(sampling.sample(logits[i : i + 1], generator=seq.generator, temperature=p.temperature,
                                             top_k=p.top_k, top_p=p.top_p, min_p=p.min_p)[0])
        return out

    def step(self) -> StepOutput | None:
        """Schedule, run one ragged forward, sample, stamp; None when there is nothing to do."""
        t0 = now_ns()
        sched = self.scheduler.schedule()
        if not sched:
            return None
        batch = self.build_batch(sched)
        t_fwd = now_ns()
        for s in sched:
            if not s.seq.first_chunk_ns:
                s.seq.first_chunk_ns = t_fwd
        logits = self.runner.forward(batch)  # (M, V)
        sampled = [s for s in sched if s.samples]
        if self.record_logits:
            row = 0
            for s in sched:
                s.seq.debug_logits.append(logits[row : row + s.n_tokens].clone())
                row += s.n_tokens
            logits = torch.stack([s.seq.debug_logits[-1][-1] for s in sampled]) if sampled else logits[:0]
        new = self.sample(logits, [s.seq for s in sampled])  # .tolist() syncs the device
        t1 = now_ns()
        tokens, finished = [], []
        for s in sched:
            seq = s.seq
            seq.num_computed += s.n_tokens
            seq.num_hashed = self.blocks.register_full(seq.block_table, seq.token_ids, seq.num_computed, seq.num_hashed)
        for s, tok in zip(sampled, new, strict=True):
            seq = s.seq
            seq.output_ids.append(tok)
            seq.token_ns.append(t1)
            tokens.append((seq, tok))
            if tok in self.eos_ids and not seq.params.ignore_eos:
                self.scheduler.finish(seq, "stop")
            elif len(seq.output_ids) >= seq.params.max_tokens or len(seq) >= self.max_model_len:
                self.scheduler.finish(seq, "length")
            if seq.status == Status.FINISHED:
                finished.append(seq)
                self.seqs.pop(seq.seq_id, None)
        n_dec = sum(1 for s in sched if s.n_tokens == 1 and not s.seq.in_prefill)
        rec = StepRecord(self.num_steps, t0, (now_ns() - t0) / 1e6, n_dec, len(sched) - n_dec,
                         sum(s.n_tokens for s in sched) - n_dec, len(sched), self.blocks.num_used,
                         len(self.scheduler.waiting), self.scheduler.num_preemptions)
        self.num_steps += 1
        self.steps.append(rec)
        return StepOutput(tokens, finished, rec)

    # ---------------------------------------------------------------- offline use

    def generate(self, prompts: list[list[int]], params: RequestParams | list[RequestParams] = RequestParams()) -> list[Sequence]:
        """Run every prompt to completion (all arrive now); returns the finished sequences in prompt order."""
        plist = params if isinstance(params, list) else [params] * len(prompts)
        seqs = [self.add_request(p, q) for p, q in zip(prompts, plist, strict=True)]
        while self.has_work():
            self.step()
        return seqs

    def prefill_logits(self, prompts: list[list[int]]) -> list[torch.Tensor]:
        """Logits (T_i - cached_i, V) of every computed prompt position, prompts batched as the scheduler likes."""
        self.record_logits = True
        try:
            seqs = self.generate(prompts, RequestParams(max_tokens=1, ignore_eos=True))
        finally:
            self.record_logits = False
        return [torch.cat(s.debug_logits)[: len(s.prompt_ids) - s.num_cached_prompt] for s in seqs]

    def reset_stats(self) -> None:
        self.steps.clear()
        self.scheduler.num_preemptions = self.scheduler.prefix_queries = self.scheduler.prefix_hits = 0


# ---------------------------------------------------------------- exactness, before any timing


@torch.inference_mode()
def hf_logits(model, prompt: list[int]) -> torch.Tensor:
    """HF's own forward over one unpadded prompt -> (T, V) float32."""
    return model(input_ids=torch.tensor([prompt], device=next(model.parameters()).device)).logits[0].float()


def check_exact(engine: Engine, prompts: list[list[int]], max_new_tokens: int = 8, atol: float = 1e-4) -> dict:
    """Logits vs HF for every prompt position (batched, chunked or cached as the engine's config makes
    them), then greedy tokens vs `inference.decode.generate`. Raises AssertionError on a mismatch."""
    from llmlab.inference.decode import generate

    worst = 0.0
    for p, got in zip(prompts, engine.prefill_logits(prompts), strict=True):
        ref = hf_logits(engine.model, p)[len(p) - got.shape[0] :]
        worst = max(worst, float((got - ref).abs().max()))
    if worst > atol:
        raise AssertionError(f"engine logits differ from HF's by {worst:.2e} > {atol:g}")
    seqs = engine.generate(prompts, RequestParams(max_tokens=max_new_tokens, ignore_eos=True))
    for p, s in zip(prompts, seqs, strict=True):
        dev = next(engine.model.parameters()).device
        ref = generate(engine.model, torch.tensor([p], device=dev), max_new_tokens).tokens[0].tolist()
        if s.output_ids != ref:
            raise AssertionError(f"greedy output differs from decode.generate: {s.output_ids} vs {ref}")
    return {"max_abs_logit_diff": worst, "prompts": len(prompts), "greedy_tokens_equal": True}
