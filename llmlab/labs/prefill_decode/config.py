"""The prefill-decode lab's Config and constants: light imports only (the CLI reads it without torch)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from llmlab.core.config import opt

LAB = "prefill-decode"
VERSION = 3  # 2: the decode share of a whole generation at long replies; 3: the hand-off, run on two ranks
LINKS = (("PCIe 4 x16 (spec)", 32.0), ("NVLink 4 (spec)", 450.0))  # GB/s per direction: PCIe 4.0 x16; H100 NVLink 4
BOUND_SHARE = 0.5  # a phase is "bound" by a roof when it reaches >= half of it
E2E_TOL = 0.10  # E2E predicted from the parts must land within 10% of the timed whole
FLOP_TOL = 0.05  # formula vs FlopCounterMode
DECODE_SHARE = 0.90  # "decode is ~95% of generation time": the decode share must reach 90% at every long reply
DTYPES = ("auto", "float32", "bfloat16", "float16")


@dataclass(frozen=True)
class Config:
    """
    One request, two personalities: prefill (reading the prompt, math-bound), decode (writing the reply, fetching data).

    A prefill pushes all T prompt tokens through each weight at once; a decode step pushes one token through every
    weight. This lab times both on your device (tokens/s and the ratio), counts their FLOPs and bytes from the
    model's shape (checked against torch's FlopCounterMode) and places them on the roofline measured with the
    roofline lab's kernels, finds the decode batch at which decode turns compute-bound, predicts E2E = TTFT +
    (n - 1) x ITL from the parts and times the whole, checks that decode is ~95% of a generation at realistic reply
    lengths (256-1,024 tokens after a 512-token prompt), and runs disaggregated serving on two torch.distributed
    ranks: one prefills and ships the KV blocks, the other decodes beside running replies, against the same engine
    colocated with chunked prefill. On a CPU it also says what really bounds
    decode when the model sits in cache.
    """

    # the built-in, and a real shape 85x its size (random weights)
    models: tuple[str, ...] = opt(("tiny", "arch:qwen2.5-0.5b"), help="Models to time (repeatable); the first also "
                                  "gets parts 3-6. arch:NAME = random weights, timing only.", flag="--model",
                                  short="-m")
    # 16 ... 4096, x4 apart: short chats to long documents
    prompt_lens: tuple[int, ...] = opt((16, 64, 256, 1024, 4096), help="Prompt lengths T, comma-separated; lengths "
                                       "beyond a model's context are clamped away with a note.")
    # a 0.5B prefill of 512 tokens is ~0.5 TFLOP
    arch_max_len: int = opt(512, help="arch: shapes are timed up to this prompt length (>= 1).")
    # no fast BF16 path on a CPU
    dtype: str = opt("auto", help="auto (float32 on a CPU, bfloat16 on a GPU) | float32 | bfloat16 | float16.")
    repeats: int = opt(5, help="Timed calls per point: median with p10/p90 (>= 3).")
    max_point_s: float = opt(4.0, help="Seconds after which a point's repeats stop early (>= 3 kept).")
    # across the ridge
    batch_sizes: tuple[int, ...] = opt((1, 2, 4, 8, 16, 32, 64, 128, 256),
                                       help="Decode batch sizes of the crossover sweep.")
    batch_context: int = opt(128, help="Cached positions per sequence in the decode batch sweep (>= 1).")
    # short and long replies
    output_lens: tuple[int, ...] = opt((8, 64), help="Reply lengths n for E2E = TTFT + (n - 1) ITL (>= 2).")
    e2e_repeats: int = opt(3, help="End-to-end generations per (T, n) (>= 1).")
    # a chat prompt of a page: the series' "512-token prompt"
    share_prompt: int = opt(512, help="Prompt tokens of the decode-share part (>= 1).")
    # realistic replies: a paragraph to a page and more
    share_output_lens: tuple[int, ...] = opt((256, 1024), help="Reply lengths n of the decode-share part, "
                                             "comma-separated (>= 2).")
    share_repeats: int = opt(2, help="Whole generations timed per reply length of the decode-share part (>= 1).")
    # 0 = the spec links
    link_GBps: float = opt(0.0, help="Link bandwidth (GB/s, one direction) of the napkin hand-off table (`disagg`, "
                                     "in the JSON; 0 = the spec values of PCIe 4.0 x16, 32, and NVLink 4, 450).",
                                     flag="--link-GBps")
    # one thread waits on nobody
    threads: int = opt(0, help="torch CPU threads for roofs and model alike (0 = torch's, or 1 when the CPU is "
                               "oversubscribed).")
    # DRAM, not cache
    roof_llc_multiple: int = opt(8, help="Bandwidth buffers of the roofs, in last-level caches.")
    roof_blocks: int = opt(10, help="Timed blocks per bandwidth kernel of the roofs.")
    roof_repeats: int = opt(5, help="Timed matmuls per shape of the compute roof.")
    # the best median wins
    roof_shapes: int = opt(2, help="Matmul shapes of the compute roof.")
    # tiny's weights sit in a GPU's L2: decode would not read HBM
    cuda_model: str = opt("auto", help="GPU: auto = a registry arch: of >= 32x the L2 replaces the first model when "
                                       "it fits in L2; same = keep it; or a model reference.")
    # a page-long prompt: several chunks of the colocated prefill
    handoff_prompt: int = opt(1024, help="Prompt tokens of each long request of the measured hand-off (>= 16; a "
                              "multiple of 16 ships every token's KV).")
    handoff_requests: int = opt(3, help="Long requests of the hand-off, arriving 100 ms after the running replies "
                                "start and 200 ms apart (>= 1).")
    # the decodes a prefill would stall
    handoff_running: int = opt(4, help="Replies already decoding when the long prompts arrive (>= 1).")
    # a chunk step is a few decode steps long
    handoff_chunk: int = opt(128, help="Tokens per step of the colocated engine's chunked prefill, the hand-off's "
                             "baseline (>= 1).")
    seed: int = 0

    def __post_init__(self):
        if not self.models:
            raise ValueError("--model: give at least one model")
        if not self.prompt_lens or any(int(t) < 1 for t in self.prompt_lens):
            raise ValueError("--prompt-lens must be one or more positive token counts")
        if not self.batch_sizes or any(int(b) < 1 for b in self.batch_sizes):
            raise ValueError("--batch-sizes must be one or more positive batch sizes")
        if not self.output_lens or any(int(n) < 2 for n in self.output_lens):
            raise ValueError("--output-lens must be token counts >= 2 (E2E = TTFT + (n - 1) ITL needs an ITL)")
        if not self.share_output_lens or any(int(n) < 2 for n in self.share_output_lens):
            raise ValueError("--share-output-lens must be token counts >= 2 (a decode share needs a decode step)")
        if self.repeats < 3 or self.e2e_repeats < 1 or self.share_repeats < 1:
            raise ValueError("repeats must be >= 3 (a median needs samples), e2e_repeats and share_repeats >= 1")
        if self.link_GBps < 0 or not math.isfinite(self.link_GBps):
            raise ValueError(f"--link-GBps {self.link_GBps}: give a positive bandwidth in GB/s (0 = the spec links)")
        if self.handoff_prompt < 16:
            raise ValueError(f"--handoff-prompt {self.handoff_prompt}: give at least 16 tokens (one KV block)")
        if min(self.handoff_requests, self.handoff_running, self.handoff_chunk) < 1:
            raise ValueError("--handoff-requests, --handoff-running and --handoff-chunk must each be >= 1")
        if self.dtype not in DTYPES:
            raise ValueError(f"--dtype {self.dtype}: use auto, float32, bfloat16 or float16")
        if self.batch_context < 1 or self.arch_max_len < 1 or self.threads < 0 or self.share_prompt < 1:
            raise ValueError("batch_context, arch_max_len and share_prompt must be >= 1, threads >= 0")

    @classmethod
    def quick(cls) -> Config:
        # the decode share keeps the 512-token prompt and one realistic reply, 256 tokens: seconds on a CPU
        return cls(models=("tiny",), prompt_lens=(32, 128, 512), repeats=3, max_point_s=1.5, batch_sizes=(1, 4, 16, 64),
                   batch_context=32, output_lens=(8,), e2e_repeats=3, share_output_lens=(256,), share_repeats=1,
                   roof_llc_multiple=2, roof_blocks=3, roof_repeats=3, roof_shapes=1, handoff_prompt=512,
                   handoff_requests=2)
