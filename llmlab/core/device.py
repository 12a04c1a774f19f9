"""Device resolution (`--device auto|cpu|cuda|cuda:N`, `--gpu N`), synchronisation, the device card.

References:
- torch.cuda.get_device_properties: name, SM count, memory, L2 size.
- NVML (nvidia-ml-py): max clocks, driver version.
- /proc/cpuinfo, os.sched_getaffinity, /sys/devices/system/cpu/cpu0/cache: the CPU card.
"""

from __future__ import annotations

import os
import platform
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from llmlab.core.errors import UsageError


@dataclass(frozen=True)
class Device:
    """A resolved device: `cpu` or `cuda:N`. Construct through `resolve_device`."""

    spec: str  # "cpu" or "cuda:N"

    @property
    def is_cuda(self) -> bool:
        return self.spec.startswith("cuda")

    @property
    def index(self) -> int | None:
        return int(self.spec.split(":")[1]) if self.is_cuda else None

    @property
    def torch(self):
        """The `torch.device` for this device."""
        import torch

        return torch.device(self.spec)

    @property
    def kind(self) -> str:
        return "cuda" if self.is_cuda else "cpu"

    @contextmanager
    def activate(self) -> Iterator[Device]:
        """Make this the current CUDA device (torch.cuda.set_device) for the block; the old one comes back after.

        Streams, events, `torch.cuda.synchronize()` without arguments and torch.utils.benchmark all
        act on the current device, so a command run with `--gpu 3` runs inside `with device.activate():`.
        On the CPU, or when this device is already current, nothing changes.
        """
        if not self.is_cuda:
            yield self
            return
        import torch

        prev = torch.cuda.current_device()
        if prev != self.index:
            torch.cuda.set_device(self.index)
        try:
            yield self
        finally:
            if prev != self.index:
                torch.cuda.set_device(prev)

    def synchronize(self) -> None:
        if self.is_cuda:
            import torch

            torch.cuda.synchronize(self.torch)

    @cached_property
    def name(self) -> str:
        if self.is_cuda:
            import torch

            return torch.cuda.get_device_name(self.index)
        return cpu_model_name()

    def total_memory_bytes(self) -> int:
        """Device memory (GPU) or physical RAM (CPU)."""
        if self.is_cuda:
            import torch

            return torch.cuda.get_device_properties(self.index).total_memory
        return _meminfo_bytes("MemTotal")

    def free_memory_bytes(self) -> int:
        if self.is_cuda:
            import torch

            free, _ = torch.cuda.mem_get_info(self.index)
            return free
        return _meminfo_bytes("MemAvailable")

    def slug(self) -> str:
        """A short file-name-safe label: `cpu-amd-epyc-7b13` or `cuda0-nvidia-h200`."""
        base = "cpu" if not self.is_cuda else f"cuda{self.index}"
        words = re.sub(r"[^a-z0-9]+", "-", self.name.lower()).strip("-")
        words = re.sub(r"-?(r\)|tm|\(r\)|cpu|processor|core-s?)-?", "-", words).strip("-")
        return f"{base}-{'-'.join(words.split('-')[:4])}" if words else base


def cuda_device_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _available() -> str:
    n = cuda_device_count()
    gpus = ", ".join(f"cuda:{i}" for i in range(n))
    return f"available: cpu{', ' + gpus if gpus else ' (no CUDA GPU found)'}"


def resolve_device(device: str = "auto", gpu: int | None = None) -> Device:
    """Turn the CLI's `--device`/`--gpu` into a Device, or raise UsageError naming what exists."""
    device = (device or "auto").strip().lower()
    if gpu is not None:
        if device not in ("auto", "cuda", f"cuda:{gpu}"):
            raise UsageError(f"--gpu {gpu} contradicts --device {device}; give one of them")
        device = f"cuda:{gpu}"
    if device == "auto":
        return Device("cuda:0") if cuda_device_count() > 0 else Device("cpu")
    if device == "cpu":
        return Device("cpu")
    m = re.fullmatch(r"cuda(?::(-?\d+))?", device)
    if not m:
        raise UsageError(f"unknown device '{device}': use auto, cpu, cuda or cuda:N ({_available()})")
    idx = int(m.group(1) or 0)
    n = cuda_device_count()
    if idx < 0 or idx >= n:
        what = f"GPU {idx}" if m.group(1) is not None or gpu is not None else "CUDA"
        raise UsageError(f"{what} is not available on this machine ({_available()})")
    return Device(f"cuda:{idx}")


def is_oom(exc: BaseException) -> bool:
    """True for out-of-memory errors on any device (CUDA OOM, CPU allocator failures)."""
    import torch

    if isinstance(exc, (torch.cuda.OutOfMemoryError, MemoryError)):
        return True
    msg = str(exc).lower()
    return isinstance(exc, RuntimeError) and ("out of memory" in msg or "can't allocate memory" in msg)


@contextmanager
def torch_threads(n: int | None) -> Iterator[None]:
    """Run the block with torch on n intra-op threads (None: unchanged); the old count comes back after."""
    import torch

    old = torch.get_num_threads()
    if n:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)


def tf32_knobs() -> dict[str, tuple[object, str, object, object]]:
    """name -> (object, attribute, TF32 on, TF32 off) for CUDA matmuls ("matmul") and cuDNN convs ("conv").

    torch >= 2.9 has the per-backend `fp32_precision` API and refuses to mix it with the legacy one,
    so the new API is used where it exists and only `allow_tf32` where it does not (torch 2.4-2.8).
    """
    import torch

    m, c = torch.backends.cuda.matmul, torch.backends.cudnn
    if hasattr(m, "fp32_precision") and hasattr(c, "conv") and hasattr(c.conv, "fp32_precision"):
        return {"matmul": (m, "fp32_precision", "tf32", "ieee"), "conv": (c.conv, "fp32_precision", "tf32", "ieee")}
    return {"matmul": (m, "allow_tf32", True, False), "conv": (c, "allow_tf32", True, False)}


def set_tf32(matmul: bool | None = None, conv: bool | None = None) -> None:
    """Allow (True) or forbid (False) TF32 tensor cores for FP32 CUDA matmuls / cuDNN convs; None leaves it."""
    knobs = tf32_knobs()
    for name, want in (("matmul", matmul), ("conv", conv)):
        if want is not None:
            obj, attr, on, off = knobs[name]
            setattr(obj, attr, on if want else off)


@contextmanager
def tf32(matmul: bool | None = None, conv: bool | None = None) -> Iterator[None]:
    """`set_tf32` for the block; the previous TF32 settings come back after, on every allowed torch."""
    saved = [(obj, attr, getattr(obj, attr)) for obj, attr, _, _ in tf32_knobs().values()]
    set_tf32(matmul, conv)
    try:
        yield
    finally:
        for obj, attr, old in saved:
            setattr(obj, attr, old)


def cpu_load() -> tuple[float | None, int]:
    """(1-minute load average or None where the OS has none, usable logical CPUs).

    A load above the CPU count means other processes share the cores: OpenMP threads then wait for
    descheduled peers, and multi-threaded timings come out slow and noisy.
    """
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    return load, cpu_cores()["logical"]


def threads_for(requested: int, note=None) -> int | None:
    """torch CPU threads for a lab: `requested` when given; 1 when the CPU is oversubscribed (OpenMP
    threads would wait for descheduled peers; `note` is told why); else None (torch's default)."""
    if requested:
        return requested
    load, cores = cpu_load()
    if load is not None and load >= cores:
        if note:
            note(f"the CPU is oversubscribed (load {load:.1f} on {cores} CPUs): torch runs on 1 thread")
        return 1
    return None


# ---------------------------------------------------------------- the CPU card


def _meminfo_bytes(key: str) -> int:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _cpuinfo() -> dict[str, str]:
    info: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if ":" in line:
                k, v = (s.strip() for s in line.split(":", 1))
                info.setdefault(k, v)
            elif not line.strip() and info:
                break  # the first processor block is enough
    except OSError:
        pass
    return info


def cpu_model_name() -> str:
    return _cpuinfo().get("model name") or platform.processor() or platform.machine() or "cpu"


def cpu_flags() -> set[str]:
    return set(_cpuinfo().get("flags", "").split())


def cpu_isa() -> dict[str, bool]:
    f = cpu_flags()
    return {
        "avx2": "avx2" in f,
        "fma": "fma" in f,
        "avx512f": "avx512f" in f,
        "avx512_bf16": "avx512_bf16" in f,
        "amx_bf16": "amx_bf16" in f,
        "amx_tile": "amx_tile" in f,
        "neon": platform.machine() in ("aarch64", "arm64"),
    }


def cpu_cores() -> dict[str, int]:
    """Usable logical CPUs (affinity), and physical cores where /proc/cpuinfo tells them."""
    logical = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    physical = set()
    try:
        phys = core = None
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("physical id"):
                phys = line.split(":")[1].strip()
            elif line.startswith("core id"):
                core = line.split(":")[1].strip()
            elif not line.strip() and core is not None:
                physical.add((phys, core))
                phys = core = None
    except OSError:
        pass
    return {"logical": logical, "physical": min(len(physical), logical) if physical else logical}


def cpu_caches() -> dict[str, int]:
    """Cache sizes in bytes per level and type, from sysfs (per instance, as cpu0 sees them)."""
    out: dict[str, int] = {}
    root = Path("/sys/devices/system/cpu/cpu0/cache")
    for idx in sorted(root.glob("index*")):
        try:
            level = (idx / "level").read_text().strip()
            typ = (idx / "type").read_text().strip()
            size = (idx / "size").read_text().strip()
        except OSError:
            continue
        mult = {"K": 1024, "M": 1024**2, "G": 1024**3}.get(size[-1], 1)
        value = int(size[:-1]) * mult if size[-1] in "KMG" else int(size)
        key = f"L{level}" + ({"Data": "d", "Instruction": "i"}.get(typ, ""))
        out[key] = value
    return out


def last_level_cache_bytes(device: Device) -> int:
    """GPU L2, or the CPU's largest cache (an L3 is shared: this is what one CPU sees)."""
    if device.is_cuda:  # the device's own L2 size, never a constant: 40 MB on an A100, 50 MB on an H100/H200
        import torch

        l2 = getattr(torch.cuda.get_device_properties(device.index), "L2_cache_size", 0)
        if not l2:
            raise RuntimeError(f"torch reports no L2 size for {device.spec}: the cache-sized buffers cannot be sized")
        return int(l2)
    caches = cpu_caches()
    return max(caches.values()) if caches else 32 * 2**20


_CPUFREQ_MAX = Path("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq")  # kHz, the max boost clock


def _lscpu_max_mhz() -> float | None:
    """`lscpu`'s "CPU max MHz" (cpufreq or the firmware's table), or None where lscpu is absent or silent."""
    import shutil
    import subprocess

    if not shutil.which("lscpu"):
        return None
    try:
        out = subprocess.run(
            ["lscpu"], capture_output=True, text=True, timeout=5, env={**os.environ, "LC_ALL": "C"}
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    m = re.search(r"^CPU max MHz:\s*([\d.]+)", out, re.M)
    return float(m.group(1)) if m and float(m.group(1)) > 0 else None


def cpu_clock_mhz() -> tuple[float | None, str]:
    """(MHz, which clock it is) for a CPU's spec peak: the max boost clock where the OS reports one.

    Order: cpufreq's cpuinfo_max_freq, then lscpu's "CPU max MHz" (both the max boost clock), then
    /proc/cpuinfo's "cpu MHz" (a base or current clock: cores may boost above it, so a measured
    rate can pass 100% of a spec computed from it, and the source string says so).
    """
    try:
        khz = int(_CPUFREQ_MAX.read_text())
        if khz > 0:
            return khz / 1000, "max boost clock (cpufreq cpuinfo_max_freq)"
    except (OSError, ValueError):
        pass
    mhz = _lscpu_max_mhz()
    if mhz:
        return mhz, "max boost clock (lscpu CPU max MHz)"
    mhz = _cpuinfo().get("cpu MHz")
    if mhz:
        return float(mhz), "clock from /proc/cpuinfo (no max boost clock reported: turbo may run faster)"
    return None, "the clock is not reported"


# ---------------------------------------------------------------- the card


def versions() -> dict[str, str]:
    import importlib.metadata as md

    out = {"python": platform.python_version()}
    for pkg in ("llmlab", "torch", "transformers", "tokenizers", "typer", "rich", "pandas", "plotext", "nvidia-ml-py"):
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            out[pkg] = "not installed"
    return out


def device_card(device: Device) -> dict:
    """Everything a reader needs to know about the hardware a result came from."""
    import torch

    card: dict = {"device": device.spec, "name": device.name, "platform": platform.platform()}
    if device.is_cuda:
        p = torch.cuda.get_device_properties(device.index)
        card.update(
            compute_capability=f"{p.major}.{p.minor}",
            sm_count=p.multi_processor_count,
            memory_bytes=p.total_memory,
            l2_bytes=getattr(p, "L2_cache_size", None),
            cuda_runtime=torch.version.cuda,
        )
        card.update(_nvml_card(device.index))
    mhz, clock_source = cpu_clock_mhz()
    card["cpu"] = {
        "model": cpu_model_name(),
        **cpu_cores(),
        "isa": cpu_isa(),
        "caches_bytes": cpu_caches(),
        "max_mhz": mhz,
        "clock_source": clock_source,
        "memory_bytes": _meminfo_bytes("MemTotal"),
        "torch_threads": torch.get_num_threads(),
    }
    card["versions"] = versions()
    return card


def _reason(exc: BaseException) -> str:
    """One line for a failed NVML call: 'Not Supported', 'No Permission', ... (pynvml's own words)."""
    return str(exc).strip() or type(exc).__name__


def nvml_handle(nvml, index: int):
    """(NVML handle, how it was found) for torch's CUDA device `index`.

    torch numbers devices after CUDA_VISIBLE_DEVICES, NVML numbers physical boards: with
    CUDA_VISIBLE_DEVICES=3, torch's cuda:0 is NVML's 3. So the device's UUID (the same in both:
    torch prints it bare, NVML as GPU-... or MIG-...) finds the handle, then the PCI bus id;
    the index is used only when CUDA_VISIBLE_DEVICES is unset, where both numberings agree.
    Raises LookupError (with every reason) when no mapping works.
    """
    import torch

    props = torch.cuda.get_device_properties(index)
    reasons = []
    uuid = getattr(props, "uuid", None)
    if uuid is not None:
        bare = str(uuid)
        for cand in ([bare] if bare.startswith(("GPU-", "MIG-")) else [f"GPU-{bare}", f"MIG-{bare}"]):
            try:
                return nvml.nvmlDeviceGetHandleByUUID(cand), f"uuid {cand}"
            except Exception as exc:
                reasons.append(f"uuid {cand}: {_reason(exc)}")
    else:
        reasons.append("uuid: torch does not report it")
    bus = [getattr(props, k, None) for k in ("pci_domain_id", "pci_bus_id", "pci_device_id")]
    if None not in bus:
        bus_id = "{:08X}:{:02X}:{:02X}.0".format(*bus)
        lookup = getattr(nvml, "nvmlDeviceGetHandleByPciBusId_v2", None) or nvml.nvmlDeviceGetHandleByPciBusId
        try:
            return lookup(bus_id), f"pci {bus_id}"
        except Exception as exc:
            reasons.append(f"pci {bus_id}: {_reason(exc)}")
    else:
        reasons.append("pci bus id: torch does not report it")
    if os.environ.get("CUDA_VISIBLE_DEVICES") is None:
        return nvml.nvmlDeviceGetHandleByIndex(index), f"index {index} (CUDA_VISIBLE_DEVICES unset)"
    raise LookupError(f"no NVML handle for cuda:{index} ({'; '.join(reasons)})")


# one value per board, never per MIG slice
WHOLE_GPU_FIELDS = ("sm_clock_mhz", "mem_clock_mhz", "power_w", "temp_c", "throttle",
                    "max_sm_clock_mhz", "max_mem_clock_mhz", "power_limit_w")
WHOLE_GPU_NOTE = ("MIG slice: clocks, power, temperature and throttle reasons are the parent GPU's "
                  "(whole-GPU, shared by every slice)")


def nvml_parent(nvml, handle):
    """The parent GPU's handle when `handle` is a MIG slice's, else None.

    NVML answers clocks, power and temperature only for the whole board ("Not Supported" on a MIG
    handle), so those are read from the parent and labelled whole-GPU; memory stays the slice's."""
    try:
        if not nvml.nvmlDeviceIsMigDeviceHandle(handle):
            return None
        return nvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(handle)
    except Exception:  # an NVML without MIG calls, or a board without MIG: the handle is the board's
        return None


def nvml_read(fields: dict, unsupported: dict[str, str]) -> dict:
    """Call each `name -> zero-argument reader` on its own: a field NVML refuses (MIG, a board without a
    power sensor) becomes None and its reason goes into `unsupported`; the other fields still come back."""
    out = {}
    for name, read in fields.items():
        try:
            out[name] = read()
        except Exception as exc:
            out[name] = None
            unsupported.setdefault(name, _reason(exc))
    return out


def _nvml_card(index: int) -> dict:
    try:
        import pynvml

        pynvml.nvmlInit()
        h, how = nvml_handle(pynvml, index)
    except Exception as exc:  # NVML missing or failing: the card says so instead of guessing
        return {"nvml": f"unavailable ({type(exc).__name__}: {_reason(exc)})"}
    unsupported: dict[str, str] = {}
    out = {"nvml": f"handle by {how}"}
    parent = nvml_parent(pynvml, h)
    board = parent if parent is not None else h
    if parent is not None:
        out["nvml_whole_gpu"] = WHOLE_GPU_NOTE
    out.update(nvml_read({
        "driver": lambda: _s(pynvml.nvmlSystemGetDriverVersion()),
        "cuda_driver": pynvml.nvmlSystemGetCudaDriverVersion_v2,
        "max_sm_clock_mhz": lambda: pynvml.nvmlDeviceGetMaxClockInfo(board, pynvml.NVML_CLOCK_SM),
        "max_mem_clock_mhz": lambda: pynvml.nvmlDeviceGetMaxClockInfo(board, pynvml.NVML_CLOCK_MEM),
        "power_limit_w": lambda: pynvml.nvmlDeviceGetEnforcedPowerLimit(board) / 1000,
    }, unsupported))
    if unsupported:
        out["nvml_unsupported"] = unsupported
    return out


def _s(v) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)
