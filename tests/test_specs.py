"""Spec-sheet lookup: one name per row, MIG, the CPU clock a spec uses."""

from __future__ import annotations

import pytest

from llmlab.core import device as devmod
from llmlab.core import specs
from llmlab.core.device import Device


@pytest.mark.parametrize("name, row", [
    ("NVIDIA L40", "L40"),  # was the L4 row (substring "L4")
    ("NVIDIA L40S", "L40S"),
    ("NVIDIA L4", "L4"),
    ("NVIDIA GH200 480GB", "GH200 96GB HBM3"),  # was the H200 row (substring "H200")
    ("NVIDIA GH200 144G HBM3e", "GH200 144GB HBM3e"),
    ("NVIDIA H200", "H200 SXM"),
    ("NVIDIA H200 NVL", "H200 NVL"),  # was SXM figures
    ("NVIDIA H100 NVL", "H100 NVL"),  # was SXM figures
    ("NVIDIA H100 PCIe", "H100 PCIe"),
    ("NVIDIA H100 80GB HBM3", "H100 SXM"),
    ("NVIDIA A100-SXM4-80GB", "A100 80GB SXM"),
    ("NVIDIA A100 80GB PCIe", "A100 80GB PCIe"),
    ("NVIDIA A100-PCIE-40GB", "A100 40GB"),
    ("NVIDIA A10", "A10"),
    ("Tesla T4", "T4"),
    ("NVIDIA GeForce RTX 4090", "RTX 4090"),
    ("NVIDIA GeForce RTX 3090", "RTX 3090"),
    ("NVIDIA GeForce RTX 4080", "RTX 4080"),
    ("NVIDIA GeForce RTX 4070", "RTX 4070"),
    ("NVIDIA GeForce RTX 5090", "RTX 5090"),
    ("NVIDIA RTX 6000 Ada Generation", "RTX 6000 Ada"),
    ("NVIDIA RTX A6000", "RTX A6000"),
    ("NVIDIA A40", "A40"),
    ("NVIDIA A30", "A30"),  # not the A10 / A100 rows
    ("NVIDIA H800", "H800 SXM"),  # not the H100 rows, whose bandwidth differs for the PCIe card
    ("NVIDIA H800 PCIe", "H800 PCIe"),
    ("NVIDIA B200", "B200"),
])
def test_spec_name_matches_its_own_row(name, row):
    assert specs.gpu_spec(name).name == row


@pytest.mark.parametrize("name", [
    "NVIDIA A10G",  # not an A10: a different board, not in the table
    "NVIDIA GeForce RTX 3090 Ti",
    "NVIDIA GeForce RTX 4090 Laptop GPU",
    "NVIDIA GeForce RTX 4080 SUPER",  # a different board (more SMs): not the 4080's row
    "NVIDIA GeForce RTX 4070 Ti",
    "NVIDIA GeForce RTX 4070 Laptop GPU",
    "Quadro RTX 6000",  # Turing, not the RTX 6000 Ada
    "NVIDIA RTX A4000",  # not the A40
    "NVIDIA GB200",  # the Grace-Blackwell superchip, not the B200 board
    "Some Unknown GPU",
])
def test_spec_name_not_in_table_is_unknown(name):
    spec, how = specs.gpu_spec_match(name)
    assert spec is None and how.startswith("unknown") and "not in the spec table" in how


def test_every_row_is_found_by_its_own_name():
    # each row's name, as torch prints it ("NVIDIA " + the board), finds that row and not an earlier one
    for _, spec in specs.GPU_SPECS:
        board = (
            spec.name.replace(" SXM", "").replace("GH200 96GB HBM3", "GH200").replace("GH200 144GB HBM3e", "GH200 144G")
        )
        board = board.replace("A100 40GB", "A100-PCIE-40GB")
        assert specs.gpu_spec(f"NVIDIA {board}").name == spec.name, spec.name


def test_new_rows_hold_their_datasheet_figures():
    b200, h800, a30 = specs.gpu_spec("NVIDIA B200"), specs.gpu_spec("NVIDIA H800"), specs.gpu_spec("NVIDIA A30")
    assert (b200.bf16_tflops, b200.bandwidth_GBps) == (2250.0, 8000)  # HGX B200: 4.5 PFLOPS sparse BF16 per GPU
    assert (h800.bf16_tflops, h800.bandwidth_GBps) == (989.4, 3350)  # H100 SXM's compute at 3.35 TB/s
    assert (a30.bf16_tflops, a30.fp32_tflops, a30.bandwidth_GBps) == (165.0, 10.3, 933)
    for name in ("NVIDIA GeForce RTX 4080", "NVIDIA GeForce RTX 4070", "NVIDIA GeForce RTX 5090"):
        g = specs.gpu_spec(name)  # GeForce: FP32-accumulate tensor rate = 2 x TF32 = 2 x FP32 (CUDA cores)
        assert g.bf16_tflops == pytest.approx(2 * g.tf32_tflops, rel=0.01) and "GeForce" in g.note


def test_spec_nvl_boards_get_their_own_figures():
    assert specs.gpu_spec("NVIDIA H100 NVL").bandwidth_GBps == 3900
    assert specs.gpu_spec("NVIDIA H200 NVL").bf16_tflops < specs.gpu_spec("NVIDIA H200").bf16_tflops


def test_spec_mig_slice_is_unknown(monkeypatch):
    name = "NVIDIA H100 80GB HBM3 MIG 1g.10gb"
    assert specs.gpu_spec(name) is None
    dev = Device("cuda:0")
    monkeypatch.setattr(Device, "name", name)  # a cached_property: a plain class attribute stands in
    peak, how = specs.peak_for(dev, "bf16")
    bw, bw_how = specs.bandwidth_spec_GBps(dev)
    assert peak is None and bw is None and "MIG slice" in how and "MIG slice" in bw_how


# ---------------------------------------------------------------- item 11: the CPU clock behind "% of spec"


def _clocks(monkeypatch, tmp_path, cpufreq_khz=None, lscpu_mhz=None, cpuinfo_mhz="2000.000"):
    f = tmp_path / "cpuinfo_max_freq"
    f.unlink(missing_ok=True)
    if cpufreq_khz is not None:
        f.write_text(f"{cpufreq_khz}\n")
    monkeypatch.setattr(devmod, "_CPUFREQ_MAX", f)
    monkeypatch.setattr(devmod, "_lscpu_max_mhz", lambda: lscpu_mhz)
    monkeypatch.setattr(
        devmod, "_cpuinfo", lambda: {"cpu MHz": cpuinfo_mhz, "model name": "Test CPU", "flags": "avx2 fma"}
    )
    monkeypatch.setattr(specs, "cpu_cores", lambda: {"logical": 2, "physical": 2})


def test_cpu_spec_uses_max_boost_clock_from_lscpu(monkeypatch, tmp_path):
    _clocks(monkeypatch, tmp_path, lscpu_mhz=3500.0)
    peak = specs.cpu_peak()
    assert peak.fp32_gflops == pytest.approx(2 * 3.5 * 32)  # not 2 x 2.0 GHz (the base clock) x 32
    assert "max boost clock (lscpu" in peak.how


def test_cpu_spec_prefers_cpufreq_and_says_when_only_base_clock_is_known(monkeypatch, tmp_path):
    _clocks(monkeypatch, tmp_path, cpufreq_khz=3700000, lscpu_mhz=3500.0)
    assert devmod.cpu_clock_mhz() == (3700.0, "max boost clock (cpufreq cpuinfo_max_freq)")
    _clocks(monkeypatch, tmp_path, cpuinfo_mhz="2000.000")
    peak = specs.cpu_peak()
    assert peak.fp32_gflops == pytest.approx(2 * 2.0 * 32)
    assert "no max boost clock reported" in peak.how


def test_over_100_percent_of_spec_carries_a_note(monkeypatch, tmp_path):
    _clocks(monkeypatch, tmp_path)
    peak = specs.cpu_peak()
    assert specs.over_spec_note(0.9 * peak.fp32_gflops, peak.fp32_gflops, peak.how) is None
    note = specs.over_spec_note(1.13 * peak.fp32_gflops, peak.fp32_gflops, peak.how)
    assert note.startswith("113% of spec") and "boost" in note
