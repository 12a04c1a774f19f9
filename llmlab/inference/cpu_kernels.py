"""The engine's compiled float32 CPU kernels (cpu_kernels.c): a single-row GEMV, and a whole decode step
of one sequence through every layer.

Why not torch's: a decode step of one sequence multiplies one row by every weight of the model, so its
speed is how fast the weights stream from memory. On a 2-core AMD EPYC one core sums tiny's 23 MB of
weights at 38-41 GB/s (`x.sum()`), while MKL's sgemv, the kernel behind torch.mm for one row, reads them
at 12-13 GB/s (1.7-1.8 ms for the 25 Linears). `gemv` reads each weight row once, in memory order, and adds
x[i] times it to y (which stays in L1): 1.1-1.2 ms for the same 25 Linears, one thread. Around those
GEMVs a torch decode step of one row is ~150 small ops (RMSNorm, RoPE, the paged gathers, SDPA), each
3-50 us of dispatch for a few hundred floats of work: `decode` runs the whole step as one call.

Sums run in a fixed, plain order (eight weight rows per pass, FMA-contracted; no fast-math), so values
differ from torch's by summation order only (~1e-5 on tiny's logits).

Built at first use with the system's C compiler (`$CC`, else `cc`) for this CPU (-march=native) in well
under a second, cached under ~/.cache/llmlab/kernels keyed by the source, the flags and the CPU. Where
no compiler works, or LLMLAB_CPU_KERNELS=0, `library()` is None and the engine runs torch's ops.
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

SOURCE_FILE = Path(__file__).with_name("cpu_kernels.c")
FLAGS = ["-O3", "-march=native", "-mprefer-vector-width=512", "-shared", "-fPIC", "-lm"]

_lock = threading.Lock()
_state: dict[str, object] = {}  # "lib": the loaded library or None, once tried


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
    source = SOURCE_FILE.read_text()
    key = hashlib.sha256("\0".join([source, cc, *FLAGS, _cpu_key()]).encode()).hexdigest()[:16]
    lib = cache_dir() / f"cpu-{key}.so"
    if lib.exists():
        return lib
    try:
        lib.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=lib.parent) as tmp:
            src, out = Path(tmp) / "kernels.c", Path(tmp) / "kernels.so"
            src.write_text(source)
            subprocess.run([cc, str(src), *FLAGS, "-o", str(out)], check=True, capture_output=True, timeout=60)
            os.replace(out, lib)  # atomic: a process building at the same time never loads half a file
    except (OSError, subprocess.SubprocessError):
        return None
    return lib


class Layer(ctypes.Structure):
    """cpu_kernels.c's llmlab_layer: one decoder layer's weights (input-major, row stride ld) and KV cache."""

    _fields_ = [("input_norm", ctypes.c_void_p), ("post_norm", ctypes.c_void_p),
                ("qkv", ctypes.c_void_p), ("qkv_bias", ctypes.c_void_p), ("qkv_ld", ctypes.c_ssize_t),
                ("o", ctypes.c_void_p), ("o_bias", ctypes.c_void_p), ("o_ld", ctypes.c_ssize_t),
                ("gate_up", ctypes.c_void_p), ("gate_up_bias", ctypes.c_void_p), ("gate_up_ld", ctypes.c_ssize_t),
                ("down", ctypes.c_void_p), ("down_bias", ctypes.c_void_p), ("down_ld", ctypes.c_ssize_t),
                ("k_cache", ctypes.c_void_p), ("v_cache", ctypes.c_void_p)]


class Dims(ctypes.Structure):
    _fields_ = [("hidden", ctypes.c_ssize_t), ("heads", ctypes.c_ssize_t), ("kv_heads", ctypes.c_ssize_t),
                ("head_dim", ctypes.c_ssize_t), ("intermediate", ctypes.c_ssize_t), ("block_size", ctypes.c_ssize_t),
                ("eps", ctypes.c_float), ("scale", ctypes.c_float)]


def library():
    """The compiled kernels (a ctypes library, argument types set), or None where they cannot be built;
    tried once per process. ctypes releases the GIL for each call."""
    with _lock:
        if "lib" not in _state:
            lib = None
            if os.environ.get("LLMLAB_CPU_KERNELS", "1") != "0":
                path = _build()
                if path is not None:
                    try:
                        lib = ctypes.CDLL(str(path))
                        lib.llmlab_gemv_f32.restype = None
                        lib.llmlab_gemv_f32.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_ssize_t] * 3
                        lib.llmlab_decode_f32.restype = ctypes.c_int
                        lib.llmlab_decode_f32.argtypes = [ctypes.c_void_p, ctypes.POINTER(Layer), ctypes.c_ssize_t,
                                                          ctypes.POINTER(Dims), ctypes.c_void_p, ctypes.c_void_p,
                                                          ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_ssize_t]
                    except (OSError, AttributeError):
                        lib = None
            _state["lib"] = lib
        return _state["lib"]


def kernel():
    """The compiled GEMV (`gemv`'s first argument), or None."""
    lib = library()
    return None if lib is None else lib.llmlab_gemv_f32


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
