"""The report: the views, the headline and the figures."""

from __future__ import annotations

import math

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


def _roof_rows(df: pd.DataFrame, dtype: str) -> pd.DataFrame:
    """Both roofs for every dtype; the ridge only for the dtype the sweep and the overlay use."""
    return df[(df["roof"] != "ridge") | (df["dtype"] == dtype)]


def _best_threads(df: pd.DataFrame) -> pd.DataFrame:
    return df.loc[df.groupby("kernel", sort=False)["median_GBps"].idxmax()]


def _best_kernel(result: LabResult) -> str:
    """The STREAM kernel whose median GB/s is the bandwidth roof."""
    bw = result.tables.get("bandwidth")
    if empty_table(bw):
        return "-"
    return str(_best_threads(bw).sort_values("median_GBps").iloc[-1]["kernel"])


def _level_rows(df: pd.DataFrame) -> pd.DataFrame:
    """Triad at the working set each level streams fastest, one row per level (every size: --tables all)."""
    tri = df[df["kernel"] == "triad"]
    return tri.loc[tri.groupby("level", sort=False)["median_GBps"].idxmax()].assign(
        working_set_MiB=lambda d: d["working_set_bytes"] / 2**20)


def _forward_rows(df: pd.DataFrame, decode: pd.DataFrame | None) -> pd.DataFrame:
    """The whole forward per phase and token count (napkin), beside the measured decode step at the same batch."""
    g = _overlay_rows(df)
    if empty_table(decode):
        return g.assign(median_ms=np.nan)
    step = decode.set_index("batch")["median_ms"]
    g["median_ms"] = [float(step[t]) if p == "decode" and t in step.index else np.nan
                      for p, t in zip(g["phase"], g["tokens"], strict=True)]
    return g


def views(result: LabResult) -> list[View]:
    sweep = result.tables.get("intensity_sweep")
    dtype = "fp32" if empty_table(sweep) else str(sweep["dtype"].iloc[0])
    out = [
        View("1. The roofs and the ridge",
             f"Best STREAM kernel's GB/s ({_best_kernel(result)}) and matmul FLOP/s: where do the roofs meet?",
             "roofs",
             (Col("roof", "roof", "text"), Col("dtype", "dtype", "text"), Col("measured_median", "measured"),
              Col("unit", "unit", "text"), Col("spec", "spec"), Col("pct_of_spec", "% of spec", ".0f")),
             rows=lambda df: _roof_rows(df, dtype)),
        View("2. The roofline, traced by one GEMM",
             f"Does (M x {_kn(result)}) @ W climb the bandwidth roof to the compute roof?",
             "intensity_sweep",
             (Col("m", "M", "int"), Col("intensity", "FLOP / byte", ".3g"), Col("median_gflops", "GFLOP/s", ".4g"),
              Col("roof_gflops", "roof GFLOP/s", ".4g"), Col("fraction_of_roof", "of roof", "%"),
              Col("bound", "bound", "text")),
             chart=Chart(f"roofline ({dtype}), log-log", "roofline_chart", "intensity", "gflops", kind="scatter",
                         series="series", logx=True, logy=True, xlabel="FLOP/byte", ylabel="GFLOP/s")),
        View("3. Where an LLM's forward pass sits",
             "Prefill and decode: FLOP/byte, the roof's time and the measured decode step", "overlay",
             (Col("phase", "phase", "text"), Col("tokens", "tokens (S or B)", "int"),
              Col("intensity", "FLOP / byte", ".3g"), Col("memory_bound_ops", "memory-bound", "text"),
              Col("roof_ms", "roof ms", ".3g"), Col("median_ms", "measured ms", ".3g")),
             rows=lambda df: _forward_rows(df, result.tables.get("decode"))),
        View("4. Caches above DRAM", "Triad GB/s in each level, at its fastest working set (all: --tables all)",
             "bandwidth_sweep",
             (Col("working_set_MiB", "working set MiB", ".3g"), Col("level", "fits in", "text"),
              Col("median_GBps", "GB/s median", ".1f"), Col("best_GBps", "GB/s best", ".1f")), rows=_level_rows),
    ]
    if "whatif" in result.tables:
        out.append(View("5. What if: other GPUs (spec-sheet napkin math, not measured)",
                        f"BF16 ridge and batch-1 tok/s of {WHATIF_MODEL}, 8k context; which models fit?", "whatif",
                        (Col("gpu", "GPU", "text", 16), Col("ridge", "ridge", ".0f"),
                         Col("decode_bf16", "decode", ".3g"), Col("decode_fp8", "FP8", ".3g"),
                         Col("prefill_bf16", "prefill", ",.0f"), Col("fits", "fit BF16/FP8", "text")),
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

    def cell(mine: pd.DataFrame, fmt: str, col: str) -> float:  # a run stopped mid-table may lack a format
        return float(mine.loc[fmt, col]) if fmt in mine.index else math.nan

    rows = []
    for (source, gpu), g in df.groupby(["source", "gpu"], sort=False):
        mine = g[g["model"] == WHATIF_MODEL].set_index("format")
        rows.append(dict(gpu=gpu if source.startswith("spec") else f"{gpu} (measured)",
                         ridge=cell(mine, "bf16", "ridge"), decode_bf16=cell(mine, "bf16", "decode_tok_s"),
                         decode_fp8=cell(mine, "fp8", "decode_tok_s"), prefill_bf16=cell(mine, "bf16", "prefill_tok_s"),
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
        text += f": {float(dec.iloc[0]['pct_of_peak_compute']):.1f}% of peak compute"
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
