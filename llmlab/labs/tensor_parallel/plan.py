"""Checks before any rank of the tensor-parallel lab starts: where the ranks run, and whether the model splits."""

from __future__ import annotations

from dataclasses import dataclass

from llmlab.core.errors import UsageError
from llmlab.inference.tp import divisible_sizes

# ---------------------------------------------------------------- checks before any rank starts


@dataclass(frozen=True)
class Plan:
    """Where the ranks run: the backend, whether on GPUs, the first GPU, and why it differs from what was asked."""

    backend: str
    on_cuda: bool
    first_gpu: int = 0
    note: str = ""


def check_ranks(nproc: int, backend: str, cuda: bool, gpus: int, first_gpu: int = 0) -> Plan:
    """The plan for `nproc` ranks on this host, or UsageError. One rank per GPU from cuda:first_gpu on; with fewer
    GPUs than that and --backend auto, the ranks run on gloo over the CPU (the run says so); nccl needs the GPUs."""
    chosen = ("nccl" if cuda else "gloo") if backend == "auto" else backend
    if chosen == "nccl" and not cuda:
        raise UsageError("--backend nccl needs CUDA GPUs: on the CPU use gloo (or auto)")
    have = max(0, gpus - first_gpu)
    if cuda and nproc > have:
        if backend != "auto":
            raise UsageError(f"--nproc {nproc}: only {have} CUDA GPU(s) from cuda:{first_gpu} on, one rank per GPU "
                             f"(--backend auto runs the ranks on gloo over the CPU instead)")
        return Plan("gloo", False, first_gpu, f"only {have} CUDA GPU(s) from cuda:{first_gpu} for {nproc} ranks: the "
                    "collectives and the sharded decode ran on gloo over the CPU (one thread per rank), so no figure "
                    "here is a GPU's; run with one GPU per rank for NCCL")
    return Plan(chosen, cuda, first_gpu)


def check_heads(heads: int, kv_heads: int, tp: int, intermediate: int = 0) -> None:
    """UsageError unless TP divides the query heads, the KV heads (no KV-head replication here) and the MLP width."""
    if heads % tp or kv_heads % tp or (intermediate and intermediate % tp):
        ok = [t for t in divisible_sizes(heads, kv_heads) if not intermediate or intermediate % t == 0]
        raise UsageError(f"TP {tp} does not divide {heads} query heads and {kv_heads} KV heads"
                         f"{f' and {intermediate} MLP columns' if intermediate else ''}: "
                         f"TP sizes that divide: {', '.join(map(str, ok)) or 'none'}")
