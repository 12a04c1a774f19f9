"""The serving lab's Config: every field is a command-line option (llmlab.core.config.opt)."""

from __future__ import annotations

from dataclasses import dataclass

from llmlab.core.config import opt

LAB = "serving"
VERSION = 3  # 3: the cost part per concurrency level, and the training run against a year of serving
JUDGE_VERSION = 3
GPU_GB = 80  # the 80 GB GPU of the capacity-by-formula table
BLOCK = 16  # the engine's block size (EngineConfig's default)
ENDPOINT_PANEL = "Against a running server"


@dataclass(frozen=True)
class Config:
    """Serving: concurrency, static vs continuous batching, KV capacity, prefix reuse, chunked prefill, cost per token.

    One request at a time leaves a GPU mostly idle; batching is the lever, and the KV cache, not the weights, limits
    how many conversations fit. This lab measures each on llmlab's paged, continuously batching engine (checked
    exact against HF first): tokens/s and TTFT/ITL/TPOT (vLLM's definitions) vs concurrency with the step-time knee
    and the compute and bandwidth utilisation at 1 client; static vs continuous batching under Poisson arrivals with
    mixed reply lengths; peak concurrent conversations in a fixed KV pool against blocks / blocks per conversation; a
    shared system prompt with the prefix cache off and on; the ITL of running decodes while a long prompt is
    prefilled whole or in chunks; $ per 1M tokens at each concurrency from the measured throughput, and a whole
    training run (6 N D, napkin) against a year of serving the same model at the measured compute use. With
    --endpoint the client-side parts run against any OpenAI-compatible server (vLLM, SGLang, TGI, llama.cpp,
    llmlab serve).
    """

    model: str = opt("tiny", short="-m", help="tiny | tiny-draft | a Hugging Face id or local path | arch:NAME "
                                              "(random weights: timing only).")  # loads offline, real weights
    gpu_arch: str = opt("llama-3-8b", help="On CUDA the default tiny is replaced by this arch shape, BF16, as many "
                                           "layers as fit.")  # tiny would sit in the GPU's L2
    concurrencies: tuple[int, ...] = opt((1, 2, 4, 8, 16, 32, 64), help="Clients of the concurrency sweep, "
                                         "comma-separated, cut at --max-concurrency.")  # doubling: where the knee is
    max_concurrency: int = opt(64, help="Top of the concurrency sweep (>= 1).")
    requests_per_level: int = opt(3, help="Requests per client at each concurrency (at least 8 requests a level).")
    prompt_len: int = opt(64, help="Tokens per prompt of parts 1 and 2 (random ids, vLLM's random dataset).")
    output_len: int = opt(64, help="Tokens per reply (>= 2; ignore_eos, as benchmarks do).")
    short_long: tuple[int, int] = opt((8, 256), help="Part 2's short and long reply lengths, comma-separated "
                                                     "(mixed: where static batching wastes slots).")
    arrivals: int = opt(32, help="Part 2's Poisson requests (>= 2), rounded down to a multiple of the batch.")
    static_waits: tuple[float, ...] = opt((0.0, 1.0, 2.0), help="Part 2: static batching's longest wait for a fuller "
                                          "batch, in mean arrival gaps, comma-separated (>= 0).")
    kv_blocks: int = opt(64, help="KV pool of part 3, in blocks of 16 tokens (at least one "
                                  "conversation).")  # 1,024 tokens of KV: a handful of long conversations
    kv_pool_multiples: tuple[int, ...] = opt((1, 2, 3), help="Part 3's pools: --kv-blocks x each of these, the "
                                             "weights fixed (>= 1).")
    conversation: tuple[int, int] = opt((144, 16), help="Part 3's conversation: prompt and output tokens, "
                                                        "comma-separated.")  # admitted at 9 blocks, 10 by the end
    prefix_lens: tuple[int, ...] = opt((128, 512, 2048), help="Part 4's shared system prompts, in tokens, "
                                                              "comma-separated.")
    prefix_requests: int = opt(8, help="Part 4's requests sharing each prefix.")
    long_prompt: int = opt(1024, help="Part 5's prompt, in tokens, that arrives while decodes run.")
    chunk_budget: int = opt(64, help="Part 5's token budget per step with chunking on.")
    price_per_hour: float = opt(2.0, help="Your machine's (or one GPU's) price in $/hour for part 6 (>= 0): the "
                                          "default is an example, not a market price.")  # never a quote: pass yours
    train_model: str = opt("llama-3-8b", help="Part 6's napkin: the arch shape whose training run (6 N D) and year "
                                              "of serving are priced.")  # the series' example
    train_tokens: float = opt(15e12, help="Part 6's napkin: training tokens D (> 0).")  # Llama 3's 15T
    train_mfu: float = opt(0.4, help="Part 6's napkin: model FLOPs utilisation of the training run, in (0, "
                                     "1].")  # a good large run reaches 0.35-0.45
    train_gpu: str = opt("H100", help="Part 6's napkin: the GPU (a spec-registry name) that trains and serves "
                                      "--train-model, at --price-per-hour each.")  # its BF16 dense peak
    endpoint: str | None = opt(None, panel=ENDPOINT_PANEL, help="An OpenAI-compatible server (http://host:port): "
                               "part 1 (the concurrency sweep) measures it; the rest need the in-process engine.")
    threads: int = opt(1, help="torch CPU threads.")  # the engine's small ragged steps gain little from more
    seed: int = 0

    def __post_init__(self):
        if self.max_concurrency < 1:
            raise ValueError(f"--max-concurrency must be at least 1, got {self.max_concurrency}")
        if self.kv_blocks < -(-sum(self.conversation) // BLOCK):
            raise ValueError(f"--kv-blocks {self.kv_blocks} is smaller than one conversation needs "
                             f"({-(-sum(self.conversation) // BLOCK)} blocks of {BLOCK} tokens)")
        if not self.price_per_hour >= 0:
            raise ValueError(f"--price-per-hour must be >= 0, got {self.price_per_hour}")
        if self.prompt_len < 1 or self.output_len < 2 or self.requests_per_level < 1 or self.arrivals < 2:
            raise ValueError("prompt and output lengths, requests and arrivals must be positive (output >= 2)")
        if not self.kv_pool_multiples or min(self.kv_pool_multiples) < 1 or not self.static_waits or \
                min(self.static_waits) < 0:
            raise ValueError("kv_pool_multiples must be >= 1 and static_waits >= 0, one of each at least")
        if not self.train_tokens > 0 or not 0 < self.train_mfu <= 1:
            raise ValueError(f"--train-tokens must be > 0 and --train-mfu in (0, 1], got {self.train_tokens:g}, "
                             f"{self.train_mfu:g}")

    @classmethod
    def quick(cls) -> Config:
        return cls(concurrencies=(1, 4, 8), max_concurrency=8, requests_per_level=1, prompt_len=32, output_len=16,
                   short_long=(4, 24), arrivals=16, static_waits=(0.0, 1.0), kv_pool_multiples=(1, 2),
                   prefix_lens=(128,), prefix_requests=3, long_prompt=192, chunk_budget=32)

    def levels(self) -> list[int]:
        return [c for c in self.concurrencies if c <= self.max_concurrency] or [self.max_concurrency]

    def static_batch(self) -> int:
        return min(8, self.max_concurrency)
