"""What if the work ran on another GPU: spec-sheet napkin math for common GPUs and 8B-70B models.

For each GPU of the table (its dense peak FLOP/s and bandwidth from llmlab/core/specs.py, its memory and
FP8 rate below) and each model at BF16 and FP8 (weights and KV cache in that format):
- ridge point = peak FLOP/s / bandwidth (FLOP per byte where the two roofs meet);
- decode ceiling at batch 1 = bandwidth / bytes one decode step reads (every weight once, and the KV cache
  of `context` tokens): tokens/s no kernel can beat on that GPU;
- prefill ceiling = peak FLOP/s / FLOPs per prompt token of a `context`-token prompt (attention included);
- fits = weights + the KV cache of `context` tokens <= the memory the datasheet prints (no activations,
  no runtime overhead: a real server needs some headroom beyond it).
These rows are spec-sheet napkin math, never measurements. The measured machine's row stands beside them,
computed the same way from the roofs this lab measured (bandwidth and the matmul peak of the dtype).
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from llmlab.core.flops import Shape, decode_cost, kv_bytes, prefill_cost
from llmlab.core.models import arch_config
from llmlab.core.specs import gpu_spec

SPEC = "spec sheet (napkin)"
MEASURED = "measured (this machine)"
FORMATS = (("bf16", 2), ("fp8", 1))  # weight and KV format, bytes per element


@dataclass(frozen=True)
class WhatIfGpu:
    name: str  # the device name as torch reports it: gpu_spec() finds its row in core.specs
    memory_GB: float  # on-board memory as the datasheet prints it (1e9 bytes)
    fp8_tflops: float | None  # dense FP8 tensor-core rate; None: no FP8 tensor cores (FP8 weights run at BF16)


# Memory and dense FP8 (half the sparse figure the datasheets print), FP32 accumulate on GeForce: NVIDIA A100,
# H100 SXM, H200 SXM, L4 and HGX B200 (1,440 GB over 8 GPUs) datasheets; the Ada whitepaper for the RTX 4090.
GPUS = (
    WhatIfGpu("NVIDIA A100 80GB SXM", 80, None),
    WhatIfGpu("NVIDIA H100 SXM", 80, 1978.9),
    WhatIfGpu("NVIDIA H200 SXM", 141, 1978.9),
    WhatIfGpu("NVIDIA L4", 24, 242.5),
    WhatIfGpu("NVIDIA GeForce RTX 4090", 24, 330.3),
    WhatIfGpu("NVIDIA B200", 180, 4500.0),
)

# (label, shape): the registry's Llama 3 8B and 3.1 70B, and a dense 30B-class model (Qwen2.5-32B's config.json).
MODELS = (
    ("8B (Llama 3)", "llama-3-8b"),
    ("32B (Qwen2.5)", Shape(layers=64, hidden=5120, heads=40, kv_heads=8, head_dim=128, intermediate=27648,
                            vocab=152064)),
    ("70B (Llama 3.1)", "llama-3.1-70b"),
)


def model_shapes() -> list[tuple[str, Shape]]:
    return [(label, s if isinstance(s, Shape) else Shape.of(arch_config(s))) for label, s in MODELS]


def whatif_row(source: str, gpu: str, label: str, shape: Shape, fmt: str, elem: int, peak_tflops: float | None,
               bw_GBps: float, memory_GB: float | None, context: int, note: str = "") -> dict:
    """One GPU x model x format: the ridge, the decode and prefill ceilings, whether weights + KV fit."""
    dec = decode_cost(shape, context, 1, elem)
    pre = prefill_cost(shape, max(context, 1), 1, elem)
    weights, kv = dec.weight_bytes, kv_bytes(shape, context, elem)
    peak = peak_tflops * 1e12 if peak_tflops else None
    return dict(source=source, gpu=gpu, model=label, format=fmt, params_B=shape.matmul_params / 1e9,
                peak_tflops=peak_tflops, bandwidth_GBps=bw_GBps, ridge=peak / (bw_GBps * 1e9) if peak else None,
                decode_intensity=dec.flops / dec.bytes, bytes_per_token=dec.bytes,
                decode_tok_s=bw_GBps * 1e9 / dec.bytes,
                prefill_tok_s=peak / (pre.flops / max(context, 1)) if peak else None,
                weights_GB=weights / 1e9, kv_GB=kv / 1e9, memory_GB=memory_GB,
                fits=None if memory_GB is None else bool(weights + kv <= memory_GB * 1e9), note=note)


def spec_rows(context: int) -> list[dict]:
    """Every GPU of GPUS x every model x BF16 and FP8, from the spec sheets alone."""
    rows = []
    for g in GPUS:
        spec = gpu_spec(g.name)
        for label, shape in model_shapes():
            for fmt, elem in FORMATS:
                peak, note = spec.bf16_tflops, ""
                if fmt == "fp8":
                    peak = g.fp8_tflops or spec.bf16_tflops
                    note = "" if g.fp8_tflops else "no FP8 tensor cores: FP8 weights, BF16 math"
                rows.append(whatif_row(SPEC, spec.name, label, shape, fmt, elem, peak, spec.bandwidth_GBps,
                                       g.memory_GB, context, note))
    return rows


def measured_rows(roofs: pd.DataFrame, memory_bytes: int, name: str, context: int) -> list[dict]:
    """This machine's row, the same napkin from what it measured: the bandwidth roof and the BF16 matmul peak
    (the best measured dtype where BF16 was not measured); FP8 reuses that peak (no FP8 matmul is timed)."""
    bw = roofs[roofs["roof"] == "bandwidth"]["measured_median"]
    comp = roofs[roofs["roof"] == "compute"].set_index("dtype")["measured_median"]
    if bw.empty or comp.empty:
        return []
    dtype = "bf16" if "bf16" in comp.index else str(comp.idxmax())
    peak = float(comp[dtype]) / 1e3  # GFLOP/s -> TFLOP/s
    rows = []
    for label, shape in model_shapes():
        for fmt, elem in FORMATS:
            note = f"measured {dtype} peak" + ("" if fmt == "bf16" else " (no FP8 matmul timed)")
            rows.append(whatif_row(MEASURED, name, label, shape, fmt, elem, peak, float(bw.iloc[0]),
                                   memory_bytes / 1e9, context, note))
    return rows


def whatif_table(roofs: pd.DataFrame, memory_bytes: int, name: str, context: int) -> pd.DataFrame:
    return pd.DataFrame(spec_rows(context) + measured_rows(roofs, memory_bytes, name, context))

