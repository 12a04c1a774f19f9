"""The real cache: grow a sequence through the model and weigh `cache.layers[i].keys/.values` at each length.

A DynamicCache grows (torch.cat per step), a StaticCache is preallocated; on a GPU the allocator shows
the growing cache's copy on every step. A registry architecture runs as a skeleton (its cache-shaping
fields intact, everything else shrunk), so Mistral's sliding window is measured in a fraction of a second.

torch, transformers and llmlab.inference are imported inside the functions that use them: `llmlab --help`
imports this package (for its Config) and must not pay for them.
"""

from __future__ import annotations

import gc
import math

from llmlab.core.device import Device, is_oom
from llmlab.core.models import arch_config, torch_dtype
from llmlab.core.render import track
from llmlab.core.results import LabResult
from llmlab.labs.kvcache_growth.config import Config
from llmlab.labs.kvcache_growth.formula import MiB, cache_tensor_bytes, cached_tokens, kv_bytes, kv_cache_bytes


def random_ids(vocab: int, batch: int, length: int, seed: int, device):
    import torch

    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (batch, length), generator=g).to(device)  # (B, T)


def grow(model, cache, ids, lengths, chunk_tokens: int = 4096):
    """Feed `ids` (B, T) through the model in chunks, yielding at each length in `lengths`."""
    import torch

    from llmlab.inference.decode import forward

    batch = ids.shape[0]
    step_max = max(1, chunk_tokens // batch)  # bounds the (B, H, chunk, T) attention scores
    pos = 0
    with torch.inference_mode():
        for length in lengths:
            while pos < length:
                step = min(length - pos, step_max)
                forward(model, ids[:, pos : pos + step], cache)
                pos += step
            yield length


def _stop_reason(batch: int, length: int, max_pos: int | None, device: Device, cfg: Config) -> str | None:
    if max_pos and length > max_pos:
        return f"context limit: {length} > max_position_embeddings {max_pos}"
    if not device.is_cuda and batch * length > cfg.cpu_token_budget:
        return f"CPU budget: batch x length {batch * length} > cpu_token_budget {cfg.cpu_token_budget}"
    return None


def measure_cache_rows(model, device: Device, cfg: Config, weights_bytes: int,
                       progress=None) -> tuple[list[dict], list[str]]:
    """The batch x length grid for a DynamicCache, plus StaticCache rows for the first batch size."""
    from transformers import StaticCache

    from llmlab.inference.decode import new_cache

    config = model.config
    max_pos = getattr(config, "max_position_embeddings", None)
    rows, notes = [], []
    for batch in track(progress, cfg.batches, "real cache: batch x length"):
        lengths = []
        for length in cfg.lengths:
            reason = _stop_reason(batch, length, max_pos, device, cfg)
            if reason:
                notes.append(f"batch {batch}: stopped before length {length} ({reason})")
                break
            lengths.append(length)
        kinds = [("dynamic", lengths)]
        static_lengths = [n for n in lengths if n <= cfg.static_max_len]
        if batch == cfg.batches[0] and static_lengths:
            kinds.append(("static", static_lengths))
        for kind, lens in kinds:
            if not lens:
                continue
            ids = random_ids(config.vocab_size, batch, lens[-1], cfg.seed + batch, device.torch)
            cache = new_cache(model) if kind == "dynamic" else StaticCache(config=config, max_cache_len=lens[-1])
            try:
                for length in grow(model, cache, ids, lens):
                    rows.append(_cache_row(config, cache, kind, batch, length, lens[-1], weights_bytes))
            except Exception as exc:  # OOM ends this batch's sweep, keeping the rows so far
                if not is_oom(exc):
                    raise
                past = rows[-1]["seq_len"] if rows else 0
                notes.append(f"batch {batch} ({kind}): out of memory growing past {past} tokens")
                _free(device)
            del cache, ids
            _free(device)
    return rows, notes


def _cache_row(config, cache, kind: str, batch: int, length: int, max_len: int, weights_bytes: int) -> dict:
    layer = cache.layers[0]
    measured, storage = cache_tensor_bytes(cache)
    per_elem = layer.keys.element_size()
    held = max_len if kind == "static" else length  # a StaticCache holds max_cache_len slots from the start
    formula = kv_cache_bytes(config, held, batch, per_elem, hf_dynamic=kind == "dynamic")
    return dict(
        cache=kind, series=f"{kind} b={batch}", batch=batch, seq_len=length,
        cached_tokens=int(layer.keys.shape[-2]), dtype=str(layer.keys.dtype).removeprefix("torch."),
        measured_bytes=measured, formula_bytes=int(formula), match=measured == formula,
        measured_over_formula=measured / formula, storage_bytes=storage,
        measured_MiB=measured / MiB, formula_MiB=formula / MiB,
        weights_bytes=weights_bytes, cache_over_weights=measured / weights_bytes,
        # formula: the batch x cached tokens at which the cache weighs as much as the weights
        tokens_to_outweigh=weights_bytes / kv_bytes(config, per_elem),
    )


def _free(device: Device) -> None:
    gc.collect()
    if device.is_cuda:
        import torch

        torch.cuda.empty_cache()


def allocator_rows(model, device: Device, cfg: Config, mem=None) -> list[dict]:
    """GPU: the allocator's view of one decode step at each length, DynamicCache vs StaticCache.

    `mem` = (allocated(), peak(), reset_peak()) defaults to torch.cuda's; tests pass stand-ins.
    A DynamicCache copies each layer's K/V into a longer tensor (torch.cat) on every step, so the
    step's peak holds one layer's old and new K/V at once; a StaticCache writes into its slots.
    """
    import torch
    from transformers import StaticCache

    from llmlab.inference.decode import decode_one_token, new_cache

    if mem is None:
        mem = (lambda: torch.cuda.memory_allocated(device.torch), lambda: torch.cuda.max_memory_allocated(device.torch),
               lambda: torch.cuda.reset_peak_memory_stats(device.torch))
    allocated, peak, reset_peak = mem
    config = model.config
    max_pos = getattr(config, "max_position_embeddings", None)
    batch = max(cfg.batches)
    lengths = [n for n in cfg.lengths if n >= 2 and _stop_reason(batch, n, max_pos, device, cfg) is None]
    rows = []
    for kind in ("dynamic", "static"):
        for length in lengths:
            _free(device)
            base = allocated()
            ids = random_ids(config.vocab_size, batch, length, cfg.seed, device.torch)
            cache = new_cache(model) if kind == "dynamic" else StaticCache(config=config, max_cache_len=length)
            try:
                for _ in grow(model, cache, ids[:, :-1], [length - 1]):
                    pass
                device.synchronize()
                before = allocated()
                reset_peak()
                decode_one_token(model, ids[:, -1:], cache)
                device.synchronize()
                top, after = peak(), allocated()
            except Exception as exc:
                if not is_oom(exc):
                    raise
                rows.append(dict(cache=kind, batch=batch, seq_len=length, oom=True))
                del cache, ids
                _free(device)
                break
            measured, _ = cache_tensor_bytes(cache)
            layer_kv = measured / config.num_hidden_layers
            rows.append(dict(
                cache=kind, batch=batch, seq_len=length, oom=False, cache_bytes=measured,
                allocated_over_base_bytes=after - base,
                allocated_over_cache=(after - base) / measured if measured else math.nan,
                step_peak_extra_bytes=top - before, one_layer_kv_bytes=int(layer_kv),
                step_peak_over_one_layer=(top - before) / layer_kv if layer_kv else math.nan,
            ))
            del cache, ids
    _free(device)
    return rows


def sliding_window_rows(cfg: Config, dtype: str = "float32") -> list[dict]:
    """A Mistral skeleton (all 32 layers, real kv_heads/head_dim, tiny width) with its window shrunk to
    `window_probe`: grow past the window and check the cache stops at it (HF keeps window-1)."""
    config = skeleton_config("mistral-7b", window=cfg.window_probe)
    model = skeleton_model(config, dtype)
    w = cfg.window_probe
    lengths = sorted({w // 2, w - 1, w, w + 1, 2 * w, 3 * w})
    ids = random_ids(config.vocab_size, 1, lengths[-1], cfg.seed, "cpu")
    from llmlab.inference.decode import new_cache

    cache = new_cache(model)
    rows = []
    for length in grow(model, cache, ids, lengths, chunk_tokens=w // 2):
        measured, storage = cache_tensor_bytes(cache)
        per_elem = cache.layers[0].keys.element_size()
        formula = kv_cache_bytes(config, length, 1, per_elem, hf_dynamic=True)
        rows.append(dict(
            model="mistral-7b skeleton", window=w, seq_len=length, cached_tokens=int(cache.layers[0].keys.shape[-2]),
            formula_tokens=cached_tokens(length, w, hf_dynamic=True), napkin_tokens=cached_tokens(length, w),
            measured_bytes=measured, formula_bytes=int(formula), match=measured == formula, storage_bytes=storage,
        ))
    return rows



def part_real_cache(res: LabResult, model, device: Device, cfg: Config, weights_bytes: int, progress) -> None:
    rows, notes = measure_cache_rows(model, device, cfg, weights_bytes, progress)
    for n in notes[:2]:  # the sweep's stops; the rest are alike
        res.note(n)
    res.add_table("real_cache", rows)
    res.add_table("sliding_window", sliding_window_rows(cfg))
    if device.is_cuda:
        res.add_table("allocator", allocator_rows(model, device, cfg))
    else:
        res.skip("allocator", "no GPU (needs torch.cuda.memory_allocated)")


def skeleton_config(name: str, window: int | None = None):
    """A registry architecture with its cache-shaping fields intact (layers, heads, kv_heads, head_dim,
    window) and everything else shrunk (hidden 32, MLP 32, vocab 256): the cache's shape does not depend
    on the shrunk fields, so it builds and runs in a fraction of a second."""
    config = arch_config(name)
    config.hidden_size, config.intermediate_size, config.vocab_size = 32, 32, 256
    if window is not None:
        config.sliding_window = window
    return config


def skeleton_model(config, dtype: str):
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("cpu"):
        return AutoModelForCausalLM.from_config(config, dtype=torch_dtype(dtype)).eval()
