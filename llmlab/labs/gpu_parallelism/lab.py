"""The lab's measuring run: every part in turn, on the CPU and (when there is one) the GPU."""

from __future__ import annotations

import torch

from llmlab.core.device import Device, cpu_cores, cpu_isa, cpu_load, resolve_device, set_tf32
from llmlab.core.results import LabResult
from llmlab.labs.gpu_parallelism.config import LAB, VERSION, Config
from llmlab.labs.gpu_parallelism.harness import keep_torch_settings, thread_counts
from llmlab.labs.gpu_parallelism.kernels import part_alexnet, part_copies, part_launch, part_tensor_cores, part_waves
from llmlab.labs.gpu_parallelism.sizes import part_sizes


def run(cfg: Config, device: Device, progress=None) -> LabResult:
    """Measures. Returns data. Never prints."""
    res = LabResult.new(LAB, VERSION, cfg)
    cpu = resolve_device("cpu")
    gpu = device if device.is_cuda else None
    sweep = thread_counts(cfg.max_threads or cpu_cores()["logical"])
    res.env["lab"] = {"cpu_isa": cpu_isa(), "cpu_cores": cpu_cores(), "thread_sweep": list(sweep),
                      "gpu": gpu.spec if gpu else None}
    load, usable = cpu_load()
    res.env["lab"]["loadavg_1min_at_start"] = load
    if load is not None and load >= 0.5 * usable:
        res.note(f"busy CPU (load {load:.1f} on {usable} CPUs): multi-thread timings come out pessimistic")
    if gpu is None:
        res.skipped["wave_quantization, copy_bandwidth, GPU rows"] = "no GPU"
    with res.guard(), torch.no_grad(), keep_torch_settings():
        set_tf32(matmul=False, conv=False)  # strict FP32 unless a part asks for TF32
        if gpu is not None:
            torch.ones(1, device=gpu.torch).sum().item()  # create the CUDA context before anything is timed
        if "sizes" in cfg.parts:
            part_sizes(res, cfg, cpu, gpu, sweep, progress)
        if "waves" in cfg.parts:
            part_waves(res, cfg, gpu, progress)
        if "tensor-cores" in cfg.parts:
            part_tensor_cores(res, cfg, cpu, gpu)
        if "launch" in cfg.parts:
            part_launch(res, cfg, cpu, gpu, sweep[-1])
        if "alexnet" in cfg.parts:
            part_alexnet(res, cfg, cpu, gpu)
        if "copies" in cfg.parts:
            part_copies(res, cfg, gpu, progress)
    return res
