"""The samplers lab's run: parts 1-4 into tables (never printed, never judged here)."""

from __future__ import annotations

from contextlib import contextmanager

import torch

from llmlab.core.device import Device, torch_threads
from llmlab.core.results import LabResult
from llmlab.labs.samplers.config import JUDGE_VERSION, LAB, VERSION, Config
from llmlab.labs.samplers.distribution import part_distribution
from llmlab.labs.samplers.fates import part_fates, part_sure_vs_unsure
from llmlab.labs.samplers.latency import part_latency
from llmlab.labs.samplers.quality import part_quality

# ----------------------------------------------------------------------------- run


def run(cfg: Config, device: Device, progress=None) -> LabResult:
    """Measures. Returns data. Never prints."""
    from llmlab.core.models import load

    res = LabResult.new(LAB, VERSION, cfg)
    res.judge_version = JUDGE_VERSION
    torch.manual_seed(cfg.seed)
    with res.guard():
        lm = load(cfg.model, device)
        res.env["model"] = {"ref": cfg.model, "kind": lm.kind, "n_params": lm.n_params, "vocab": lm.config.vocab_size}
        if lm.timing_only:
            res.note(f"{cfg.model} has random weights: its fates and quality rows are timings of a real shape, never "
                     "a quality claim")
        with untimed(device):  # parts 1-3 count tokens, not milliseconds
            prompt_logits = next_token_logits(lm, cfg.prompt, device)  # (1, V)
            part_fates(res, cfg, lm, prompt_logits)
            part_sure_vs_unsure(res, cfg, lm, device)
            part_quality(res, cfg, lm, device, progress)
            part_distribution(res, cfg, prompt_logits)
        part_latency(res, cfg, lm, device, prompt_logits, progress)
    return res


@contextmanager
def untimed(device: Device):
    """One CPU thread for work that is not timed: on a shared, busy CPU a thread pool waiting
    for a descheduled worker made a decode step of tiny 10x slower (the timed parts keep
    torch's own thread count)."""
    with torch_threads(None if device.is_cuda else 1):
        yield


@torch.inference_mode()
def next_token_logits(lm, text: str, device: Device) -> torch.Tensor:
    ids = lm.tokenizer(text, return_tensors="pt").input_ids.to(device.torch)
    return lm.model(input_ids=ids).logits[:, -1, :].float()  # (1, V)
