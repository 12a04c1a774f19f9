"""The speculative lab: judge() on hand-made tables (every claim can hold and can fail), the headline's
reason, `--quick --json` end to end through the CLI, and bad input exiting 2."""

from __future__ import annotations

import json
import types

import pandas as pd
import pytest

from llmlab.core.results import LabResult, find
from llmlab.labs import speculative as lab

IDS = ["greedy_identity", "tree_forward_exact", "distribution_matches_target", "distribution_test_covered", "pays_off",
       "within_leviathan", "within_verify_model", "best_gamma_predicted", "vs_plain_goal", "vs_hf_assisted",
       "loop_vs_hf_generate", "alpha_matches_beta", "oracle_bounds_policies", "tree_beats_chain_same_budget",
       "speedup_shrinks_with_batch", "lookup_grounded_goal", "target_copies_input", "lookup_control_cheap",
       "verify_free_when_memory_bound"]


def _fixture() -> LabResult:
    """A run in which every claim holds."""
    res = LabResult.new("speculative", lab.VERSION, lab.Config())
    t = {
        "identity": [dict(check="chain gamma=4", prompt=0, tokens=32, identical=True, first_divergence=-1)] * 3,
        "tree_check": [dict(branching="(2, 2, 1, 1)", nodes=14, max_abs_logit_diff=1e-5, tolerance=1e-3, match=True)],
        "distribution": [dict(method=m, outcome=o, samples=600, cells=20, p_value=0.4, significance=1e-3, detectable_w=0.3,
                              passes=True, multi_accept_rounds=40, residual_draws=90, bonus_tokens=30)
                         for m in ("chain gamma=3", "tree (2, 2, 1)") for o in ("tokens 1-3 jointly", "tokens 1-4 jointly")],
        "acceptance": [dict(gamma=4, temperature=0.0, rounds=50, alpha=0.75, beta=0.75, tau=3.0, expected_tau=3.05,
                            tokens_per_target_forward=3.0, cost_ratio_c=0.2, verify_cost=1.1, predicted_speedup=1.5,
                            predicted_speedup_verify=1.45, measured_speedup=1.4, measured_p10=1.3, measured_p90=1.5)],
        "speed": [dict(method=m, gamma=g, tokens_per_s=100 * x, speedup=x) for m, g, x in
                  (("plain (ours)", 0, 1.0), ("HF generate", 0, 0.9), ("speculative (ours)", 4, 1.4), ("HF assisted", 4, 1.0))],
        "gamma_sweep": [dict(gamma=g, alpha=0.75, verify_cost=1.1, speedup=x, predicted_speedup=p + 0.1,
                             predicted_speedup_verify=p) for g, x, p in ((1, 1.1, 1.1), (2, 1.3, 1.3), (4, 1.4, 1.45), (6, 1.35, 1.4))],
        "temperature_sweep": [dict(temperature=T, alpha=0.8, beta=0.79, beta_se=0.02, tau=3.0) for T in (0.0, 1.0)],
        "policies": [dict(policy=p, max_gamma=m, tokens_per_target_forward=x) for p, m, x in
                     (("constant 4", 4, 3.0), ("heuristic +2/-1", 8, 3.2), ("confidence < 0.6", 8, 3.1), ("oracle", 8, 4.0))],
        "tree": [dict(sampling="greedy", method=m, compared=c, verified_per_forward=v, tokens_per_target_forward=x) for m, c, v, x in
                 (("chain gamma=4", "same depth", 5, 3.0), ("chain gamma=14", "same verify budget", 15, 3.5),
                  ("tree", "tree (2, 2, 1, 1)", 15, 3.8))],
        "batch": [dict(batch=1, speedup=1.2), dict(batch=8, speedup=0.6)],
        "lookup": [dict(workload=w, prompt_tokens=p, found_share=f, alpha=0.8, tokens_per_target_forward=3.0, speedup=x,
                        predicted_speedup=x) for w, p, f, x in
                   (("quote", 330, 0.9, 2.1), ("edit", 320, 0.9, 1.8), ("open (control)", 32, 0.2, 1.0))],
        "copy": [dict(passages=2, tokens=64, first_read=0.3, second_read=0.95)],
        "regimes": [dict(regime=r, verify_k4=v, verify_k8=v, verify_k16=v, best_gamma=4, predicted_speedup=1.5,
                         predicted_free_verify=1.6) for r, v in (("in cache", 1.3), ("DRAM", 1.05))],
    }
    for name, rows in t.items():
        res.add_table(name, pd.DataFrame(rows))
    return res


def _set(res: LabResult, table: str, col: str, value, where=None) -> LabResult:
    df = res.tables[table]
    df.loc[df.index if where is None else where(df), col] = value
    return res


FAILS = {  # claim -> how a run makes it fail
    "greedy_identity": lambda r: _set(r, "identity", "identical", False, lambda d: d.index[:1]),
    "tree_forward_exact": lambda r: _set(r, "tree_check", "match", False),
    "distribution_matches_target": lambda r: _set(_set(r, "distribution", "p_value", 1e-5, lambda d: d.index[-1:]),
                                                  "distribution", "passes", False, lambda d: d.index[-1:]),
    "distribution_test_covered": lambda r: _set(r, "distribution", "bonus_tokens", 0, lambda d: d.method == "tree (2, 2, 1)"),
    "pays_off": lambda r: _set(r, "acceptance", "measured_speedup", 0.9),
    "within_leviathan": lambda r: _set(r, "acceptance", "predicted_speedup", 2.0),
    "within_verify_model": lambda r: _set(r, "acceptance", "predicted_speedup_verify", 2.0),
    "best_gamma_predicted": lambda r: _set(_set(r, "gamma_sweep", "speedup", 2.0, lambda d: d.gamma == 1), "gamma_sweep",
                                           "predicted_speedup_verify", 2.0, lambda d: d.gamma == 6),
    "vs_plain_goal": lambda r: _set(r, "acceptance", "measured_speedup", 1.2),
    "vs_hf_assisted": lambda r: _set(r, "speed", "speedup", 1.3, lambda d: d.method == "HF assisted"),
    "loop_vs_hf_generate": lambda r: _set(r, "speed", "speedup", 1.2, lambda d: d.method == "HF generate"),
    "alpha_matches_beta": lambda r: _set(r, "temperature_sweep", "alpha", 0.9, lambda d: d.temperature > 0),
    "oracle_bounds_policies": lambda r: _set(r, "policies", "tokens_per_target_forward", 2.0, lambda d: d.policy == "oracle"),
    "tree_beats_chain_same_budget": lambda r: _set(r, "tree", "tokens_per_target_forward", 3.2, lambda d: d.method == "tree"),
    "speedup_shrinks_with_batch": lambda r: _set(r, "batch", "speedup", 1.5, lambda d: d.batch == 8),
    "lookup_grounded_goal": lambda r: _set(r, "lookup", "speedup", 1.3, lambda d: d.workload == "edit"),
    "target_copies_input": lambda r: _set(r, "copy", "second_read", 0.3),
    "lookup_control_cheap": lambda r: _set(r, "lookup", "speedup", 0.9, lambda d: d.workload == "open (control)"),
    "verify_free_when_memory_bound": lambda r: _set(r, "regimes", "verify_k4", 1.9, lambda d: d.regime == "DRAM"),
}


def test_every_claim_holds_on_a_good_run():
    claims = lab.judge(_fixture())
    assert [c.id for c in claims] == [f"speculative.{i}" for i in IDS]  # ids are stable: the docs cite them
    bad = [(c.id, c.measured, c.note) for c in claims if c.holds is not True]
    assert not bad, bad


@pytest.mark.parametrize("claim", IDS)
def test_each_claim_can_fail(claim):
    res = FAILS[claim](_fixture())
    claims = lab.judge(res)
    assert find(claims, f"speculative.{claim}").holds is False
    others = [c.id for c in claims if c.holds is not True and c.id != f"speculative.{claim}"]
    if claim in ("vs_plain_goal", "pays_off"):  # a lower measured speed-up also moves the prediction claims
        others = [o for o in others if "within" not in o and "vs_plain" not in o]
    assert not others, others


def test_claims_that_a_run_could_not_measure():
    res = _fixture()
    res.config["temperature"] = 0.7  # the goals are greedy
    del res.tables["batch"]
    res.skip("batch", "not in --quick")
    res.tables["temperature_sweep"] = res.tables["temperature_sweep"].iloc[:1]  # T = 0 only: alpha == beta by construction
    del res.tables["lookup"], res.tables["regimes"]  # an older run: no prompt lookup, no verify-cost curve
    claims = lab.judge(res)
    for cid in ("vs_plain_goal", "vs_hf_assisted", "speedup_shrinks_with_batch", "alpha_matches_beta",
                "lookup_grounded_goal", "lookup_control_cheap", "verify_free_when_memory_bound"):
        c = find(claims, f"speculative.{cid}")
        assert c.holds is None and c.note, cid
    assert "not in --quick" in find(claims, "speculative.speedup_shrinks_with_batch").note


def test_headline_says_why_when_it_does_not_pay_off():
    res = _fixture()
    _set(res, "acceptance", "measured_speedup", 0.85)
    _set(res, "acceptance", "verify_cost", 1.4)
    line = lab.headline(res, lab.judge(res))
    assert "0.85x" in line and "verifying 5 tokens costs 1.40 target steps" in line and "compute-bound" in line
    assert line.startswith("Best here: prompt lookup on quote, 2.10x plain.")  # the best method, on its workload
    assert "a DRAM-sized model pays 1.05 for 4 tokens" in line
    res = _fixture()
    _set(res, "acceptance", "verify_cost", 1.0)
    _set(res, "acceptance", "cost_ratio_c", 0.6)  # 4 drafts x 0.6 = 2.4 steps for tau 3: the draft is the cost
    _set(res, "acceptance", "measured_speedup", 0.9)
    assert "the draft costs 0.60 of a target step" in lab.headline(res, [])
    res = _fixture()
    _set(res, "acceptance", "measured_speedup", 1.5)
    assert "Why" not in lab.headline(res, [])  # it pays off as the goal asks: nothing to explain


def test_headline_says_lookup_misses_because_the_model_does_not_copy():
    res = _fixture()
    _set(_set(res, "copy", "second_read", 0.27), "copy", "first_read", 0.26)
    _set(res, "lookup", "speedup", 1.2, lambda d: d.workload == "quote")
    line = lab.headline(res, lab.judge(res))
    assert "Lookup on quoted source: 1.20x; the model does not copy" in line and "27% right, as 26% the first time" in line
    assert "does not copy" not in lab.headline(_fixture(), [])  # a model that copies: nothing to explain


def test_quick_json_end_to_end(quick_run):
    d = quick_run("speculative").data  # the session's one quick run (tests/conftest.py)
    assert d["lab"] == "speculative" and not d["interrupted"] and d["judge_version"] == lab.JUDGE_VERSION
    tables = d["tables"]

    def rows(name):  # the JSON form of a table: columns + rows of values
        t = tables[name]
        return [dict(zip(t["columns"], r, strict=True)) for r in t["rows"]]

    q = lab.Config.quick()
    assert {r["method"] for r in rows("speed")} == {"plain (ours)", "HF generate", "speculative (ours)", "HF assisted",
                                                    "prompt lookup (ours)"}
    lk = {r["workload"]: r for r in rows("lookup")}
    assert set(lk) == {"quote", "edit", "open (control)"} and all(r["identical"] for r in lk.values())
    assert all(r["tokens_per_target_forward"] >= 1 and r["speedup"] > 0.2 for r in lk.values())
    curve = rows("verify_curve")
    for regime in ("in cache", "DRAM"):  # the verify-cost curve of both regimes is in --quick
        ks = [r["k"] for r in curve if r["regime"] == regime]
        assert ks == list(q.verify_ks), regime
    dram = next(r for r in curve if r["regime"] == "DRAM")
    assert dram["weights_MB"] >= q.dram_llc_multiple * dram["llc_MB"]  # weights >= 8x the last-level cache
    assert "verify_gpu" in d["skipped"] or d["env"]["device"]["device"].startswith("cuda")
    assert [r["gamma"] for r in rows("gamma_sweep")] == sorted(set(q.gammas) | {q.gamma})
    assert all(r["speedup"] > 0.2 and r["predicted_speedup_verify"] > 0 for r in rows("gamma_sweep"))
    acc = rows("acceptance")[0]
    assert acc["beta"] == pytest.approx(acc["alpha"])  # greedy: beta counts the same agreements (a note, not a claim)
    assert acc["tau"] >= 1.5 and acc["alpha"] >= 0.4  # the trained pair agrees (model card: ~0.7)
    assert d["skipped"]["batch"] == "not in --quick (timed batches take minutes)" and "verify_dram" not in d["skipped"]
    verdicts = {c["id"]: c["holds"] for c in d["claims"]}
    assert list(verdicts) == [f"speculative.{i}" for i in IDS]
    for must in ("greedy_identity", "tree_forward_exact", "distribution_matches_target", "distribution_test_covered",
                 "oracle_bounds_policies"):
        assert verdicts[f"speculative.{must}"] is True, must  # correctness does not depend on the machine's load
    assert all(r["samples"] == q.dist_samples and r["passes"] for r in rows("distribution"))


def _assert_usage_error(r: types.SimpleNamespace, *needles: str) -> None:
    assert r.returncode == 2, (r.returncode, r.stderr)
    err = r.stderr.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    for n in needles:
        assert n in err, err


@pytest.mark.parametrize("args, needle", [
    (("--gamma", "0"), "--gamma"),
    (("--temperature", "-0.5"), "--temperature"),
])
def test_bad_input_exits_2(args, needle, cli):
    _assert_usage_error(cli("speculative", "--device", "cpu", "--no-save", *args), needle)


def test_draft_with_another_vocabulary_exits_2(tmp_path, cli):
    from llmlab.core.models import builtin_path

    cfg = json.loads((builtin_path("tiny-draft") / "config.json").read_text())
    cfg["vocab_size"] = 100
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    _assert_usage_error(cli("speculative", "--device", "cpu", "--no-save", "--draft", str(tmp_path)), "100", "4096")


def test_config_validation():
    for bad in (dict(gamma=0), dict(temperature=-1.0), dict(gammas=(0, 2)), dict(gammas=()), dict(tree=(2, 0)),
                dict(top_p=0.0), dict(prompts=0), dict(prompts=33), dict(confidence=1.5), dict(new_tokens=1),
                dict(sweep_repeats=-1), dict(lookup_min_ngram=3, lookup_max_ngram=2), dict(lookup_tokens=0),
                dict(verify_ks=(2, 4)), dict(workload_prompts=-1)):
        with pytest.raises(ValueError):
            lab.Config(**bad)
    q = lab.Config.quick()
    assert q.new_tokens * q.prompts >= 96 and q.repeats >= 3  # the demo's measurement: enough tokens and rounds
    assert lab.Config(temperature=0.7).params().temperature == 0.7


def test_bench_gives_each_side_its_own_best_gamma():
    """Issue 12 item 10: the peer is not handed our best gamma; each side is compared at its own best."""
    from benchmarks import speculative as bench

    ratios = {"ours": {1: 1.0, 3: 1.25, 6: 1.1}, "HF": {1: 0.7, 3: 0.8, 6: 0.95}}
    assert bench.best_gammas(ratios) == {"ours": 3, "HF": 6}
    assert any(kw["schedule"] is None and kw["gamma"] is None for kw in bench.DYNAMIC.values())  # HF's own defaults
    assert any(kw["schedule"] == "heuristic" for kw in bench.DYNAMIC.values())
    assert bench.median_ratio({"a": [2.0, 2.0, 4.0], "b": [1.0, 1.0, 1.0]}, "a", "b") == 2.0
