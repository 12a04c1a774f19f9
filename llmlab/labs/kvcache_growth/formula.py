"""The KV cache's size by formula: bytes per token = 2 (K and V) x layers x kv_heads x head_dim x bytes per
value, with GQA/MQA (kv_heads < heads), sliding windows (Mistral caps the cache at its window) and cache
dtypes FP32, FP16/BF16, FP8 and 4-bit (plus the bytes of its scales); and the bytes a real cache holds."""

from __future__ import annotations

from dataclasses import dataclass

from llmlab.core.flops import kv_bytes_per_token

GiB, MiB, KiB = 2**30, 2**20, 2**10


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

