"""One Llama-family decoder layer over rows of tokens, shared by the serving engine and tensor parallelism.

A layer is RMSNorm -> attention (q/k/v projections, optional Qwen3 q/k norms, RoPE, attention,
o projection) -> residual -> RMSNorm -> SwiGLU MLP -> residual. `layer_forward` computes it over
(N, hidden) rows; the caller brings what differs:

- `attend(q, k, v)`: the attention over the caller's KV cache, (N, Hq, D) and (N, Hkv, D) in,
  (N, Hq, D) out. The engine reads a paged cache through block tables; tensor parallelism keeps
  one (B, Hkv, T, D) tensor per layer.
- `reduce(partial)`: the all-reduce of a row-split projection's partial sum, in place (tensor
  parallelism); None when the layer is whole (the engine).

`layers_of(model, rank, world)` gives each layer's parts: at world 1 the model's own weights, q/k/v
and gate/up fused into one matmul each, stored input-major on the CPU (inference/linear.py: the
modules' weights become views of the fused ones, so memory does not grow; biases come along;
quantized Linears stay modules); at world n rank `rank`'s
Megatron slices of the same weights (Shoeybi et al., "Megatron-LM", 2019, section 3): q/k/v
and gate/up column-split, o and down row-split, their biases added once, after the all-reduce.
RMSNorm and RoPE are computed as HF computes them (float32 norm, HF's own rotary module, so RoPE
scaling follows the config). Llama, Mistral (no sliding window: exact only within the window),
Qwen2 and Qwen3.

References:
- HF transformers `models/llama/modeling_llama.py` (rotate_half, apply_rotary_pos_emb, LlamaRMSNorm).
- gpt-fast `model.py`: one small function per block, shape comments.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from llmlab.inference.linear import Fused, Proj, Separate, Sliced, fuse, plain


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x (N, H): x / rms(x) * weight, in float32 as HF computes it, back to x's dtype (and only then times
    the weight). In float32 that order changes nothing, so torch's one fused op does it (one op for six)."""
    if x.dtype == torch.float32 and weight.dtype == torch.float32:
        return F.rms_norm(x, (x.shape[-1],), weight, eps)
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x (N, heads, D), cos/sin (N, 1, D)."""
    return x * cos + rotate_half(x) * sin


def rope(rotary_emb, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin (N, 1, D) for rows x (N, hidden) at `positions` (N,), from the model's own rotary module."""
    cos, sin = rotary_emb(x[None], positions[None])  # (1, N, D) each, scaling included
    return cos[0].unsqueeze(1).to(x.dtype), sin[0].unsqueeze(1).to(x.dtype)


def expand_kv(k: torch.Tensor, groups: int) -> torch.Tensor:
    """(B, Hkv, T, D) -> (B, Hkv * groups, T, D): each KV head repeated for its query heads (GQA made MHA)."""
    return k if groups == 1 else k.repeat_interleave(groups, dim=1)


@dataclass(frozen=True)
class Layer:
    """One decoder layer's parts: projections as callables (weights, fused weights, a rank's slices, or quantized
    modules: inference/linear.py)."""

    input_norm: torch.Tensor  # (hidden,) RMSNorm weight before attention
    post_norm: torch.Tensor  # (hidden,) RMSNorm weight before the MLP
    qkv: Fused | Separate  # (N, hidden) -> q (N, heads * D), k and v (N, kv_heads * D)
    o: Proj  # (N, heads * D) -> (N, hidden): a partial sum when row-split
    gate_up: Fused | Separate  # (N, hidden) -> gate and up (N, intermediate): this rank's columns
    down: Proj  # (N, intermediate) -> (N, hidden): a partial sum when row-split
    act: Callable[[torch.Tensor], torch.Tensor]  # the MLP's activation (SiLU for SwiGLU)
    q_norm: Proj | None  # Qwen3: RMSNorm over head_dim before RoPE; None elsewhere
    k_norm: Proj | None
    heads: int  # query heads in this layer (this rank's share)
    kv_heads: int
    head_dim: int
    o_bias: torch.Tensor | None = None  # a row-split projection's bias, added once after the all-reduce
    down_bias: torch.Tensor | None = None


def head_counts(config) -> tuple[int, int, int]:
    """(query heads, KV heads, head_dim) of an HF config."""
    heads = config.num_attention_heads
    kv = getattr(config, "num_key_value_heads", None) or heads
    return heads, kv, getattr(config, "head_dim", None) or config.hidden_size // heads


def _whole(layer, heads: int, kv: int, hd: int) -> Layer:
    """The whole layer: q/k/v and gate/up fused (one matmul each instead of five), o and down as weights."""
    a, m = layer.self_attn, layer.mlp
    return Layer(layer.input_layernorm.weight, layer.post_attention_layernorm.weight,
                 fuse(a, "_llmlab_qkv", [a.q_proj, a.k_proj, a.v_proj]), plain(a.o_proj),
                 fuse(m, "_llmlab_gate_up", [m.gate_proj, m.up_proj]), plain(m.down_proj), m.act_fn,
                 getattr(a, "q_norm", None), getattr(a, "k_norm", None), heads, kv, hd)


def _column(lin, sl: slice) -> Sliced:
    return Sliced(lin.weight[sl], None if lin.bias is None else lin.bias[sl])


def _shard(layer, rank: int, world: int, heads: int, kv: int, hd: int, inter: int) -> Layer:
    """Rank `rank`'s slices: whole GQA groups of heads, and inter / world MLP columns."""
    hq, hkv = heads // world, kv // world
    q_sl = slice(rank * hq * hd, (rank + 1) * hq * hd)
    kv_sl = slice(rank * hkv * hd, (rank + 1) * hkv * hd)
    i_sl = slice(rank * inter // world, (rank + 1) * inter // world)
    a, m = layer.self_attn, layer.mlp
    return Layer(layer.input_layernorm.weight, layer.post_attention_layernorm.weight,
                 Separate(_column(a.q_proj, q_sl), _column(a.k_proj, kv_sl), _column(a.v_proj, kv_sl)),
                 Sliced(a.o_proj.weight[:, q_sl]), Separate(_column(m.gate_proj, i_sl), _column(m.up_proj, i_sl)),
                 Sliced(m.down_proj.weight[:, i_sl]), m.act_fn, getattr(a, "q_norm", None),
                 getattr(a, "k_norm", None), hq, hkv, hd, o_bias=a.o_proj.bias, down_bias=m.down_proj.bias)


def layers_of(model, rank: int = 0, world: int = 1) -> list[Layer]:
    """Every decoder layer of an HF Llama-family causal LM: whole at world 1, else rank `rank`'s slices.

    At world n the caller has checked that n divides the query heads, the KV heads and the MLP columns.
    """
    c = model.config
    heads, kv, hd = head_counts(c)
    if world == 1:
        return [_whole(layer, heads, kv, hd) for layer in model.model.layers]
    return [_shard(layer, rank, world, heads, kv, hd, c.intermediate_size) for layer in model.model.layers]


def _project_out(proj: Proj, bias: torch.Tensor | None, x: torch.Tensor,
                 reduce: Callable[[torch.Tensor], None] | None) -> torch.Tensor:
    """A row-split projection: the partial sum, all-reduced, then its bias once."""
    y = proj(x)
    if reduce is not None:
        reduce(y)
    return y if bias is None else y + bias


def layer_forward(x: torch.Tensor, layer: Layer, cos: torch.Tensor, sin: torch.Tensor, eps: float,
                  attend: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor],
                  reduce: Callable[[torch.Tensor], None] | None = None) -> torch.Tensor:
    """x (N, hidden) -> (N, hidden) through one decoder layer; cos/sin (N, 1, D) from `rope`."""
    n = x.shape[0]
    h = rms_norm(x, layer.input_norm, eps)
    hq, hkv, d = layer.heads, layer.kv_heads, layer.head_dim
    if isinstance(layer.qkv, Fused) and layer.q_norm is None:  # q and k side by side: RoPE once for both
        out = layer.qkv.proj(h)  # (N, (Hq + 2 Hkv) * D)
        qk = apply_rope(out[:, : (hq + hkv) * d].view(n, hq + hkv, d), cos, sin)
        q, k, v = qk[:, :hq], qk[:, hq:], out[:, (hq + hkv) * d :].view(n, hkv, d)  # (N, Hq, D), (N, Hkv, D) x2
    else:
        q, k, v = layer.qkv(h)
        q, k, v = q.view(n, hq, d), k.view(n, hkv, d), v.view(n, hkv, d)
        if layer.q_norm is not None:
            q, k = layer.q_norm(q), layer.k_norm(k)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    o = attend(q, k, v)  # (N, Hq, D)
    x = x + _project_out(layer.o, layer.o_bias, o.reshape(n, layer.heads * layer.head_dim), reduce)
    h = rms_norm(x, layer.post_norm, eps)
    gate, up = layer.gate_up(h)
    return x + _project_out(layer.down, layer.down_bias, layer.act(gate) * up, reduce)
