"""Lab: serving: batching, concurrency, KV capacity, prefix reuse, chunked prefill, cost per token.

The series' production half, measured on llmlab's own paged, continuously batching engine
(llmlab.serving.engine.llm_engine, checked against HF at every computed position before any timing), or on
any OpenAI-compatible server with --endpoint URL (part 1, the concurrency sweep; the others need the engine's
internals).

The model: the built-in `tiny` on a CPU. On CUDA the default `tiny` (23 MB) would sit in the GPU's
L2, where decode is not memory-bound as it is for a real model, so the engine's parts run an `arch:`
model (random weights: timings only) in BF16, as many of its layers as fit in half the free memory;
the output names it and its weights' size against the L2.

Parts:
1. concurrency sweep, closed loop (N clients, each sends its next request when the last ends):
   output tokens/s, TTFT / ITL / TPOT p50 and p99 (vLLM bench serve's definitions: the engine's
   per-request stamps go through the same `calculate_metrics` as an HTTP client's), step time vs
   decodes per step, and per level: compute utilisation (2 N FLOPs per token x tokens/s over peak),
   bandwidth utilisation (weights + KV read per step / step time over the bandwidth) and the device's
   own busy reading (NVML utilisation on a GPU; CPU time over wall time on a CPU): one request at a
   time leaves the FLOPs unused while the device looks busy.
2. static vs continuous batching under Poisson arrivals with mixed output lengths: static at its best
   (dynamic fill: whatever is queued when the engine is idle, up to B, after a max wait swept from 0),
   TTFT p50/p99, and static batching's wasted slots (finished-but-waiting rows) from the step records.
3. KV capacity: pools of several sizes at fixed weights, many long conversations; the peak of running
   sequences against blocks / blocks per conversation, and the preemptions past it; Llama 2 7B vs
   Llama 3 8B on an 80 GB GPU by formula.
4. prefix reuse: N requests sharing a system prompt of L tokens, prefix cache off and on.
5. chunked prefill: the ITL of running decodes while a long prompt is prefilled in one step vs in chunks.
6. cost per token: price per hour / (3600 x tokens/s) at each concurrency, against the decode step's
   price shared by its decodes; a whole training run (6 N D, napkin) against a year of serving the
   same model at the compute use measured here, and the tokens served where the two cross.

References: vLLM benchmarks/serve.py (metric definitions); "Inside vLLM: Anatomy of a
High-Throughput LLM Inference System" (2025: the step-time knee, chunked prefill); Orca (OSDI '22,
iteration-level scheduling); vLLM docs "Optimization and Tuning: chunked prefill" and
"Disaggregated prefilling"; nano-vllm.

Layout: `config` (the Config), `model` (what the engine runs), `drivers` (clients and arrivals), `lab`
(run, check, parts 1 and 6), `scheduling` (parts 2-5), `endpoint` (--endpoint), `cost` (part 6's
rows), `verdicts` (judge, headline), `report` (views).
"""

from llmlab.core.lazy import lazy
from llmlab.labs.serving.config import BLOCK, JUDGE_VERSION, LAB, VERSION, Config

_PARTS = {  # name -> the submodule that defines it; imported on first use (the parts load torch)
    **dict.fromkeys(("check", "part_concurrency", "part_exact", "run"), "lab"),
    **dict.fromkeys(("headline", "judge"), "verdicts"),
    "views": "report",
    **dict.fromkeys(("arch_model", "speed_model"), "model"),
    **dict.fromkeys(("busy_reading", "records"), "drivers"),
    **dict.fromkeys(("part_capacity", "part_prefix", "part_static"), "scheduling"),
    "part_endpoint": "endpoint",
}
__getattr__ = lazy(__name__, _PARTS)
__all__ = ["BLOCK", "JUDGE_VERSION", "LAB", "VERSION", "Config", *_PARTS]
