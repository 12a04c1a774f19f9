"""What the hardware did during a measurement: NVML on a GPU, process CPU time and RSS on the CPU.

References:
- nvidia-ml-py (imported as pynvml): clocks, power, temperature, utilisation, memory,
  clocks-event (throttle) reasons. Sampled in a background thread every `interval_s`.
- resource.getrusage: process CPU time; /proc/self/statm: resident set size.

Usage:
    with Telemetry(device) as tel:
        ...measure...
    tel.summary()   # {"source": "nvml", "sm_clock_mhz": {"min":..,"median":..,"max":..}, ...}
"""

from __future__ import annotations

import os
import resource
import statistics
import threading
import time

from llmlab.core.device import Device

# NVML clocks-event reasons worth naming (bit -> name); idle and app-clock settings are left out.
_THROTTLE_BITS = {
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x20: "sw_thermal",
    0x40: "hw_thermal",
    0x80: "hw_power_brake",
    0x100: "display_clocks",
}


def _rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return 0


def _cpu_time_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


class Telemetry:
    """Background sampler; a no-op on NVML (with one note) when NVML is absent."""

    def __init__(self, device: Device, interval_s: float = 0.025):  # 25 ms: NVML updates ~every 20 ms
        self.device = device
        self.interval_s = interval_s
        self.samples: list[dict] = []
        self.note: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._handle = None
        self._parent = None  # a MIG slice's parent GPU handle (None: the handle is a whole board)
        self._board = None  # the handle clocks, power and temperature are read from: the parent GPU of a MIG slice
        self._nvml = None
        self.unsupported: dict[str, str] = {}  # NVML field -> why it could not be read (MIG, no sensor)
        self.handle_how: str | None = None

    # -- lifecycle
    def __enter__(self) -> Telemetry:
        self.start()
        return self

    def __exit__(self, *exc) -> bool:
        self.stop()
        return False

    def start(self) -> None:
        self._t0 = time.perf_counter()
        self._cpu0 = _cpu_time_s()
        self._rss_peak = _rss_bytes()
        if self.device.is_cuda:
            self._init_nvml()
        self._thread = threading.Thread(target=self._loop, name="llmlab-telemetry", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=1.0)
        self._wall = time.perf_counter() - self._t0
        self._cpu = _cpu_time_s() - self._cpu0

    def _init_nvml(self) -> None:
        try:
            import pynvml

            from llmlab.core.device import nvml_handle, nvml_parent

            pynvml.nvmlInit()
            self._nvml = pynvml
            # by UUID: CUDA_VISIBLE_DEVICES-safe
            self._handle, self.handle_how = nvml_handle(pynvml, self.device.index or 0)
            self._parent = nvml_parent(pynvml, self._handle)
            self._board = self._handle if self._parent is None else self._parent
        except Exception as exc:
            self.note = f"NVML unavailable ({type(exc).__name__}): no clocks/power recorded"  # the summary says it

    # -- sampling
    def _loop(self) -> None:
        while not self._stop.is_set():
            self._rss_peak = max(self._rss_peak, _rss_bytes())
            if self._handle is not None:
                self.samples.append(self._read_nvml())
            self._stop.wait(self.interval_s)

    def _read_nvml(self) -> dict:
        """One sample; each field read on its own, None (reason in `self.unsupported`) where NVML refuses it."""
        from llmlab.core.device import nvml_read

        n, h, b = self._nvml, self._handle, self._board  # b: the whole board (a MIG slice's parent)
        # nvidia-ml-py 12.535+ renamed "throttle" reasons to "clocks event" reasons; older ones have only the first name
        def event_reasons():  # looked up when read: nvml_read reports a missing function as the field's error
            new_name = getattr(n, "nvmlDeviceGetCurrentClocksEventReasons", None)
            return (new_name or n.nvmlDeviceGetCurrentClocksThrottleReasons)(b)

        return {"t_s": time.perf_counter() - self._t0, **nvml_read({
            "sm_clock_mhz": lambda: n.nvmlDeviceGetClockInfo(b, n.NVML_CLOCK_SM),
            "mem_clock_mhz": lambda: n.nvmlDeviceGetClockInfo(b, n.NVML_CLOCK_MEM),
            "power_w": lambda: n.nvmlDeviceGetPowerUsage(b) / 1000,
            "temp_c": lambda: n.nvmlDeviceGetTemperature(b, n.NVML_TEMPERATURE_GPU),
            "gpu_util_pct": lambda: n.nvmlDeviceGetUtilizationRates(h).gpu,
            "mem_util_pct": lambda: n.nvmlDeviceGetUtilizationRates(h).memory,
            "mem_used_bytes": lambda: n.nvmlDeviceGetMemoryInfo(h).used,
            "throttle": event_reasons,
        }, self.unsupported)}

    # -- summary
    def summary(self) -> dict:
        """Per-run summary: min/median/max of each NVML field, named throttle reasons, CPU use."""
        wall = getattr(self, "_wall", time.perf_counter() - self._t0)
        cpu = getattr(self, "_cpu", _cpu_time_s() - self._cpu0)
        out: dict = {
            "wall_s": round(wall, 4),
            "process_cpu_s": round(cpu, 4),
            "cpu_utilisation_cores": round(cpu / wall, 2) if wall > 0 else None,
            "rss_peak_bytes": self._rss_peak,
            "loadavg_1m": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
        }
        if not self.device.is_cuda:
            out["source"] = "process (no NVML on the CPU)"
            return out
        if not self.samples:
            out["source"] = self.note or "NVML: no samples (run shorter than one interval)"
            return out
        out["source"] = "nvml"
        out["nvml_handle"] = self.handle_how  # how torch's device was mapped to NVML's board (uuid, pci, index)
        if self._parent is not None:
            from llmlab.core.device import WHOLE_GPU_FIELDS, WHOLE_GPU_NOTE

            out["whole_gpu"] = WHOLE_GPU_NOTE  # these fields describe the parent board, not the slice
            out["whole_gpu_fields"] = [f for f in WHOLE_GPU_FIELDS if not f.startswith(("max_", "power_limit"))]
        out["n_samples"] = len(self.samples)
        for key in ("sm_clock_mhz", "mem_clock_mhz", "power_w", "temp_c", "gpu_util_pct", "mem_used_bytes"):
            xs = [s[key] for s in self.samples if s.get(key) is not None]
            out[key] = {"min": min(xs), "median": statistics.median(xs), "max": max(xs)} if xs else None
        bits = [s["throttle"] for s in self.samples if s.get("throttle") is not None]
        out["throttle_reasons"] = (
            [name for bit, name in _THROTTLE_BITS.items() if any(b & bit for b in bits)] if bits else None
        )
        if self.unsupported:
            out["unsupported"] = dict(self.unsupported)  # field -> NVML's reason; those fields are None above
        return out


def sample(device: Device, seconds: float = 1.0) -> dict:
    """A telemetry summary over `seconds` of idle time (what `llmlab env` shows)."""
    with Telemetry(device) as tel:
        time.sleep(seconds)
    return tel.summary()
