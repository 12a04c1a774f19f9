"""Disaggregated prefill (`serving.disagg`): the pool import, the workload's checks, and one run on two gloo
ranks. The run asserts only what the code guarantees (bytes moved = the formula, greedy tokens equal to the
colocated reply's, every request answered, no rank left behind), never a speed: both ranks may share a core."""

from __future__ import annotations

import copy
import os

import pytest

from llmlab.inference import tp
from llmlab.serving.disagg import Workload, tables
from llmlab.serving.engine.block_manager import BlockManager

# ---------------------------------------------------------------- the pool import


def test_import_prefix_is_hit_by_the_prompt_plus_its_first_token():
    bm = BlockManager(num_blocks=8, block_size=4)
    prompt = list(range(10, 20))  # 10 tokens: 2 full blocks, a partial one
    held = bm.import_prefix(prompt[:8])
    assert len(held) == 2 and bm.num_used == 2
    table: list[int] = []
    assert bm.match_prefix(table, prompt + [99]) == 8  # both imported blocks hit; the partial block is computed
    assert table == held
    bm.release(list(held))  # the importer lets go once the request is admitted
    assert bm.num_used == 2  # the request still holds them
    bm.release(table)
    assert bm.num_free == 8
    again: list[int] = []
    assert bm.match_prefix(again, prompt + [99]) == 8  # freed, still cached


def test_import_prefix_takes_only_full_blocks_and_skips_the_cache_when_it_is_off():
    bm = BlockManager(num_blocks=8, block_size=4, enable_prefix_cache=False)
    assert len(bm.import_prefix(list(range(11)))) == 2
    table: list[int] = []
    assert bm.match_prefix(table, list(range(11))) == 0


# ---------------------------------------------------------------- the workload


@pytest.mark.parametrize("kw, msg", [
    (dict(long_tokens=1), "long_tokens"), (dict(long_prompt=8), "one block"), (dict(long_at_ms=()), "arrival"),
    (dict(device="tpu"), "cpu or cuda"), (dict(running=0), "running"), (dict(long_at_ms=(-1.0,)), "arrival"),
])
def test_workload_rejects(kw, msg):
    with pytest.raises(ValueError, match=msg):
        Workload(**kw)


def test_workload_prompts_are_the_same_for_one_salt_and_the_pool_holds_every_request():
    w = Workload(running=3, long_at_ms=(1.0, 2.0, 3.0))
    run, long = w.prompts(4096)
    assert (run, long) == w.prompts(4096) and (run, long) != w.prompts(4096, salt=1)
    assert len(run) == 3 and len(long) == 3 and all(len(p) == w.long_prompt for p in long)
    assert min(min(p) for p in run + long) >= 4
    per = lambda n: -(-n // w.block_size)  # noqa: E731
    assert w.num_blocks() >= 3 * per(w.running_prompt + w.running_tokens) + 3 * per(w.long_prompt + w.long_tokens)


# ---------------------------------------------------------------- one run on two ranks

SMALL = Workload(running=2, running_prompt=16, running_tokens=256, long_prompt=72, long_tokens=4,
                 long_at_ms=(10.0, 20.0), chunk_budget=32, probe_bytes=1 << 16, probe_iters=2, timeout_s=240)


@pytest.fixture(scope="module")
def raw():
    from llmlab.serving import disagg_ranks

    plan = disagg_ranks.placement("cpu") | dict(store_port=tp.free_port())
    return tp.launch(disagg_ranks.worker, 2, (SMALL, plan), timeout_s=SMALL.timeout_s)


def test_the_handoff_moves_the_formulas_bytes_of_whole_blocks(raw):
    t = tables(SMALL, raw)
    assert len(t["handoff"]) == 2
    for h in t["handoff"]:
        assert h["shipped_tokens"] == 64 and h["blocks"] == 4  # 72 tokens: 4 full blocks of 16 ship
        assert h["kv_bytes"] == h["formula_bytes"] == 2 * 6 * 2 * 64 * 64 * 4  # tiny: 6 layers, 2 KV heads x 64
        assert h["prompt_formula_bytes"] == 2 * 6 * 2 * 64 * 72 * 4
        assert h["hit_tokens"] == 64 and h["recomputed_tokens"] == 72 + 1 - 64  # the partial block + first token
        assert h["transfer_ms"] > 0 and h["predicted_ms"] > 0


def test_the_disaggregated_reply_is_the_colocated_one_and_every_request_is_answered(raw):
    t = tables(SMALL, raw)
    assert all(h["tokens_equal"] for h in t["handoff"])
    colo, dis = t["modes"]
    assert colo["answered"] and dis["answered"] and dis["tokens_equal"]
    assert colo["running_through"] and dis["running_through"] and colo["gaps"] > 0 and dis["gaps"] > 0
    assert [r["reply_tokens"] for r in t["requests"]] == [SMALL.long_tokens] * 4
    assert {r["mode"] for r in t["requests"]} == {colo["mode"], dis["mode"]}
    assert all(r["ttft_ms"] > 0 and r["second_token_ms"] >= r["ttft_ms"] for r in t["requests"])
    link = t["link"][0]
    assert link["backend"] == "gloo" and link["rate_GBps"] > 0 and link["latency_us"] > 0


def test_a_differing_token_is_reported_not_hidden(raw):
    bad = copy.deepcopy(raw)
    bad["decode"]["long"][1]["tokens"][-1] += 1
    t = tables(SMALL, bad)
    assert [h["tokens_equal"] for h in t["handoff"]] == [True, False]
    assert t["modes"][1]["tokens_equal"] is False


def test_no_rank_is_left_behind(raw):
    for pid in tp.LAST_PIDS:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


# ---------------------------------------------------------------- the lab's part: claims from saved tables


def _saved(itl=(30.0, 12.0), ratio=1.1, formula_delta=0, wait=5.0, devices="cpu + cpu") -> dict:
    """Tables shaped as the lab saves them; the colocated and disaggregated worst ITL are `itl`."""
    import pandas as pd

    from llmlab.serving.disagg import MODES

    link = dict(probe_bytes=1 << 25, iters=5, latency_us=50.0, big_ms=10.0, rate_GBps=3.3, backend="gloo",
                devices=devices, note="")
    hand = [dict(request=j, prompt_tokens=64, blocks=4, shipped_tokens=64, kv_bytes=196608,
                 formula_bytes=196608 + formula_delta, prompt_formula_bytes=196608, transfer_ms=0.1 * ratio,
                 predicted_ms=0.1, transfer_over_predicted=ratio, hit_tokens=64, recomputed_tokens=1,
                 tokens_equal=True) for j in range(2)]
    modes = [dict(mode=MODES[0], running=2, long_requests=2, window_ms=300.0, gaps=20, itl_p50_before_ms=10.0,
                  itl_p50_ms=14.0, itl_max_ms=itl[0], ttft_p50_ms=80.0, ttft_max_ms=90.0, answered=True,
                  running_through=True, chunk_budget=32, tokens_equal=None),
             dict(mode=MODES[1], running=2, long_requests=2, window_ms=300.0, gaps=25, itl_p50_before_ms=10.0,
                  itl_p50_ms=10.5, itl_max_ms=itl[1], ttft_p50_ms=70.0, ttft_max_ms=75.0, answered=True,
                  running_through=True, chunk_budget=None, tokens_equal=True)]
    reqs = [dict(mode=MODES[1], request=j, arrival_ms=10.0, ttft_ms=70.0, second_token_ms=80.0, reply_tokens=4,
                 prefill_ms=50.0, prefill_ttft_ms=60.0, wait_ms=wait, transfer_ms=0.11) for j in range(2)]
    return dict(handoff_link=pd.DataFrame([link]), handoff=pd.DataFrame(hand), handoff_modes=pd.DataFrame(modes),
                handoff_requests=pd.DataFrame(reqs))


def _verdicts(**kw) -> dict:
    from llmlab.labs.prefill_decode.disagg import handoff_claims

    return {c.id.split(".")[1]: c.holds for c in handoff_claims(_saved(**kw))}


def test_the_handoff_claims_hold_on_a_run_that_meets_them():
    assert _verdicts() == dict(handoff_bytes_at_link_rate=True, disagg_lowers_running_itl=True,
                               disagg_ttft_cost=True)


@pytest.mark.parametrize("kw, failed", [
    (dict(formula_delta=16), "handoff_bytes_at_link_rate"), (dict(ratio=3.0), "handoff_bytes_at_link_rate"),
    (dict(ratio=0.3), "handoff_bytes_at_link_rate"), (dict(itl=(12.0, 30.0)), "disagg_lowers_running_itl"),
    (dict(wait=40.0), "disagg_ttft_cost"),
])
def test_each_handoff_claim_can_fail(kw, failed):
    got = _verdicts(**kw)
    assert got[failed] is False and all(v for k, v in got.items() if k != failed)


def test_the_itl_claim_is_not_judged_when_both_ranks_share_one_gpu():
    assert _verdicts(devices="cuda:0 + cuda:0")["disagg_lowers_running_itl"] is None


def test_no_handoff_claims_without_the_part():
    from llmlab.labs.prefill_decode.disagg import handoff_claims

    assert handoff_claims({}) == []


def test_the_labs_workload_takes_its_fields_from_the_config():
    from types import SimpleNamespace

    from llmlab.core.device import resolve_device
    from llmlab.labs.prefill_decode.disagg import workload

    cfg = SimpleNamespace(handoff_running=3, handoff_prompt=256, handoff_requests=2, handoff_chunk=64, seed=7)
    w = workload(cfg, resolve_device("cpu"), "tiny", "float32")
    assert (w.running, w.long_prompt, w.chunk_budget, w.seed, w.device) == (3, 256, 64, 7, "cpu")
    assert w.long_at_ms == (100.0, 300.0)
