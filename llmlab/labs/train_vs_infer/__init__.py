"""Lab: training vs inference: training does two things (forward, then backward + update), inference one.

Parts, in the order of the article ("AI Inference, part 1"):
1. the cost of one step: a forward (inference), forward + backward, forward + backward + AdamW,
   over the same B x T tokens, timed in interleaved rounds; FLOPs counted by
   torch.utils.flop_counter.FlopCounterMode beside the napkin 2N (forward) and 6N (training).
2. memory: bytes per parameter of each regime, counted tensor by tensor: weights, gradients
   (after backward), AdamW's two moments (optimizer.state), the activations autograd saves for
   backward (saved_tensors_hooks, each storage once), and inference's KV cache + logits.
   On a GPU torch.cuda.max_memory_allocated is recorded beside it. Scaled to Llama 3 8B by formula.
3. why answers come one word at a time: T positions in one teacher-forced forward vs T
   sequential decode steps (KV cache on), tokens/s of each on the same model.
4. inference does not learn: generate a conversation, check the weights' hash, .grad and a
   re-run with the same prompt and seed; then one AdamW step on that conversation and check again.

References:
- Kaplan et al. 2020 (arXiv 2001.08361), section 2.1: forward ~ 2N FLOPs per token, training ~ 6N.
- ZeRO (Rajbhandari et al. 2020, arXiv 1910.02054), section 3.1: mixed-precision Adam keeps
  16 bytes per parameter (2 weights + 2 grads + 4 master + 4 + 4 moments); FP32 Adam also 16.
- torch.utils.flop_counter.FlopCounterMode; torch.autograd.graph.saved_tensors_hooks.

Layout: `config` (the Config), `lab` (run and its parts), `report` (judge, headline, views).
"""

from llmlab.core.lazy import lazy
from llmlab.labs.train_vs_infer.config import JUDGE_VERSION, LAB, VERSION, Config

_PARTS = {  # name -> the submodule that defines it; imported on first use (the parts load torch)
    **dict.fromkeys(("GPU_GB", "fits_rows", "load_model", "matmul_params", "memory_chart_rows", "part_learning",
                     "part_memory", "part_parallel", "part_step_cost", "run", "weights_hash"), "lab"),
    **dict.fromkeys(("FLOP_RATIO_TOL", "PARALLEL_MIN", "STEP_RATIO_BAND", "headline", "judge", "views"), "report"),
}
__getattr__ = lazy(__name__, _PARTS)
__all__ = ["JUDGE_VERSION", "LAB", "VERSION", "Config", *_PARTS]
