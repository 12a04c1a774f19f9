"""The roofline lab's Config: light imports only (the CLI reads it for `llmlab --help` without torch)."""

from __future__ import annotations

from dataclasses import dataclass

from llmlab.core.config import opt
from llmlab.core.roofs import CPU_SHAPES, GPU_SHAPES, KERNELS

LAB = "roofline"
VERSION = 3  # 2: bandwidth timed in blocks of calls after a 0.3 s warm-up; 3: the spec-sheet what-if table
DTYPES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}  # torch name -> spec name


@dataclass(frozen=True)
class Config:
    """The two speed limits, measured: memory bandwidth and matmul compute, and where LLM work sits between them.

    Every processor has two roofs: how many bytes per second it can move and how many FLOPs per second it can
    do. Arithmetic intensity (FLOPs per byte moved) decides which one binds: below the ridge point (peak FLOP/s /
    bandwidth) a kernel waits on memory, above it on the math units. This lab measures both roofs on your device
    (STREAM-style read/write/copy/triad over buffers 8x the last-level cache, with a size sweep that shows each
    cache level; matmul FLOP/s over a set of aligned shapes with the cache flushed), compares them with the spec
    sheet, then sweeps a GEMM from M=1 (a matrix-vector product: ~0.5 FLOP/byte in FP32) to M=4096 and watches
    it climb the roofline. Finally it places --model's per-layer matmuls of prefill and decode on that roofline
    and times the real decode step at growing batch: at batch 1 decode reads every weight to do 2 FLOPs with it,
    so it uses a few percent of peak compute, and batch size is the lever that moves it toward the ridge. A
    what-if table then does the same napkin math from spec sheets for common GPUs and 8B-70B models.
    """

    # bandwidth buffers are 8x the last-level cache: < 1/8 of any access can hit
    llc_multiple: int = opt(8, help="Bandwidth buffer size in last-level caches (>= 1).")
    bandwidth_repeats: int = opt(10, help="Timed blocks of calls per bandwidth kernel: median and best (>= 3).")
    # each block lasts >= 20 ms: launch gaps are inside the throughput, not at a sample's edge
    bandwidth_block_s: float = opt(0.02, help="Seconds one timed block of bandwidth calls lasts at least.")
    # matmuls for 0.3 s before the roofs: GPU and CPU clocks are boosted when the timing starts
    warmup_s: float = opt(0.3, help="Seconds of matmuls run before the roofs are timed (clocks boosted).")
    # read, write, copy, triad: write and copy show the cost of write-allocate
    kernels: tuple[str, ...] = opt(KERNELS, help="STREAM kernels of the bandwidth roof: read, write, copy, triad.")
    sweep_kernels: tuple[str, ...] = opt(("read", "copy", "triad"), help="STREAM kernels of the working-set sweep.")
    # 8 = the roof's own buffer: DRAM for sure
    sweep_max_llc: float = opt(8.0, help="Largest working-set sweep buffer, in last-level caches (> 0).")
    # half an L1d, where per-call overhead shows
    sweep_min_bytes: int = opt(16 * 1024, help="Smallest working-set sweep buffer, in bytes.")
    # 2-3 points per cache level
    sweep_factor: int = opt(2, help="Each sweep buffer is this many times the last (>= 2).")
    # sub-ms calls, many per block
    sweep_min_run_s: float = opt(0.1, help="Seconds of calls timed per small working-set sweep point.")
    # 2-34 GFLOP, 0.05-1 s per call on 2 cores
    cpu_shapes: tuple[tuple[int, int, int], ...] = opt(CPU_SHAPES, help="Matmul shapes (M, N, K) of the CPU "
                                                       "compute roof.", hidden=True)
    # mamf-finder style: large, 256-aligned
    gpu_shapes: tuple[tuple[int, int, int], ...] = opt(GPU_SHAPES, help="Matmul shapes (M, N, K) of the GPU "
                                                       "compute roof.", hidden=True)
    # +1 warm-up, the cache flushed before each
    compute_repeats: int = opt(5, help="Timed matmuls per shape and dtype of the compute roof (>= 3).")
    # M = 1..4096: far below to far above the ridge
    intensity_batches: tuple[int, ...] = opt(tuple(2**i for i in range(13)),
                                             help="Rows M of the GEMM intensity sweep, comma-separated (>= 1).")
    # 16 MB in FP32 (flushed from cache before each call); M = 4096 is 34 GFLOP
    intensity_kn: int = opt(2048, help="CPU: K = N of the intensity sweep's weight (>= 16).")
    # 128 MB in BF16, 2x+ any L2; M = 4096 is 550 GFLOP, well into the compute roof
    intensity_kn_gpu: int = opt(8192, help="GPU: K = N of the intensity sweep's weight (>= 16).")
    intensity_repeats: int = opt(5, help="Timed GEMMs per M of the intensity sweep (>= 3).")
    model: str = opt("tiny", help="Model whose matmuls are overlaid and whose decode step is timed "
                                  "(a built-in, arch:NAME = random weights, or a Hugging Face id).", short="-m")
    # tiny's weights sit in a GPU's L2: the decode step would not read HBM
    cuda_model: str = opt("auto", help="GPU: the model timed instead of --model: auto = a registry arch: of "
                                       ">= 32x the L2 when --model fits in it, same = keep --model, or a reference.")
    dtype: str = opt("auto", help="Compute dtype of the intensity sweep and the model overlay: auto (float32 on a "
                                  "CPU, bfloat16 on a GPU) | float32 | bfloat16 | float16.")
    prefill_tokens: int = opt(512, help="Prompt tokens S of the prefill overlay (analytic, >= 1).")
    decode_context: int = opt(128, help="Prompt tokens in the KV cache when the decode step is timed (>= 1).")
    # past the ridge on a CPU
    decode_batches: tuple[int, ...] = opt((1, 2, 4, 8, 16, 32, 64, 128), help="Decode batch sizes of the timed "
                                                                             "decode step, comma-separated.")
    # after the thread probe and 1 warm-up
    decode_steps: int = opt(12, help="Timed decode steps per batch (>= 3).")
    # the random init of a big arch: takes minutes on a CPU
    decode_max_gib: float = opt(2.0, help="CPU: weights above this many GiB are not timed (the overlay stays).")
    # the what-if table's KV cache: a long chat or a RAG prompt
    whatif_context: int = opt(8192, help="Tokens of KV cache the spec-sheet what-if table fits beside the weights.")
    seed: int = 0

    def __post_init__(self):
        if self.llc_multiple < 1:
            raise ValueError("llc_multiple must be at least 1")
        for name in ("bandwidth_repeats", "compute_repeats", "intensity_repeats", "decode_steps"):
            if getattr(self, name) < 3:
                raise ValueError(f"{name} must be at least 3 (a median needs samples)")
        for name in ("kernels", "sweep_kernels"):
            bad = [k for k in getattr(self, name) if k not in KERNELS]
            if bad or not getattr(self, name):
                raise ValueError(f"{name}: choose from {', '.join(KERNELS)}")
        if self.sweep_max_llc <= 0:
            raise ValueError("sweep_max_llc must be > 0")
        if self.sweep_factor < 2:
            raise ValueError("sweep_factor must be at least 2")
        for name in ("intensity_batches", "decode_batches"):
            vals = getattr(self, name)
            if not vals or any(int(v) < 1 for v in vals):
                raise ValueError(f"{name} must be positive integers")
        if self.dtype not in ("auto", *DTYPES):
            raise ValueError(f"--dtype {self.dtype}: use auto, {', '.join(DTYPES)}")
        if self.prefill_tokens < 1 or self.decode_context < 1 or min(self.intensity_kn, self.intensity_kn_gpu) < 16:
            raise ValueError("prefill_tokens and decode_context must be >= 1 and intensity_kn >= 16")
        if self.whatif_context < 0:
            raise ValueError(f"--whatif-context must be >= 0 tokens, got {self.whatif_context}")

    @classmethod
    def quick(cls) -> Config:
        return cls(
            bandwidth_repeats=3, kernels=("read", "copy", "triad"), sweep_kernels=("triad",), sweep_max_llc=1.0,
            sweep_factor=8, sweep_min_run_s=0.03, cpu_shapes=((2048, 1024, 1024), (1024, 2048, 1024)),
            gpu_shapes=GPU_SHAPES[:2], compute_repeats=3, intensity_batches=(1, 4, 16, 64, 256),
            intensity_kn_gpu=4096, intensity_repeats=3, decode_context=32, decode_batches=(1, 4, 16, 64),
            decode_steps=6,
        )
