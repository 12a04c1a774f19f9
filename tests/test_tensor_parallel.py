"""The tensor-parallel lab: sharded logits = one process (2 gloo ranks), nccl-tests' busbw, a killed rank -> exit 3
with no orphan, judge fixtures (each claim holds and fails), bad input -> exit 2.

The full CLI --quick run is in tests/test_render.py (-k tensor); here only the parts.
"""

from __future__ import annotations

import math
import os

import pandas as pd
import pytest

from llmlab.core.errors import MeasurementError, UsageError
from llmlab.core.results import LabResult, find
from llmlab.inference import tp
from llmlab.labs import tensor_parallel as lab


def test_sharded_logits_equal_single_process_on_2_gloo_ranks():
    out = tp.launch(lab.exactness_worker, 2, (lab.Config(new_tokens=4),), timeout_s=240)
    assert out["tp"] == 2 and out["tokens"] == 4
    assert out["max_abs_logit_diff"] <= 1e-5, out
    assert out["greedy_equal"] is True
    assert out["logit_scale"] > 1  # real logits, not zeros compared with zeros


def test_killed_rank_exits_3_naming_it_and_leaves_no_orphan():
    cfg = lab.Config(fault="kill:1", timeout_s=120)
    with pytest.raises(MeasurementError, match="rank 1 died") as exc:
        tp.launch(lab._worker, 2, (cfg, "gloo", False), timeout_s=cfg.timeout_s)
    assert exc.value.exit_code == 3
    assert len(tp.LAST_PIDS) == 2
    for pid in tp.LAST_PIDS:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)  # the rank is gone and reaped


@pytest.mark.slow
def test_hung_rank_is_named_at_the_timeout_and_leaves_no_orphan():
    cfg = lab.Config(fault="hang:1", timeout_s=12)  # 2 gloo ranks form their group in ~3-5 s here
    with pytest.raises(MeasurementError, match="timeout-s 12") as exc:
        tp.launch(lab._worker, 2, (cfg, "gloo", False), timeout_s=cfg.timeout_s)
    assert exc.value.exit_code == 3
    # rank 1 is named as the one behind, or (on a machine so loaded that rank 0 did not get ahead) both ranks are
    assert "rank 1 hung in 'group formed'" in str(exc.value) or "rank(s) 0, 1" in str(exc.value)
    for pid in tp.LAST_PIDS:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_busbw_formula_matches_a_hand_computed_case():
    # 1 MB in 1 ms = 1 GB/s algbw; 4 ranks: all-reduce x 2*3/4 = 1.5, all-gather / reduce-scatter x 3/4
    assert tp.bandwidths("all_reduce", 1e6, 1e-3, 4) == pytest.approx((1.0, 1.5))
    assert tp.bandwidths("all_gather", 1e6, 1e-3, 4) == pytest.approx((1.0, 0.75))
    assert tp.bandwidths("reduce_scatter", 1e6, 1e-3, 4) == pytest.approx((1.0, 0.75))
    assert tp.bus_factor("all_reduce", 2) == 1.0
    with pytest.raises(ValueError):
        tp.bus_factor("broadcast", 2)


def test_fits_formula_llama_70b():
    rows = pd.DataFrame(lab.fits_rows(lab.Config(fit_context=8192, fit_batch=16)))
    assert rows.weights_GB_per_gpu.iloc[0] == pytest.approx(141.1, abs=0.5)  # 70.6B params x 2 bytes
    assert rows.kv_KiB_per_token_per_gpu.iloc[0] == 320  # 2 x 80 layers x 8 KV heads x 128 x 2 B
    assert int(rows[rows.fits].tp.min()) == 4
    assert rows.kv_tokens_left_per_gpu.is_monotonic_increasing


# ---------------------------------------------------------------- judge fixtures


def _result(diff=1e-6, greedy=True, floor=(100.0, 120.0), link=None, comm=0.6, pred=0.5) -> LabResult:
    res = LabResult(lab="tensor-parallel", version=1)
    res.add_table("exactness", [dict(tp=2, max_abs_logit_diff=diff, greedy_equal=greedy, tokens=8)])
    sizes, times = [8, 4096, 2**20, 2**24], [floor[0], floor[1], 2000.0, 20000.0]
    res.add_table("collectives", [dict(op="all_reduce", ranks=2, size_bytes=s, time_us=t,
                                       algbw_GBps=s / t / 1e3, busbw_GBps=s / t / 1e3) for s, t in zip(sizes, times, strict=True)])
    res.add_table("steps", [dict(tp=2, batch=1, step_ms=10.0, comm_ms=10 * comm, comm_share=comm, allreduces=12,
                                 msg_bytes=1024, predicted_comm_share=pred, speedup=1.2, efficiency=0.6)])
    if link is None:
        res.skip("link", "no GPU")
    else:
        res.add_table("link", [dict(link="NVLink x18 (spec)", spec_GBps=link)])
    return res


def test_judge_claims_hold():
    claims = lab.judge(_result(link=0.5))  # plateau of the fixture: ~0.84 GB/s busbw (the best of the sweep)
    for cid in ("sharded_logits_equal", "latency_floor", "comm_share_tp2_b1", "allreduce_busbw"):
        assert find(claims, f"tensor_parallel.{cid}").holds is True, cid


def test_judge_claims_fail():
    claims = lab.judge(_result(diff=1e-3, floor=(100.0, 900.0), link=450.0, comm=0.9, pred=0.1))
    for cid in ("sharded_logits_equal", "latency_floor", "comm_share_tp2_b1", "allreduce_busbw"):
        assert find(claims, f"tensor_parallel.{cid}").holds is False, cid
    assert find(lab.judge(_result(greedy=False)), "tensor_parallel.sharded_logits_equal").holds is False


def test_judge_without_a_link_or_tables_says_not_measured():
    c = find(lab.judge(_result()), "tensor_parallel.allreduce_busbw")
    assert c.holds is None and "no GPU" in c.note and "GB/s" in c.measured
    claims = lab.judge(LabResult(lab="tensor-parallel", version=1))  # an interrupted run: nothing measured
    assert len(claims) == 4 and all(c.holds is None for c in claims)


def test_predicted_comm_interpolates_the_sweep():
    coll = _result().tables["collectives"]
    assert lab.predicted_comm_ms(coll, 4096, 12) == pytest.approx(12 * 120 / 1e3)
    assert 0.12 * 12 < lab.predicted_comm_ms(coll, 65536, 12) < 2.0 * 12
    assert math.isnan(lab.predicted_comm_ms(coll[coll.op == "x"], 4096, 12))


# ---------------------------------------------------------------- bad input -> exit 2


def test_nproc_1_explains_and_exits_2(cli):
    p = cli("tensor-parallel", "--nproc", "1", "--no-save")  # Config refuses it: no rank starts
    assert p.returncode == 2, p.stderr
    lines = [x for x in p.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and "at least 2 ranks" in lines[0] and "Traceback" not in p.stderr


def test_unknown_backend_and_bad_values_are_usage_errors():
    with pytest.raises(ValueError, match="--backend"):
        lab.Config(backend="mpi")
    with pytest.raises(ValueError, match="2 ranks"):
        lab.Config(nproc=1)
    with pytest.raises(ValueError, match="timeout"):
        lab.Config(timeout_s=0)


def test_nproc_above_the_gpus_and_nccl_without_cuda_exit_2():
    with pytest.raises(UsageError, match="only 2 CUDA GPU"):
        lab.check_ranks(4, "auto", cuda=True, gpus=2)
    with pytest.raises(UsageError, match="needs CUDA"):
        lab.check_ranks(2, "nccl", cuda=False, gpus=0)
    assert lab.check_ranks(2, "auto", cuda=False, gpus=0) == "gloo"
    assert lab.check_ranks(2, "auto", cuda=True, gpus=2) == "nccl"


def test_head_count_not_divisible_names_the_sizes_that_divide():
    with pytest.raises(UsageError, match="sizes that divide: 2$") as exc:
        lab.check_heads(4, 2, 3)
    assert exc.value.exit_code == 2 and "TP 3" in str(exc.value)
    lab.check_heads(4, 2, 2, 768)  # tiny at TP 2: fine
    with pytest.raises(UsageError, match="MLP columns: TP sizes that divide: 2, 4$"):
        lab.check_heads(8, 4, 8, 20)
    assert tp.divisible_sizes(64, 8) == [2, 4, 8]  # Llama-3.1-70B
