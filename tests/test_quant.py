"""The quantizers (round-trip bounds, exact bytes, the E2M1 table, a hand-computed NVFP4 block),
the quantization lab's judge fixtures and its bad input. The lab end to end: tests/test_render.py."""

from __future__ import annotations

import copy

import pandas as pd
import pytest
import torch

from llmlab.core.errors import UsageError
from llmlab.core.results import LabResult, find
from llmlab.inference import quant as Q
from llmlab.labs import quantization as L

E2M1_TABLE = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]


def _w(n=48, k=256, seed=0):
    return torch.randn(n, k, generator=torch.Generator().manual_seed(seed))


# ---------------------------------------------------------------- round trips and bytes


def test_int8_error_is_at_most_half_a_scale_per_element():
    w = _w()
    qt = Q.quantize_weight(w, "int8")
    err = (Q.dequantize_weight(qt) - w).abs()
    assert qt.parts["q"].dtype == torch.int8 and qt.parts["q"].abs().max() == 127
    assert (err <= qt.parts["scale"][:, None] / 2 + 1e-6).all()


@pytest.mark.parametrize("fmt", ["int4-g32", "int4-g128", "int4-g32-asym", "int4-g128-asym"])
def test_int4_error_within_the_format_bound(fmt):
    w = _w()
    qt = Q.quantize_weight(w, fmt)
    err = (Q.dequantize_weight(qt) - w).abs()
    assert (err <= Q.error_bound(qt) + 1e-6).all()
    assert qt.parts["scale"].dtype == torch.float16 and qt.parts["q"].dtype == torch.uint8


@pytest.mark.parametrize("fmt", Q.WEIGHT_FORMATS)
def test_weight_bytes_equal_the_formula_exactly(fmt):
    for n, k in ((48, 256), (7, 128), (1, 768)):
        assert Q.quantize_weight(_w(n, k), fmt).nbytes == Q.weight_bytes_formula(n, k, fmt)


@pytest.mark.parametrize("fmt", Q.KV_FORMATS)
def test_kv_bytes_equal_the_formula_exactly(fmt):
    x = torch.randn(2, 3, 5, 64)  # (B, H, T, D)
    assert Q.quantize_kv(x, fmt).nbytes == Q.kv_bytes_formula(2, 3, 5, 64, fmt)


def test_fp8_round_trip_is_within_e4m3_relative_precision():
    w = _w()
    for fmt in ("fp8-tensor", "fp8-channel"):
        qt = Q.quantize_weight(w, fmt)
        assert qt.parts["q"].dtype == torch.float8_e4m3fn
        err = (Q.dequantize_weight(qt) - w).abs()
        s = qt.parts["scale"] if fmt == "fp8-tensor" else qt.parts["scale"][:, None]
        # 3 mantissa bits: half an ulp is 1/16 of the value; below 2^-6 (subnormals) the step is 2^-9
        assert (err <= w.abs() / 16 + s * 2**-10 + 1e-7).all()


def test_group_size_that_does_not_divide_the_dimension_is_refused():
    with pytest.raises(ValueError, match="does not divide"):
        Q.quantize_weight(_w(4, 96), "int4-g64")


# ---------------------------------------------------------------- E2M1 and NVFP4


def test_e2m1_decoding_of_all_16_codes_matches_the_table():
    vals = Q.e2m1_value(torch.arange(16))
    assert vals.tolist() == E2M1_TABLE
    assert torch.signbit(vals[8])  # code 8 is -0


def test_e2m1_encoding_round_trips_every_value_and_rounds_ties_to_even():
    table = torch.tensor(E2M1_TABLE)
    codes = Q.e2m1_encode(table)
    assert Q.e2m1_value(codes).tolist() == [abs(v) if v == 0 else v for v in E2M1_TABLE]
    ties = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 7.0, -5.0])
    assert Q.e2m1_value(Q.e2m1_encode(ties)).tolist() == [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, 6.0, -4.0]


def test_nvfp4_encoder_against_a_hand_computed_block():
    # tensor amax 10.5 -> s_g = 10.5 / (6 x 448) = 1/256 exactly.
    # block A: amax 10.5 -> s_b = 10.5 / 6 x 256 = 448 (E4M3 exact); scale 448/256 = 1.75
    a = [1.75 * v for v in (0, .5, 1, 1.5, 2, 3, 4, 6, -.5, -1.5, .25, .75, 1.25, 1.7, 3.5, 5)]
    code_a = [0, 1, 2, 3, 4, 5, 6, 7, 9, 11, 0, 2, 2, 3, 6, 6]  # ties .25->0, .75->1, 1.25->1, 3.5->4, 5->4
    # block B: amax 3.5 -> s_b = 149.33 -> E4M3 rounds to 144 (step 16 in [128, 256)); scale 144/256 = 0.5625
    b = [3.5, -3.5, 0, 0.5625, 1.125, -2.25, 0.28125, 1.6875, 0.3, 0.7, 2.0, -0.1, 0, 0, 0, 0]
    code_b = [7, 15, 0, 2, 4, 14, 1, 5, 1, 2, 6, 0, 0, 0, 0, 0]  # 6.22 saturates to 6; -0.18 -> +0
    qt = Q.nvfp4_quantize(torch.tensor([a + b]))  # (1, 32)
    assert qt.parts["tensor_scale"].item() == 1 / 256
    assert qt.parts["block_scale"].float().tolist() == [448.0, 144.0]
    assert Q._unpack4(qt.parts["q"]).flatten().tolist() == code_a + code_b
    assert qt.nbytes == 32 // 2 + 2 + 4
    expect = [E2M1_TABLE[c] * 1.75 for c in code_a] + [E2M1_TABLE[c] * 0.5625 for c in code_b]
    assert Q.nvfp4_dequantize(qt).flatten().tolist() == [e + 0.0 for e in expect]


def test_nvfp4_values_are_exactly_representable_e2m1_times_the_scales():
    x = torch.randn(2, 4, 8, 64)
    qt = Q.nvfp4_quantize(x)
    scale = (qt.parts["block_scale"].float() * qt.parts["tensor_scale"])[:, None]
    deq = Q.nvfp4_dequantize(qt).reshape(-1, 16)
    table = torch.tensor(E2M1_TABLE)
    nearest = table[(deq / scale)[..., None].sub(table).abs().argmin(-1)]  # the E2M1 value each element decodes to
    assert torch.equal(nearest * scale, deq)  # every element is exactly an E2M1 value x block scale x tensor scale
    err = (Q.nvfp4_dequantize(qt) - x).norm() / x.norm()
    assert 0 < err < 0.2  # 4-bit values: ~10% relative error, not garbage


# ---------------------------------------------------------------- the model paths


@pytest.fixture(scope="module")
def tiny():
    from llmlab.core.models import load

    return load("tiny", "cpu").model


def test_fp32_to_fp32_is_the_identity_with_a_loss_delta_of_zero(tiny):
    from llmlab.tiny.evaluate import heldout_loss

    ids = torch.randint(0, tiny.config.vocab_size, (513,), generator=torch.Generator().manual_seed(0))
    q = copy.deepcopy(tiny)
    b = Q.fake_quantize_(q, "fp32")
    assert all(torch.equal(a, c) for a, c in zip(tiny.parameters(), q.parameters(), strict=True))
    assert heldout_loss(q, ids) - heldout_loss(tiny, ids) == 0.0
    n = sum(p.numel() for _, p in Q.quantizable(tiny))
    assert b["matrix_bytes"] == b["matrix_bytes_formula"] == 4 * n


@pytest.mark.parametrize("fmt", ["int8", "int4-g32", "fp8-channel", "bf16"])
def test_quant_linear_computes_with_the_dequantized_weight(fmt):
    lin = torch.nn.Linear(256, 64, bias=False)
    ql = Q.QuantLinear(lin, fmt)
    x = torch.randn(3, 256)
    ref = x @ Q.dequantize_weight(ql.qt).T
    tol = 2e-2 if fmt == "bf16" else 1e-3  # bf16 also rounds the activations
    assert torch.allclose(ql(x), ref, atol=tol, rtol=tol)


def test_fp32_kv_cache_gives_the_plain_forward_and_nvfp4_moves_it(tiny):
    from llmlab.inference import decode

    x = torch.randint(0, tiny.config.vocab_size, (1, 32), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        plain = tiny(input_ids=x).logits
        fp32 = decode.forward(tiny, x, L.QDQCache("fp32", tiny.config), logits_to_keep=0)
        nv = decode.forward(tiny, x, L.QDQCache("nvfp4", tiny.config), logits_to_keep=0)
    assert torch.equal(plain, fp32)
    assert not torch.equal(plain, nv)


def test_kv_fit_rows_follow_the_formula():
    rows = {(r["model"], r["kv_format"]): r for r in L.kv_fit_rows(["bf16", "fp8", "nvfp4"], 80)}
    r = rows[("arch:llama-3-8b", "bf16")]
    assert r["bytes_per_token"] == 2 * 32 * 8 * 128 * 2  # 2 (K, V) x layers x kv heads x head_dim x 2 B
    assert rows[("arch:llama-3.1-70b", "nvfp4")]["x_fp8"] == pytest.approx(1 / 0.5625, rel=1e-3)


# ---------------------------------------------------------------- judge fixtures


def _result(int8_loss=0.001, int4_ppl=0.02, match=True, speedup=3.5, nvfp4_bpt=0.5625, nvfp4_ppl=0.004, fp32_kl=0.0):
    weights = pd.DataFrame([
        dict(format="fp32", bits_per_param=32.0, x_bf16=2.0, loss_delta=0.0, ppl_delta=0.0, kl=fp32_kl, agreement=1.0,
             bytes_match=True),
        dict(format="int8", bits_per_param=8.1, x_bf16=0.507, loss_delta=int8_loss, ppl_delta=int8_loss, kl=1e-5,
             agreement=1.0, bytes_match=match),
        dict(format="int4-g128", bits_per_param=4.1, x_bf16=0.26, loss_delta=0.02, ppl_delta=int4_ppl, kl=1e-3,
             agreement=0.95, bytes_match=True)])
    speed = pd.DataFrame([
        dict(model="m", format=f, batch=1, real_kernel=real, linear_bytes=b, fits_in_cache=False, speedup=s,
             bytes_ratio=4e6 / b) for f, real, b, s in (("fp32", True, 4e6, 1.0), ("int8", True, 1e6, speedup),
                                                       ("int4-g128", False, 5e5, 0.3))])
    kv_bytes = pd.DataFrame([dict(format="fp8", long_context_bytes_per_token=1.0, bytes_match=True),
                             dict(format="nvfp4", long_context_bytes_per_token=nvfp4_bpt, bytes_match=True)])
    kv_quality = pd.DataFrame([dict(format="nvfp4", ppl_delta=nvfp4_ppl, agreement=0.97)])
    return LabResult(lab="quantization", version=1, tables=dict(weights=weights, speed=speed, kv_bytes=kv_bytes,
                                                                kv_quality=kv_quality))


@pytest.mark.parametrize("cid, bad", [
    ("quantization.fp32_identity", dict(fp32_kl=1e-9)),
    ("quantization.bytes_match_formula", dict(match=False)),
    ("quantization.int8_halves_memory", dict(int8_loss=0.05)),
    ("quantization.int4_perplexity", dict(int4_ppl=0.2)),
    ("quantization.speedup_tracks_bytes", dict(speedup=0.6)),
    ("quantization.nvfp4_kv_vs_fp8", dict(nvfp4_bpt=0.75)),
    ("quantization.nvfp4_kv_quality", dict(nvfp4_ppl=0.03)),
])
def test_each_claim_holds_and_fails(cid, bad):
    assert find(L.judge(_result()), cid).holds is True
    assert find(L.judge(_result(**bad)), cid).holds is False


def test_judge_tolerates_missing_tables():
    res = LabResult(lab="quantization", version=1)
    res.skip("speed", "interrupted")
    claims = L.judge(res)
    assert claims and all(c.holds is None for c in claims)
    assert find(claims, "quantization.speedup_tracks_bytes").note == "interrupted"


# ---------------------------------------------------------------- bad input


def test_unknown_formats_are_refused():
    with pytest.raises(ValueError, match="unknown weight format"):
        L.Config(weights=("int5",))
    with pytest.raises(ValueError, match="unknown KV format"):
        L.Config(kv=("fp6",))


def test_group_size_not_dividing_the_model_is_a_usage_error():
    from llmlab.core.device import resolve_device

    with pytest.raises(UsageError, match="group size 48 does not divide"):
        L.run(L.Config(**{**L.QUICK, "weights": ("int4-g48",)}), resolve_device("cpu"))


def test_a_format_this_torch_cannot_run_is_a_usage_error(monkeypatch):
    monkeypatch.setattr(Q, "HAS_FP8", False)
    with pytest.raises(UsageError, match="formats it can run: fp32, bf16"):
        L._formats(L.Config(weights=("bf16", "fp8-tensor"), kv=("bf16",)))
    with pytest.raises(UsageError, match="--kv nvfp4"):
        L._formats(L.Config(weights=("bf16",), kv=("bf16", "nvfp4")))


def test_unknown_kv_format_exits_2_through_the_cli(cli):
    p = cli("quantization", "--kv", "fp6", "--no-save")
    assert p.returncode == 2
    assert "unknown KV format 'fp6'" in p.stderr


def test_config_defaults_are_the_quantizers_formats():
    assert L.Config().weights == Q.WEIGHT_FORMATS
