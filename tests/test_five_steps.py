"""five-steps: the hand run is the forward, shapes are the hooks' shapes and the config's, FLOPs match the counter
(SDPA included), steps add up, every generator that samples logits lives on their device."""

from __future__ import annotations

import pandas as pd
import pytest
import torch

from llmlab.core.device import resolve_device, torch_threads
from llmlab.core.results import LabResult, find
from llmlab.labs import five_steps as F

CPU = resolve_device("cpu")
CFG = F.Config(sizes=(), prefill_tokens=16, context=8, repeats=3)


@pytest.fixture(scope="module")
def tiny():
    with torch_threads(1):
        model, tok, _ = F.load_model("tiny", CPU)
        ids = tok(CFG.prompt, return_tensors="pt", add_special_tokens=False)["input_ids"]
        yield model, tok, ids


def test_hand_run_is_the_forward(tiny):
    model, _, ids = tiny
    with torch.inference_mode(), torch_threads(1):
        r = F.hand_check(model, ids)
    assert r["max_abs_logit_diff"] <= F.LOGIT_TOL and r["hand_token"] == r["generate_token"]


def test_listed_shapes_are_the_hooks_shapes(tiny):
    model, tok, ids = tiny
    seen = {}
    mods = {"1. embed": model.model.embed_tokens, "2. attention": model.model.layers[0].self_attn,
            "3. MLP": model.model.layers[0].mlp, "4. LM head": model.lm_head}
    def hook(k):
        def record(mod, args, out):  # returns None: the module's output stays as it is
            seen.setdefault(k, str(tuple((out[0] if isinstance(out, tuple) else out).shape)))
        return record

    handles = [m.register_forward_hook(hook(k)) for k, m in mods.items()]
    try:
        with torch.inference_mode():
            rows = F.walk_rows(model, ids, "tiny", ids.shape[1], tok)
    finally:
        for h in handles:
            h.remove()
    listed = {r["step"]: r["shape"] for r in rows}
    assert all(listed[k] == v for k, v in seen.items()), (listed, seen)
    assert listed["4. LM head"] == f"(1, 1, {model.config.vocab_size})"


def test_predictions_come_from_the_config_and_the_count_not_from_the_tensors(tiny):
    """Told a T the ids do not have (a tokenizer that added a BOS), every T-shaped step is off and the claim fails;
    the sample row holds an id drawn from the vocabulary."""
    model, tok, ids = tiny
    with torch.inference_mode():
        rows = F.walk_rows(model, ids, "tiny", ids.shape[1] + 1, tok)
        good = F.walk_rows(model, ids, "tiny", ids.shape[1], tok)
    off = [r["step"] for r in rows if r["shape"] != r["expected"]]
    assert off == ["1. tokenize", "1. embed", "2. attention", "3. MLP", "2-3. x layers"]
    d, v = model.config.hidden_size, model.config.vocab_size
    assert {r["step"]: r["expected"] for r in good}["2-3. x layers"] == str((1, ids.shape[1], d))
    sample = good[-1]
    assert sample["step"] == "5. sample" and sample["shape"] == "(1,)" and 0 <= sample["token_id"] < v
    res = LabResult(lab=F.LAB, version=F.VERSION)
    res.add_table("walk", rows)
    assert find(F.judge(res), "five_steps.shapes_as_predicted").holds is False
    res.add_table("walk", good)
    assert find(F.judge(res), "five_steps.shapes_as_predicted").holds is True


def test_every_generator_that_samples_logits_is_made_on_their_device(tiny, monkeypatch):
    """A CUDA run samples CUDA logits: a generator made without a device is a CPU one, and torch.multinomial
    refuses it there. On the CPU both are CPU, so the check is that each generator reaching the sampler was
    made explicitly on the logits' device."""
    from llmlab.inference import sampling

    model, tok, ids = tiny
    real_gen, real_sample, made = torch.Generator, sampling.sample, {}

    def generator(device=None):
        g = real_gen(device=device if device is not None else "cpu")
        made[id(g)] = device
        return g

    def sample(logits, generator=None, **kw):
        asked = made.get(id(generator))
        assert asked is not None and torch.device(asked) == logits.device, f"generator made for {asked!r}"
        return real_sample(logits, generator=generator, **kw)

    monkeypatch.setattr(torch, "Generator", generator)
    monkeypatch.setattr(sampling, "sample", sample)
    with torch_threads(1), torch.inference_mode():
        F.walk_rows(model, ids, "tiny", ids.shape[1], tok)
        F.candidate_rows(model, ids, tok, CFG)
        F.time_steps(model, F.Config(sizes=(), prefill_tokens=4, context=2, repeats=1), CPU, "tiny", 2)
    assert len(made) >= 3


@pytest.mark.parametrize("ref", ["tiny", "arch:qwen2.5-0.5b"])
def test_formula_flops_match_the_counter_attention_core_included(ref):
    """On the CPU too the counter counts SDPA (core.flops' mapping): attention's counted FLOPs exceed its four
    projections by the QK^T and PV core, 4 x heads x head_dim x pairs (dense T x T in prefill, T + 1 in decode)."""
    from llmlab.core.flops import Shape

    with torch_threads(1), torch.inference_mode():
        model, _, full = F.load_model(ref, CPU, layers=1)
        rows = F.time_steps(model, F.Config(sizes=(), prefill_tokens=16, context=8, repeats=1), CPU, ref, full)
    s = Shape.of(model.config)
    # a layer
    proj = sum(2 * k * n for name, k, n, _ in s.matmuls() if name in ("q_proj", "k_proj", "v_proj", "o_proj"))
    for r in rows:
        if r["counted_flops"]:
            assert r["flops"] == pytest.approx(r["counted_flops"], rel=F.FLOP_TOL), r
        if r["step"] == "2. attention":
            pairs = 8 + 1 if r["phase"] == "decode" else 16 * 16
            core = 4 * s.heads * s.head_dim * pairs
            # all layers
            assert r["counted_flops"] == pytest.approx((r["tokens"] * proj + core) * r["layers"], rel=1e-9), r


def test_steps_add_up_to_the_forward_on_a_compute_heavy_shape():
    """One layer of Qwen2.5-0.5B (136 M-parameter LM head): the stamps cover the forward within the tolerance."""
    # a sum of per-step medians against the median forward: within each run the steps fit inside the forward,
    # but medians over 3 runs do not add exactly (a shared CPU moved them 2% apart): the tolerance both ways, and
    # up to 3 measurements (the suite runs a quick run beside this test; a stamp that misses a step misses every time)
    with torch_threads(1), torch.inference_mode():
        model, _, full = F.load_model("arch:qwen2.5-0.5b", CPU, layers=1)
        for _ in range(3):
            rows = F.time_steps(model, F.Config(sizes=(), prefill_tokens=64, context=8, repeats=3), CPU, "q", 1)
            pre = next(r for r in rows if r["phase"] == "prefill")
            if abs(pre["stamped_ms"] / pre["measured_forward_ms"] - 1) <= F.ADD_UP_TOL:
                break
    assert abs(pre["stamped_ms"] / pre["measured_forward_ms"] - 1) <= F.ADD_UP_TOL, pre


# ---------------------------------------------------------------- judge fixtures


def _walk(t=5, shapes=None, token_id=3, v=16):
    """A walk table as walk_rows writes it: predicted shapes for T = t, d = 8, V = v; `shapes` overrides measured
    ones."""
    pred = F.predicted_shapes(type("C", (), dict(hidden_size=8, vocab_size=v))(), t)
    got = {**{k: str(x) for k, x in F.predicted_shapes(type("C", (), dict(hidden_size=8, vocab_size=v))(), 5).items()},
           **(shapes or {})}
    return [dict(model="m", step=k, what="", shape=got[k], expected=str(x),
                 token_id=token_id if k == "5. sample" else None,
                 vocab=v) for k, x in pred.items()]


def _fixture(diff=1e-7, same_token=True, stamped=9.5, attn_mlp=8.0, sample=0.1, flop_err=0.0, walk=None):
    res = LabResult(lab=F.LAB, version=F.VERSION)
    res.add_table("hand_run", [dict(max_abs_logit_diff=diff, tolerance=F.LOGIT_TOL, hand_token=5,
                                    generate_token=5 if same_token else 6)])
    res.add_table("walk", walk or _walk())
    rest = 10.0 - attn_mlp - sample
    times = {"1. embed": rest / 2, "2. attention": attn_mlp / 2, "3. MLP": attn_mlp / 2, "norms": rest / 2,
             "4. LM head": 0.0,
             "5. sample": sample}
    res.add_table("time", pd.DataFrame([dict(model="m", phase="decode", step=s, time_ms=t, flops=100.0 * (1 + flop_err),
                                             counted_flops=100.0, measured_forward_ms=10.0,
                                             stamped_ms=stamped, param_bytes=1.0) for s, t in times.items()]))
    return res


@pytest.mark.parametrize("claim_id, bad", [
    ("five_steps.no_sixth_step", dict(diff=1e-3)),
    ("five_steps.no_sixth_step", dict(same_token=False)),
    ("five_steps.shapes_as_predicted", dict(walk=_walk(t=6))),  # the tokenizer counted a BOS the ids lack
    # every position's scores
    ("five_steps.shapes_as_predicted", dict(walk=_walk(shapes={"4. LM head": "(1, 5, 16)"}))),
    ("five_steps.shapes_as_predicted", dict(walk=_walk(token_id=16))),  # an id past the vocabulary
    ("five_steps.steps_add_up", dict(stamped=5.0)),
    ("five_steps.attention_mlp_dominate", dict(attn_mlp=3.0)),
    ("five_steps.sampling_negligible", dict(sample=1.0)),
    ("five_steps.flops_formula", dict(flop_err=0.2)),
])
def test_each_claim_can_hold_and_fail(claim_id, bad):
    assert find(F.judge(_fixture()), claim_id).holds is True
    assert find(F.judge(_fixture(**bad)), claim_id).holds is False


@pytest.mark.parametrize("kw", [dict(prefill_tokens=1), dict(top_p=0.0), dict(prompt="  "), dict(repeats=0)])
def test_bad_config_is_refused(kw):
    with pytest.raises(ValueError):
        F.Config(**kw)
