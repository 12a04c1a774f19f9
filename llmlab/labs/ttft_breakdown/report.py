"""The in-process lab's report: the views, the headline (which layer dominates TTFT), the figures.

matplotlib is imported inside figures(): `llmlab --help` imports this package (for its Config).
"""

from __future__ import annotations

import numpy as np

from llmlab.core.results import Chart, Claim, Col, LabResult, View, empty_table


def views(result: LabResult) -> list[View]:
    def by_rho(df):
        return df.sort_values("rho", na_position="last")

    def cold_rows(df):  # the steps, then spawn -> first token against the same request warm; no empty device steps
        idle = df["step"].isin(["device_init", "to_device"]) & (df["median_ms"] < 5)
        return df[~df["step"].isin(["spawn_to_exit", "first_forward_extra"]) & ~idle]

    return [
        View("1. One request, phase by phase", "Where do a request's milliseconds go before the first token?",
             "phases", (Col("scenario", "scenario", "text", 24), Col("queue_ms", "queue ms", ",.2f"),
                        Col("template_tokenize_ms", "tokenize ms", ",.2f"), Col("prefill_ms", "prefill ms", ",.1f"),
                        Col("first_token_ms", "sample ms", ",.2f"), Col("ttft_ms", "TTFT ms", ",.1f"))),
        View("2. Attribution check", "A known delay goes into one component: how far does each phase move (ms)?",
             "attribution",
             (Col("injected_into", "delay put into", "text"), Col("delay_ms", "delay", ".0f"),
              Col("d_template_tokenize_ms", "tokenize", ".2f"), Col("d_prefill_ms", "prefill", ".2f"),
              Col("d_first_token_ms", "sample", ".2f"), Col("d_ttft_ms", "TTFT", ".1f"))),
        View("3. Prompt length", "Does prefill run at the rate its FLOPs and the matmul rate predict?", "prompt_sweep",
             (Col("prompt_tokens", "prompt tokens", "int"), Col("ttft_median_ms", "TTFT ms"),
              Col("prefill_ms", "prefill ms"), Col("napkin_prefill_ms", "napkin ms"),
              Col("rate_vs_napkin", "rate / napkin", ".2f"), Col("matmul_gflop_per_s", "matmul GFLOP/s", ".0f"))),
        View("4. Queueing", "How does the wait grow as utilisation nears 1 (one FCFS worker)?", "queueing",
             (Col("arrivals", "arrivals", "text"), Col("rho", "rho", ".2f"), Col("wait_mean_ms", "mean wait ms"),
              Col("wait_p90_ms", "p90 wait ms"), Col("schedule_md1_ms", "ideal M/D/1 ms"),
              Col("expected_mean_ms", "expected mean ms")), rows=by_rho),
        View("5. Cold start", "What does a fresh process spend before its first token (weights read cold)?",
             "cold_start",
             (Col("phase", "step", "text", 30), Col("median_ms", "median ms", "int"),
              Col("expected", "napkin", "text", 30)), rows=cold_rows),
        View("6. Where TTFT goes", "Which layer dominates TTFT in each scenario (means, ms)?", "scenarios",
             (Col("scenario", "scenario", "text", 22), Col("queue_ms", "queue", ",.1f"),
              Col("cold_start_ms", "cold", ",.0f"), Col("retrieval_ms", "retrieval", ",.1f"),
              Col("prefill_ms", "prefill", ",.1f"), Col("other_ms", "other", ",.1f"), Col("ttft_ms", "TTFT", ",.0f")),
             chart=Chart("TTFT waterfall per scenario (ms)", "scenarios", "bar",
                         ["queue_ms", "retrieval_ms", "prefill_ms", "other_ms"], kind="stacked", xlabel="scenario")),
    ]


def layers(result: LabResult) -> dict[str, float]:
    """What each layer adds to a warm idle chat request at the worst point measured (ms)."""
    t = result.tables
    sc = t["scenarios"].set_index("scenario")
    base = float(sc["ttft_ms"].iloc[0])
    out = {}
    if "chat, cold start" in sc.index:
        out["cold start"] = float(sc.loc["chat, cold start", "cold_start_ms"])
    q = t.get("queueing")
    if not empty_table(q) and (q["arrivals"] == "poisson").any():
        out["queueing"] = float(q.loc[q["arrivals"] == "poisson", "wait_p90_ms"].max())
    sw = t.get("prompt_sweep")
    if not empty_table(sw):
        out["prompt length"] = float(sw["ttft_median_ms"].iloc[-1] - sw["ttft_median_ms"].iloc[0])
    rag = [k for k in sc.index if k.startswith("RAG")]
    if rag:
        out["RAG"] = float(sc.loc[rag[0], "ttft_ms"] - base)
    return {"base": base, **dict(sorted(out.items(), key=lambda kv: -kv[1]))}


def headline(result: LabResult, claims: list[Claim]) -> str:
    """The article's flowchart with this run's numbers: which layer dominates TTFT here."""
    if empty_table(result.tables.get("scenarios")):
        return ""
    lay = layers(result)
    base = lay.pop("base")
    if not lay:
        return f"Warm idle chat: {base:.0f} ms to the first token."
    (worst, ms), *rest = lay.items()
    tail = ", ".join(f"{k} +{_ms(v)}" for k, v in rest)
    return (f"Warm idle chat: {base:.0f} ms to the first token; {worst} adds the most "
            f"(+{_ms(ms)}, {ms / base:.0f}x){', then ' + tail if tail else ''}.")


def _ms(v: float) -> str:
    return f"{v / 1e3:.2f} s" if abs(v) >= 1000 else f"{v:.0f} ms"


def figures(result: LabResult) -> list[tuple[str, object]]:
    """The TTFT waterfall for the HTML report: one horizontal stacked bar per scenario, layers in the
    order they happen, cold start included (log-free, so the cold bar dwarfs the rest: that is the finding)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sc = result.tables.get("scenarios")
    if empty_table(sc):
        return []
    parts = [("queue_ms", "queue"), ("cold_start_ms", "cold start"), ("retrieval_ms", "retrieval"),
             ("prefill_ms", "prefill"), ("other_ms", "tokenize + first token")]
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.5), gridspec_kw={"width_ratios": [3, 2]})
    warm = sc[sc["cold_start_ms"] == 0]
    for ax, df, title in ((axes[0], warm, "warm scenarios"), (axes[1], sc, "with the cold start")):
        left = np.zeros(len(df))
        for key, label in parts:
            v = df[key].to_numpy(float)
            ax.barh(df["scenario"], v, left=left, label=label)
            left += v
        ax.invert_yaxis()
        ax.set_xlabel("ms to first token")
        ax.set_title(title, fontsize=9)
        ax.tick_params(labelsize=7)
    axes[1].set_yticklabels([])
    axes[0].legend(fontsize=7, loc="lower right")
    fig.suptitle("TTFT waterfall: where the time to first token goes", fontsize=10)
    fig.tight_layout()
    out = [("TTFT waterfall", fig)]
    sw = result.tables.get("prompt_sweep")
    if not empty_table(sw):  # prefill against its napkin time, log-log: the gap closes as compute takes over
        fig2, ax = plt.subplots(figsize=(6, 3.5))
        ax.loglog(sw["prompt_tokens"], sw["prefill_ms"], "o-", label="prefill, measured (median)")
        ax.loglog(sw["prompt_tokens"], sw["napkin_prefill_ms"], "s--", label="napkin: FLOPs / matmul rate")
        ax.set_xlabel("prompt tokens")
        ax.set_ylabel("ms")
        ax.legend(fontsize=7)
        ax.set_title("Prefill vs the napkin time", fontsize=10)
        fig2.tight_layout()
        out.append(("Prefill vs napkin", fig2))
    return out
