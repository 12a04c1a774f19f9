"""The pair a run measures: loading and checking the target and its draft, their prompts, the timing pair.

On CUDA the built-in pair fits in the GPU's L2, so the timed parts run an `arch:` pair sized from the
device instead (`verify_cost.speed_pair`); correctness always runs on the loaded, trained pair.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import torch
from transformers.utils import logging as hf_logging

from llmlab.core.device import Device
from llmlab.core.errors import UsageError
from llmlab.core.models import BUILTINS, load, load_config, load_tokenizer
from llmlab.core.results import LabResult
from llmlab.inference import speculative as S
from llmlab.inference import verify_cost as V
from llmlab.inference.decode import SamplingParams
from llmlab.labs.speculative.config import Config
from llmlab.tiny.corpus import build_corpus
from llmlab.tiny.evaluate import heldout_prompts

HELDOUT_PROMPT_LEN = 32  # tokens per held-out prompt of the built-in pair (as its model card's agreement)
# Prompts for any other pair (Python docs and code, written for this lab). The built-in pair gets
# prompts from its held-out documents instead: text it never saw, in its own domain.
PROMPTS = (
    "def __init__(self, name, value=None):\n        ",
    "The for statement is used to iterate over the elements of",
    "import os\nimport sys\n\n\ndef main():\n    ",
    "Return the number of items in the",
    'class Queue:\n    """A first-in, first-out queue."""\n\n    def ',
    "If the argument is a string, it",
    "    for key, value in sorted(items):\n        if ",
    "Raise ValueError if the",
)


def sampling_params(cfg: Config, temperature: float | None = None) -> SamplingParams:
    """The run's sampling settings, at `temperature` (default: the lab's --temperature)."""
    t = cfg.temperature if temperature is None else temperature
    return SamplingParams(temperature=t, top_k=cfg.top_k, top_p=cfg.top_p)


def prompt_lookup(cfg: Config) -> S.PromptLookup:
    """The run's prompt-lookup settings."""
    return S.PromptLookup(cfg.lookup_max_ngram, cfg.lookup_min_ngram, cfg.lookup_tokens)


def check_pair(cfg: Config) -> None:
    """A draft must share the target's tokenizer: refuse another vocabulary before loading any weights."""
    vt, vd = load_config(cfg.model).vocab_size, load_config(cfg.draft).vocab_size
    if vt != vd:
        raise UsageError(f"--draft {cfg.draft} has a vocabulary of {vd} tokens but --model {cfg.model} has {vt}: "
                         "speculative decoding needs a draft that shares the target's tokenizer")
    tt, td = load_tokenizer(cfg.model), load_tokenizer(cfg.draft)
    if tt is not None and td is not None and tt.get_vocab() != td.get_vocab():
        raise UsageError(f"--draft {cfg.draft}'s tokenizer ({len(td)} tokens) differs from --model {cfg.model}'s "
                         f"({len(tt)} tokens): speculative decoding needs one shared tokenizer")


@dataclass
class Pair:
    target: torch.nn.Module
    draft: torch.nn.Module
    tokenizer: object
    prompts: list[torch.Tensor]  # (1, S) each
    device: Device
    label: str  # which models these are, as the report names them

    def run(self, fn, prompts=None) -> list:
        return [fn(ids) for ids in (self.prompts if prompts is None else prompts)]


def load_pair(cfg: Config, device: Device) -> Pair:
    t, d = load(cfg.model, device), load(cfg.draft, device)
    if t.tokenizer is None:
        raise UsageError(f"--model {cfg.model} has no tokenizer (random weights): this lab needs a trained pair")
    pair = Pair(t.model, d.model, t.tokenizer, [], device, f"{cfg.model} / {cfg.draft}")
    pair.prompts = prompt_set(cfg, pair, cfg.prompts)
    return pair


def timing_pair(res: LabResult, cfg: Config, pair: Pair) -> Pair:
    """The pair the timed parts run, recorded in env["speed_models"]. On a CPU: the pair itself. On CUDA the
    built-in pair (23 MB) sits in an H200's 50 MB L2, so decode there is not memory-bound: an arch: target and
    draft sized from the device (verify_cost.speed_pair), the draft's share of the target as the pair's."""
    if not pair.device.is_cuda:
        res.env["speed_models"] = dict(kind="loaded", target=cfg.model, draft=cfg.draft)
        return pair
    share = res.env["models"]["draft_params"] / res.env["models"]["target_params"]
    try:
        t, d, info = V.speed_pair(cfg.gpu_arch, pair.device, share, cfg.dram_llc_multiple, seed=cfg.seed)
    except V.TooLarge as exc:
        res.note(f"timed parts on {pair.label}, which may sit in L2: {exc}")
        res.env["speed_models"] = dict(kind="loaded", target=cfg.model, draft=cfg.draft, why=str(exc))
        return pair
    res.env["speed_models"] = dict(kind="arch", **info)
    label = f"{info['target']} / {info['draft']} ({info['dtype']}, random weights: a timing only)"
    res.note(f"timed parts (speed, gamma, policies, tree, batch, lookup): {label}; correctness on {pair.label}")
    return Pair(t, d, pair.tokenizer, pair.prompts, pair.device, label)


def prompt_set(cfg: Config, pair: Pair, n: int) -> list[torch.Tensor]:
    """n prompts (1, S): held-out windows of the built-in pair's corpus (all one length), else PROMPTS."""
    if cfg.model in BUILTINS and cfg.draft in BUILTINS:
        rows = heldout_prompts(_heldout_ids(pair.tokenizer), n=n, prompt_len=HELDOUT_PROMPT_LEN,
                               eot_id=pair.tokenizer.eos_token_id or 0)
        return [rows[i : i + 1].to(pair.device.torch) for i in range(n)]
    return [pair.tokenizer(PROMPTS[i % len(PROMPTS)], return_tensors="pt", add_special_tokens=False)["input_ids"]
            .to(pair.device.torch) for i in range(n)]


@lru_cache(maxsize=1)
def _heldout_ids(tokenizer) -> torch.Tensor:
    text = build_corpus(heldout_only=True).heldout_text()
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # the held-out stream is longer than a context: fine, it is cut into windows
    try:
        return tokenizer(text, return_tensors="pt", add_special_tokens=False)["input_ids"][0]
    finally:
        hf_logging.set_verbosity(verbosity)
