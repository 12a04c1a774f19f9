"""The quantizers (round-trip bounds, exact bytes, the E2M1 table, a hand-computed NVFP4 block), the kernel
paths (which one each device takes, with the CUDA capability patched; the layouts; the kernels that run on a
CPU, for real, against the dequantized reference; the fall-back when a probe fails), the quantization lab's
judge fixtures and its bad input. The lab end to end: tests/test_render.py."""

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


# ---------------------------------------------------------------- kernel paths


@pytest.mark.parametrize("cc, int8, int4, fp8", [
    ((7, 5), "int8pack_mm (naive CUDA kernel)", Q.EMUL, Q.EMUL),
    ((8, 0), "int8pack_mm (naive CUDA kernel)", "int4pack_mm (tinygemm, BF16)", Q.EMUL),
    ((8, 9), "int8pack_mm (naive CUDA kernel)", "int4pack_mm (tinygemm, BF16)", "_scaled_mm FP8 (tensor cores)"),
    ((9, 0), "int8pack_mm (naive CUDA kernel)", "int4pack_mm (tinygemm, BF16)", "_scaled_mm FP8 (tensor cores)"),
])
def test_each_gpu_generation_gets_its_kernels(monkeypatch, cc, int8, int4, fp8):
    """FP8 GEMM from compute capability 8.9 (FP8 tensor cores), tinygemm INT4 from sm80; group sizes it lacks
    emulate."""
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: cc)
    gpu = torch.device("cuda:0")
    assert Q.kernel_path("int8", gpu) == int8
    assert Q.kernel_path("int4-g128", gpu) == Q.kernel_path("int4-g32-asym", gpu) == int4
    assert Q.kernel_path("int4-g16", gpu) == Q.EMUL
    assert Q.kernel_path("fp8-tensor", gpu) == Q.kernel_path("fp8-channel", gpu) == fp8
    assert Q.kernel_path("bf16", gpu) == "BF16 matmul (kernel)"


def test_the_cpu_gets_its_own_kernels():
    cpu = torch.device("cpu")
    assert Q.kernel_path("int8", cpu) == "int8pack_mm (kernel)"
    int4 = "int4pack_mm_for_cpu (kernel)" if hasattr(torch, "_weight_int4pack_mm_for_cpu") else Q.EMUL  # torch 2.6+
    assert Q.kernel_path("int4-g64", cpu) == int4
    assert Q.kernel_path("fp8-channel", cpu) == Q.EMUL  # no FP8 tensor cores: the format is emulated


_CPU_RUNNABLE = [("int8", "int8pack_mm (kernel)"), ("int4-g32", "int4pack_mm_for_cpu (kernel)"),
                 ("int4-g128-asym", "int4pack_mm_for_cpu (kernel)"), ("int4-g64-asym", "int4pack_mm_for_cpu (kernel)"),
                 ("fp8-tensor", "_scaled_mm FP8 (tensor cores)"), ("fp8-channel", "_scaled_mm FP8 (tensor cores)")]


@pytest.mark.parametrize("fmt, path", _CPU_RUNNABLE)
def test_kernels_that_run_on_a_cpu_equal_the_dequantized_reference(fmt, path):
    """The real ops (the FP8 GEMM too: torch has a CPU _scaled_mm), through the same pack and call as on a GPU:
    a wrong zero, scale layout or operand order is O(1) off; rounding is 2^-8 at worst."""
    qt = Q.quantize_weight(_w(64, 256), fmt)
    x = torch.randn(5, 256, generator=torch.Generator().manual_seed(2))
    try:
        y = Q._mm(path, x, Q._pack(path, qt), Q._group(fmt)).float()
    except (AttributeError, NotImplementedError) as exc:  # an older torch without this op on the CPU
        pytest.skip(f"{path} does not run on this torch's CPU: {exc}")
    ref = Q._reference(path, x, qt)
    tol = Q.KERNEL_TOL if path.startswith("_scaled_mm") else 1e-5  # BF16 output vs FP32 kernels
    assert float((y - ref).norm() / ref.norm()) <= tol


def test_fp8_gemm_layout_column_major_weight_and_scales_per_tensor_or_row():
    for fmt, shape in (("fp8-tensor", ()), ("fp8-channel", (1, 48))):
        packed = Q._pack("_scaled_mm FP8 (tensor cores)", Q.quantize_weight(_w(48, 256), fmt))
        b = packed["q"].t()  # (K, N) as _scaled_mm's second operand
        assert b.shape == (256, 48) and b.stride() == (1, 256)  # column-major
        assert tuple(packed["scale_b"].shape) == shape and packed["scale_b"].dtype == torch.float32
    xq, sx = Q.fp8_activations(torch.randn(3, 256), rowwise=True)
    assert xq.dtype == torch.float8_e4m3fn and tuple(sx.shape) == (3, 1)


@pytest.mark.parametrize("fmt", ["int4-g32", "int4-g128-asym"])
def test_int4_kernel_layout_scales_zeros_and_nibbles(fmt):
    """tinygemm's dequantization (q - 8) x scale + zero gives W' exactly; its byte layout keeps the even index in the
    high nibble (our `_pack4` keeps it in the low one)."""
    qt = Q.quantize_weight(_w(32, 256), fmt)
    codes = Q._unpack4(qt.parts["q"]).float()  # (N, K)
    sz = Q.int4_scales_and_zeros(qt, torch.float32)  # (groups, N, 2)
    g = Q._group(fmt)
    assert sz.shape == (256 // g, 32, 2)
    scale, zero = (sz[..., i].t().repeat_interleave(g, dim=1) for i in (0, 1))  # (N, K) each
    assert torch.allclose((codes - 8) * scale + zero, Q.dequantize_weight(qt), atol=1e-6, rtol=0)
    b = Q.int4_cuda_bytes(torch.tensor([[1, 2, 3, 4]]))
    assert b.tolist() == [[0x12, 0x34]]


def test_layers_the_kernel_layout_cannot_take_are_emulated():
    lin = torch.nn.Linear(256, 24, bias=False)  # N = 24: not a multiple of 16
    assert Q.QuantLinear(lin, "int4-g32").path == Q.EMUL
    model = torch.nn.Sequential(torch.nn.Linear(256, 64, bias=False), torch.nn.Linear(64, 24, bias=False))
    assert Q.quantize_linears(model, "int4-g32") == f"int4pack_mm_for_cpu (kernel) + {Q.EMUL}"


@pytest.mark.parametrize("broken", ["raises", "wrong"])
def test_a_kernel_that_fails_its_probe_falls_back_to_the_emulation(monkeypatch, broken):
    """_weight_int8pack_mm has no CUDA kernel before torch 2.9: the probe finds that out once and the layer emulates."""
    def op(x, q, s):
        if broken == "raises":
            raise NotImplementedError(
                "Could not run 'aten::_weight_int8pack_mm' with arguments from the 'CUDA' backend"
            )
        return torch.zeros(x.shape[0], q.shape[0])

    monkeypatch.setattr(Q, "_PROBES", {})
    monkeypatch.setattr(torch, "_weight_int8pack_mm", op)
    row = Q.probe("int8", torch.device("cpu"))
    assert row["kernel"] == "int8pack_mm (kernel)" and row["path"] == Q.EMUL
    assert ("Could not run" if broken == "raises" else "off the dequantized reference") in row["why"]
    ql = Q.QuantLinear(torch.nn.Linear(256, 64, bias=False), "int8")
    x = torch.randn(3, 256)
    assert ql.path == Q.EMUL and torch.allclose(ql(x), x @ Q.dequantize_weight(ql.qt).T, atol=1e-5)


def test_nvfp4_of_an_all_zero_tensor_stays_on_its_device():
    """The fallback tensor scale is made beside the data: on the meta device every part is meta (a CPU constant,
    or a Python branch on the data, cannot be); on the CPU zeros round-trip to zeros with scale 1."""
    qt = Q.nvfp4_quantize(torch.zeros(2, 3, 4, 64, device="meta"))
    assert all(t.device.type == "meta" for t in qt.parts.values())
    qt = Q.nvfp4_quantize(torch.zeros(1, 32))
    assert qt.parts["tensor_scale"].tolist() == [1.0] and not Q.nvfp4_dequantize(qt).any()


def test_decode_speed_waits_for_the_device_at_every_step(tiny, monkeypatch):
    """On a GPU the host only enqueues: each decode step is timed after the device's synchronise."""
    from llmlab.core.device import resolve_device
    from llmlab.inference import decode

    real, syncs = decode.generate, []

    def generate(*a, sync=None, **kw):
        syncs.append(sync)
        return real(*a, sync=sync, **kw)

    monkeypatch.setattr(decode, "generate", generate)
    cpu = resolve_device("cpu")
    cfg = L.Config(batches=(1,), decode_tokens=2, prompt_len=4, repeats=1)
    rows = L.part_speed(tiny, "tiny", ["fp32", "int8"], cfg, cpu)
    assert syncs and all(s == cpu.synchronize for s in syncs)
    assert [r["path"] for r in rows] == ["FP32 matmul (kernel)", "int8pack_mm (kernel)"]


def test_gpu_speed_model_is_sized_from_free_memory_and_l2():
    from llmlab.core.flops import Shape
    from llmlab.core.models import arch_config

    fmts = ["fp32", "bf16", "int8", "int4-g128", "fp8-channel"]
    layers, full, beyond = L.gpu_speed_layers("arch:llama-3-8b", fmts, 139 * 2**30, 60 * 2**20)  # an H200
    s = Shape.of(arch_config("llama-3-8b"))
    per_layer = sum(k * n for name, k, n, _ in s.matmuls() if name != "lm_head")
    need = (8 + 4 + 2 + 1.1 + 1.2 + 1.1) * (layers * per_layer + 2 * s.hidden * s.vocab)
    assert 1 <= layers < full == 32 and need <= L.GPU_MEMORY_SHARE * 139 * 2**30 and beyond
    assert L.gpu_speed_layers("arch:llama-3-8b", fmts, 24 * 2**30, 60 * 2**20)[0] < layers  # a smaller card, fewer
    assert L.gpu_speed_layers("arch:llama-3-8b", fmts, 2**30, 60 * 2**20)[0] == 1  # at least one layer


# ---------------------------------------------------------------- judge fixtures


def _result(int8_loss=0.001, int4_ppl=0.02, match=True, speedup=3.5, nvfp4_bytes=0.5625, nvfp4_ppl=0.004, fp32_kl=0.0,
            device="cpu", fits=False):
    weights = pd.DataFrame([
        dict(format="fp32", bits_per_param=32.0, x_bf16=2.0, loss_delta=0.0, ppl_delta=0.0, kl=fp32_kl, agreement=1.0,
             bytes_match=True),
        dict(format="int8", bits_per_param=8.1, x_bf16=0.507, loss_delta=int8_loss, ppl_delta=int8_loss, kl=1e-5,
             agreement=1.0, bytes_match=match),
        dict(format="int4-g128", bits_per_param=4.1, x_bf16=0.26, loss_delta=0.02, ppl_delta=int4_ppl, kl=1e-3,
             agreement=0.95, bytes_match=True)])
    speed = pd.DataFrame([
        dict(model="m", device=device, format=f, batch=1, path=path, real_kernel=Q.EMUL not in path, linear_bytes=b,
             fits_in_cache=fits, speedup=s, bytes_ratio=4e6 / b)
        for f, path, b, s in (("fp32", "FP32 matmul (kernel)", 4e6, 1.0),
                              ("int8", "int8pack_mm (kernel)", 1e6, speedup),
                              ("int4-g128", Q.EMUL, 5e5, 0.3))])
    # the same cache of 256 tokens packed two ways: FP8 1 B a value + a scale per head; NVFP4 0.5 + 1/16 B (+ 4 B);
    # a packer that kept FP32 block scales would store 0.75 B a value
    n = 2 * 4 * 256 * 64
    kv_bytes = pd.DataFrame([dict(format="fp8", bytes=n + 4 * 4, long_context_bytes_per_token=1.0, bytes_match=True),
                             dict(format="nvfp4", bytes=int(n * nvfp4_bytes) + 4, long_context_bytes_per_token=0.5625,
                                  bytes_match=True)])
    kv_quality = pd.DataFrame([dict(format="nvfp4", ppl_delta=nvfp4_ppl, agreement=0.97)])
    return LabResult(lab="quantization", version=1, tables=dict(weights=weights, speed=speed, kv_bytes=kv_bytes,
                                                                kv_quality=kv_quality))


@pytest.mark.parametrize("cid, bad", [
    ("quantization.fp32_identity", dict(fp32_kl=1e-9)),
    ("quantization.bytes_match_formula", dict(match=False)),
    ("quantization.int8_halves_memory", dict(int8_loss=0.05)),
    ("quantization.int4_perplexity", dict(int4_ppl=0.2)),
    ("quantization.speedup_tracks_bytes", dict(speedup=0.6)),
    ("quantization.nvfp4_kv_vs_fp8", dict(nvfp4_bytes=0.75)),
    ("quantization.nvfp4_kv_quality", dict(nvfp4_ppl=0.03)),
])
def test_each_claim_holds_and_fails(cid, bad):
    assert find(L.judge(_result()), cid).holds is True
    assert find(L.judge(_result(**bad)), cid).holds is False


def test_nvfp4_vs_fp8_is_judged_on_the_measured_bytes_not_the_lookup_table():
    claim = find(L.judge(_result(nvfp4_bytes=0.75)), "quantization.nvfp4_kv_vs_fp8")  # the table still says 0.5625
    assert claim.holds is False and claim.measured.startswith("0.74")


@pytest.mark.parametrize("device, fits, words, not_words", [
    ("cpu", True, "fit in the CPU's cache: decode is not bound by DRAM", "GPU"),
    ("cuda", True, "fit in the GPU's L2: decode is not bound by HBM", "CPU"),
    ("cuda", False, "beyond the GPU's L2: fewer bytes from HBM", "CPU"),
])
def test_speed_wording_follows_the_device(device, fits, words, not_words):
    res = _result(device=device, fits=fits, speedup=0.6)
    claims = L.judge(res)
    note = find(claims, "quantization.speedup_tracks_bytes").note
    head = L.headline(res, claims)
    assert words in note and not_words not in note
    assert ("a GPU" if device == "cuda" else "a CPU") in head and not_words not in head


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
    assert L.Config().weights == L.WEIGHT_FORMATS == Q.WEIGHT_FORMATS  # the Config's table is quant's, name by name
    assert ("fp32", *L.KV_FORMATS) == Q.KV_FORMATS and L.Config().kv == L.KV_FORMATS


def test_the_config_and_its_quick_build_without_torch():
    import subprocess
    import sys

    code = ("import sys; from llmlab.labs.quantization.config import Config; Config(); Config.quick(); "
            "sys.exit('torch' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
