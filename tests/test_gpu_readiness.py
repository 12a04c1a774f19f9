"""GPU paths checked with stand-ins: no GPU on the test machine.

A fake `torch.cuda` records which device is current, which stream each event is recorded on and
which device each synchronise waits for; a fake `pynvml` module answers some fields and refuses
others, the way MIG slices and boards without power sensors do.
"""

from __future__ import annotations

import pytest
import torch

from llmlab.core import timing
from llmlab.core.device import Device


class FakeCuda:
    """Just enough of torch.cuda for core.timing and Device: current device, streams, events, syncs."""

    def __init__(self, n: int = 8):
        self.n, self.current, self.log = n, 0, []

    def install(self, mp: pytest.MonkeyPatch) -> FakeCuda:
        cuda = torch.cuda
        mp.setattr(cuda, "current_device", lambda: self.current)
        mp.setattr(cuda, "set_device", self.set_device)
        mp.setattr(cuda, "current_stream", self.current_stream)
        mp.setattr(cuda, "synchronize", self.synchronize)
        mp.setattr(cuda, "device_count", lambda: self.n)
        mp.setattr(cuda, "is_available", lambda: True)
        fake = self

        class Event:
            def __init__(self, enable_timing: bool = False):
                self.stream = None

            def record(self, stream=None):
                self.stream = stream if stream is not None else fake.current_stream()
                fake.log.append(("record", self.stream.device))

            def synchronize(self):
                fake.log.append(("event-sync", self.stream.device))

            def elapsed_time(self, end):
                assert end.stream.device == self.stream.device, "events on two devices"
                return 2.0  # ms

        mp.setattr(cuda, "Event", Event)
        return self

    def set_device(self, idx):
        self.log.append(("set_device", int(idx)))
        self.current = int(idx)

    def _index(self, device) -> int:
        if device is None:
            return self.current
        if isinstance(device, torch.device):
            return device.index if device.index is not None else self.current
        return int(device)

    def current_stream(self, device=None):
        return type("Stream", (), {"device": self._index(device)})()

    def synchronize(self, device=None):
        self.log.append(("sync", self._index(device)))


@pytest.fixture
def cuda(monkeypatch):
    return FakeCuda().install(monkeypatch)


# ---------------------------------------------------------------- item 12: --gpu N with N != 0


def test_gpu_n_activate_sets_and_restores_the_device(cuda):
    with Device("cuda:3").activate() as dev:
        assert dev.index == 3 and torch.cuda.current_device() == 3
    assert torch.cuda.current_device() == 0
    assert [e for e in cuda.log if e[0] == "set_device"] == [("set_device", 3), ("set_device", 0)]
    cuda.log.clear()
    with Device("cpu").activate():
        pass
    with Device("cuda:0").activate():  # already current: nothing to switch
        pass
    assert cuda.log == []


def test_gpu_n_measure_records_events_on_that_devices_stream(cuda):
    st = timing.measure(lambda: None, Device("cuda:3"), mode=timing.LATENCY, warmup=1, repeats=4)
    assert st.n == 4 and st.median == 2.0
    records = [d for kind, d in cuda.log if kind == "record"]
    assert records == [3] * 8  # start and end of each of 4 calls, all on GPU 3's stream
    assert {d for kind, d in cuda.log if kind in ("sync", "event-sync")} == {3}
    assert cuda.current == 0  # the previous device is current again


def test_gpu_n_interleaved_times_on_that_device(cuda):
    res = timing.interleaved({"a": lambda: 1, "b": lambda: 2}, 3, Device("cuda:5"))
    assert res.seconds == {"a": [0.002] * 3, "b": [0.002] * 3}
    assert {d for kind, d in cuda.log if kind in ("record", "sync", "event-sync")} == {5}


def test_gpu_n_autorange_syncs_the_right_device(cuda, monkeypatch):
    from torch.utils import benchmark

    class Timer:  # torch.utils.benchmark's CUDA timer calls torch.cuda.synchronize() with no device
        def __init__(self, stmt, globals, num_threads):
            self.fn = globals["fn"]

        def blocked_autorange(self, min_run_time):
            torch.cuda.synchronize()
            self.fn()
            torch.cuda.synchronize()
            return type("M", (), {"times": [1e-3, 2e-3]})()

    monkeypatch.setattr(benchmark, "Timer", Timer)
    st = timing.autorange(lambda: None, Device("cuda:2"))
    assert st.n == 2
    assert {d for kind, d in cuda.log if kind == "sync"} == {2}


# ---------------------------------------------------------------- items 13-14: NVML by UUID, one field at a time


class NVMLError(Exception):
    pass


def fake_pynvml(boards: list[dict], refuse: set[str] = frozenset()):
    """A pynvml stand-in over physical boards [{uuid, bus, sm}]: handles are board numbers; `refuse` names
    the calls that raise 'Not Supported' (as power readings do on MIG and on some boards)."""
    import types

    m = types.ModuleType("pynvml")
    m.NVMLError = NVMLError
    m.NVML_CLOCK_SM, m.NVML_CLOCK_MEM, m.NVML_TEMPERATURE_GPU = 0, 1, 0

    def call(name, fn):
        def wrapped(*a):
            if name in refuse:
                raise NVMLError("Not Supported")
            return fn(*a)
        setattr(m, name, wrapped)

    def by(key, value):
        for i, b in enumerate(boards):
            if b[key] == value:
                return i
        raise NVMLError("Not Found")

    call("nvmlInit", lambda: None)
    call("nvmlDeviceGetHandleByIndex", lambda i: i)
    call("nvmlDeviceGetHandleByUUID", lambda u: by("uuid", u))
    call("nvmlDeviceGetHandleByPciBusId_v2", lambda p: by("bus", p))
    call("nvmlSystemGetDriverVersion", lambda: b"570.1")
    call("nvmlSystemGetCudaDriverVersion_v2", lambda: 12080)
    call("nvmlDeviceGetMaxClockInfo", lambda h, k: boards[h]["sm"] + 1000 if k == 0 else 2619)
    call("nvmlDeviceGetEnforcedPowerLimit", lambda h: 700_000)
    call("nvmlDeviceGetClockInfo", lambda h, k: boards[h]["sm"] if k == 0 else 2619)
    call("nvmlDeviceGetPowerUsage", lambda h: 300_000)
    call("nvmlDeviceGetTemperature", lambda h, k: 40 + h)
    call("nvmlDeviceGetUtilizationRates", lambda h: type("U", (), {"gpu": 99, "memory": 50})())
    call("nvmlDeviceGetMemoryInfo", lambda h: type("M", (), {"used": 10 * 2**30})())
    call("nvmlDeviceGetCurrentClocksEventReasons", lambda h: 0x4)
    return m


BOARDS = [
    dict(
        uuid=f"GPU-{i}{i}{i}{i}aaaa-0000-0000-0000-000000000000", bus=f"00000000:{0x10 + i:02X}:00.0", sm=1000 + 100 * i
    )
    for i in range(4)
]


def visible_as_cuda0(monkeypatch, board: int, uuid: bool = True, pci: bool = True):
    """torch sees only physical board `board`, as cuda:0 (CUDA_VISIBLE_DEVICES=board)."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", str(board))
    props = {"name": "NVIDIA H200"}
    if uuid:
        props["uuid"] = BOARDS[board]["uuid"].removeprefix("GPU-")  # torch prints the UUID bare
    if pci:
        props.update(pci_domain_id=0, pci_bus_id=0x10 + board, pci_device_id=0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: type("P", (), props)())


def test_nvml_handle_found_by_uuid_not_by_index(monkeypatch):
    from llmlab.core.device import _nvml_card

    visible_as_cuda0(monkeypatch, 3)
    monkeypatch.setitem(__import__("sys").modules, "pynvml", fake_pynvml(BOARDS))
    card = _nvml_card(0)
    assert card["max_sm_clock_mhz"] == 2300  # board 3's, not board 0's 2000
    assert card["nvml"].startswith("handle by uuid GPU-3333")


def test_nvml_handle_by_uuid_in_the_pcie_probe(monkeypatch):
    import sys

    from llmlab.labs.gpu_parallelism import kernels as gp

    visible_as_cuda0(monkeypatch, 3)
    nvml = fake_pynvml(BOARDS)
    nvml.nvmlDeviceGetMaxPcieLinkGeneration = lambda h: {0: 4, 3: 5}[h]  # board 0 is gen 4, the visible board 3 gen 5
    nvml.nvmlDeviceGetMaxPcieLinkWidth = lambda h: 16
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    gbps, how = gp.pcie_GBps(Device("cuda:0"))
    assert how == "PCIe gen 5 x16 (NVML)" and gbps == pytest.approx(3.938 * 16)


def test_nvml_handle_falls_back_to_pci_bus_id(monkeypatch):
    from llmlab.core.device import nvml_handle

    visible_as_cuda0(monkeypatch, 2, uuid=False)
    h, how = nvml_handle(fake_pynvml(BOARDS), 0)
    assert h == 2 and how == "pci 00000000:12:00.0"
    visible_as_cuda0(monkeypatch, 2, uuid=False, pci=False)
    with pytest.raises(LookupError, match="uuid: torch does not report it"):  # never silently board 0
        nvml_handle(fake_pynvml(BOARDS), 0)


def test_telemetry_reads_the_visible_board_and_keeps_samples_without_power(monkeypatch):
    import time

    from llmlab.core.telemetry import Telemetry

    visible_as_cuda0(monkeypatch, 3)
    monkeypatch.setitem(__import__("sys").modules, "pynvml", fake_pynvml(BOARDS, refuse={"nvmlDeviceGetPowerUsage"}))
    with Telemetry(Device("cuda:0"), interval_s=0.002) as tel:
        time.sleep(0.05)
    s = tel.summary()
    assert s["source"] == "nvml" and s["n_samples"] >= 1  # one refused field no longer drops the sample
    assert s["sm_clock_mhz"]["median"] == 1300 and s["temp_c"]["max"] == 43  # board 3
    assert s["power_w"] is None and s["unsupported"] == {"power_w": "Not Supported"}
    assert s["throttle_reasons"] == ["sw_power_cap"]


def test_device_card_nvml_fields_are_read_one_by_one(monkeypatch):
    from llmlab.core.device import _nvml_card

    visible_as_cuda0(monkeypatch, 1)
    monkeypatch.setitem(__import__("sys").modules, "pynvml",
                        fake_pynvml(BOARDS, refuse={"nvmlDeviceGetEnforcedPowerLimit", "nvmlDeviceGetMaxClockInfo"}))
    card = _nvml_card(0)
    assert card["driver"] == "570.1" and card["cuda_driver"] == 12080  # what NVML does answer is kept
    assert card["power_limit_w"] is None and card["max_sm_clock_mhz"] is None
    assert card["nvml_unsupported"] == {"power_limit_w": "Not Supported", "max_sm_clock_mhz": "Not Supported",
                                        "max_mem_clock_mhz": "Not Supported"}


# ---------------------------------------------------------------- item 16: one TF32 helper for every allowed torch


def _old_torch_backends(monkeypatch):
    """torch 2.4-2.8: no `fp32_precision`, only the `allow_tf32` flags."""
    import types

    matmul, cudnn = types.SimpleNamespace(allow_tf32=False), types.SimpleNamespace(allow_tf32=False)
    monkeypatch.setattr(torch.backends.cuda, "matmul", matmul)
    monkeypatch.setattr(torch.backends, "cudnn", cudnn)
    return matmul, cudnn


def test_tf32_helper_uses_allow_tf32_on_torch_before_2_9(monkeypatch):
    from llmlab.core import roofs
    from llmlab.core.device import set_tf32, tf32

    matmul, cudnn = _old_torch_backends(monkeypatch)
    set_tf32(matmul=True, conv=True)
    assert matmul.allow_tf32 is True and cudnn.allow_tf32 is True
    set_tf32(matmul=False)
    with tf32(matmul=True):
        assert matmul.allow_tf32 is True
    assert matmul.allow_tf32 is False and cudnn.allow_tf32 is True  # restored; conv untouched
    with roofs.tf32(True):  # the roofline lab's tf32 rows on an old torch (was an AttributeError)
        assert matmul.allow_tf32 is True
    assert matmul.allow_tf32 is False


def test_tf32_helper_uses_fp32_precision_on_torch_2_9_and_later():
    from llmlab.core.device import tf32, tf32_knobs
    from llmlab.labs.gpu_parallelism import harness as gp

    if not hasattr(torch.backends.cuda.matmul, "fp32_precision"):
        pytest.skip(f"torch {torch.__version__} has no fp32_precision API")
    m = torch.backends.cuda.matmul
    before = m.fp32_precision
    with tf32(matmul=True, conv=False):
        assert m.fp32_precision == "tf32" and torch.backends.cudnn.conv.fp32_precision == "ieee"
    assert m.fp32_precision == before
    assert gp.tf32_knobs is tf32_knobs  # the lab saves and restores TF32 with the core helper


def test_telemetry_sample_survives_a_pynvml_without_clock_event_reasons(monkeypatch):
    import sys
    import time

    from llmlab.core.telemetry import Telemetry

    visible_as_cuda0(monkeypatch, 0)
    nvml = fake_pynvml(BOARDS)
    del nvml.nvmlDeviceGetCurrentClocksEventReasons  # neither the new nor the old name: the field is unsupported
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    with Telemetry(Device("cuda:0"), interval_s=0.002) as tel:
        time.sleep(0.03)
    s = tel.summary()
    assert s["n_samples"] >= 1 and s["sm_clock_mhz"]["max"] == 1000
    assert s["throttle_reasons"] is None and "throttle" in s["unsupported"]


# ---------------------------------------------------------------- latency rows and throughput rows


def _launch_log(cuda, mode, setup=None, **kw):
    """The fake CUDA log of one measure() on cuda:0 after a warm-up: which calls ran between which events."""
    marks = []
    cuda.log.clear()
    st = timing.measure(
        lambda: marks.append(len(cuda.log)), Device("cuda:0"), mode=mode, warmup=0, repeats=3, setup=setup, **kw
    )
    return st, marks


def test_latency_rows_start_every_call_from_an_idle_stream(cuda):
    """With or without a setup kernel before it, a latency sample is one call after a device synchronise."""
    for setup in (None, lambda: cuda.log.append(("setup-kernel", 0))):
        st, _ = _launch_log(cuda, timing.LATENCY, setup)
        kinds = [k for k, _ in cuda.log]
        starts = [i for i, k in enumerate(kinds) if k == "record"][::2]
        assert len(starts) == 3 and st.n == 3 and st.median == 2.0  # one call per event pair: 2 ms each
        assert all(kinds[i - 1] == "sync" for i in starts)  # the stream is synchronised right before each start event


def test_throughput_rows_time_a_block_of_calls_between_one_event_pair(cuda):
    st, marks = _launch_log(cuda, timing.THROUGHPUT, calls=5)
    assert len(marks) == 15 and st.n == 3
    assert st.median == pytest.approx(2.0 / 5)  # the block's 2 ms over its 5 calls
    assert sum(1 for k, _ in cuda.log if k == "record") == 6  # one event pair per block, never per call


# ---------------------------------------------------------------- MIG: whole-GPU readings from the parent board


def fake_mig_pynvml(board: int = 3):
    """fake_pynvml with a MIG slice of `board` as handle 100 + board: clocks, power, temperature and throttle
    reasons are 'Not Supported' on the slice (as NVML does), memory is the slice's own."""
    m = fake_pynvml(BOARDS)
    mig = 100 + board
    for name in (
        "nvmlDeviceGetClockInfo",
        "nvmlDeviceGetMaxClockInfo",
        "nvmlDeviceGetPowerUsage",
        "nvmlDeviceGetTemperature",
        "nvmlDeviceGetEnforcedPowerLimit",
        "nvmlDeviceGetCurrentClocksEventReasons",
    ):
        board_only = getattr(m, name)

        def refuse_slice(h, *a, _f=board_only):
            if h >= 100:
                raise NVMLError("Not Supported")
            return _f(h, *a)
        setattr(m, name, refuse_slice)
    m.nvmlDeviceIsMigDeviceHandle = lambda h: h >= 100
    m.nvmlDeviceGetDeviceHandleFromMigDeviceHandle = lambda h: h - 100
    return m, mig


def test_mig_telemetry_reads_the_parent_gpu_and_says_whole_gpu(monkeypatch):
    import sys
    import time

    from llmlab.core import device as dev_mod
    from llmlab.core.telemetry import Telemetry

    m, mig = fake_mig_pynvml(3)
    monkeypatch.setitem(sys.modules, "pynvml", m)
    monkeypatch.setattr(dev_mod, "nvml_handle", lambda nvml, index: (mig, "uuid MIG-3333"))
    with Telemetry(Device("cuda:0"), interval_s=0.005) as tel:
        time.sleep(0.05)
    s = tel.summary()
    # board 3's
    assert s["sm_clock_mhz"]["median"] == 1300 and s["temp_c"]["max"] == 43 and s["power_w"]["median"] == 300
    assert s["throttle_reasons"] == ["sw_power_cap"] and "unsupported" not in s
    assert s["whole_gpu"].startswith("MIG slice") and "power_w" in s["whole_gpu_fields"]


def test_mig_device_card_reads_max_clocks_from_the_parent(monkeypatch):
    import sys

    from llmlab.core import device as dev_mod

    m, mig = fake_mig_pynvml(2)
    monkeypatch.setitem(sys.modules, "pynvml", m)
    monkeypatch.setattr(dev_mod, "nvml_handle", lambda nvml, index: (mig, "uuid MIG-2222"))
    card = dev_mod._nvml_card(0)
    assert card["max_sm_clock_mhz"] == 2200 and card["power_limit_w"] == 700 and "nvml_unsupported" not in card
    assert card["nvml_whole_gpu"].startswith("MIG slice")
    m2 = fake_pynvml(BOARDS)  # a whole board: no label
    monkeypatch.setitem(sys.modules, "pynvml", m2)
    monkeypatch.setattr(dev_mod, "nvml_handle", lambda nvml, index: (2, "uuid GPU-2222"))
    assert "nvml_whole_gpu" not in dev_mod._nvml_card(0)
