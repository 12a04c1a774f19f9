"""The gpu-parallelism lab's Config and constants: light imports only (the CLI reads it without torch)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from llmlab.core.config import opt
from llmlab.core.device import cpu_cores

LAB = "gpu-parallelism"
VERSION = 2  # 2: GPU sizes timed with L2 flushed; wave table with predicted boundaries; core.timing.interleaved
PARTS = ("sizes", "waves", "tensor-cores", "launch", "alexnet", "copies")
WORKS = ("elementwise", "reduction", "matmul")
TILE = 128  # the output tile one SM computes in the wave model (cuBLAS picks its own; 128 is typical)
CONV1 = dict(c_in=3, hw=227, c_out=96, k=11, stride=4)  # AlexNet conv1 -> 55x55 output


def cpu_way(threads: int) -> str:
    """A CPU row's name in the tables: "cpu 1 thread", "cpu 2 threads"."""
    return f"cpu {threads} thread{'s' if threads > 1 else ''}"


def _half_decades(lo: int, hi: int) -> tuple[int, ...]:
    out, e = [], math.log10(lo)
    while 10**e <= hi * 1.001:
        out.append(int(round(10**e)))
        e += 0.5
    return tuple(out)


@dataclass(frozen=True)
class Config:
    """See parallelism: the same work as a Python loop, on 1..N CPU threads, and on the GPU.

    A CPU has a handful of strong cores; a GPU thousands of simple ones in SMs, plus tensor cores for matmuls.
    This lab times an FMA, a reduction and a matmul at growing sizes four ways and finds where the GPU starts to
    win (below it, launch and copy overhead dominate); it shows the CPU's thread scaling against ideal, the
    wave-quantization saw-tooth around the SM count, FP32 vs TF32/BF16/FP16 (and whether the CPU has AMX), B small
    matmuls vs one bmm, AlexNet's conv1 at batch 128, and host<->device copy bandwidth. Without a GPU the GPU parts
    say "not measured: no GPU".
    """

    # L1-resident (4 KB) to 4x the RAM traffic of any LLC
    sizes: tuple[int, ...] = opt(_half_decades(10**3, 10**8), help="Elements of the FMA and sum sweeps, "
                                                                   "comma-separated (>= 1).")
    # 8 KFLOP to 17 GFLOP
    matmul_ns: tuple[int, ...] = opt((16, 32, 64, 128, 256, 512, 1024, 2048), help="n of the n x n @ n x n matmul "
                                                                                   "sweep, comma-separated.")
    # ~0.1 s per call at ~250 ns per op
    python_max_ops: int = opt(3 * 10**5, help="Largest Python-loop call, in inner ops (0 = no Python loop).")
    max_threads: int | None = opt(None, help="Top of the CPU thread sweep (auto: every usable CPU).")
    # at least 3 samples each
    budget_s: float = opt(0.3, help="Seconds spent per measured point (> 0).")
    # 2 GFLOP, compute bound, ~0.1 s on 2 cores
    tc_n_cpu: int = opt(1024, help="n of the CPU's FP32-vs-BF16 matmul.")
    # 1.1 TFLOP, compute bound on any data-centre GPU
    tc_n_gpu: int = opt(8192, help="n of the GPU's per-dtype matmul (FP32, TF32, BF16, FP16).")
    # enough work per tile to be compute bound
    wave_k: int = opt(4096, help="Inner dimension K of the wave-quantization sweep.")
    wave_max_waves: int = opt(6, help="Full waves of 128x128 tiles the wave sweep covers.")
    # 4 points per 128-row wave boundary
    wave_step: int = opt(32, help="M step of the wave sweep (1..128).")
    # 1000 launches make the overhead visible
    launch_count: int = opt(1000, help="B: small matmuls run one by one against one batched bmm.")
    # 65 KFLOP, less work than one launch costs
    launch_n: int = opt(32, help="n of each small n x n x n matmul of the launch-overhead part.")
    # AlexNet's training batch size
    conv_batch: int = opt(128, help="AlexNet conv1 batch size.")
    # latency- to bandwidth-bound
    copy_sizes_mb: tuple[int, ...] = opt((1, 4, 16, 64, 256), help="Host<->device copy sizes in MiB, "
                                                                   "comma-separated.")
    parts: tuple[str, ...] = opt(PARTS, help="Run only these parts (repeatable): sizes, waves, tensor-cores, "
                                             "launch, alexnet, copies.", flag="--only")
    seed: int = 0

    def __post_init__(self):
        for name in ("sizes", "matmul_ns", "copy_sizes_mb"):
            vals = getattr(self, name)
            if not vals or any(int(v) < 1 for v in vals):
                raise ValueError(f"{name} must be one or more positive integers, got {vals}")
        bad = [p for p in self.parts if p not in PARTS]
        if bad or not self.parts:
            raise ValueError(f"unknown part(s) {bad or '(none given)'}: choose from {', '.join(PARTS)}")
        usable = cpu_cores()["logical"]
        if self.max_threads is not None and not 1 <= self.max_threads <= usable:
            raise ValueError(f"max_threads must be 1..{usable} (the usable CPUs here), got {self.max_threads}")
        for name in ("tc_n_cpu", "tc_n_gpu", "wave_k", "wave_max_waves", "wave_step", "launch_count", "launch_n",
                     "conv_batch"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.wave_step > TILE:
            raise ValueError(f"wave_step must be at most {TILE} (one tile row), got {self.wave_step}")
        if self.budget_s <= 0 or self.python_max_ops < 0:
            raise ValueError("budget_s must be > 0 and python_max_ops >= 0")

    @classmethod
    def quick(cls) -> Config:
        return cls(
            sizes=(10**3, 10**4, 10**5, 10**6, 10**7),  # still reaches past a 32 MB L3 at 1e7 (160 MB moved)
            matmul_ns=(16, 64, 256, 512),
            python_max_ops=3 * 10**4,
            budget_s=0.05,
            tc_n_cpu=512,
            tc_n_gpu=4096,
            wave_max_waves=4,
            launch_count=256,
            conv_batch=8,
            copy_sizes_mb=(1, 16, 64),
        )
