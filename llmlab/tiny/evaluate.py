"""Measure the built-in pair: held-out loss, a unigram baseline, greedy agreement, decode ms/token.

- Held-out loss: mean next-token cross-entropy (nats) over non-overlapping windows of held-out
  documents the models never saw; perplexity = exp(loss).
- Unigram baseline: the train set's token frequencies (add-one smoothed) scored on the same tokens.
- Greedy agreement: along the target's own greedy continuation of held-out prompts, the fraction of
  positions where the draft's argmax equals the target's argmax. With drafts of k tokens accepted
  while they agree, this is the per-token acceptance rate alpha of greedy speculative decoding.
- Decode ms/token: HF `generate` (greedy, batch 1, KV cache), (median t(n + 1 new) - median t(1 new)) / n,
  so the prefill is not counted; repeats after a warm-up, target and draft alternating.

References:
- Leviathan et al. 2023, speculative decoding, expected tokens per step (1 - a^(k+1)) / (1 - a):
  https://arxiv.org/abs/2211.17192
- https://huggingface.co/docs/transformers/main_classes/text_generation
"""

from __future__ import annotations

import math
import os
import statistics
import time


def heldout_loss(model, ids, seq_len: int = 256, max_tokens: int = 32_768, batch_size: int = 8) -> float:
    """Mean cross-entropy in nats per token over the first max_tokens held-out tokens."""
    import torch
    import torch.nn.functional as F

    n_win = max(1, min(len(ids) - 1, max_tokens) // seq_len)
    windows = ids[: n_win * seq_len + 1]
    total, count = 0.0, 0
    with torch.no_grad():
        for start in range(0, n_win, batch_size):
            rows = range(start, min(n_win, start + batch_size))
            x = torch.stack([windows[r * seq_len : (r + 1) * seq_len] for r in rows])  # (B, T)
            y = torch.stack([windows[r * seq_len + 1 : (r + 1) * seq_len + 1] for r in rows])
            logits = model(input_ids=x).logits  # (B, T, V)
            total += F.cross_entropy(logits.flatten(0, 1).float(), y.flatten(), reduction="sum").item()
            count += y.numel()
    return total / count


def unigram_loss(train_ids, heldout_ids, vocab_size: int, seq_len: int = 256, max_tokens: int = 32_768) -> float:
    """Cross-entropy of add-one-smoothed train token frequencies on the same held-out targets."""
    import torch

    counts = torch.bincount(train_ids, minlength=vocab_size).double() + 1.0
    logp = (counts / counts.sum()).log()
    n_win = max(1, min(len(heldout_ids) - 1, max_tokens) // seq_len)
    targets = heldout_ids[1 : n_win * seq_len + 1]
    return -logp[targets].mean().item()


def heldout_prompts(heldout_ids, n: int = 16, prompt_len: int = 32, eot_id: int = 0):
    """n prompts of prompt_len tokens, evenly spaced through the held-out stream: (n, prompt_len).
    A window that contains end-of-text is moved forward to start after it (prompts stay in one document)."""
    import torch

    span = len(heldout_ids) - prompt_len * 4
    out = []
    for i in range(n):
        s = i * span // n
        w = heldout_ids[s : s + prompt_len]
        hits = (w == eot_id).nonzero()
        if len(hits):
            s += int(hits[-1]) + 1
            w = heldout_ids[s : s + prompt_len]
        out.append(w)
    return torch.stack(out)


def greedy_continue(model, prompts, new_tokens: int):
    """Greedy decoding with a KV cache, no stopping at end-of-text: (B, P) -> (B, P + new_tokens)."""
    import torch

    seq = prompts
    with torch.no_grad():
        out = model(input_ids=prompts, use_cache=True)
        for _ in range(new_tokens):
            nxt = out.logits[:, -1].argmax(-1, keepdim=True)  # (B, 1)
            seq = torch.cat([seq, nxt], dim=1)
            out = model(input_ids=nxt, cache=out.cache, use_cache=True)
    return seq


def greedy_agreement(target, draft, prompts, new_tokens: int = 32) -> dict:
    """Draft argmax == target argmax at each position of the target's greedy continuation."""
    import torch

    seq = greedy_continue(target, prompts, new_tokens)  # (B, P + N)
    p = prompts.shape[1]
    with torch.no_grad():
        t_arg = target(input_ids=seq[:, :-1]).logits[:, p - 1 :].argmax(-1)  # (B, N): predicts seq[:, p:]
        d_arg = draft(input_ids=seq[:, :-1]).logits[:, p - 1 :].argmax(-1)
    agree = (t_arg == d_arg).float()
    return {
        "agreement": agree.mean().item(),
        "positions": agree.numel(),
        "prompts": prompts.shape[0],
        "new_tokens": new_tokens,
        # teacher-forced target argmax vs. its own KV-cached greedy tokens: ~1.0 (float ties aside)
        "target_self_consistency": (t_arg == seq[:, p:]).float().mean().item(),
    }


def _generate_ms(model, prompt, n: int) -> float:
    import torch

    t0 = time.perf_counter_ns()
    with torch.no_grad():
        model.generate(prompt, max_new_tokens=n, min_new_tokens=n, do_sample=False)
    return (time.perf_counter_ns() - t0) / 1e6


def decode_ms_per_token(models: dict, prompt, new_tokens: int = 128, repeats: int = 9) -> dict:
    """HF generate, greedy, batch 1: per-token decode time with the prefill subtracted (ms), for
    each named model: (median t(n + 1 new) - median t(1 new)) / n. Repeats alternate between the
    models, so a busy machine slows them alike; min/max are those of the per-repeat estimates."""
    long: dict[str, list[float]] = {name: [] for name in models}
    short: dict[str, list[float]] = {name: [] for name in models}
    for model in models.values():
        _generate_ms(model, prompt, 8)  # warm-up
    for _ in range(repeats):
        for name, model in models.items():
            long[name].append(_generate_ms(model, prompt, new_tokens + 1))
            short[name].append(_generate_ms(model, prompt, 1))
    out = {}
    for name in models:
        each = [(a - b) / new_tokens for a, b in zip(long[name], short[name], strict=True)]
        out[name] = {"median_ms": (statistics.median(long[name]) - statistics.median(short[name])) / new_tokens,
                     "min_ms": min(each), "max_ms": max(each), "new_tokens": new_tokens, "repeats": repeats}
    return out


def sample_continuations(model, tokenizer, prompts: list[str], new_tokens: int = 40) -> list[str]:
    import torch

    out = []
    for text in prompts:
        ids = torch.tensor([tokenizer(text, add_special_tokens=False)["input_ids"]])
        seq = greedy_continue(model, ids, new_tokens)
        out.append(tokenizer.decode(seq[0, ids.shape[1] :].tolist()))
    return out


def expected_speedup(alpha: float, c: float, k: int = 4) -> float:
    """Leviathan et al. eq. 1: (1 - a^(k+1)) / ((1 - a)(k c + 1))."""
    if alpha >= 1.0:
        return (k + 1) / (k * c + 1)
    return (1 - alpha ** (k + 1)) / ((1 - alpha) * (k * c + 1))


SAMPLE_PROMPTS = ("The for statement", "def __init__(self", "Return the number of", "import os\n")


def evaluate_pair(target, draft, tokenizer, train_ids, heldout_ids, eval_tokens: int = 32_768,
                  agreement_prompts: int = 32, timing: bool = True) -> dict:
    """Every number of the model card, measured."""
    import torch

    eot = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    vocab = target.config.vocab_size
    m: dict = {}
    m["loss_target"] = heldout_loss(target, heldout_ids, max_tokens=eval_tokens)
    m["loss_draft"] = heldout_loss(draft, heldout_ids, max_tokens=eval_tokens)
    m["loss_unigram"] = unigram_loss(train_ids, heldout_ids, vocab, max_tokens=eval_tokens)
    for k in ("target", "draft", "unigram"):
        m[f"ppl_{k}"] = math.exp(m[f"loss_{k}"])
    m["eval_tokens"] = min(len(heldout_ids) - 1, eval_tokens) // 256 * 256
    prompts = heldout_prompts(heldout_ids, n=agreement_prompts, eot_id=eot)
    m["agreement"] = greedy_agreement(target, draft, prompts)
    m["params_target"] = sum(p.numel() for p in target.parameters())
    m["params_draft"] = sum(p.numel() for p in draft.parameters())
    if timing:
        prompt = prompts[:1]
        timing = decode_ms_per_token({"target": target, "draft": draft}, prompt)
        m["decode_target"], m["decode_draft"] = timing["target"], timing["draft"]
        m["c_ratio"] = m["decode_draft"]["median_ms"] / m["decode_target"]["median_ms"]
        m["expected_speedup_k4"] = expected_speedup(m["agreement"]["agreement"], m["c_ratio"], 4)
        m["torch_threads"] = torch.get_num_threads()
        m["load_average_1m"] = os.getloadavg()[0]  # other jobs on the machine inflate both timings
    m["samples"] = {
        p: {"tiny": t, "tiny-draft": d}
        for p, t, d in zip(SAMPLE_PROMPTS, sample_continuations(target, tokenizer, list(SAMPLE_PROMPTS)),
                           sample_continuations(draft, tokenizer, list(SAMPLE_PROMPTS)), strict=True)
    }
    return m
