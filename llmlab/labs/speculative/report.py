"""The report: the headline (the best method, and why the model draft gives what it gives) and the views,
in the order of the article."""

from __future__ import annotations

from llmlab.core.results import Chart, Claim, Col, LabResult, View
from llmlab.labs.speculative.config import COPY_MIN, GOAL_LOOKUP_GROUNDED, GOAL_VS_PLAIN
from llmlab.labs.speculative.verdicts import row


def timed_models(result: LabResult) -> str:
    """The pair the timed parts ran (the loaded pair, or on CUDA an arch: pair sized from the device)."""
    m = result.env.get("speed_models") or {}
    cfg = result.config
    pair = f"{m.get('target', cfg.get('model'))} / {m.get('draft', cfg.get('draft'))}"
    return pair + (" (random weights)" if m.get("kind") == "arch" else "")


def views(result: LabResult) -> list[View]:
    """The report's parts, in the order of the article. --quick counts the temperature and tree parts without
    timing them, and has no batch part: their verdicts are in "What this run found", their tables in --tables all."""
    cfg = result.config
    timed_sweeps = int(cfg.get("sweep_repeats", 0)) > 0
    x = (Col("speedup", "x plain", "x"),) if timed_sweeps else ()
    full = timed_sweeps or bool(cfg.get("batch_sizes"))
    dist_t = float(cfg.get("temperature") or 1.0)
    out = [
        View("1. Same output", f"Do B = 1 runs (T={dist_t:g}, top-k {cfg.get('dist_top_k')}) "
             "follow the target's exact joint law?", "distribution",
             (Col("method", "method", "text", 16), Col("outcome", "outcome", "text", 18),
              Col("samples", "runs", "int"), Col("p_value", "p-value", ".3f"), Col("detectable_w", "w found", ".2f"),
              Col("passes", "passes"))),
        View("2. Speed", f"Is speculative decoding faster than plain decoding? Timed: {timed_models(result)}",
             "speed",
             (Col("method", "method", "text", 20), Col("gamma", "gamma", "int"), Col("tokens_per_s", "tokens / s"),
              Col("speedup", "x plain", "x"), Col("speedup_p10", "p10", "x"), Col("expected", "model", "x"))),
        View("3. Gamma", "How many tokens should the draft guess per round?", "gamma_sweep",
             (Col("gamma", "gamma", "int"), Col("alpha", "alpha", ".3f"), Col("verify_cost", "verify (steps)", ".2f"),
              Col("speedup", "x plain", "x"), Col("predicted_speedup", "Leviathan", "x"),
              Col("predicted_speedup_verify", "with verify", "x")),
             chart=Chart("speed-up vs gamma: measured and predicted", "gamma_sweep", x="gamma",
                         y=["speedup", "predicted_speedup", "predicted_speedup_verify"],
                         xlabel="gamma (drafted tokens)", ylabel="x plain") if full else None),
        View("4. Temperature", "Does the counted acceptance match beta = sum min(p, q)?", "temperature_sweep",
             (Col("temperature", "T", "g"), Col("alpha", "alpha", ".3f"), Col("beta", "beta", ".3f"),
              Col("beta_se", "+- se", ".3f"), Col("tau", "tokens / round", ".2f"), *x)),
        View("5. Draft length", "Which draft-length policy wastes least, at one budget?", "policies",
             (Col("policy", "policy", "text", 18), Col("max_gamma", "max gamma", "int"),
              Col("tokens_per_target_forward", "tokens / fwd", ".2f"),
              Col("draft_forwards_per_token", "drafts / token", ".2f"), Col("alpha", "alpha", ".3f"), *x)),
        View("6. Tree vs chain", "Does a token tree beat a chain of the same depth or budget?", "tree",
             (Col("sampling", "sampling", "text", 8), Col("method", "method", "text", 14),
              Col("verified_per_forward", "verified / fwd", "int"),
              Col("tokens_per_target_forward", "tokens / fwd", ".2f"), *x)),
        View("7. Batch", "Does the speed-up survive a batch?", "batch",
             (Col("batch", "batch", "int"), Col("alpha_per_row", "alpha", ".3f"),
              Col("tokens_per_round_min_rule", "tokens / round", ".2f"), Col("plain_tokens_per_s", "plain tokens / s"),
              Col("speedup", "x plain", "x"))),
        View("8. Prompt lookup", f"Does a draft-free lookup ({_lookup_setting(result)}) pay where the output re-uses "
             "the input (quote, edit: stdlib source; open: held-out text)?", "lookup",
             (Col("workload", "workload", "text", 14), Col("prompt_tokens", "prompt", ".0f"),
              Col("found_share", "found", "%"), Col("alpha", "alpha", ".2f"),
              Col("tokens_per_target_forward", "tokens / fwd", ".2f"),
              Col("speedup", "x plain", "x"), Col("predicted_speedup", "model", "x"))),
        View("9. Verify cost", "Is verifying k tokens nearly free when decode is memory-bound?", "regimes",
             (Col("regime", "regime", "text", 8), Col("verify_k4", "k=4", ".2f"), Col("verify_k8", "k=8", ".2f"),
              Col("verify_k16", "k=16 (steps)", ".2f"), Col("best_gamma", "best g", "int"),
              Col("predicted_speedup", "predicted", "x"), Col("predicted_free_verify", "if free", "x")),
             chart=Chart("verify cost vs tokens per forward", "verify_curve", x="k", y="relative_to_k1",
                         series="regime", xlabel="k (tokens in one forward)",
                         ylabel="x one-token step") if full else None),
    ]
    if not full:  # --quick: counted-only parts (draft-length policies too) and the absent batch part leave the report
        out = [v for v in out if v.title[0] not in "4567"]
    return out


def best_method(result: LabResult) -> tuple[str, float] | None:
    """The fastest method of this run against plain decoding on the same prompts: (label, x plain)."""
    cands = []
    if "speed" in result.tables:
        for r in result.tables["speed"].itertuples():
            if r.method != "plain (ours)" and r.speedup == r.speedup:
                cands.append((f"{r.method} on held-out text", r.speedup))
    if "lookup" in result.tables:
        for r in result.tables["lookup"].itertuples():
            if not r.workload.startswith("open") and r.speedup == r.speedup:
                cands.append((f"prompt lookup on {r.workload}", r.speedup))
    return max(cands, key=lambda c: c[1]) if cands else None


def headline(result: LabResult, claims: list[Claim]) -> str:
    """The best method and its speed-up; the model draft's speed-up and why: its tokens against its cost."""
    try:
        r = row(result, "acceptance")
    except (KeyError, IndexError):
        return ""
    best = best_method(result)
    lead_in = f"Best here: {best[0].replace(' (ours)', '')}, {best[1]:.2f}x plain. " if best else ""
    x, g, a, c, v, tau = (r["measured_speedup"], int(r["gamma"]), r["alpha"], r["cost_ratio_c"], r["verify_cost"],
                          r["tau"])
    cost = g * c + v
    timed = f"Timed on {timed_models(result)}. " if result.env.get("speed_models", {}).get("kind") == "arch" else ""
    head = (f"{timed}{lead_in}The model draft gives {x:.2f}x (gamma {g}): a round yields {tau:.2f} tokens "
            f"(alpha {a:.2f}) for {cost:.2f} target steps ({g} drafts x c {c:.2f} + a verify of {v:.2f}).")
    tail = _lookup_why(result)
    if timed:
        return (f"{head} A random-weight pair's acceptance is no draft's: the regimes table predicts the trained "
                "pair's alpha at these costs.")
    if x >= GOAL_VS_PLAIN:
        return head + tail
    lead = "Why" if x < 1 else "Why not more"
    if v > 1.2:
        why = (f"{lead}: verifying {g + 1} tokens costs {v:.2f} target steps here, not 1: "
               "the tiny model is compute-bound in cache, not memory-bound")
        try:
            d = result.tables["regimes"].set_index("regime").loc["DRAM"]
            why += f"; a DRAM-sized model pays {d.verify_k4:.2f} for 4 tokens."
        except (KeyError, AttributeError):
            why += "."
    elif g * c >= tau - 1:
        why = f"{lead}: the draft costs {c:.2f} of a target step and is right too rarely (alpha {a:.2f})."
    else:
        why = f"{lead}: the loop's own overhead per round, beyond what the model predicts."
    return f"{head} {why}{tail}"


def _lookup_setting(result: LabResult) -> str:
    c = result.config
    lo, hi, k = c.get("lookup_min_ngram", 1), c.get("lookup_max_ngram", 2), c.get("lookup_tokens", 4)
    return f"n-grams {lo}-{hi}, {k} drafted"


def _lookup_why(result: LabResult) -> str:
    """One sentence on prompt lookup over quoted text, when it misses its goal because the model does not copy."""
    try:
        lk = result.tables["lookup"].set_index("workload")
        c = row(result, "copy")
        q = float(lk.loc["quote", "speedup"])
    except (KeyError, IndexError, ValueError):
        return ""
    if q >= GOAL_LOOKUP_GROUNDED or c["second_read"] >= COPY_MIN:
        return ""
    return (f" Lookup on quoted source: {q:.2f}x; the model does not copy its input (a read passage's repeat "
            f"{c['second_read']:.0%} right).")
