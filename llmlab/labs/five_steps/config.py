"""The five-steps lab's Config: every field is a command-line option (llmlab.core.config.opt)."""

from __future__ import annotations

from dataclasses import dataclass

from llmlab.core.config import opt

LAB = "five-steps"
VERSION = 2  # 2: predicted shapes from the config and the tokenizer's count; SDPA's FLOPs counted on the CPU too
JUDGE_VERSION = 2


@dataclass(frozen=True)
class Config:
    """Watch a model produce one word: tokenize and embed, attention, MLP (once per layer), LM head, sample; shapes,
    candidates and where the time goes.

    The lab calls the model's own submodules in order by hand and records the real tensor shape after each step (on
    tiny, and on Llama 3 8B's full shape on the meta device), shows the top-5 words after the LM head and what greedy
    and top-p pick, checks the hand run gives the forward's logits (no secret sixth step), and stamps each step with
    forward hooks during a decode step and a prefill: time, FLOPs (shape formula vs FlopCounterMode) and weight bytes
    per step, and how the split moves with model size.
    """

    model: str = opt("tiny", short="-m", help="tiny | tiny-draft | a Hugging Face id or local path | arch:NAME "
                                              # real weights: the words mean something
                                              "(random weights: timing only).")
    big: str = opt("arch:llama-3-8b", help="A larger arch: model walked on the meta device (shapes "
                                           "only).")  # the article's example
    sizes: tuple[str, ...] = opt(("arch:qwen2.5-0.5b", "arch:llama-3.2-1b"), flag="--size",
                                 help="arch: models for the breakdown vs size, comma-separated or repeated (timed on "
                                      "--size-layers layers, scaled).")  # larger shapes, random weights
    size_layers: int = opt(2, help="Layers of each --size model actually run (>= 1; attention and MLP scaled to the "
                                   "full count).")
    prompt: str = opt("The default value of the", help="The text whose next word is followed through the "
                                                       "model.")  # from the tiny model's own domain (Python docs)
    prefill_tokens: int = opt(256, help="Tokens of the timed prefill (>= 2).")
    context: int = opt(128, help="Tokens in the cache when the timed decode step runs (>= 1).")
    repeats: int = opt(15, help="Timed forwards per shape, the median kept (>= 1).")
    top_p: float = opt(0.9, help="p of step 5 under top-p, in (0, 1].")
    threads: int = opt(1, help="torch CPU threads.")  # one, so the per-step stamps are not smeared by OpenMP waits
    seed: int = 0

    def __post_init__(self):
        if self.prefill_tokens < 2 or self.context < 1 or self.repeats < 1 or self.size_layers < 1:
            raise ValueError("prefill tokens must be >= 2, context, repeats and size layers >= 1")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"--top-p must be in (0, 1], got {self.top_p}")
        if not self.prompt.strip():
            raise ValueError("--prompt must not be empty")

    @classmethod
    def quick(cls) -> Config:
        return cls(sizes=(), prefill_tokens=48, context=32, repeats=4)
