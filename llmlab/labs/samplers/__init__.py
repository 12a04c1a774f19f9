"""Lab: one distribution, four fates: how greedy, temperature, top-k, top-p and min-p turn the
model's scores into one token, what that does to the text, and what each costs per step.

Parts:
1. fates: the model's real next-token distribution on a prompt, and what each strategy keeps
   (the tokens, their renormalised probabilities, the mass kept); across the positions of a
   real passage, how many tokens top-k, top-p and min-p keep when the model is sure or unsure.
   Each processor's kept set against Hugging Face's warper on those real distributions.
2. quality: N continuations per strategy and a temperature sweep: distinct-1/2, repetition
   (rep-4), mean log-probability under the model, entropy.
3. distribution: the sorting-free top-p sampler against the sort-based one (chi-square).
4. latency: one sampling step per strategy, ours and Hugging Face's, over vocab x batch on
   synthetic logits; the ratio to greedy ("top-p costs 9x greedy": reproduce or refute);
   the sampler's share of a measured decode step of the model.

References:
- Holtzman et al. 2019 (top-p), Fan et al. 2018 (top-k), Nguyen et al. 2024 (min-p).
- Welleck et al. 2019, "Neural Text Generation with Unlikelihood Training" (seq-rep-4).
- Li et al. 2016, "A Diversity-Promoting Objective Function" (distinct-n).
- FlashInfer, "Sorting-Free GPU Kernels for LLM Sampling" (2025).
- llmlab.inference.sampling: the algorithms measured here, tested against transformers.

Layout: `config` (the Config), `fates`, `quality`, `distribution` and `latency` (parts 1-4), `lab`
(run), `verdicts` (judge, headline), `report` (views, figures).
"""

from llmlab.core.lazy import lazy
from llmlab.labs.samplers.config import GOAL, JUDGE_VERSION, LAB, STRATEGIES, VERSION, Config

_PARTS = {  # name -> the submodule that defines it; imported on first use (the parts load torch)
    "run": "lab",
    **dict.fromkeys(("ARTICLE_RATIO", "confidence_quarters", "headline", "judge"), "verdicts"),
    **dict.fromkeys(("figures", "views"), "report"),
    **dict.fromkeys(("entropy", "spearman"), "fates"),
    "text_metrics": "quality",
    "mass_bins": "distribution",
}
__getattr__ = lazy(__name__, _PARTS)
__all__ = ["GOAL", "JUDGE_VERSION", "LAB", "STRATEGIES", "VERSION", "Config", *_PARTS]
