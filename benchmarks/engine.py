"""Benchmark: the serving engine's continuous batching against itself one request at a time and
against HF `generate` with static batches, each side at its best batch size.

The engine's performance goal, on the built-in `tiny`, 32 requests of 64 prompt and 64 output tokens
(EOS ignored, like vLLM's --ignore-eos), greedy, all arriving at once, same run, output tokens/s:
- the engine at its best max_num_seqs >= 3x the engine at max_num_seqs 1;
- the engine at its best >= 1.5x HF `generate` at its best static batch. Both sides are swept in the
  same run (--engine-seqs, --hf-batches: 8, 16, 32 by default; 32 = every request in one batch), the
  best of each side is the one with the highest median tokens/s, and the ratio is the median of the
  per-round ratios of those two. All prompts have 64 tokens, so HF's batches need no padding.
`make bench-engine` (= `python -m benchmarks.engine`) prints the ratios. The same script runs
unchanged on a GPU (--device cuda).

Napkin: a step of tiny (6 layers, width 256) on a CPU costs about the same for 1 row as for 32
(overhead and weight reads dominate, the matmuls are tiny), so batching 32 decodes should give
close to 32x in tokens per step; the per-sequence attention and the Python scheduler are what
eat into that. HF's batch of B gets at most B x over batch 1, minus generate's bookkeeping.

The engine is checked exact before timing (logits vs HF at every computed position within the
dtype's bar, greedy tokens HF's argmax). The prefix cache is off in the timed runs (random prompts
share no prefix anyway; off means a repeat round cannot hit blocks cached by the previous one).
Rounds interleave the contenders, order alternating.

Threads: on a machine shared with other jobs, pass --threads 1. With torch's two OpenMP threads
fighting other processes for two busy cores (load ~15), every contender slowed by about 10x and
the engine measured 13.6 output tokens/s instead of ~240; one thread each is the fair setting there.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from llmlab.core.device import resolve_device
from llmlab.core.models import load
from llmlab.inference.decode import hf_generate
from llmlab.serving.engine.llm_engine import Engine, EngineConfig, check_exact
from llmlab.serving.engine.scheduler import RequestParams

GOALS = {"engine at its best / engine at max_num_seqs 1": 3.0, "engine at its best / HF generate at its best": 1.5}


def run_engine(model, prompts: list[list[int]], new_tokens: int, max_num_seqs: int, sync) -> float:
    """Output tokens/s of one engine run over all prompts (a fresh engine: empty KV pool)."""
    eng = Engine(model, EngineConfig(max_num_seqs=max_num_seqs, enable_prefix_cache=False))
    t0 = time.perf_counter()
    seqs = eng.generate(prompts, RequestParams(max_tokens=new_tokens, ignore_eos=True))
    sync()
    dt = time.perf_counter() - t0
    n = sum(len(s.output_ids) for s in seqs)
    assert n == len(prompts) * new_tokens
    return n / dt


def run_hf(model, prompts: list[list[int]], new_tokens: int, batch: int, pad_id: int, sync) -> float:
    """Output tokens/s of HF generate over static batches of `batch` left-padded prompts."""
    dev = next(model.parameters()).device
    n, t0 = 0, time.perf_counter()
    for i in range(0, len(prompts), batch):
        group = prompts[i : i + batch]
        width = max(map(len, group))
        ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in group], device=dev)  # (b, width) left-padded
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in group], device=dev)
        with torch.inference_mode():
            out = (
                hf_generate(model, ids, new_tokens)
                if all(len(p) == width for p in group)
                else model.generate(
                    ids,
                    attention_mask=mask,
                    max_new_tokens=new_tokens,
                    min_new_tokens=new_tokens,
                    do_sample=False,
                    pad_token_id=pad_id,
                )[:, width:]
            )
        n += out.numel()
    sync()
    return n / (time.perf_counter() - t0)


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def best(rates: dict[str, list[float]], names: list[str]) -> str:
    """The contender among `names` with the highest median tokens/s."""
    return max(names, key=lambda k: statistics.median(rates[k]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu", help="cpu | cuda | auto (default cpu: the goal is stated on a CPU)")
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--hf-batches", default="8,16,32", help="HF generate's static batch sizes swept")
    ap.add_argument("--engine-seqs", default="8,16,32", help="the engine's max_num_seqs swept")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    dev = resolve_device(args.device, None)
    lm = load("tiny", dev)
    model = lm.model
    sync = torch.cuda.synchronize if dev.is_cuda else (lambda: None)
    g = torch.Generator().manual_seed(0)
    vocab = model.config.vocab_size
    prompts = [torch.randint(1, vocab, (args.prompt_len,), generator=g).tolist() for _ in range(args.requests)]

    exact = check_exact(Engine(model, EngineConfig(max_num_batched_tokens=48)), prompts[:6], max_new_tokens=8)
    print(f"All results match (logits within {exact['atol']:g} of HF at {exact['positions']} positions, "
          f"{exact['decode_positions']} of them decodes, max |diff| {exact['max_abs_logit_diff']:.1e}; greedy tokens "
          "HF's argmax). Starting benchmarks.")

    pad = model.config.pad_token_id if model.config.pad_token_id is not None else 0
    engines = {f"engine at max_num_seqs {n}": n for n in _ints(args.engine_seqs)}
    hfs = {f"HF generate (static batches of {b})": b for b in _ints(args.hf_batches)}
    contenders = {k: (lambda n=n: run_engine(model, prompts, args.new_tokens, n, sync)) for k, n in engines.items()}
    contenders["engine at max_num_seqs 1"] = lambda: run_engine(model, prompts, args.new_tokens, 1, sync)
    contenders |= {k: (lambda b=b: run_hf(model, prompts, args.new_tokens, b, pad, sync)) for k, b in hfs.items()}
    run_engine(model, prompts[:4], 8, 64, sync)  # warm-up
    rates: dict[str, list[float]] = {k: [] for k in contenders}
    for r in range(args.rounds):
        for k in (list(contenders) if r % 2 == 0 else list(reversed(contenders))):
            rates[k].append(contenders[k]())
            print(f"  round {r + 1}: {k}: {rates[k][-1]:.1f} output tokens/s", flush=True)
    eng, hf = best(rates, list(engines)), best(rates, list(hfs))
    per_round = lambda a, b: [x / y for x, y in zip(rates[a], rates[b], strict=True)]  # noqa: E731
    ratios = {"engine at its best / engine at max_num_seqs 1": per_round(eng, "engine at max_num_seqs 1"),
              "engine at its best / HF generate at its best": per_round(eng, hf)}
    print(
        f"built-in tiny on {dev.spec}, {args.requests} requests x {args.prompt_len} prompt + {args.new_tokens} output "
        f"tokens "
        f"(greedy, EOS ignored), {args.rounds} rounds, torch threads {torch.get_num_threads()}"
    )
    for k, v in rates.items():
        mark = "  <- best" if k in (eng, hf) else ""
        print(f"  {k:40s} {statistics.median(v):8.1f} output tokens/s (min {min(v):.1f}, max {max(v):.1f}){mark}")
    for k, v in ratios.items():
        med = statistics.median(v)
        verdict = "met" if med >= GOALS[k] else "NOT met"
        print(f"  {k:48s} {med:5.2f}x (rounds: {', '.join(f'{x:.2f}' for x in v)}); goal >= {GOALS[k]}x: {verdict}")
    print(f"  best: {eng}; {hf}")


if __name__ == "__main__":
    main()
