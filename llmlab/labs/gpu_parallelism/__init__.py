"""Lab: see parallelism with your own eyes — the same work on a Python loop, CPU threads, and a GPU.

The article's sentences, each turned into a measurement:
1. "A CPU has a handful of powerful cores, a GPU thousands of simple ones": an elementwise
   fused multiply-add, a reduction and a matmul at growing sizes, done as a plain Python loop,
   vectorised on one CPU thread, on all CPU threads (a torch.set_num_threads sweep), and on the
   GPU (with and without the host<->device copies). Throughput per way, the crossover size where
   the GPU starts to win, and the CPU's thread scaling against ideal.
2. "Thousands of cores, in SMs": matmul throughput around multiples of the SM count (wave
   quantization: the saw-tooth).
3. "Tensor cores made the GPU an AI chip": matmul FLOP/s in FP32, TF32, BF16, FP16 (GPU); FP32 vs
   BF16 on the CPU, saying whether it has a matrix unit (AMX).
4. Launch overhead: B small matmuls one by one vs one batched bmm.
5. AlexNet (2012) conv1, 227x227x3 -> 96 filters 11x11 stride 4, at batch 128, CPU and GPU.
6. Host<->device copy bandwidth, pinned and pageable: data has to get to the GPU first.

References:
- NVIDIA, "Matrix Multiplication Background User's Guide" (tile and wave quantization).
- NVIDIA, "CUDA C++ Best Practices Guide" (pinned memory, asynchronous copies, launch overhead).
- Krizhevsky, Sutskever, Hinton, "ImageNet Classification with Deep Convolutional Neural
  Networks", NeurIPS 2012 (conv1: 96 kernels of 11x11x3, stride 4; two GTX 580 GPUs).
- llm.c dev/cuda: a CPU reference first, every variant checked against it before timing.
"""


from __future__ import annotations

from llmlab.core.device import Device
from llmlab.core.results import LabResult
from llmlab.labs.gpu_parallelism.config import LAB, PARTS, VERSION, WORKS, Config
from llmlab.labs.gpu_parallelism.report import headline, views
from llmlab.labs.gpu_parallelism.verdicts import judge

JUDGE_VERSION = 1


def run(cfg: Config, device: Device, progress=None) -> LabResult:
    """Measures. Returns data. Never prints."""
    from llmlab.labs.gpu_parallelism import lab  # torch loads here: the CLI imports this package for its Config

    return lab.run(cfg, device, progress)


__all__ = ["JUDGE_VERSION", "LAB", "PARTS", "VERSION", "WORKS", "Config", "headline", "judge", "run", "views"]
