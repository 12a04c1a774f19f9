"""The speculative lab: judge() on hand-made tables (every claim can hold and can fail), the headline's
reason, `--quick --json` end to end through the CLI, and bad input exiting 2."""

from __future__ import annotations

import json
import types

import pandas as pd
import pytest

from llmlab.core.results import LabResult, find
from llmlab.labs import speculative as lab
from llmlab.labs.speculative.pair import Pair, sampling_params, timing_pair
from llmlab.labs.speculative.regimes import part_verify_curve

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
        "distribution": [dict(method=m, outcome=o, samples=600, cells=20, p_value=0.4, significance=1e-3,
                              detectable_w=0.3, passes=True, multi_accept_rounds=40, residual_draws=90, bonus_tokens=30)
                         for m in ("chain gamma=3", "tree (2, 2, 1)")
                         for o in ("tokens 1-3 jointly", "tokens 1-4 jointly")],
        "acceptance": [dict(gamma=4, temperature=0.0, rounds=50, alpha=0.75, beta=0.75, tau=3.0, expected_tau=3.05,
                            tokens_per_target_forward=3.0, cost_ratio_c=0.2, verify_cost=1.1, predicted_speedup=1.5,
                            predicted_speedup_verify=1.45, measured_speedup=1.4, measured_p10=1.3, measured_p90=1.5)],
        "speed": [dict(method=m, gamma=g, tokens_per_s=100 * x, speedup=x) for m, g, x in
                  (("plain (ours)", 0, 1.0), ("HF generate", 0, 0.9), ("speculative (ours)", 4, 1.4),
                   ("HF assisted", 4, 1.0))],
        "gamma_sweep": [dict(gamma=g, alpha=0.75, verify_cost=1.1, speedup=x, predicted_speedup=p + 0.1,
                             predicted_speedup_verify=p)  # the default sweep, 1..8: the best is 4 measured, 5 modelled
                        for g, x, p in ((1, 1.1, 1.1), (2, 1.3, 1.3), (3, 1.35, 1.4), (4, 1.4, 1.44), (5, 1.38, 1.45),
                                        (6, 1.35, 1.4), (7, 1.3, 1.35), (8, 1.25, 1.3))],
        "temperature_sweep": [dict(temperature=T, alpha=0.8, beta=0.79, beta_se=0.02, tau=3.0) for T in (0.0, 1.0)],
        "policies": [dict(policy=p, max_gamma=m, tokens_per_target_forward=x) for p, m, x in
                     (("constant 4", 4, 3.0), ("heuristic +2/-1", 8, 3.2), ("confidence < 0.6", 8, 3.1),
                      ("oracle", 8, 4.0))],
        "tree": [dict(sampling="greedy", method=m, compared=c, verified_per_forward=v, tokens_per_target_forward=x)
                 for m, c, v, x in
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
    "distribution_test_covered": lambda r: _set(r, "distribution", "bonus_tokens", 0,
                                                lambda d: d.method == "tree (2, 2, 1)"),
    "pays_off": lambda r: _set(r, "acceptance", "measured_speedup", 0.9),
    "within_leviathan": lambda r: _set(r, "acceptance", "predicted_speedup", 2.0),
    "within_verify_model": lambda r: _set(r, "acceptance", "predicted_speedup_verify", 2.0),
    "best_gamma_predicted": lambda r: _set(r, "gamma_sweep", "predicted_speedup_verify", 2.0, lambda d: d.gamma == 7),
    "vs_plain_goal": lambda r: _set(r, "acceptance", "measured_speedup", 1.2),
    "vs_hf_assisted": lambda r: _set(r, "speed", "speedup", 1.3, lambda d: d.method == "HF assisted"),
    "loop_vs_hf_generate": lambda r: _set(r, "speed", "speedup", 1.2, lambda d: d.method == "HF generate"),
    "alpha_matches_beta": lambda r: _set(r, "temperature_sweep", "alpha", 0.9, lambda d: d.temperature > 0),
    "oracle_bounds_policies": lambda r: _set(r, "policies", "tokens_per_target_forward", 2.0,
                                             lambda d: d.policy == "oracle"),
    "tree_beats_chain_same_budget": lambda r: _set(r, "tree", "tokens_per_target_forward", 3.2,
                                                   lambda d: d.method == "tree"),
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
    # T = 0 only: alpha == beta by construction
    res.tables["temperature_sweep"] = res.tables["temperature_sweep"].iloc[:1]
    del res.tables["lookup"], res.tables["regimes"]  # an older run: no prompt lookup, no verify-cost curve
    claims = lab.judge(res)
    for cid in ("vs_plain_goal", "vs_hf_assisted", "speedup_shrinks_with_batch", "alpha_matches_beta",
                "lookup_grounded_goal", "lookup_control_cheap", "verify_free_when_memory_bound"):
        c = find(claims, f"speculative.{cid}")
        assert c.holds is None and c.note, cid
    assert "not in --quick" in find(claims, "speculative.speedup_shrinks_with_batch").note


def test_best_gamma_is_judged_only_on_a_sweep_wide_enough_to_miss():
    """--quick sweeps 2, 4, 6: best +- one step covers the whole sweep, so any prediction would pass."""
    res = _fixture()
    sweep = res.tables["gamma_sweep"]
    res.tables["gamma_sweep"] = sweep[sweep.gamma.isin(lab.Config.quick().gammas)]
    c = find(lab.judge(res), "speculative.best_gamma_predicted")
    assert c.holds is None and "any prediction lands within one step" in c.note
    res = _fixture()  # five gammas, the measured best at the end: two lie beyond its one step, so it can fail
    res.tables["gamma_sweep"] = res.tables["gamma_sweep"][res.tables["gamma_sweep"].gamma <= 5].reset_index(drop=True)
    _set(res, "gamma_sweep", "speedup", 2.0, lambda d: d.gamma == 5)
    assert find(lab.judge(res), "speculative.best_gamma_predicted").holds is True
    _set(res, "gamma_sweep", "predicted_speedup_verify", 2.0, lambda d: d.gamma == 2)
    assert find(lab.judge(res), "speculative.best_gamma_predicted").holds is False


def test_acceptance_bound_claims_are_not_judged_on_an_arch_pair():
    """On CUDA the timed parts run an arch: pair: its random weights' acceptance is no draft's, so the goals and
    "pays off" are not judged on it; the cost model's claims (the same run's alpha, c, v) still are."""
    res = _fixture()
    res.env["speed_models"] = dict(kind="arch", target="arch:llama-3-8b x32 layers", draft="arch:llama-3-8b x3 layers")
    claims = lab.judge(res)
    for cid in ("pays_off", "vs_plain_goal", "vs_hf_assisted", "lookup_grounded_goal", "lookup_control_cheap"):
        c = find(claims, f"speculative.{cid}")
        assert c.holds is None and "arch:llama-3-8b x32 layers, random weights" in c.note, cid
    for cid in ("within_leviathan", "within_verify_model", "best_gamma_predicted", "greedy_identity"):
        assert find(claims, f"speculative.{cid}").holds is True, cid
    assert "arch:llama-3-8b x32 layers / arch:llama-3-8b x3 layers (random weights)" in lab.views(res)[1].question
    assert lab.headline(res, claims).startswith("Timed on arch:llama-3-8b x32 layers")


def test_fixture_is_output_run_can_produce(quick_run):
    """The hand-made tables use the columns and row labels of a real run, so the verdicts they test are
    verdicts a run can reach."""
    d = quick_run("speculative").data
    fixture = _fixture()
    labels = ("method", "policy", "regime", "workload", "compared", "outcome", "sampling")
    for name, df in fixture.tables.items():
        if name not in d["tables"]:
            assert name in ("batch",) or name in d["skipped"], name  # --quick has no batch part
            continue
        real = d["tables"][name]
        assert set(df.columns) <= set(real["columns"]), (name, set(df.columns) - set(real["columns"]))
        for col in set(labels) & set(df.columns):
            seen = {r[real["columns"].index(col)] for r in real["rows"]}
            if "verify_dram" in d["skipped"]:  # the DRAM regime's row, where this machine's cache made it not fit
                seen.add("DRAM")
            assert set(df[col]) <= seen, (name, col, set(df[col]) - seen)


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
    assert "Lookup on quoted source: 1.20x; the model does not copy" in line
    assert "repeat 27% right" in line
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
    dram_measured = "verify_dram" not in d["skipped"]  # its weights fit in memory, or it says why not
    for regime in ("in cache", "DRAM")[: 1 + dram_measured]:  # the verify-cost curve of both regimes is in --quick
        ks = [r["k"] for r in curve if r["regime"] == regime]
        assert ks == list(q.verify_ks), regime
    dram = [r for r in curve if r["regime"] == "DRAM"]
    if dram_measured:  # what dram_model guarantees: weights >= 8x the last-level cache the run found
        assert dram[0]["weights_MB"] >= q.dram_llc_multiple * dram[0]["llc_MB"]
    else:
        assert not dram and "last-level cache" in d["skipped"]["verify_dram"]
    assert "verify_gpu" in d["skipped"] or d["env"]["device"]["device"].startswith("cuda")
    assert d["env"]["speed_models"]["kind"] == "loaded"  # a CPU times the loaded pair, and says so
    assert {r["models"] for r in rows("speed")} == {"tiny / tiny-draft"}
    assert [r["gamma"] for r in rows("gamma_sweep")] == sorted(set(q.gammas) | {q.gamma})
    assert all(r["speedup"] > 0.2 and r["predicted_speedup_verify"] > 0 for r in rows("gamma_sweep"))
    acc = rows("acceptance")[0]
    assert acc["beta"] == pytest.approx(acc["alpha"])  # greedy: beta counts the same agreements (a note, not a claim)
    assert acc["tau"] >= 1.5 and acc["alpha"] >= 0.4  # the trained pair agrees (model card: ~0.7)
    assert d["skipped"]["batch"] == "not in --quick (timed batches take minutes)"
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
                dict(verify_ks=(2, 4)), dict(workload_prompts=-1), dict(dram_max_mb=-1)):
        with pytest.raises(ValueError):
            lab.Config(**bad)
    q = lab.Config.quick()
    assert q.new_tokens * q.prompts >= 96 and q.repeats >= 3  # the demo's measurement: enough tokens and rounds
    assert sampling_params(lab.Config(temperature=0.7)).temperature == 0.7


def test_bench_gives_each_side_its_own_best_gamma():
    """The peer is not handed our best gamma; each side is compared at its own best."""
    from benchmarks import speculative as bench

    ratios = {"ours": {1: 1.0, 3: 1.25, 6: 1.1}, "HF": {1: 0.7, 3: 0.8, 6: 0.95}}
    assert bench.best_gammas(ratios) == {"ours": 3, "HF": 6}
    assert any(kw["schedule"] is None and kw["gamma"] is None for kw in bench.DYNAMIC.values())  # HF's own defaults
    assert any(kw["schedule"] == "heuristic" for kw in bench.DYNAMIC.values())
    assert bench.median_ratio({"a": [2.0, 2.0, 4.0], "b": [1.0, 1.0, 1.0]}, "a", "b") == 2.0


# ---------------------------------------------------------------- models sized from the device


def test_dram_model_is_sized_from_the_cache_the_run_finds(monkeypatch):
    """A 503 MB L3 needs 4 GB of FP32 weights: more layers than qwen2.5-0.5b publishes (24), not its 1,976 MB;
    where those do not fit in memory, dram_model says so instead of building a smaller model."""
    from llmlab.core import device as D
    from llmlab.core.flops import param_count
    from llmlab.core.models import arch_config
    from llmlab.inference import verify_cost as V

    want = 8 * 503 * 2**20
    conf = arch_config("qwen2.5-0.5b")
    layers = V.layers_for(conf, want, 4)
    assert layers > 24
    conf.num_hidden_layers = layers
    assert 4 * param_count(conf) >= want
    conf.num_hidden_layers = layers - 1
    assert 4 * param_count(conf) < want  # the fewest layers that reach it
    monkeypatch.setattr(D, "last_level_cache_bytes", lambda dev: 503 * 2**20)
    monkeypatch.setattr(D.Device, "free_memory_bytes", lambda self: 6 * 10**9)  # 3 GB usable: not enough
    with pytest.raises(V.TooLarge, match="8x the 527 MB last-level cache"):
        V.dram_model("qwen2.5-0.5b", 8, D.Device("cpu"))
    with pytest.raises(V.TooLarge, match="MB: over this run's 2,000 MB"):  # --quick's cap
        V.dram_model("qwen2.5-0.5b", 8, D.Device("cpu"), max_bytes=lab.Config.quick().dram_max_mb * 1e6)


def test_verify_curve_part_records_an_unfit_dram_regime_as_not_measured(monkeypatch):
    from llmlab.core.device import Device
    from llmlab.inference import verify_cost as V
    from tests.test_speculative import _toy

    def too_large(*a, **k):
        raise V.TooLarge("8x the 527 MB last-level cache: arch:qwen2.5-0.5b x59 layers needs 4,064 MB")

    monkeypatch.setattr(V, "dram_model", too_large)
    toy = _toy(1)
    pair = Pair(toy, toy, None, [], Device("cpu"), "toy / toy")
    res = LabResult.new("speculative", lab.VERSION, lab.Config.quick())
    part_verify_curve(res, pair, pair, lab.Config.quick(), dict(alpha=0.7, c=0.2))
    assert list(res.tables["regimes"].regime) == ["in cache"]
    assert "last-level cache" in res.skipped["verify_dram"]
    c = find(lab.judge(res), "speculative.verify_free_when_memory_bound")
    assert c.holds is None and "last-level cache" in c.note


def test_gpu_timing_pair_is_sized_from_the_device():
    """An H200 (140 GB free, 50 MiB L2) times a Llama-3-8B-shaped target (all 32 layers, FP32) and a draft
    scaled as the built-in pair (0.21 of the target's weights); a smaller card gets fewer layers; one that
    cannot hold 8x its L2 beside a draft is refused (the trained pair then runs, with a note)."""
    from llmlab.core.flops import param_count
    from llmlab.core.models import arch_config
    from llmlab.inference import verify_cost as V

    def size(layers: int) -> int:  # FP32 bytes of llama-3-8b's shapes at this many layers
        conf = arch_config("llama-3-8b")
        conf.num_hidden_layers = layers
        return 4 * param_count(conf)

    l2 = 50 * 2**20
    t, d = V.speed_layers("llama-3-8b", 140 * 10**9, l2, 0.21, 8, 4)
    assert (t, d) == (32, 3)
    assert size(t) >= 8 * l2 and size(d) >= 0.21 * size(t) > size(d - 1)
    t, _ = V.speed_layers("llama-3-8b", 20 * 10**9, l2, 0.21, 8, 4)  # as many layers as fit beside the draft
    assert t == 4 and 1.21 * size(t) <= 0.5 * 20 * 10**9 < 1.21 * size(t + 1)
    with pytest.raises(V.TooLarge, match="the 52 MB L2"):
        V.speed_layers("llama-3-8b", 5 * 10**9, l2, 0.21, 8, 4)


def test_cuda_runs_the_timed_parts_on_the_sized_pair(monkeypatch):
    """On CUDA (a stand-in device), timing_pair asks speed_pair for the gpu_arch pair with the built-in pair's
    draft share, and the run's env and notes name the models that ran; on the CPU the loaded pair runs."""
    from llmlab.inference import verify_cost as V
    from tests.test_speculative import _toy

    asked = {}

    def speed_pair(arch, device, share, multiple, **kw):
        asked.update(arch=arch, share=share, multiple=multiple)
        return _toy(1), _toy(2), dict(target=f"arch:{arch} x32 layers", draft=f"arch:{arch} x3 layers", target_MB=32e3,
                                     draft_MB=6.7e3, llc_MB=52.4, dtype="float32")

    monkeypatch.setattr(V, "speed_pair", speed_pair)
    cfg = lab.Config.quick()
    cuda = types.SimpleNamespace(is_cuda=True)
    pair = Pair(_toy(3), _toy(4), None, ["prompt"], cuda, "tiny / tiny-draft")
    res = LabResult.new("speculative", lab.VERSION, cfg)
    res.env["models"] = dict(target_params=5_770_496, draft_params=1_217_088)
    speed = timing_pair(res, cfg, pair)
    assert asked == dict(arch="llama-3-8b", share=pytest.approx(0.2109, abs=1e-4), multiple=cfg.dram_llc_multiple)
    assert speed is not pair and speed.prompts == pair.prompts and "arch:llama-3-8b x32 layers" in speed.label
    assert res.env["speed_models"]["kind"] == "arch" and any("arch:llama-3-8b x32" in n for n in res.notes)
    cpu = Pair(None, None, None, [], types.SimpleNamespace(is_cuda=False), "tiny / tiny-draft")
    assert timing_pair(res, cfg, cpu) is cpu and res.env["speed_models"]["kind"] == "loaded"
