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

import math
import time
from dataclasses import dataclass

import numpy as np

from llmlab.core.device import Device, is_oom
from llmlab.core.render import track
from llmlab.core.results import Claim, Col, LabResult, View
from llmlab.core.timing import Stopwatch

LAB = "kvcache-growth"
VERSION = 2  # 2: the cache-vs-weights crossing judged from the measured rows; kv_by_length table
JUDGE_VERSION = 1
MIN_FIT_TOKENS = 16  # fewer generated tokens than this cannot tell n^2 from n (a busy CPU's budget cut it)

GiB, MiB, KiB = 2**30, 2**20, 2**10


# ---------------------------------------------------------------- 1. the formula


@dataclass(frozen=True)
class CacheDtype:
    """How one cached value is stored: `bits` per value, plus one `scale_bytes` scale per `group` values."""

    name: str
    bits: int
    group: int | None = None  # values sharing one scale (None: a per-tensor scale, negligible per token)
    scale_bytes: int = 2  # an FP16 scale
    note: str = ""

    @property
    def bytes_per_elem(self) -> float:
        scales = self.scale_bytes / self.group if self.group else 0.0
        return self.bits / 8 + scales

    @property
    def scale_overhead(self) -> float:
        """Bytes of scales over bytes of values (0.0625 = +6.25%)."""
        return self.bytes_per_elem / (self.bits / 8) - 1


CACHE_DTYPES: dict[str, CacheDtype] = {
    "fp32": CacheDtype("fp32", 32, note="4 bytes"),
    "fp16": CacheDtype("fp16", 16, note="2 bytes"),
    "bf16": CacheDtype("bf16", 16, note="2 bytes (the usual cache dtype)"),
    "fp8": CacheDtype("fp8", 8, note="1 byte (E4M3); one FP32 scale per layer for K and for V: ~0 per token"),
    "int4-g64": CacheDtype("int4-g64", 4, 64, note="0.5 byte + one FP16 scale per 64 values (+6.25%)"),
    "int4-g32": CacheDtype("int4-g32", 4, 32, note="0.5 byte + one FP16 scale per 32 values (+12.5%)"),
}
_TORCH_CACHE_DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}


def cache_dtype(name: str) -> CacheDtype:
    key = name.strip().lower().replace("bfloat16", "bf16").replace("float16", "fp16").replace("float32", "fp32")
    if key == "int4":
        key = "int4-g64"
    if key not in CACHE_DTYPES:
        raise ValueError(f"unknown cache dtype '{name}': use one of {', '.join(CACHE_DTYPES)}")
    return CACHE_DTYPES[key]


def sliding_window(config) -> int | None:
    """The attention window that caps the cache (Mistral), or None (full attention)."""
    if isinstance(config, dict):
        return config.get("sliding_window")
    if getattr(config, "use_sliding_window", True) is False:  # Qwen2 ships a window field, switched off
        return None
    w = getattr(config, "sliding_window", None)
    return int(w) if w else None


def attention_kind(heads: int, kv_heads: int) -> str:
    """MHA (every query head has its K/V), MQA (one K/V head), or GQA-g (g query heads share one)."""
    if kv_heads == heads:
        return "MHA"
    if kv_heads == 1:
        return "MQA"
    return f"GQA-{heads // kv_heads}"


def attn_shape(config) -> dict:
    """layers, heads, kv_heads, head_dim of an HF config (head_dim explicit when the config gives it)."""
    heads = config.num_attention_heads
    return dict(layers=config.num_hidden_layers, heads=heads,
                kv_heads=getattr(config, "num_key_value_heads", None) or heads,
                head_dim=getattr(config, "head_dim", None) or config.hidden_size // heads)


def kv_elems_per_token(config) -> int:
    """Cached values per token: 2 x layers x kv_heads x head_dim (the model module's formula at 1 byte)."""
    from llmlab.core.models import kv_bytes_per_token

    return kv_bytes_per_token(config, 1)


def kv_bytes(config, dtype: CacheDtype | float) -> float:
    """Bytes per token of context for one sequence, scales included."""
    per = dtype.bytes_per_elem if isinstance(dtype, CacheDtype) else float(dtype)
    return kv_elems_per_token(config) * per


def cached_tokens(seq_len: int, window: int | None, hf_dynamic: bool = False) -> int:
    """Tokens the cache holds after `seq_len` tokens: all of them, or the window.

    HF's DynamicSlidingWindowLayer keeps window-1 (the current token completes the window at attention
    time); the napkin math (and a rolling buffer as in the Mistral paper) keeps `window`.
    """
    if not window:
        return seq_len
    return min(seq_len, window - 1 if hf_dynamic else window)


def kv_cache_bytes(config, seq_len: int, batch: int, dtype: CacheDtype | float, hf_dynamic: bool = False) -> float:
    """The whole cache: batch x cached tokens x bytes per token."""
    return batch * cached_tokens(seq_len, sliding_window(config), hf_dynamic) * kv_bytes(config, dtype)


def cache_tensor_bytes(cache) -> tuple[int, int]:
    """(bytes of the K/V tensors as numel x element size, bytes of their storages) over all layers."""
    tensor = storage = 0
    for layer in cache.layers:
        for t in (getattr(layer, "keys", None), getattr(layer, "values", None)):
            if t is None or t.numel() == 0:
                continue
            tensor += t.numel() * t.element_size()
            storage += t.untyped_storage().nbytes()
    return tensor, storage


# ---------------------------------------------------------------- the lab's configuration


@dataclass(frozen=True)
class Config:
    model: str = "tiny"  # the built-in: a real trained Llama (6 layers, GQA 4:2, head_dim 64)
    dtype: str | None = None  # the measured model's dtype; None: float32 on the CPU, bfloat16 on a GPU
    cache_dtype: str = "bf16"  # the registry table's cache dtype (the formula covers every dtype)
    batches: tuple[int, ...] = (1, 4, 16)  # 1 request and two batches; under the CPU budget each one crosses tiny's weights
    lengths: tuple[int, ...] = (1, 16, 64, 256, 1024, 4096, 8192, 16384)  # x4 steps to past tiny's 8192 context
    cpu_token_budget: int = 4096  # CPU only: stop a batch past this many tokens (batch x length; seconds on 2 cores)
    static_max_len: int = 1024  # StaticCache rows for the first batch size up to this length (it preallocates)
    contexts: tuple[int, ...] = (4096, 32768, 131072)  # the article's 4k / 32k / 128k
    concurrency_context: int = 4096  # tokens per request for "maximum concurrency" (Llama-2's whole window)
    memory_utilization: float = 0.9  # vLLM's default gpu_memory_utilization
    gen_prompt: int = 8  # a short prompt: the growth comes from generated tokens
    gen_tokens: int = 160  # long enough that recomputing the prefix outweighs the per-step overhead
    gen_repeats: int = 3  # median per step over repeats (never one run)
    trap_budget_s: float = 60.0  # the no-cache runs' wall-time cap: fewer tokens on a slow or shared CPU
    window_probe: int = 32  # the Mistral skeleton's window, shrunk so the cap is reached in a few tokens
    cuda_model: str = "auto"  # GPU trap: auto = a registry arch: of >= 32x the L2 when --model fits in it (tiny does); "same" keeps it
    max_trap_tokens: int = 8192  # GPU: the trap's token count is sized from the device (trap_tokens) up to this
    seed: int = 0

    def __post_init__(self):
        cache_dtype(self.cache_dtype)  # validates
        if self.dtype is not None and self.dtype not in ("float32", "float16", "bfloat16"):
            raise ValueError(f"dtype must be float32, float16 or bfloat16, not '{self.dtype}'")
        for name in ("batches", "lengths", "contexts"):
            v = getattr(self, name)
            if not v or any(int(x) < 1 for x in v):
                raise ValueError(f"{name} must be positive integers")
        if list(self.lengths) != sorted(set(self.lengths)):
            raise ValueError("lengths must be increasing")
        if self.concurrency_context < 1 or self.cpu_token_budget < 1:
            raise ValueError("concurrency_context and cpu_token_budget must be positive")
        if not 0 < self.memory_utilization <= 1:
            raise ValueError("memory_utilization must be in (0, 1]")
        if self.gen_prompt < 1 or self.gen_tokens < 8:
            raise ValueError("gen_prompt must be >= 1 and gen_tokens >= 8 (the fit needs points)")
        if self.gen_repeats < 2:
            raise ValueError("gen_repeats must be >= 2 (a median, never one run)")
        if self.trap_budget_s <= 0:
            raise ValueError("trap_budget_s must be positive")
        if self.window_probe < 4:
            raise ValueError("window_probe must be >= 4")

    @classmethod
    def quick(cls) -> Config:
        return cls(batches=(1, 16), lengths=(1, 16, 64, 256), static_max_len=256, gen_tokens=48, trap_budget_s=9.0)


# ---------------------------------------------------------------- 2. the real cache


def _random_ids(vocab: int, batch: int, length: int, seed: int, device):
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


def measure_cache_rows(model, device: Device, cfg: Config, weights_bytes: int, progress=None) -> tuple[list[dict], list[str]]:
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
            ids = _random_ids(config.vocab_size, batch, lens[-1], cfg.seed + batch, device.torch)
            cache = new_cache(model) if kind == "dynamic" else StaticCache(config=config, max_cache_len=lens[-1])
            try:
                for length in grow(model, cache, ids, lens):
                    rows.append(_cache_row(config, cache, kind, batch, length, lens[-1], weights_bytes))
            except Exception as exc:  # OOM ends this batch's sweep, keeping the rows so far
                if not is_oom(exc):
                    raise
                notes.append(f"batch {batch} ({kind}): out of memory growing past {rows[-1]['seq_len'] if rows else 0} tokens")
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
        tokens_to_outweigh=weights_bytes / kv_bytes(config, per_elem),  # formula: batch x cached tokens where cache = weights
    )


def _free(device: Device) -> None:
    import gc

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
            ids = _random_ids(config.vocab_size, batch, length, cfg.seed, device.torch)
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
                allocated_over_base_bytes=after - base, allocated_over_cache=(after - base) / measured if measured else math.nan,
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
    model = _skeleton_model(config, dtype)
    w = cfg.window_probe
    lengths = sorted({w // 2, w - 1, w, w + 1, 2 * w, 3 * w})
    ids = _random_ids(config.vocab_size, 1, lengths[-1], cfg.seed, "cpu")
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


# ---------------------------------------------------------------- 3. the registry side by side


def skeleton_config(name: str, window: int | None = None):
    """A registry architecture with its cache-shaping fields intact (layers, heads, kv_heads, head_dim,
    window) and everything else shrunk (hidden 32, MLP 32, vocab 256): the cache's shape does not depend
    on the shrunk fields, so it builds and runs in a fraction of a second."""
    from llmlab.core.models import arch_config

    config = arch_config(name)
    config.hidden_size, config.intermediate_size, config.vocab_size = 32, 32, 256
    if window is not None:
        config.sliding_window = window
    return config


def _skeleton_model(config, dtype: str):
    import torch
    from transformers import AutoModelForCausalLM

    from llmlab.core.models import torch_dtype

    with torch.device("cpu"):
        return AutoModelForCausalLM.from_config(config, dtype=torch_dtype(dtype)).eval()


def measured_kv_per_token(name: str, tokens: int = 8) -> float:
    """Bytes per token of a real HF cache, from the registry model's BF16 skeleton run over `tokens`."""
    from llmlab.inference.decode import new_cache

    config = skeleton_config(name)
    model = _skeleton_model(config, "bfloat16")
    cache = new_cache(model)
    ids = _random_ids(config.vocab_size, 1, tokens, 0, "cpu")
    for _ in grow(model, cache, ids, [tokens]):
        pass
    return cache_tensor_bytes(cache)[0] / tokens


def registry_rows(cfg: Config, device: Device, extra: dict | None = None, progress=None) -> list[dict]:
    """One row per registry model (and the lab's --model): formula, skeleton measurement, capacity."""
    from llmlab.core.models import ARCHS, arch_config, estimate_bytes

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
            row[f"GiB_at_{_k(c)}"] = cached_tokens(c, window) * per_tok / GiB
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


def _k(n: int) -> str:
    return f"{n // 1024}k" if n % 1024 == 0 else str(n)


# ---------------------------------------------------------------- 4. the quadratic trap


def generate_without_cache(model, ids, n: int, sync=None, max_s: float | None = None):
    """Greedy, recomputing the whole sequence every step (no cache). Returns (tokens (B, n), step seconds).

    `max_s` stops early (at least 8 tokens) once the loop has run that long: a slow machine's bound."""
    import torch

    seq, times = ids, []
    with torch.inference_mode():
        for _ in range(n):
            if max_s is not None and len(times) >= 8 and sum(times) > max_s:
                break
            t0 = time.perf_counter()
            logits = model(input_ids=seq, use_cache=False, logits_to_keep=1).logits[:, -1]  # (B, V)
            tok = logits.argmax(dim=-1, keepdim=True)  # (B, 1)
            if sync:
                sync()
            times.append(time.perf_counter() - t0)
            seq = torch.cat([seq, tok], dim=1)
    return seq[:, ids.shape[1] :], times


def generate_with_cache(model, ids, n: int, sync=None):
    """Greedy with a DynamicCache (llmlab.inference.decode). Returns (tokens (B, n), step seconds, prefill first)."""
    from llmlab.inference.decode import generate

    g = generate(model, ids, n, sync=sync)
    return g.tokens, [g.prefill_s, *g.step_s]


def fit_growth(n: np.ndarray, total_s: np.ndarray) -> dict:
    """Least squares of total time vs n: a line and a parabola, with R^2, residuals, the n^2 term's share
    of the fitted total at n_max, and the n where the n^2 term overtakes the linear one (b / a)."""
    out = {}
    ss_tot = float(np.sum((total_s - total_s.mean()) ** 2))
    for deg in (1, 2):
        coef = np.polyfit(n, total_s, deg)
        pred = np.polyval(coef, n)
        ssr = float(np.sum((total_s - pred) ** 2))
        out[deg] = dict(coef=coef, r2=1 - ssr / ss_tot if ss_tot > 0 else math.nan, ssr=ssr, pred=pred)
    a, b, _ = out[2]["coef"]
    n_max = float(n.max())
    out["quad_share"] = float(a * n_max**2 / np.polyval(out[2]["coef"], n_max))
    out["overtake_n"] = float(b / a) if a > 0 and b > 0 else math.nan
    return out


def is_quadratic(fit: dict) -> bool:
    """The rule: the n^2 coefficient is positive and the parabola leaves at most half the line's squared
    residual (the n^2 term is real, not noise). How much of the bill it is at n_max is reported beside."""
    return bool(fit[2]["coef"][0] > 0 and fit[2]["ssr"] <= 0.5 * fit[1]["ssr"])


def trap(model, device: Device, cfg: Config, progress=None) -> dict:
    """Time both loops `gen_repeats` times, interleaved (core.timing.interleaved); per-step medians, totals, fits.

    The untimed first pass runs the no-cache loop under its time budget: the tokens it reaches set n
    for every timed run (a slow or busy CPU gets fewer tokens, never a longer lab).
    """
    from llmlab.core.timing import interleaved

    ids = _random_ids(model.config.vocab_size, 1, cfg.gen_prompt, cfg.seed, device.torch)
    loops = {"without cache": generate_without_cache, "with cache": generate_with_cache}
    n_tokens = cfg.gen_tokens
    results: dict[str, list] = {mode: [] for mode in loops}  # mode -> [(tokens, step seconds)] per timed run

    def probe():
        nonlocal n_tokens
        _, times = generate_without_cache(model, ids, cfg.gen_tokens, device.synchronize, max_s=cfg.trap_budget_s / cfg.gen_repeats)
        n_tokens = len(times)

    def timed(mode):
        return lambda: results[mode].append(loops[mode](model, ids, n_tokens, device.synchronize))

    it = interleaved({mode: timed(mode) for mode in loops}, cfg.gen_repeats, device,
                     first={"without cache": probe, "with cache": lambda: generate_with_cache(model, ids, 4, device.synchronize)},
                     rounds=lambda r: track(progress, list(r), "quadratic trap: generate with / without cache"))
    steps = {mode: [times for _, times in runs] for mode, runs in results.items()}
    tokens = {mode: runs[0][0] for mode, runs in results.items()}
    totals = {mode: it.stats(mode) for mode in loops}  # wall time of each whole run, ms
    out = {"tokens_match": int((tokens["with cache"] == tokens["without cache"]).all(dim=0).sum()), "n_tokens": n_tokens,
           "modes": {}}
    for mode, runs in steps.items():
        per_step = np.median(np.array(runs), axis=0)  # (n,) seconds
        n = np.arange(1, len(per_step) + 1)
        total = np.cumsum(per_step)
        context = cfg.gen_prompt + n - 1  # tokens the step attends over (the prompt plus tokens so far)
        slope = np.polyfit(context, per_step * 1e3, 1)
        out["modes"][mode] = dict(per_step_s=per_step, runs=np.array(runs), n=n, total_s=total, context=context,
                                  fit=fit_growth(n.astype(float), total), step_slope_ms_per_ktok=slope[0] * 1e3,
                                  total_stats=totals[mode])
    return out


def trap_tables(t: dict, points: int = 16) -> tuple[list[dict], list[dict], list[dict]]:
    steps, totals, fits = [], [], []
    for mode, m in t["modes"].items():
        n = m["n"]
        pick = sorted({int(i) for i in np.linspace(0, len(n) - 1, min(points, len(n)))})
        for i in pick:
            col = m["runs"][:, i] * 1e3
            steps.append(dict(mode=mode, step=int(n[i]), context_len=int(m["context"][i]), step_ms=float(m["per_step_s"][i] * 1e3),
                              p10_ms=float(np.percentile(col, 10)), p90_ms=float(np.percentile(col, 90))))
            totals.append(dict(mode=mode, n_tokens=int(n[i]), total_s=float(m["total_s"][i]),
                               fit_linear_s=float(m["fit"][1]["pred"][i]), fit_quadratic_s=float(m["fit"][2]["pred"][i])))
        f = m["fit"]
        c2, c1, c0 = f[2]["coef"]
        l1, l0 = f[1]["coef"]
        fits.append(dict(mode=mode, n_max=int(n[-1]), total_median_s=m["total_stats"].median_ms / 1e3,
                         total_p10_s=m["total_stats"].p10_ms / 1e3, total_p90_s=m["total_stats"].p90_ms / 1e3,
                         quad_a_s_per_tok2=c2, quad_b_s_per_tok=c1, quad_c_s=c0, quad_r2=f[2]["r2"],
                         quad_ssr=f[2]["ssr"], lin_ssr=f[1]["ssr"],
                         lin_b_s_per_tok=l1, lin_c_s=l0, lin_r2=f[1]["r2"], quad_share_at_n_max=f["quad_share"], n2_overtakes_at_n=f["overtake_n"],
                         step_ms_first=float(m["per_step_s"][1] * 1e3), step_ms_last=float(m["per_step_s"][-1] * 1e3),
                         step_slope_ms_per_1k_context=m["step_slope_ms_per_ktok"], quadratic=is_quadratic(f)))
    return steps, totals, fits


# ---------------------------------------------------------------- the lab


def run(cfg: Config, device: Device, progress=None) -> LabResult:
    """Measures. Fills tables, env, notes, skipped. Never prints, never judges."""
    res = LabResult.new(LAB, VERSION, cfg)
    res.judge_version = JUDGE_VERSION
    with res.guard():
        lm = _load(cfg, device)
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


def _load(cfg: Config, device: Device):
    from llmlab.core.models import load

    return load(cfg.model, device, cfg.dtype or ("bfloat16" if device.is_cuda else "float32"))


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


def part_registry(res: LabResult, model, device: Device, cfg: Config, progress) -> None:
    from llmlab.core.models import ARCHS, arch_config

    extra = None
    if not cfg.model.startswith("arch:"):
        real = res.tables["real_cache"]
        last = real[real["cache"] == "dynamic"].iloc[-1]
        extra = dict(name=cfg.model, config=model.config,
                     measured_bf16_per_token=last["measured_bytes"] / (last["batch"] * last["cached_tokens"])
                     * 2 / _elem_size(last["dtype"]))
    reg = res.add_table("registry", registry_rows(cfg, device, extra, progress))
    res.add_table("kv_by_length", kv_by_length_rows(reg, cfg))
    res.add_table("cache_dtypes", dtype_rows([(cfg.model, model.config)] + [(n, arch_config(n)) for n in ARCHS]))
    res.note(f"capacity on {device.spec} ({device.total_memory_bytes() / GiB:.1f} GiB): {cfg.memory_utilization:.0%} of it "
             "minus the BF16 weights (vLLM's gpu_memory_utilization); activations not subtracted: upper bounds")


def kv_by_length_rows(reg, cfg: Config) -> list[dict]:
    """Each model's cache for one request vs context length: measured bytes per token x cached tokens."""
    lengths = sorted({1024, *cfg.contexts})
    rows = []
    for r in reg.itertuples():
        for n in lengths:
            held = cached_tokens(n, r.window or None)
            rows.append(dict(model=r.model, context=n, cached_tokens=held,
                             GiB=held * r.measured_bf16_KiB_per_token * KiB / GiB,
                             beyond_max_context=bool(r.max_context and n > r.max_context)))
    return rows


def _elem_size(dtype: str) -> int:
    return {"float32": 4, "float16": 2, "bfloat16": 2}.get(dtype, 4)


def part_trap(res: LabResult, model, device: Device, cfg: Config, progress) -> None:
    model, cfg = trap_setup(res, model, device, cfg)
    t = trap(model, device, cfg, progress)
    steps, totals, fits = trap_tables(t)
    res.add_table("generation_steps", steps)
    res.add_table("generation_totals", totals)
    res.add_table("generation_fits", [dict(f, tokens_equal=t["tokens_match"], tokens_compared=t["n_tokens"], model=res.env["trap_model"])
                                      for f in fits])
    if t["n_tokens"] < cfg.gen_tokens:
        res.note(f"quadratic trap: the no-cache loop hit its {cfg.trap_budget_s:.0f} s budget at {t['n_tokens']} of "
                 f"{cfg.gen_tokens} tokens; every run generated that many")


def trap_setup(res: LabResult, model, device: Device, cfg: Config):
    """(model, cfg) for the trap. On a GPU: a model past L2 (core.roofs.gpu_speed_model) and a token count from
    the device (trap_tokens): 160 tokens of `tiny` on a GPU are flat and launch-bound. On a CPU nothing changes."""
    from dataclasses import replace

    from llmlab.core.models import load
    from llmlab.core.roofs import gpu_speed_model

    ref, why = gpu_speed_model(cfg.model, cfg.cuda_model, device, cfg.dtype or "bfloat16")
    res.env["trap_model"] = ref
    if ref != cfg.model:
        model = load(ref, device, cfg.dtype or "bfloat16").model
        res.note(f"quadratic trap on {why}")
    if device.is_cuda:
        n, why_n = trap_tokens(model, device, cfg)
        cfg = replace(cfg, gen_tokens=n)
        res.env["trap_tokens"] = why_n
        res.note(f"quadratic trap: {why_n}")
    return model, cfg


def trap_tokens(model, device: Device, cfg: Config, forward_ms=None) -> tuple[int, str]:
    """(tokens to generate, why): 4x the context n_x at which one no-cache forward takes twice the shortest one's time.

    Below n_x a step's fixed cost (launches, weight reads) hides the per-token work; a run to 4 n_x puts
    about two thirds of the total into the n^2 term. Doubling n from 64 up to max_trap_tokens / 4 (and
    the model's context); `forward_ms(n)` is one timed forward over n tokens (tests pass a stand-in)."""
    max_pos = int(getattr(model.config, "max_position_embeddings", 0) or cfg.max_trap_tokens)
    cap = max(cfg.gen_tokens, min(cfg.max_trap_tokens, max_pos - cfg.gen_prompt))
    forward_ms = forward_ms or (lambda n: _no_cache_forward_ms(model, device, n, cfg.seed))
    n, base = 64, forward_ms(64)
    while 4 * n < cap:
        n *= 2
        if forward_ms(n) >= 2 * base:
            tokens = max(cfg.gen_tokens, min(cap, 4 * n))
            return tokens, f"{tokens} tokens from the device: a no-cache forward doubles its {base:.2f} ms by {n} tokens of context"
    return cap, f"{cap} tokens (the cap): a no-cache forward stays under twice its {base:.2f} ms up to {n} tokens"


def _no_cache_forward_ms(model, device: Device, n: int, seed: int) -> float:
    """The median of 3 synchronised no-cache forwards over n tokens (logits of the last position only), in ms."""
    import statistics

    import torch

    ids = _random_ids(model.config.vocab_size, 1, n, seed, device.torch)
    times = []
    with torch.inference_mode():
        for _ in range(4):  # the first is a warm-up
            device.synchronize()
            t0 = time.perf_counter()
            model(input_ids=ids, use_cache=False, logits_to_keep=1)
            device.synchronize()
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times[1:])


# ---------------------------------------------------------------- judge: every verdict from the tables


def judge(result: LabResult) -> list[Claim]:
    """Pure: the claims from result.tables alone (a saved run re-judges the same)."""
    T = result.tables
    claims = []
    if "real_cache" in T:
        claims += [_judge_bytes(T["real_cache"]), _judge_outweighs(T["real_cache"], result.config.get("model", "?"))]
    if "sliding_window" in T:
        claims.append(_judge_window(T["sliding_window"]))
    claims.append(_judge_allocator(T.get("allocator"), result.skipped.get("allocator", "")))
    if "registry" in T:
        claims.append(_judge_gqa(T["registry"]))
    if "generation_fits" in T:
        claims += _judge_trap(T["generation_fits"])
    return claims


def _judge_bytes(df) -> Claim:
    n_match = int((df["measured_bytes"] == df["formula_bytes"]).sum())
    worst = float((df["measured_bytes"] / df["formula_bytes"] - 1).abs().max())
    per_tok = df["formula_bytes"].iloc[0] / (df["batch"].iloc[0] * df["cached_tokens"].iloc[0])
    return Claim("kvcache_growth.bytes_match_formula", "measured cache bytes equal the formula at every length",
                 f"every row exactly 2 x layers x kv_heads x head_dim x bytes = {per_tok:.0f} B/tok x tokens",
                 f"{n_match}/{len(df)} rows exact (worst off by {worst:.2g})", n_match == len(df))


def _judge_outweighs(df, model: str) -> Claim:
    """Measured cache bytes cross the weights exactly where batch x cached tokens crosses the formula's N."""
    dyn = df[df["cache"] == "dynamic"]
    over = dyn["measured_bytes"] > dyn["weights_bytes"]
    predicted = dyn["batch"] * dyn["cached_tokens"] > dyn["tokens_to_outweigh"]
    n_star = float(dyn["tokens_to_outweigh"].iloc[0])
    first = dyn[over].sort_values(["batch", "seq_len"]).head(1)
    text = f"the cache outweighs the weights past N tokens ({model})"
    expected = f"every row on its side of N = weights / bytes per token = {n_star:,.0f} (batch x tokens)"
    if not over.any():
        return Claim("kvcache_growth.cache_outweighs_weights", text, expected,
                     f"largest cache {dyn['cache_over_weights'].max():.2f}x the weights", None,
                     note="not measured: no grid point reached N (raise --batches or --lengths)")
    r = first.iloc[0]
    agree = int((over == predicted).sum())
    return Claim("kvcache_growth.cache_outweighs_weights", text, expected,
                 f"first at b={int(r['batch'])} x {int(r['seq_len'])} ({r['cache_over_weights']:.2f}x); "
                 f"{agree}/{len(dyn)} rows on the predicted side", agree == len(dyn))


def _judge_window(sw) -> Claim:
    w = int(sw["window"].iloc[0])
    ok = (sw["cached_tokens"] == sw["formula_tokens"]) & (sw["measured_bytes"] == sw["formula_bytes"])
    capped = int(sw["cached_tokens"].max())
    return Claim("kvcache_growth.sliding_window_caps", "a sliding window caps the cache (Mistral skeleton)",
                 f"every length exactly min(length, window - 1 = {w - 1}) tokens (HF's rule)",
                 f"<= {capped} tokens to length {int(sw['seq_len'].max())}; {int(ok.sum())}/{len(sw)} rows exact",
                 bool(ok.all()))


def _judge_allocator(alloc, why: str) -> Claim:
    cid, text = "kvcache_growth.dynamic_cache_copies", "a DynamicCache copies itself each step; a StaticCache not"
    expected = "dynamic's largest step peak > static's"
    if alloc is None or alloc.empty:
        return Claim(cid, text, expected, "-", None, note=f"not measured: {why or 'no allocator rows'}")
    ok = alloc[~alloc["oom"].astype(bool)]
    dyn, sta = ok[ok["cache"] == "dynamic"], ok[ok["cache"] == "static"]
    if dyn.empty or sta.empty:
        return Claim(cid, text, expected, "-", None, note="not measured: out of memory before both caches had a row")
    d, s = dyn["step_peak_extra_bytes"].max(), sta["step_peak_extra_bytes"].max()
    return Claim(cid, text, expected, f"step peak: dynamic {d / MiB:.1f} MiB, static {s / MiB:.1f} MiB", bool(d > s))


def _judge_gqa(reg) -> Claim:
    r = reg.set_index("model")
    l2, l3 = r.loc["llama-2-7b"], r.loc["llama-3-8b"]
    ratio = l2["measured_bf16_KiB_per_token"] / l3["measured_bf16_KiB_per_token"]
    formula = l2["bf16_KiB_per_token"] / l3["bf16_KiB_per_token"]
    return Claim("kvcache_growth.gqa_4x_smaller", "Llama 3 8B needs 4x less KV per token than Llama 2 7B",
                 f"exactly 4x, measured and formula ({l2['bf16_KiB_per_token']:.0f} vs {l3['bf16_KiB_per_token']:.0f} KiB: 32 vs 8 KV heads)",
                 f"HF caches {l2['measured_bf16_KiB_per_token']:.0f} vs {l3['measured_bf16_KiB_per_token']:.0f} KiB/token: {ratio:.2f}x",
                 bool(abs(ratio - 4.0) < 1e-9 and abs(formula - 4.0) < 1e-9))


def _judge_trap(fits) -> list[Claim]:
    f = fits.set_index("mode")
    nc, wc = f.loc["without cache"], f.loc["with cache"]
    n = int(nc["n_max"])
    text = "without a cache, total generation time grows quadratically" + (f" ({nc['model']})" if "model" in nc.index else "")
    expected = "fit a n^2 + b n + c: a > 0 and its squared residual <= 0.5x a line's"
    measured = f"a = {nc['quad_a_s_per_tok2'] * 1e6:.1f} us/tok^2, residual {nc['quad_ssr'] / nc['lin_ssr']:.2f}x; {n} tokens"
    if n < MIN_FIT_TOKENS:
        quad = Claim("kvcache_growth.no_cache_quadratic", text, expected, measured, None,
                     note=f"not measured: {n} tokens (< {MIN_FIT_TOKENS}) cannot tell n^2 from n (time budget)")
    else:
        quad = Claim("kvcache_growth.no_cache_quadratic", text, expected, measured,
                     bool(nc["quad_a_s_per_tok2"] > 0 and nc["quad_ssr"] <= 0.5 * nc["lin_ssr"]))
    eq, total = int(wc["tokens_equal"]), int(wc["tokens_compared"])
    same = Claim("kvcache_growth.cache_same_output", "the cache changes the speed, not the output (greedy)",
                 f"{total}/{total} tokens equal", f"{eq}/{total} tokens equal", eq == total)
    return [quad, same]


def headline(result: LabResult, claims: list[Claim]) -> str:
    """The one thing this run found."""
    T = result.tables
    parts = []
    if "real_cache" in T:
        df = T["real_cache"]
        per_tok = df["formula_bytes"].iloc[0] / (df["batch"].iloc[0] * df["cached_tokens"].iloc[0])
        exact = bool((df["measured_bytes"] == df["formula_bytes"]).all())
        parts.append(f"The KV cache is {'exactly' if exact else 'not'} the formula: {per_tok:,.0f} B per token here, "
                     "growing linearly with length x batch.")
    if "generation_fits" in T:
        nc = T["generation_fits"].set_index("mode").loc["without cache"]
        wc = T["generation_fits"].set_index("mode").loc["with cache"]
        if nc["n_max"] < MIN_FIT_TOKENS:
            parts.append(f"The quadratic trap reached only {int(nc['n_max'])} tokens in its time budget (a slow or busy CPU): "
                         "too few to judge.")
        else:
            parts.append(f"Without it each token recomputes the prefix: {nc['step_ms_first']:.1f} -> {nc['step_ms_last']:.1f} ms "
                         f"per token vs {wc['step_ms_last']:.1f} ms with it.")
    return " ".join(parts)


# ---------------------------------------------------------------- views: the report, in the article's order


def views(result: LabResult) -> list[View]:
    big = result.config.get("contexts", [131072])[-1]
    return [
        View("1. The real cache against the formula", "Do the K/V tensors weigh exactly batch x tokens x bytes per token?",
             "real_cache", (Col("series", "cache", "text"), Col("seq_len", "tokens", "int"), Col("measured_MiB", "measured MiB"),
                            Col("formula_MiB", "formula MiB"), Col("cache_over_weights", "x weights", ".2f")),
             rows=_real_rows),
        View("2. A sliding window caps it", "Mistral's window: does the cache stop growing at the window?", "sliding_window",
             (Col("seq_len", "length", "int"), Col("cached_tokens", "cached tokens", "int"),
              Col("formula_tokens", "HF formula", "int"), Col("measured_bytes", "bytes", "int"))),
        View("3. Dynamic vs static cache (allocator)", "Does a growing cache copy itself on every step?", "allocator",
             (Col("cache", "cache", "text"), Col("seq_len", "tokens", "int"), Col("step_peak_extra_bytes", "step peak B", "int"),
              Col("step_peak_over_one_layer", "x one layer KV", ".2f"))),
        View("4. Real models side by side (BF16 cache)", "How much KV does each architecture need, and how many requests fit?",
             "registry", (Col("model", "model", "text", 13), Col("attention", "attention", "text"),
                          Col("measured_bf16_KiB_per_token", "KiB / token", ".0f"), Col(f"GiB_at_{_k(big)}", f"GiB at {_k(big)}", ".1f"),
                          Col("cache_outweighs_weights_at_tokens", "= weights at tokens", "int"),
                          Col("max_concurrency", "requests here", ".1f"))),
        View("5. Cache dtypes", "Bytes per token of Llama 3 8B's cache in each storage format", "cache_dtypes",
             (Col("cache_dtype", "cache dtype", "text"), Col("bytes_per_value", "bytes / value", ".4g"),
              Col("scale_overhead_pct", "scales %", ".2f"), Col("KiB_per_token", "KiB / token", ".1f")),
             rows=lambda d: d[d["model"] == "llama-3-8b"].drop_duplicates("cache_dtype")),
        View("6. The quadratic trap", "Generating without a cache: does total time grow as n^2?", "generation_fits",
             (Col("mode", "mode", "text"), Col("n_max", "tokens", "int"), Col("step_ms_first", "first ms/tok", ".1f"),
              Col("step_ms_last", "last ms/tok", ".1f"), Col("total_median_s", "total s", ".2f"), Col("quad_r2", "R^2 n^2 fit", ".4f"))),
    ]


def _real_rows(df):
    """Dynamic rows past one token, then the static cache's last row (it is full from the start)."""
    import pandas as pd

    dyn = df[(df["cache"] == "dynamic") & (df["seq_len"] > 1)]
    return pd.concat([dyn, df[df["cache"] == "static"].tail(1)])


def figures(result: LabResult) -> list:
    """The HTML report's plot: KV bytes of one request vs context length, one line per architecture."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figs = []
    df = result.tables.get("kv_by_length")
    if df is None or df.empty:
        return figs
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for model, g in df.groupby("model", sort=False):
        ax.plot(g["context"], g["GiB"], marker="o", markersize=3, label=model)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("context (tokens)")
    ax.set_ylabel("KV cache, one request (GiB)")
    ax.legend(fontsize=6, ncol=2)
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    figs.append(("KV cache bytes vs context length per architecture (BF16, measured bytes per token; Mistral capped by its window)", fig))
    tot = result.tables.get("generation_totals")
    if tot is not None and not tot.empty:
        fig, ax = plt.subplots(figsize=(6, 3.5))
        for mode, g in tot.groupby("mode", sort=False):
            ax.plot(g["n_tokens"], g["total_s"], marker="o", markersize=3, label=f"{mode} (measured)")
            ax.plot(g["n_tokens"], g["fit_quadratic_s"], linestyle=":", color="0.4")
        ax.set_xlabel("tokens generated")
        ax.set_ylabel("total time (s)")
        ax.legend(fontsize=7)
        fig.tight_layout()
        figs.append(("The quadratic trap: total generation time with and without the cache (dotted: the n^2 fit)", fig))
    return figs
