"""The kernels the labs rely on, probed one by one on a device: does each exist here, is it right, how fast.

Each probe returns one row {kernel, status, detail}: status "ran" (checked against an FP32/FP64
reference first, then timed), "mismatch" (it ran but disagrees with the reference beyond its bar),
or "not available" with the reason (this torch has no such op, the device lacks the unit, the op
refused the call). A probe never raises: what is missing is a finding, not a crash.

- TF32 vs IEEE FP32 matmul (torch.backends.cuda.matmul fp32 precision): the two rates, TF32's error.
- FP8 `torch._scaled_mm`: E4M3 x E4M3 -> BF16 with FP32 per-tensor scales, second operand
  column-major, K and N multiples of 16; needs compute capability >= 8.9 (Ada, Hopper, Blackwell).
- INT8 `torch._weight_int8pack_mm`: weight-only INT8 (per-output-channel scales) x BF16 (FP32 on the
  CPU) activations, a decode-shaped M = 16; the CUDA kernel exists from torch 2.9.
- INT4 `torch._weight_int4pack_mm` (tinygemm, gpt-fast's layout: uint8 (N, K/2) packed by
  `_convert_weight_to_int4pack`, groups of 128, BF16 scales and zeros (K/128, N, 2), w = (q - 8)
  x scale + zero); sm80+ with BF16 on CUDA, the `_for_cpu` pair on the CPU.
- SDPA: which backend `torch._fused_sdp_choice` picks for the engine's decode attention call
  (one query per sequence, an explicit boolean mask, enable_gqa=True) in FP32 and BF16, and with
  K/V expanded to the query heads instead of enable_gqa.
- Launch gap: the time per tiny kernel when 1,000 are enqueued back to back (timed once around all).
Timing: CUDA events on the current stream on a GPU, time.perf_counter on the CPU; the mean of 10 calls
after 2 warm-up calls (a probe says whether the kernel is there and roughly how fast, not a benchmark).
"""

from __future__ import annotations

import time
from collections.abc import Callable

MATMUL_N = {"cuda": 4096, "cpu": 256}  # square matmul side: big enough to be compute-bound on an H200, quick on a CPU
TF32_BAR = 1e-2  # TF32 keeps 10 mantissa bits: relative error ~1e-3 on a K=4096 dot product
LOW_BAR = 5e-2  # FP8 / INT4 / INT8 kernels against the same quantized operands in FP32


def _row(kernel: str, status: str, detail: str) -> dict:
    return {"kernel": kernel, "status": status, "detail": detail}


def _why(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:160]


def _seconds(fn: Callable, dev, iters: int = 10) -> float:
    """Mean seconds per call after 2 warm-up calls: CUDA events on the stream that ran the work, else perf_counter."""
    import torch

    for _ in range(2):
        fn()
    if dev.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize(dev)
        start.record()
        for _ in range(iters):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3 / iters
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - t0) / iters


def _rel(got, ref) -> float:
    return float((got.float() - ref.float()).abs().max() / ref.float().abs().max().clamp_min(1e-30))


def _cc(dev) -> tuple[int, int]:
    import torch

    return torch.cuda.get_device_capability(dev) if dev.type == "cuda" else (0, 0)


def probe_tf32(dev) -> dict:
    import torch

    from llmlab.core.device import tf32

    if dev.type != "cuda":
        return _row("tf32 matmul", "not available", "TF32 is a CUDA tensor-core mode; the CPU computes FP32 in IEEE")
    n = MATMUL_N["cuda"]
    a, b = torch.randn(n, n, device=dev), torch.randn(n, n, device=dev)
    with tf32(matmul=False):
        ref = a @ b
        t_ieee = _seconds(lambda: a @ b, dev)
    with tf32(matmul=True):
        got = a @ b
        t_tf32 = _seconds(lambda: a @ b, dev)
    err, fl = _rel(got, ref), 2 * n**3 / 1e12
    return _row("tf32 matmul", "ran" if err <= TF32_BAR else "mismatch",
                f"IEEE {fl / t_ieee:.1f} TFLOP/s, TF32 {fl / t_tf32:.1f} TFLOP/s ({t_ieee / t_tf32:.1f}x), "
                f"rel err {err:.1e}")


def probe_fp8(dev) -> dict:
    import torch

    name = "fp8 _scaled_mm"
    if not hasattr(torch, "_scaled_mm") or not hasattr(torch, "float8_e4m3fn"):
        return _row(name, "not available", f"torch {torch.__version__} has no torch._scaled_mm / float8_e4m3fn")
    if dev.type != "cuda" or _cc(dev) < (8, 9):
        return _row(name, "not available",
                    f"needs a CUDA GPU with compute capability >= 8.9 (here: {dev.type} {_cc(dev)})")
    n = MATMUL_N["cuda"]
    a = torch.randn(n, n, device=dev).to(torch.float8_e4m3fn)  # (M, K) row-major
    b = torch.randn(n, n, device=dev).to(torch.float8_e4m3fn).t()  # (K, N) column-major
    one = torch.tensor(1.0, device=dev)
    try:
        run = lambda: torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)  # noqa: E731
        err = _rel(run(), a.float() @ b.float())
        t = _seconds(run, dev)
    except (RuntimeError, TypeError) as exc:
        return _row(name, "not available", _why(exc))
    return _row(name, "ran" if err <= LOW_BAR else "mismatch",
                f"E4M3 {2 * n**3 / t / 1e12:.1f} TFLOP/s, rel err {err:.1e}")


def probe_int8(dev) -> dict:
    import torch

    name = "int8 _weight_int8pack_mm"
    if not hasattr(torch, "_weight_int8pack_mm"):
        return _row(name, "not available", f"torch {torch.__version__} has no torch._weight_int8pack_mm")
    n, dt = MATMUL_N[dev.type], torch.bfloat16 if dev.type == "cuda" else torch.float32
    x = torch.randn(16, n, device=dev, dtype=dt)  # (M, K): a decode batch of 16
    w = torch.randint(-127, 128, (n, n), device=dev, dtype=torch.int8)  # (N, K)
    s = (torch.rand(n, device=dev) / 127).to(dt)  # (N,) per output channel
    try:
        run = lambda: torch._weight_int8pack_mm(x, w, s)  # noqa: E731
        err = _rel(run(), x.float() @ (w.float() * s.float()[:, None]).t())
        t = _seconds(run, dev)
    except (RuntimeError, NotImplementedError) as exc:
        return _row(name, "not available", _why(exc))
    return _row(name, "ran" if err <= LOW_BAR else "mismatch",
                f"M=16, {n}x{n} INT8 weights read at {n * n / t / 1e9:.3g} GB/s, rel err {err:.1e}")


def _int4_ops(dev):
    """(convert, matmul) for this device, or a reason string where the op or the unit is missing."""
    import torch

    if dev.type == "cuda":
        if _cc(dev) < (8, 0):
            return f"the CUDA kernel needs sm80+ (here: {_cc(dev)})"
        ops = ("_convert_weight_to_int4pack", "_weight_int4pack_mm")
    else:
        ops = ("_convert_weight_to_int4pack_for_cpu", "_weight_int4pack_mm_for_cpu")
    missing = [o for o in ops if not hasattr(torch, o)]
    return f"torch {torch.__version__} has no torch.{missing[0]}" if missing else tuple(getattr(torch, o) for o in ops)


def probe_int4(dev, group: int = 128) -> dict:
    import torch

    name = "int4 _weight_int4pack_mm"
    ops = _int4_ops(dev)
    if isinstance(ops, str):
        return _row(name, "not available", ops)
    convert, mm = ops
    n = MATMUL_N[dev.type]
    q = torch.randint(0, 16, (n, n), device=dev, dtype=torch.int32)  # (N, K) 4-bit codes
    scale = torch.rand(n // group, n, device=dev) / 8  # (K / group, N)
    sz = torch.stack([scale, torch.zeros_like(scale)], -1).to(torch.bfloat16)  # (K / group, N, 2): scale, zero
    x = torch.randn(16, n, device=dev, dtype=torch.bfloat16)  # (M, K)
    w = (q - 8).float() * sz[..., 0].float().t().repeat_interleave(group, 1)  # (N, K) dequantized
    try:
        packed = convert((q[:, ::2] << 4 | q[:, 1::2]).to(torch.uint8), 8) if dev.type == "cuda" else convert(q, 8)
        run = lambda: mm(x, packed, group, sz)  # noqa: E731
        err = _rel(run(), x.float() @ w.t())
        t = _seconds(run, dev)
    except (RuntimeError, NotImplementedError, TypeError) as exc:
        return _row(name, "not available", _why(exc))
    return _row(name, "ran" if err <= LOW_BAR else "mismatch",
                f"M=16, {n}x{n} INT4 weights (groups of {group}) read at {n * n / 2 / t / 1e9:.3g} GB/s, "
                f"rel err {err:.1e}")


def probe_sdpa(dev, heads: int = 32, kv_heads: int = 8, head_dim: int = 128, context: int = 512) -> dict:
    """The backend SDPA's dispatcher picks for the engine's decode call (Llama-3-8B's heads), per dtype and layout."""
    import torch
    from torch.nn.attention import SDPBackend

    name = "sdpa backend"
    if not hasattr(torch, "_fused_sdp_choice"):
        return _row(name, "not available", f"torch {torch.__version__} has no torch._fused_sdp_choice")
    picks = []
    for dt in (torch.float32, torch.bfloat16):
        q = torch.randn(8, heads, 1, head_dim, device=dev, dtype=dt)  # (B, Hq, 1, D): one new token per sequence
        k = torch.randn(8, kv_heads, context, head_dim, device=dev, dtype=dt)  # (B, Hkv, S, D)
        mask = torch.ones(8, 1, 1, context, device=dev, dtype=torch.bool)  # (B, 1, 1, S)
        kx = k.repeat_interleave(heads // kv_heads, 1)  # (B, Hq, S, D)
        for label, kk, gqa in (("gqa", k, True), ("expanded", kx, False)):
            try:
                pick = SDPBackend(torch._fused_sdp_choice(q, kk, kk, mask, 0.0, False, scale=None, enable_gqa=gqa)).name
            except (RuntimeError, TypeError, ValueError) as exc:
                pick = f"refused ({_why(exc)[:40]})"
            picks.append(f"{str(dt).removeprefix('torch.')}+mask+{label}: {pick}")
    return _row(name, "ran", "; ".join(picks))


def probe_launch(dev, n: int = 1000) -> dict:
    import torch

    x = torch.zeros(1, device=dev)
    t = _seconds(lambda: [x.add_(1) for _ in range(n)], dev, iters=3)
    return _row("launch gap", "ran", f"{t / n * 1e6:.2f} us per tiny kernel ({n} back-to-back add_, synchronized once)")


PROBES = (probe_tf32, probe_fp8, probe_int8, probe_int4, probe_sdpa, probe_launch)


def probe_all(device: str) -> list[dict]:
    """Every probe on `device` ('cpu', 'cuda', 'cuda:N'); one that raises becomes a 'not available' row."""
    import torch

    dev = torch.device(device)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)  # the events and the current stream are this device's
    rows = []
    for probe in PROBES:
        try:
            rows.append(probe(dev))
        except Exception as exc:  # noqa: BLE001  (a probe that breaks is recorded, the others still run)
            rows.append(_row(probe.__name__.removeprefix("probe_"), "not available", _why(exc)))
    return rows
