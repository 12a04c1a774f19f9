"""The five-steps lab's verdicts, headline and views, from the tables alone."""

from __future__ import annotations

from llmlab.core.results import Chart, Claim, Col, LabResult, View
from llmlab.labs.five_steps.lab import share_rows

ADD_UP_TOL = 0.10  # the steps' stamps must cover the forward within 10%: the remainder is residual adds, masks, Python
FLOP_TOL = 0.05  # formula vs FlopCounterMode
SAMPLE_SHARE_MAX = 0.05  # "picking the word is a negligible share": under 5% of a decode step

# ---------------------------------------------------------------- judge


def judge(result: LabResult) -> list[Claim]:
    """Every verdict from the tables alone."""
    claims = []
    t = result.tables
    hc = t.get("hand_run")
    if hc is not None and not hc.empty:
        r = hc.iloc[0]
        ok = r.max_abs_logit_diff <= r.tolerance and r.hand_token == r.generate_token
        claims.append(Claim("five_steps.no_sixth_step", "the five steps are the whole computation",
                            f"max |hand-run logit - forward logit| <= {r.tolerance:g} (FP32) and the hand run's argmax "
                            "= generate's first token",
                            f"max |diff| {r.max_abs_logit_diff:.1e}; token {int(r.hand_token)} vs "
                            f"{int(r.generate_token)}", ok))
    walk = t.get("walk")
    if walk is not None and not walk.empty:
        both = walk if t.get("walk_big") is None else __import__("pandas").concat([walk, t["walk_big"]])
        bad = both[(both["shape"] != both["expected"]) | ~both.apply(_id_in_vocab, axis=1)]
        claims.append(Claim("five_steps.shapes_as_predicted", "each step turns (1, T) into (1, T, d), then (1, V)",
                            "every step's shape = the prediction from the config and the tokenizer's count alone: "
                            "(1, T), (1, T, d) x 4, (1, 1, V), (1,); and the sampled id in [0, V)",
                            f"{len(both) - len(bad)}/{len(both)} steps as predicted"
                            + ("" if bad.empty else f"; first off: {bad.iloc[0]['step']} {_shown(bad.iloc[0])}"),
                            bad.empty))
    tm = t.get("time")
    if tm is not None and not tm.empty:
        first = tm[tm.model == tm.model.iloc[0]]
        dec = first[first.phase == "decode"].set_index("step")
        fwd, stamped = dec.measured_forward_ms.iloc[0], dec.stamped_ms.iloc[0]
        rem = 1 - stamped / fwd
        claims.append(Claim("five_steps.steps_add_up", "the steps account for the whole forward",
                            f"|1 - stamped steps / forward| <= {ADD_UP_TOL:.0%} (a decode step)",
                            f"{stamped:.2f} of {fwd:.2f} ms "
                            f"({rem:+.1%} remainder: residuals, masks, Python)", abs(rem) <= ADD_UP_TOL))
        am = (dec.time_ms["2. attention"] + dec.time_ms["3. MLP"]) / dec.time_ms.sum()
        claims.append(Claim("five_steps.attention_mlp_dominate",
                            "attention and MLP, repeated per layer, take most of the time",
                            "(attention + MLP) / all steps > 50% of a decode step's time",
                            f"{am:.0%} ({first.model.iloc[0]}, decode)", am > 0.5))
        sm = dec.time_ms["5. sample"] / dec.time_ms.sum()
        claims.append(Claim("five_steps.sampling_negligible", "picking the word is a negligible share",
                            f"sample / all steps < {SAMPLE_SHARE_MAX:.0%} of a decode step's time",
                            f"{sm:.1%} ({dec.time_ms['5. sample']:.3f} ms)",
                            sm < SAMPLE_SHARE_MAX))
        c = tm[tm.counted_flops > 0]
        old = "uncounted_flops" in c and (c.uncounted_flops > 0).any()  # a version-1 run: SDPA's core left out
        err = ((c.flops - (c.uncounted_flops if old else 0)) / c.counted_flops - 1).abs().max()
        skip = " (SDPA core excluded: a version-1 run)" if old else ""
        claims.append(Claim("five_steps.flops_formula", "the shape formula gives each step's FLOPs",
                            f"|formula / FlopCounterMode - 1| <= {FLOP_TOL:.0%} at every counted step (attention with "
                            "its SDPA core, MLP, LM head)", f"worst step off by {err:.1%}{skip}", err <= FLOP_TOL))
        models = list(dict.fromkeys(tm.model))
        if len(models) > 1:
            sh = __import__("pandas").DataFrame(share_rows(tm.to_dict("records")))
            head = sh[(sh.phase == "decode") & (sh.step == "4. LM head")].set_index("model").time_share
            claims.append(Claim("five_steps.lm_head_share_by_size",
                                "the LM head's share changes with the model's shape",
                                "largest vs tiny", " -> ".join(f"{m.split(':')[-1]} {head[m]:.0%}" for m in models),
                                None,
                                note="a description, not a test: which way it goes depends on vocab vs width x layers"))
    return claims


def _id_in_vocab(row) -> bool:
    """The sample row's id lies in [0, V); other rows (and the meta walk, which draws no value) have none to check."""
    tid = row.get("token_id")
    return tid is None or tid != tid or 0 <= tid < row.get("vocab", float("inf"))  # tid != tid: NaN from a CSV


def _shown(row) -> str:
    tid = row.get("token_id")
    return row["shape"] if tid is None or tid != tid else f"{row['shape']} id {int(tid)}"


def headline(result: LabResult, claims: list[Claim]) -> str:
    sh = result.tables.get("shares")
    if sh is None or sh.empty:
        return ""
    d = sh[(sh.model == sh.model.iloc[0]) & (sh.phase == "decode")].set_index("step")
    top = d.time_share.idxmax()
    return (f"One decode step of {sh.model.iloc[0]}: {top} takes {d.time_share[top]:.0%} of the time; "
            f"attention + MLP {d.time_share['2. attention'] + d.time_share['3. MLP']:.0%}, picking the word "
            f"{d.time_share['5. sample']:.1%}.")


def views(result: LabResult) -> list[View]:
    cfg = result.config
    return [
        View("1. One word, five steps", f"What happens to {cfg.get('prompt', '')!r} on its way to the next word?",
             "walk",
             (Col("step", "step"), Col("what", "what", width=40), Col("shape", "shape"))),
        View("   ... the candidates after step 4, and step 5's pick",
             "Which words score highest, and which gets picked?",
             "candidates", (Col("rank", "rank", "int"), Col("word", "word", width=16), Col("probability", "p", ".3f"),
                            Col("greedy_pick", "greedy"), Col("top_p_pick", f"top-p {cfg.get('top_p', '')}"))),
        View("   ... the same walk through Llama 3 8B (meta device: shapes only)",
             "How big is each step in the article's model?",
             "walk_big", (Col("step", "step"), Col("what", "what", width=34), Col("shape", "shape"))),
        View("2. Where the time goes", "Which step takes the time of one decode step and of one prefill?", "shares",
             (Col("phase", "phase"), Col("step", "step"), Col("time_share", "time", "%"),
              Col("flop_share", "FLOPs", "%"),
              Col("byte_share", "weight bytes", "%")),
             rows=lambda df: df[df.model == df.model.iloc[0]],
             chart=Chart("share of a decode step's time", "chart_decode", "step", "time_share", kind="bar",
                         ylabel="share of time")),
        View("3. What changes with size", "How does the split move as the model grows (decode step)?", "sizes",
             (Col("model", "model"), Col("step", "step"), Col("time_share", "time", "%"),
              Col("flop_share", "FLOPs", "%"))),
        View("4. No secret sixth step", "Do the five steps by hand give the model's own answer?", "hand_run",
             (Col("max_abs_logit_diff", "max |logit diff|", ".1e"), Col("tolerance", "tolerance", ".0e"),
              Col("hand_token", "by hand", "int"), Col("generate_token", "generate", "int"))),
    ]
