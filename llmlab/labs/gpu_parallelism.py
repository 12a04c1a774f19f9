"""Lab: see parallelism with your own eyes — the same work on a Python loop, CPU threads, and a GPU.

The article's sentences, each turned into a measurement:
1. "A CPU has a handful of powerful cores, a GPU thousands of simple ones": an elementwise
   fused multiply-add, a reduction and a matmul at growing sizes, done as a plain Python loop,
   vectorised on one CPU thread, on all CPU threads (a torch.set_num_threads sweep), and on the
   GPU (with and without the host<->device copies). Throughput per way, the crossover size where
   the GPU starts to win, and the CPU's thread scaling against ideal.
2. "Thousands of cores, in SMs": matmul throughput around multiples of the SM count (wave
   quantization: the saw-tooth).
3. "Tensor cores made the GPU an AI chip": matmul FLOP/s in FP32, TF32, BF16, FP16 (GPU); FP32 vs
   BF16 on the CPU, saying whether it has a matrix unit (AMX).
4. Launch overhead: B small matmuls one by one vs one batched bmm.
5. AlexNet (2012) conv1, 227x227x3 -> 96 filters 11x11 stride 4, at batch 128, CPU and GPU.
6. Host<->device copy bandwidth, pinned and pageable: data has to get to the GPU first.

References:
- NVIDIA, "Matrix Multiplication Background User's Guide" (tile and wave quantization).
- NVIDIA, "CUDA C++ Best Practices Guide" (pinned memory, asynchronous copies, launch overhead).
- Krizhevsky, Sutskever, Hinton, "ImageNet Classification with Deep Convolutional Neural
  Networks", NeurIPS 2012 (conv1: 96 kernels of 11x11x3, stride 4; two GTX 580 GPUs).
- llm.c dev/cuda: a CPU reference first, every variant checked against it before timing.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import pandas as pd
import torch
import torch.nn.functional as F

from llmlab.core.device import Device, cpu_cores, cpu_isa, cpu_load, is_oom, nvml_handle, resolve_device, set_tf32, torch_threads
from llmlab.core.device import tf32_knobs as _tf32_knobs  # the TF32 helper lives in core (item 16); old name kept
from llmlab.core.render import track
from llmlab.core.results import Chart, Claim, Col, LabResult, View
from llmlab.core.specs import bandwidth_spec_GBps, peak_for
from llmlab.core.timing import LATENCY, L2Flusher, Stats, interleaved, measure

LAB = "gpu-parallelism"
VERSION = 2  # 2: GPU sizes timed with L2 flushed; wave table with predicted boundaries; core.timing.interleaved
JUDGE_VERSION = 1
PARTS = ("sizes", "waves", "tensor-cores", "launch", "alexnet", "copies")
WORKS = ("elementwise", "reduction", "matmul")
NO_GPU = "not measured: no GPU"
TILE = 128  # the output tile one SM computes in the wave model (cuBLAS picks its own; 128 is typical)
CONV1 = dict(c_in=3, hw=227, c_out=96, k=11, stride=4)  # AlexNet conv1 -> 55x55 output


def _half_decades(lo: int, hi: int) -> tuple[int, ...]:
    out, e = [], math.log10(lo)
    while 10**e <= hi * 1.001:
        out.append(int(round(10**e)))
        e += 0.5
    return tuple(out)


@dataclass(frozen=True)
class Config:
    sizes: tuple[int, ...] = _half_decades(10**3, 10**8)  # elements: L1-resident (4 KB) to 4x the RAM traffic of any LLC
    matmul_ns: tuple[int, ...] = (16, 32, 64, 128, 256, 512, 1024, 2048)  # n of n x n @ n x n: 8 KFLOP to 17 GFLOP
    python_max_ops: int = 3 * 10**5  # Python loop cap (inner ops): ~0.1 s per call at ~250 ns per op
    max_threads: int | None = None  # top of the thread sweep; None = every usable CPU
    budget_s: float = 0.3  # time spent per measured point (at least 3 samples each)
    tc_n_cpu: int = 1024  # CPU FP32-vs-BF16 matmul: 2 GFLOP, compute bound, ~0.1 s on 2 cores
    tc_n_gpu: int = 8192  # GPU dtype matmul: 1.1 TFLOP, compute bound on any data-centre GPU
    wave_k: int = 4096  # inner dim of the wave sweep: enough work per tile to be compute bound
    wave_max_waves: int = 6  # the wave sweep covers 1..6 full waves of 128x128 tiles
    wave_step: int = 32  # M step of the wave sweep: 4 points per 128-row wave boundary
    launch_count: int = 1000  # B small matmuls vs one bmm: 1000 launches make the overhead visible
    launch_n: int = 32  # each small matmul is 32x32x32: 65 KFLOP, less work than one launch costs
    conv_batch: int = 128  # AlexNet's training batch size
    copy_sizes_mb: tuple[int, ...] = (1, 4, 16, 64, 256)  # host<->device copies: latency- to bandwidth-bound
    parts: tuple[str, ...] = PARTS  # which parts to run
    seed: int = 0  # the CLI sets it from --seed

    def __post_init__(self):
        for name in ("sizes", "matmul_ns", "copy_sizes_mb"):
            vals = getattr(self, name)
            if not vals or any(int(v) < 1 for v in vals):
                raise ValueError(f"{name} must be one or more positive integers, got {vals}")
        bad = [p for p in self.parts if p not in PARTS]
        if bad or not self.parts:
            raise ValueError(f"unknown part(s) {bad or '(none given)'}: choose from {', '.join(PARTS)}")
        usable = cpu_cores()["logical"]
        if self.max_threads is not None and not 1 <= self.max_threads <= usable:
            raise ValueError(f"max_threads must be 1..{usable} (the usable CPUs here), got {self.max_threads}")
        for name in ("tc_n_cpu", "tc_n_gpu", "wave_k", "wave_max_waves", "wave_step", "launch_count", "launch_n", "conv_batch"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.wave_step > TILE:
            raise ValueError(f"wave_step must be at most {TILE} (one tile row), got {self.wave_step}")
        if self.budget_s <= 0 or self.python_max_ops < 0:
            raise ValueError("budget_s must be > 0 and python_max_ops >= 0")

    @classmethod
    def quick(cls) -> Config:
        return cls(
            sizes=(10**3, 10**4, 10**5, 10**6, 10**7),  # still reaches past a 32 MB L3 at 1e7 (160 MB moved)
            matmul_ns=(16, 64, 256, 512),
            python_max_ops=3 * 10**4,
            budget_s=0.05,
            tc_n_cpu=512,
            tc_n_gpu=4096,
            wave_max_waves=4,
            launch_count=256,
            conv_batch=8,
            copy_sizes_mb=(1, 16, 64),
        )


def run(cfg: Config, device: Device, progress=None) -> LabResult:
    """Measures. Returns data. Never prints."""
    res = LabResult.new(LAB, VERSION, cfg)
    cpu = resolve_device("cpu")
    gpu = device if device.is_cuda else None
    sweep = thread_counts(cfg.max_threads or cpu_cores()["logical"])
    res.env["lab"] = {"cpu_isa": cpu_isa(), "cpu_cores": cpu_cores(), "thread_sweep": list(sweep), "gpu": gpu.spec if gpu else None}
    load, usable = cpu_load()
    res.env["lab"]["loadavg_1min_at_start"] = load
    if load is not None and load >= 0.5 * usable:
        res.note(f"busy CPU (load {load:.1f} on {usable} CPUs): multi-thread timings come out pessimistic")
    if gpu is None:
        res.skipped["wave_quantization, copy_bandwidth, GPU rows"] = "no GPU"
    with res.guard(), torch.no_grad(), keep_torch_settings():
        set_tf32(matmul=False, conv=False)  # strict FP32 unless a part asks for TF32
        if gpu is not None:
            torch.ones(1, device=gpu.torch).sum().item()  # create the CUDA context before anything is timed
        if "sizes" in cfg.parts:
            part_sizes(res, cfg, cpu, gpu, sweep, progress)
        if "waves" in cfg.parts:
            part_waves(res, cfg, gpu, progress)
        if "tensor-cores" in cfg.parts:
            part_tensor_cores(res, cfg, cpu, gpu)
        if "launch" in cfg.parts:
            part_launch(res, cfg, cpu, gpu, sweep[-1])
        if "alexnet" in cfg.parts:
            part_alexnet(res, cfg, cpu, gpu)
        if "copies" in cfg.parts:
            part_copies(res, cfg, gpu, progress)
    return res


# ---------------------------------------------------------------- helpers


def thread_counts(cores: int) -> tuple[int, ...]:
    """1, 2, 4, ... below `cores`, then `cores` itself."""
    out, t = [], 1
    while t < cores:
        out.append(t)
        t *= 2
    return (*out, cores)


def threads_setter(n: int) -> Callable[[], None]:
    return lambda: torch.set_num_threads(n)


@contextmanager
def keep_torch_settings() -> Iterator[None]:
    """Whatever the lab changes (threads, TF32 for CUDA matmuls and cuDNN convs) is restored on exit."""
    threads = torch.get_num_threads()
    saved = {name: getattr(obj, attr) for name, (obj, attr, _, _) in _tf32_knobs().items()}
    try:
        yield
    finally:
        torch.set_num_threads(threads)
        for name, (obj, attr, _, _) in _tf32_knobs().items():
            setattr(obj, attr, saved[name])


def time_fn(fn: Callable[[], object], device: Device, budget_s: float, setup: Callable[[], object] | None = None) -> Stats:
    """A warm-up call and a probe call, then as many timed calls as fit in budget_s (3..500).

    One sample per call, so per-call dispatch and launch overhead is in every sample: at small
    sizes that overhead is what the lab shows.
    """
    for _ in range(2):  # the first call warms up (lazy init, caches); the second is the probe
        if setup:
            setup()
        t0 = time.perf_counter()
        fn()
        device.synchronize()
        probe = time.perf_counter() - t0
    repeats = int(min(500, max(3, budget_s / max(probe, 1e-6))))
    return measure(fn, device, mode=LATENCY, warmup=0 if probe > 0.05 else 3, repeats=repeats, setup=setup, max_time_s=budget_s)  # a slow probe was warm-up enough


def time_interleaved(fns: list[Callable[[], object]], device: Device, budget_s: float, setups: list[Callable[[], object]] | None = None) -> list[Stats]:
    """Time several fns in alternation with core.timing.interleaved, ~budget_s each (3..500 rounds).

    On a shared machine a busy neighbour then slows every variant alike, so their ratio holds.
    `setups[i]` runs before each call of fns[i], outside the timed region.
    """
    setups = setups or [None] * len(fns)
    probes = [time_fn(fn, device, budget_s / 10, setup=setup).median_s for fn, setup in zip(fns, setups, strict=True)]  # warm-up, estimate
    repeats = int(min(500, max(3, budget_s / max(max(probes), 1e-6))))
    names = {str(i): fn for i, fn in enumerate(fns)}
    done = interleaved(names, repeats, device, setups={str(i): st for i, st in enumerate(setups) if st},
                       max_time_s=budget_s * len(fns))
    return [done.stats(str(i)) for i in range(len(fns))]


def stats_cols(st: Stats) -> dict[str, float | int]:
    """Timing columns of a table row (the number of samples, min, max and mean stay out: tables stay readable)."""
    return {"median_ms": st.median_ms, "p10_ms": st.p10_ms, "p90_ms": st.p90_ms}


def rel_err(x: torch.Tensor, ref: torch.Tensor) -> float:
    """||x - ref|| / ||ref||, on x's device, in float64 if either side is float64 (else float32: enough for 1e-5)."""
    dtype = torch.float64 if torch.float64 in (x.dtype, ref.dtype) else torch.float32
    x, ref = x.detach().to(dtype), ref.detach().to(device=x.device, dtype=dtype)
    return float((x - ref).norm() / ref.norm().clamp_min(1e-30))


def cpu_peak_gflops(threads: int) -> float | None:
    """The CPU's FP32 spec peak, scaled to the physical cores `threads` can occupy."""
    peak, _ = peak_for(resolve_device("cpu"), "fp32")
    phys = cpu_cores()["physical"]
    return peak * min(threads, phys) / phys if peak else None


def _pct(x: float | None, peak: float | None) -> float | None:
    return 100 * x / peak if x is not None and peak else None


# ---------------------------------------------------------------- part 1: the same work, four ways


def fma_py(a: list[float], b: list[float], c: list[float]) -> list[float]:
    return [x * y + z for x, y, z in zip(a, b, c, strict=True)]


def sum_py(a: list[float]) -> float:
    s = 0.0
    for x in a:
        s += x
    return s


def matmul_py(a: list[list[float]], b: list[list[float]]) -> list[list[float]]:
    bt = list(zip(*b, strict=True))  # columns of b
    return [[sum(x * y for x, y in zip(row, col, strict=True)) for col in bt] for row in a]


def work_counts(work: str, size: int) -> dict[str, int]:
    """Elements, FLOPs, minimum bytes moved (FP32) and Python inner ops for one call."""
    if work == "elementwise":  # out = a * b + c: 2 FLOPs, 3 reads + 1 write per element
        return {"elements": size, "flops": 2 * size, "bytes": 16 * size, "py_ops": size}
    if work == "reduction":  # s = sum(a): 1 FLOP, 1 read per element
        return {"elements": size, "flops": size, "bytes": 4 * size, "py_ops": size}
    return {"elements": size * size, "flops": 2 * size**3, "bytes": 12 * size * size, "py_ops": size**3}  # n x n matmul


def work_inputs(work: str, size: int, gen: torch.Generator) -> tuple[torch.Tensor, ...]:
    if work == "elementwise":
        return tuple(torch.randn(size, generator=gen) for _ in range(3))  # a, b, c: (N,)
    if work == "reduction":
        return (torch.rand(size, generator=gen),)  # positive: the sum has no cancellation to hide errors
    return tuple(torch.randn(size, size, generator=gen) for _ in range(2))  # a, b: (n, n)


def work_fn(work: str, xs: tuple[torch.Tensor, ...]) -> Callable[[], torch.Tensor]:
    """The vectorised call on the tensors' device; it returns its result."""
    if work == "elementwise":
        a, b, c = xs
        out = torch.empty_like(a)
        fn = lambda: torch.addcmul(c, a, b, out=out)  # noqa: E731  one fused pass: out = c + a * b
    elif work == "reduction":
        (a,) = xs
        fn = lambda: torch.sum(a)  # noqa: E731
    else:
        a, b = xs
        out = torch.empty_like(a)
        fn = lambda: torch.mm(a, b, out=out)  # noqa: E731
    return fn


def work_py(work: str, xs: tuple[torch.Tensor, ...]) -> Callable[[], object]:
    lists = [x.tolist() for x in xs]
    if work == "elementwise":
        return lambda: fma_py(*lists)
    if work == "reduction":
        return lambda: sum_py(*lists)
    return lambda: matmul_py(*lists)


def work_with_copies(work: str, xs: tuple[torch.Tensor, ...], gpu: Device) -> Callable[[], torch.Tensor]:
    """Copy the (pageable) host inputs to the GPU, compute, copy the result back: what a one-off call costs."""

    def fn():
        ys = tuple(x.to(gpu.torch) for x in xs)
        if work == "elementwise":
            out = torch.addcmul(ys[2], ys[0], ys[1])
        elif work == "reduction":
            out = torch.sum(ys[0])
        else:
            out = torch.mm(ys[0], ys[1])
        return out.cpu()

    return fn


def matches(work: str, out, ref: torch.Tensor) -> bool:
    out = torch.as_tensor(out, dtype=torch.float64) if not isinstance(out, torch.Tensor) else out
    return rel_err(out, ref) < (1e-4 if work == "matmul" else 1e-5)


def part_sizes(res: LabResult, cfg: Config, cpu: Device, gpu: Device | None, sweep: tuple[int, ...], progress) -> None:
    gen = torch.Generator().manual_seed(cfg.seed)
    top = sweep[-1]
    flush = L2Flusher(gpu) if gpu is not None else None  # 2x L2 overwritten before each GPU call
    scaling: list[dict] = []
    mismatches: list[str] = []
    for work in WORKS:
        sizes = cfg.matmul_ns if work == "matmul" else cfg.sizes
        rows: list[dict] = []
        try:  # on Ctrl-C the sizes measured so far still make a table
            for size in track(progress, sizes, f"{work} sizes"):
                try:
                    xs = work_inputs(work, size, gen)
                    fn = work_fn(work, xs)
                    ref = fn().clone()  # the reference: vectorised on the CPU, default threads
                except (RuntimeError, MemoryError) as exc:
                    if not is_oom(exc):
                        raise
                    res.note(f"{work}: out of memory at size {size:,}; the sweep stops there")
                    break

                if work_counts(work, size)["py_ops"] <= cfg.python_max_ops:
                    py = work_py(work, xs)
                    rows.append(size_row(work, "python loop", size, time_fn(py, cpu, cfg.budget_s), matches(work, py(), ref), None, None))
                threads = sweep if size == sizes[-1] else tuple(sorted({1, top}))
                with torch_threads(torch.get_num_threads()):  # the thread count comes back afterwards
                    stats = time_interleaved([fn] * len(threads), cpu, cfg.budget_s, [threads_setter(t) for t in threads])
                    oks = []
                    for t in threads:
                        torch.set_num_threads(t)
                        oks.append(matches(work, fn(), ref))
                for t, st, ok in zip(threads, stats, oks, strict=True):
                    if t in (1, top):
                        rows.append(size_row(work, cpu_way(t), size, st, ok, cpu_peak_gflops(t), None))
                    if size == sizes[-1]:
                        scaling.append({"work": work, "size": size, "threads": t, **stats_cols(st)})
                if gpu is not None:
                    gxs = tuple(x.to(gpu.torch) for x in xs)
                    gfn = work_fn(work, gxs)
                    peak_g, peak_bw = peak_for(gpu, "fp32")[0], bandwidth_spec_GBps(gpu)[0]
                    # L2 flushed before every timed call: a size that fits in L2 would otherwise beat HBM's spec (issue 12 item 18)
                    st = time_fn(gfn, gpu, cfg.budget_s, setup=flush)
                    rows.append(size_row(work, "gpu", size, st, matches(work, gfn(), ref), peak_g, peak_bw))
                    copies = work_with_copies(work, xs, gpu)
                    rows.append(size_row(work, "gpu + copies", size, time_fn(copies, gpu, cfg.budget_s), matches(work, copies(), ref), peak_g, None))
                    del gxs, gfn
                del xs, fn, ref
        finally:
            if rows:
                res.add_table(f"throughput_{work}", rows)
        mismatches += [f"{work} {r['way']} size {r['size']}" for r in rows if not r["ok"]]
    res.add_table("thread_scaling", scaling_rows(scaling))
    if mismatches:
        res.note(f"do NOT match the CPU reference: {', '.join(mismatches)}")


def size_row(work: str, way: str, size: int, st: Stats, ok: bool, peak_gflops: float | None, peak_GBps: float | None) -> dict:
    """One measurement of part 1: timing, throughput in three units, and the share of the FP32 / bandwidth peak.

    `ok`: the result matches the CPU reference. Bytes are the minimum moved (each input read once,
    the output written once), so GBps is a lower bound on the real traffic.
    """
    c, s = work_counts(work, size), st.median_s
    gflops, gbps = c["flops"] / s / 1e9, c["bytes"] / s / 1e9
    return {
        "way": way, "size": size, **stats_cols(st), "gelems_per_s": c["elements"] / s / 1e9, "gflops": gflops, "GBps": gbps,
        "pct_peak_flops": _pct(gflops, peak_gflops), "pct_peak_bw": _pct(gbps, peak_GBps), "ok": ok,
    }


def cpu_way(threads: int) -> str:
    return f"cpu {threads} thread{'s' if threads > 1 else ''}"


def scaling_rows(rows: list[dict]) -> list[dict]:
    """Speed-up over 1 thread and parallel efficiency; an 'ideal' series for the chart."""
    out = []
    for r in rows:
        one = next(x for x in rows if x["work"] == r["work"] and x["threads"] == 1)
        sp = one["median_ms"] / r["median_ms"]
        out.append({**r, "speedup": sp, "ideal_speedup": float(r["threads"]), "efficiency_pct": 100 * sp / r["threads"]})
    out += [{"work": "ideal", "threads": t, "speedup": float(t), "ideal_speedup": float(t)} for t in sorted({r["threads"] for r in rows})]
    return out


def _size_for_flops(work: str, flops: float) -> int:
    n = {"elementwise": flops / 2, "reduction": flops, "matmul": (flops / 2) ** (1 / 3)}[work]
    return int(float(f"{max(n, 1):.1g}"))


# ---------------------------------------------------------------- part 2: wave quantization


def part_waves(res: LabResult, cfg: Config, gpu: Device | None, progress) -> None:
    if gpu is None:
        return
    sms = torch.cuda.get_device_properties(gpu.index).multi_processor_count
    n, k = TILE * sms, cfg.wave_k
    ms = list(range(cfg.wave_step, TILE * cfg.wave_max_waves + TILE // 2 + 1, cfg.wave_step))
    gen = torch.Generator(device=gpu.torch).manual_seed(cfg.seed)
    a_all = torch.randn(ms[-1], k, device=gpu.torch, dtype=torch.float16, generator=gen)  # (M_max, K)
    b = torch.randn(k, n, device=gpu.torch, dtype=torch.float16, generator=gen)  # (K, N)
    rows = []
    for m in track(progress, ms, "wave sweep"):
        a, out = a_all[:m], torch.empty(m, n, device=gpu.torch, dtype=torch.float16)
        st = time_fn(lambda a=a, out=out: torch.mm(a, b, out=out), gpu, cfg.budget_s)
        tiles = math.ceil(m / TILE) * (n // TILE)
        rows.append({"M": m, "N": n, "K": k, "sms": sms, "tiles": tiles, "waves": tiles / sms, **stats_cols(st), "tflops": 2 * m * n * k / st.median_s / 1e12})
    res.add_table("wave_quantization", wave_rows(rows, cfg.wave_step))


def wave_rows(rows: list[dict], step: int) -> list[dict]:
    """Adds the prediction: `boundary` marks the first M past a full wave (M - step <= TILE*w < M: with
    N = TILE x SMs every extra tile row is one more wave), `drop` the TFLOP/s lost from the point before."""
    out = []
    for i, r in enumerate(rows):
        prev = rows[i - 1] if i else None
        crossed = prev is not None and math.ceil(prev["M"] / TILE) < math.ceil(r["M"] / TILE)
        out.append({**r, "boundary": crossed, "drop": 1 - r["tflops"] / prev["tflops"] if prev else 0.0})
    return out


# ---------------------------------------------------------------- part 3: tensor cores


def matmul_fn(device: Device, dtype: torch.dtype, n: int, seed: int) -> Callable[[], torch.Tensor]:
    """An n x n x n matmul in dtype on device, writing into one preallocated output."""
    gen = torch.Generator(device=device.torch).manual_seed(seed)
    a = torch.randn(n, n, device=device.torch, generator=gen).to(dtype)  # (n, n)
    b = torch.randn(n, n, device=device.torch, generator=gen).to(dtype)  # (n, n)
    out = torch.empty(n, n, device=device.torch, dtype=dtype)
    return lambda: torch.mm(a, b, out=out)


def tf32_setter(on: bool) -> Callable[[], None]:
    """TF32 for the next FP32 CUDA matmul: False = strict FP32 (IEEE), True = TF32 tensor cores."""
    return lambda: set_tf32(matmul=on)


def part_tensor_cores(res: LabResult, cfg: Config, cpu: Device, gpu: Device | None) -> None:
    rows, sources = [], {}
    rates: dict[tuple[str, str, int], float] = {}  # (device, dtype, n) -> measured GFLOP/s
    dtypes = {"fp32": (torch.float32, False), "tf32": (torch.float32, True), "bf16": (torch.bfloat16, False), "fp16": (torch.float16, False)}
    for dev, n, names in ((cpu, cfg.tc_n_cpu, ("fp32", "bf16")), (gpu, cfg.tc_n_gpu, ("fp32", "tf32", "bf16", "fp16"))):
        if dev is None:
            continue
        fns = [matmul_fn(dev, dtypes[name][0], n, cfg.seed) for name in names]
        setups = [tf32_setter(dtypes[name][1]) for name in names]
        outs = []
        for fn, setup in zip(fns, setups, strict=True):
            setup()
            outs.append(fn().float())
        stats = time_interleaved(fns, dev, cfg.budget_s, setups)  # interleaved: a busy neighbour slows every dtype alike
        set_tf32(matmul=False)
        for name, st, out in zip(names, stats, outs, strict=True):
            gflops = 2 * n**3 / st.median_s / 1e9
            peak, source = peak_for(dev, name)
            rates[(dev.spec, name, n)] = gflops
            rows.append({"device": dev.spec, "dtype": name, "n": n, **stats_cols(st), "gflops": gflops, "peak_gflops": peak, "pct_of_peak": _pct(gflops, peak),
                         "speedup_vs_fp32": gflops / rates[(dev.spec, "fp32", n)], "rel_err_vs_fp32": rel_err(out, outs[0])})
            sources[dev.spec] = source
    res.add_table("tensor_cores", rows)
    res.env["lab"]["peak_sources"] = sources


# ---------------------------------------------------------------- part 4: launch overhead


def launch_fns(dev: Device, bsz: int, n: int, seed: int) -> tuple[Callable[[], torch.Tensor], Callable[[], torch.Tensor]]:
    """(B separate torch.mm calls, one torch.bmm) over the same (B, n, n) inputs; each returns its output."""
    gen = torch.Generator(device=dev.torch).manual_seed(seed)
    a = torch.randn(bsz, n, n, device=dev.torch, generator=gen)  # (B, n, n)
    b = torch.randn(bsz, n, n, device=dev.torch, generator=gen)  # (B, n, n)
    out_loop, out_bmm = torch.empty_like(a), torch.empty_like(a)
    triples = list(zip(a.unbind(0), b.unbind(0), out_loop.unbind(0), strict=True))  # views made once, outside the timing

    def loop() -> torch.Tensor:
        for x, y, o in triples:
            torch.mm(x, y, out=o)  # one dispatch (CPU) / one kernel launch (GPU) each
        return out_loop

    return loop, lambda: torch.bmm(a, b, out=out_bmm)


def part_launch(res: LabResult, cfg: Config, cpu: Device, gpu: Device | None, top: int) -> None:
    rows, bsz, n = [], cfg.launch_count, cfg.launch_n
    runs = [(cpu, 1)] + ([(cpu, top)] if top > 1 else []) + ([(gpu, None)] if gpu else [])
    for dev, threads in runs:
        with torch_threads(threads or torch.get_num_threads()):
            loop, bmm = launch_fns(dev, bsz, n, cfg.seed)
            ok = rel_err(loop(), bmm()) < 1e-5
            st_loop, st_bmm = time_interleaved([loop, bmm], dev, cfg.budget_s)
        for way, st in (("loop of mm", st_loop), ("one bmm", st_bmm)):
            rows.append({"device": dev.spec, "threads": threads, "way": way, "count": bsz, "n": n, **stats_cols(st), "us_per_matmul": 1e3 * st.median_ms / bsz,
                         "gflops": 2 * bsz * n**3 / st.median_s / 1e9, "ok": ok})
    res.add_table("launch_overhead", rows)


# ---------------------------------------------------------------- part 5: AlexNet conv1


def conv1_flops(batch: int) -> int:
    """2 x B x C_out x H_out x W_out x (C_in x k x k): 2 x 96 x 55 x 55 x 363 = 211 MFLOP per image."""
    c = CONV1
    hw_out = (c["hw"] - c["k"]) // c["stride"] + 1  # 55
    return 2 * batch * c["c_out"] * hw_out * hw_out * c["c_in"] * c["k"] * c["k"]


def conv1_im2col(x: torch.Tensor, w: torch.Tensor, stride: int) -> torch.Tensor:
    """The reference: a convolution is a matmul over unfolded patches."""
    bsz, k = x.shape[0], w.shape[-1]
    hw_out = (x.shape[-1] - k) // stride + 1
    cols = F.unfold(x, k, stride=stride)  # (B, C_in*k*k, H_out*W_out) = (B, 363, 3025)
    out = w.reshape(w.shape[0], -1) @ cols  # (B, 96, 3025)
    return out.reshape(bsz, w.shape[0], hw_out, hw_out)


def part_alexnet(res: LabResult, cfg: Config, cpu: Device, gpu: Device | None) -> None:
    c, bsz = CONV1, cfg.conv_batch
    gen = torch.Generator().manual_seed(cfg.seed)
    x = torch.randn(bsz, c["c_in"], c["hw"], c["hw"], generator=gen)  # (B, 3, 227, 227)
    w = torch.randn(c["c_out"], c["c_in"], c["k"], c["k"], generator=gen) / 11  # (96, 3, 11, 11)
    ref = conv1_im2col(x[:2], w, c["stride"])
    flops, rows, peaks = conv1_flops(bsz), [], {}
    set_tf32(conv=False)  # strict FP32 on the GPU too, like the CPU (restored by keep_torch_settings)
    for dev in (cpu, gpu):
        if dev is None:
            continue
        xd, wd = x.to(dev.torch), w.to(dev.torch)
        ok = rel_err(F.conv2d(xd[:2], wd, stride=c["stride"]), ref) < 1e-4
        n = cfg.tc_n_cpu if not dev.is_cuda else cfg.tc_n_gpu
        # the napkin's matmul rate is timed interleaved with the conv: a busy neighbour slows both alike
        st, st_mm = time_interleaved([lambda xd=xd, wd=wd: F.conv2d(xd, wd, stride=c["stride"]), matmul_fn(dev, torch.float32, n, cfg.seed)], dev, cfg.budget_s)
        mm = 2 * n**3 / st_mm.median_s / 1e9
        peak = peak_for(dev, "fp32")[0]
        rows.append({"device": dev.spec, "threads": None if dev.is_cuda else torch.get_num_threads(), "batch": bsz, "gflop": flops / 1e9, **stats_cols(st),
                     "gflops": flops / st.median_s / 1e9, "matmul_gflops": mm, "napkin_ms": flops / mm / 1e6, "pct_of_peak": _pct(flops / st.median_s / 1e9, peak), "ok": ok})
        peaks[dev.spec] = peak
    res.add_table("alexnet_conv1", rows)
    res.env["lab"]["gtx580_ms"] = flops / 1.58e12 * 1e3  # AlexNet's GTX 580 (1.58 TFLOP/s FP32) needed at least this


# ---------------------------------------------------------------- part 6: host <-> device copies


def pcie_GBps(gpu: Device) -> tuple[float | None, str]:
    """Per-direction PCIe link bandwidth from NVML's max generation and width for this device in this system.

    (The *current* generation drops while the link idles, so it would understate the link.)
    """
    per_lane = {1: 0.25, 2: 0.5, 3: 0.985, 4: 1.969, 5: 3.938, 6: 7.563}  # GB/s per lane after encoding
    try:
        import pynvml

        pynvml.nvmlInit()
        h, _ = nvml_handle(pynvml, gpu.index)  # by UUID: torch's index is not NVML's under CUDA_VISIBLE_DEVICES
        gen, width = pynvml.nvmlDeviceGetMaxPcieLinkGeneration(h), pynvml.nvmlDeviceGetMaxPcieLinkWidth(h)
        return per_lane.get(gen, 0) * width or None, f"PCIe gen {gen} x{width} (NVML)"
    except Exception as exc:  # NVML absent or failing: say so instead of guessing
        return None, f"PCIe link unknown ({type(exc).__name__})"


def copy_fn(direction: str, host: torch.Tensor, dev_buf: torch.Tensor, non_blocking: bool) -> Callable[[], torch.Tensor]:
    """One copy; asynchronous only from pinned memory (the CUDA events still bracket it)."""
    if direction == "host->device":
        return lambda: dev_buf.copy_(host, non_blocking=non_blocking)
    return lambda: host.copy_(dev_buf, non_blocking=non_blocking)


def part_copies(res: LabResult, cfg: Config, gpu: Device | None, progress) -> None:
    if gpu is None:
        return
    link, source = pcie_GBps(gpu)
    rows = []
    for mb in track(progress, cfg.copy_sizes_mb, "copies"):
        nbytes = mb * 2**20
        dev_buf = torch.empty(nbytes, dtype=torch.uint8, device=gpu.torch)
        for memory in ("pageable", "pinned"):
            host = torch.ones(nbytes, dtype=torch.uint8)
            host = host.pin_memory() if memory == "pinned" else host
            for direction in ("host->device", "device->host"):
                st = time_fn(copy_fn(direction, host, dev_buf, non_blocking=memory == "pinned"), gpu, cfg.budget_s)
                bw = nbytes / st.median_s / 1e9
                rows.append({"memory": memory, "direction": direction, "MiB": mb, **stats_cols(st), "GBps": bw, "link_GBps": link, "pct_of_link": _pct(bw, link)})
        del dev_buf, host
    res.add_table("copy_bandwidth", rows)
    res.env["lab"]["pcie"] = source


# ---------------------------------------------------------------- judge


def _ms(df: pd.DataFrame, **eq) -> float | None:
    sub = df
    for k, v in eq.items():
        sub = sub[sub[k] == v]
    return float(sub["median_ms"].iloc[0]) if len(sub) else None


def _top(result: LabResult) -> int:
    return int(max(result.env.get("lab", {}).get("thread_sweep") or [1]))


def judge(result: LabResult) -> list[Claim]:
    """Pure: every verdict from result.tables and result.env["lab"] alone."""
    t, out = result.tables, []
    if "throughput_elementwise" in t:
        out += [_python_claim(t["throughput_elementwise"])]
    if "thread_scaling" in t:
        out += _scaling_claims(t["thread_scaling"], _top(result))
    if all(f"throughput_{w}" in t for w in WORKS):
        out.append(_crossover_claim({w: t[f"throughput_{w}"] for w in WORKS}, _top(result)))
    if "wave_quantization" in t or "throughput_elementwise" in t:
        out.append(wave_claim(t.get("wave_quantization")))
    if "tensor_cores" in t:
        out += _tensor_claims(t["tensor_cores"], result.env.get("lab", {}).get("cpu_isa", {}))
    if "launch_overhead" in t:
        out += _launch_claims(t["launch_overhead"])
    if "alexnet_conv1" in t:
        out += _alexnet_claims(t["alexnet_conv1"])
    if "throughput_elementwise" in t:
        out.append(_copy_claim(t.get("copy_bandwidth")))
    return out


def _python_claim(el: pd.DataFrame) -> Claim:
    cid, text = "gpu_parallelism.python_loop_vs_vectorised", "a Python loop is >= 100x slower than one vectorised thread"
    py = el[el.way == "python loop"]
    if py.empty:
        return Claim(cid, text, ">= 100x", "-", None, "the loop was not run (python_max_ops)")
    size = int(py["size"].max())
    ratio = _ms(py, size=size) / _ms(el, way="cpu 1 thread", size=size)
    return Claim(cid, text, ">= 100x", f"{ratio:,.0f}x (FMA, {size:,} elements)", ratio >= 100)


def _scaling_claims(sc: pd.DataFrame, top: int) -> list[Claim]:
    ids = ("gpu_parallelism.matmul_thread_scaling", "gpu_parallelism.fma_scales_worse_than_matmul")
    texts = (f"matmul scales near-linearly over {top} CPU threads", "memory-bound FMA scales worse than matmul")
    if top == 1:
        return [Claim(i, x, ">= 75% of ideal", "-", None, "one usable CPU") for i, x in zip(ids, texts, strict=True)]
    at = {w: sc[(sc.work == w) & (sc.threads == top)].iloc[0] for w in WORKS}
    eff = {w: float(r["efficiency_pct"]) for w, r in at.items()}
    spd = {w: float(r["speedup"]) for w, r in at.items()}
    return [Claim(ids[0], texts[0], f">= 75% of ideal ({top}x)", f"{spd['matmul']:.2f}x ({eff['matmul']:.0f}% of ideal)", eff["matmul"] >= 75),
            Claim(ids[1], texts[1], "FMA's % of ideal < matmul's", f"FMA {spd['elementwise']:.2f}x, matmul {spd['matmul']:.2f}x",
                  eff["elementwise"] < eff["matmul"])]


def crossover(gpu_ms: dict[int, float], cpu_ms: dict[int, float]) -> int | None:
    """The smallest size from which the GPU is faster at that size and at every larger measured size."""
    sizes = sorted(set(gpu_ms) & set(cpu_ms))
    wins = [gpu_ms[s] < cpu_ms[s] for s in sizes]
    return next((s for i, s in enumerate(sizes) if all(wins[i:])), None)


def _crossover_claim(tbl: dict[str, pd.DataFrame], top: int) -> Claim:
    cid, text = "gpu_parallelism.gpu_crossover", f"the GPU beats {top} CPU threads only above a size (FMA, sum, n)"
    way = cpu_way(top)
    exp = {w: _size_for_flops(w, 5e-6 * float(t[t.way == way]["gflops"].max()) * 1e9) for w, t in tbl.items()}
    expected = "for each, a crossover > the smallest size (napkin ~" + ", ".join(_compact(exp[w]) for w in WORKS) + ")"
    if not any((t.way == "gpu").any() for t in tbl.values()):
        return Claim(cid, text, expected, "-", None, "no GPU")
    xs, smallest_ok = {}, True
    for w, t in tbl.items():
        cpu = dict(zip(t[t.way == way]["size"], t[t.way == way]["median_ms"], strict=True))
        g = t[t.way == "gpu"]
        xs[w] = crossover(dict(zip(g["size"], g["median_ms"], strict=True)), cpu)
        smallest_ok &= xs[w] is not None and xs[w] > min(cpu)
    meas = ", ".join(_compact(xs[w]) if xs[w] is not None else "never" for w in WORKS)
    return Claim(cid, text, expected, meas, smallest_ok)


def _compact(n: int) -> str:
    """10000 -> "1e4", 7000 -> "7e3", 256 -> "256"."""
    return f"{n:.0e}".replace("e+0", "e").replace("e+", "e") if n >= 1000 and n == float(f"{n:.0e}") else f"{n:,}"


def wave_claim(wq: pd.DataFrame | None, min_drop: float = 0.05) -> Claim:
    """Issue 12 item 6: drops > 5% must sit at the predicted wave boundaries (within one sweep step), and at
    least half of the boundaries must show one; a drop anywhere else refutes the saw-tooth."""
    cid, text = "gpu_parallelism.wave_quantization", f"matmul FLOP/s drops > {100 * min_drop:.0f}% just past each full wave"
    expected = f"drops only within a step of M = {TILE}w, at >= half of them"
    if wq is None or wq.empty:
        return Claim(cid, text, expected, "-", None, "no GPU")
    bidx = [i for i, b in enumerate(wq["boundary"]) if bool(b)]
    near = {j for i in bidx for j in (i - 1, i, i + 1)}
    drops = [i for i, d in enumerate(wq["drop"]) if float(d) > min_drop]
    hit = sum(any(j in drops for j in (i - 1, i, i + 1)) for i in bidx)
    stray = [int(wq["M"].iloc[i]) for i in drops if i not in near]
    holds = bool(bidx) and 2 * hit >= len(bidx) and not stray
    meas = f"{hit}/{len(bidx)} waves, {len(stray)} stray"
    return Claim(cid, text, expected, meas, holds)


def _tensor_claims(tc: pd.DataFrame, isa: dict) -> list[Claim]:
    cpu = tc[tc.device == "cpu"]
    r = float(cpu[cpu.dtype == "bf16"]["speedup_vs_fp32"].iloc[0])
    p32, pb = (cpu[cpu.dtype == d]["peak_gflops"].iloc[0] for d in ("fp32", "bf16"))
    unit = "AMX" if isa.get("amx_bf16") else ("AVX512_BF16" if isa.get("avx512_bf16") else "no BF16 unit")
    out = [Claim("gpu_parallelism.cpu_bf16_beats_fp32", f"BF16 matmul beats FP32 on this CPU ({unit})",
                 f"> 1.05x (spec peaks: {pb / p32:.0f}x)" if p32 and pb and not pd.isna(p32) else "> 1.05x (only with BF16 hardware)",
                 f"{r:.2f}x (n = {int(cpu['n'].iloc[0])})", r > 1.05)]
    gpu = tc[tc.device != "cpu"]
    text = "tensor cores: BF16 >= 4x, TF32 >= 1.5x strict FP32"
    if gpu.empty:
        return out + [Claim("gpu_parallelism.tensor_cores", text, "BF16 >= 4x, TF32 >= 1.5x", "-", None, "no GPU")]
    sp = {d: float(gpu[gpu.dtype == d]["speedup_vs_fp32"].iloc[0]) for d in ("bf16", "tf32")}
    pk = {d: gpu[gpu.dtype == d]["peak_gflops"].iloc[0] for d in ("fp32", "tf32", "bf16")}
    spec = f" (spec: {pk['bf16'] / pk['fp32']:.0f}x, {pk['tf32'] / pk['fp32']:.0f}x)" if all(v and not pd.isna(v) for v in pk.values()) else ""
    exp = f"BF16 >= 4x, TF32 >= 1.5x{spec}"
    return out + [Claim("gpu_parallelism.tensor_cores", text, exp, f"BF16 {sp['bf16']:.1f}x, TF32 {sp['tf32']:.1f}x",
                        sp["bf16"] >= 4 and sp["tf32"] >= 1.5)]


def _launch_claims(lo: pd.DataFrame) -> list[Claim]:
    out = []
    for cid, where, sub in (("gpu_parallelism.batched_beats_loop_cpu", "CPU", lo[lo.device == "cpu"]),
                            ("gpu_parallelism.batched_beats_loop_gpu", "GPU", lo[lo.device != "cpu"])):
        n, count = (int(sub[c].iloc[0]) if len(sub) else 0 for c in ("n", "count"))
        text = f"one bmm is >= 2x faster than {count or 'B'} separate small matmuls ({where})"
        if sub.empty:
            out.append(Claim(cid, text, ">= 2x (the loop pays B launches of ~5 us)", "-", None, "no GPU"))
            continue
        parts, ok = [], True
        for threads, g in sub.groupby("threads", dropna=False, sort=False):
            ratio = _ms(g, way="loop of mm") / _ms(g, way="one bmm")
            ok &= ratio >= 2
            parts.append(f"{ratio:.2g}x" + ("" if pd.isna(threads) else f" at {int(threads)}t"))
        exp = ">= 2x at every thread count (the loop pays B dispatches of 1-5 us)" if where == "CPU" else ">= 2x (the loop pays B launches of ~5 us)"
        out.append(Claim(cid, text, exp, ", ".join(parts), ok))
    return out


def _alexnet_claims(ax: pd.DataFrame) -> list[Claim]:
    r = ax[ax.device == "cpu"].iloc[0]
    ratio = float(r["median_ms"]) / float(r["napkin_ms"])
    out = [Claim("gpu_parallelism.alexnet_conv1_is_matmul", "AlexNet conv1 takes its FLOPs / the matmul rate (CPU)",
                 f"within 0.5-2x of {float(r['napkin_ms']):.0f} ms", f"{float(r['median_ms']):.0f} ms ({ratio:.2f}x napkin)", 0.5 <= ratio <= 2)]
    text = f"the GPU runs AlexNet conv1 >= 10x faster than the CPU (batch {int(r['batch'])})"
    g = ax[ax.device != "cpu"]
    if g.empty:
        return out + [Claim("gpu_parallelism.alexnet_gpu_10x", text, ">= 10x", "-", None, "no GPU")]
    sp = float(r["median_ms"]) / float(g["median_ms"].iloc[0])
    return out + [Claim("gpu_parallelism.alexnet_gpu_10x", text, ">= 10x", f"{sp:.0f}x ({float(g['median_ms'].iloc[0]):.2f} ms)", sp >= 10)]


def _copy_claim(cb: pd.DataFrame | None) -> Claim:
    cid, text = "gpu_parallelism.pinned_beats_pageable", "pinned host memory copies >= 1.1x faster than pageable"
    if cb is None or cb.empty:
        return Claim(cid, text, "pinned > 1.1x pageable", "-", None, "no GPU")
    big = cb[(cb.direction == "host->device") & (cb["MiB"] == cb["MiB"].max())]  # the largest copy: bandwidth, not latency
    best = big.groupby("memory")["GBps"].max()
    link = cb["link_GBps"].iloc[0]
    exp = "pinned > 1.1x pageable" + (f" (link {float(link):.0f} GB/s)" if link and not pd.isna(link) else "")
    return Claim(cid, text, exp, f"pinned {best['pinned']:.1f}, pageable {best['pageable']:.1f} GB/s",
                 best["pinned"] > 1.1 * best["pageable"])


# ---------------------------------------------------------------- report


WAY_HEADER = {"python loop": "Python", "gpu": "GPU", "gpu + copies": "GPU + copies"}


def _pivot(df: pd.DataFrame, value: str) -> pd.DataFrame:
    """One row per size, one column per way (the ways as measured, in order)."""
    p = df.pivot_table(index="size", columns="way", values=value, sort=True)
    return p.reindex(columns=list(dict.fromkeys(df["way"]))).reset_index()


def _way_cols(df: pd.DataFrame, unit: str) -> tuple[Col, ...]:
    ways = list(dict.fromkeys(df["way"]))
    return tuple(Col(w, WAY_HEADER.get(w, w.removeprefix("cpu ")), ".3g") for w in ways[:5])


def _wave_rows(df: pd.DataFrame) -> pd.DataFrame:
    """The first point past each predicted boundary, and the largest drop anywhere else."""
    b = df["boundary"].astype(bool)
    near = b | b.shift(-1, fill_value=False) | b.shift(1, fill_value=False)
    out = df[b].assign(at="past a wave")
    off = df[~near]
    if len(off) and float(off["drop"].max()) > 0:
        out = pd.concat([out, off.loc[[off["drop"].idxmax()]].assign(at="worst elsewhere")]).sort_values("M")
    return out


def _launch_rows(df: pd.DataFrame) -> pd.DataFrame:
    """One row per device and thread count: the loop, the bmm, and the speed-up."""
    rows = []
    for (dev, threads), g in df.groupby(["device", "threads"], dropna=False, sort=False):
        if not {"loop of mm", "one bmm"} <= set(g.way):
            continue  # a run stopped between the two
        loop, bmm = (float(g[g.way == w]["median_ms"].iloc[0]) for w in ("loop of mm", "one bmm"))
        overhead = 1e3 * (loop - bmm) / float(g["count"].iloc[0])
        rows.append(dict(device=dev, threads=threads, loop_ms=loop, bmm_ms=bmm, speedup=loop / bmm, overhead_us=overhead))
    return pd.DataFrame(rows)


def views(result: LabResult) -> list[View]:
    t, out = result.tables, []
    if "throughput_elementwise" in t:
        el = t["throughput_elementwise"]
        out.append(View("1. The same work, four ways", "FMA out = a*b + c: G elements/s per way", "throughput_elementwise",
                        (Col("size", "elements", "int"), *_way_cols(el, "")), rows=lambda df: _pivot(df, "gelems_per_s"),
                        chart=Chart("FMA throughput vs size, one line per way", "throughput_elementwise", "size", "gelems_per_s", series="way",
                                    logx=True, logy=True, xlabel="elements", ylabel="G elements/s")))
    if "throughput_matmul" in t:
        mm = t["throughput_matmul"]
        out.append(View("2. Matmul, four ways", "n x n matmul: GFLOP/s per way", "throughput_matmul",
                        (Col("size", "n", "int"), *_way_cols(mm, "GFLOP/s")), rows=lambda df: _pivot(df, "gflops")))
    if "thread_scaling" in t:
        out.append(View("3. CPU thread scaling", "Speed-up over 1 thread at the largest size", "thread_scaling",
                        (Col("work", "work", "text"), Col("threads", "threads", "int"), Col("median_ms", "ms", ".3g"),
                         Col("speedup", "speed-up", "x"), Col("efficiency_pct", "% of ideal", ".0f")),
                        rows=lambda df: df[(df.work != "ideal") & (df.threads == df.threads.max())]))
    if "wave_quantization" in t:
        out.append(View("4. Wave quantization", "FP16 matmul, N = 128 x SMs: FLOP/s on both sides of each wave", "wave_quantization",
                        (Col("M", "M", "int"), Col("waves", "waves", ".2f"), Col("tflops", "TFLOP/s", ".1f"),
                         Col("drop", "drop", "%"), Col("at", "where", "text")), rows=_wave_rows))
    if "tensor_cores" in t:
        out.append(View("5. Tensor cores and BF16", "Matmul GFLOP/s per dtype, against the spec peak", "tensor_cores",
                        (Col("device", "device", "text"), Col("dtype", "dtype", "text"), Col("n", "n", "int"), Col("gflops", "GFLOP/s", ".4g"),
                         Col("pct_of_peak", "% of peak", ".0f"), Col("speedup_vs_fp32", "vs FP32", "x"))))
    if "launch_overhead" in t:
        out.append(View("6. Launch overhead", "B small matmuls one by one vs one batched bmm", "launch_overhead",
                        (Col("device", "device", "text"), Col("threads", "threads", "int"), Col("loop_ms", "loop ms", ".3g"),
                         Col("bmm_ms", "bmm ms", ".3g"), Col("speedup", "bmm speed-up", "x"), Col("overhead_us", "us per call", ".3g")),
                        rows=_launch_rows))
    if "alexnet_conv1" in t:
        out.append(View("7. AlexNet conv1", "96 filters 11x11 stride 4 on 227x227x3: measured vs FLOPs / matmul rate", "alexnet_conv1",
                        (Col("device", "device", "text"), Col("batch", "batch", "int"), Col("median_ms", "ms", ".3g"),
                         Col("napkin_ms", "napkin ms", ".3g"), Col("gflops", "GFLOP/s", ".4g"), Col("pct_of_peak", "% of peak", ".0f"))))
    if "copy_bandwidth" in t:
        out.append(View("8. Host -> device copies", "GB/s of the largest copy, pinned vs pageable", "copy_bandwidth",
                        (Col("memory", "memory", "text"), Col("direction", "direction", "text"), Col("MiB", "MiB", "int"),
                         Col("GBps", "GB/s", ".3g"), Col("pct_of_link", "% of link", ".0f")),
                        rows=lambda df: df[(df["MiB"] == df["MiB"].max()) & (df.direction == "host->device")]))
    return out


def headline(result: LabResult, claims: list[Claim]) -> str:
    from llmlab.core.results import find

    bits = []
    for cid, fmt in (("gpu_parallelism.python_loop_vs_vectorised", "a Python loop ran {} slower than 1 thread"),
                     ("gpu_parallelism.gpu_crossover", "the GPU won from sizes {}"),
                     ("gpu_parallelism.matmul_thread_scaling", "{} threads: matmul {}")):
        try:
            c = find(claims, cid)
        except KeyError:
            continue
        if c.holds is None or (cid.endswith("crossover") and not c.holds):
            continue
        m = c.measured.split(" (")[0]
        bits.append(fmt.format(_top(result), m) if "threads:" in fmt else fmt.format(m))
    text = "; ".join(bits[:2])
    return (text[0].upper() + text[1:] + ".") if bits else ""
