"""The report: the views, the headline and the figures."""

from __future__ import annotations

import numpy as np
import pandas as pd

from llmlab.core.plots import pyplot
from llmlab.core.results import Chart, Claim, Col, LabResult, View, empty_table
from llmlab.labs.roofline.verdicts import _row


def _overlay_rows(df: pd.DataFrame) -> pd.DataFrame:
    """One row per phase and token count: the whole forward's matmuls and attention."""
    g = df.groupby(["phase", "tokens"], sort=False).agg(flops=("flops", "sum"), bytes=("bytes", "sum"),
                                                        roof_us=("roof_us", "sum"))
    g = g.reset_index()
    g["intensity"] = g["flops"] / g["bytes"]
    g["roof_ms"] = g["roof_us"] / 1e3
    mem = df.groupby(["phase", "tokens"], sort=False)["bound"].agg(lambda b: f"{(b == 'memory').sum()} of {len(b)} ops")
    g["memory_bound_ops"] = mem.values
    return g


def _sweep_rows(df: pd.DataFrame) -> pd.DataFrame:
    tri = df[df["kernel"] == "triad"].copy()
    tri["working_set_MiB"] = tri["working_set_bytes"] / 2**20
    if len(tri) > 12:  # keep both ends and an even spread
        idx = np.unique(np.linspace(0, len(tri) - 1, 12).round().astype(int))
        tri = tri.iloc[idx]
    return tri


def _roof_rows(df: pd.DataFrame, dtype: str) -> pd.DataFrame:
    """Both roofs for every dtype; the ridge only for the dtype the sweep and the overlay use."""
    return df[(df["roof"] != "ridge") | (df["dtype"] == dtype)]


def _best_threads(df: pd.DataFrame) -> pd.DataFrame:
    return df.loc[df.groupby("kernel", sort=False)["median_GBps"].idxmax()]


def views(result: LabResult) -> list[View]:
    sweep = result.tables.get("intensity_sweep")
    dtype = "fp32" if empty_table(sweep) else str(sweep["dtype"].iloc[0])
    out = [
        View("1. Bandwidth roof", "How many GB/s do STREAM kernels get over buffers 8x the cache?", "bandwidth",
             (Col("kernel", "kernel", "text"), Col("threads", "threads", "int"),
              Col("median_GBps", "GB/s median", ".1f"), Col("best_GBps", "GB/s best", ".1f"),
              Col("calls_per_block", "calls per timed block", "int")), rows=_best_threads),
        View("2. Compute roof and ridge", "What matmul FLOP/s is reachable, and where do the roofs meet?", "roofs",
             (Col("roof", "roof", "text"), Col("dtype", "dtype", "text"), Col("measured_median", "measured"),
              Col("unit", "unit", "text"), Col("spec", "spec"), Col("pct_of_spec", "% of spec", ".0f")),
             rows=lambda df: _roof_rows(df, dtype)),
        View("3. The roofline, traced by one GEMM",
             f"Does (M x {_kn(result)}) @ W climb the bandwidth roof to the compute roof?",
             "intensity_sweep",
             (Col("m", "M", "int"), Col("intensity", "FLOP / byte", ".3g"), Col("median_gflops", "GFLOP/s", ".4g"),
              Col("roof_gflops", "roof GFLOP/s", ".4g"), Col("fraction_of_roof", "of roof", "%"),
              Col("bound", "bound", "text")),
             chart=Chart(f"roofline ({dtype}), log-log", "roofline_chart", "intensity", "gflops", kind="scatter",
                         series="series", logx=True, logy=True, xlabel="FLOP/byte", ylabel="GFLOP/s")),
        View("4. Where an LLM's matmuls sit", "Prefill and decode: FLOP per byte of the whole forward pass", "overlay",
             (Col("phase", "phase", "text"), Col("tokens", "tokens (S or B)", "int"),
              Col("intensity", "FLOP / byte", ".3g"), Col("memory_bound_ops", "memory-bound", "text"),
              Col("roof_ms", "roof time ms", ".3g")), rows=_overlay_rows),
    ]
    if "decode" in result.tables:
        out.append(View("5. The real decode step", "How does the step time grow with batch?", "decode",
                        (Col("batch", "batch", "int"), Col("median_ms", "ms / step", ".3g"),
                         Col("roof_ms", "roof ms", ".3g"), Col("achieved_GBps", "GB/s", ".3g"),
                         Col("pct_of_peak_compute", "% of peak FLOP/s", ".2f"),
                         Col("tokens_per_s", "tokens / s", ".4g"))))
    out.append(View("6. Caches above DRAM", "Triad GB/s as the working set grows past each cache", "bandwidth_sweep",
                    (Col("working_set_MiB", "working set MiB", ".3g"), Col("level", "fits in", "text"),
                     Col("median_GBps", "GB/s median", ".1f"), Col("best_GBps", "GB/s best", ".1f")), rows=_sweep_rows))
    if "whatif" in result.tables:
        out.append(View("7. What if: other GPUs (spec-sheet napkin math, not measured)",
                        f"BF16 ridge (FLOP/byte) and batch-1 ceilings of {WHATIF_MODEL} at an 8k context; which "
                        "models fit with 8k of KV?", "whatif",
                        (Col("gpu", "GPU", "text", 16), Col("ridge", "ridge", ".0f"),
                         Col("decode_bf16", "decode BF16 tok/s", ".3g"), Col("decode_fp8", "FP8", ".3g"),
                         Col("prefill_bf16", "prefill BF16 tok/s", ",.0f"), Col("fits", "fit BF16/FP8", "text")),
                        rows=_whatif_rows))
    return out


WHATIF_MODEL = "32B (Qwen2.5)"  # the series' "A100 vs H100 vs a 30B model": the view's ceilings are this model's


def _whatif_rows(df: pd.DataFrame) -> pd.DataFrame:
    """One row per GPU: WHATIF_MODEL's BF16 ridge and ceilings (and its FP8 decode), and the models whose weights
    with 8k of KV fit, in BF16 / in FP8."""
    def fitting(g: pd.DataFrame, fmt: str) -> str:
        g = g[g["format"] == fmt]
        names = [m.split()[0] for m, f in zip(g["model"], g["fits"], strict=True) if f is True or f == 1.0]
        return ",".join(names) if names else "none"

    rows = []
    for (source, gpu), g in df.groupby(["source", "gpu"], sort=False):
        mine = g[g["model"] == WHATIF_MODEL].set_index("format")
        rows.append(dict(gpu=gpu if source.startswith("spec") else f"{gpu} (measured)",
                         ridge=mine.loc["bf16", "ridge"], decode_bf16=mine.loc["bf16", "decode_tok_s"],
                         decode_fp8=mine.loc["fp8", "decode_tok_s"], prefill_bf16=mine.loc["bf16", "prefill_tok_s"],
                         fits=f"{fitting(g, 'bf16')}/{fitting(g, 'fp8')}"))
    return pd.DataFrame(rows)


def _kn(result: LabResult) -> str:
    s = result.tables.get("intensity_sweep")
    return f"{int(s['k'].iloc[0])}" if s is not None and len(s) else "K"


def headline(result: LabResult, claims: list[Claim]) -> str:
    m = result.tables.get("decode_model")
    roofs = result.tables.get("roofs")
    if m is None or roofs is None:
        return ""
    m = m.iloc[0]
    bw = float(_row(roofs, roof="bandwidth")["measured_median"])
    text = (f"Decode at batch 1 does {float(m['b1_intensity']):.2f} FLOP per byte, far below the ridge "
            f"({float(m['ridge']):.1f} at {bw:.1f} GB/s)")
    dec = result.tables.get("decode")
    if dec is not None and len(dec):
        text += f": it used {float(dec.iloc[0]['pct_of_peak_compute']):.1f}% of peak compute"
        if bool(m["fits_llc"]):
            text += " (weights in cache: dispatch sets its time)"
    return text + "."


def figures(result: LabResult) -> list:
    """The roofline on log-log axes: measured roofs (lines) and measured points; the cache sweep."""
    plt = pyplot()
    out = []
    ch = result.tables.get("roofline_chart")
    if ch is not None and len(ch):
        fig, ax = plt.subplots(figsize=(6, 3.5))
        for series, g in ch.groupby("series", sort=False):
            if series.startswith(("measured roof", "spec")):
                ax.plot(g["intensity"], g["gflops"], "-" if series.startswith("measured") else "--", label=series)
            else:
                ax.scatter(g["intensity"], g["gflops"], s=14, label=series)
        ax.set(xscale="log", yscale="log", xlabel="arithmetic intensity (FLOP/byte)", ylabel="GFLOP/s",
               title="Roofline, measured")
        ax.legend(fontsize=6)
        fig.tight_layout()
        out.append(("roofline: measured roofs and points", fig))
    sw = result.tables.get("bandwidth_sweep")
    if sw is not None and len(sw):
        fig, ax = plt.subplots(figsize=(6, 3.5))
        for kernel, g in sw.groupby("kernel", sort=False):
            ax.plot(g["working_set_bytes"] / 2**20, g["median_GBps"], marker="o", ms=3, label=kernel)
        ax.set(xscale="log", yscale="log", xlabel="working set (MiB)", ylabel="GB/s", title="Bandwidth vs working set")
        ax.legend(fontsize=7)
        fig.tight_layout()
        out.append(("bandwidth vs working set: the cache plateaus", fig))
    return out
