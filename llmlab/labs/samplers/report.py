"""The samplers lab's report: the terminal views and the HTML report's figure."""

from __future__ import annotations

from llmlab.core.results import Chart, Col, LabResult, View
from llmlab.labs.samplers.config import STRATEGIES
from llmlab.labs.samplers.verdicts import confidence_quarters, headline_cell


def views(result: LabResult) -> list[View]:
    lat = result.tables.get("latency")
    V, B = headline_cell(lat) if lat is not None and not lat.empty else (0, 0)
    return [
        View("1. One distribution, five fates", "How many tokens, and how much of the mass, does each strategy keep?",
             "fates",
             (Col("strategy", "strategy", "text"), Col("setting", "setting", "text", 16),
              Col("kept_tokens", "kept tokens", "int"),
              Col("mass_kept", "mass kept", "%"), Col("p_top_renorm", "top token p", ".3f"))),
        View("   The kept distributions", "The model's most likely tokens: p before and after each cut (0 = cut)",
             "fates_tokens",
             (Col("token", "token", "text", 10), Col("p_model", "model", ".3f"), Col("p_temperature", "temp", ".3f"),
              Col("p_top_k", "top-k", ".3f"), Col("p_top_p", "top-p", ".3f"), Col("p_min_p", "min-p", ".3f")),
             max_rows=6,  # the chart draws every row: a line stops at the rank where its sampler cuts
             chart=Chart("p by rank, before and after each cut", "fates_tokens", "rank",
                         ["p_model", "p_top_k", "p_top_p", "p_min_p"], logy=True,
                         xlabel="rank in the model's distribution", ylabel="p")),
        View("2. Sure vs unsure", "Across a real passage: tokens kept when the model is sure vs unsure",
             "sure_vs_unsure",
             (Col("quarter", "confidence", "text"), Col("top_prob", "top token p", ".2f"),
              Col("kept_top_k", "top-k", ".0f"),
              Col("kept_top_p", "top-p", ".0f"), Col("kept_min_p", "min-p", ".0f")), rows=confidence_quarters),
        View("3. What it does to the text", "Diversity, repetition and likelihood of the continuations", "quality",
             (Col("strategy", "strategy", "text"), Col("distinct_2", "distinct-2", ".2f"), Col("rep_4", "rep-4", ".2f"),
              Col("mean_logprob", "log-prob", ".2f"), Col("sample", "sample", "text", 24))),
        View("4. Sorting-free top-p: same distribution?", "Chi-square of sorting-free draws against the sort-based law",
             "distribution", (Col("kept_tokens", "kept tokens", "int"), Col("samples", "draws", "int"),
                              Col("chi2", "chi2", ".1f"),
                              Col("p_value", "p", ".3f"), Col("tv_distance", "TV", ".3f"),
                              Col("detectable_w", "detects w >=", ".2f"))),
        View(f"5. Cost of one sampling step (V={V:,}, B={B})", "Time per step, and its ratio to greedy (argmax)",
             "latency",
             (Col("strategy", "strategy", "text"), Col("impl", "implementation", "text"),
              Col("latency_median_ms", "ms"),
              Col("latency_p90_ms", "p90 ms"), Col("vs_greedy", "x greedy", "x")),
             rows=lambda d: d[(d["vocab"] == V) & (d["batch"] == B)]),
    ]


def figures(result: LabResult) -> list:
    """The HTML report's plot of the kept distributions: one panel per strategy, the model's top tokens."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    toks = result.tables.get("fates_tokens")
    if toks is None or toks.empty:
        return []
    fig, axes = plt.subplots(1, len(STRATEGIES), figsize=(10, 3.5), sharey=True)
    for ax, name in zip(axes, STRATEGIES, strict=True):
        ax.bar(range(len(toks)), toks["p_model"], color="0.85", label="model")
        ax.bar(range(len(toks)), toks[f"p_{name}"], width=0.5, color="C0", label="kept, renormalised")
        ax.set_title(name.replace("_", "-"), fontsize=9)
        ax.set_xticks(range(len(toks)), toks["token"], rotation=90, fontsize=7)
    axes[0].set_ylabel("probability")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    return [("The kept distributions: the model's top tokens before (grey) and after each cut", fig)]
