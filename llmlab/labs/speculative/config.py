"""The speculative lab's Config and the bars its claims are judged against (no torch: the CLI imports it)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from llmlab.core.config import opt

LAB = "speculative"
VERSION = 2  # 2: one interleaved set for speed and the gamma sweep; B = 1 distribution loop; same-budget policies/tree
JUDGE_VERSION = 1
GOAL_VS_PLAIN, GOAL_VS_HF_ASSISTED = 1.3, 1.25  # the performance goal (greedy, built-in pair, CPU)
GOAL_LOOKUP_GROUNDED, GOAL_LOOKUP_CONTROL, GOAL_LOOKUP_VS_HF = 1.5, 0.95, 1.1  # prompt lookup's goals (greedy)
COPY_TOKENS, COPY_MIN = 64, 0.8  # a model "copies" when it predicts >= 80% of a just-read 64-token passage's repeat
VERIFY_FREE = 1.25  # "nearly free": a forward over 4 tokens costs at most 1.25 single-token forwards
PREDICTION_TOLERANCE = 0.2  # "within 20% of Leviathan's prediction"
BEST_GAMMA_OUTSIDE = 2  # the best-gamma claim is judged when >= 2 swept gammas lie beyond one step of the best
TREE_TOL = 1e-3  # max |logit| difference between a tree forward and a plain forward of the path (FP32)
DIST_TOKENS = 4  # the distribution test's output length: gamma 3 drafts positions 1-3, the bonus lands on 4
ENDPOINT = "Against running servers"  # the --help group of the --endpoint options


@dataclass(frozen=True)
class Config:
    """Speculative decoding: a small draft guesses gamma tokens, the target checks them all in one forward, and the
    output stays exactly the target's.

    Decoding is one target forward per token. A draft ~5x cheaper proposes gamma tokens; the target scores all
    gamma + 1 positions at once, keeps the longest accepted prefix plus one token of its own, and the caches are
    cropped past the first rejection. Greedy: accept while the draft equals the target's argmax. Sampling: accept
    a token with probability min(1, p/q) and at the first rejection draw from norm(max(0, p - q)) (Leviathan et
    al., Chen et al.), which makes the output distributed exactly as the target's. This lab proves that (greedy
    token-for-token identity, a chi-square test against the target's exact law), then measures tokens/s of plain
    decoding (our loop, HF generate) and speculative decoding (ours, HF assisted generation with the same draft
    and gamma), the acceptance rate alpha, tokens per round tau, beta = sum min(p, q), the draft/target cost ratio
    c, and sets Leviathan's predicted speed-up (1 - alpha^(gamma+1)) / ((1 - alpha)(gamma c + 1)) beside the
    measured one; then sweeps gamma 1..8 and temperature, compares draft-length policies (constant, +2/-1,
    confidence, oracle), a token tree verified in one forward with a tree attention mask, and batch sizes.
    """

    # the target: the built-in trained pair loads offline in seconds
    model: str = opt("tiny", flag="--model", short="-m",
                     help="The target: tiny | a Hugging Face id or local path (a trained model with a tokenizer).")
    # same tokenizer, ~0.2-0.3 of the target's cost per token
    draft: str = opt("tiny-draft", help="The draft model (same tokenizer as --model): tiny-draft | a Hugging Face id "
                                        "or local path.")
    # Leviathan's optimum for alpha ~0.7, c ~0.2 is 3-5
    gamma: int = opt(4, help="Tokens drafted per round (>= 1).")
    # 0 = greedy: the performance goal and the identity check are greedy
    temperature: float = opt(0.0, help="Sampling temperature of the main comparison (>= 0; 0 = greedy).")
    top_k: int = opt(0, help="Top-k, applied to the target's p and the draft's q alike (0 = off).")
    top_p: float = opt(1.0, help="Top-p (nucleus), applied to p and q alike, in (0, 1] (1 = off).")
    # long enough for ~10 rounds, short enough for many repeats
    new_tokens: int = opt(48, help="New tokens per prompt (>= 2).")
    # prose and code differ
    prompts: int = opt(4, help="Prompts (1..32): held-out windows of the built-in pair's corpus, else built-in "
                               "Python prompts.")
    repeats: int = opt(5, help="Interleaved timed rounds of the speed part and the gamma sweep (>= 1); a speed-up is "
                               "the median of per-round ratios.")
    sweep_repeats: int = opt(3, help="Timed rounds of the temperature, policy, tree and batch parts (0: count "
                                     "only, no timing).")
    # past the optimum the extra guesses are wasted
    gammas: tuple[int, ...] = opt((1, 2, 3, 4, 5, 6, 7, 8), help="Gammas of the sweep, comma-separated (each >= 1).")
    # greedy, a chat default, the raw distribution
    temperatures: tuple[float, ...] = opt((0.0, 0.7, 1.0), help="Temperatures of the acceptance sweep (counted "
                                                               "alpha vs beta), comma-separated (each >= 0).")
    confidence: float = opt(0.6, help="The confidence policy stops drafting once the draft's top probability falls "
                                      "below this, in (0, 1).")
    # 14 nodes, as deep as the default chain
    tree: tuple[int, ...] = opt((2, 2, 1, 1), help="Children per depth of the token tree, comma-separated "
                                                   "(each >= 1).")
    tree_sampled: bool = opt(True, help="Also compare tree and chains sampled (SpecInfer: children drawn from q), "
                                        "at --temperature or 1.")
    batch_sizes: tuple[int, ...] = opt((1, 2, 4, 8), help="Batch sizes of the batch sweep, comma-separated (each "
                                                          ">= 1; distinct prompts of one length, no padding; none "
                                                          "skips it).")
    batch_tokens: int = opt(32, help="New tokens per row in the batch sweep (>= 2).")
    dist_samples: int = opt(600, help="B = 1 sampled runs (one seed each) per method of the distribution test "
                                      "(>= 50).")
    # 3^4 = 81 cells at most
    dist_top_k: int = opt(3, help="The distribution test's support per token, top-k (>= 2; k^4 outcome cells at "
                                  "most).")
    cost_samples: int = opt(40, help="Alternating timed samples of each forward shape for the draft/target cost "
                                     "ratio c and the verify cost (>= 3).")
    # HF's default too; the best of the bench sweep
    lookup_max_ngram: int = opt(2, help="Prompt lookup: the longest suffix n-gram matched (>= --lookup-min-ngram).")
    # 1 lets a repeated token find its continuation
    lookup_min_ngram: int = opt(1, help="Prompt lookup: the shortest suffix n-gram matched (>= 1).")
    # the bench sweep's best on a 2-core CPU (HF defaults to 10)
    lookup_tokens: int = opt(4, help="Prompt lookup: tokens drafted on a match (>= 1).")
    workload_prompts: int = opt(2, help="Standard-library functions per input-grounded workload, quote and edit "
                                        "(0 skips both).")
    verify_ks: tuple[int, ...] = opt(tuple(range(1, 17)), help="Token counts k of the verify-cost curve (a target "
                                                               "forward over k tokens), comma-separated, from k = 1.")
    verify_samples: int = opt(9, help="Alternating timed samples of each k of the verify-cost curve, per regime "
                                      "(>= 3).")
    dram_arch: str = opt("qwen2.5-0.5b", help="The DRAM regime's architecture: random weights, cut or extended to "
                                              "enough layers (see --dram-llc-multiple).")
    dram_llc_multiple: int = opt(8, help="The DRAM regime's weights are at least this many times the last-level "
                                         "cache (>= 1).")
    # past the cap the regime is not measured
    dram_max_mb: int = opt(0, help="The largest DRAM-regime model to build, in MB (0: no cap; never over half the "
                                   "free memory).")
    gpu_arch: str = opt("llama-3-8b", help="CUDA only: the architecture of the timed pair (random weights), sized "
                                           "from the device's free memory and L2.")
    # ops this small gain nothing from more
    threads: int = opt(1, help="CPU only: torch threads (0 keeps torch's default).")
    seed: int = 0
    endpoint: str | None = opt(None, panel=ENDPOINT,
                               help="Measure speculative decoding on a running OpenAI-compatible server "
                                    "(http://host:port: vLLM with --speculative-config, llama.cpp's llama-server "
                                    "with -md, ...) against --baseline, the same model served without it: the same "
                                    "prompts (quote, edit, open), greedy, one request at a time, the two servers "
                                    "alternated; decode tokens/s, time per output token, TTFT, and whether the texts "
                                    "are identical. Runs instead of the in-process lab; --model names the served "
                                    "model.")
    baseline: str | None = opt(None, panel=ENDPOINT,
                               help="With --endpoint: the same model on a server without speculative decoding "
                                    "(http://host:port; required with --endpoint).")
    request_timeout: float = opt(120.0, panel=ENDPOINT, help="With --endpoint: seconds before a request counts as "
                                                             "failed (> 0).")
    api_key_env: str = opt("OPENAI_API_KEY", panel=ENDPOINT,
                           help="With --endpoint: the NAME of the environment variable holding the API key of both "
                                "servers (the key itself is never written anywhere).")
    # What check() found at --endpoint and --baseline (two loadgen.probe.Server), for run() to measure without
    # asking again. Not an option and never saved: it holds the request headers (the API key).
    endpoint_found: object | None = dataclasses.field(default=None, repr=False, compare=False,
                                                      metadata={"found": True})

    def __post_init__(self):
        if not isinstance(self.gamma, int) or self.gamma < 1:
            raise ValueError(f"--gamma must be a positive integer (tokens drafted per round), got {self.gamma}")
        if not self.temperature >= 0:
            raise ValueError(f"--temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if any(not t >= 0 for t in self.temperatures):
            raise ValueError(f"--temperatures must all be >= 0, got {self.temperatures}")
        if not self.gammas or any(g < 1 for g in self.gammas) or any(b < 1 for b in self.batch_sizes) \
                or any(k < 1 for k in self.tree):
            raise ValueError("--gammas (at least one), --batch-sizes and --tree branching must all be >= 1")
        if self.top_k < 0 or not 0 < self.top_p <= 1:
            raise ValueError(f"--top-k must be >= 0 and --top-p in (0, 1], got {self.top_k}, {self.top_p}")
        if not 1 <= self.prompts <= 32:
            raise ValueError(f"--prompts must be 1..32, got {self.prompts}")
        if self.new_tokens < 2 or self.batch_tokens < 2 or self.repeats < 1 or self.sweep_repeats < 0:
            raise ValueError("--new-tokens and --batch-tokens must be >= 2, --repeats >= 1, --sweep-repeats >= 0")
        if not 0 < self.confidence < 1 or self.dist_samples < 50 or self.dist_top_k < 2 or self.threads < 0:
            raise ValueError("--confidence must be in (0, 1), --dist-samples >= 50, --dist-top-k >= 2, "
                             "--threads >= 0")
        if self.cost_samples < 3:
            raise ValueError("--cost-samples must be >= 3")
        if not 1 <= self.lookup_min_ngram <= self.lookup_max_ngram or self.lookup_tokens < 1:
            raise ValueError("prompt lookup needs 1 <= --lookup-min-ngram <= --lookup-max-ngram and "
                             f"--lookup-tokens >= 1, got {self.lookup_min_ngram}, {self.lookup_max_ngram}, "
                             f"{self.lookup_tokens}")
        if not self.verify_ks or min(self.verify_ks) != 1 or self.verify_samples < 3 or self.dram_llc_multiple < 1 \
                or self.dram_max_mb < 0:
            raise ValueError("--verify-ks must start at k = 1, --verify-samples >= 3, --dram-llc-multiple >= 1, "
                             "--dram-max-mb >= 0")
        if (self.endpoint is None) != (self.baseline is None):
            raise ValueError("--endpoint and --baseline go together: the server with speculative decoding and the "
                             "same model served without it")
        for name, url in (("--endpoint", self.endpoint), ("--baseline", self.baseline)):
            if url is not None and not url.startswith(("http://", "https://")):
                raise ValueError(f"{name} {url!r}: give an http(s) URL, e.g. http://127.0.0.1:8000")
        if self.endpoint is not None and self.endpoint.rstrip("/") == self.baseline.rstrip("/"):
            raise ValueError("--endpoint and --baseline are the same URL: give the server without speculative "
                             "decoding as --baseline")
        if not self.request_timeout > 0:
            raise ValueError(f"--request-timeout must be > 0 seconds, got {self.request_timeout}")
        if self.workload_prompts < 0:
            raise ValueError("--workload-prompts must be >= 0 (0 skips the quote and edit workloads)")

    @classmethod
    def quick(cls) -> Config:
        """The demo: 3 prompts x 32 tokens x 3 timed rounds for speed (stable to a few %), gamma 2, 4 and 6,
        the other parts counted once (no timing), no batch sweep, a DRAM regime of at most 2 GB (24 forwards
        stream it: a few seconds each on one core); about 55 s on an idle 2-core CPU."""
        return cls(new_tokens=32, prompts=3, repeats=3, sweep_repeats=0, gammas=(2, 4, 6), temperatures=(1.0,),
                   tree_sampled=False, batch_sizes=(), dist_samples=60, dist_top_k=2, cost_samples=15,
                   workload_prompts=1, verify_ks=(1, 4, 8, 16), verify_samples=5, dram_max_mb=2000)
