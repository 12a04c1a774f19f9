"""The kvcache-growth lab's report: the views, in the article's order, and the figures.

matplotlib is imported inside figures(): `llmlab --help` imports this package (for its Config).
"""

from __future__ import annotations

import pandas as pd

from llmlab.core.results import Chart, Col, LabResult, View
from llmlab.labs.kvcache_growth.registry import context_label


def views(result: LabResult) -> list[View]:
    big = result.config.get("contexts", [131072])[-1]
    gib_at = context_label(big)
    return [
        View("1. The real cache against the formula",
             "Do the K/V tensors weigh exactly batch x tokens x bytes per token?", "real_cache",
             (Col("series", "cache", "text"), Col("seq_len", "tokens", "int"), Col("measured_MiB", "measured MiB"),
              Col("formula_MiB", "formula MiB"), Col("cache_over_weights", "x weights", ".2f")),
             rows=_real_rows),
        View("2. A sliding window caps it", "Mistral's window: does the cache stop growing at the window?",
             "sliding_window",
             (Col("seq_len", "length", "int"), Col("cached_tokens", "cached tokens", "int"),
              Col("formula_tokens", "HF formula", "int"), Col("measured_bytes", "bytes", "int"))),
        View("3. Dynamic vs static cache (allocator)", "Does a growing cache copy itself on every step?", "allocator",
             (Col("cache", "cache", "text"), Col("seq_len", "tokens", "int"),
              Col("step_peak_extra_bytes", "step peak B", "int"),
              Col("step_peak_over_one_layer", "x one layer KV", ".2f"))),
        View("4. Real models side by side (BF16 cache)",
             "How much KV does each architecture need, and how many requests fit?", "registry",
             (Col("model", "model", "text", 13), Col("attention", "attention", "text"),
              Col("measured_bf16_KiB_per_token", "KiB / token", ".0f"),
              Col(f"GiB_at_{gib_at}", f"GiB at {gib_at}", ".1f"),
              Col("cache_outweighs_weights_at_tokens", "= weights at tokens", "int"),
              Col("max_concurrency", "requests here", ".1f")),
             chart=Chart("one request's KV cache vs context, per layout (log-log)", "kv_growth", "context", "GiB",
                         series="layout", logx=True, logy=True, xlabel="context (tokens)", ylabel="GiB")),
        View("5. Cache dtypes", "Bytes per token of Llama 3 8B's cache in each storage format", "cache_dtypes",
             (Col("cache_dtype", "cache dtype", "text"), Col("bytes_per_value", "bytes / value", ".4g"),
              Col("scale_overhead_pct", "scales %", ".2f"), Col("KiB_per_token", "KiB / token", ".1f")),
             rows=lambda d: d[d["model"] == "llama-3-8b"].drop_duplicates("cache_dtype")),
        View("6. The quadratic trap", "Generating without a cache: does total time grow as n^2?", "generation_fits",
             (Col("mode", "mode", "text"), Col("n_max", "tokens", "int"), Col("step_ms_first", "first ms/tok", ".1f"),
              Col("step_ms_last", "last ms/tok", ".1f"), Col("total_median_s", "total s", ".2f"),
              Col("quad_r2", "R^2 n^2 fit", ".4f"))),
    ]


def _real_rows(df):
    """Dynamic rows past one token, then the static cache's last row (it is full from the start)."""
    dyn = df[(df["cache"] == "dynamic") & (df["seq_len"] > 1)]
    return pd.concat([dyn, df[df["cache"] == "static"].tail(1)])


def figures(result: LabResult) -> list:
    """The HTML report's plot: KV bytes of one request vs context length, one line per architecture."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figs = []
    df = result.tables.get("kv_by_length")
    if df is None or df.empty:
        return figs
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for model, g in df.groupby("model", sort=False):
        ax.plot(g["context"], g["GiB"], marker="o", markersize=3, label=model)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("context (tokens)")
    ax.set_ylabel("KV cache, one request (GiB)")
    ax.legend(fontsize=6, ncol=2)
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    figs.append(("KV cache bytes vs context length per architecture (BF16, measured bytes per token; "
                 "Mistral capped by its window)", fig))
    tot = result.tables.get("generation_totals")
    if tot is not None and not tot.empty:
        fig, ax = plt.subplots(figsize=(6, 3.5))
        for mode, g in tot.groupby("mode", sort=False):
            ax.plot(g["n_tokens"], g["total_s"], marker="o", markersize=3, label=f"{mode} (measured)")
            ax.plot(g["n_tokens"], g["fit_quadratic_s"], linestyle=":", color="0.4")
        ax.set_xlabel("tokens generated")
        ax.set_ylabel("total time (s)")
        ax.legend(fontsize=7)
        fig.tight_layout()
        figs.append(("The quadratic trap: total generation time with and without the cache (dotted: the n^2 fit)", fig))
    return figs
