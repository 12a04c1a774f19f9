"""The train-vs-infer lab's Config: every field is a command-line option (llmlab.core.config.opt)."""

from __future__ import annotations

from dataclasses import dataclass

from llmlab.core.config import opt

LAB = "train-vs-infer"
VERSION = 1
JUDGE_VERSION = 1


@dataclass(frozen=True)
class Config:
    """Training does two things, inference one: a forward vs forward + backward + AdamW, their FLOPs and bytes, and
    why inference does not learn.

    Training runs a forward pass, then a backward pass (about twice the forward's FLOPs) and a weight update, and
    keeps gradients and Adam's two moments: 16 bytes per parameter before activations, against 2-4 for inference
    weights. It sees every position of a sequence at once (teacher forcing), while generation produces one token
    per forward. This lab times and counts (FlopCounterMode) the three regimes on the same batch, counts their bytes
    tensor by tensor (weights, grads, optimizer state, saved activations, KV cache), scales Llama 3 8B onto one 80
    GB GPU by formula, races one forward over T tokens against T decode steps, and checks that generating 1,000
    tokens leaves the weights' hash, .grad and the next answer unchanged, while one AdamW step on that conversation
    changes them.
    """

    models: tuple[str, ...] = opt(("tiny", "arch:qwen2.5-0.5b"), flag="--model", short="-m",
                                  help="Models to measure, comma-separated or repeated: tiny | arch:NAME (cut to "
                                       "--arch-layers, random weights) | a Hugging Face id.")  # real + a real shape
    arch_layers: int = opt(2, help="Layers kept of an arch: model (>= 1).")  # the shape of a layer, not 24 of them
    batch: int = opt(4, help="Sequences per step (>= 1).")  # a small training batch
    seq_len: int = opt(128, help="Tokens per sequence (>= 8).")  # a short training context
    repeats: int = opt(5, help="Interleaved timing rounds (>= 1; median, p10, p90).")
    gen_tokens: int = opt(1000, help="Tokens of conversation generated before checking that nothing changed "
                                     "(>= 16).")  # a long conversation: 1,000 tokens
    answer_tokens: int = opt(32, help="Tokens of the answer compared before and after, same prompt and seed (>= 4).")
    lr: float = opt(1e-3, help="AdamW learning rate of the one training step on that conversation "
                               "(> 0).")  # a common fine-tuning rate
    threads: int = opt(0, help="torch CPU threads (0 = torch's default).")
    seed: int = 0

    def __post_init__(self):
        if not self.models:
            raise ValueError("--models needs at least one model")
        if self.batch < 1 or self.seq_len < 8:
            raise ValueError(f"--batch must be >= 1 and --seq-len >= 8, got {self.batch}, {self.seq_len}")
        if self.repeats < 1 or self.arch_layers < 1 or self.threads < 0:
            raise ValueError("repeats and arch layers must be >= 1, threads >= 0")
        if self.gen_tokens < 16 or self.answer_tokens < 4:
            raise ValueError(f"--gen-tokens must be >= 16 and answer tokens >= 4, got {self.gen_tokens}")
        if not self.lr > 0:
            raise ValueError(f"--lr must be > 0, got {self.lr}")

    @classmethod
    def quick(cls) -> Config:
        return cls(models=("tiny",), batch=2, seq_len=48, repeats=3, gen_tokens=64, answer_tokens=12)
