"""GPU paths checked with stand-ins (issue 12, items 12-14, 16): no GPU on the test machine.

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
    st = timing.measure(lambda: None, Device("cuda:3"), warmup=1, repeats=4)
    assert st.n == 4 and st.median_ms == 2.0
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
