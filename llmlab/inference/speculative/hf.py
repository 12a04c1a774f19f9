"""The Hugging Face peer: assisted generation (`generate(assistant_model=...)`) with the same draft.

transformers `generation/candidate_generator.py`: num_assistant_tokens, num_assistant_tokens_schedule
("constant", "heuristic" +2/-1), assistant_confidence_threshold. Prompt lookup's peer needs no
wrapper: `decode.hf_generate(target, ids, n, prompt_lookup_num_tokens=k, max_matching_ngram_size=n)`.
"""

from __future__ import annotations

import torch

from llmlab.inference import decode


def hf_assisted_generate(target, draft, input_ids: torch.Tensor, max_new_tokens: int, gamma: int | None,
                         schedule: str | None = "constant", confidence: float | None = 0.0, **kw) -> torch.Tensor:
    """HF assisted generation with the same draft.

    By default a constant gamma with the confidence stop off, as our chain loop drafts. `gamma`,
    `schedule` ("constant" | "heuristic" | "heuristic_transient") or `confidence` None keep HF's own
    default for that setting (transformers 5: 20 tokens, "constant", an adaptive confidence stop
    starting at 0.4). HF reads these from the assistant's generation_config and adapts some of them
    in place across calls; they are restored afterwards, so every call starts from the same state.
    Batch size 1 only (an HF limit).
    """
    from transformers.utils import logging as hf_logging  # lazy: transformers.utils alone takes ~2 s to import

    gc = draft.generation_config
    saved = (gc.num_assistant_tokens, gc.num_assistant_tokens_schedule, gc.assistant_confidence_threshold)
    for name, value in (("num_assistant_tokens", gamma), ("num_assistant_tokens_schedule", schedule),
                        ("assistant_confidence_threshold", confidence)):
        if value is not None:
            setattr(gc, name, value)
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # HF's candidate generator warns about the arguments it passes its assistant
    try:
        return decode.hf_generate(target, input_ids, max_new_tokens, assistant_model=draft, **kw)
    finally:
        hf_logging.set_verbosity(verbosity)
        gc.num_assistant_tokens, gc.num_assistant_tokens_schedule, gc.assistant_confidence_threshold = saved
