"""The serving engine: exact against HF's forward and decode.generate, with batching, chunked
prefill, prefix-cache hits and preemption; the scheduler's step records show what ran."""

from __future__ import annotations

import pytest
import torch

from llmlab.core.models import load
from llmlab.inference.decode import generate
from llmlab.inference.sampling import SamplingParams
from llmlab.serving.engine.block_manager import BlockManager
from llmlab.serving.engine.llm_engine import Engine, EngineConfig, check_exact, hf_logits
from llmlab.serving.engine.scheduler import RequestParams

ATOL = 1e-4


@pytest.fixture(scope="module")
def model():
    return load("tiny", "cpu").model


def prompts_of(lengths, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(1, 4096, (n,), generator=g).tolist() for n in lengths]


def max_diff(model, prompts, got):
    return max(
        float((g - hf_logits(model, p)[len(p) - g.shape[0] :]).abs().max()) for p, g in zip(prompts, got, strict=True)
    )


def reference(model, prompt, n):
    return generate(model, torch.tensor([prompt]), n).tokens[0].tolist()


def test_logits_equal_hf_for_a_ragged_batch(model):
    prompts = prompts_of([3, 17, 40, 16])
    eng = Engine(model, EngineConfig())
    got = eng.prefill_logits(prompts)
    assert [g.shape[0] for g in got] == [3, 17, 40, 16]
    assert max_diff(model, prompts, got) <= ATOL
    first = eng.steps[0]
    # one ragged batch of 3 + 17 + 40 + 16 tokens, no padding
    assert first.num_seqs == 4 and first.num_prefill_tokens == 76


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


def test_logprobs_per_row_are_log_softmax_of_hfs_logits_in_a_mixed_batch(model):
    """Rows asking for k = 0, 5 or nothing, greedy and sampled, batched and preempted: each asking row gets, per
    output token, the raw log-probability of that token and the top k, as HF's forward gives them."""
    prompts = prompts_of([12, 12, 12, 30], seed=8)
    hot = SamplingParams(temperature=1.7, top_k=20)
    params = [RequestParams(16, logprobs=0, ignore_eos=True),
              RequestParams(16, hot, seed=1, logprobs=5, ignore_eos=True),
              RequestParams(16, ignore_eos=True), RequestParams(16, logprobs=5, ignore_eos=True)]
    eng = Engine(model, EngineConfig(num_blocks=7))  # 9 blocks by the end: someone is preempted
    seqs = eng.generate(prompts, params)
    assert eng.scheduler.num_preemptions > 0 and seqs[2].logprobs == []
    for s, q in zip(seqs, params, strict=True):
        if q.logprobs is None:
            continue
        ref = hf_logits(model, s.token_ids[:-1])[len(s.prompt_ids) - 1 :].log_softmax(-1)  # (16, V)
        assert len(s.logprobs) == 16
        for i, (tok, (lp, top)) in enumerate(zip(s.output_ids, s.logprobs, strict=True)):
            assert abs(lp - float(ref[i, tok])) <= ATOL and len(top) == q.logprobs
            # each alternative's own log-probability, and the k largest in order (robust to near-ties)
            assert all(abs(a - float(ref[i, t])) <= ATOL for t, a in top)
            assert all(abs(a - float(b)) <= ATOL for (_, a), b in zip(top, ref[i].topk(q.logprobs).values, strict=True))


def changed_greedy(model, prompt, n, bias=(), rep=1.0, freq=0.0, pres=0.0, min_tokens=0, banned=(), stop=()):
    """Greedy over HF's forward with the request's logit changes written from their definitions, one token at a
    time: bias added; `banned` at -inf before min_tokens; a seen token's logit divided by rep if positive, else
    multiplied; each output token's logit less freq per occurrence and pres once; ends at a `stop` token."""
    ids, out = list(prompt), []
    while len(out) < n:
        row = hf_logits(model, ids)[-1].clone()
        for t, b in bias:
            row[t] += b
        if len(out) < min_tokens:
            row[list(banned)] = float("-inf")
        for t in set(ids) if rep != 1.0 else ():
            row[t] = row[t] / rep if row[t] > 0 else row[t] * rep
        for t in set(out):
            row[t] -= freq * out.count(t) + pres
        out.append(int(row.argmax()))
        ids.append(out[-1])
        if out[-1] in stop:
            break
    return out


def test_logit_bias_penalties_min_tokens_and_stop_ids_follow_their_definitions(model):
    """Each change, batched beside the others and a plain row, gives the tokens its definition gives over HF's
    forward, and each changes the greedy text (a change that did nothing would not pass)."""
    (p,) = prompts_of([10], seed=9)
    plain = reference(model, p, 16)
    t = plain[2]  # a token the plain run makes
    cases = [
        ({"logit_bias": ((t, -100.0), (plain[0], -5.0))}, {"bias": ((t, -100.0), (plain[0], -5.0))}),
        ({"repetition_penalty": 1.8}, {"rep": 1.8}),
        ({"frequency_penalty": 1.5}, {"freq": 1.5}),
        ({"presence_penalty": 2.0, "frequency_penalty": -0.5}, {"pres": 2.0, "freq": -0.5}),
        ({"stop_token_ids": frozenset({t})}, {"stop": (t,)}),
        ({"stop_token_ids": frozenset({t}), "min_tokens": 4}, {"stop": (t,), "min_tokens": 4, "banned": (0, t)}),
    ]
    eng = Engine(model, EngineConfig())
    params = [RequestParams(16, ignore_eos=True, **c) for c, _ in cases] + [RequestParams(16, ignore_eos=True)]
    *seqs, alone = eng.generate([p] * len(params), params)
    assert alone.output_ids == plain
    for s, (c, ref) in zip(seqs, cases, strict=True):
        assert s.output_ids == changed_greedy(model, p, 16, **ref) != plain, c
    assert seqs[4].finish_reason == "stop" and seqs[4].output_ids == plain[: plain.index(t) + 1]


def test_continuous_batching_refills_the_batch(model):
    prompts = prompts_of([8] * 6, seed=5)
    eng = Engine(model, EngineConfig(max_num_seqs=4))
    params = [RequestParams(max_tokens=n, ignore_eos=True) for n in (3, 10, 10, 10, 6, 6)]
    eng.generate(prompts, params)
    assert max(r.num_seqs for r in eng.steps) == 4
    # a newcomer prefilled beside running decodes
    assert any(r.num_decodes > 0 and r.num_prefill_tokens > 0 for r in eng.steps)


def test_check_exact_and_seeded_sampling(model):
    eng = Engine(model, EngineConfig(max_num_batched_tokens=24, num_blocks=16))
    report = check_exact(eng, prompts_of([9, 33], seed=6), max_new_tokens=4)
    assert report["max_abs_logit_diff"] <= ATOL
    (p,) = prompts_of([10], seed=7)
    sampled = SamplingParams(temperature=1.0, top_p=0.9)
    run = lambda seed: eng.generate([p], RequestParams(16, sampled, seed=seed, ignore_eos=True))[0].output_ids  # noqa: E731
    assert run(1) == run(1)
    assert run(1) != run(2)


def test_requests_that_cannot_fit_are_refused(model):
    eng = Engine(model, EngineConfig(num_blocks=4))  # 64-token context
    with pytest.raises(ValueError, match="context"):
        eng.add_request(list(range(1, 70)))
    with pytest.raises(ValueError, match="max_tokens"):
        eng.add_request(list(range(1, 10)), RequestParams(max_tokens=60))
    with pytest.raises(ValueError):
        SamplingParams(temperature=-1)


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


# ---------------------------------------------------------------- the exactness check itself


def test_check_exact_compares_every_computed_position_with_hf(model):
    eng = Engine(model, EngineConfig(max_num_batched_tokens=24))
    prompts = prompts_of([33, 9], seed=8)
    r = check_exact(eng, prompts, max_new_tokens=5)
    # round 1: 33 + 9 prompt positions + 2 x 4 decodes; round 2 (prompt + reply + 3) recomputes past its cached blocks
    assert r["decode_positions"] >= 2 * 2 * 4 and r["positions"] > sum(map(len, prompts)) + 8
    # a follow-up hits its first turn's full blocks: 33 + 4 computed = 2 blocks; 9 + 4 none
    assert r["prefix_hit_tokens"] == 32
    assert r["max_abs_logit_diff"] <= ATOL and r["greedy_tokens_equal"] and r["atol"] == ATOL


def _read_one_slot_past(monkeypatch):
    """Plant the bug the check must catch: decode attention reads one key past the sequence's end."""
    from llmlab.serving.engine.model_runner import ModelRunner

    orig = ModelRunner.decode_attention

    def bad(self, q, kb, vb, tables, lens, same_len):
        return orig(self, q, kb, vb, tables, lens + 1, None if same_len is None else same_len + 1)

    monkeypatch.setattr(ModelRunner, "decode_attention", bad)


def test_check_exact_catches_decode_reading_one_slot_past(model, monkeypatch):
    _read_one_slot_past(monkeypatch)
    prompts = prompts_of([40, 20], seed=9)
    r = check_exact(Engine(model, EngineConfig(max_num_batched_tokens=48)), prompts, max_new_tokens=6, strict=False)
    assert r["max_abs_logit_diff"] > 10 * ATOL  # 9.4e-3 measured: only decode positions are wrong
    with pytest.raises(AssertionError, match="differs from HF"):
        check_exact(Engine(model, EngineConfig(max_num_batched_tokens=48)), prompts, max_new_tokens=6)


def test_bf16_engine_is_checked_against_the_bf16_bar():
    from llmlab.serving.engine.llm_engine import exact_atol

    m = load("tiny", "cpu").model
    eng = Engine(m, EngineConfig(dtype="bfloat16", max_num_batched_tokens=24))  # casts the model in place
    assert next(m.parameters()).dtype == torch.bfloat16 and eng.runner.k_cache.dtype == torch.bfloat16
    r = check_exact(eng, prompts_of([20, 11], seed=10), max_new_tokens=4, strict=False)
    assert r["atol"] == exact_atol(torch.bfloat16) > ATOL and r["dtype"] == "bfloat16"
    assert ATOL < r["max_abs_logit_diff"] <= r["atol"]  # 0.06 measured: BF16 rounding, not FP32's 1e-6


# ---------------------------------------------------------------- attention backends


def test_sdpa_calls_without_a_mask_where_none_is_needed(model):
    eng = Engine(model, EngineConfig(max_num_batched_tokens=64))
    eng.generate(prompts_of([10, 10, 10], seed=11), RequestParams(max_tokens=4, ignore_eos=True))
    kinds = {k.split()[0] for k in eng.attention_backends}
    assert kinds == {"prefill", "decode"}  # same-length decodes read exactly their keys: no ragged (masked) call
    eng.generate(prompts_of([10, 30], seed=12), RequestParams(max_tokens=4, ignore_eos=True))
    assert "decode-ragged" in {k.split()[0] for k in eng.attention_backends}


def test_kv_is_expanded_where_only_that_gets_a_fused_kernel(model, monkeypatch):
    """CUDA's rule, played on the CPU: a GQA call with a mask gets MATH, the expanded call a fused kernel."""
    from llmlab.serving.engine import model_runner as MR

    def oracle(q, k, v, mask=None, is_causal=False, enable_gqa=False):
        return "MATH" if enable_gqa and mask is not None else "EFFICIENT_ATTENTION"

    monkeypatch.setattr(MR, "sdpa_backend", oracle)
    eng = Engine(model, EngineConfig(max_num_batched_tokens=16))
    eng.runner.expand_kv_for_fused = True
    assert eng.runner.n_kv < eng.runner.n_heads  # tiny is GQA, so the rule applies
    prompts = prompts_of([30, 7], seed=13)
    got = eng.prefill_logits(prompts)  # chunks of 16 after cached keys: masked calls
    assert max_diff(model, prompts, got) <= ATOL  # expanding K/V changes nothing but the kernel
    assert eng.attention_backends.get("prefill-after-cache EFFICIENT_ATTENTION", 0) > 0
    assert not any(k.endswith("MATH") for k in eng.attention_backends)


# ---------------------------------------------------------------- batch building


def test_a_step_makes_one_host_tensor_and_views_of_it(model, monkeypatch):
    from llmlab.serving.engine import llm_engine as E

    made = []
    real = E.host_to_device
    monkeypatch.setattr(E, "host_to_device", lambda values, dev: made.append(len(values)) or real(values, dev))
    eng = Engine(model, EngineConfig(max_num_batched_tokens=20))
    for p in prompts_of([30, 5, 6], seed=14):
        eng.add_request(p, RequestParams(max_tokens=3, ignore_eos=True))
    b = eng.build_batch(eng.scheduler.schedule())
    assert len(made) == 1
    base = b.input_ids.untyped_storage().data_ptr()
    assert all(t.untyped_storage().data_ptr() == base for t in (b.positions, b.slots, b.decode_tables, b.logit_rows,
                                                                *(p[3] for p in b.prefills)))


def test_host_to_device_pins_and_copies_without_blocking_on_cuda(monkeypatch):
    from llmlab.serving.engine.llm_engine import host_to_device

    seen = {}
    real_tensor = torch.tensor
    monkeypatch.setattr(
        torch, "tensor", lambda *a, **kw: seen.update(pin=kw.pop("pin_memory", False)) or real_tensor(*a, **kw)
    )
    monkeypatch.setattr(
        torch.Tensor, "to", lambda self, dev, non_blocking=False: seen.update(dev=str(dev), nb=non_blocking) or self
    )
    assert host_to_device([1, 2, 3], torch.device("cuda", 0)).tolist() == [1, 2, 3]
    assert seen == {"pin": True, "dev": "cuda:0", "nb": True}
    seen.clear()
    host_to_device([1], torch.device("cpu"))
    assert seen == {"pin": False}  # pinned memory only where CUDA is


# ---------------------------------------------------------------- sampling


def _sampled_seqs(n, **params):
    from llmlab.serving.engine.scheduler import Sequence

    sampled = SamplingParams(temperature=params.pop("temperature", 0.7), **params)
    return [Sequence(i, [1], RequestParams(sampling=sampled)) for i in range(n)]


def test_batched_sampling_draws_from_the_processed_distribution(model):
    from scipy.stats import chisquare

    from llmlab.inference import sampling

    eng = Engine(model, EngineConfig(num_blocks=4))
    row = torch.randn(1, 4096, generator=torch.Generator().manual_seed(0)) * 3
    seqs = _sampled_seqs(4000, temperature=0.7, top_k=6)
    got = torch.tensor(eng.sample(row.expand(4000, -1), seqs))
    p = sampling.probs(row, temperature=0.7, top_k=6)[0]
    keep = p.nonzero()[:, 0]
    counts = (got[:, None] == keep[None]).sum(0)
    assert int(counts.sum()) == 4000  # nothing outside the top 6
    expected = p[keep].double().numpy()
    assert chisquare(counts.numpy(), 4000 * expected / expected.sum()).pvalue > 1e-3


def test_sampling_syncs_once_per_group_not_per_row(model, monkeypatch):
    calls = [0]
    for name in ("tolist", "item", "__bool__", "__int__", "__float__"):
        real = getattr(torch.Tensor, name)
        monkeypatch.setattr(
            torch.Tensor, name, lambda self, *a, _r=real, **k: calls.__setitem__(0, calls[0] + 1) or _r(self, *a, **k)
        )
    eng = Engine(model, EngineConfig(num_blocks=4))
    logits = torch.randn(64, 4096)

    def syncs(n):
        calls[0] = 0
        eng.sample(logits[:n], _sampled_seqs(n // 2, top_p=0.9) + _sampled_seqs(n // 2, temperature=0.0))
        return calls[0]

    assert syncs(64) == syncs(4) <= 4  # the .tolist() + sampling's row checks of one group, whatever the rows


def test_a_seeded_request_draws_the_same_tokens_alone_or_in_company(model):
    eng = Engine(model, EngineConfig())
    p, others = prompts_of([10], seed=15)[0], prompts_of([7, 12, 9], seed=16)
    sampled = SamplingParams(temperature=1.0, top_p=0.9)
    seeded = RequestParams(12, sampled, seed=5, ignore_eos=True)
    alone = eng.generate([p], seeded)[0].output_ids
    crowd = eng.generate([p, *others], [seeded] + [RequestParams(12, sampled, ignore_eos=True)] * 3)
    assert crowd[0].output_ids == alone


# ---------------------------------------------------------------- the KV pool from memory


def test_num_blocks_for_memory_is_what_is_left_after_weights_and_a_step(model):
    from llmlab.serving.engine.llm_engine import kv_bytes_per_block, num_blocks_for_memory, step_reserve_bytes

    class Dev:
        def total_memory_bytes(self):
            return 80 * 2**30

        def free_memory_bytes(self):
            return 70 * 2**30  # 10 GiB in use: the weights and whatever else

    per = kv_bytes_per_block(model, 16)
    assert per == 2 * 6 * 16 * model.config.num_key_value_heads * 64 * 4  # K and V, 6 layers, 16 tokens, FP32
    reserve = step_reserve_bytes(model, 64, 512, 1024)
    n = num_blocks_for_memory(model, Dev(), 16, 0.9, 64, 512, 1024)
    assert n == int((0.9 * 80 * 2**30 - 10 * 2**30 - reserve) // per)
    with pytest.raises(ValueError, match="no room"):
        num_blocks_for_memory(model, Dev(), 16, 0.1)
