"""Parts 2-5 of the serving lab: static vs continuous batching, KV capacity, prefix reuse, chunked prefill."""

from __future__ import annotations

import time

import numpy as np

from llmlab.labs.serving.config import BLOCK, GPU_GB, Config
from llmlab.labs.serving.drivers import make_engine, open_loop, random_prompts, records, reply_params


def part_static(res, cfg: Config, model, vocab: int, rng) -> None:
    """Poisson arrivals at about 80% of the engine's batch-of-B capacity; static batches of B (dynamic fill,
    each max wait of the sweep) vs continuous. The request count is a multiple of B."""
    from llmlab.loadgen.client import calculate_metrics

    b = cfg.static_batch()
    n = max(b, cfg.arrivals // b * b)
    outs = [cfg.short_long[i % 2] for i in range(n)]
    prompts = random_prompts(n, cfg.prompt_len, vocab, rng)
    eng = make_engine(model, max_num_seqs=b, enable_prefix_cache=False)
    t = time.perf_counter()
    eng.generate(prompts[:b], reply_params(int(np.mean(outs))))  # calibration: one batch of B at the mean length
    rate = 0.8 * b / (time.perf_counter() - t)  # requests/s at ~80% of capacity
    gaps = list(np.random.default_rng(cfg.seed).exponential(1 / rate, n))
    rows = []
    for mode, sb, wait in [("static", b, w) for w in cfg.static_waits] + [("continuous", 0, 0.0)]:
        eng = make_engine(model, max_num_seqs=b, enable_prefix_cache=False)
        seqs, wall, wasted, batches = open_loop(eng, prompts, outs, gaps, static_batch=sb, max_wait_s=wait / rate)
        m = calculate_metrics(records(seqs), wall)
        rows.append(dict(mode=mode, batch=b, requests=n, rate_per_s=rate, max_wait_gaps=wait if sb else None,
                         max_wait_ms=1e3 * wait / rate if sb else None, output_tokens_per_s=m.output_throughput,
                         p50_ttft_ms=m.p50_ttft_ms, p99_ttft_ms=m.p99_ttft_ms, steps=len(eng.steps),
                         batches=len(batches),
                         mean_batch=float(np.mean([len(g) for g in batches])) if batches else None, wasted_slots=wasted,
                         wasted_from_lengths=sum(len(g) * max(g) - sum(g) for g in batches),
                         slot_use=sum(map(sum, batches)) / (sum(map(sum, batches)) + wasted) if batches else None))
    res.add_table("static_vs_continuous", rows)


def part_capacity(res, cfg: Config, model, vocab: int, rng) -> None:
    """Pools of kv_blocks x each multiple, the weights fixed; 3 x formula + 2 conversations each."""
    p, o = cfg.conversation
    rows = []
    for mult in cfg.kv_pool_multiples:
        blocks = cfg.kv_blocks * mult
        eng = make_engine(model, num_blocks=blocks, max_num_seqs=256, max_num_batched_tokens=max(512, p + 1),
                      enable_prefix_cache=False)
        per_seq = -(-(p + o) // BLOCK)  # blocks one conversation holds by its end
        at_admission = -(-p // BLOCK)  # blocks it holds when admitted (its prompt)
        formula = blocks // per_seq
        n = 3 * formula + 2
        eng.generate(random_prompts(n, p, vocab, rng), reply_params(o))
        running = [s.num_seqs for s in eng.steps if s.num_prefill_tokens == 0]
        rows.append(dict(kv_blocks=blocks, block_size=BLOCK, tokens_per_seq=p + o, blocks_per_seq=per_seq,
                         formula_max_seqs=formula, admission_bound=blocks // at_admission, max_num_seqs=256,
                         conversations=n,
                         peak_running=max(running) if running else 0,
                         median_running=float(np.median(running)) if running else 0.0,
                         preemptions=eng.scheduler.num_preemptions))
    res.add_table("capacity", rows)


def capacity_formula_rows(context: int = 4096) -> list[dict]:
    """Conversations of `context` tokens that fit beside BF16 weights on one 80 GB GPU (formula)."""
    from llmlab.core.flops import kv_bytes_per_token, param_count
    from llmlab.core.models import arch_config

    rows = []
    for name in ("llama-2-7b", "llama-3-8b"):
        conf = arch_config(name)
        w, kv = 2 * param_count(conf), kv_bytes_per_token(conf, 2)
        free = GPU_GB * 1e9 - w
        rows.append(dict(model=name, kv_heads=conf.num_key_value_heads, weights_GB=w / 1e9, kv_KiB_per_token=kv / 1024,
                         context=context, conversations=int(free // (kv * context))))
    return rows


def part_prefix(res, cfg: Config, model, vocab: int, rng) -> None:
    """N requests = a shared system prompt of L tokens + 16 own tokens, one at a time; cache off, then on."""
    from llmlab.loadgen.client import calculate_metrics

    rows = []
    ctx = getattr(model.config, "max_position_embeddings", 8192)
    for L in [x for x in cfg.prefix_lens if x + 32 < ctx]:
        shared = random_prompts(1, L, vocab, rng)[0]
        prompts = [shared + tail for tail in random_prompts(cfg.prefix_requests, 16, vocab, rng)]
        for cache in (False, True):
            eng = make_engine(model, enable_prefix_cache=cache, max_num_batched_tokens=max(512, L + 32))
            eng.generate([random_prompts(1, 16, vocab, rng)[0]], reply_params(2))  # warm-up on another prompt
            eng.reset_stats()
            seqs = [eng.generate([p], reply_params(4))[0] for p in prompts]
            m = calculate_metrics(records(seqs), 1.0)
            computed = sum(s.num_prefill_tokens for s in eng.steps)
            rows.append(dict(prefix_tokens=L, prompt_tokens=L + 16, requests=len(prompts), prefix_cache=cache,
                             p50_ttft_ms=m.p50_ttft_ms, hit_tokens=eng.scheduler.prefix_hits,
                             query_tokens=eng.scheduler.prefix_queries, prefill_tokens_computed=computed,
                             expected_hits=(len(prompts) - 1) * (L // eng.cfg.block_size) * eng.cfg.block_size
                             if cache else 0))
    res.add_table("prefix", rows)


def part_chunked(res, cfg: Config, model, vocab: int, rng) -> None:
    """4 decodes run; a long prompt arrives; its prefill in one step (chunking off) vs in budget-sized chunks."""
    rows = []
    long_p = min(cfg.long_prompt, getattr(model.config, "max_position_embeddings", 8192) - 8)
    for mode, budget in (("one step (chunking off)", long_p + 64), (f"chunks of {cfg.chunk_budget}", cfg.chunk_budget)):
        eng = make_engine(model, max_num_batched_tokens=budget, enable_prefix_cache=False)
        runners = [eng.add_request(p, reply_params(40 + long_p // cfg.chunk_budget)) for p in random_prompts(4, 16,
                                                                                                             vocab,
                                                                                                             rng)]
        for _ in range(6):
            eng.step()
        big = eng.add_request(random_prompts(1, long_p, vocab, rng)[0], reply_params(2))
        while not big.token_ns:
            eng.step()
        window = (big.arrival_ns, big.token_ns[0])
        gaps = [(b - a) / 1e6 for r in runners for a, b in zip(r.token_ns, r.token_ns[1:], strict=False)
                if window[0] <= b <= window[1] + 1]
        before = [(b - a) / 1e6 for r in runners for a, b in zip(r.token_ns[:5], r.token_ns[1:6], strict=False)]
        rows.append(dict(mode=mode, budget=budget, long_prompt=long_p, running_decodes=len(runners),
                         itl_before_ms=float(np.median(before)), itl_max_during_ms=max(gaps) if gaps else float("nan"),
                         long_prompt_ttft_ms=(big.token_ns[0] - big.arrival_ns) / 1e6))
    res.add_table("chunked", rows)
