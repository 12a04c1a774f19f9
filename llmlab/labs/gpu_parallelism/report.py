"""The report: the views and the headline."""

from __future__ import annotations

import pandas as pd

from llmlab.core.results import Chart, Claim, Col, LabResult, View, find
from llmlab.labs.gpu_parallelism.verdicts import _top

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
        rows.append(dict(device=dev, threads=threads, loop_ms=loop, bmm_ms=bmm, speedup=loop / bmm,
                         overhead_us=overhead))
    return pd.DataFrame(rows)


def views(result: LabResult) -> list[View]:
    t, out = result.tables, []
    if "throughput_elementwise" in t:
        el = t["throughput_elementwise"]
        out.append(View("1. The same work, four ways", "FMA out = a*b + c: G elements/s per way",
                        "throughput_elementwise",
                        (Col("size", "elements", "int"), *_way_cols(el, "")),
                        rows=lambda df: _pivot(df, "gelems_per_s"),
                        chart=Chart("FMA throughput vs size, one line per way", "throughput_elementwise", "size",
                                    "gelems_per_s", series="way",
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
        out.append(View("4. Wave quantization", "FP16 matmul, N = 128 x SMs: FLOP/s on both sides of each wave",
                        "wave_quantization",
                        (Col("M", "M", "int"), Col("waves", "waves", ".2f"), Col("tflops", "TFLOP/s", ".1f"),
                         Col("drop", "drop", "%"), Col("at", "where", "text")), rows=_wave_rows))
    if "tensor_cores" in t:
        out.append(View("5. Tensor cores and BF16", "Matmul GFLOP/s per dtype, against the spec peak", "tensor_cores",
                        (Col("device", "device", "text"), Col("dtype", "dtype", "text"), Col("n", "n", "int"),
                         Col("gflops", "GFLOP/s", ".4g"),
                         Col("pct_of_peak", "% of peak", ".0f"), Col("speedup_vs_fp32", "vs FP32", "x"))))
    if "launch_overhead" in t:
        out.append(View("6. Launch overhead", "B small matmuls one by one vs one batched bmm", "launch_overhead",
                        (Col("device", "device", "text"), Col("threads", "threads", "int"),
                         Col("loop_ms", "loop ms", ".3g"), Col("bmm_ms", "bmm ms", ".3g"),
                         Col("speedup", "bmm speed-up", "x"), Col("overhead_us", "us per call", ".3g")),
                        rows=_launch_rows))
    if "alexnet_conv1" in t:
        out.append(View("7. AlexNet conv1", "96 filters 11x11 stride 4 on 227x227x3: measured vs FLOPs / matmul rate",
                        "alexnet_conv1",
                        (Col("device", "device", "text"), Col("batch", "batch", "int"), Col("median_ms", "ms", ".3g"),
                         Col("napkin_ms", "napkin ms", ".3g"), Col("gflops", "GFLOP/s", ".4g"),
                         Col("pct_of_peak", "% of peak", ".0f"))))
    if "copy_bandwidth" in t:
        out.append(View("8. Host -> device copies", "GB/s of the largest copy, pinned vs pageable", "copy_bandwidth",
                        (Col("memory", "memory", "text"), Col("direction", "direction", "text"),
                         Col("MiB", "MiB", "int"),
                         Col("GBps", "GB/s", ".3g"), Col("pct_of_link", "% of link", ".0f")),
                        rows=lambda df: df[(df["MiB"] == df["MiB"].max()) & (df.direction == "host->device")]))
    return out


def headline(result: LabResult, claims: list[Claim]) -> str:
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
