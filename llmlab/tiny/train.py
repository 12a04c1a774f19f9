"""Train the built-in pair: a ~6 M Llama target (`tiny`) and a ~1 M draft (`tiny-draft`) distilled from it.

In reading order: `build_data` (corpus -> tokenizer -> id streams) -> `train_target` (next-token
cross-entropy) -> `distill_draft` (KL to the target's logits, which is what raises greedy agreement)
-> `train_pair` (both, saved as HF folders, then evaluated and the model card written).

Calibration on a 2-core AVX2 CPU, torch 2.13: the 6 x 256 target takes ~1.7 s per step of 32 x 128
tokens on an idle machine with 2 threads; on a machine shared with other jobs one thread wastes less
(two threads spin at each barrier while the other is descheduled). On one thread a target step of
8 x 512 tokens takes ~2.5 s (~1,700 tokens/s); the shipped pair's steps, seconds and epochs are in
MODEL_CARD.md. Training windows follow a copying curriculum (see TrainConfig and `curriculum_batches`).
The schedule is AdamW at a high learning rate with warm-up-stable-decay (WSD): a linear warm-up, a
constant LR, and a cosine decay to 10 % over the last fifth of the steps. A constant middle lets a
--minutes run re-size its total from the speed it really gets on a shared machine (every 50 steps,
until the decay starts) without changing the LR of any step already taken, so the fixed-step
command `--target-steps N` reproduces it bit for bit.

References:
- nanoGPT train.py (warm-up, AdamW, gradient clipping): https://github.com/karpathy/nanoGPT
- Hägele et al. 2024, Scaling Laws and Compute-Optimal Training Beyond Fixed Training Durations (WSD
  matches cosine): https://arxiv.org/abs/2405.18392
- Hinton et al. 2015, Distilling the Knowledge in a Neural Network: https://arxiv.org/abs/1503.02531
- Leviathan et al. 2023, Fast Inference from Transformers via Speculative Decoding (why agreement
  matters): https://arxiv.org/abs/2211.17192
- DistillSpec (Zhou et al. 2023), distilling a draft for agreement: https://arxiv.org/abs/2310.08461
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from llmlab.tiny.copying import copy_phase, masked_ce, with_pairs
from llmlab.tiny.corpus import Corpus, build_corpus, topic_documents
from llmlab.tiny.tokenizer import VOCAB_SIZE, encode_documents, save_tokenizer, train_tokenizer

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class Arch:
    """A Llama shape. head_dim = hidden / heads."""

    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int

    def llama_config(self, vocab_size: int, eot_id: int = 0):
        from transformers import LlamaConfig

        return LlamaConfig(
            vocab_size=vocab_size,
            hidden_size=self.hidden,
            intermediate_size=self.intermediate,
            num_hidden_layers=self.layers,
            num_attention_heads=self.heads,
            num_key_value_heads=self.kv_heads,
            max_position_embeddings=8192,  # labs sweep prompts up to 4096 tokens; RoPE extends past training length
            rope_theta=10000.0,  # the original RoPE base: plenty for 8 K positions at this size
            rms_norm_eps=1e-5,  # Llama-2's value
            tie_word_embeddings=True,  # the 4096 x hidden embedding is a big share of a tiny model: share it
            bos_token_id=eot_id,
            eos_token_id=eot_id,
            pad_token_id=eot_id,
            torch_dtype="float32",
        )


# The target: 6 layers give it depth (and a per-token decode cost the draft can undercut by 4x);
# width 256 with 4 heads of 64 and 2 KV heads is GQA at the smallest sensible size; SwiGLU at 3x width.
TARGET_ARCH = Arch(layers=6, hidden=256, intermediate=768, heads=4, kv_heads=2)
# The draft: one layer, because on a CPU per-token decode time is mostly per-layer overhead, so
# depth (not width) sets the cost ratio c; width 192 buys back some quality at almost no cost.
DRAFT_ARCH = Arch(layers=1, hidden=192, intermediate=576, heads=3, kv_heads=1)


@dataclass(frozen=True)
class TrainConfig:
    seed: int = 0  # fixed: the same Python version + seed + steps reproduce the shipped pair
    target: Arch = TARGET_ARCH
    draft: Arch = DRAFT_ARCH
    vocab_size: int = VOCAB_SIZE  # see tokenizer.py
    corpus: str = "full"  # "full" (topics + docstrings + source) or "topics" (fast, for tests)
    seq_len: int = 512  # the lookup labs' prompts are ~330 tokens: train on positions past them
    batch_size: int = 4  # 2 K tokens a step: ~1.2 s on one thread (the text phase that kept the copying head)
    # The copying curriculum. A real corpus teaches copying (induction heads) through repetition at
    # a scale one CPU thread cannot train on, so a stated share of windows carries it explicitly:
    # span_share of windows repeat one of their own real-text spans later in the window (what a
    # quote, an edit or a docstring echoed in help() looks like); random_share of windows carry a
    # span of random ids twice (the classic induction-head setup: only copying predicts the second
    # reading). Spans are repeat_min..repeat_max tokens. The other windows are plain text, and the
    # held-out evaluation is always plain text.
    span_share: float = 0.25
    random_share: float = 0.10
    repeat_min: int = 32
    repeat_max: int = 128
    target_lr: float = 2e-3  # tiny models tolerate (and need) a high LR with warm-up; 2e-3 kept the copying head
    draft_lr: float = 3e-3
    # WSD: warmup_steps of linear warm-up keep the first high-LR steps stable (a fixed count, so the
    # LR before the decay never depends on the total), then the peak, then a cosine decay over the
    # last decay_frac of the steps to min_lr_frac of the peak (not to zero, as nanoGPT).
    warmup_steps: int = 50
    decay_frac: float = 0.2
    min_lr_frac: float = 0.1
    resize_every: int = 50  # a --minutes run re-sizes its total every this many steps until the decay
    weight_decay: float = 0.1  # AdamW default for GPT-style training
    grad_clip: float = 1.0  # guards the high-LR start
    distill_temperature: float = 1.0  # T = 1: match the target's distribution as is; argmax is what counts
    target_steps: int = 500  # the shipped run's steps (see MODEL_CARD.md); --minutes overrides
    draft_steps: int = 500  # distillation converges faster than training from scratch
    minutes: float | None = None  # a wall-clock budget: steps are sized from a timed trial step
    target_share: float = 0.8  # of the budget, for the target (a draft step costs ~2/5 of a target step)
    threads: int | None = None  # torch threads; None keeps torch's default (the shipped run used 1)
    eval_tokens: int = 32_768  # held-out tokens for the loss: a stable estimate in seconds
    # Every probe_every target steps (0: never), the induction-head test on probe_passages passages of 64
    # random ids read twice: the share of the second reading the target predicts. Copying forms in a phase
    # change, so the curve says whether a run has it long before the end. It reads no training data and
    # draws from its own generator: the run's steps are the same with or without it.
    probe_every: int = 100
    probe_passages: int = 8
    # The copying phase (copying.py), before any text: windows of random ids tiled with repeated pairs, the
    # loss on the second readings; copy_levels are (window length, probe span) unlocked one by one when the
    # probe of the current level reaches copy_promote, until the last level's reaches copy_goal (or
    # copy_max_steps; copy_steps fixes the count, as a reproduction does; 0 skips the phase). Then in the
    # text phase every copy_maintain_every-th batch is a pair batch of the last level.
    copy_levels: tuple = ((32, 12), (64, 12), (128, 32), (256, 64))
    copy_tokens: int = 1024  # tokens a step: B = copy_tokens // window
    copy_lr: float = 2e-3
    copy_promote: float = 0.5
    copy_goal: float = 0.85
    copy_probe_every: int = 100
    copy_max_steps: int = 12_000
    copy_steps: int | None = None
    # of a --minutes target budget, at most, for the copying phase: its onset (the step where the probe
    # leaves 0) came at 44 min of an idle core's 92, and a loaded core is slower; the text phase keeps the rest
    copy_budget_share: float = 0.75
    copy_maintain_every: int = 4

    @classmethod
    def micro(cls) -> TrainConfig:
        """Seconds on 2 cores: what the tests run (topics only, toy shapes, a few steps)."""
        tiny = Arch(layers=1, hidden=32, intermediate=64, heads=2, kv_heads=1)
        return cls(target=tiny, draft=tiny, vocab_size=512, corpus="topics", seq_len=32, batch_size=8,
                   repeat_min=4, repeat_max=12, target_steps=30, draft_steps=10, eval_tokens=2048, warmup_steps=3,
                   resize_every=5, copy_levels=((16, 4), (32, 8)), copy_tokens=128, copy_probe_every=4,
                   copy_max_steps=8)


@dataclass
class Data:
    tokenizer: object
    train_ids: torch.Tensor  # (N,) int64, documents joined by <|endoftext|>
    heldout_ids: torch.Tensor
    heldout_docs: list[str]
    corpus_sha256: str
    train_bytes: int
    heldout_bytes: int


# progress callback: (phase, step, total_steps, loss, copy probe at this step or None)
OnStep = Callable[[str, int, int, float, "float | None"], None]


def build_data(cfg: TrainConfig) -> Data:
    import torch

    if cfg.corpus == "topics":
        docs = [t for _, t in topic_documents()]
        corpus = Corpus(train=docs[4:], heldout=docs[:4])
    else:
        corpus = build_corpus()
    tok = train_tokenizer(corpus.train, cfg.vocab_size)
    train_ids = torch.tensor(encode_documents(tok, corpus.train), dtype=torch.long)
    held_ids = torch.tensor(encode_documents(tok, corpus.heldout), dtype=torch.long)
    return Data(tok, train_ids, held_ids, corpus.heldout, corpus.sha256(),
                len(corpus.train_text().encode()), len(corpus.heldout_text().encode()))


def warmup_of(total: int, cfg: TrainConfig) -> int:
    return max(1, min(cfg.warmup_steps, total // 5))  # a run of at least 5 warm-ups has the full one


def decay_start(total: int, cfg: TrainConfig) -> int:
    return total - max(1, int(cfg.decay_frac * total))


def lr_at(step: int, total: int, peak: float, cfg: TrainConfig) -> float:
    """WSD: linear warm-up, the peak, then cosine decay to min_lr_frac * peak over the last decay_frac."""
    warm, start = warmup_of(total, cfg), decay_start(total, cfg)
    if step < warm:
        return peak * (step + 1) / warm
    if step < start:
        return peak
    progress = min(1.0, (step - start) / max(1, total - start))
    return peak * (cfg.min_lr_frac + (1 - cfg.min_lr_frac) * 0.5 * (1 + math.cos(math.pi * progress)))


PLAIN, SPAN, RANDOM = 0, 1, 2  # window kinds of the copying curriculum


def repeat_span(window, g, lo: int, hi: int, vocab_size: int | None = None):
    """Write one span of lo..hi tokens into window twice, the second copy after the first (in place).
    The span is the window's own text (vocab_size None) or random ids 1..vocab_size - 1 (never EOT).
    Returns (first, second, length): the two start positions and the span length."""
    import torch

    n = len(window)
    length = int(torch.randint(lo, min(hi, n // 2) + 1, (1,), generator=g))
    first = int(torch.randint(0, n - 2 * length + 1, (1,), generator=g))
    second = int(torch.randint(first + length, n - length + 1, (1,), generator=g))
    if vocab_size is None:
        span = window[first:first + length].clone()
    else:
        span = torch.randint(1, vocab_size, (length,), generator=g)
    window[first:first + length] = span
    window[second:second + length] = span
    return first, second, length


def curriculum_batches(ids, cfg: TrainConfig, seed: int):
    """Endless (batch, kinds): random windows of seq_len + 1 tokens (B, T + 1), each window PLAIN,
    SPAN (with probability span_share) or RANDOM (random_share), see TrainConfig."""
    import torch

    g = torch.Generator().manual_seed(seed)
    offsets = torch.arange(cfg.seq_len + 1)
    while True:
        starts = torch.randint(0, len(ids) - cfg.seq_len - 1, (cfg.batch_size,), generator=g)
        batch = ids[starts[:, None] + offsets]  # advanced indexing: a copy, the corpus stays as is
        u = torch.rand(cfg.batch_size, generator=g)
        kinds = torch.where(u < cfg.span_share, SPAN, torch.where(u < cfg.span_share + cfg.random_share, RANDOM, PLAIN))
        for row, kind in enumerate(kinds.tolist()):
            if kind != PLAIN:
                repeat_span(batch[row], g, cfg.repeat_min, cfg.repeat_max, cfg.vocab_size if kind == RANDOM else None)
        yield batch, kinds


def batches(ids, cfg: TrainConfig, seed: int):
    """Endless training batches (B, T + 1) of the curriculum."""
    return (batch for batch, _ in curriculum_batches(ids, cfg, seed))


def new_model(arch: Arch, vocab_size: int, seed: int):
    import torch
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    return LlamaForCausalLM(arch.llama_config(vocab_size))


def _optimizer(model, lr: float, cfg: TrainConfig):
    import torch

    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]  # no decay on norms
    rest = [p for n, p in model.named_parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": rest, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95), fused=False)


def _ce_step(model, batch):
    """Cross-entropy on a text batch (B, T + 1), or on the masked targets of a pair batch (x, mask)."""
    import torch.nn.functional as F

    if isinstance(batch, tuple):
        return masked_ce(model, *batch)
    logits = model(input_ids=batch[:, :-1]).logits  # (B, T, V)
    return F.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten())


def _kl_step(draft, target, batch, temperature: float):
    """KL(target || draft) per token, on the target's soft labels."""
    import torch
    import torch.nn.functional as F

    x = batch[:, :-1]
    with torch.no_grad():
        t_logp = F.log_softmax(target(input_ids=x).logits / temperature, dim=-1)  # (B, T, V)
    d_logp = F.log_softmax(draft(input_ids=x).logits / temperature, dim=-1)
    kl = F.kl_div(d_logp.flatten(0, 1), t_logp.flatten(0, 1), log_target=True, reduction="batchmean")
    return kl * temperature**2


def resized_total(done: int, elapsed: float, pace: float, budget_s: float, cfg: TrainConfig) -> int:
    """The total that fits budget_s: done steps in elapsed seconds, the rest at the recent pace
    (seconds per step: a shared machine's speed drifts, the average since the start lags it), kept
    long enough that the LR of every step taken stays what it was: a full warm-up, the decay ahead."""
    fits = done + int((budget_s - elapsed) / pace)
    keep = max(5 * cfg.warmup_steps, math.ceil((done + 1) / (1 - cfg.decay_frac)) + 1)
    return max(fits, keep)


def copy_probe(model, cfg: TrainConfig) -> float:
    """The induction-head test (evaluate.repeat_accuracy on random ids), in eval mode, back to train mode."""
    from llmlab.tiny.evaluate import random_passages, repeat_accuracy

    model.eval()
    passages = random_passages(cfg.vocab_size, n=cfg.probe_passages, length=min(64, cfg.seq_len // 2))
    share = repeat_accuracy(model, passages)["second_read"]
    model.train()
    return share


def _run(model, step_fn, total: int, lr: float, cfg: TrainConfig, data_iter, phase: str, on_step: OnStep | None,
         budget_s: float | None = None, probes: list | None = None):
    """Train for total steps; with budget_s, total is re-sized from the recent pace every resize_every
    steps after the warm-up, until the decay starts. probes (a list): (step, copy_probe) appended every
    cfg.probe_every steps and after the last."""
    import torch

    opt = _optimizer(model, lr, cfg)
    model.train()
    losses = []
    stamps = [time.perf_counter()]  # stamps[i]: when step i began
    step = 0
    while step < total:
        resize = step >= cfg.warmup_steps and step % cfg.resize_every == 0 and step < decay_start(total, cfg)
        if budget_s is not None and resize:
            k = min(step, 2 * cfg.resize_every)  # the pace of the last 2 re-sizing intervals
            pace = (stamps[step] - stamps[step - k]) / k
            total = resized_total(step, stamps[step] - stamps[0], pace, budget_s, cfg)
        for group in opt.param_groups:
            group["lr"] = lr_at(step, total, lr, cfg)
        loss = step_fn(next(data_iter))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        losses.append(loss.item())
        copy_share = None
        if probes is not None and cfg.probe_every and ((step + 1) % cfg.probe_every == 0 or step + 1 == total):
            copy_share = copy_probe(model, cfg)
            probes.append((step + 1, copy_share))
        if on_step:
            on_step(phase, step + 1, total, losses[-1], copy_share)
        step += 1
        stamps.append(time.perf_counter())
    model.eval()
    return losses


def _seconds_per_step(model, step_fn, cfg: TrainConfig, data_iter) -> float:
    """Time one step on a throwaway copy (after one warm-up step), so the real run stays seeded."""
    trial = copy.deepcopy(model)
    opt = _optimizer(trial, 1e-4, cfg)
    times = []
    for _ in range(4):
        t0 = time.perf_counter()
        loss = step_fn(trial, next(data_iter))
        loss.backward()
        opt.step()
        opt.zero_grad()
        times.append(time.perf_counter() - t0)
    return sorted(times[1:])[1]  # the median of 3 after a warm-up step


def train_target(cfg: TrainConfig, data: Data, on_step: OnStep | None = None, budget_s: float | None = None,
                 probes: list | None = None, copying: dict | None = None):
    """The copying phase (copying.copy_phase), then text (the curriculum, with pair batches kept in).
    budget_s (with cfg.minutes): seconds for both; the copying phase takes at most copy_budget_share of them,
    the text phase's steps are sized from a trial step and re-sized after warm-up. probes: a list the text
    phase's copy probe (step, share) goes into (see TrainConfig.probe_every); copying: a dict the copying
    phase's record goes into."""
    model = new_model(cfg.target, cfg.vocab_size, cfg.seed)
    t0 = time.perf_counter()
    record = copy_phase(model, cfg, _optimizer(model, cfg.copy_lr, cfg), on_step,
                        budget_s and budget_s * cfg.copy_budget_share)
    if copying is not None:
        copying.update(record)
    steps = cfg.target_steps
    text_budget = budget_s and max(60.0, budget_s - (time.perf_counter() - t0))
    if text_budget is not None:
        sec = _seconds_per_step(model, _ce_step, cfg, batches(data.train_ids, cfg, cfg.seed + 100))
        steps = max(5 * cfg.warmup_steps, int(text_budget / sec))  # a full warm-up from the first step
    losses = _run(model, lambda b: _ce_step(model, b), steps, cfg.target_lr, cfg,
                  with_pairs(batches(data.train_ids, cfg, cfg.seed), cfg), "target", on_step, text_budget, probes)
    return model, losses


def distill_draft(cfg: TrainConfig, data: Data, target, on_step: OnStep | None = None, budget_s: float | None = None):
    draft = new_model(cfg.draft, cfg.vocab_size, cfg.seed + 1)
    steps = cfg.draft_steps
    T = cfg.distill_temperature
    if budget_s is not None:
        sec = _seconds_per_step(draft, lambda m, b: _kl_step(m, target, b, T), cfg,
                                batches(data.train_ids, cfg, cfg.seed + 101))
        steps = max(5 * cfg.warmup_steps, int(budget_s / sec))  # a full warm-up from the first step
    losses = _run(draft, lambda b: _kl_step(draft, target, b, T), steps, cfg.draft_lr, cfg,
                  batches(data.train_ids, cfg, cfg.seed + 1), "draft", on_step, budget_s)
    return draft, losses


def save_model(model, tokenizer, out: Path) -> None:
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # no tqdm bar from save_pretrained under our own progress bar
    out.mkdir(parents=True, exist_ok=True)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(str(out), safe_serialization=True)
    save_tokenizer(tokenizer, out)


@dataclass
class TrainReport:
    config: dict
    target_steps: int
    draft_steps: int
    target_losses: list[float]
    draft_losses: list[float]
    target_seconds: float
    draft_seconds: float
    corpus_sha256: str
    train_tokens: int
    heldout_tokens: int
    train_bytes: int
    heldout_bytes: int
    target_copy_probe: list = field(default_factory=list)  # (step, share of a random passage's second reading)
    copying: dict = field(default_factory=dict)  # the copying phase: copying.copy_phase's record
    extra: dict = field(default_factory=dict)


def train_pair(cfg: TrainConfig, out: Path, on_step: OnStep | None = None) -> tuple[TrainReport, Data]:
    """Build the data, train `tiny`, distil `tiny-draft`, save both under out/tiny and out/tiny-draft."""
    import torch

    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    out = Path(out)
    data = build_data(cfg)
    budget = cfg.minutes * 60 if cfg.minutes is not None else None
    t0 = time.perf_counter()
    probes: list = []
    copying: dict = {}
    target, t_losses = train_target(cfg, data, on_step, budget and budget * cfg.target_share, probes, copying)
    t1 = time.perf_counter()
    save_model(target, data.tokenizer, out / "tiny")
    # the draft gets what the target left of the budget (a slow target phase shortens it, not the deadline)
    draft, d_losses = distill_draft(cfg, data, target, on_step, budget and max(60.0, budget - (t1 - t0)))
    t2 = time.perf_counter()
    save_model(draft, data.tokenizer, out / "tiny-draft")
    cfg_dict = asdict(replace(cfg, target_steps=len(t_losses), draft_steps=len(d_losses), minutes=None,
                              copy_steps=copying["steps"]))
    report = TrainReport(cfg_dict, len(t_losses), len(d_losses), t_losses, d_losses, t1 - t0, t2 - t1,
                         data.corpus_sha256, len(data.train_ids), len(data.heldout_ids),
                         data.train_bytes, data.heldout_bytes, probes, copying=copying)
    return report, data
