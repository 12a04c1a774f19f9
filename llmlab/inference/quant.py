"""Quantizers, written out: each format is a `quantize` (FP32 tensor -> packed tensors) and a
`dequantize` (packed -> FP32), with the formula beside it; `QTensor.nbytes` counts the packed bytes.

Weight formats (a matrix W of shape (N out, K in); "channel" = one output row):
- fp32: identity. bf16 / fp16: W.to(dtype), dequantize = .float().
- int8 (per-channel symmetric): s_n = max_k |W_nk| / 127 (FP32),  q = clamp(round(W / s), -127, 127) (int8),
  W' = q * s.  Error per element <= s_n / 2.
- int4-gG (group-wise symmetric, G in the input dimension): s = max|W_group| / 7, rounded *up* to FP16 so
  |W / s| <= 7 stays true,  q = round(W / s) in [-7, 7], stored as q + 8 in [1, 15], two per byte.
  W' = (q - 8) * s.  Error <= s / 2.
- int4-gG-asym: s = (max - min) / 15 (FP16, rounded up), zero z = round(-min / s) in [0, 15] (uint8),
  q = clamp(round(W / s) + z, 0, 15), W' = (q - z) * s.
- fp8-tensor / fp8-channel (E4M3, max 448): s = amax / 448 (FP32, one per tensor or per row),
  q = (W / s).to(float8_e4m3fn), W' = q.float() * s.

KV formats (a cache tensor of shape (B, H kv heads, T, D)):
- bf16: 2 bytes. fp8 (E4M3) with one FP32 scale per head: s_h = amax_h / 448.
- int8 with one FP32 scale per (token, head): s = max_d |x| / 127.
- nvfp4: E2M1 values (4 bits), one FP8 E4M3 scale per block of 16 consecutive values (along D),
  one FP32 scale per tensor:  s_g = amax / (6 * 448),  s_b = fp8(amax_block / 6 / s_g),
  q = e2m1(x / (s_b * s_g)),  x' = value(q) * s_b * s_g.
  E2M1 (1 sign, 2 exponent bits with bias 1, 1 mantissa bit): code = s e1 e0 m;
  e = 0: value = m * 0.5 (subnormal: 0, 0.5); e > 0: value = 2^(e - 1) * (1 + m / 2)
  -> magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6. Encoding rounds to nearest, ties to the even code.

References:
- NVFP4: NVIDIA, "Introducing NVFP4 for Efficient and Accurate Low-Precision Inference" (2025) and
  "Optimizing Inference for Long Context and Large Batch Sizes with NVFP4 KV Cache" (E. Alvarez, 2025-12-08);
  OCP Microscaling Formats (MX) v1.0 spec, section 5.3.3 (FP4 E2M1 encoding).
- FP8 E4M3: Micikevicius et al. 2022, "FP8 Formats for Deep Learning" (arXiv 2209.05433): max 448.
- GPTQ (arXiv 2210.17323) / AWQ (arXiv 2306.00978): group-wise INT4 weight-only, FP16 scales.
- LLM.int8() (arXiv 2208.07339): per-channel absmax INT8.
- torch._weight_int8pack_mm: PyTorch's weight-only INT8 matmul (CPU kernel; a naive CUDA one from torch 2.9;
  also used by gpt-fast). torch._weight_int4pack_mm (tinygemm, CUDA sm80+, BF16) and _weight_int4pack_mm_for_cpu:
  weight-only INT4, dequantized as (q - 8) x scale + zero per group (gpt-fast, torchao's int4 weight-only).
  torch._scaled_mm: FP8 E4M3 GEMM on FP8 tensor cores (sm89+), per-tensor or row-wise FP32 scales.

Kernel paths (`QuantLinear.path`): each format takes the real kernel this device has, else it is
dequantized to FP32 every call ("dequantize+FP32 (emul)": the emulation's speed, not the format's).
A kernel is probed once per device against x @ W'^T (W' the dequantized weight) before any layer
uses it: an op this torch lacks on the device, or a wrong answer, falls back to the emulation.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

HAS_FP8 = hasattr(torch, "float8_e4m3fn")  # torch >= 2.1
FP8_MAX = 448.0  # largest finite E4M3 (S.1111.110 = 1.75 x 2^8)
E2M1_MAX = 6.0
NVFP4_BLOCK = 16

WEIGHT_FORMATS = ("fp32", "bf16", "fp16", "int8", "int4-g32", "int4-g128", "int4-g32-asym", "int4-g128-asym",
                  "fp8-tensor", "fp8-channel")
KV_FORMATS = ("fp32", "bf16", "fp8", "int8", "nvfp4")
_INT4 = re.compile(r"^int4-g(\d+)(-asym)?$")


def check_weight_format(name: str) -> None:
    """ValueError for a name that is not a weight format (int4-gG takes any G >= 2; it must divide K later)."""
    m = _INT4.match(name)
    if name in WEIGHT_FORMATS or (m and int(m.group(1)) >= 2 and int(m.group(1)) % 2 == 0):
        return
    raise ValueError(f"unknown weight format '{name}': use one of {', '.join(WEIGHT_FORMATS)} (int4-gG: any even G)")


def check_kv_format(name: str) -> None:
    if name not in KV_FORMATS:
        raise ValueError(f"unknown KV format '{name}': use one of {', '.join(KV_FORMATS)}")


def needs_fp8(name: str) -> bool:
    return name.startswith("fp8") or name == "nvfp4"


def runnable(names) -> list[str]:
    """The formats this torch can run (FP8 and NVFP4 need torch.float8_e4m3fn)."""
    return [n for n in names if HAS_FP8 or not needs_fp8(n)]


@dataclass
class QTensor:
    """A quantized tensor: the packed parts (what would be stored) and how to read them back."""

    fmt: str
    shape: tuple[int, ...]
    parts: dict[str, torch.Tensor] = field(default_factory=dict)

    @property
    def nbytes(self) -> int:
        """Bytes of the packed tensors, counted from the tensors themselves."""
        return sum(t.numel() * t.element_size() for t in self.parts.values())


# ---------------------------------------------------------------- weights


def _round_up_fp16(s: torch.Tensor) -> torch.Tensor:
    """s in FP16, rounded up (so x / s never leaves the code range)."""
    h = s.half()
    return torch.where(h.float() < s, torch.nextafter(h, torch.full_like(h, float("inf"))), h)


def _pack4(u: torch.Tensor) -> torch.Tensor:
    """Codes 0..15 (..., K) -> bytes (..., K / 2): low nibble = even index, high nibble = odd index."""
    u = u.to(torch.uint8)
    return u[..., 0::2] | (u[..., 1::2] << 4)


def _unpack4(b: torch.Tensor) -> torch.Tensor:
    """Bytes (..., K / 2) -> codes (..., K) as int16."""
    lo, hi = (b & 0x0F).to(torch.int16), (b >> 4).to(torch.int16)
    return torch.stack([lo, hi], dim=-1).flatten(-2)


def quantize_weight(w: torch.Tensor, fmt: str) -> QTensor:
    """w (N, K) FP32 -> QTensor in `fmt` (see the module docstring for each formula)."""
    check_weight_format(fmt)
    w = w.detach().float()
    n, k = w.shape
    if fmt == "fp32":
        return QTensor(fmt, (n, k), {"w": w.clone()})
    if fmt in ("bf16", "fp16"):
        return QTensor(fmt, (n, k), {"w": w.to(torch.bfloat16 if fmt == "bf16" else torch.float16)})
    if fmt == "int8":
        amax = w.abs().amax(dim=1, keepdim=True)  # (N, 1)
        s = torch.where(amax > 0, amax / 127, torch.ones_like(amax))
        q = torch.clamp(torch.round(w / s), -127, 127).to(torch.int8)
        return QTensor(fmt, (n, k), {"q": q, "scale": s.squeeze(1)})
    if fmt.startswith("fp8"):
        if not HAS_FP8:
            raise ValueError(f"{fmt} needs torch.float8_e4m3fn (torch >= 2.1)")
        amax = w.abs().amax() if fmt == "fp8-tensor" else w.abs().amax(dim=1)  # () or (N,)
        s = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax)).reshape(-1)
        scaled = w / (s if fmt == "fp8-tensor" else s[:, None])
        return QTensor(fmt, (n, k), {"q": scaled.to(torch.float8_e4m3fn), "scale": s})
    m = _INT4.match(fmt)
    g = int(m.group(1))
    if k % g:
        raise ValueError(f"group size {g} does not divide the input dimension {k}")
    wg = w.reshape(n, k // g, g)  # (N, groups, G)
    if not m.group(2):  # symmetric
        amax = wg.abs().amax(dim=2, keepdim=True)
        s = _round_up_fp16(torch.where(amax > 0, amax / 7, torch.ones_like(amax)))  # (N, groups, 1) fp16
        q = torch.clamp(torch.round(wg / s.float()), -7, 7) + 8  # codes 1..15
        return QTensor(fmt, (n, k), {"q": _pack4(q.reshape(n, k)), "scale": s.squeeze(2)})
    lo, hi = wg.amin(dim=2, keepdim=True), wg.amax(dim=2, keepdim=True)
    s = _round_up_fp16(torch.where(hi > lo, (hi - lo) / 15, torch.ones_like(hi)))
    z = torch.clamp(torch.round(-lo / s.float()), 0, 15)  # (N, groups, 1)
    q = torch.clamp(torch.round(wg / s.float()) + z, 0, 15)
    return QTensor(
        fmt, (n, k), {"q": _pack4(q.reshape(n, k)), "scale": s.squeeze(2), "zero": z.squeeze(2).to(torch.uint8)}
    )


def dequantize_weight(qt: QTensor) -> torch.Tensor:
    """QTensor -> FP32 (N, K)."""
    n, k = qt.shape
    p = qt.parts
    if qt.fmt in ("fp32", "bf16", "fp16"):
        return p["w"].float()
    if qt.fmt == "int8":
        return p["q"].float() * p["scale"][:, None]
    if qt.fmt.startswith("fp8"):
        s = p["scale"]
        return p["q"].float() * (s if s.numel() == 1 else s[:, None])
    q = _unpack4(p["q"]).reshape(n, p["scale"].shape[1], -1).float()  # (N, groups, G)
    z = p["zero"].float()[..., None] if "zero" in p else 8.0
    return ((q - z) * p["scale"].float()[..., None]).reshape(n, k)


def weight_bytes_formula(n: int, k: int, fmt: str) -> int:
    """Bytes of one (N, K) matrix: bits x params / 8 + scales (+ zero points)."""
    if fmt in ("fp32", "bf16", "fp16"):
        return n * k * (4 if fmt == "fp32" else 2)
    if fmt == "int8":
        return n * k + 4 * n  # 1 byte per value + one FP32 scale per row
    if fmt == "fp8-tensor":
        return n * k + 4
    if fmt == "fp8-channel":
        return n * k + 4 * n
    m = _INT4.match(fmt)
    groups = n * k // int(m.group(1))
    return n * k // 2 + 2 * groups + (groups if m.group(2) else 0)  # 4 bits + FP16 scale (+ uint8 zero) per group


def error_bound(qt: QTensor) -> torch.Tensor:
    """Per-element bound on |W - W'| from rounding alone: s / 2 (int8, int4 sym), s (asym: the zero rounds too)."""
    n, k = qt.shape
    s = qt.parts["scale"].float()
    if qt.fmt == "int8":
        return (s / 2)[:, None].expand(n, k)
    s = s.repeat_interleave(k // s.shape[1], dim=1)
    return s if "zero" in qt.parts else s / 2


# ---------------------------------------------------------------- E2M1 and NVFP4


def e2m1_value(code: torch.Tensor) -> torch.Tensor:
    """Codes 0..15 -> values, from the bits: sign = bit 3, exponent = bits 2-1 (bias 1), mantissa = bit 0."""
    code = code.to(torch.int64)
    sign = torch.where((code >> 3) & 1 == 1, -1.0, 1.0)
    e, m = (code >> 1) & 3, (code & 1).float()
    mag = torch.where(e == 0, 0.5 * m, torch.pow(2.0, (e - 1).float()) * (1 + m / 2))
    return sign * mag


# Rounding x (|x| <= 6) to the E2M1 grid: the midpoints between neighbouring magnitudes. At a midpoint
# the even code wins: 0.25 -> 0 (code 0), 0.75 -> 1 (code 2), 1.25 -> 1 (2), 1.75 -> 2 (4), 2.5 -> 2 (4),
# 3.5 -> 4 (6), 5 -> 4 (6). "up" midpoints round a tie up, the others round it down.
_MIDPOINTS = ((0.25, False), (0.75, True), (1.25, False), (1.75, True), (2.5, False), (3.5, True), (5.0, False))


def e2m1_encode(x: torch.Tensor) -> torch.Tensor:
    """Values -> codes 0..15 (uint8): round to nearest, ties to even, saturate at +-6."""
    a = x.abs().clamp(max=E2M1_MAX)
    mag = torch.zeros_like(a, dtype=torch.int64)
    for mid, tie_up in _MIDPOINTS:
        mag += (a >= mid) if tie_up else (a > mid)
    neg = (x < 0) & (mag > 0)  # -0 is stored as +0
    return (mag + 8 * neg).to(torch.uint8)


def nvfp4_quantize(x: torch.Tensor) -> QTensor:
    """x (..., D), D a multiple of 16 -> NVFP4: E2M1 codes (two per byte), FP8 E4M3 block scales, FP32 tensor scale."""
    if not HAS_FP8:
        raise ValueError("nvfp4 needs torch.float8_e4m3fn for its block scales (torch >= 2.1)")
    shape = tuple(x.shape)
    if shape[-1] % NVFP4_BLOCK:
        raise ValueError(f"nvfp4 needs the last dimension to be a multiple of {NVFP4_BLOCK}, got {shape[-1]}")
    x = x.detach().float()
    blocks = x.reshape(-1, NVFP4_BLOCK)  # (n_blocks, 16)
    amax = x.abs().amax()
    s_g = torch.where(amax > 0, amax / (E2M1_MAX * FP8_MAX), torch.ones_like(amax))  # FP32 per tensor, on x's device
    s_b = (blocks.abs().amax(dim=1) / E2M1_MAX / s_g).to(torch.float8_e4m3fn)  # (n_blocks,) E4M3
    scale = s_b.float() * s_g  # (n_blocks,) effective block scale
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    codes = e2m1_encode(blocks / safe[:, None])
    return QTensor("nvfp4", shape, {"q": _pack4(codes), "block_scale": s_b, "tensor_scale": s_g.reshape(1).float()})


def nvfp4_dequantize(qt: QTensor) -> torch.Tensor:
    p = qt.parts
    vals = e2m1_value(_unpack4(p["q"]))  # (n_blocks, 16)
    return (vals * (p["block_scale"].float() * p["tensor_scale"])[:, None]).reshape(qt.shape)


# ---------------------------------------------------------------- KV cache


def quantize_kv(x: torch.Tensor, fmt: str) -> QTensor:
    """x (B, H, T, D) -> QTensor in a KV format."""
    check_kv_format(fmt)
    x = x.detach().float()
    if fmt == "fp32":
        return QTensor(fmt, tuple(x.shape), {"x": x.clone()})
    if fmt == "bf16":
        return QTensor(fmt, tuple(x.shape), {"x": x.to(torch.bfloat16)})
    if fmt == "nvfp4":
        return nvfp4_quantize(x)
    if fmt == "fp8":
        if not HAS_FP8:
            raise ValueError("fp8 KV needs torch.float8_e4m3fn (torch >= 2.1)")
        amax = x.abs().amax(dim=(0, 2, 3))  # (H,): one scale per head
        s = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
        return QTensor(fmt, tuple(x.shape), {"q": (x / s[None, :, None, None]).to(torch.float8_e4m3fn), "scale": s})
    amax = x.abs().amax(dim=3, keepdim=True)  # (B, H, T, 1): one scale per token and head
    s = torch.where(amax > 0, amax / 127, torch.ones_like(amax))
    return QTensor(fmt, tuple(x.shape), {"q": torch.clamp(torch.round(x / s), -127, 127).to(torch.int8), "scale": s})


def dequantize_kv(qt: QTensor) -> torch.Tensor:
    p = qt.parts
    if qt.fmt in ("fp32", "bf16"):
        return p["x"].float()
    if qt.fmt == "nvfp4":
        return nvfp4_dequantize(qt)
    if qt.fmt == "fp8":
        return p["q"].float() * p["scale"][None, :, None, None]
    return p["q"].float() * p["scale"]


def kv_bytes_formula(b: int, h: int, t: int, d: int, fmt: str) -> int:
    """Bytes of one (B, H, T, D) K or V tensor: the kvcache formula's values + this format's scales."""
    n = b * h * t * d
    if fmt in ("fp32", "bf16"):
        return n * (4 if fmt == "fp32" else 2)
    if fmt == "fp8":
        return n + 4 * h  # FP32 scale per head
    if fmt == "int8":
        return n + 4 * b * h * t  # FP32 scale per token and head
    return n // 2 + n // NVFP4_BLOCK + 4  # 4-bit values + one E4M3 byte per 16 + one FP32 per tensor


def kv_bytes_per_value(fmt: str, head_dim: int) -> float:
    """Long-context bytes per cached value (per-tensor and per-head scales amortise to 0)."""
    return {"fp32": 4.0, "bf16": 2.0, "fp8": 1.0, "int8": 1.0 + 4 / head_dim, "nvfp4": 0.5 + 1 / NVFP4_BLOCK}[fmt]


def qdq_kv(x: torch.Tensor, fmt: str) -> torch.Tensor:
    """Quantize then dequantize (what attention reads back), in x's dtype."""
    return dequantize_kv(quantize_kv(x, fmt)).to(x.dtype)


# ---------------------------------------------------------------- modules


EMUL = "dequantize+FP32 (emul)"  # unpack + scale to FP32, then an FP32 matmul: no kernel for the format
KERNEL_TOL = 2e-2  # a kernel path = x @ W'^T within 2% (relative, Frobenius): BF16 activations/output round at 2^-8
INT4_KERNEL_GROUPS = (32, 64, 128, 256)  # the group sizes tinygemm takes


def _capability(device: torch.device) -> tuple[int, int] | None:
    return torch.cuda.get_device_capability(device) if device.type == "cuda" else None


def kernel_path(fmt: str, device: torch.device) -> str:
    """The path `fmt` is meant to take on `device`, before the probe: a kernel's name, or EMUL where there is none.
    FP8 GEMM needs FP8 tensor cores (compute capability >= 8.9); tinygemm INT4 needs sm80+."""
    device = torch.device(device)
    cc = _capability(device)
    if fmt in ("fp32", "bf16", "fp16"):
        return f"{fmt.upper()} matmul (kernel)"
    if fmt == "int8":
        return "int8pack_mm (naive CUDA kernel)" if cc else "int8pack_mm (kernel)"
    m = _INT4.match(fmt)
    if m and int(m.group(1)) in INT4_KERNEL_GROUPS:
        if cc and cc >= (8, 0):
            return "int4pack_mm (tinygemm, BF16)"
        if cc is None and hasattr(torch, "_weight_int4pack_mm_for_cpu"):
            return "int4pack_mm_for_cpu (kernel)"
    if fmt.startswith("fp8") and cc and cc >= (8, 9) and hasattr(torch, "_scaled_mm"):
        return "_scaled_mm FP8 (tensor cores)"
    return EMUL


# ---- each kernel: a layout check, a pack (QTensor -> the tensors the op reads), the op on x (M, K)


def _fits(path: str, n: int, k: int) -> bool:
    """The layouts the ops take: tinygemm and the CPU INT4 pack want N % 16 and K % 32; FP8 GEMM K and N % 16."""
    if path.startswith("int4pack"):
        return n % 16 == 0 and k % 32 == 0
    if path.startswith("_scaled_mm"):
        return n % 16 == 0 and k % 16 == 0
    return True


def int4_scales_and_zeros(qt: QTensor, dtype: torch.dtype) -> torch.Tensor:
    """(groups, N, 2) [scale, zero] for W' = (q - 8) x scale + zero: symmetric zero 0; asymmetric
    W' = (q - z) s = (q - 8) s + (8 - z) s, so zero = (8 - z) s."""
    s = qt.parts["scale"].float()  # (N, groups)
    zero = (8 - qt.parts["zero"].float()) * s if "zero" in qt.parts else torch.zeros_like(s)
    return torch.stack([s.t(), zero.t()], dim=-1).to(dtype).contiguous()


def int4_cuda_bytes(codes: torch.Tensor) -> torch.Tensor:
    """Codes (N, K) -> (N, K / 2) uint8 as torch._convert_weight_to_int4pack reads them: even index in the HIGH nibble
    (the opposite of `_pack4`)."""
    codes = codes.to(torch.uint8)
    return (codes[:, 0::2] << 4) | codes[:, 1::2]


def _inner_k_tiles(k: int) -> int:
    return next(t for t in (8, 4, 2) if k % (16 * t) == 0)


def _pack(path: str, qt: QTensor) -> dict[str, torch.Tensor]:
    p = qt.parts
    if path.startswith("int8pack"):
        return {"q": p["q"], "scale": p["scale"]}
    if path.startswith("int4pack"):
        codes = _unpack4(p["q"])  # (N, K) in 0..15
        k = qt.shape[1]
        if path.startswith("int4pack_mm_for_cpu"):
            packed = torch._convert_weight_to_int4pack_for_cpu(codes.to(torch.int32), _inner_k_tiles(k))
            return {"q": packed, "sz": int4_scales_and_zeros(qt, torch.float32)}
        packed = torch._convert_weight_to_int4pack(int4_cuda_bytes(codes), _inner_k_tiles(k))
        return {"q": packed, "sz": int4_scales_and_zeros(qt, torch.bfloat16)}
    if path.startswith("_scaled_mm"):
        s = p["scale"]
        scale_b = s.reshape(()) if s.numel() == 1 else s.reshape(1, -1).contiguous()  # per tensor () / row-wise (1, N)
        return {"q": p["q"].contiguous(), "scale_b": scale_b}
    return {"w": p["w"]} if "w" in p else {}


def fp8_activations(x: torch.Tensor, rowwise: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """x (M, K) -> (E4M3 values, FP32 scales): one scale per tensor () or per row (M, 1), amax / 448."""
    amax = (x.abs().amax(dim=1, keepdim=True) if rowwise else x.abs().amax()).float()
    s = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
    return (x.float() / s).to(torch.float8_e4m3fn), s


def _mm(path: str, x: torch.Tensor, packed: dict, group: int) -> torch.Tensor:
    """x (M, K) -> (M, N) through the kernel of `path`."""
    if path.startswith("int8pack"):
        return torch._weight_int8pack_mm(x, packed["q"], packed["scale"].to(x.dtype))
    if path.startswith("int4pack_mm_for_cpu"):
        return torch._weight_int4pack_mm_for_cpu(x.float(), packed["q"], group, packed["sz"])
    if path.startswith("int4pack"):
        return torch._weight_int4pack_mm(x.to(torch.bfloat16), packed["q"], group, packed["sz"])
    # FP8 GEMM: both operands E4M3, the second column-major (the (N, K) row-major weight, transposed), output BF16
    xq, sx = fp8_activations(x, rowwise=packed["scale_b"].dim() == 2)
    return torch._scaled_mm(xq, packed["q"].t(), scale_a=sx, scale_b=packed["scale_b"], out_dtype=torch.bfloat16)


def _reference(path: str, x: torch.Tensor, qt: QTensor) -> torch.Tensor:
    """What the kernel must equal: x @ W'^T in FP32; FP8 GEMM with x rounded to E4M3 the same way first."""
    if path.startswith("_scaled_mm"):
        xq, sx = fp8_activations(x, rowwise=qt.parts["scale"].numel() > 1)
        x = xq.float() * sx
    return x.float() @ dequantize_weight(qt).T


def _group(fmt: str) -> int:
    m = _INT4.match(fmt)
    return int(m.group(1)) if m else 0


_PROBES: dict[tuple[str, str], dict] = {}  # (format, device) -> probe(): measured once per process


def probe(fmt: str, device: torch.device) -> dict:
    """`kernel_path`, checked once per device: the kernel on a (64, 256) weight against the dequantized reference.
    An op missing on this device (e.g. _weight_int8pack_mm on CUDA before torch 2.9) or a wrong answer -> EMUL.
    Returns {format, kernel (the path meant), path (the path taken), rel_err (None: nothing to check), why}."""
    device = torch.device(device)
    key = (fmt, str(device))
    if key not in _PROBES:
        meant = kernel_path(fmt, device)
        row = dict(format=fmt, kernel=meant, path=meant, rel_err=None, why="")
        if meant != EMUL and not meant.endswith("matmul (kernel)"):
            g = torch.Generator().manual_seed(0)
            w, x = torch.randn(64, 256, generator=g).to(device), torch.randn(3, 256, generator=g).to(device)
            try:
                qt = quantize_weight(w, fmt)
                y, ref = _mm(meant, x, _pack(meant, qt), _group(fmt)).float(), _reference(meant, x, qt)
                row["rel_err"] = float((y - ref).norm() / ref.norm())
                if not row["rel_err"] <= KERNEL_TOL:
                    raise ValueError(f"off the dequantized reference by {row['rel_err']:.1e} (> {KERNEL_TOL:g})")
            except (RuntimeError, NotImplementedError, ValueError, TypeError, AttributeError) as exc:
                row.update(path=EMUL, why=(str(exc).splitlines() or [type(exc).__name__])[0][:160])
        _PROBES[key] = row
    return dict(_PROBES[key])


class QuantLinear(torch.nn.Module):
    """A Linear whose weight is stored packed. forward takes the path named in `self.path`: this device's kernel
    for the format (probed once), or EMUL."""

    def __init__(self, linear: torch.nn.Linear | None, fmt: str, weight: torch.Tensor | None = None):
        super().__init__()
        w = linear.weight if linear is not None else weight
        self.qt = quantize_weight(w, fmt)
        self.bias = None if linear is None or linear.bias is None else torch.nn.Parameter(linear.bias.detach().float())
        self.fmt, self.group = fmt, _group(fmt)
        path = probe(fmt, w.device)["path"]
        self.path = path if _fits(path, *self.qt.shape) else EMUL  # a layer the kernel's layout cannot take
        self.packed = _pack(self.path, self.qt) if self.path != EMUL else {}

    @property
    def nbytes(self) -> int:
        """Bytes the forward reads: the kernel's packed tensors, or the format's (EMUL)."""
        return sum(t.numel() * t.element_size() for t in self.packed.values()) if self.packed else self.qt.nbytes

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x (..., K)
        p = self.qt.parts
        if self.fmt == "fp32":
            y = F.linear(x, p["w"])
        elif self.fmt in ("bf16", "fp16"):
            y = F.linear(x.to(p["w"].dtype), p["w"]).to(x.dtype)
        elif self.path == EMUL:
            y = F.linear(x, dequantize_weight(self.qt))
        else:
            x2 = x.reshape(-1, x.shape[-1]).contiguous()  # (M, K): the packed kernels take a contiguous A
            y = _mm(self.path, x2, self.packed, self.group).to(x.dtype).reshape(*x.shape[:-1], -1)
        return y if self.bias is None else y + self.bias


def quantizable(model) -> list[tuple[str, torch.Tensor]]:
    """The model's matrices (dim 2), each storage once: the Linear weights and the (tied) embedding."""
    seen, out = set(), []
    for name, p in model.named_parameters():
        if p.dim() == 2 and p.data_ptr() not in seen:
            seen.add(p.data_ptr())
            out.append((name, p))
    return out


@torch.no_grad()
def fake_quantize_(model, fmt: str) -> dict:
    """Replace every matrix by its quantize-dequantize round trip, in place (weight-only quality, FP32 compute).
    Returns bytes measured from the packed tensors and by formula, matrices and the rest (norms, FP32)."""
    measured = formula = 0
    for _, p in quantizable(model):
        qt = quantize_weight(p, fmt)
        measured += qt.nbytes
        formula += weight_bytes_formula(*p.shape, fmt)
        p.copy_(dequantize_weight(qt))
    mats = {p.data_ptr() for _, p in quantizable(model)}
    other = sum(p.numel() * p.element_size() for p in model.parameters() if p.data_ptr() not in mats)
    return dict(matrix_bytes=measured, matrix_bytes_formula=formula, other_bytes=other)


def quantize_linears(model, fmt: str) -> str:
    """Swap every nn.Linear (and a tied LM head) for a QuantLinear, in place; returns the path they take
    ("A + EMUL" when some layers' shapes do not fit the kernel's layout)."""
    paths = []
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, torch.nn.Linear):
                q = QuantLinear(child, fmt)
                setattr(parent, name, q)
                paths.append(q.path)
    return " + ".join(sorted(set(paths), key=lambda p: p == EMUL))
