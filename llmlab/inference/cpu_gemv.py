"""A single-row float32 GEMV for the CPU decode step: y = b + x @ W on a weight stored input-major.

Why not torch's: a decode step of one sequence multiplies one row by every weight of the model, so its
speed is how fast the weights stream from memory. On a 2-core AMD EPYC one core sums tiny's 23 MB of
weights at 38-41 GB/s (`x.sum()`), while MKL's sgemv, the kernel behind torch.mm for one row, reads them
at 12-13 GB/s (1.7-1.8 ms for the 25 Linears). The loop below reads each weight row once, in memory order,
and adds x[i] times it to y (which stays in L1): 1.1-1.2 ms for the same 25 Linears, one thread.

The summation order is fixed and plain: each y[o] adds x[i] * W[i][o] for i in order (eight rows per pass,
FMA-contracted); nothing is reassociated, so the compiler needs no fast-math to vectorise it (the vector
runs along o). The values differ from MKL's by summation order only (~1e-5 on tiny's logits).

Built at first use with the system's C compiler (`$CC`, else `cc`) for this CPU (-march=native) in well
under a second, cached under ~/.cache/llmlab/kernels keyed by the source, the flags and the CPU. Where
no compiler works, or LLMLAB_CPU_GEMV=0, `kernel()` is None and the engine uses torch's GEMV.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

import torch

SOURCE = r"""
#include <stddef.h>
void llmlab_gemv_f32(const float *restrict x, const float *restrict w, const float *restrict b,
                     float *restrict y, ptrdiff_t in, ptrdiff_t out, ptrdiff_t ld) {
  for (ptrdiff_t o = 0; o < out; ++o) y[o] = b ? b[o] : 0.0f;
  ptrdiff_t i = 0;
  for (; i + 8 <= in; i += 8) {
    const float a0 = x[i], a1 = x[i + 1], a2 = x[i + 2], a3 = x[i + 3];
    const float a4 = x[i + 4], a5 = x[i + 5], a6 = x[i + 6], a7 = x[i + 7];
    const float *r = w + i * ld;
    for (ptrdiff_t o = 0; o < out; ++o)
      y[o] = y[o] + a0 * r[o] + a1 * r[ld + o] + a2 * r[2 * ld + o] + a3 * r[3 * ld + o]
                  + a4 * r[4 * ld + o] + a5 * r[5 * ld + o] + a6 * r[6 * ld + o] + a7 * r[7 * ld + o];
  }
  for (; i < in; ++i) {
    const float a = x[i], *r = w + i * ld;
    for (ptrdiff_t o = 0; o < out; ++o) y[o] += a * r[o];
  }
}
"""
FLAGS = ["-O3", "-march=native", "-mprefer-vector-width=512", "-shared", "-fPIC"]

_lock = threading.Lock()
_state: dict[str, object] = {}  # "fn": the loaded function or None, once tried


def _cpu_key() -> str:
    """What -march=native compiles for: the CPU's model and feature flags (Linux), else the platform."""
    try:
        info = Path("/proc/cpuinfo").read_text()
        lines = [ln for ln in info.splitlines() if ln.startswith(("model name", "flags"))][:2]
        return "\n".join(lines)
    except OSError:
        return platform.processor() + platform.machine()


def cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "llmlab" / "kernels"


def _build() -> Path | None:
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        return None
    key = hashlib.sha256("\0".join([SOURCE, cc, *FLAGS, _cpu_key()]).encode()).hexdigest()[:16]
    lib = cache_dir() / f"gemv-{key}.so"
    if lib.exists():
        return lib
    try:
        lib.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=lib.parent) as tmp:
            src, out = Path(tmp) / "gemv.c", Path(tmp) / "gemv.so"
            src.write_text(SOURCE)
            subprocess.run([cc, *FLAGS, str(src), "-o", str(out)], check=True, capture_output=True, timeout=60)
            os.replace(out, lib)  # atomic: a process building at the same time never loads half a file
    except (OSError, subprocess.SubprocessError):
        return None
    return lib


def kernel():
    """The compiled GEMV (a ctypes function), or None where it cannot be built; tried once per process."""
    with _lock:
        if "fn" not in _state:
            fn = None
            if os.environ.get("LLMLAB_CPU_GEMV", "1") != "0":
                lib = _build()
                if lib is not None:
                    try:
                        fn = ctypes.CDLL(str(lib)).llmlab_gemv_f32
                        fn.restype = None
                        fn.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_ssize_t] * 3
                    except OSError:
                        fn = None
            _state["fn"] = fn
        return _state["fn"]


def usable(weight: torch.Tensor) -> bool:
    """Whether `gemv` can read this (out, in) weight: float32 on the CPU, stored input-major (rows of W^T
    contiguous, any row stride: a rank's column slice of a fused weight qualifies)."""
    wt = weight.t()
    return weight.device.type == "cpu" and weight.dtype == torch.float32 and wt.stride(1) == 1 and wt.dim() == 2


def gemv(fn, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """One row x (..., in) times the (out, in) weight (`usable`), plus bias: (..., out)."""
    wt, x = weight.t(), x.contiguous()
    b = None if bias is None else bias.contiguous()  # held until the call returns
    y = torch.empty(*x.shape[:-1], wt.shape[1], dtype=torch.float32)
    fn(x.data_ptr(), wt.data_ptr(), None if b is None else b.data_ptr(), y.data_ptr(), wt.shape[0], wt.shape[1],
       wt.stride(0))
    return y
