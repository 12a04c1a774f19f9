"""Prefill and decode over a Hugging Face causal LM with a KV cache: a lean loop, gpt-fast style.

Reading order: `forward` -> `prefill` -> `decode_one_token` -> `iter_tokens` (the one decode loop) ->
`generate`; `stream_text` streams the loop's tokens as text.

References:
- gpt-fast generate.py (prefill / decode_one_token / decode_n_tokens).
- transformers 5.x: the forward kwarg is `cache=` (`past_key_values=` is deprecated until 5.40);
  `Cache.crop(-n)` removes the last n positions; `logits_to_keep=1` computes only the last
  position's logits (the LM head over the whole prompt is wasted work in prefill).

HF `generate` does the same work plus logits processors, stopping criteria and bookkeeping on
every step; this loop is what is left when those are taken out, so the labs can compare both.
"""

from __future__ import annotations

import inspect
import itertools
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch

from llmlab.inference.sampling import SamplingParams

_CACHE_KW: dict[type, str] = {}


def new_cache(model=None):
    """An empty DynamicCache (grows by concatenation; what HF generate uses by default)."""
    from transformers import DynamicCache

    return DynamicCache(config=model.config) if model is not None else DynamicCache()


def _cache_kw(model) -> str:
    cls = type(model)
    if cls not in _CACHE_KW:
        params = inspect.signature(model.forward).parameters
        _CACHE_KW[cls] = "cache" if "cache" in params else "past_key_values"
    return _CACHE_KW[cls]


def forward(model, input_ids: torch.Tensor, cache, *, logits_to_keep: int = 1, **kw) -> torch.Tensor:
    """One forward over `input_ids` (B, T) appending to `cache`; returns logits (B, logits_to_keep, V)."""
    out = model(input_ids=input_ids, use_cache=True, logits_to_keep=logits_to_keep, **{_cache_kw(model): cache}, **kw)
    return out.logits


def crop(cache, length: int) -> None:
    """Cut the cache back to its first `length` positions (e.g. past a rejected draft)."""
    extra = cache.get_seq_length() - length
    if extra > 0:
        cache.crop(-extra)


# ---------------------------------------------------------------- choosing a token


def next_token(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None = None) -> torch.Tensor:
    """logits (B, V) -> token ids (B, 1)."""
    if params.greedy:
        return logits.argmax(dim=-1, keepdim=True)
    return torch.multinomial(params.probs(logits), 1, generator=generator)


# ---------------------------------------------------------------- the loop


@torch.inference_mode()
def prefill(model, input_ids: torch.Tensor, cache) -> torch.Tensor:
    """Run the prompt (B, S) through the model, filling `cache`; returns last-position logits (B, V)."""
    return forward(model, input_ids, cache)[:, -1, :].float()


@torch.inference_mode()
def decode_one_token(model, token: torch.Tensor, cache) -> torch.Tensor:
    """token (B, 1) -> next-position logits (B, V); the cache grows by one position."""
    return forward(model, token, cache)[:, -1, :].float()


@dataclass
class Generation:
    tokens: torch.Tensor  # (B, n) new tokens only
    prefill_s: float
    step_s: list[float] = field(default_factory=list)  # wall time of each decode step after the first token

    @property
    def n_new(self) -> int:
        return int(self.tokens.shape[1])

    @property
    def decode_tokens_per_s(self) -> float:
        total = sum(self.step_s)
        return (len(self.step_s) / total) if total > 0 else float("nan")


def iter_tokens(
    model,
    cache,
    first: torch.Tensor,
    n: int,
    params: SamplingParams = SamplingParams(),
    generator: torch.Generator | None = None,
    eos_token_id: int | None = None,
    sync: Callable[[], None] | None = None,
) -> Iterator[tuple[torch.Tensor, float]]:
    """The decode loop: up to `n` (token (B, 1), step seconds) after `first` (B, 1). A row that has
    emitted EOS keeps emitting EOS; the loop stops when every row has."""
    tok = first
    done = (tok == eos_token_id).squeeze(1) if eos_token_id is not None else None
    for _ in range(n):
        if done is not None and bool(done.all()):
            return
        t0 = time.perf_counter()
        with torch.inference_mode():
            logits = decode_one_token(model, tok, cache)
            tok = next_token(logits, params, generator)
        if done is not None:
            tok = torch.where(done.unsqueeze(1), torch.full_like(tok, eos_token_id), tok)
            done = done | (tok.squeeze(1) == eos_token_id)
        if sync:
            sync()
        yield tok, time.perf_counter() - t0


@torch.inference_mode()
def generate(
    model,
    input_ids: torch.Tensor,
    max_new_tokens: int,
    params: SamplingParams = SamplingParams(),
    generator: torch.Generator | None = None,
    eos_token_id: int | None = None,
    sync: Callable[[], None] | None = None,
) -> Generation:
    """Prefill `input_ids` (B, S), then decode up to `max_new_tokens` (first token included).

    Stops early when every row has emitted `eos_token_id`; `sync` runs after each step, inside its timing.
    """
    if max_new_tokens < 1:
        raise ValueError("max_new_tokens must be at least 1")
    cache = new_cache(model)
    t0 = time.perf_counter()
    first = next_token(prefill(model, input_ids, cache), params, generator)
    if sync:
        sync()
    prefill_s = time.perf_counter() - t0
    steps = list(iter_tokens(model, cache, first, max_new_tokens - 1, params, generator, eos_token_id, sync))
    return Generation(torch.cat([first, *(tok for tok, _ in steps)], dim=1), prefill_s, [dt for _, dt in steps])


@torch.inference_mode()
def hf_generate(model, input_ids: torch.Tensor, max_new_tokens: int, **kw) -> torch.Tensor:
    """The peer: HF `generate` with the settings of our loop, greedy unless kw says otherwise.

    Same inference mode as `generate` here (HF's own decorator is no_grad). Exactly `max_new_tokens` new
    tokens with no EOS handling, as `generate` with eos_token_id None: eos_token_id None drops HF's EOS
    stopping check, where min_new_tokens would add an EOS-masking step to every token.
    """
    kw.setdefault("do_sample", False)
    kw.setdefault("eos_token_id", None)
    out = model.generate(
        input_ids,
        attention_mask=torch.ones_like(input_ids),
        max_new_tokens=max_new_tokens,
        pad_token_id=model.config.eos_token_id if model.config.pad_token_id is None else model.config.pad_token_id,
        **kw,
    )
    return out[:, input_ids.shape[1] :]


def stream_text(model, tokenizer, prompt: str, max_new_tokens: int = 64, params: SamplingParams = SamplingParams(),
                seed: int = 0) -> Iterator[str]:
    """Yield the continuation's text, one piece per decoded token; a piece is "" while a multi-byte
    character is still incomplete. Stops at end-of-text."""
    if tokenizer is None:
        raise ValueError("this model has no tokenizer (random weights): text generation needs a trained model")
    device = next(model.parameters()).device
    ids = tokenizer(prompt, return_tensors="pt", add_special_tokens=False)["input_ids"].to(device)
    if ids.shape[1] == 0:
        raise ValueError("the prompt is empty")
    g = torch.Generator(device=device).manual_seed(seed)
    eos = tokenizer.eos_token_id
    cache = new_cache(model)
    first = next_token(prefill(model, ids, cache), params, g)
    tokens = itertools.chain([first], (t for t, _ in iter_tokens(model, cache, first, max_new_tokens - 1, params, g)))
    new: list[int] = []
    shown = ""
    for tok in tokens:
        if int(tok) == eos:
            return
        new.append(int(tok))
        text = tokenizer.decode(new)
        if text.endswith("\ufffd"):  # half a UTF-8 character: hold it back, one piece per token still
            yield ""
        else:
            yield text[len(shown):]
            shown = text
