"""Lab `kvcache-growth`: watch the KV cache (the model's notebook) grow, and what it costs.

Four parts, in reading order:
1. the formula: bytes per token = 2 (K and V) x layers x kv_heads x head_dim x bytes per element,
   with GQA/MQA (kv_heads < heads), sliding windows (Mistral caps the cache at its window) and
   cache dtypes FP32, FP16/BF16, FP8 and 4-bit (plus the bytes of its scales);
2. the real cache: run the model, grow the sequence, sum the bytes of `cache.layers[i].keys/.values`
   at each length and compare with the formula (exactly); a preallocated StaticCache beside the
   growing DynamicCache; on a GPU also the allocator's view (`memory_allocated`, peak);
3. the registry side by side (Llama-2-7B MHA vs Llama-3-8B GQA ...): KiB/token, GiB at 4k/32k/128k,
   and how many tokens / concurrent requests fit on this device after the weights (what vLLM prints
   at start-up as "GPU KV cache size" and "Maximum concurrency");
4. the quadratic trap: greedy generation with the cache and without it (recomputing the whole prefix
   every step), time per token and total time, and a least-squares fit of total time vs n.

Parts: config.py (the Config), formula.py (1), cache.py (2), registry.py (3), quadratic.py (4),
verdicts.py (claims and headline), report.py (views and figures).

References:
- "Transformer Inference Arithmetic" (kipp.ly): KV bytes per token = 2 * n_layers * n_kv_heads * d_head * bytes.
- GQA: Ainslie et al. 2023, arXiv:2305.13245; MQA: Shazeer 2019, arXiv:1911.02150.
- Mistral 7B (arXiv:2310.06825): sliding-window attention, a rolling cache of `window` tokens.
- transformers 5.x cache_utils: DynamicLayer (torch.cat per step), DynamicSlidingWindowLayer (keeps the
  last window-1 tokens), StaticLayer (preallocated max_cache_len).
- vLLM `gpu_memory_utilization` (0.9 by default) and its start-up lines "GPU KV cache size: N tokens",
  "Maximum concurrency for L tokens per request: Xx".
- KIVI (arXiv:2402.02750) and HF QuantizedCache: 2/4-bit caches with one scale per group of values;
  vLLM `--kv-cache-dtype fp8`: FP8 E4M3 with a per-tensor scale.
"""

from __future__ import annotations

from llmlab.core import models
from llmlab.core.device import Device
from llmlab.core.results import LabResult
from llmlab.core.timing import Stopwatch
from llmlab.labs.kvcache_growth.cache import allocator_rows, measure_cache_rows, part_real_cache, sliding_window_rows
from llmlab.labs.kvcache_growth.config import Config
from llmlab.labs.kvcache_growth.formula import (
    attention_kind,
    cache_dtype,
    cached_tokens,
    kv_bytes,
    kv_cache_bytes,
    kv_elems_per_token,
    sliding_window,
)
from llmlab.labs.kvcache_growth.quadratic import (
    fit_total_time,
    generate_with_cache,
    generate_without_cache,
    is_quadratic,
    part_trap,
    trap,
    trap_setup,
    trap_tokens,
)
from llmlab.labs.kvcache_growth.registry import measured_kv_per_token, part_registry, registry_rows
from llmlab.labs.kvcache_growth.report import figures, views
from llmlab.labs.kvcache_growth.verdicts import headline, judge

LAB = "kvcache-growth"
VERSION = 3  # 3: kv_growth table (the terminal chart); 2: the crossing judged from the measured rows
JUDGE_VERSION = 1


def run(cfg: Config, device: Device, progress=None) -> LabResult:
    """Measures. Fills tables, env, notes, skipped. Never prints, never judges."""
    res = LabResult.new(LAB, VERSION, cfg)
    res.judge_version = JUDGE_VERSION
    with res.guard():
        lm = models.load(cfg.model, device, cfg.dtype or ("bfloat16" if device.is_cuda else "float32"))
        model = lm.model
        weights_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
        res.env["model"] = dict(ref=cfg.model, kind=lm.kind, n_params=lm.n_params, weights_bytes=weights_bytes,
                                dtype=str(next(model.parameters()).dtype).removeprefix("torch."),
                                timing_only=lm.timing_only, kv_elems_per_token=kv_elems_per_token(model.config))
        if lm.timing_only:
            res.note(f"{cfg.model} has random weights: its figures are timings and sizes, never a quality claim")
        sw = Stopwatch()
        res.env["phases_ms"] = sw.phases_ms  # host wall time of each part
        with sw.phase("real_cache"):
            part_real_cache(res, model, device, cfg, weights_bytes, progress)
        with sw.phase("registry"):
            part_registry(res, model, device, cfg, progress)
        with sw.phase("quadratic_trap"):
            part_trap(res, model, device, cfg, progress)
    return res


__all__ = ["JUDGE_VERSION", "LAB", "VERSION", "Config", "allocator_rows", "attention_kind", "cache_dtype",
           "cached_tokens", "figures", "fit_total_time", "generate_with_cache", "generate_without_cache", "headline",
           "is_quadratic", "judge", "kv_bytes", "kv_cache_bytes", "measure_cache_rows", "measured_kv_per_token",
           "registry_rows", "run", "sliding_window", "sliding_window_rows", "trap", "trap_setup", "trap_tokens",
           "views"]
