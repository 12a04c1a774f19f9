"""Lab: the two speed limits, measured — memory bandwidth and compute, and where LLM work sits.

The article's argument, each step turned into a measurement:
1. Peak memory bandwidth: read, write, copy and triad over buffers >= 8x the last-level cache,
   repeated (median and best), and a size sweep that shows the cache plateaus above DRAM/HBM.
2. Peak compute: matmul FLOP/s over a small set of aligned shapes (FP32 and BF16 on a CPU;
   FP32, TF32, BF16, FP16 on a GPU), cache flushed between repeats, best and median, with the
   clocks and power NVML saw per dtype.
3. "% of spec" for both roofs where the spec is known (a CPU's bandwidth spec is not).
4. The ridge point (peak FLOP/s / bandwidth) and an intensity sweep: GEMMs of M = batch rows
   against a K x N weight; achieved FLOP/s against arithmetic intensity traces the roofline.
5. The LLM overlay: the per-layer matmuls of prefill (S tokens) and decode (batch B) of --model,
   with their intensity, on the measured roofline; and the real model's decode step timed at
   batch 1..N: achieved bandwidth and achieved fraction of peak compute.

How bytes are counted: every byte a kernel must read or write, once (STREAM's convention):
read = N, write = N, copy = 2N, triad a = b + s*c = 3N. A CPU's write-allocate traffic (reading
a line before overwriting it) is real but not counted, so write and copy look slower than read.
A GEMM moves A + B + C once each: intensity = 2MKN / (bytes of A + B + C).

Threads on a CPU: every kernel is measured with all torch threads and with one (or the faster
is picked by a short probe) and the `threads` column says which won. On a shared machine an
OpenMP region waits for its slowest thread, so one thread can beat two by 10x; on an idle one,
all threads win the compute-bound rows. The roofs are the best of what was measured.

References:
- Williams, Waterman, Patterson, "Roofline: an insightful visual performance model for
  multicore architectures", CACM 2009.
- McCalpin, STREAM benchmark (copy, scale, add, triad; bytes counted once).
- Empirical Roofline Toolkit (ERT), LBNL: working-set sweep showing each cache level.
- Stas Bekman, mamf-finder (ml-engineering): search aligned shapes, flush L2, report best/median.
- "Making Deep Learning Go Brrrr From First Principles" (Horace He): overhead, bandwidth, compute.
"""

from __future__ import annotations

from llmlab.core.device import Device
from llmlab.core.results import LabResult
from llmlab.labs.roofline.config import DTYPES, LAB, VERSION, Config
from llmlab.labs.roofline.report import figures, headline, views
from llmlab.labs.roofline.verdicts import judge

JUDGE_VERSION = 2  # 2: the what-if claims


def run(cfg: Config, device: Device, progress=None) -> LabResult:
    """Measures. Fills tables, env, notes, skipped. Never prints, never judges."""
    from llmlab.labs.roofline import lab  # torch loads here: the CLI imports this package for its Config

    return lab.run(cfg, device, progress)


__all__ = ["DTYPES", "JUDGE_VERSION", "LAB", "VERSION", "Config", "figures", "headline", "judge", "run", "views"]
