"""A decode step of one sequence on the CPU as one compiled call (cpu_kernels.c's llmlab_decode_f32).

Why: one row through a small model is memory-bound in its GEMVs and overhead-bound everywhere else. A
torch step of `tiny` with one sequence is ~150 ops (RMSNorm, RoPE, the cache writes, the paged gathers,
SDPA) whose dispatch costs more than their arithmetic: the fused RMSNorm took 30 us and each block
gather 54 us for a few hundred floats. The kernel does the same arithmetic in one call per step: the
layers' weights are the engine's own fused, input-major tensors (no copy), the K/V go into the
engine's paged cache at the slot the scheduler chose, and attention reads the keys through the block
table in place, with no gather.

`CpuDecoder.build` returns None, and the engine keeps its torch path, unless every layer is what the
kernel computes: float32 on the CPU, q/k/v and gate/up fused, plain (or fused-bias) Linears, SiLU, no
q/k norms, RoPE over the whole head. The model's embedding, rotary module (so RoPE scaling follows the
config), final norm and LM head stay torch's.
"""

from __future__ import annotations

import ctypes

import torch
import torch.nn.functional as F

from llmlab.inference import cpu_kernels
from llmlab.inference.linear import Fused, Sliced
from llmlab.inference.llama import Layer


def _is_silu(act) -> bool:
    probe = torch.linspace(-8, 8, 33)
    return torch.equal(act(probe), F.silu(probe))


def _weight(p) -> Sliced | None:
    """The Sliced behind a projection if the kernel can read it (input-major float32, float32 bias)."""
    s = p.proj if isinstance(p, Fused) else p
    if not isinstance(s, Sliced) or not cpu_kernels.usable(s.weight):
        return None
    if s.bias is not None and (s.bias.dtype != torch.float32 or not s.bias.is_contiguous()):
        return None
    return s


def _supported(layer: Layer, inter: int) -> bool:
    hq, hkv, d = layer.heads, layer.kv_heads, layer.head_dim
    return (isinstance(layer.qkv, Fused) and layer.qkv.sizes == [hq * d, hkv * d, hkv * d]
            and isinstance(layer.gate_up, Fused) and layer.gate_up.sizes == [inter, inter]
            and all(_weight(p) is not None for p in (layer.qkv, layer.o, layer.gate_up, layer.down))
            and layer.q_norm is None and layer.o_bias is None and layer.down_bias is None
            and hq % hkv == 0 and d % 2 == 0 and _is_silu(layer.act)
            and all(w.dtype == torch.float32 and w.is_contiguous() for w in (layer.input_norm, layer.post_norm)))


def _ptr(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


class CpuDecoder:
    """The compiled single-sequence decode step over the engine's layers and paged cache."""

    def __init__(self, lib, layers: list[Layer], k_cache: torch.Tensor, v_cache: torch.Tensor, dims: cpu_kernels.Dims):
        self.lib, self.layers, self.k_cache, self.v_cache, self.dims = lib, layers, k_cache, v_cache, dims  # held
        structs = []
        for li, layer in enumerate(layers):
            qkv, o, gu, down = (_weight(p) for p in (layer.qkv, layer.o, layer.gate_up, layer.down))
            structs.append(cpu_kernels.Layer(
                _ptr(layer.input_norm), _ptr(layer.post_norm),
                _ptr(qkv.weight), _ptr(qkv.bias), qkv.weight.t().stride(0),
                _ptr(o.weight), _ptr(o.bias), o.weight.t().stride(0),
                _ptr(gu.weight), _ptr(gu.bias), gu.weight.t().stride(0),
                _ptr(down.weight), _ptr(down.bias), down.weight.t().stride(0),
                _ptr(k_cache[li]), _ptr(v_cache[li])))
        self.structs = (cpu_kernels.Layer * len(structs))(*structs)

    @classmethod
    def build(cls, layers: list[Layer], k_cache: torch.Tensor, v_cache: torch.Tensor, intermediate: int,
              block_size: int, eps: float, scale: float) -> CpuDecoder | None:
        """The decoder, or None where the kernels are not built or a layer is not what they compute."""
        lib = cpu_kernels.library()
        if lib is None or not layers or k_cache.device.type != "cpu" or k_cache.dtype != torch.float32:
            return None
        if not (k_cache.is_contiguous() and v_cache.is_contiguous()):
            return None
        if not all(_supported(x, intermediate) for x in layers):
            return None
        a = layers[0]
        dims = cpu_kernels.Dims(a.input_norm.shape[0], a.heads, a.kv_heads, a.head_dim, intermediate, block_size,
                                eps, scale)
        return cls(lib, layers, k_cache, v_cache, dims)

    def __call__(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, table: torch.Tensor, n_keys: int,
                 slot: int) -> torch.Tensor:
        """x (1, hidden) float32, written in place and returned; cos/sin (head_dim,) float32 for the token's
        position; table (blocks,) int64; n_keys the sequence's keys with this token's; slot its K/V's slot."""
        assert x.is_contiguous() and cos.is_contiguous() and sin.is_contiguous() and table.dtype == torch.int64
        rc = self.lib.llmlab_decode_f32(x.data_ptr(), self.structs, len(self.layers), ctypes.byref(self.dims),
                                        cos.data_ptr(), sin.data_ptr(), table.data_ptr(), n_keys, slot)
        if rc != 0:
            raise MemoryError("llmlab_decode_f32: out of memory for its scratch buffer")
        return x
