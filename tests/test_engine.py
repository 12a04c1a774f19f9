"""The serving engine: exact against HF's forward and decode.generate, with batching, chunked
prefill, prefix-cache hits and preemption; the scheduler's step records show what ran."""

from __future__ import annotations

import pytest
import torch

from llmlab.core.models import load
from llmlab.inference.decode import generate
from llmlab.serving.block_manager import BlockManager
from llmlab.serving.engine import Engine, EngineConfig, check_exact, hf_logits
from llmlab.serving.scheduler import RequestParams

ATOL = 1e-4


@pytest.fixture(scope="module")
def model():
    return load("tiny", "cpu").model


def prompts_of(lengths, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(1, 4096, (n,), generator=g).tolist() for n in lengths]


def max_diff(model, prompts, got):
    return max(float((g - hf_logits(model, p)[len(p) - g.shape[0]:]).abs().max()) for p, g in zip(prompts, got, strict=True))


def reference(model, prompt, n):
    return generate(model, torch.tensor([prompt]), n).tokens[0].tolist()


def test_logits_equal_hf_for_a_ragged_batch(model):
    prompts = prompts_of([3, 17, 40, 16])
    eng = Engine(model, EngineConfig())
    got = eng.prefill_logits(prompts)
    assert [g.shape[0] for g in got] == [3, 17, 40, 16]
    assert max_diff(model, prompts, got) <= ATOL
    first = eng.steps[0]
    assert first.num_seqs == 4 and first.num_prefill_tokens == 76  # one ragged batch of 3 + 17 + 40 + 16 tokens, no padding


def test_chunked_prefill_is_exact(model):
    prompts = prompts_of([40, 23], seed=1)
    eng = Engine(model, EngineConfig(max_num_batched_tokens=16))
    got = eng.prefill_logits(prompts)
    assert max_diff(model, prompts, got) <= ATOL
    assert all(r.num_prefill_tokens <= 16 for r in eng.steps)
    assert len(eng.steps) >= 4  # 63 tokens in chunks of at most 16


def test_prefix_cache_hits_are_counted_and_exact(model):
    (a,) = prompts_of([48], seed=2)
    b = a[:40] + [11, 12, 13]
    eng = Engine(model, EngineConfig())
    eng.prefill_logits([a])
    assert eng.scheduler.prefix_hits == 0
    (got,) = eng.prefill_logits([b])
    assert eng.scheduler.prefix_hits == 32  # two full blocks of 16 shared
    assert got.shape[0] == len(b) - 32
    assert max_diff(model, [b], [got]) <= ATOL
    off = Engine(model, EngineConfig(enable_prefix_cache=False))
    off.prefill_logits([a])
    off.prefill_logits([b])
    assert off.scheduler.prefix_hits == 0


def test_greedy_equals_decode_generate(model):
    prompts = prompts_of([5, 30, 12], seed=3)
    eng = Engine(model, EngineConfig())
    seqs = eng.generate(prompts, RequestParams(max_tokens=12, ignore_eos=True))
    for p, s in zip(prompts, seqs, strict=True):
        assert s.output_ids == reference(model, p, 12)
        assert s.finish_reason == "length" and len(s.token_ns) == 12
        assert s.arrival_ns <= s.scheduled_ns <= s.first_chunk_ns < s.first_token_ns <= s.finished_ns
    assert max(r.num_decodes for r in eng.steps) == 3  # the three decoded together


def test_preemption_when_blocks_run_out_keeps_output_exact(model):
    prompts = prompts_of([12, 12, 12], seed=4)
    eng = Engine(model, EngineConfig(num_blocks=6))  # each needs 3 blocks by the end: 9 > 6
    seqs = eng.generate(prompts, RequestParams(max_tokens=24, ignore_eos=True))
    assert eng.scheduler.num_preemptions > 0
    assert any(s.num_preemptions for s in seqs)
    for p, s in zip(prompts, seqs, strict=True):
        assert s.output_ids == reference(model, p, 24)
    assert eng.blocks.num_used == 0


def test_continuous_batching_refills_the_batch(model):
    prompts = prompts_of([8] * 6, seed=5)
    eng = Engine(model, EngineConfig(max_num_seqs=4))
    params = [RequestParams(max_tokens=n, ignore_eos=True) for n in (3, 10, 10, 10, 6, 6)]
    eng.generate(prompts, params)
    assert max(r.num_seqs for r in eng.steps) == 4
    assert any(r.num_decodes > 0 and r.num_prefill_tokens > 0 for r in eng.steps)  # a newcomer prefilled beside running decodes


def test_check_exact_and_seeded_sampling(model):
    eng = Engine(model, EngineConfig(max_num_batched_tokens=24, num_blocks=16))
    report = check_exact(eng, prompts_of([9, 33], seed=6), max_new_tokens=4)
    assert report["max_abs_logit_diff"] <= ATOL
    (p,) = prompts_of([10], seed=7)
    run = lambda seed: eng.generate([p], RequestParams(max_tokens=16, temperature=1.0, top_p=0.9, seed=seed, ignore_eos=True))[0].output_ids  # noqa: E731
    assert run(1) == run(1)
    assert run(1) != run(2)


def test_requests_that_cannot_fit_are_refused(model):
    eng = Engine(model, EngineConfig(num_blocks=4))  # 64-token context
    with pytest.raises(ValueError, match="context"):
        eng.add_request(list(range(1, 70)))
    with pytest.raises(ValueError, match="max_tokens"):
        eng.add_request(list(range(1, 10)), RequestParams(max_tokens=60))
    with pytest.raises(ValueError):
        RequestParams(temperature=-1)


def test_block_manager_prefix_chain():
    bm = BlockManager(num_blocks=4, block_size=2)
    table: list[int] = []
    bm.grow(table, 5)
    assert len(table) == 3 and bm.num_free == 1
    assert bm.register_full(table, [1, 2, 3, 4, 5], 5, 0) == 2
    bm.release(table)
    assert bm.num_used == 0
    t2: list[int] = []
    assert bm.match_prefix(t2, [1, 2, 3, 4, 9]) == 4  # both full blocks hit
    t3: list[int] = []
    assert bm.match_prefix(t3, [9, 2, 3, 4, 9]) == 0  # same second block after another parent: no hit
