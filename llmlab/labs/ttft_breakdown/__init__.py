"""Lab: where time to first token goes — queueing, cold start, prompt length (prefill), RAG.

Two chatbots can take the same 4 s for an answer while one feels snappy: its first word arrives
in 200 ms. TTFT hides four layers, and this lab measures each on your machine:

1. one request, phase by phase (template + tokenize, queue, prefill, first sample + detokenize),
   each phase with its own stamps; then the attribution check: a known delay put into one
   component (the tokenizer, the model's forward, the detokenizer) must show up in its phase;
2. prompt length: prefill time from 16 tokens to --prompt-len against the napkin time, FLOPs
   (2 P T + 2 L d T^2) over a matmul rate measured at the same token count;
3. queueing: Poisson arrivals at rising utilisation (and a burst) in front of one FCFS worker,
   against M/D/1 on the same arrival times; a RAG request (BM25 + long context) next to the chat;
4. cold start in a fresh process: interpreter, imports, tokenizer, weights, device, first forward.

Every request comes from one trace source, `pipeline.time_request` (the in-process worker), as a
`loadgen.metrics.Trace`; everything after it reads only Traces. Streaming metrics follow vLLM's
benchmark_serving; llmlab/loadgen/metrics.py has the definitions and how GenAI-Perf, llmperf and
guidellm differ. With --endpoint the lab is another one, against a running server (endpoint.py).

Parts: config.py (the Config), local.py (the in-process parts), cold.py (the cold start),
pipeline.py (one request timed phase by phase), fits.py (TTFT against prompt length), verdicts.py
and report.py (the in-process verdicts and report), endpoint.py (the --endpoint lab, whole).

References:
- vLLM benchmarks/benchmark_serving.py (TTFT, TPOT, ITL, E2EL; Poisson arrivals, burstiness)
- Kleinrock, Queueing Systems vol. 1 (1975): M/D/1 and M/M/1 mean waits (Pollaczek-Khinchine)
- Kaplan et al. (2020), "Scaling Laws for Neural Language Models": 2 N FLOPs per token forward
- Robertson & Zaragoza (2009), BM25
"""


from __future__ import annotations

from llmlab.core.device import Device
from llmlab.core.results import LabResult
from llmlab.labs import endpoint_hooks
from llmlab.labs.ttft_breakdown import endpoint, local, report, verdicts
from llmlab.labs.ttft_breakdown.cold import ColdWeights
from llmlab.labs.ttft_breakdown.config import Config
from llmlab.labs.ttft_breakdown.fits import growth_fit
from llmlab.labs.ttft_breakdown.local import Ctx, _sweep_lengths, attribution, napkin_flops
from llmlab.labs.ttft_breakdown.report import figures
from llmlab.labs.ttft_breakdown.verdicts import HARNESS_PCT

LAB = "ttft-breakdown"
VERSION = 2  # 2: the attribution check, the matmul rate per prompt length, one row per request
JUDGE_VERSION = 1  # --endpoint runs are told apart by config.endpoint (their own tables and claims)


def check(cfg: Config) -> Config:
    """Before the run starts: an endpoint must answer, speak OpenAI's API and stream (else one line, exit 2).
    Returns the Config with what it found, for run()."""
    return endpoint.discover(cfg) if cfg.endpoint else cfg


def run(cfg: Config, device: Device, progress=None) -> LabResult:
    """Measures. Fills tables, env, notes, skipped. Never prints, never judges."""
    res = LabResult.new(LAB, VERSION, cfg.saved())
    with res.guard():
        if cfg.endpoint:  # a running server: the client's stamps joined to the server's own phases
            endpoint.measure(cfg, res, progress)
        else:
            local.measure(cfg, device, res, progress)
    return res


judge, views, headline, exit_code = endpoint_hooks(endpoint, verdicts, report)  # by config.endpoint


__all__ = ["HARNESS_PCT", "JUDGE_VERSION", "LAB", "VERSION", "ColdWeights", "Config", "Ctx", "_sweep_lengths",
           "attribution", "check", "exit_code", "figures", "growth_fit", "headline", "judge", "napkin_flops", "run",
           "views"]
