"""The samplers lab's Config: every field is a command-line option (llmlab.core.config.opt)."""

from __future__ import annotations

from dataclasses import dataclass

from llmlab.core.config import opt

LAB = "samplers"
VERSION = 2  # 2: HF parity on the passage's real distributions; samplers reject all -inf rows (one more pass)
JUDGE_VERSION = 1
STRATEGIES = ("greedy", "temperature", "top_k", "top_p", "min_p")
# The performance goal of the sorting-free top-p: at V = 128,256, B = 32 at least this many times faster than
# Hugging Face's TopPLogitsWarper + multinomial, on the CPU and on a GPU (the lab judges it, benchmarks/ prints it).
GOAL = {"cpu": 1.5, "cuda": 3.0}


@dataclass(frozen=True)
class Config:
    """One distribution, four fates: greedy, temperature, top-k, top-p and min-p on a real next-token distribution,
    and what each costs.

    The model scores every token of its vocabulary (4,096 for tiny, 128,256 for Llama 3); a sampler turns the scores
    into one token. Greedy takes the argmax; temperature reshapes the softmax; top-k keeps a fixed number of tokens,
    top-p the smallest set holding p of the mass, min-p every token at least min_p times as likely as the best. The
    lab shows what each keeps of the model's real distribution (bar charts), how many tokens each keeps when the
    model is sure or unsure, what the text looks like (distinct-n, repetition, log-probability, entropy; a
    temperature sweep), and the latency of one sampling step, ours and Hugging Face's, at vocabularies up to 151,936
    and batches up to 128: top-p sorts the vocabulary, greedy reads it once ("top-p costs 9x greedy": reproduce or
    refute). A sorting-free top-p (FlashInfer's dual-pivot rejection, in torch) is checked to sample the same
    distribution (chi-square) and timed against the sort.
    """

    model: str = opt("tiny", short="-m", help="tiny | tiny-draft | a Hugging Face id or local path | arch:NAME "
                                              "(random weights: timing only).")  # real trained distributions, offline
    prompt: str = opt("The default value of the",
                      help="The prompt whose next-token distribution meets each strategy.")  # the tiny model's domain
    temperature: float = opt(0.8, help="Temperature of the 'temperature' strategy (> 0; 0 is greedy, shown "
                                       "anyway).")  # a common chat default: sharper than the raw distribution
    top_k: int = opt(40, help="k of top-k (>= 1).")  # the classic fixed cut (GPT-2 era default)
    top_p: float = opt(0.9, help="p of top-p, the mass kept, in (0, 1].")  # the classic nucleus
    min_p: float = opt(0.1, help="min-p: keep tokens with p >= min_p x p(top token), in [0, 1].")  # paper: 0.05-0.1
    bars: int = opt(12, help="Tokens shown per fate, the model's most likely ones.")
    passage_tokens: int = opt(128, help="Real-text positions of part 2's sure vs unsure (one forward pass).")
    samples: int = opt(8, help="Continuations per strategy for the quality table (>= 1).")  # enough distinct n-grams
    max_new_tokens: int = opt(40, help="Tokens per continuation (>= 2).")  # long enough for repetition to show
    temperatures: tuple[float, ...] = opt((0.3, 0.6, 1.0, 1.3, 1.6), help="Temperatures of the quality sweep, "
                                          "comma-separated (> 0).")  # below, at and above the raw distribution
    vocab_sizes: tuple[int, ...] = opt((0, 32000, 128256, 151936), help="Vocabulary sizes of the latency sweep, "
                                       "comma-separated (0 = the model's own).")  # Llama 2, Llama 3, Qwen 2.5
    batch_sizes: tuple[int, ...] = opt((1, 8, 32, 128), help="Batch sizes of the latency sweep, comma-separated "
                                       "(>= 1).")  # one user to a full serving batch
    chi2_samples: int = opt(4000, help="Draws of the distribution test (>= 100).")  # ~200 per bin of 5% mass
    latency_budget_s: float = opt(150.0, help="Seconds after which the latency sweep stops (and says where).")
    sample_budget_s: float = opt(0.25, help="Seconds of timed calls per (cell, sampler): at least 3 calls, at most "
                                            "50.")
    decode_repeats: int = opt(30, help="Timed decode steps of the model for the sampler's share (>= 3).")
    seed: int = 0

    def __post_init__(self):
        if self.temperature == 0:
            raise ValueError("temperature 0 is greedy decoding (always the most likely token), which the lab "
                             "already shows as 'greedy': give a temperature > 0")
        if not self.temperature > 0:
            raise ValueError(f"--temperature must be > 0, got {self.temperature}")
        if not isinstance(self.top_k, int) or self.top_k < 1:
            raise ValueError(f"--top-k must be a positive integer (the number of tokens kept), got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"--top-p must be in (0, 1] (the probability mass kept), got {self.top_p}")
        if not 0 <= self.min_p <= 1:
            raise ValueError(f"--min-p must be in [0, 1] (a fraction of the top token's probability), got {self.min_p}")
        if any(not t > 0 for t in self.temperatures):
            raise ValueError(f"temperatures must all be > 0 (0 is greedy), got {self.temperatures}")
        if self.samples < 1 or self.max_new_tokens < 2:
            raise ValueError("--samples must be >= 1 and --max-new-tokens >= 2")
        if any(v < 0 for v in self.vocab_sizes) or any(b < 1 for b in self.batch_sizes):
            raise ValueError("vocab sizes must be >= 0 (0 = the model's) and batch sizes >= 1")
        if self.sample_budget_s <= 0 or self.latency_budget_s <= 0 or self.decode_repeats < 3 or \
                self.chi2_samples < 100:
            raise ValueError("budgets must be > 0 s, decode_repeats >= 3 and chi2_samples >= 100")
        if not self.prompt.strip():
            raise ValueError("--prompt must not be empty")

    @classmethod
    def quick(cls) -> Config:
        return cls(
            passage_tokens=64, samples=4, max_new_tokens=12, temperatures=(0.5, 1.5),
            vocab_sizes=(0, 128256), batch_sizes=(1, 8), chi2_samples=2000, latency_budget_s=20.0,
            sample_budget_s=0.05, decode_repeats=10,
        )
