"""train-vs-infer: FLOPs of a training step, Adam's state, what inference changes (nothing), the judge."""

from __future__ import annotations

import pandas as pd
import pytest

from llmlab.core.device import resolve_device, torch_threads
from llmlab.core.results import LabResult, find
from llmlab.labs import train_vs_infer as L

CPU = resolve_device("cpu")
SMALL = L.Config(models=("tiny",), batch=1, seq_len=16, repeats=1, gen_tokens=16, answer_tokens=8)


@pytest.fixture(scope="module")
def tiny():
    with torch_threads(1):
        model, tok, label = L.load_model("tiny", SMALL, CPU)
        yield model


def test_training_step_counts_3x_the_forward_flops(tiny):
    with torch_threads(1):
        rows = {r["regime"]: r for r in L.part_step_cost(tiny, "tiny", SMALL, CPU)}
    fwd, bwd = rows["inference: forward"], rows["training: forward + backward"]
    assert bwd["flops"] / fwd["flops"] == pytest.approx(3.0, rel=0.10)
    n = L.matmul_params(tiny)
    assert fwd["flops"] / (SMALL.batch * SMALL.seq_len) == pytest.approx(2 * n, rel=0.10)  # 2N per token (+ attention)


def test_adam_state_is_exactly_two_values_per_parameter(tiny):
    with torch_threads(1):
        inf, tr = L.part_memory(tiny, "tiny", SMALL, CPU)
    n = sum(p.numel() for p in tiny.parameters())
    assert tr["optimizer_elems"] == 2 * n and tr["optimizer_B"] == 8 * n and tr["grads_B"] == 4 * n == inf["weights_B"]
    assert tr["activations_B"] > 0 and inf["kv_cache_B"] > 0 and inf["grads_B"] == 0


def test_inference_leaves_the_hash_and_a_training_step_changes_it(tiny):
    with torch_threads(1):
        before, gen, step = L.part_learning(tiny, SMALL, CPU)
    assert gen["weights_hash"] == before["weights_hash"] and gen["params_with_grad"] == 0 and gen["answer_same"]
    assert step["weights_hash"] != before["weights_hash"]
    assert step["conversation_loss"] < gen["conversation_loss"]


# ---------------------------------------------------------------- judge fixtures


def _fixture(step_x=3.0, flop_x=3.0, per_token=2.0, adam_elems_per_param=2, par_x=50.0, same_hash=True, loss_drop=True):
    res = LabResult(lab=L.LAB, version=L.VERSION, config={"seq_len": 64})
    res.add_table("steps", pd.DataFrame([
        dict(model="m", regime="inference: forward", flops=100.0, flops_per_token_per_param=per_token, x_forward=1.0,
             time_ms=1.0),
        dict(model="m", regime="training: forward + backward", flops=100.0 * flop_x, flops_per_token_per_param=6.0,
             x_forward=2.0, time_ms=2.0),
        dict(model="m", regime="training: + AdamW step", flops=100.0 * flop_x, flops_per_token_per_param=6.0,
             x_forward=step_x, time_ms=step_x)]))
    n = 1000
    res.add_table("memory", pd.DataFrame([
        dict(model="m", regime="inference", params=n, weights_B=4 * n, grads_B=0, optimizer_B=0, activations_B=10,
             kv_cache_B=10, total_B=4 * n + 20, optimizer_elems=0),
        dict(model="m", regime="training (AdamW)", params=n, weights_B=4 * n, grads_B=4 * n,
             optimizer_B=4 * adam_elems_per_param * n,
             activations_B=500, kv_cache_B=0, total_B=(8 + 4 * adam_elems_per_param) * n + 500,
             optimizer_elems=adam_elems_per_param * n)]))
    res.add_table("parallel", pd.DataFrame([dict(mode="parallel", tokens_per_s=par_x * 10, x_sequential=par_x),
                                            dict(mode="sequential", tokens_per_s=10.0, x_sequential=1.0)]))
    res.add_table("learning", pd.DataFrame([
        dict(stage="before", weights_hash="a", params_with_grad=0, answer_same=True, answer_first_diff=-1,
             conversation_loss=None, tokens=0),
        dict(stage="gen", weights_hash="a" if same_hash else "b", params_with_grad=0, answer_same=True,
             answer_first_diff=-1,
             conversation_loss=3.0, tokens=100),
        dict(stage="step", weights_hash="c", params_with_grad=0, answer_same=False, answer_first_diff=2,
             conversation_loss=2.5 if loss_drop else 3.5, tokens=100)]))
    return res


@pytest.mark.parametrize("claim_id, bad", [
    ("train_vs_infer.training_flops_3x", dict(flop_x=2.0)),
    ("train_vs_infer.forward_2n", dict(per_token=4.0)),
    ("train_vs_infer.step_time_3x", dict(step_x=7.0)),
    ("train_vs_infer.adam_16_bytes", dict(adam_elems_per_param=1)),
    ("train_vs_infer.training_memory_ratio", dict(adam_elems_per_param=0)),
    ("train_vs_infer.parallel_vs_sequential", dict(par_x=3.0)),
    ("train_vs_infer.inference_does_not_learn", dict(same_hash=False)),
    ("train_vs_infer.training_step_learns", dict(loss_drop=False)),
])
def test_each_claim_can_hold_and_fail(claim_id, bad):
    assert find(L.judge(_fixture()), claim_id).holds is True
    assert find(L.judge(_fixture(**bad)), claim_id).holds is False


def test_judge_without_the_learning_part_says_not_measured():
    res = _fixture()
    del res.tables["learning"]
    res.skip("learning", "random weights")
    assert find(L.judge(res), "train_vs_infer.inference_does_not_learn").holds is None


@pytest.mark.parametrize("kw", [dict(batch=0), dict(seq_len=4), dict(lr=0.0), dict(gen_tokens=1), dict(models=())])
def test_bad_config_is_refused(kw):
    with pytest.raises(ValueError):
        L.Config(**kw)


def test_views_name_existing_tables():
    res = _fixture()
    assert {v.table for v in L.views(res)} >= {"steps", "memory", "parallel", "learning"}
