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
        tp.launch(lab._worker, 2, (cfg, lab.Plan("gloo", False)), timeout_s=cfg.timeout_s)
    assert exc.value.exit_code == 3
    assert len(tp.LAST_PIDS) == 2
    for pid in tp.LAST_PIDS:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)  # the rank is gone and reaped


@pytest.mark.slow
def test_hung_rank_is_named_at_the_timeout_and_leaves_no_orphan():
    cfg = lab.Config(fault="hang:1", timeout_s=12)  # 2 gloo ranks form their group in ~3-5 s here
    with pytest.raises(MeasurementError, match="timeout-s 12") as exc:
        tp.launch(lab._worker, 2, (cfg, lab.Plan("gloo", False)), timeout_s=cfg.timeout_s)
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


# ---------------------------------------------------------------- judge fixtures (rows shaped as run() writes them)


def _result(diff=1e-6, greedy=True, floor=(100.0, 120.0), link=None, comm=0.6, pred=0.5, aligned=None,
            inter=None) -> LabResult:
    """aligned: the batch-1 step's all-reduce ms with the ranks aligned (default: the predicted ms);
    inter: (busbw plateau GB/s, port spec GB/s) adds the inter-node scope of a torchrun run over 2 nodes."""
    res = LabResult(lab="tensor-parallel", version=2)
    res.add_table("exactness", [dict(tp=2, max_abs_logit_diff=diff, greedy_equal=greedy, tokens=8)])
    sizes, times = [8, 4096, 2**20, 2**24], [floor[0], floor[1], 2000.0, 20000.0]
    scopes = [("world", 1.0)] + ([("inter-node", inter[0] / (2**24 / 20000.0 / 1e3))] if inter else [])
    res.add_table("collectives", [dict(scope=sc, op="all_reduce", ranks=2, size_bytes=s, time_us=t / f,
                                       algbw_GBps=s / t / 1e3 * f, busbw_GBps=s / t / 1e3 * f)
                                  for sc, f in scopes for s, t in zip(sizes, times, strict=True)])
    step, pred_ms = 10.0, 10.0 * pred
    al = pred_ms if aligned is None else aligned
    res.add_table("steps", [dict(tp=2, batch=1, step_ms=step, comm_ms=step * comm, comm_share=comm, allreduces=12,
                                 msg_bytes=1024, aligned_step_ms=step + 1, aligned_comm_ms=al, barrier_ms=1.0,
                                 predicted_comm_ms=pred_ms, predicted_comm_share=pred, aligned_comm_share=al / step,
                                 wait_ms=step * comm - al, wait_share=(step * comm - al) / step, speedup=1.2,
                                 efficiency=0.6)])
    rows = [] if link is None else [dict(rank=r, scope="intra-node", link="NVLink 4 x18 (spec)",
                                         spec_GBps=link * (1 + r))
                                    for r in range(2)]
    rows += [] if inter is None else [dict(rank=0, scope="inter-node", link="InfiniBand 400 Gb/s x8 ports",
                                           spec_GBps=inter[1])]
    if rows:
        res.add_table("link", rows)
    else:
        res.skip("link", "no GPU")
    return res


IDS = ("sharded_logits_equal", "latency_floor", "comm_share_tp2_b1", "allreduce_busbw")


def test_judge_claims_hold():
    claims = lab.judge(_result(link=0.5))  # plateau of the fixture: ~0.84 GB/s busbw (the best of the sweep)
    for cid in IDS:
        assert find(claims, f"tensor_parallel.{cid}").holds is True, cid


def test_judge_claims_fail():
    claims = lab.judge(_result(diff=1e-3, floor=(100.0, 900.0), link=450.0, comm=0.9, pred=0.1, aligned=5.0))
    for cid in IDS:
        assert find(claims, f"tensor_parallel.{cid}").holds is False, cid
    assert find(lab.judge(_result(greedy=False)), "tensor_parallel.sharded_logits_equal").holds is False


def test_busbw_is_judged_against_the_slowest_ranks_link():
    # rank 0's link 1.0 GB/s, rank 1's 2.0: the ring runs at its slowest link, so 0.84 >= 50% of 1.0 holds
    c = find(lab.judge(_result(link=1.0)), "tensor_parallel.allreduce_busbw")
    assert c.holds is True and "of 1 GB/s" in c.expected and "slowest rank" in c.expected
    assert find(lab.judge(_result(link=2.0)), "tensor_parallel.allreduce_busbw").holds is False


def test_comm_claim_judges_the_aligned_all_reduce_not_the_wait():
    # 74% of the step in all-reduce, but 60 of those 74 points are the wait: the aligned all-reduce (1.4 ms) is the
    # prediction
    c = find(lab.judge(_result(comm=0.74, pred=0.14, aligned=1.4)), "tensor_parallel.comm_share_tp2_b1")
    assert c.holds is True and "ranks aligned by a barrier" in c.expected
    assert "60% waiting for the slower rank" in c.measured
    c = find(lab.judge(_result(comm=0.74, pred=0.14, aligned=5.0)), "tensor_parallel.comm_share_tp2_b1")
    assert c.holds is False and "not the whole gap" in c.note
    assert find(lab.judge(_result(pred=0.14, aligned=0.5)), "tensor_parallel.comm_share_tp2_b1").holds is False  # 0.36x


def test_headline_says_how_much_is_the_wait_for_the_slower_rank():
    res = _result(comm=0.74, pred=0.14, aligned=1.4)
    text = lab.headline(res, lab.judge(res))
    assert "74% of its time in 12 all-reduces" in text and "14% in the all-reduces themselves" in text
    assert "60% waiting for the slower rank" in text
    res = _result(comm=0.3, pred=0.3, aligned=3.5)  # noise: the aligned all-reduces took longer than the plain ones
    assert "no measurable wait for the slower rank" in lab.headline(res, lab.judge(res))


def test_internode_claim_holds_and_fails_against_the_port():
    res = _result(link=0.5, inter=(30.0, 50.0))
    claims = lab.judge(res)
    c = find(claims, "tensor_parallel.internode_busbw")
    assert c.holds is True and "InfiniBand" in c.expected
    assert find(lab.judge(_result(link=0.5, inter=(10.0, 50.0))), "tensor_parallel.internode_busbw").holds is False
    assert "internode_busbw" not in {c.id.split(".")[1] for c in lab.judge(_result())}  # one node: no such claim
    c = find(claims, "tensor_parallel.allreduce_busbw")  # across nodes the NVLink claim reads the intra-node scope
    assert c.holds is None and "no intra-node collectives" in c.note


def test_judge_without_a_link_or_tables_says_not_measured():
    c = find(lab.judge(_result()), "tensor_parallel.allreduce_busbw")
    assert c.holds is None and "no GPU" in c.note and "GB/s" in c.measured
    claims = lab.judge(LabResult(lab="tensor-parallel", version=2))  # an interrupted run: nothing measured
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


def test_nccl_without_enough_gpus_and_nccl_without_cuda_exit_2():
    with pytest.raises(UsageError, match="only 2 CUDA GPU"):
        lab.check_ranks(4, "nccl", cuda=True, gpus=2)
    with pytest.raises(UsageError, match="only 1 CUDA GPU.*from cuda:1"):
        lab.check_ranks(2, "nccl", cuda=True, gpus=2, first_gpu=1)  # --gpu 1: ranks on cuda:1 and cuda:2
    with pytest.raises(UsageError, match="needs CUDA"):
        lab.check_ranks(2, "nccl", cuda=False, gpus=0)
    assert lab.check_ranks(2, "auto", cuda=False, gpus=0) == lab.Plan("gloo", False)
    assert lab.check_ranks(2, "auto", cuda=True, gpus=2) == lab.Plan("nccl", True)
    assert lab.check_ranks(2, "auto", cuda=True, gpus=4, first_gpu=2) == lab.Plan("nccl", True, 2)


def test_fewer_gpus_than_ranks_plans_gloo_on_the_cpu_and_says_so():
    plan = lab.check_ranks(2, "auto", cuda=True, gpus=1)
    assert plan.backend == "gloo" and not plan.on_cuda
    assert "only 1 CUDA GPU(s)" in plan.note and "no figure" in plan.note


@pytest.mark.slow
def test_single_gpu_host_runs_the_ranks_on_gloo_and_exits_0(monkeypatch):
    import types

    from llmlab.core import device as devmod

    monkeypatch.setattr(devmod, "cuda_device_count", lambda: 1)  # a 1-GPU host, as make gpu-check meets it
    gpu = types.SimpleNamespace(is_cuda=True, index=0, name="NVIDIA H200")
    cfg = lab.Config(sizes=(8, 4096), batches=(1,), steps=3, context=8, new_tokens=2, point_s=0.01, max_iters=6)
    res = lab.run(cfg, gpu)
    assert not res.interrupted and res.env["tp"]["backend"] == "gloo" and res.env["tp"]["on_gpus"] is False
    assert any("only 1 CUDA GPU(s)" in n for n in res.notes)
    assert "fewer GPUs than ranks" in res.skipped["link"]
    claims = lab.judge(res)
    assert find(claims, "tensor_parallel.sharded_logits_equal").holds is True
    assert find(claims, "tensor_parallel.allreduce_busbw").holds is None
    assert "on gloo over the CPU" in lab.headline(res, claims)
    assert set(res.tables["collectives"].size_bytes) == {8, 4096}  # the CPU sizes: the ranks are on the CPU


def test_gpu_sweep_reaches_1_gib_and_the_cpu_sizes_stay():
    full, quick = lab.Config(), lab.Config.quick()
    # nccl-tests' range; quick well past 64 MiB
    assert max(full.gpu_sizes) == 2**30 and max(quick.gpu_sizes) >= 256 * 2**20
    assert max(full.sizes) == 64 * 2**20 and max(quick.sizes) == 4 * 2**20


def test_tp1_step_pays_the_same_device_syncs_as_tp2(monkeypatch):
    import torch

    from llmlab.core.models import load

    model = load("tiny", "cpu", dtype="float32").model
    calls = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: calls.append(1))
    sh = tp.ShardedLlama(model, 0, 1)
    sh.sync = True  # what a CUDA model sets
    with torch.inference_mode():
        cache = sh.new_cache()
        sh.forward(torch.tensor([[1, 2, 3]]), cache)
        calls.clear()
        sh.forward(torch.tensor([[4]]), cache)
    # TP = n synchronizes before and after each of its 2 x layers all-reduces; TP = 1 must pay the same
    assert len(calls) == 2 * 2 * model.config.num_hidden_layers and sh.comm_calls == 0


# ---------------------------------------------------------------- the link spec


def test_link_spec_tables():
    assert lab.nvlink_spec([4] * 18) == ("NVLink 4 x18", 450.0)  # H100 / H200
    assert lab.nvlink_spec([5] * 18) == ("NVLink 5 x18", 900.0)  # B200: 50 GB/s per link per direction
    assert lab.nvlink_spec([9]) == ("NVLink x1 (generation unknown)", None)  # not in the table: unknown, not a guess
    assert lab.pcie_spec(4, 16) == ("PCIe 4 x16", pytest.approx(31.5, abs=0.1))
    assert lab.pcie_spec(1, 16)[1] == 4.0 and lab.pcie_spec(2, 16)[1] == 8.0  # gen 1-2: numbers, not NaN
    assert lab.pcie_spec(7, 16)[1] is None


class _FakeNvml:
    """pynvml with 2 boards on PCIe (no NVLink); the board torch's cuda:0 is (UUID GPU-b) is NVML's index 1."""

    class NVMLError(Exception):
        pass

    def __init__(self):
        self.by_index = []

    def nvmlInit(self):
        pass

    def nvmlDeviceGetHandleByUUID(self, uuid):
        return {"GPU-b": "board-b"}[uuid]

    def nvmlDeviceGetHandleByIndex(self, i):
        self.by_index.append(i)
        return ["board-a", "board-b"][i]

    def nvmlDeviceGetNvLinkState(self, h, i):
        raise self.NVMLError("Not Supported")

    def nvmlDeviceGetCurrPcieLinkGeneration(self, h):
        return 1  # idle: the link dropped to gen 1

    def nvmlDeviceGetCurrPcieLinkWidth(self, h):
        return 4

    def nvmlDeviceGetMaxPcieLinkGeneration(self, h):
        return {"board-a": 4, "board-b": 5}[h]

    def nvmlDeviceGetMaxPcieLinkWidth(self, h):
        return 16


def test_link_is_read_from_the_ranks_own_gpu_by_uuid_at_its_max_pcie(monkeypatch):
    import sys
    import types

    import torch

    fake = _FakeNvml()
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: types.SimpleNamespace(uuid="b"))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")  # torch's cuda:0 is the second board
    (row,) = lab.gpu_link_rows(0)
    assert row["link"] == "PCIe 5 x16 (spec)" and row["spec_GBps"] == pytest.approx(63.0, abs=0.1)  # board b, max gen
    assert row["nvml"] == "uuid GPU-b" and fake.by_index == []  # never by index


def test_nvlink_spec_follows_the_gpus_architecture(monkeypatch):
    import sys
    import types

    import torch

    fake = _FakeNvml()
    fake.nvmlDeviceGetNvLinkState = lambda h, i: 1  # 18 active links
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: types.SimpleNamespace(uuid="b"))
    # H100/H200, B200, A100 (12 links on a real one)
    for cc, spec in (((9, 0), 450.0), ((10, 0), 900.0), ((8, 0), 450.0)):
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i, cc=cc: cc)
        (row,) = lab.gpu_link_rows(0)
        assert row["spec_GBps"] == spec and row["link"].endswith("x18 (spec)"), (cc, row)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i: (12, 0))  # an architecture not in the table
    assert lab.gpu_link_rows(0)[0]["spec_GBps"] is None


def test_nic_row_reads_the_port_rate_from_sysfs(tmp_path):
    port = tmp_path / "class/infiniband/mlx5_0/ports/1"
    port.mkdir(parents=True)
    (port / "rate").write_text("400 Gb/sec (4X NDR)\n")
    assert lab.nic_row(str(tmp_path)) == dict(scope="inter-node", link="InfiniBand 400 Gb/s x1 ports (spec per port)",
                                              spec_GBps=50.0)
    eth = tmp_path / "e"
    for name, speed in (("lo", "100000"), ("eth0", "25000"), ("eth1", "-1")):
        (eth / "class/net" / name).mkdir(parents=True)
        (eth / "class/net" / name / "speed").write_text(speed)
    assert lab.nic_row(str(eth))["spec_GBps"] == pytest.approx(3.125)  # 25 Gb/s; loopback and a down link ignored
    assert lab.nic_row(str(tmp_path / "none"))["spec_GBps"] is None


# ---------------------------------------------------------------- torchrun across nodes


@pytest.mark.slow
def test_torchrun_over_two_nodes_measures_the_inter_node_hop(tmp_path):
    import json
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    torchrun = Path(sys.executable).parent / "torchrun"
    if not torchrun.exists() and not shutil.which("torchrun"):
        pytest.skip("no torchrun")
    port = tp.free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        env.pop(k, None)
    # two "nodes" of one gloo rank each on this host: static rendezvous (env://), one torchrun per node
    procs = [subprocess.Popen([str(torchrun), "--nnodes", "2", "--nproc-per-node", "1", "--node-rank", str(n),
                               "--master-addr", "127.0.0.1", "--master-port", str(port), "-m", "llmlab",
                               "tensor-parallel",
                               "--quick", "--device", "cpu", "--json", "--no-save"], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for n in (0, 1)]
    outs = [p.communicate(timeout=400) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs[0][1][-2000:] + outs[1][1][-2000:]
    assert outs[1][0].strip() == ""  # rank 1 neither renders nor saves
    data = json.loads(outs[0][0])
    assert data["env"]["tp"]["nodes"] == 2 and data["env"]["tp"]["ranks_per_node"] == 1
    coll = data["tables"]["collectives"]
    scopes = {row[coll["columns"].index("scope")] for row in coll["rows"]}
    assert scopes == {"world", "inter-node"}  # one rank per node: no intra-node hop
    claims = {c["id"]: c for c in data["claims"]}
    assert claims["tensor_parallel.sharded_logits_equal"]["holds"] is True
    assert claims["tensor_parallel.internode_busbw"]["holds"] is None  # gloo on the CPU: no link spec
    assert any("torchrun" in n for n in data["notes"])


def test_head_count_not_divisible_names_the_sizes_that_divide():
    with pytest.raises(UsageError, match="sizes that divide: 2$") as exc:
        lab.check_heads(4, 2, 3)
    assert exc.value.exit_code == 2 and "TP 3" in str(exc.value)
    lab.check_heads(4, 2, 2, 768)  # tiny at TP 2: fine
    with pytest.raises(UsageError, match="MLP columns: TP sizes that divide: 2, 4$"):
        lab.check_heads(8, 4, 8, 20)
    assert tp.divisible_sizes(64, 8) == [2, 4, 8]  # Llama-3.1-70B
