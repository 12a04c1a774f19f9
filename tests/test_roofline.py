"""Tests for the roofline lab: byte and FLOP accounting against formulas and HF, the kernels against
references, the knee estimators on synthetic data, and one end-to-end CLI run."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pandas as pd
import pytest
import torch

from llmlab.core import roofs as core_roofs
from llmlab.core.device import Device
from llmlab.labs import roofline as R

CPU = Device("cpu")


def roofs(bw=10.0, peak=100.0, dtype="fp32") -> R.Roofs:
    return R.Roofs(bw, "read", 1, {dtype: peak}, {dtype: "torch"})


# ---------------------------------------------------------------- accounting


def test_gemm_intensity_formula():
    flops, nbytes, ai = R.gemm_intensity(1, 4096, 4096, 4)
    assert flops == 2 * 4096 * 4096
    assert nbytes == 4 * (4096 + 4096 * 4096 + 4096)
    assert ai == pytest.approx(0.5, rel=1e-3)  # a matrix-vector product in FP32: 2 FLOPs per 4-byte weight
    _, _, ai_sq = R.gemm_intensity(1024, 1024, 1024, 2)
    assert ai_sq == pytest.approx(2 * 1024**3 / (2 * 3 * 1024**2))  # n/3 FLOP/byte in BF16


def test_layer_matmuls_match_the_hf_model():
    """The overlay's matmul list covers exactly the model's Linear weights (lm_head tied or not)."""
    from llmlab.core.models import load

    lm = load("tiny", CPU)
    linear = {id(m.weight): m.weight.numel() for m in lm.model.modules() if isinstance(m, torch.nn.Linear)}
    mats = R.layer_matmuls(lm.config)
    assert sum(k * n * c for _, k, n, c in mats) == sum(linear.values())
    cost = R.step_cost(lm.config, batch=1, context=10, elem=4)
    assert cost["weight_bytes"] == 4 * sum(linear.values())
    from llmlab.core.models import kv_bytes_per_token

    assert cost["kv_bytes"] == 10 * kv_bytes_per_token(lm.config, 4)


def test_overlay_from_an_arch_config_allocates_nothing():
    from llmlab.core.models import load_config

    config = load_config("arch:llama-3-8b")
    df = R.overlay_table(config, roofs(bw=3000, peak=700_000, dtype="bf16"), "bf16", 512, (1, 256), 1024)
    dec1 = df[(df["phase"] == "decode") & (df["tokens"] == 1) & (df["op"] != "attention")]
    assert set(dec1["bound"]) == {"memory"}
    assert dec1["intensity"].between(0.99, 1.0).all()  # BF16 GEMV: 2 FLOPs per 2-byte weight
    head = df[(df["phase"] == "prefill") & (df["op"] == "lm_head")].iloc[0]
    assert head["m"] == 1 and head["n"] == 128256  # logits_to_keep=1: the last position only
    pre = df[(df["phase"] == "prefill") & df["op"].isin(["gate_proj", "up_proj", "down_proj"])]
    assert set(pre["bound"]) == {"compute"}  # 512 tokens is far above the ridge of ~230


def test_attention_cost_counts_the_kv_cache_once():
    from llmlab.core.models import kv_bytes_per_token, load_config

    config = load_config("tiny")
    flops, nbytes = R.attention_cost(config, tokens=2, context=100, elem=2, prefill=False)
    assert nbytes > 2 * 100 * kv_bytes_per_token(config, 2)  # 2 sequences x 100 positions of K and V, plus Q and O
    assert nbytes < 2 * 100 * kv_bytes_per_token(config, 2) * 1.05
    assert flops == 4 * config.num_attention_heads * config.head_dim * 2 * 100 * config.num_hidden_layers


# ---------------------------------------------------------------- roofs and knees


def test_roofs_attainable_and_ridge():
    r = roofs(bw=10, peak=100)
    assert r.ridge("fp32") == 10
    assert r.attainable("fp32", 1) == 10 and r.attainable("fp32", 50) == 100


def test_predicted_knee_is_ridge_times_bytes_per_weight_over_two():
    """With a negligible KV cache, decode intensity is ~2B/elem, so the knee is ~ridge x elem / 2."""
    from llmlab.core.models import load_config

    config = load_config("tiny")
    knee = R.predicted_knee(config, roofs(bw=10, peak=200), "fp32", context=1)
    assert knee == pytest.approx(20 * 4 / 2, rel=0.1)
    assert math.isinf(R.predicted_knee(config, roofs(bw=1, peak=10_000), "fp32", context=100_000))


def test_measured_knee_on_a_synthetic_roofline():
    knee_true = 16
    batches = [1, 2, 4, 8, 16, 32, 64, 128]
    ms = [max(10.0, 10.0 * b / knee_true) for b in batches]  # flat, then linear in B
    knee, reached = R.measured_knee(pd.DataFrame({"batch": batches, "median_ms": ms}))
    assert reached and knee == pytest.approx(knee_true)
    knee, reached = R.measured_knee(pd.DataFrame({"batch": [1, 2, 4], "median_ms": [10.0, 10.5, 11.0]}))
    assert not reached


# ---------------------------------------------------------------- kernels


def test_bandwidth_kernels_compute_stream_results_and_count_bytes_once():
    a, b, c = torch.zeros(1000), torch.arange(1000.0), torch.full((1000,), 2.0)
    k = R.bandwidth_kernels(a, b, c)
    assert {name: nb for name, (_, nb) in k.items()} == {"read": 4000, "write": 4000, "copy": 8000, "triad": 12000}
    k["triad"][0]()
    torch.testing.assert_close(a, b + core_roofs.TRIAD_SCALAR * c)
    assert float(k["read"][0]()) == pytest.approx(float(a.sum()))
    k["copy"][0]()
    torch.testing.assert_close(b, a)
    k["write"][0]()
    assert bool((a == 1.0).all())


@pytest.mark.parametrize("backend,dtype", [("torch", "fp32"), ("torch", "bf16"), ("numpy", "fp32")])
def test_matmul_variants_match_fp64(backend, dtype):
    R.check_matmul(backend, dtype, CPU)  # raises on a mismatch


# ---------------------------------------------------------------- core.roofs


class _FakeEvent:
    """A CUDA event stand-in: records which stream it was recorded on; 2 ms between a pair."""

    log: list = []

    def __init__(self, enable_timing=False):
        self.t = None

    def record(self, stream=None):
        _FakeEvent.log.append(stream)
        self.t = len(_FakeEvent.log)

    def synchronize(self):
        pass

    def elapsed_time(self, end):
        return 2.0 * (end.t - self.t)


def test_time_blocks_uses_one_event_pair_per_block_of_calls(monkeypatch):
    """Issue 12 item 15: a fast kernel is timed in blocks of many calls, one event pair per block."""
    calls = []
    stream = object()
    monkeypatch.setattr(torch.cuda, "Event", _FakeEvent)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda dev=None: stream)
    monkeypatch.setattr(Device, "synchronize", lambda self: None)
    _FakeEvent.log = []
    stats, per_block = core_roofs.time_blocks(lambda: calls.append(1), Device("cuda:0"), blocks=4, min_block_s=0.01)
    assert per_block >= 10  # a call of ~us needs many calls to fill 10 ms
    assert len(_FakeEvent.log) == 2 * 4 and all(s is stream for s in _FakeEvent.log)  # 4 blocks, one pair each
    assert len(calls) == 2 + 4 * per_block  # warm-up + probe + the blocks
    assert stats.n == 4 and stats.median_ms == pytest.approx(2.0 / per_block)  # per call, not per block


def test_time_blocks_on_cpu_times_per_call():
    import time

    stats, per_block = core_roofs.time_blocks(lambda: time.sleep(0.002), CPU, blocks=3, min_block_s=0.01)
    assert per_block >= 3 and stats.n == 3
    assert 1.9 <= stats.median_ms <= 6  # ~2 ms per call (sleep overshoots a little on a busy box)


def test_warm_up_runs_for_the_time_asked():
    assert 0.3 <= core_roofs.warm_up(CPU, 0.3) < 3


def test_core_roofs_measure_bandwidth_and_peak_small():
    bufs = core_roofs.Buffers(torch.zeros(1 << 16), torch.ones(1 << 16), torch.ones(1 << 16), "")
    bw = core_roofs.measure_bandwidth(CPU, "triad", bufs=bufs, blocks=3, min_block_s=0.002, threads=1)
    assert bw.bytes_per_call == 3 * 4 * (1 << 16) and bw.threads == 1 and bw.median_GBps > 0
    assert bw.best_GBps >= bw.median_GBps
    torch.testing.assert_close(bufs.a, torch.full((1 << 16,), 4.0))  # 1 + 3 x 1: the triad really ran
    with pytest.raises(ValueError, match="kernel"):
        core_roofs.measure_bandwidth(CPU, "scale", bufs=bufs)
    peak = core_roofs.matmul_peak_gflops(CPU, "fp32", shapes=((128, 128, 128),), repeats=3)
    assert peak > 0
    assert core_roofs.ridge_point(100.0, 10.0) == 10.0
    assert core_roofs.attainable_gflops(1.0, 100.0, 10.0) == 10.0


def test_cache_levels_and_thread_probe():
    from llmlab.core.device import cpu_caches

    caches = cpu_caches()
    if "L1d" in caches:
        assert R.cache_level(caches["L1d"], CPU) == "L1"
    assert R.cache_level(10 * R.last_level_cache_bytes(CPU), CPU) == "DRAM"
    x = torch.randn(256, 256)
    assert R.pick_threads(lambda: x @ x, CPU) in R.thread_counts(CPU)


def test_config_validation():
    with pytest.raises(ValueError, match="dtype"):
        R.Config(dtype="int8")
    with pytest.raises(ValueError, match="at least 3"):
        R.Config(compute_repeats=1)
    with pytest.raises(ValueError):
        R.Config(decode_batches=(0,))
    R.Config.quick()  # valid


# ---------------------------------------------------------------- end to end


def _cli(*args, timeout=240):
    return subprocess.run([sys.executable, "-m", "llmlab", "roofline", *args], capture_output=True, text=True,
                          timeout=timeout, env={**__import__("os").environ, "HF_HUB_OFFLINE": "1"})


def test_cli_quick_json_end_to_end():
    p = _cli("--device", "cpu", "--quick", "--json", "--no-save")
    assert p.returncode == 0, p.stderr[-2000:]
    d = json.loads(p.stdout)
    tables = d["tables"]
    for name in ("bandwidth", "bandwidth_sweep", "compute", "roofs", "intensity_sweep", "overlay", "decode", "roofline_chart"):
        assert tables[name]["rows"], name
    bw = pd.DataFrame(tables["bandwidth"]["rows"], columns=tables["bandwidth"]["columns"])
    assert (bw["median_GBps"] > 0).all() and (bw["best_GBps"] >= bw["median_GBps"] * 0.999).all()
    roofs_df = pd.DataFrame(tables["roofs"]["rows"], columns=tables["roofs"]["columns"])
    ridge = roofs_df[(roofs_df["roof"] == "ridge") & (roofs_df["dtype"] == "fp32")]["measured_median"].iloc[0]
    assert ridge > 0
    sweep = pd.DataFrame(tables["intensity_sweep"]["rows"], columns=tables["intensity_sweep"]["columns"])
    assert sweep["intensity"].is_monotonic_increasing and (sweep["median_gflops"] > 0).all()
    claims = {c["text"]: c for c in d["claims"]}
    batch1 = claims["decode at batch 1 uses under 5% of peak compute here"]
    assert batch1["holds"] in (True, False) and "%" in batch1["measured"]
    assert claims["measured bandwidth is N% of spec"]["holds"] is None  # a CPU has no bandwidth spec
    assert d["charts"] and d["charts"][0]["logx"] and d["charts"][0]["logy"]


@pytest.mark.parametrize("args,needle", [(["--gpu", "0"], "GPU 0"), (["--device", "cpu", "--dtype", "int8"], "dtype")])
def test_cli_bad_input_exits_2_with_one_line(args, needle):
    if args[:2] == ["--gpu", "0"] and torch.cuda.is_available():
        pytest.skip("this machine has a GPU 0")
    p = _cli(*args, "--no-save", timeout=60)
    assert p.returncode == 2
    lines = [ln for ln in p.stderr.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and needle in lines[0] and "Traceback" not in p.stderr


def test_unknown_model_is_a_usage_error_before_any_measuring():
    from llmlab.core.errors import UsageError

    with pytest.raises(UsageError, match="unknown model"):
        R.run(R.Config(model="no-such-model"), CPU)
