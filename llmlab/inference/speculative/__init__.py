"""Speculative decoding over Hugging Face causal LMs: a draft proposes, the target verifies in one forward.

Reading order: `acceptance` (distributions, the acceptance rule, the min rule of a batch) -> `policies`
(draft lengths) -> `rounds` (the state every loop shares) -> `chain` (`draft_chain` ->
`speculative_generate`) -> `tree` (`TreeShape` -> `tree_attention_mask` -> `tree_generate`) ->
`lookup` (prompt lookup: a draft without a model) -> `metrics` -> `hf` (the Hugging Face peer).

References:
- Leviathan, Kalman, Matias 2023, "Fast Inference from Transformers via Speculative Decoding"
  (arXiv 2211.17192): algorithm 1, beta = sum_x min(p, q), expected tokens per round
  (1 - a^(g+1)) / (1 - a) and speed-up (1 - a^(g+1)) / ((1 - a)(g c + 1)).
- Chen et al. 2023, "Accelerating Large Language Model Decoding with Speculative Sampling"
  (arXiv 2302.01318): the modified rejection sampling, residual norm(max(0, p - q)).
- Miao et al. 2024, "SpecInfer" (arXiv 2305.09781): token-tree verification in one forward with a
  tree attention mask; multi-candidate speculative sampling.
- Li et al. 2024, "EAGLE" / "EAGLE-2" (arXiv 2401.15077, 2406.16858): top-k trees from the draft,
  depth-based position ids, KV compaction to the accepted path.
- gpt-fast generate.py `speculative_decode`; transformers `generation/candidate_generator.py`
  (num_assistant_tokens, the "heuristic" +2/-1 schedule, assistant_confidence_threshold).
"""

# the distribution tests' statistics live in llmlab.core.stats: these are the same objects
from llmlab.core.stats import SIGNIFICANCE, chisquare_pvalue, detectable_effect, samples_for_effect
from llmlab.inference.speculative.acceptance import (
    beta,
    coin,
    draw,
    min_rule,
    multi_candidate_verify,
    one_hot_q,
    probs,
    rejection_plan,
    verify,
    verify_greedy,
    verify_greedy_rows,
    verify_round,
    verify_rows,
)
from llmlab.inference.speculative.chain import draft_chain, speculative_generate
from llmlab.inference.speculative.hf import hf_assisted_generate
from llmlab.inference.speculative.lookup import NgramIndex, PromptLookup, lookup_generate
from llmlab.inference.speculative.metrics import acceptance_metrics, exact_law, expected_tau, predicted_speedup
from llmlab.inference.speculative.policies import (
    ConfidenceGamma,
    ConstantGamma,
    HeuristicGamma,
    OracleGamma,
    oracle_run_lengths,
)
from llmlab.inference.speculative.rounds import SpecGeneration, SpecStats, check_vocabulary, prefill
from llmlab.inference.speculative.tree import (
    TreeShape,
    compact_cache,
    draft_tree,
    tree_attention_mask,
    tree_forward,
    tree_generate,
    tree_shape,
)

__all__ = [
    "SIGNIFICANCE", "ConfidenceGamma", "ConstantGamma", "HeuristicGamma", "NgramIndex", "OracleGamma", "PromptLookup",
    "SpecGeneration", "SpecStats", "TreeShape", "acceptance_metrics", "beta", "check_vocabulary", "chisquare_pvalue",
    "coin", "compact_cache", "detectable_effect", "draft_chain", "draft_tree", "draw", "exact_law", "expected_tau",
    "hf_assisted_generate", "lookup_generate", "min_rule", "multi_candidate_verify", "one_hot_q",
    "oracle_run_lengths", "predicted_speedup", "prefill", "probs", "rejection_plan", "samples_for_effect",
    "speculative_generate", "tree_attention_mask", "tree_forward", "tree_generate", "tree_shape", "verify",
    "verify_greedy", "verify_greedy_rows", "verify_round", "verify_rows",
]
