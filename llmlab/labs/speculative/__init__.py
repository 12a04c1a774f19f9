"""Lab: speculative decoding — a small draft guesses, the big target checks all guesses in one forward,
and rejection sampling keeps the output exactly the target's. Only the speed changes.

Parts, in the order of the article (every timed figure comes from interleaved rounds, so a shared
machine's drift hits all methods alike):
1. same output (`correctness`): greedy speculative == plain greedy token for token; the tree forward
   (4D mask, depth positions) == plain forwards of each path; a chi-square test of the JOINT law of the
   first tokens of B = 1 sampled runs (many seeds) against the target's exact law, chain and tree.
2. costs (`speed`): a draft step, a target step, a verify over g + 1 tokens (c and the verify cost).
3. speed (`speed`): plain (ours, HF generate) vs speculative (ours at each gamma, HF assisted at the
   lab's gamma), alpha, tau, Leviathan's prediction beside the measured speed-up (with and without the
   verify cost).
4.-7. (`sweeps`) temperature (counted alpha vs analytic beta), draft-length policies at one draft budget
   (constant, +2/-1, confidence, oracle), a token tree vs chains (same depth, same verify budget), batch size.
8. prompt lookup on input-grounded text (`lookup`); 9. the verify cost in cache and from DRAM (`regimes`).
With --endpoint URL --baseline URL the lab is another one: speculative decoding on a running server against
the same model served without it (endpoint.py, whole).

run() measures (`lab`), judge() gives the verdicts from the tables alone (`verdicts`), views() and
headline() are the report (`report`); `pair` loads the models, `harness` times them.

References:
- Leviathan et al. 2023 (arXiv 2211.17192); Chen et al. 2023 (arXiv 2302.01318);
  SpecInfer (arXiv 2305.09781); EAGLE-2 (arXiv 2406.16858).
- transformers assisted generation: `generate(assistant_model=...)`, num_assistant_tokens,
  num_assistant_tokens_schedule, assistant_confidence_threshold (generation/candidate_generator.py).
- llmlab.inference.speculative: the algorithms measured here, tested for identity and distribution.
"""

from __future__ import annotations

from llmlab.core.device import Device
from llmlab.core.results import LabResult
from llmlab.labs import endpoint_hooks
from llmlab.labs.speculative import endpoint, report, verdicts
from llmlab.labs.speculative.config import (
    GOAL_LOOKUP_CONTROL,
    GOAL_LOOKUP_GROUNDED,
    GOAL_LOOKUP_VS_HF,
    GOAL_VS_HF_ASSISTED,
    GOAL_VS_PLAIN,
    JUDGE_VERSION,
    LAB,
    VERSION,
    Config,
)


def check(cfg: Config) -> Config:
    """Before the run starts: both servers must answer, speak OpenAI's API and stream (else one line, exit 2)."""
    return endpoint.discover(cfg) if cfg.endpoint else cfg


def run(cfg: Config, device: Device, progress=None) -> LabResult:
    """Measures. Fills tables, env, notes and skipped. Never prints, never judges."""
    if cfg.endpoint:  # two running servers, from the outside: no model is loaded here
        res = LabResult.new(LAB, VERSION, cfg)
        with res.guard():
            endpoint.measure(cfg, res, progress)
        return res
    from llmlab.labs.speculative import lab  # torch loads here: the CLI imports this package for its Config

    return lab.run(cfg, device, progress)


judge, views, headline, exit_code = endpoint_hooks(endpoint, verdicts, report)  # by config.endpoint


__all__ = ["GOAL_LOOKUP_CONTROL", "GOAL_LOOKUP_GROUNDED", "GOAL_LOOKUP_VS_HF", "GOAL_VS_HF_ASSISTED", "GOAL_VS_PLAIN",
           "JUDGE_VERSION", "LAB", "VERSION", "Config", "check", "exit_code", "headline", "judge", "run", "views"]
