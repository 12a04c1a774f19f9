"""Lab: when one GPU is not enough: collectives and a sharded decode on torch.distributed.

1. A sharded decode, exact first: the built-in `tiny` split Megatron-style over the ranks
   (llmlab.inference.tp.ShardedLlama: heads and GQA KV heads column-split, o_proj row-split,
   gate/up column-split, down row-split, one all-reduce after attention and one after the MLP;
   embeddings and LM head replicated). Its logits must equal the single-process HF forward within
   1e-5 (FP32) and its greedy tokens must be identical, before anything is timed.
2. Collectives: all-reduce, all-gather, reduce-scatter from 8 B to 64 MiB on the CPU, to 1 GiB on
   GPUs (nccl-tests' range: NVLink busbw plateaus near 256 MiB-1 GiB): time, algbw and busbw as
   nccl-tests defines them (NVIDIA/nccl-tests, doc/PERFORMANCE.md: algbw = S/t; busbw = algbw x
   2(n-1)/n for all-reduce, (n-1)/n for all-gather and reduce-scatter). On GPUs busbw is compared
   with each rank's link spec read from NVML through that rank's own device UUID (active NVLink links
   x the per-direction rate of the GPU's NVLink generation, which its architecture fixes: 20 GB/s
   NVLink 1, 25 GB/s NVLink 2-4, 50 GB/s NVLink 5; or the maximum PCIe generation x width, not
   the current one, which drops at idle); on the CPU gloo
   runs over loopback TCP and has no link spec. Across nodes (torchrun) the sweep also runs on the
   ranks of one node (NVLink/PCIe) and on one rank per node (the network), each with its own spec
   (the node's InfiniBand or Ethernet port rate from sysfs).
3. Where the time goes: one decode step at batch 1 and 16 for TP = 1 and TP = nproc, with the
   all-reduces timed inside the step (the device synchronized around each at every TP, TP = 1
   included); the all-reduce message (batch x hidden x bytes), 2 x layers all-reduces per token, the
   comm predicted from part 2, and the scaling efficiency (speed-up / TP). The steps run twice: as
   they are (the speed-up), and with a barrier before each all-reduce, which splits the all-reduce
   time of a step into the wait for the slower rank (the skew) and the all-reduce itself.
4. What fits, by formula: arch:llama-3.1-70b in BF16 on 80 GB GPUs (llmlab.core.models
   param_count, kv_bytes_per_token): the minimum TP for a context x batch and the KV tokens left.

Ranks: `--nproc N` spawns them (torch.multiprocessing, MASTER_ADDR 127.0.0.1, a free port), gloo
with one thread per rank on the CPU, NCCL on GPUs (rank r on cuda:(G + r) with --gpu G); with fewer
GPUs than ranks (and --backend auto) the ranks run on gloo over the CPU and the run says so. Rank 0
gathers and returns the tables. Under an outside `torchrun --nnodes M --nproc-per-node N -m llmlab
tensor-parallel` (env:// rendezvous) every rank runs the worker, local rank r on cuda:(G + r), and
rank 0 alone renders and saves.

References: Shoeybi et al., "Megatron-LM" (2019); NVIDIA/nccl-tests doc/PERFORMANCE.md; PyTorch
torch.distributed docs (gloo / NCCL backends, torchrun); Pope et al., "Efficiently Scaling
Transformer Inference" (2022) for the 2-all-reduces-per-layer cost at small batch.

Layout: `config` (the Config), `plan` (checks before the ranks start), `worker` (a rank's work),
`formulas` and `links` (the parent's formulas and link specs), `lab` (run), `verdicts` (judge,
headline), `report` (views).
"""

from llmlab.core.lazy import lazy
from llmlab.labs.tensor_parallel.config import BACKENDS, JUDGE_VERSION, LAB, VERSION, Config, MiB

_PARTS = {  # name -> the submodule that defines it; imported on first use (the parts load torch)
    "run": "lab",
    **dict.fromkeys(("headline", "judge", "plateau"), "verdicts"),
    "views": "report",
    **dict.fromkeys(("Plan", "check_heads", "check_ranks"), "plan"),
    **dict.fromkeys(("_worker", "exactness_worker"), "worker"),
    **dict.fromkeys(("fits_rows", "predicted_comm_ms"), "formulas"),
    **dict.fromkeys(("gpu_link_rows", "nic_row", "nvlink_spec", "pcie_spec"), "links"),
}
__getattr__ = lazy(__name__, _PARTS)
__all__ = ["BACKENDS", "JUDGE_VERSION", "LAB", "VERSION", "Config", "MiB", *_PARTS]
