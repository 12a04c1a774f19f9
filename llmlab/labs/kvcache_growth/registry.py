"""The registry side by side (Llama-2-7B MHA vs Llama-3-8B GQA ...): KiB per token, GiB at 4k/32k/128k, and how
many tokens and concurrent requests fit on this device after the weights (vLLM's "GPU KV cache size" and
"Maximum concurrency" at start-up), each model's bytes per token measured on a skeleton's real cache.

torch, transformers and llmlab.inference are imported inside the functions that use them: `llmlab --help`
imports this package (for its Config) and must not pay for them.
"""

from __future__ import annotations

import math

from llmlab.core.device import Device
from llmlab.core.models import ARCHS, arch_config, estimate_bytes
from llmlab.core.render import track
from llmlab.core.results import LabResult
from llmlab.labs.kvcache_growth.cache import grow, random_ids, skeleton_config, skeleton_model
from llmlab.labs.kvcache_growth.config import Config
from llmlab.labs.kvcache_growth.formula import (
    CACHE_DTYPES,
    GiB,
    KiB,
    attention_kind,
    attn_shape,
    cache_dtype,
    cache_tensor_bytes,
    cached_tokens,
    kv_bytes,
    sliding_window,
)


def measured_kv_per_token(name: str, tokens: int = 8) -> float:
    """Bytes per token of a real HF cache, from the registry model's BF16 skeleton run over `tokens`."""
    from llmlab.inference.decode import new_cache

    config = skeleton_config(name)
    model = skeleton_model(config, "bfloat16")
    cache = new_cache(model)
    ids = random_ids(config.vocab_size, 1, tokens, 0, "cpu")
    for _ in grow(model, cache, ids, [tokens]):
        pass
    return cache_tensor_bytes(cache)[0] / tokens


def registry_rows(cfg: Config, device: Device, extra: dict | None = None, progress=None) -> list[dict]:
    """One row per registry model (and the lab's --model): formula, skeleton measurement, capacity."""
    dt = cache_dtype(cfg.cache_dtype)
    total = device.total_memory_bytes()
    entries = [(n, arch_config(n)) for n in ARCHS]
    if extra:
        entries.insert(0, (extra["name"], extra["config"]))
    rows = []
    for name, config in track(progress, entries, "registry: formula + skeleton caches"):
        s = attn_shape(config)
        window = sliding_window(config)
        per_tok = kv_bytes(config, dt)
        measured = measured_kv_per_token(name) if name in ARCHS else extra.get("measured_bf16_per_token", math.nan)
        weights = estimate_bytes(config, "bfloat16")
        budget = cfg.memory_utilization * total - weights
        ctx = cfg.concurrency_context
        per_request = cached_tokens(ctx, window) * per_tok
        row = dict(
            model=name, attention=attention_kind(s["heads"], s["kv_heads"]), layers=s["layers"], heads=s["heads"],
            kv_heads=s["kv_heads"], head_dim=s["head_dim"], window=window or 0,
            max_context=getattr(config, "max_position_embeddings", 0),
            bf16_KiB_per_token=kv_bytes(config, 2) / KiB, measured_bf16_KiB_per_token=measured / KiB,
            cache_dtype=dt.name, KiB_per_token=per_tok / KiB,
        )
        for c in cfg.contexts:
            row[f"GiB_at_{context_label(c)}"] = cached_tokens(c, window) * per_tok / GiB
        row.update(
            weights_bf16_GiB=weights / GiB,
            cache_outweighs_weights_at_tokens=math.ceil(weights / per_tok),
            weights_fit=budget > 0,
            kv_budget_GiB=max(budget, 0) / GiB,
            kv_cache_tokens=int(max(budget, 0) // per_tok),
            max_concurrency=max(budget, 0) / per_request,
            concurrency_context=ctx,
        )
        rows.append(row)
    return rows


def dtype_rows(configs: list[tuple[str, object]]) -> list[dict]:
    """KiB per token of every model in every cache dtype (formula, scales included)."""
    rows = []
    for name, config in configs:
        for dt in CACHE_DTYPES.values():
            rows.append(dict(model=name, cache_dtype=dt.name, bytes_per_value=dt.bytes_per_elem,
                             scale_overhead_pct=100 * dt.scale_overhead, KiB_per_token=kv_bytes(config, dt) / KiB,
                             storage=dt.note))
    return rows


def context_label(n: int) -> str:
    """A context length as the tables name it: 4096 -> "4k"."""
    return f"{n // 1024}k" if n % 1024 == 0 else str(n)



def part_registry(res: LabResult, model, device: Device, cfg: Config, progress) -> None:
    extra = None
    if not cfg.model.startswith("arch:"):
        real = res.tables["real_cache"]
        last = real[real["cache"] == "dynamic"].iloc[-1]
        extra = dict(name=cfg.model, config=model.config,
                     measured_bf16_per_token=last["measured_bytes"] / (last["batch"] * last["cached_tokens"])
                     * 2 / _elem_size(last["dtype"]))
    reg = res.add_table("registry", registry_rows(cfg, device, extra, progress))
    res.add_table("kv_by_length", kv_by_length_rows(reg, cfg))
    res.add_table("kv_growth", kv_growth_rows(reg, cfg))
    res.add_table("cache_dtypes", dtype_rows([(cfg.model, model.config)] + [(n, arch_config(n)) for n in ARCHS]))
    res.note(f"capacity on {device.spec} ({device.total_memory_bytes() / GiB:.1f} GiB): "
             f"{cfg.memory_utilization:.0%} of it "
             "minus the BF16 weights (vLLM's gpu_memory_utilization); activations not subtracted: upper bounds")


def kv_by_length_rows(reg, cfg: Config) -> list[dict]:
    """Each model's cache for one request vs context length: measured bytes per token x cached tokens."""
    return _cache_rows(reg, sorted({1024, *cfg.contexts}))


def _cache_rows(reg, lengths: list[int]) -> list[dict]:
    """One request's cache of each registry row at each length: measured bytes per token x cached tokens."""
    rows = []
    for r in reg.itertuples():
        for n in lengths:
            held = cached_tokens(n, r.window or None)
            rows.append(dict(model=r.model, context=n, cached_tokens=held,
                             GiB=held * r.measured_bf16_KiB_per_token * KiB / GiB,
                             beyond_max_context=bool(r.max_context and n > r.max_context)))
    return rows


# The chart's layouts: one model each for full multi-head attention, grouped-query attention and a sliding
# window, beside the lab's own model (at most four series: the legend must fit the chart's height).
GROWTH_LAYOUTS = {"llama-2-7b": "MHA", "llama-3-8b": "GQA", "mistral-7b": "window"}


def kv_growth_rows(reg, cfg: Config) -> list[dict]:
    """The notebook growing with length, per layout: `_cache_rows` of the chart's models at every power of two
    from 256 tokens to the longest context."""
    longest = max(cfg.contexts)
    lengths = [2**k for k in range(8, 40) if 2**k < longest] + [longest]
    kinds = dict(GROWTH_LAYOUTS)
    if reg.iloc[0].model not in ARCHS:  # the lab's --model, first in the registry table
        kinds[reg.iloc[0].model] = "this model"
    return [dict(r, layout=f"{r['model']} ({kinds[r['model']]})")
            for r in _cache_rows(reg[reg["model"].isin(kinds)], lengths)]


def _elem_size(dtype: str) -> int:
    return {"float32": 4, "float16": 2, "bfloat16": 2}.get(dtype, 4)
