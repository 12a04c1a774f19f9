"""Core: device resolution, timing statistics, results round trip and atomic save, rendering."""

from __future__ import annotations

import json
import os
import statistics

import numpy as np
import pandas as pd
import pytest
from rich.console import Console

from llmlab.core import device as devmod
from llmlab.core.device import Device, resolve_device
from llmlab.core.errors import UsageError
from llmlab.core.render import chart_text, fmt, render
from llmlab.core.results import Chart, Claim, LabResult, atomic_write, check_writable
from llmlab.core.specs import gpu_spec, peak_for
from llmlab.core.stats import summary
from llmlab.core.timing import LATENCY, THROUGHPUT, Stopwatch, autorange, measure

CPU = Device("cpu")


# ---------------------------------------------------------------- device


@pytest.mark.parametrize("n_gpus", [0, 1, 2])
def test_resolve_device(monkeypatch, n_gpus):
    monkeypatch.setattr(devmod, "cuda_device_count", lambda: n_gpus)
    assert resolve_device("cpu") == Device("cpu")
    assert resolve_device("auto") == (Device("cuda:0") if n_gpus else Device("cpu"))
    for i in range(n_gpus):
        assert resolve_device("auto", gpu=i) == Device(f"cuda:{i}")
        assert resolve_device(f"cuda:{i}") == Device(f"cuda:{i}")
    with pytest.raises(UsageError, match="available: cpu"):
        resolve_device("auto", gpu=n_gpus)  # one past the last GPU
    with pytest.raises(UsageError, match="not available"):
        resolve_device("auto", gpu=-1)
    with pytest.raises(UsageError, match="unknown device 'tpu'"):
        resolve_device("tpu")
    if n_gpus == 0:
        with pytest.raises(UsageError, match="CUDA is not available"):
            resolve_device("cuda")
    else:
        assert resolve_device("cuda") == Device("cuda:0")


def test_gpu_flag_contradicting_device_is_refused(monkeypatch):
    monkeypatch.setattr(devmod, "cuda_device_count", lambda: 2)
    with pytest.raises(UsageError, match="contradicts"):
        resolve_device("cpu", gpu=1)


def test_device_card_cpu_has_the_fields():
    card = devmod.device_card(CPU)
    cpu = card["cpu"]
    assert cpu["logical"] >= 1 and cpu["physical"] >= 1
    assert set(cpu["isa"]) >= {"avx2", "avx512f", "amx_bf16"}
    assert card["versions"]["torch"] != "not installed"
    assert card["versions"]["transformers"] != "not installed"
    assert CPU.slug().startswith("cpu")


def test_gpu_spec_matching():
    assert gpu_spec("NVIDIA H100 80GB HBM3").bandwidth_GBps == 3350
    assert gpu_spec("NVIDIA H100 PCIe").name == "H100 PCIe"
    assert gpu_spec("NVIDIA H200").bandwidth_GBps == 4800
    assert gpu_spec("NVIDIA A100-SXM4-80GB").name == "A100 80GB SXM"
    assert gpu_spec("NVIDIA GeForce RTX 4090").note.startswith("GeForce")
    assert gpu_spec("Tesla T4").bf16_tflops is None
    assert gpu_spec("Some Unknown GPU") is None
    g, how = peak_for(CPU, "fp32")
    assert (g is None) == how.startswith("unknown")


# ---------------------------------------------------------------- timing


def test_summary_matches_numpy():
    rng = np.random.default_rng(0)
    xs = list(rng.exponential(size=101))
    s = summary(xs)
    assert s.n == 101
    assert s.median == pytest.approx(statistics.median(xs))
    assert s.p10 == pytest.approx(np.quantile(xs, 0.1))
    assert s.p90 == pytest.approx(np.quantile(xs, 0.9))
    assert s.min == min(xs) and s.max == max(xs)
    assert s.min <= s.p10 <= s.median <= s.p90 <= s.max
    assert summary([2.0]).p90 == 2.0
    with pytest.raises(ValueError):
        summary([])


def test_measure_times_real_work():
    import time

    calls = []

    def fn():
        calls.append(1)
        time.sleep(0.002)

    s = measure(fn, CPU, mode=LATENCY, warmup=2, repeats=5)
    assert len(calls) == 7 and s.n == 5
    assert 1.9 <= s.min < 50  # a 2 ms sleep is at least 2 ms


def test_measure_setup_is_outside_the_timed_region():
    import time

    s = measure(lambda: None, CPU, mode=LATENCY, warmup=1, repeats=4, setup=lambda: time.sleep(0.01))
    assert s.median < 5


def test_measure_throughput_times_blocks_of_calls_per_call():
    import time

    calls = []

    def fn():
        calls.append(1)
        time.sleep(0.002)

    s = measure(fn, CPU, mode=THROUGHPUT, warmup=1, repeats=3, min_block_s=0.01)
    per_block = (len(calls) - 1 - 1) // 3  # warm-up and probe, then 3 blocks
    assert per_block >= 4 and len(calls) == 2 + 3 * per_block and s.n == 3
    assert 1.9 <= s.min < 50  # per call (~2 ms), not per block (>= 10 ms)
    s = measure(fn, CPU, mode=THROUGHPUT, warmup=0, repeats=2, calls=3)
    assert s.n == 2 and 1.9 <= s.min < 50


def test_measure_asks_for_a_mode():
    import pytest

    with pytest.raises(TypeError):
        measure(lambda: None, CPU, warmup=0, repeats=3)  # no default: a lab says which row it means
    with pytest.raises(ValueError, match="mode"):
        measure(lambda: None, CPU, mode="fast", warmup=0, repeats=3)


def test_autorange_uses_torch_benchmark():
    import torch

    a = torch.randn(64, 64)
    s = autorange(lambda: a @ a, CPU, min_run_time=0.05)
    assert s.n >= 1 and 0 < s.median < 100


def test_stopwatch_phases_add_up():
    import time

    sw = Stopwatch()
    with sw.phase("a"):
        time.sleep(0.003)
    with sw.phase("b"):
        time.sleep(0.001)
    assert set(sw.phases_ms) == {"a", "b"}
    assert sw.phases_ms["a"] >= 2.9 and sw.phases_ms["b"] >= 0.9


# ---------------------------------------------------------------- results


def _result() -> LabResult:
    res = LabResult(lab="demo", version=3, config={"sizes": [1, 2]}, env={"utc_stamp": "20260101T000000Z"})
    res.add_table(
        "t", [{"size": 1, "latency_ms": 0.5, "name": "a"}, {"size": 2, "latency_ms": float("nan"), "name": "b"}]
    )
    res.claims = [Claim("demo.x", "x holds", "about 2", "2.1", True, "note"),
                  Claim("demo.y", "y", "-", "-", None, "not measured: no GPU")]
    res.skip("gpu_part", "no GPU")
    res.note("hello")
    return res


def test_json_round_trip():
    res = _result()
    text = res.to_json()
    d = json.loads(text)  # strict JSON: NaN became null
    assert d["schema_version"] == 2 and d["tables"]["t"]["rows"][1][1] is None
    back = LabResult.from_json(text)
    assert back.lab == "demo" and back.version == 3
    assert back.claims[0].holds is True and back.claims[1].holds is None
    assert back.claims[1].verdict == "not measured"
    assert list(back.tables["t"].columns) == ["size", "latency_ms", "name"]
    assert back.tables["t"]["latency_ms"].iloc[0] == 0.5
    assert back.claims[0].id == "demo.x" and back.notes == ["hello"] and back.skipped == {"gpu_part": "no GPU"}


def test_json_rejects_other_schema():
    d = json.loads(_result().to_json())
    d["schema_version"] = 99
    with pytest.raises(ValueError):
        LabResult.from_dict(d)


def test_save_writes_json_and_csvs(tmp_path):
    path = _result().save(tmp_path, "cpu-test")
    assert path == tmp_path / "demo" / "20260101T000000Z-cpu-test.json"
    assert LabResult.from_json(path.read_text()).lab == "demo"
    csv = pd.read_csv(tmp_path / "demo" / "20260101T000000Z-cpu-test.t.csv")
    assert list(csv["size"]) == [1, 2]
    assert not [p for p in (tmp_path / "demo").iterdir() if p.name.endswith(".tmp")]


def test_atomic_write_leaves_old_file_on_failure(tmp_path, monkeypatch):
    target = tmp_path / "f.json"
    atomic_write(target, "old")

    def boom(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError):
        atomic_write(target, "new")
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["f.json"]  # no temp file left behind


def test_check_writable(tmp_path):
    check_writable(tmp_path / "new")  # created
    assert (tmp_path / "new").is_dir()
    with pytest.raises(UsageError, match="parent folder"):
        check_writable(tmp_path / "missing" / "deeper")
    with pytest.raises(UsageError):
        check_writable("/proc/llmlab-results")  # /proc refuses new folders even to root
    (tmp_path / "file").write_text("x")
    with pytest.raises(UsageError, match="not a folder"):
        check_writable(tmp_path / "file")


def test_guard_turns_ctrl_c_into_partial_result():
    res = LabResult(lab="demo", version=1)
    with res.guard():
        res.add_table("done", [{"a": 1}])
        raise KeyboardInterrupt
    assert res.interrupted and "done" in res.tables


# ---------------------------------------------------------------- render


def test_render_without_tty_is_plain_text():
    console = Console(file=__import__("io").StringIO(), force_terminal=False, width=100)
    render(_result(), console)
    text = console.file.getvalue()
    assert "\x1b[" not in text
    assert "latency_ms" in text and "holds" in text and "not measured" in text and "hello" in text


@pytest.mark.parametrize("kind", ["line", "scatter", "bar", "stacked"])
def test_charts_draw(kind):
    res = LabResult(lab="demo", version=1)
    res.add_table(
        "t", pd.DataFrame({"x": [1, 10, 100], "a_ms": [1.0, 2.0, 3.0], "b_ms": [0.5, 0.5, 1.0], "s": ["p", "p", "q"]})
    )
    y = ["a_ms", "b_ms"] if kind == "stacked" else "a_ms"
    out = chart_text(
        res,
        Chart("title here", "t", "x", y, kind=kind, series="s" if kind == "line" else None, logx=kind == "line"),
        60,
        15,
        color=False,
    )
    assert "title here" in out and "\x1b[" not in out
    assert len(out.splitlines()) >= 10


def test_fmt():
    assert fmt(1234567) == "1,234,567"
    assert fmt(0.000012) == "1.200e-05"
    assert fmt(3.14159) == "3.142"
    assert fmt(None) == "-" and fmt(float("nan")) == "-" and fmt(True) == "yes"


# ---------------------------------------------------------------- one interleaved timer, one stats module


def test_interleaved_first_pass_then_alternating_rounds():
    import time

    from llmlab.core.timing import interleaved

    log: list[str] = []

    def method(name, out):
        def fn():
            log.append(name)
            return out
        return fn

    res = interleaved({"a": method("a", 1), "b": method("b", 2), "c": method("c", 3)}, 4, CPU,
                      first={"a": method("a*", "A"), "b": method("b*", "B"), "c": method("c*", "C")},
                      setups={"b": lambda: (log.append("setup-b"), time.sleep(0.02))})
    assert res.outputs == {"a": "A", "b": "B", "c": "C"}  # the untimed first pass's return values
    calls = [x for x in log if x != "setup-b"]
    assert calls[:3] == ["a*", "b*", "c*"]
    assert calls[3:] == ["a", "b", "c", "c", "b", "a", "a", "b", "c", "c", "b", "a"]  # order flips each round
    assert log.count("setup-b") == 5 and all(log[i + 1] in ("b", "b*") for i, x in enumerate(log) if x == "setup-b")
    assert {k: len(v) for k, v in res.seconds.items()} == {"a": 4, "b": 4, "c": 4}
    assert max(res.seconds["b"]) < 0.015  # the 20 ms setup is outside the timed region
    outputs, seconds = res  # unpacks like the labs' old helpers
    assert outputs is res.outputs and seconds is res.seconds


def test_interleaved_times_real_work_and_pairs_ratios():
    import time

    from llmlab.core.timing import interleaved

    res = interleaved({"slow": lambda: time.sleep(0.02), "fast": lambda: time.sleep(0.001)}, 5, CPU)
    assert all(s >= 0.0199 for s in res.seconds["slow"])  # a 20 ms sleep is at least 20 ms
    assert res.stats("slow").n == 5 and res.stats("slow").median >= 19.9
    ratios = res.ratios("slow", "fast")
    assert len(ratios) == 5 and statistics.median(ratios) > 2  # 20 ms vs 1 ms (+ a busy box's oversleep)


def test_interleaved_budget_stops_early_but_keeps_min_rounds():
    import time

    from llmlab.core.timing import interleaved

    seen = []
    res = interleaved({"x": lambda: time.sleep(0.005)}, 1000, CPU, max_time_s=0.001, min_rounds=3,
                      rounds=lambda it: (seen.append(r) or r for r in it))
    assert len(res.seconds["x"]) == 3 and seen == [0, 1, 2]
    with pytest.raises(ValueError, match="repeats"):
        interleaved({"x": lambda: None}, 0, CPU)


def test_stats_chisquare_passes_the_law_and_fails_a_skewed_one():
    from scipy import stats as sps

    from llmlab.core import stats

    law = {0: 0.5, 1: 0.3, 2: 0.2}
    p, cells = stats.chisquare_pvalue({0: 500, 1: 300, 2: 200}, law, 1000)
    assert p == pytest.approx(1.0) and cells == 3
    p, _ = stats.chisquare_pvalue({0: 400, 1: 350, 2: 250}, law, 1000)
    assert p == pytest.approx(sps.chisquare([400, 350, 250], [500, 300, 200]).pvalue) and p < stats.SIGNIFICANCE
    # rare cells pool, and an outcome outside the support lands in the pool: 7 observed where 1 is expected
    p, cells = stats.chisquare_pvalue({0: 500, 1: 493, "impossible": 7}, {0: 0.5, 1: 0.499, 2: 0.001}, 1000)
    assert cells == 3 and p < stats.SIGNIFICANCE


def test_stats_power_helpers_agree():
    from llmlab.core import stats

    n = stats.samples_for_effect(cells=10, w=0.1)
    assert stats.detectable_effect(10, n) <= 0.1 + 1e-9
    assert stats.power(10, n, 0.1) >= 0.8 > stats.power(10, n // 2, 0.1)
    assert stats.cohens_w({0: 0.6, 1: 0.4}, {0: 0.5, 1: 0.5}) == pytest.approx(0.2)
    s = stats.summary([3.0, 1.0, 2.0])
    assert (s.median, s.min, s.max, s.n) == (2.0, 1.0, 3.0, 3)
    assert s.as_dict("tokens_per_s_")["tokens_per_s_median"] == 2.0


def test_speculative_keeps_reexports_of_core_stats():
    from llmlab.core import stats
    from llmlab.inference import speculative as S

    assert S.chisquare_pvalue is stats.chisquare_pvalue and S.SIGNIFICANCE == stats.SIGNIFICANCE
    assert S.detectable_effect is stats.detectable_effect and S.samples_for_effect is stats.samples_for_effect


def test_models_shape_reads_head_dim_and_kv_heads():
    from llmlab.core.flops import shape

    entry = dict(layers=2, hidden=128, heads=4, kv_heads=2, intermediate=256, vocab=100, model_type="llama")
    assert shape(entry)["head_dim"] == 32 and shape(entry)["kv_heads"] == 2
