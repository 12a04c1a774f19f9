"""Tests for the gpu-parallelism lab: the reference implementations, the crossover and scaling logic,
the thread-count restore, config validation, an in-process run, and the CLI end to end."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from llmlab.core.device import resolve_device
from llmlab.labs import gpu_parallelism as gp


def test_python_loops_match_torch():
    g = torch.Generator().manual_seed(0)
    a, b, c = (torch.randn(257, generator=g, dtype=torch.float64) for _ in range(3))
    assert torch.allclose(torch.tensor(gp.fma_py(a.tolist(), b.tolist(), c.tolist()), dtype=torch.float64), a * b + c)
    assert gp.sum_py(a.tolist()) == pytest.approx(float(a.sum()), rel=1e-12)
    m, n = torch.randn(7, 5, generator=g, dtype=torch.float64), torch.randn(5, 3, generator=g, dtype=torch.float64)
    assert torch.allclose(torch.tensor(gp.matmul_py(m.tolist(), n.tolist()), dtype=torch.float64), m @ n)


def test_work_counts_follow_the_formulas():
    assert gp.work_counts("elementwise", 10) == {"elements": 10, "flops": 20, "bytes": 160, "py_ops": 10}
    assert gp.work_counts("reduction", 10) == {"elements": 10, "flops": 10, "bytes": 40, "py_ops": 10}
    assert gp.work_counts("matmul", 4) == {"elements": 16, "flops": 128, "bytes": 192, "py_ops": 64}


def test_conv1_im2col_reference_and_flops():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 3, 227, 227, generator=g)
    w = torch.randn(96, 3, 11, 11, generator=g)
    ref = gp.conv1_im2col(x, w, 4)
    assert ref.shape == (2, 96, 55, 55)
    assert gp.rel_err(F.conv2d(x, w, stride=4), ref) < 1e-5
    assert gp.conv1_flops(1) == 2 * 96 * 55 * 55 * 3 * 11 * 11 == 210_830_400


def test_crossover_is_where_the_gpu_wins_for_good():
    cpu = {1: 1.0, 10: 2.0, 100: 10.0, 1000: 100.0}
    assert gp.crossover({1: 5.0, 10: 5.0, 100: 5.0, 1000: 5.0}, cpu) == 100
    assert gp.crossover({1: 0.5, 10: 3.0, 100: 5.0, 1000: 5.0}, cpu) == 100  # an early fluke win does not count
    assert gp.crossover({1: 0.5, 10: 1.0, 100: 5.0, 1000: 5.0}, cpu) == 1
    assert gp.crossover({s: 2 * v for s, v in cpu.items()}, cpu) is None


def test_thread_counts_and_scaling_rows():
    assert gp.thread_counts(1) == (1,)
    assert gp.thread_counts(2) == (1, 2)
    assert gp.thread_counts(6) == (1, 2, 4, 6)
    rows = gp.scaling_rows([{"work": "matmul", "threads": 1, "median_ms": 10.0}, {"work": "matmul", "threads": 2, "median_ms": 6.0}])
    two = next(r for r in rows if r["work"] == "matmul" and r["threads"] == 2)
    assert two["speedup"] == pytest.approx(10 / 6) and two["efficiency_pct"] == pytest.approx(100 * 10 / 12)
    assert [r["speedup"] for r in rows if r["work"] == "ideal"] == [1.0, 2.0]


def test_torch_threads_restores_even_on_error():
    before = torch.get_num_threads()
    with pytest.raises(RuntimeError):
        with gp.torch_threads(1):
            assert torch.get_num_threads() == 1
            raise RuntimeError("boom")
    assert torch.get_num_threads() == before


def test_time_interleaved_gives_one_stats_per_fn():
    cpu = resolve_device("cpu")
    a = torch.randn(64, 64)
    fast, slow = gp.time_interleaved([lambda: a + 1, lambda: a @ a @ a @ a], cpu, 0.02)
    assert fast.n >= 3 and slow.n >= 3 and fast.p10_ms <= fast.median_ms <= fast.p90_ms


@pytest.mark.parametrize("bad", [dict(parts=("nope",)), dict(parts=()), dict(sizes=(0,)), dict(conv_batch=0), dict(max_threads=10_000), dict(budget_s=0)])
def test_config_rejects_bad_values(bad):
    with pytest.raises(ValueError):
        dataclasses.replace(gp.Config.quick(), **bad)


def test_run_on_cpu_measures_cpu_and_marks_gpu_not_measured():
    cfg = dataclasses.replace(
        gp.Config.quick(), sizes=(1000, 100_000), matmul_ns=(16, 64), python_max_ops=5000, budget_s=0.01,
        tc_n_cpu=128, launch_count=16, conv_batch=1, parts=("sizes", "waves", "tensor-cores", "launch", "alexnet", "copies"),
    )
    threads, knobs = torch.get_num_threads(), {k: getattr(o, a) for k, (o, a, _, _) in gp._tf32_knobs().items()}
    res = gp.run(cfg, resolve_device("cpu"))
    assert torch.get_num_threads() == threads and knobs == {k: getattr(o, a) for k, (o, a, _, _) in gp._tf32_knobs().items()}
    el = res.tables["throughput_elementwise"]
    assert {"python loop", "cpu 1 thread"} <= set(el.way) and el.ok.all() and (el.median_ms > 0).all()
    assert not any(t.astype(str).apply(lambda col: col.str.contains("gpu|cuda")).any().any() for t in res.tables.values())  # no GPU figure anywhere
    assert set(res.tables) == {"throughput_elementwise", "throughput_reduction", "throughput_matmul", "thread_scaling", "tensor_cores", "launch_overhead", "alexnet_conv1"}
    gpu_claims = [c for c in res.claims if c.holds is None]
    assert gpu_claims and all(c.note.startswith("not measured") and c.measured == "-" for c in gpu_claims)
    measured = [c for c in res.claims if c.holds is not None]
    assert any("Python loop" in c.text for c in measured) and any("bmm" in c.text for c in measured) and any("BF16" in c.text for c in measured)
    assert res.tables["alexnet_conv1"].ok.all() and res.tables["launch_overhead"].ok.all()


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "llmlab", "gpu-parallelism", *args], capture_output=True, text=True, timeout=180)


def test_cli_quick_json_end_to_end():
    p = _cli("--device", "cpu", "--quick", "--json", "--no-save")
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    assert d["lab"] == "gpu-parallelism" and d["env"]["quick"] is True
    for name in ("throughput_elementwise", "throughput_matmul", "thread_scaling", "tensor_cores", "launch_overhead", "alexnet_conv1"):
        t = d["tables"][name]
        col = t["columns"].index("median_ms")
        assert t["rows"] and all(r[col] is None or r[col] > 0 for r in t["rows"])
    verdicts = {c["verdict"] for c in d["claims"]}
    assert "not measured" in verdicts and verdicts & {"holds", "does not hold"}
    assert all(c["measured"] != "-" for c in d["claims"] if c["verdict"] != "not measured")


@pytest.mark.parametrize("args", [("--only", "nope"), ("--conv-batch", "0"), ("--device", "cuda:7")])
def test_cli_bad_input_exits_2_with_one_line(args):
    p = _cli(*args, "--no-save")
    assert p.returncode == 2
    assert len(p.stderr.strip().splitlines()) == 1 and "Traceback" not in p.stderr


@dataclasses.dataclass(frozen=True)
class _StandInGpu(gp.Device):
    """A 'GPU' that is really the CPU: runs the lab's GPU code paths here (no real GPU figure comes out of it)."""

    name = "stand-in GPU"

    @property
    def is_cuda(self) -> bool:
        return True

    @property
    def index(self) -> int:
        return 0

    @property
    def torch(self):
        return torch.device("cpu")

    def synchronize(self) -> None:
        pass


def test_gpu_code_paths_run_with_a_stand_in_device(monkeypatch):
    from types import SimpleNamespace

    from llmlab.core import timing

    cpu = resolve_device("cpu")
    monkeypatch.setattr(gp, "measure", lambda fn, device, **kw: timing.measure(fn, cpu, **kw))
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: SimpleNamespace(multi_processor_count=2))
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda self: self)
    cfg = dataclasses.replace(
        gp.Config.quick(), sizes=(1000, 10_000), matmul_ns=(16, 32), python_max_ops=1000, budget_s=0.005, tc_n_cpu=64, tc_n_gpu=64,
        wave_k=32, wave_max_waves=2, wave_step=64, launch_count=8, conv_batch=1, copy_sizes_mb=(1,),
    )
    knobs = {k: getattr(o, a) for k, (o, a, _, _) in gp._tf32_knobs().items()}
    res = gp.run(cfg, _StandInGpu("cuda:0"))
    assert {"wave_quantization", "copy_bandwidth"} <= set(res.tables)
    for w in gp.WORKS:
        t = res.tables[f"throughput_{w}"]
        assert {"gpu", "gpu + copies"} <= set(t.way) and t.ok.all()
    assert set(res.tables["tensor_cores"].dtype) == {"fp32", "tf32", "bf16", "fp16"}
    assert len(res.tables["alexnet_conv1"]) == 2 and res.tables["alexnet_conv1"].ok.all()
    assert set(res.tables["copy_bandwidth"].memory) == {"pinned", "pageable"}
    assert all(c.holds is not None for c in res.claims), [c.text for c in res.claims if c.holds is None]
    assert knobs == {k: getattr(o, a) for k, (o, a, _, _) in gp._tf32_knobs().items()}  # TF32 settings restored
