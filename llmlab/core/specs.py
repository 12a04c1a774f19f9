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

import re
from dataclasses import dataclass

from llmlab.core.device import Device, cpu_clock_mhz, cpu_cores, cpu_flags, cpu_model_name


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
        peaks = {"bf16": self.bf16_tflops, "fp16": self.fp16_tflops, "tf32": self.tf32_tflops, "fp32": self.fp32_tflops}
        return peaks.get(dtype)


_GEFORCE = "GeForce: FP16/BF16 with FP32 accumulate is half the FP16-accumulate rate ({})"

# Matched against torch.cuda.get_device_name() as case-insensitive regular expressions on word
# boundaries, first match wins, so the more specific rows come first: "L40" is not "L4", "GH200" is
# not "H200", "A100" is not "A10", and the NVL boards (PCIe cards, lower clocks) are not SXM.
# Sources: NVIDIA datasheets (H100 / H100 NVL, H200 / H200 NVL, GH200, A100, L40, L40S, L4, A10, T4; the rows
# added later cite theirs beside them), Ada and Ampere GeForce whitepapers. Datasheets print sparse tensor
# figures: these are half of them.
GPU_SPECS: list[tuple[str, GpuSpec]] = [
    (r"\bGH200\b.*\b144\s*G", GpuSpec("GH200 144GB HBM3e", 989.4, 989.4, 494.7, 66.9, 4900)),
    (r"\bGH200\b", GpuSpec("GH200 96GB HBM3", 989.4, 989.4, 494.7, 66.9, 4000)),
    (r"\bH200\b.*\bNVL\b", GpuSpec("H200 NVL", 835.5, 835.5, 417.5, 60.0, 4800)),
    (r"\bH200\b", GpuSpec("H200 SXM", 989.4, 989.4, 494.7, 66.9, 4800)),
    (r"\bH100\b.*\bNVL\b", GpuSpec("H100 NVL", 835.5, 835.5, 417.5, 60.0, 3900)),
    (r"\bH100\b.*\bPCIe\b", GpuSpec("H100 PCIe", 756.0, 756.0, 378.0, 51.2, 2000)),
    (r"\bH100\b", GpuSpec("H100 SXM", 989.4, 989.4, 494.7, 66.9, 3350)),
    (r"\bA100\b(?=.*\b80GB\b)(?=.*\bPCIe\b)", GpuSpec("A100 80GB PCIe", 312.0, 312.0, 156.0, 19.5, 1935)),
    (r"\bA100\b.*\b80GB\b", GpuSpec("A100 80GB SXM", 312.0, 312.0, 156.0, 19.5, 2039)),
    (r"\bA100\b", GpuSpec("A100 40GB", 312.0, 312.0, 156.0, 19.5, 1555)),
    (r"\bL40S\b", GpuSpec("L40S", 362.05, 362.05, 183.0, 91.6, 864)),
    (r"\bL40\b", GpuSpec("L40", 181.05, 181.05, 90.5, 90.5, 864)),
    (r"\bL4\b", GpuSpec("L4", 121.0, 121.0, 60.0, 30.3, 300)),
    (r"\bA10\b", GpuSpec("A10", 125.0, 125.0, 62.5, 31.2, 600)),
    (r"\bT4\b", GpuSpec("T4", None, 65.0, None, 8.1, 320, "Turing: no BF16 or TF32 tensor cores")),
    (r"\bRTX 4090\b(?!.*\b(?:Laptop|D)\b)", GpuSpec("RTX 4090", 165.2, 165.2, 82.6, 82.6, 1008, _GEFORCE.format(330))),
    (r"\bRTX 3090\b(?!\s*Ti\b)", GpuSpec("RTX 3090", 71.0, 71.0, 35.6, 35.6, 936, _GEFORCE.format(142))),
    # NVIDIA Ada GPU architecture whitepaper (v2.1), appendix tables: RTX 4080 (76 SMs, 2505 MHz boost,
    # 22.4 Gbps x 256-bit GDDR6X), RTX 4070 (46 SMs, 2475 MHz, 21 Gbps x 192-bit), RTX 6000 Ada (142 SMs,
    # 2505 MHz, 20 Gbps x 384-bit GDDR6; a workstation card: full-rate FP32 accumulate).
    (r"\bRTX 4080\b(?!.*\b(?:SUPER|Laptop)\b)",
     GpuSpec("RTX 4080", 97.5, 97.5, 48.7, 48.7, 716.8, _GEFORCE.format(195))),
    (r"\bRTX 4070\b(?!.*\b(?:Ti|SUPER|Laptop)\b)",
     GpuSpec("RTX 4070", 58.3, 58.3, 29.1, 29.1, 504, _GEFORCE.format(117))),
    (r"\bRTX 6000 Ada\b", GpuSpec("RTX 6000 Ada", 364.2, 364.2, 182.1, 91.1, 960)),
    # NVIDIA RTX Blackwell GPU architecture whitepaper: RTX 5090 (170 SMs, 2407 MHz boost, 28 Gbps x 512-bit
    # GDDR7).
    (r"\bRTX 5090\b(?!.*\b(?:Laptop|D)\b)",
     GpuSpec("RTX 5090", 209.5, 209.5, 104.8, 104.8, 1792, _GEFORCE.format(419))),
    # NVIDIA RTX A6000 datasheet (309.7 sparse FP16 tensor TFLOPS, 38.7 FP32, 768 GB/s) and the Ampere GA102 whitepaper.
    (r"\bRTX A6000\b", GpuSpec("RTX A6000", 154.8, 154.8, 77.4, 38.7, 768)),
    # NVIDIA A40 datasheet: FP32 37.4, TF32 74.8, BF16 / FP16 149.7 TFLOPS dense, 696 GB/s.
    (r"\bA40\b", GpuSpec("A40", 149.7, 149.7, 74.8, 37.4, 696)),
    # NVIDIA A30 datasheet: FP32 10.3, TF32 82, BF16 / FP16 165 TFLOPS dense, 933 GB/s.
    (r"\bA30\b", GpuSpec("A30", 165.0, 165.0, 82.0, 10.3, 933)),
    # NVIDIA H800 datasheet: SXM5 as the H100 SXM's compute (1979 / 989 sparse BF16 / TF32, 67 FP32) at 3.35 TB/s;
    # PCIe as the H100 PCIe's (1513 / 756 sparse, 51 FP32) at 2 TB/s. The H800 differs in its NVLink (400 GB/s).
    (r"\bH800\b.*\bPCIe\b", GpuSpec("H800 PCIe", 756.0, 756.0, 378.0, 51.2, 2000)),
    (r"\bH800\b", GpuSpec("H800 SXM", 989.4, 989.4, 494.7, 66.9, 3350)),
    # NVIDIA HGX B200 datasheet, per GPU (the 8-GPU board's figures / 8): FP16 / BF16 4.5 PFLOPS and TF32 2.2
    # PFLOPS sparse, FP32 75 TFLOPS, HBM3e 8 TB/s.
    (r"\bB200\b", GpuSpec("B200", 2250.0, 2250.0, 1125.0, 75.0, 8000)),
]

_MIG = re.compile(r"\bMIG\b|\b\d+g\.\d+gb\b", re.I)  # "NVIDIA H100 80GB HBM3 MIG 1g.10gb"


def gpu_spec_match(name: str) -> tuple[GpuSpec | None, str]:
    """(the spec row for a device name, or None) and why: the row's name, "MIG slice", or "not in the table"."""
    if _MIG.search(name):
        return None, f"unknown: '{name}' is a MIG slice, which has a fraction of the full GPU's SMs and bandwidth"
    for pattern, spec in GPU_SPECS:
        if re.search(pattern, name, re.I):
            return spec, f"{spec.name} datasheet (dense)"
    return None, f"unknown: '{name}' is not in the spec table"


def gpu_spec(name: str) -> GpuSpec | None:
    """The spec row for a torch device name; None for a MIG slice or a GPU not in the table."""
    return gpu_spec_match(name)[0]


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
    mhz, clock = cpu_clock_mhz()
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
        f"{cores} cores x {ghz:.2f} GHz ({clock}) x {per} FP32 FLOP/cycle ({isa}); "
        f"BF16 x {bf16_per} ({bf16_isa})"
    )
    return CpuPeak(cores * ghz * per, cores * ghz * bf16_per, how)


def peak_for(device: Device, dtype: str) -> tuple[float | None, str]:
    """Spec peak compute in GFLOP/s for dtype ('fp32', 'tf32', 'bf16', 'fp16') and its source."""
    if device.is_cuda:
        spec, how = gpu_spec_match(device.name)
        if spec is None:
            return None, how
        tf = spec.peak_tflops(dtype)
        return (tf * 1e3 if tf else None), f"{how}{'; ' + spec.note if spec.note else ''}"
    peak = cpu_peak()
    g = peak.bf16_gflops if dtype in ("bf16", "fp16") else peak.fp32_gflops
    return g, peak.how


def bandwidth_spec_GBps(device: Device) -> tuple[float | None, str]:
    if device.is_cuda:
        spec, how = gpu_spec_match(device.name)
        return (spec.bandwidth_GBps, f"{spec.name} datasheet") if spec else (None, how)
    return None, "unknown for a CPU (depends on DIMMs and channels)"


def over_spec_note(measured: float | None, spec: float | None, how: str) -> str | None:
    """The note a "% of spec" above 100% must carry (None at or below 100%, or with no spec).

    A CPU spec from a base or current clock undercounts boosted cores; a GPU above its datasheet
    points at a wrong spec row or a timing error. Either way the reader is told, never shown a bare 113%.
    """
    if not measured or not spec or measured <= spec:
        return None
    pct = 100 * measured / spec
    if "max boost" in how:
        why = "the spec already uses the max boost clock, so suspect the FLOP/cycle assumed or the timing"
    elif "GHz" in how:
        why = "the spec uses a clock below the cores' boost clock (the OS reports no max boost clock)"
    else:
        why = "the measurement beat the datasheet: check the spec row matched and the timing synchronised"
    return f"{pct:.0f}% of spec: {why} ({how})"
