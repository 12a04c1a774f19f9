"""Part 1: the same work (FMA, sum, matmul) as a Python loop, on 1..N CPU threads and on the GPU."""

from __future__ import annotations

from collections.abc import Callable

import torch

from llmlab.core.device import Device, is_oom, torch_threads
from llmlab.core.render import track
from llmlab.core.results import LabResult
from llmlab.core.specs import bandwidth_spec_GBps, peak_for
from llmlab.core.stats import Summary
from llmlab.core.timing import L2Flusher
from llmlab.labs.gpu_parallelism.config import WORKS, Config, cpu_way
from llmlab.labs.gpu_parallelism.harness import (
    _pct,
    cpu_peak_gflops,
    rel_err,
    stats_cols,
    threads_setter,
    time_fn,
    time_interleaved,
)

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
                    rows.append(size_row(work, "python loop", size, time_fn(py, cpu, cfg.budget_s),
                                         matches(work, py(), ref), None, None))
                threads = sweep if size == sizes[-1] else tuple(sorted({1, top}))
                with torch_threads(torch.get_num_threads()):  # the thread count comes back afterwards
                    stats = time_interleaved([fn] * len(threads), cpu, cfg.budget_s,
                                             [threads_setter(t) for t in threads])
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
                    # L2 flushed before every timed call: a size that fits in L2 would otherwise beat HBM's spec
                    st = time_fn(gfn, gpu, cfg.budget_s, setup=flush)
                    rows.append(size_row(work, "gpu", size, st, matches(work, gfn(), ref), peak_g, peak_bw))
                    copies = work_with_copies(work, xs, gpu)
                    rows.append(size_row(work, "gpu + copies", size, time_fn(copies, gpu, cfg.budget_s),
                                         matches(work, copies(), ref), peak_g, None))
                    del gxs, gfn
                del xs, fn, ref
        finally:
            if rows:
                res.add_table(f"throughput_{work}", rows)
        mismatches += [f"{work} {r['way']} size {r['size']}" for r in rows if not r["ok"]]
    res.add_table("thread_scaling", scaling_rows(scaling))
    if mismatches:
        res.note(f"do NOT match the CPU reference: {', '.join(mismatches)}")


def size_row(work: str, way: str, size: int, st: Summary, ok: bool, peak_gflops: float | None,
             peak_GBps: float | None) -> dict:
    """One measurement of part 1: timing, throughput in three units, and the share of the FP32 / bandwidth peak.

    `ok`: the result matches the CPU reference. Bytes are the minimum moved (each input read once,
    the output written once), so GBps is a lower bound on the real traffic.
    """
    c, s = work_counts(work, size), (st.median / 1e3)
    gflops, gbps = c["flops"] / s / 1e9, c["bytes"] / s / 1e9
    return {
        "way": way, "size": size, **stats_cols(st), "gelems_per_s": c["elements"] / s / 1e9, "gflops": gflops,
        "GBps": gbps,
        "pct_peak_flops": _pct(gflops, peak_gflops), "pct_peak_bw": _pct(gbps, peak_GBps), "ok": ok,
    }


def scaling_rows(rows: list[dict]) -> list[dict]:
    """Speed-up over 1 thread and parallel efficiency; an 'ideal' series for the chart."""
    out = []
    for r in rows:
        one = next(x for x in rows if x["work"] == r["work"] and x["threads"] == 1)
        sp = one["median_ms"] / r["median_ms"]
        out.append({**r, "speedup": sp, "ideal_speedup": float(r["threads"]),
                    "efficiency_pct": 100 * sp / r["threads"]})
    out += [{"work": "ideal", "threads": t, "speedup": float(t),
             "ideal_speedup": float(t)} for t in sorted({r["threads"] for r in rows})]
    return out




