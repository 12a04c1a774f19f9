"""Spec-sheet peaks of known GPUs, and a CPU's theoretical peak from cores x clock x FLOP/cycle.

All GPU figures are dense (no 2:4 sparsity), from NVIDIA's datasheets / architecture
whitepapers, in TFLOP/s and GB/s (1e9 bytes/s). GeForce cards (RTX 3090, 4090) run FP16/BF16
tensor math at half rate when accumulating in FP32, which is what PyTorch does: the figures
here are the FP32-accumulate ones, and `note` says so.

CPU FLOP/cycle per core (FP32, FMA = 2 FLOPs):
- AVX2 + FMA, two 256-bit FMA pipes: 2 x 8 x 2 = 32
- AVX-512 on Intel server cores (two 512-bit FMA pipes): 64; AMD Zen 4 runs AVX-512 on 256-bit
  pipes: 32; Zen 5 (full 512-bit): 64
- AVX512_BF16 (VDPBF16PS) doubles the FP32 rate for BF16 inputs; Intel AMX-BF16: 1024 per core.
"""

from __future__ import annotations

from dataclasses import dataclass

from llmlab.core.device import Device, cpu_cores, cpu_flags, cpu_max_mhz, cpu_model_name


@dataclass(frozen=True)
class GpuSpec:
    name: str
    bf16_tflops: float | None  # dense tensor-core BF16 (FP32 accumulate)
    fp16_tflops: float | None  # dense tensor-core FP16 (FP32 accumulate)
    tf32_tflops: float | None  # dense tensor-core TF32
    fp32_tflops: float  # CUDA-core FP32 (non-tensor)
    bandwidth_GBps: float
    note: str = ""

    def peak_tflops(self, dtype: str) -> float | None:
        return {"bf16": self.bf16_tflops, "fp16": self.fp16_tflops, "tf32": self.tf32_tflops, "fp32": self.fp32_tflops}.get(dtype)


# Matched by substrings of torch.cuda.get_device_name(), most specific first.
GPU_SPECS: list[tuple[tuple[str, ...], GpuSpec]] = [
    (("H200",), GpuSpec("H200 SXM", 989.4, 989.4, 494.7, 66.9, 4800)),
    (("H100", "PCIe"), GpuSpec("H100 PCIe", 756.0, 756.0, 378.0, 51.2, 2000)),
    (("H100",), GpuSpec("H100 SXM", 989.4, 989.4, 494.7, 66.9, 3350)),
    (("A100", "80GB", "PCIe"), GpuSpec("A100 80GB PCIe", 312.0, 312.0, 156.0, 19.5, 1935)),
    (("A100", "80GB"), GpuSpec("A100 80GB SXM", 312.0, 312.0, 156.0, 19.5, 2039)),
    (("A100",), GpuSpec("A100 40GB", 312.0, 312.0, 156.0, 19.5, 1555)),
    (("L40S",), GpuSpec("L40S", 362.05, 362.05, 183.0, 91.6, 864)),
    (("L4",), GpuSpec("L4", 121.0, 121.0, 60.0, 30.3, 300)),
    (("A10",), GpuSpec("A10", 125.0, 125.0, 62.5, 31.2, 600)),
    (("T4",), GpuSpec("T4", None, 65.0, None, 8.1, 320, "Turing: no BF16 or TF32 tensor cores")),
    (("4090",), GpuSpec("RTX 4090", 165.2, 165.2, 82.6, 82.6, 1008, "GeForce: FP16/BF16 with FP32 accumulate is half the FP16-accumulate rate (330)")),
    (("3090",), GpuSpec("RTX 3090", 71.0, 71.0, 35.6, 35.6, 936, "GeForce: FP16/BF16 with FP32 accumulate is half the FP16-accumulate rate (142)")),
]


def gpu_spec(name: str) -> GpuSpec | None:
    for keys, spec in GPU_SPECS:
        if all(k.lower() in name.lower() for k in keys):
            return spec
    return None


@dataclass(frozen=True)
class CpuPeak:
    fp32_gflops: float | None
    bf16_gflops: float | None
    how: str  # the derivation, or why it is unknown


def cpu_peak() -> CpuPeak:
    """cores x clock x FLOP/cycle where the ISA tells FLOP/cycle; None (with a reason) otherwise."""
    flags = cpu_flags()
    model = cpu_model_name()
    cores = cpu_cores()["physical"]
    mhz = cpu_max_mhz()
    if not mhz:
        return CpuPeak(None, None, "unknown: the clock is not reported")
    amd = "AMD" in model.upper()
    if "avx512f" in flags:
        if amd and "avx512_vp2intersect" not in flags:
            per, isa = 32, "AVX-512 on Zen 4 (256-bit FMA pipes)"
        else:
            per, isa = 64, "AVX-512, two 512-bit FMA pipes"
    elif "avx2" in flags and "fma" in flags:
        per, isa = 32, "AVX2 + FMA, two 256-bit FMA pipes"
    else:
        return CpuPeak(None, None, f"unknown: no AVX2/FMA/AVX-512 flags on '{model}'")
    if "amx_bf16" in flags:
        bf16_per, bf16_isa = 1024, "AMX-BF16"
    elif "avx512_bf16" in flags:
        bf16_per, bf16_isa = 2 * per, "AVX512_BF16 dot products"
    else:
        bf16_per, bf16_isa = per, "no BF16 unit: BF16 runs at the FP32 rate at best"
    ghz = mhz / 1000
    how = (
        f"{cores} cores x {ghz:.2f} GHz (reported clock; turbo may differ) x {per} FP32 FLOP/cycle ({isa}); "
        f"BF16 x {bf16_per} ({bf16_isa})"
    )
    return CpuPeak(cores * ghz * per, cores * ghz * bf16_per, how)


def peak_for(device: Device, dtype: str) -> tuple[float | None, str]:
    """Spec peak compute in GFLOP/s for dtype ('fp32', 'tf32', 'bf16', 'fp16') and its source."""
    if device.is_cuda:
        spec = gpu_spec(device.name)
        if spec is None:
            return None, f"'{device.name}' is not in the spec table"
        tf = spec.peak_tflops(dtype)
        return (tf * 1e3 if tf else None), f"{spec.name} datasheet (dense){'; ' + spec.note if spec.note else ''}"
    peak = cpu_peak()
    g = peak.bf16_gflops if dtype in ("bf16", "fp16") else peak.fp32_gflops
    return g, peak.how


def bandwidth_spec_GBps(device: Device) -> tuple[float | None, str]:
    if device.is_cuda:
        spec = gpu_spec(device.name)
        return (spec.bandwidth_GBps, f"{spec.name} datasheet") if spec else (None, "not in the spec table")
    return None, "unknown for a CPU (depends on DIMMs and channels)"
