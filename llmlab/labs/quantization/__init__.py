"""Lab: quantization: precision traded for memory and speed, in the weights and in the KV cache.

Parts:
1. weight formats on the built-in `tiny` (real weights): FP32, BF16, FP16, INT8 per-channel, INT4
   group-wise (sym/asym), FP8 E4M3 (per-tensor / per-channel). Quality with FP32 compute and the
   weights replaced by their quantize-dequantize round trip: held-out loss and perplexity delta vs
   FP32 (llmlab.tiny.evaluate.heldout_loss), greedy agreement with FP32 (greedy_agreement), KL of
   the next-token distributions.
2. bytes: measured from the packed tensors vs bits x params / 8 + scales (exact).
3. decode tokens/s per format at batch 1 and 16, interleaved rounds, the device synchronised at
   every step. Each row names its path: the device's kernel for the format (llmlab.inference.quant:
   FP32/BF16/FP16 matmul; INT8 torch._weight_int8pack_mm; INT4 _weight_int4pack_mm(_for_cpu); FP8
   torch._scaled_mm where the GPU has FP8 tensor cores), each checked against the dequantized
   reference before timing, or "dequantize+FP32 (emul)" (no kernel here: not the format's speed).
   On a CPU the full run adds an arch: shape cut to a few layers; on a GPU, whose L2 holds all of
   tiny, the speed part times an arch: shape with as many layers as the free memory holds (random
   weights: timing only).
4. KV formats (BF16, FP8 per-head scale, INT8 per-token scale, NVFP4): bytes of a real prefill cache
   measured vs the kvcache formula + scales; tokens that fit on an 80 GB GPU after the weights
   (formula); quality when K and V are quantize-dequantized as they enter the cache.

References:
- NVIDIA, "Optimizing Inference for Long Context and Large Batch Sizes with NVFP4 KV Cache"
  (E. Alvarez, 2025-12-08, developer.nvidia.com/blog): "NVFP4 cuts KV cache memory footprint by up
  to 50% [vs FP8] ... with <1% accuracy loss across code-generation, knowledge, and long-context
  benchmarks" (benchmark accuracy, not perplexity: our proxy is held-out perplexity).
- GPTQ (arXiv 2210.17323), AWQ (arXiv 2306.00978): INT4 g128 costs a few % perplexity on large models.
- LLM.int8() (arXiv 2208.07339); FP8 formats (arXiv 2209.05433); formulas in llmlab/inference/quant.py.

Layout: `config` (the Config), `lab` (run, the set-up, the GPU speed model), `quality` (KL against
FP32), `weights` (parts 1-3), `kvcache` (part 4), `verdicts` (judge, headline), `report` (views).
"""

from llmlab.core.lazy import lazy
from llmlab.labs.quantization.config import JUDGE_VERSION, KV_FORMATS, LAB, QUICK, VERSION, WEIGHT_FORMATS, Config

_PARTS = {  # name -> the submodule that defines it; imported on first use (the parts load torch)
    **dict.fromkeys(("GPU_MEMORY_SHARE", "_formats", "gpu_speed_layers", "run"), "lab"),
    **dict.fromkeys(("headline", "judge"), "verdicts"),
    "views": "report",
    **dict.fromkeys(("QDQCache", "kl_divergence"), "quality"),
    **dict.fromkeys(("part_speed", "part_weights"), "weights"),
    **dict.fromkeys(("kv_fit_rows", "part_kv_bytes", "part_kv_quality"), "kvcache"),
}
__getattr__ = lazy(__name__, _PARTS)
__all__ = ["JUDGE_VERSION", "KV_FORMATS", "LAB", "QUICK", "VERSION", "WEIGHT_FORMATS", "Config", *_PARTS]
