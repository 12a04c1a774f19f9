"""The report: the views, the headline and the figures."""

from __future__ import annotations

import math

import pandas as pd

from llmlab.core.plots import pyplot
from llmlab.core.results import Claim, Col, LabResult, View, empty_table
from llmlab.labs.prefill_decode.disagg import handoff_views
from llmlab.labs.prefill_decode.verdicts import _first_model, decode_bound


def views(result: LabResult) -> list[View]:
    """The report's parts, in the order of the article."""
    many = "phases" in result.tables and result.tables["phases"]["model"].nunique() > 1
    model = (Col("model", "model", "text", 12),) if many else ()
    return [
        View("1. The two phases timed", "How many tokens/s does reading the prompt make, and writing the reply?",
             "phases",
             (*model, Col("tokens", "T", "int"), Col("prefill_ms", "prefill ms"),
              Col("prefill_tok_s", "prefill tok/s", "int"),
              Col("decode_ms", "decode ms/token"), Col("decode_tok_s", "decode tok/s", ".1f"),
              Col("ratio", "x decode", "x"))),  # tokens/s vs T is drawn in the HTML report (figures)
        View("2. Why: arithmetic intensity per phase", "Where does each phase sit against this machine's ridge point?",
             "intensity", (Col("label", "phase", "text", 14), Col("intensity", "FLOP/byte"), Col("ridge", "ridge"),
                           Col("achieved_gflops", "GFLOP/s"), Col("share_of_peak", "% of peak", "%"),
                           Col("achieved_GBps", "GB/s"), Col("share_of_bandwidth", "% of GB/s", "%")),
             rows=_ends),  # the roofline itself: `llmlab roofline` draws it; the points stay in roofline_chart
        View("3. Where the crossover is", "At which decode batch does the step stop being flat (compute-bound)?",
             "crossover", (Col("batch", "batch", "int"), Col("ms", "ms / step"), Col("tok_s", "tok/s", "int"),
                           Col("intensity", "FLOP/byte"), Col("share_of_peak", "% of peak", "%"),
                           Col("roof_ms", "roof ms"))),
        View("4. The two numbers: TTFT and ITL", "Does E2E = TTFT + (n - 1) x ITL, from the parts, match the whole?",
             "e2e",
             (Col("tokens", "T", "int"), Col("new_tokens", "n", "int"), Col("ttft_ms", "TTFT ms"),
              Col("itl_ms", "ITL ms"), Col("predicted_e2e_ms", "E2E pred. ms"), Col("measured_e2e_ms", "E2E ms"),
              Col("error", "error", "%"))),
        # decode's share of a reply: its claim states the shares (the table is in the JSON and --tables all)
        *handoff_views(result),
    ]


def _ends(df: pd.DataFrame) -> pd.DataFrame:
    """The smallest and the largest T of each phase (the chart shows every point)."""
    df = _first_model(df)
    keep = df["tokens"].isin([df["tokens"].min(), df["tokens"].max()])
    return df[keep].sort_values(["phase", "tokens"], ascending=[False, True])


def headline(result: LabResult, claims: list[Claim]) -> str:
    """The ratio of the two phases, and what bounds decode here."""
    if empty_table(result.tables.get("phases")):
        return ""
    ph = _first_model(result.tables["phases"]).sort_values("tokens").iloc[-1]
    text = (f"{ph['model']}: prefill (T={int(ph['tokens'])}) makes {ph['ratio']:.0f}x the tokens/s of decode "
            f"({ph['prefill_tok_s']:.0f} vs {ph['decode_tok_s']:.1f}).")
    fl = result.tables.get("decode_floor")
    if fl is not None and len(fl):
        r = fl.iloc[0]
        top, share = decode_bound(r)
        if top != "memory bandwidth":
            text += (f" Decode is bound by {top} ({share:.0%} of its {r['measured_ms']:.1f} ms), not memory"
                     + (": the weights sit in cache." if r["weights_MiB"] + r["kv_MiB"] <= r["llc_MiB"] else "."))
    return text


def figures(result: LabResult) -> list[tuple[str, object]]:
    """Extra matplotlib figures for the HTML report: TTFT and ITL vs T, and the decode batch crossover."""
    plt = pyplot()
    out = []
    ph = result.tables.get("phases")
    if ph is not None and len(ph):
        fig, ax = plt.subplots(figsize=(6, 4))
        for model, g in ph.groupby("model", sort=False):
            ax.plot(g["tokens"], g["prefill_ms"], "o-", label=f"{model} TTFT (prefill)")
            ax.plot(g["tokens"], g["decode_ms"], "s--", label=f"{model} ITL (decode step)")
        ax.set(xscale="log", yscale="log", xlabel="prompt length T (tokens)", ylabel="ms",
               title="TTFT grows with T, ITL barely")
        ax.legend(fontsize=8)
        out.append(("TTFT and ITL vs prompt length", fig))
    cx = result.tables.get("crossover")
    if cx is not None and len(cx):
        fig, ax = plt.subplots(figsize=(6, 4))
        ax.plot(cx["batch"], cx["ms"], "o-", label="decode step (measured)")
        ax.plot(cx["batch"], cx["roof_ms"], ":", label="roofline: max(FLOPs/peak, bytes/BW)")
        b = float(cx["formula_crossover"].iloc[0])
        if math.isfinite(b):
            ax.axvline(b, color="grey", linestyle="--", label=f"formula crossover B ~{b:.0f}")
        ax.set(xscale="log", yscale="log", xlabel="decode batch B", ylabel="ms per step",
               title="where decode turns compute-bound")
        ax.legend(fontsize=8)
        out.append(("decode batch crossover", fig))
    return out
