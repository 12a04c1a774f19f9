"""The kvcache-growth lab's Config: light imports only (the CLI reads every lab's Config for `llmlab --help`)."""

from __future__ import annotations

from dataclasses import dataclass

from llmlab.core.config import opt
from llmlab.labs.kvcache_growth.formula import cache_dtype


@dataclass(frozen=True)
class Config:
    """Watch the KV cache grow: its bytes against the formula, GQA vs MHA, and the quadratic trap without it.

    Every token leaves a key and a value per layer and KV head in the cache: 2 x layers x kv_heads x
    head_dim x bytes per token (Llama-2-7B: 512 KiB in BF16; Llama-3-8B, with 4 query heads sharing each
    KV head: 128 KiB). This lab grows a real cache (batch x length), sums its tensors and checks them
    byte for byte against that formula (and the sliding window of Mistral); compares the registry models
    (GiB at 4k/32k/128k, tokens and requests that fit after the weights, as vLLM reports them); and
    generates with and without the cache, fitting total time vs n: without it every token recomputes the
    whole prefix, so the total grows as n^2.
    """

    model: str = opt("tiny", flag="--model", short="-m",  # a real trained Llama (6 layers, GQA 4:2, head_dim 64)
                     help="tiny | tiny-draft | a Hugging Face id or local path | arch:NAME (random weights: timing "
                          "only).")
    dtype: str | None = opt(None, help="The measured model's dtype: float32 | float16 | bfloat16; default: float32 "
                                       "on the CPU, bfloat16 on a GPU.")
    cache_dtype: str = opt("bf16", help="Cache dtype of the registry table: fp32 | fp16 | bf16 | fp8 | int4-g64 | "
                                        "int4-g32 (4-bit + one FP16 scale per 64 / 32 values); the formula covers "
                                        "every dtype.")
    # 1 request and two batches; under the CPU budget each one crosses tiny's weights
    batches: tuple[int, ...] = opt((1, 4, 16), help="Batch sizes of the real cache, comma-separated (>= 1).")
    # x4 steps to past tiny's 8192 context
    lengths: tuple[int, ...] = opt((1, 16, 64, 256, 1024, 4096, 8192, 16384),
                                   help="Sequence lengths the real cache grows through, in tokens, increasing.")
    cpu_token_budget: int = opt(4096, help="CPU only: a batch stops past this many tokens (batch x length; seconds "
                                           "on 2 cores).")
    static_max_len: int = opt(1024, help="StaticCache rows for the first batch size up to this length, in tokens "
                                         "(it preallocates).")
    contexts: tuple[int, ...] = opt((4096, 32768, 131072),  # the article's 4k / 32k / 128k
                                    help="Context lengths of the registry table, in tokens, comma-separated.")
    # Llama-2's whole window
    concurrency_context: int = opt(4096, help="Tokens per request for the registry's \"maximum concurrency\".")
    memory_utilization: float = opt(0.9, help="Share of device memory the cache and weights may use, in (0, 1] "
                                              "(vLLM's gpu_memory_utilization).")  # vLLM's default
    gen_prompt: int = opt(8, help="Prompt tokens of the quadratic trap (>= 1).")  # the growth comes from generated
    # long enough that recomputing the prefix outweighs the per-step overhead
    gen_tokens: int = opt(160, help="Tokens the quadratic trap generates with and without the cache (>= 8).")
    gen_repeats: int = opt(3, help="Timed runs of each trap loop (>= 2): per-step medians, never one run.")
    trap_budget_s: float = opt(60.0, help="Wall-time cap of the no-cache runs, in seconds (> 0): fewer tokens on a "
                                          "slow or shared CPU.")
    window_probe: int = opt(32, help="The Mistral skeleton's sliding window, in tokens (>= 4): shrunk so the cap "
                                     "is reached in a few tokens.")
    cuda_model: str = opt("auto", help="GPU trap model: auto = a registry arch: of >= 32x the L2 when --model fits "
                                       "in it (tiny does); same = --model.")
    max_trap_tokens: int = opt(8192, help="GPU: the most tokens the trap generates (its count is sized from the "
                                          "device up to this).")
    seed: int = 0

    def __post_init__(self):
        try:
            cache_dtype(self.cache_dtype)
        except ValueError as exc:
            raise ValueError(f"--cache-dtype: {exc}") from None
        if self.dtype is not None and self.dtype not in ("float32", "float16", "bfloat16"):
            raise ValueError(f"--dtype must be float32, float16 or bfloat16, not '{self.dtype}'")
        for name in ("batches", "lengths", "contexts"):
            v = getattr(self, name)
            if not v or any(int(x) < 1 for x in v):
                raise ValueError(f"--{name} must be positive integers")
        if list(self.lengths) != sorted(set(self.lengths)):
            raise ValueError("--lengths must be increasing")
        if self.concurrency_context < 1 or self.cpu_token_budget < 1:
            raise ValueError("--concurrency-context and --cpu-token-budget must be positive")
        if not 0 < self.memory_utilization <= 1:
            raise ValueError("--memory-utilization must be in (0, 1]")
        if self.gen_prompt < 1 or self.gen_tokens < 8:
            raise ValueError("--gen-prompt must be >= 1 and --gen-tokens >= 8 (the fit needs points)")
        if self.gen_repeats < 2:
            raise ValueError("--gen-repeats must be >= 2 (a median, never one run)")
        if self.trap_budget_s <= 0:
            raise ValueError("--trap-budget-s must be positive")
        if self.window_probe < 4:
            raise ValueError("--window-probe must be >= 4")

    @classmethod
    def quick(cls) -> Config:
        # two batches, four lengths and 48 trap tokens: every part and claim in about a minute on 2 cores
        return cls(batches=(1, 16), lengths=(1, 16, 64, 256), static_max_len=256, gen_tokens=48, trap_budget_s=9.0)

