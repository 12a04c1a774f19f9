"""Measure the built-in pair: held-out loss, a unigram baseline, greedy agreement, decode ms/token.

- Held-out loss: mean next-token cross-entropy (nats) over non-overlapping windows of held-out
  documents the models never saw; perplexity = exp(loss).
- Unigram baseline: the train set's token frequencies (add-one smoothed) scored on the same tokens.
- Greedy agreement: along the target's own greedy continuation of held-out prompts, the fraction of
  positions where the draft's argmax equals the target's argmax. With drafts of k tokens accepted
  while they agree, this is the per-token acceptance rate alpha of greedy speculative decoding.
- Decode ms/token: HF `generate` (greedy, batch 1, KV cache), (median t(n + 1 new) - median t(1 new)) / n,
  so the prefill is not counted; repeats after a warm-up, target and draft alternating.
- Copying: greedy next-token accuracy on a 64-token passage read twice in a row, on the second
  reading: held-out passages, and random token ids (the induction-head test of Olsson et al.).
- Loops: whether greedy text on stated prompts falls into a loop of period <= 8 tokens within 64.

References:
- Leviathan et al. 2023, speculative decoding, expected tokens per step (1 - a^(k+1)) / (1 - a):
  https://arxiv.org/abs/2211.17192
- https://huggingface.co/docs/transformers/main_classes/text_generation
- Olsson et al. 2022, In-context Learning and Induction Heads (repeated random tokens):
  https://transformer-circuits.pub/2022/in-context-learning-and-induction-heads/index.html
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


def _step_ms(model, prompt, n: int) -> list[float]:
    """A plain KV-cached greedy loop, batch 1: prefill prompt, then n one-token forwards; each step's ms.
    This is the step speculative decoding repeats (a draft step, a target step), without the per-token
    bookkeeping of HF generate (logits processors, stopping criteria), which on models this small is a
    large share of a step and the same for both models, so it would pull their ratio toward 1."""
    import inspect

    import torch
    from transformers import DynamicCache

    name = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"  # HF 5 renamed it
    kw = {name: DynamicCache(config=model.config), "use_cache": True, "logits_to_keep": 1}
    times = []
    with torch.inference_mode():
        tok = model(input_ids=prompt, **kw).logits[:, -1:].argmax(-1)
        for _ in range(n):
            t0 = time.perf_counter_ns()
            tok = model(input_ids=tok, **kw).logits[:, -1:].argmax(-1)
            times.append((time.perf_counter_ns() - t0) / 1e6)
    return times


def decode_ms_per_token(models: dict, prompt, new_tokens: int = 128, repeats: int = 9) -> dict:
    """Per-token decode time (ms) of each named model in a plain KV-cached greedy loop (_step_ms), batch 1:
    the median step of each repeat, then the median over repeats; min/max are those of the per-repeat
    medians. Repeats alternate between the models, so a busy machine slows them alike."""
    each: dict[str, list[float]] = {name: [] for name in models}
    for model in models.values():
        _step_ms(model, prompt, 8)  # warm-up
    for _ in range(repeats):
        for name, model in models.items():
            each[name].append(statistics.median(_step_ms(model, prompt, new_tokens)))
    return {name: {"median_ms": statistics.median(v), "min_ms": min(v), "max_ms": max(v), "new_tokens": new_tokens,
                   "repeats": repeats, "loop": "KV-cached greedy forward, batch 1"} for name, v in each.items()}


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
LOOP_PROMPTS = ("The list method", *SAMPLE_PROMPTS)  # the first is what a newcomer runs first
COPY_TOKENS = 64  # passage length of the copying tests

# The pair's goals: metric (a dotted path into the metrics dict) -> (direction, bound).
GOALS = {
    "copy_heldout": (">=", 0.80),  # second reading of a held-out passage
    "copy_random": (">=", 0.80),  # second reading of random ids
    "loss_target": ("<=", 4.8),
    "draft_gap": ("<=", 0.15),  # loss_draft - loss_target
    "agreement.agreement": (">=", 0.75),  # greedy agreement of the pair
    "c_ratio": ("<=", 0.25),
    "loops": ("<=", 0),  # prompts of LOOP_PROMPTS whose greedy text loops
    "size_mb": ("<=", 40.0),  # both folders on disk
    "load_seconds": ("<", 3.0),  # both models and the tokenizer from disk
}


def repeat_accuracy(model, passages) -> dict:
    """Greedy next-token accuracy on passages (B, n), each read twice in a row: on the first and the
    second reading. The position that predicts the repeat's first token has no cue yet: left out."""
    import torch

    n = passages.shape[1]
    x = torch.cat([passages, passages], dim=1)  # (B, 2n)
    with torch.no_grad():
        hit = (model(input_ids=x).logits[:, :-1].argmax(-1) == x[:, 1:]).float()  # hit[:, i]: i predicts x[:, i + 1]
    return {"passages": passages.shape[0], "tokens": n, "first_read": hit[:, : n - 1].mean().item(),
            "second_read": hit[:, n:].mean().item()}


def random_passages(vocab_size: int, n: int = 16, length: int = COPY_TOKENS, seed: int = 0):
    """n sequences of random ids 1..vocab_size - 1 (never end-of-text): (n, length)."""
    import torch

    return torch.randint(1, vocab_size, (n, length), generator=torch.Generator().manual_seed(seed))


def loop_period(tokens: list[int], max_period: int = 8, min_span: int = 16) -> int | None:
    """The smallest period p <= max_period such that some stretch of max(min_span, 3 p) tokens repeats
    with period p (x[i] == x[i - p] all along it), else None."""
    for p in range(1, max_period + 1):
        need, run = max(min_span, 3 * p), 0
        for i in range(p, len(tokens)):
            run = run + 1 if tokens[i] == tokens[i - p] else 0
            if run + p >= need:
                return p
    return None


def loop_check(model, tokenizer, prompts=LOOP_PROMPTS, new_tokens: int = 64) -> list[dict]:
    """Greedy new_tokens on each prompt: the loop period found (None: no loop) and the text."""
    import torch

    rows = []
    for text in prompts:
        ids = torch.tensor([tokenizer(text, add_special_tokens=False)["input_ids"]])
        new = greedy_continue(model, ids, new_tokens)[0, ids.shape[1]:].tolist()
        rows.append({"prompt": text, "period": loop_period(new), "text": tokenizer.decode(new)})
    return rows


def goal_rows(m: dict) -> list[dict]:
    """One row per goal of GOALS that m measured: the value, the bound and whether it holds."""
    ops = {">=": lambda a, b: a >= b, "<=": lambda a, b: a <= b, "<": lambda a, b: a < b}
    rows = []
    for key, (op, bound) in GOALS.items():
        value = m
        for part in key.split("."):
            value = value.get(part) if isinstance(value, dict) else None
        if value is not None:
            rows.append({"metric": key, "value": value, "goal": f"{op} {bound}", "held": ops[op](value, bound)})
    return rows


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
    m["draft_gap"] = m["loss_draft"] - m["loss_target"]
    m["copy"] = {name: repeat_accuracy(model, heldout_prompts(heldout_ids, n=16, prompt_len=COPY_TOKENS, eot_id=eot))
                 for name, model in (("target", target), ("draft", draft))}
    m["copy_random_detail"] = {name: repeat_accuracy(model, random_passages(vocab))
                               for name, model in (("target", target), ("draft", draft))}
    m["copy_heldout"] = m["copy"]["target"]["second_read"]
    m["copy_random"] = m["copy_random_detail"]["target"]["second_read"]
    m["loop_check"] = loop_check(target, tokenizer)
    m["loops"] = sum(r["period"] is not None for r in m["loop_check"])
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
