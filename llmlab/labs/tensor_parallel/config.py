"""The tensor-parallel lab's Config: every field is a command-line option (llmlab.core.config.opt)."""

from __future__ import annotations

from dataclasses import dataclass

from llmlab.core.config import opt

LAB = "tensor-parallel"
VERSION = 2  # 2: sizes to 1 GiB on GPUs, syncs at TP = 1 too, the aligned (barrier) steps, per-rank links, scopes
JUDGE_VERSION = 2
MiB = 2**20
BACKENDS = ("auto", "gloo", "nccl")


@dataclass(frozen=True)
class Config:
    """Tensor parallelism: collectives and a sharded decode on torch.distributed (gloo on the CPU, NCCL on GPUs).

    When a model or its KV cache outgrows one GPU, engines split each layer across GPUs and pay two all-reduces per
    layer. This lab spawns --nproc ranks, splits the built-in tiny Megatron-style (heads and KV heads column-split,
    o_proj and down row-split) and checks its logits against one process within 1e-5 first; times all-reduce,
    all-gather and reduce-scatter from 8 B up with nccl-tests' algbw and busbw; splits a decode step at TP 1 and TP
    n into compute and all-reduce time; and says by formula how many 80 GB GPUs Llama-3.1-70B needs. Also runs
    under torchrun --nproc-per-node N -m llmlab tensor-parallel.
    """

    nproc: int = opt(2, help="Ranks = the TP degree (>= 2; one per GPU on CUDA, from --gpu N on; with fewer GPUs "
                             "and --backend auto the ranks run on gloo over the CPU).")  # what a 2-core CPU holds
    backend: str = opt("auto", help="auto (nccl on CUDA, gloo on the CPU) | gloo | nccl.")
    timeout_s: float = opt(600.0, help="Seconds before a rank still running is declared hung (exit 3).")
    model: str = opt("tiny", short="-m", help="The model split over the ranks (its heads must divide by "
                                              "--nproc).")  # real weights: the exactness check means something
    prompt_len: int = opt(16, help="Prompt tokens of the exactness check.")
    new_tokens: int = opt(8, help="Greedy tokens compared against the single-process forward.")
    sizes: tuple[int, ...] = opt(tuple(8 * 4**k for k in range(12)) + (64 * MiB,),
                                 help="Collective message sizes on the CPU, in bytes, comma-separated (8 B .. 1 "
                                      "GiB).")  # 8 B .. 32 MiB x4 apart, then 64 MiB
    gpu_sizes: tuple[int, ...] = opt(tuple(8 * 4**k for k in range(14)) + (1024 * MiB,),
                                     help="Collective message sizes on GPUs, in bytes, comma-separated (8 B .. 1 "
                                          "GiB).")  # 8 B .. 512 MiB, then 1 GiB (nccl-tests' range)
    warmup: int = opt(2, help="Untimed collectives per size (connection set-up, first touch).")
    max_iters: int = opt(50, help="Timed collectives per size at most.")  # nccl-tests' default is 20
    blocks: int = opt(3, help="The timed iterations in this many blocks, the fastest block's mean kept (>= 1; "
                              "timeit's rule: less scheduler noise).")
    point_s: float = opt(0.3, help="Target seconds of timed collectives per size (fewer iterations for big "
                                   "messages).")
    batches: tuple[int, ...] = opt((1, 16), help="Decode batches, comma-separated (>= 1).")  # latency-bound 1, a server
    context: int = opt(64, help="Cached positions before the timed decode steps (>= 1).")
    steps: int = opt(20, help="Timed decode steps per (TP, batch), the median reported (>= 3).")
    fit_model: str = opt("arch:llama-3.1-70b", help="Part 4: the model whose BF16 weights and KV are fitted on "
                                                    "GPUs by formula.")  # needs several 80 GB GPUs
    fit_context: int = opt(8192, help="Part 4: tokens per sequence (>= 1).")
    fit_batch: int = opt(16, help="Part 4: sequences (>= 1).")
    gpu_GB: float = opt(80.0, help="Part 4: memory per GPU in GB (> 0).")  # H100/A100 80 GB
    usable: float = opt(0.9, help="Part 4: share of a GPU's memory for weights + KV, in (0, 1] (the rest: "
                                  "activations, runtime).")
    fault: str = opt("", hidden=True, help="Test hook: kill:R kills rank R, hang:R hangs it, right after the group "
                                           "forms.")
    seed: int = 0

    def __post_init__(self):
        if self.nproc < 2:
            raise ValueError(f"--nproc {self.nproc}: tensor parallelism needs at least 2 ranks (one process has "
                             "nothing to split or all-reduce; the TP=1 baseline is measured anyway)")
        if self.backend not in BACKENDS:
            raise ValueError(f"--backend {self.backend!r}: use auto, gloo (CPU) or nccl (CUDA)")
        if not self.timeout_s > 0:
            raise ValueError("--timeout-s must be > 0 seconds")
        if not self.sizes or not self.gpu_sizes or any(s < 8 or s > 2**30 for s in self.sizes + self.gpu_sizes):
            raise ValueError("message sizes must be 8 B .. 1 GiB")
        if not self.batches or any(b < 1 for b in self.batches) or self.context < 1 or self.steps < 3 or \
                self.blocks < 1:
            raise ValueError("batches, context and blocks must be >= 1, steps >= 3")
        if self.fault and (self.fault.split(":")[0] not in ("kill", "hang") or not self.fault.split(":")[-1].isdigit()):
            raise ValueError(f"fault {self.fault!r}: the test hook takes kill:RANK or hang:RANK")
        if self.fit_context < 1 or self.fit_batch < 1 or not 0 < self.usable <= 1 or self.gpu_GB <= 0:
            raise ValueError("--fit-context and --fit-batch must be >= 1, usable in (0, 1], gpu_GB > 0")

    @classmethod
    def quick(cls) -> Config:
        return cls(timeout_s=180.0, sizes=(8, 1024, 4096, 64 * 1024, 4 * MiB), max_iters=20, point_s=0.05,
                   gpu_sizes=(8, 1024, 4096, 64 * 1024, 4 * MiB, 64 * MiB, 256 * MiB), steps=6, context=32,
                   new_tokens=6)
