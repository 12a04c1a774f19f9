"""The verdicts, from a run's tables and config alone: one function per group of claims, in the report's order."""

from __future__ import annotations

from llmlab.core import stats as st
from llmlab.core.results import Claim, LabResult
from llmlab.labs.speculative.config import (
    BEST_GAMMA_OUTSIDE,
    COPY_MIN,
    COPY_TOKENS,
    GOAL_LOOKUP_CONTROL,
    GOAL_LOOKUP_GROUNDED,
    GOAL_VS_HF_ASSISTED,
    GOAL_VS_PLAIN,
    LAB,
    PREDICTION_TOLERANCE,
    TREE_TOL,
    VERIFY_FREE,
)


def _claim(cid: str, text: str, expected: str, fn, note: str = "") -> Claim:
    """A claim from fn() -> (measured, holds[, note]); a table this run lacks makes it 'not measured'."""
    try:
        out = fn()
    except (KeyError, IndexError, ValueError, AttributeError, ZeroDivisionError) as exc:
        why = str(exc) if isinstance(exc, ValueError) and str(exc) else f"this run lacks it ({type(exc).__name__})"
        return Claim(f"{LAB}.{cid}", text, expected, "-", None, f"not measured: {why}")
    measured, holds, *why = out
    return Claim(f"{LAB}.{cid}", text, expected, measured, holds, why[0] if why else note)


def row(result: LabResult, table: str) -> dict:
    """The first row of a one-row table."""
    return result.tables[table].iloc[0].to_dict()


def judge(result: LabResult) -> list[Claim]:
    """Pure: every verdict from result.tables and result.config."""
    return (_correctness_claims(result) + _speed_claims(result) + _sweep_claims(result) + _lookup_claims(result)
            + _verify_claims(result))


def _trained(result: LabResult, fn):
    """A speed-up that rests on the draft's acceptance: a random-weight arch: pair's says nothing of a trained one's."""
    timed_on = result.env.get("speed_models", {})

    def f():
        if timed_on.get("kind") == "arch":
            return "-", None, (f"not measured: this run timed {timed_on['target']}, random weights: its acceptance "
                               "is no draft's (the regimes table predicts the trained pair's alpha at its costs)")
        return fn()
    return f


def _goal(result: LabResult, fn):
    """The goals are greedy, for the loaded (built-in) pair."""
    greedy = float(result.config.get("temperature", 0.0)) == 0.0

    def f():
        if not greedy:
            return "-", None, "the goal is greedy: run with --temperature 0"
        return _trained(result, fn)()
    return f


def _correctness_claims(result: LabResult) -> list[Claim]:
    """Same output: greedy identity, the tree forward, the distribution test and what it covered."""
    t = result.tables

    def identity():
        df = t["identity"]
        if df.empty:
            raise ValueError("no greedy runs")
        bad = df[~df.identical.astype(bool)]
        first = "" if bad.empty else f"; {bad.iloc[0].check} diverges at token {int(bad.iloc[0].first_divergence)}"
        return f"{int(df.identical.sum())}/{len(df)} runs identical{first}", bad.empty

    def tree_exact():
        r = row(result, "tree_check")
        return f"max diff {r['max_abs_logit_diff']:.1e}, {int(r['nodes'])} nodes", bool(r["match"])

    def distribution():
        df = t["distribution"]
        return f"min p {df.p_value.min():.3f} of {len(df)}, w {df.detectable_w.max():.2f}", bool(df.passes.all())

    def covered():
        df = t["distribution"].drop_duplicates("method")
        parts = ["multi_accept_rounds", "residual_draws", "bonus_tokens"]
        low = df[(df[parts] <= 0).any(axis=1)]
        m = "; ".join(f"{r.method.split()[0]} {int(r.multi_accept_rounds)}/{int(r.residual_draws)}/"
                      f"{int(r.bonus_tokens)}" for r in df.itertuples())
        return m, low.empty, "" if low.empty else "a path the test never took is not tested"

    return [
        _claim("greedy_identity", "greedy speculative output == plain greedy, token for token",
               "every run identical (FP32)", identity),
        _claim("tree_forward_exact", "one tree forward == plain forwards of each path",
               f"max |logit diff| <= {TREE_TOL:g}", tree_exact),
        _claim("distribution_matches_target", "sampled runs follow the target's exact law",
               f"every p > {st.SIGNIFICANCE}", distribution),
        _claim("distribution_test_covered", "the test saw multi-accepts, residuals, bonus tokens",
               "each method: multi/residual/bonus > 0", covered),
    ]


def _speed_claims(result: LabResult) -> list[Claim]:
    """Speed: the speed-up, Leviathan's prediction and the verify-cost model, the best gamma, the goals."""
    t = result.tables
    a = lambda: row(result, "acceptance")  # noqa: E731
    speed = lambda: t["speed"].set_index("method").speedup  # noqa: E731

    def pays():
        r = a()
        x = r["measured_speedup"]
        return f"{x:.2f}x (p10-p90 {r['measured_p10']:.2f}-{r['measured_p90']:.2f}), gamma {int(r['gamma'])}", x > 1

    def within(col: str):
        r = a()
        x, pred = r["measured_speedup"], r[col]
        return f"{x:.2f}x vs {pred:.2f}x ({x / pred - 1:+.0%})", abs(x / pred - 1) <= PREDICTION_TOLERANCE

    def vs_plain():
        x = a()["measured_speedup"]
        return f"{x:.2f}x", x >= GOAL_VS_PLAIN

    def vs_hf():
        s = speed()
        x = s["speculative (ours)"] / s["HF assisted"]
        return f"{x:.2f}x ({s['speculative (ours)']:.2f} vs {s['HF assisted']:.2f})", x >= GOAL_VS_HF_ASSISTED

    def loop_vs_hf():
        x = 1 / speed()["HF generate"]
        return f"{x:.2f}x", x >= 1

    def best_gamma():
        df = t["gamma_sweep"]
        if df.speedup.isna().all():
            raise ValueError("no gamma timed")
        gs = list(df.gamma)
        got, want = int(df.loc[df.speedup.idxmax()].gamma), int(df.loc[df.predicted_speedup_verify.idxmax()].gamma)
        outside = sum(abs(i - gs.index(got)) > 1 for i in range(len(gs)))
        if outside < BEST_GAMMA_OUTSIDE:
            raise ValueError(f"{len(gs)} gammas: any prediction lands within one step (--gammas for a wider sweep)")
        return f"best {got}, model {want} (of {len(gs)})", abs(gs.index(got) - gs.index(want)) <= 1

    tol, g = PREDICTION_TOLERANCE, result.config.get("gamma", 4)
    return [
        _claim("pays_off", "speculative decoding is faster than plain decoding here", "> 1x", _trained(result, pays)),
        _claim("within_leviathan", f"speed-up within {tol:.0%} of Leviathan's formula",
               f"within {tol:.0%} of tau/(g c + 1)", lambda: within("predicted_speedup")),
        _claim("within_verify_model", f"speed-up within {tol:.0%} of the verify-cost model",
               f"within {tol:.0%} of tau/(g c + v)", lambda: within("predicted_speedup_verify")),
        _claim("best_gamma_predicted", "the verify-cost model finds the best gamma",
               "model's best within 1 step of the measured", best_gamma),
        _claim("vs_plain_goal", f"ours >= {GOAL_VS_PLAIN}x our plain decoding (the goal)", f">= {GOAL_VS_PLAIN}x",
               _goal(result, vs_plain)),
        _claim("vs_hf_assisted", f"ours >= {GOAL_VS_HF_ASSISTED}x HF assisted (same draft, gamma {g})",
               f">= {GOAL_VS_HF_ASSISTED}x", _goal(result, vs_hf)),
        _claim("loop_vs_hf_generate", "our plain loop is at least as fast as HF generate", ">= 1x", loop_vs_hf),
    ]


def _sweep_claims(result: LabResult) -> list[Claim]:
    """Temperature (alpha vs beta), draft-length policies (the oracle), tree vs chain, batch size."""
    t = result.tables

    def alpha_beta():
        df = t["temperature_sweep"]
        df = df[df.temperature > 0]
        if df.empty:
            raise ValueError("no T > 0 row")
        ok = bool(((df.alpha - df.beta).abs() <= 3 * df.beta_se + 1e-9).all())
        return "; ".join(f"T={r.temperature:g}: {r.alpha:.3f} vs {r.beta:.3f}" for r in df.itertuples()), ok

    def oracle():
        df = t["policies"].set_index("policy")
        o = df.loc["oracle"]
        others = df.drop(index="oracle")
        if (others.max_gamma > o.max_gamma).any():
            return "budgets differ", None, "the oracle must not draft more than the others"
        best = others.tokens_per_target_forward.idxmax()
        top = others.tokens_per_target_forward.max()
        return (f"{o.tokens_per_target_forward:.2f} vs {best.split()[0]} {top:.2f} tok/fwd",
                bool(o.tokens_per_target_forward >= top - 1e-9))

    def tree_budget():
        df = t["tree"]
        df = df[df.sampling == "greedy"].set_index("compared")
        tree = df[df.method == "tree"].iloc[0]
        chain = df.loc["same verify budget"]
        return (f"{tree.tokens_per_target_forward:.2f} vs {chain.tokens_per_target_forward:.2f} tok/fwd",
                bool(tree.tokens_per_target_forward > chain.tokens_per_target_forward))

    def batch():
        if "batch" in result.skipped:
            return "-", None, f"not measured: {result.skipped['batch']}"
        df = t["batch"]
        if len(df) < 2:
            raise ValueError("one batch size")
        lo, hi = df.iloc[0], df.iloc[-1]
        return (f"{lo.speedup:.2f}x at B={int(lo.batch)} -> {hi.speedup:.2f}x at B={int(hi.batch)}",
                bool(hi.speedup < lo.speedup))

    return [
        _claim("alpha_matches_beta", "counted acceptance == analytic beta = sum min(p, q)",
               "|alpha - beta| <= 3 s.e. at each T > 0", alpha_beta),
        _claim("oracle_bounds_policies", "the oracle beats every policy at the same budget",
               "oracle tok/fwd >= every policy's", oracle),
        _claim("tree_beats_chain_same_budget", "a tree beats a chain verifying as many tokens",
               "tree tok/fwd > the chain's (greedy)", tree_budget),
        _claim("speedup_shrinks_with_batch", "the speed-up shrinks as the batch grows",
               "x plain at the largest B < at the smallest", batch),
    ]


def _lookup_claims(result: LabResult) -> list[Claim]:
    """Prompt lookup: its goal on input-grounded text, whether the target copies, its cost on open text."""
    t = result.tables

    def lookup_grounded():
        df = t["lookup"]
        df = df[~df.workload.str.startswith("open")]
        if df.empty or df.speedup.isna().all():
            raise ValueError("no timed grounded workload")
        x = df.speedup.min()
        return "; ".join(f"{r.workload} {r.speedup:.2f}x" for r in df.itertuples()), bool(x >= GOAL_LOOKUP_GROUNDED)

    def lookup_control():
        r = t["lookup"].set_index("workload").loc["open (control)"]
        return (f"{r.speedup:.2f}x ({r.found_share:.0%} of rounds found a draft)",
                bool(r.speedup >= GOAL_LOOKUP_CONTROL))

    def copies():
        c = t["copy"].iloc[0]
        return (f"repeat {c.second_read:.0%} right, first read {c.first_read:.0%}", bool(c.second_read >= COPY_MIN),
                "no induction heads: lookup's drafts pay only where the model repeats itself")

    return [
        _claim("lookup_grounded_goal", f"prompt lookup >= {GOAL_LOOKUP_GROUNDED}x plain on quote and edit (the goal)",
               f">= {GOAL_LOOKUP_GROUNDED}x each", _goal(result, lookup_grounded)),
        _claim("target_copies_input", f"the target copies a {COPY_TOKENS}-token passage it just read",
               f">= {COPY_MIN:.0%} of the repeat", copies),
        _claim("lookup_control_cheap", "prompt lookup costs little on open-ended text",
               f">= {GOAL_LOOKUP_CONTROL}x plain", _goal(result, lookup_control)),
    ]


def _verify_claims(result: LabResult) -> list[Claim]:
    """Verify cost: nearly free when decode is memory-bound (the DRAM regime)."""

    def verify_free():
        df = result.tables["regimes"].set_index("regime")
        if "verify_dram" in result.skipped or "DRAM" not in df.index:
            return "-", None, f"not measured: {result.skipped.get('verify_dram', 'no DRAM regime')}"
        d, c = df.loc["DRAM"], df.loc["in cache"]
        return (f"DRAM {d.verify_k4:.2f}, in cache {c.verify_k4:.2f} steps for 4 tokens",
                bool(d.verify_k4 <= VERIFY_FREE))

    return [_claim("verify_free_when_memory_bound", "verify is nearly free when decode is memory-bound (DRAM model)",
                   f"DRAM: 4 tokens <= {VERIFY_FREE} one-token steps", verify_free)]
