"""Lab: the five steps: watch a model produce one word, step by step, and see where the time goes.

Every token goes through the same five steps (the series, part 2): 1. words to numbers (tokenize,
embed), 2. attention, 3. the MLP (2 and 3 repeat once per layer), 4. the LM head (word scores),
5. sampling (pick a word).

Parts:
1. the walk-through: the model's own submodules called in order by hand (`hand_run`), forward
   hooks recording the real shape after each step, the top-5 candidates after step 4 and the word
   greedy and top-p pick — on the built-in `tiny` (real weights) and on Llama 3 8B's full shape on
   torch's meta device (shapes without memory or arithmetic).
2. where the time goes: forward pre/post hooks stamp each step's modules during a normal forward
   (a decode step and a prefill); the steps must add up to the whole forward within 10%, and the
   remainder (residual adds, masks, Python) is reported. FLOPs per step from the shape formula
   (llmlab.core.flops), cross-checked with FlopCounterMode's per-module counts; parameter bytes.
3. what changes with size: the same split for larger `arch:` shapes (random weights), measured on
   a few of their layers and scaled to the full layer count (labelled).
4. "no secret sixth step": the hand run's logits equal the model's forward (FP32, 1e-5) and its
   greedy word equals generate's.

References:
- transformers' LlamaForCausalLM (modeling_llama.py): embed_tokens -> rotary_emb -> each decoder
  layer (input_layernorm, self_attn, residual, post_attention_layernorm, mlp, residual) -> norm -> lm_head.
- torch.utils.flop_counter.FlopCounterMode; torch.nn.Module.register_forward_pre_hook / _hook.

Layout: `config` (the Config), `lab` (run and its parts), `report` (judge, headline, views).
"""

from llmlab.core.lazy import lazy
from llmlab.labs.five_steps.config import JUDGE_VERSION, LAB, VERSION, Config

_PARTS = {  # name -> the submodule that defines it; imported on first use (the parts load torch)
    **dict.fromkeys(("LOGIT_TOL", "STEPS", "StepClock", "candidate_rows", "generator_on", "hand_check", "hand_run",
                     "load_model", "parts", "predicted_shapes", "run", "share_rows", "time_steps", "walk_rows"), "lab"),
    **dict.fromkeys(("ADD_UP_TOL", "FLOP_TOL", "SAMPLE_SHARE_MAX", "headline", "judge", "views"), "report"),
}
__getattr__ = lazy(__name__, _PARTS)
__all__ = ["JUDGE_VERSION", "LAB", "VERSION", "Config", *_PARTS]
