"""How the engine holds a model's Linear layers: as weights it calls directly, fused where they share an input,
stored input-major on the CPU. The values never change, only how they are laid out and called.

- `Sliced`: y = x W^T (+ b) by F.linear, without the module call (whose hook checks run on every call; a
  decode step of a small model makes dozens).
- `fuse`: projections that read the same input (q/k/v, gate/up) as one matmul: one weight read, one call
  instead of three or two. The modules' weights become views of the fused tensor, so memory does not grow.
- Input-major storage on the CPU (`cpu_layout`): the (out, in) weight stored as its transpose, so that
  F.linear(x, W) runs as x @ (in, out), a plain row-major GEMM. For the single-row GEMV of a decode step
  MKL's kernel for that layout is faster: on a 2-core AMD EPYC a decode step of the built-in `tiny` took 3.5
  ms instead of 4.2 (fused either way; 150 steps each, interleaved). CUDA keeps nn.Linear's layout. One row
  runs the compiled GEMV of `cpu_kernels` on that layout where a C compiler is there: the same step 3.36 -> 2.91 ms.
- oneDNN's packed weights on the CPU (`cpu_packed`): for two rows or more (a batched decode step, a prefill
  chunk) torch's oneDNN linear on a weight reordered into its blocked layout (what inductor's CPU freezing
  and vLLM's CPU backend call) beats the plain GEMM: the 25 Linears of `tiny` at 32 rows took 5.1-5.3 ms
  instead of 7.9-8.1, at 8 rows 2.7-2.9 instead of 4.2-4.7, one thread; one row stays on MKL's GEMV, which
  is as fast. The packed copy is a second copy of each float32 weight (the modules keep theirs for HF's
  forward): for the CPU's small models, memory for speed. Summation order changes, values do not (~1e-5).

A Linear that is not exactly torch.nn.Linear (a quantized one) is left as it is and called as a module.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from llmlab.inference import cpu_kernels

Proj = Callable[[torch.Tensor], torch.Tensor]


class Sliced:
    """A weight (a Linear's, a rank's slice of one, or several fused): y = x W^T (+ b), no module call.
    On the CPU in float32: one row runs `cpu_kernels` (where it builds); two rows or more run oneDNN's linear
    on a packed copy, packed again when the weight is written in place (load_state_dict, a module's view)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None):
        self.weight, self.bias = weight, bias
        self.packed, self.packed_version = cpu_packed(weight), _version(weight)
        self.gemv = cpu_kernels.kernel() if cpu_kernels.usable(weight) else None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.gemv is not None and x.numel() == x.shape[-1] and x.dtype == torch.float32:
            return cpu_kernels.gemv(self.gemv, x, self.weight, self.bias)
        if self.packed is not None and x.numel() >= PACKED_MIN_ROWS * x.shape[-1]:
            if self.packed_version != _version(self.weight):
                self.packed, self.packed_version = cpu_packed(self.weight), _version(self.weight)
            return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")
        return F.linear(x, self.weight, self.bias)


PACKED_MIN_ROWS = 2  # one row (a single sequence's decode step) is a GEMV: cpu_kernels's, else MKL's
PACKED_FOR_ROWS = 64  # the batch size oneDNN packs for; 64 was fastest of 1 / 32 / 64 from 1 to 512 rows


def _version(w: torch.Tensor) -> int | None:
    """The in-place write counter (None for an inference tensor, which keeps none: a rank's slice)."""
    return None if w.is_inference() else w._version


def cpu_packed(w: torch.Tensor) -> torch.Tensor | None:
    """oneDNN's blocked copy of a float32 CPU weight (None elsewhere, or without oneDNN)."""
    if w.device.type != "cpu" or w.dtype != torch.float32 or not torch.backends.mkldnn.is_available():
        return None
    with torch.no_grad():
        return torch.ops.mkldnn._reorder_linear_weight(w.contiguous(), PACKED_FOR_ROWS)


class Fused:
    """Several projections of one input as one matmul: x -> the tuple of their outputs (views of one result)."""

    def __init__(self, proj: Sliced, sizes: list[int]):
        self.proj, self.sizes = proj, sizes

    def __call__(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return self.proj(x).split(self.sizes, dim=-1)


class Separate:
    """Several projections of one input, one call each: x -> the tuple of their outputs."""

    def __init__(self, *projs: Proj):
        self.projs = projs

    def __call__(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(p(x) for p in self.projs)


def is_plain(lin) -> bool:
    return type(lin) is torch.nn.Linear


def cpu_layout(w: torch.Tensor) -> bool:
    """Whether weights like w are stored input-major (see the module docstring): on the CPU."""
    return w.device.type == "cpu"


def _input_major(w: torch.Tensor) -> torch.Tensor:
    """The same (out, in) values stored as a contiguous (in, out): a transposed view (itself if it is one)."""
    return w if w.t().is_contiguous() else w.t().contiguous().t()


def _rebind(module: torch.nn.Module, name: str, value: torch.Tensor) -> None:
    old = getattr(module, name)
    if value is not old:
        setattr(module, name, torch.nn.Parameter(value, requires_grad=old.requires_grad))


def plain(lin, *tied: torch.nn.Module) -> Proj:
    """A plain Linear as its weight (stored input-major on the CPU); anything else as the module itself.
    tied: modules that share the weight (an embedding tied to the LM head) get the re-stored one too."""
    if not is_plain(lin):
        return lin
    if cpu_layout(lin.weight):
        shared = [m for m in tied if m.weight is lin.weight]
        with torch.no_grad():
            _rebind(lin, "weight", _input_major(lin.weight))
        for m in shared:
            m.weight = lin.weight
    return Sliced(lin.weight, lin.bias)


def fuse(owner: torch.nn.Module, name: str, mods: list) -> Fused | Separate:
    """Plain Linears reading the same input as one matmul. Their weights move into one tensor (input-major on
    the CPU) and each module's weight becomes a view of its rows, so memory does not grow; the fused weight is
    kept on `owner` as `name` and reused while the modules still point into it. Other Linears (quantized,
    mixed dtypes or biases) stay separate."""
    biased = {m.bias is not None for m in mods if is_plain(m)}
    if len(biased) != 1 or not all(map(is_plain, mods)) or len({(m.weight.dtype, m.weight.device) for m in mods}) != 1:
        return Separate(*(plain(m) for m in mods))
    sizes = [m.out_features for m in mods]
    starts = [sum(sizes[:i]) for i in range(len(mods))]
    cached = getattr(owner, name, None)
    if cached is not None and all(m.weight.data_ptr() == cached.proj.weight[s].data_ptr()
                                  for m, s in zip(mods, starts, strict=True)):
        return cached
    with torch.no_grad():
        if cpu_layout(mods[0].weight):
            w = torch.cat([m.weight.t() for m in mods], dim=1).t()  # (sum of outputs, in), stored (in, sum)
        else:
            w = torch.cat([m.weight for m in mods])  # (sum of outputs, in)
        b = torch.cat([m.bias for m in mods]) if biased == {True} else None
    for m, s, n in zip(mods, starts, sizes, strict=True):
        _rebind(m, "weight", w[s : s + n])
        if b is not None:
            _rebind(m, "bias", b[s : s + n])
    cached = Fused(Sliced(w, b), sizes)
    object.__setattr__(owner, name, cached)  # not a submodule: no state_dict entry
    return cached
