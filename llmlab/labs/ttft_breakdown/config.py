"""The ttft lab's Config: light imports only (the CLI reads every lab's Config for `llmlab --help`)."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from llmlab.core.config import flag_of, opt

ENDPOINT = "Against a running server"  # the --help group of the --endpoint options


@dataclass(frozen=True)
class Config:
    """Where time to first token goes: queueing, cold start, prompt length (prefill), RAG. Also: llmlab ttft.

    Two chatbots can take the same 4 s per answer and one feels snappy: its first word arrives in
    200 ms. TTFT hides four layers. This lab serves streaming requests with one real worker and
    stamps every phase (template + tokenize, queue wait, prefill forward, first sample + detokenize,
    then each decode step), checks that the phases add up to the TTFT the client measured and reports
    the harness's own remainder; starts the model in a fresh process (interpreter, imports, weights,
    device, first forward) against the same request warm; sweeps the prompt from 16 tokens to
    --prompt-len and fits a + bT + cT^2 (where attention's T^2 takes over); sends Poisson arrivals at
    rising utilisation and a burst to one first-come-first-served worker and sets the queue waits
    (p50/p90/p99) beside M/D/1; and adds a real BM25 retrieval over the built-in corpus (RAG) next to
    the plain chat. Metrics follow vLLM's benchmark (TTFT, TPOT = (E2E - TTFT)/(n - 1), ITL, E2E),
    with how GenAI-Perf, llmperf and guidellm define theirs; the diagnosis names the layer that
    dominates this run.

    With --endpoint URL the same questions go to a running server, from the outside: every streamed
    chunk is stamped (vLLM bench serve's definitions), prompts have an exact token count through the
    server's /tokenize (else calibrated from usage), and the server's own phases are joined per
    request from its `timings` (llmlab serve, llama.cpp) or from vLLM-style /metrics histograms.
    Parts: one request alone as a waterfall; a prompt-length sweep with TTFT = a + bT (the prefill
    rate); a prefix probe (one long prefix twice; the drop is the prefix cache, checked against
    cache_n or the prefix-cache counters); and a load run (--concurrency, --request-rate,
    --burstiness; warm-up excluded) with p50/p90/p99 TTFT, TPOT, ITL, E2EL. --model names the served
    model (default: the server's first). Failed requests are kept with their error; if every request
    fails the run exits 3. Example: llmlab serve & llmlab ttft --endpoint http://127.0.0.1:8000 --quick
    """

    model: str = opt("tiny", flag="--model", short="-m",  # the built-in trained pair's target: offline in seconds
                     help="tiny | tiny-draft | a Hugging Face id or local path | arch:NAME (random weights: timing "
                          "only); with --endpoint, the served model's name (the server's first when it serves no "
                          "such model).")
    prompt_len: int = opt(4096, help="Longest prompt of the sweep, in tokens (> 0; the sweep runs 16..this; beyond "
                                     "the model's context it is clamped with a notice).")  # the article's 4096
    sweep_points: int = opt(7, help="Prompt lengths of the sweep, geometric from 16 to --prompt-len (>= 1).")
    # a curve, not two points
    sweep_repeats: int = opt(3, help="TTFT samples per prompt length (>= 1): median, p10/p90.")
    sweep_max_s: float = opt(30.0, help="Seconds after which a prompt length stops repeating (> 0; at least one "
                                        "sample).")
    chat_repeats: int = opt(7, help="Warm repeats of the plain chat and the RAG request (>= 1).")
    new_tokens: int = opt(16, help="Tokens streamed per request (>= 2).")  # TPOT and ITL need at least 2
    # ~8x a warm tiny chat TTFT on an idle 2-core CPU, so its 10% (10 ms) stands above the jitter of the
    # fastest of a few samples of any other phase
    attribution_delay_ms: float = opt(100.0, help="The known delay put into one component by the attribution "
                                                  "check, in ms (> 0).")
    attribution_repeats: int = opt(5, help="Plain/delayed request pairs per injected phase (>= 1; the fastest of "
                                           "each is compared).")
    utilizations: tuple[float, ...] = opt((0.3, 0.5, 0.7, 0.8, 0.9, 0.95), flag="--utilization",
                                          help="Target utilisation rho (comma-separated or repeated, in (0, 2)): "
                                               "rate = rho / the measured service time.")
    rates: tuple[float, ...] = opt((), flag="--rate", help="Arrival rate in requests/s (comma-separated or repeated, "
                                                          "> 0): replaces the utilisation sweep.")
    # bounded, so rho = 0.95 still ends in about n x service / rho
    requests_per_rate: int = opt(30, flag="--requests", help="Requests per arrival rate (>= 2).")
    burst: int = opt(12, help="Requests that arrive at the same instant (0 = skip).")
    rag_top_k: int = opt(6, help="BM25 passages put into the RAG prompt (>= 1).")
    rag_context_tokens: int = opt(1536, help="Token budget of the retrieved context (>= 16; ~4 characters per "
                                             "token).")
    cold_starts: int = opt(3, help="Cold starts in fresh processes (0 = skip; each takes seconds).")
    threads: int = opt(0, help="torch CPU threads; 0: torch's, or 1 when the CPU is oversubscribed (load average "
                               ">= cores).")
    seed: int = 0  # arrival schedules and the M/D/1 simulation
    endpoint: str | None = opt(None, panel=ENDPOINT,
                               help="Measure a running OpenAI-compatible server (http://host:port: vLLM, SGLang, "
                                    "TGI, llama.cpp, llmlab serve) instead of the in-process worker: its TTFT split "
                                    "into client + network, server queue, prefill and first decode where it reports "
                                    "them, its prefill rate, its prefix cache, and latency under load.")
    concurrency: int = opt(8, panel=ENDPOINT, help="With --endpoint: requests in flight at most during the load part "
                                                   "(>= 1).")
    request_rate: float = opt(math.inf, panel=ENDPOINT,
                              help="With --endpoint: arrivals per second of the load part (> 0; inf: no limit, "
                                   "concurrency alone).")
    burstiness: float = opt(1.0, panel=ENDPOINT, help="With --request-rate: gamma shape of the gaps (> 0): 1 = "
                                                      "Poisson, < 1 burstier, > 1 more even.")
    load_requests: int = opt(32, flag="--num-requests", panel=ENDPOINT,
                             help="With --endpoint: requests of the load part (0 = skip).")
    warmup: int = opt(2, panel=ENDPOINT, help="With --endpoint: requests sent first and left out of every table "
                                              "(>= 0).")
    prefix_probes: int = opt(3, panel=ENDPOINT, help="With --endpoint: pairs of requests sharing one long prefix "
                                                     "(0 = skip).")
    request_timeout: float = opt(60.0, panel=ENDPOINT, help="With --endpoint: seconds before a request counts as "
                                                            "failed (> 0).")
    api_key_env: str = opt("OPENAI_API_KEY", panel=ENDPOINT,
                           help="With --endpoint: the NAME of the environment variable holding the API key (the "
                                "key itself is never written anywhere).")
    tokenizer: str | None = opt(None, panel=ENDPOINT,
                                help="With --endpoint: a tokenizer (tiny | a Hugging Face id or path) to count "
                                     "output tokens when the server sends no usage.")
    # What check() found at --endpoint (a loadgen.probe.Server), for run() to measure without asking again.
    # Not an option and never saved: it holds the request headers (the API key).
    endpoint_found: object | None = dataclasses.field(default=None, repr=False, compare=False,
                                                      metadata={"found": True})

    def __post_init__(self):
        if self.endpoint is not None and not self.endpoint.startswith(("http://", "https://")):
            raise ValueError(f"--endpoint {self.endpoint!r}: give an http(s) URL, e.g. http://127.0.0.1:8000")
        if self.concurrency < 1:
            raise ValueError(f"--concurrency must be at least 1 request in flight, got {self.concurrency}")
        if not self.request_rate > 0:
            raise ValueError(f"--request-rate must be > 0 requests/s (leave it out for no limit), "
                             f"got {self.request_rate}")
        if not self.burstiness > 0:
            raise ValueError(f"--burstiness must be > 0 (1 = Poisson), got {self.burstiness}")
        if not self.request_timeout > 0:
            raise ValueError(f"--request-timeout must be > 0 seconds, got {self.request_timeout}")
        if self.prompt_len < 1:
            raise ValueError(f"--prompt-len must be a positive number of tokens, got {self.prompt_len}")
        bad = [r for r in self.rates if not r > 0]
        if bad:
            raise ValueError(f"--rate: an arrival rate must be > 0 requests/s, got {bad[0]}")
        bad = [u for u in self.utilizations if not 0 < u < 2]
        if bad:
            raise ValueError(f"--utilization: a utilisation must be in (0, 2), got {bad[0]}")
        if not self.sweep_max_s > 0:
            raise ValueError(f"--sweep-max-s must be > 0 seconds, got {self.sweep_max_s}")
        if not self.attribution_delay_ms > 0:
            raise ValueError(f"--attribution-delay-ms must be > 0, got {self.attribution_delay_ms}")
        if not (self.rates or self.utilizations):
            raise ValueError("give at least one arrival rate (--rate) or utilisation (--utilization)")
        fields = {f.name: f for f in dataclasses.fields(self)}
        for name, lo in (("new_tokens", 2), ("threads", 0), ("requests_per_rate", 2), ("sweep_points", 1),
                         ("sweep_repeats", 1), ("chat_repeats", 1), ("rag_top_k", 1), ("rag_context_tokens", 16),
                         ("burst", 0), ("cold_starts", 0), ("attribution_repeats", 1), ("load_requests", 0),
                         ("warmup", 0), ("prefix_probes", 0)):
            if getattr(self, name) < lo:
                raise ValueError(f"{flag_of(fields[name])} must be at least {lo}, got {getattr(self, name)}")

    @classmethod
    def quick(cls) -> Config:
        # 1,024 tokens: 16x less prefill than 4,096, still long enough that compute dominates (the napkin claim)
        return cls(prompt_len=1024, sweep_points=4, sweep_repeats=2, sweep_max_s=1.5, chat_repeats=3, new_tokens=8,
                   utilizations=(0.3, 0.95), requests_per_rate=16, burst=6, rag_top_k=4, rag_context_tokens=512,
                   cold_starts=1, attribution_repeats=4, concurrency=4, load_requests=12, prefix_probes=2)

    def saved(self) -> dict:
        """The Config as a result keeps it: every option, never what check() found (it holds the API key)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if not f.metadata.get("found")}
