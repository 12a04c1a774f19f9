"""The speculative lab end to end: `--quick --json` gives measured tables and claims; bad input exits 2."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

from llmlab.labs import speculative as lab


def _cli(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "llmlab", "speculative", *args], capture_output=True, text=True,
                          timeout=timeout, env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"})


def test_quick_json_end_to_end():
    r = _cli("--device", "cpu", "--quick", "--json", "--no-save")
    assert r.returncode == 0, r.stderr[-2000:]
    d = json.loads(r.stdout)
    assert d["lab"] == "speculative" and not d["interrupted"]
    tables = d["tables"]
    for name in ("tree_check", "distribution", "costs", "speed", "acceptance", "per_position", "histogram",
                 "gamma_sweep", "temperature_sweep", "policies", "tree", "batch", "identity"):
        assert name in tables, f"missing table {name}"

    def rows(name):  # the JSON form of a table: columns + rows of values
        t = tables[name]
        return [dict(zip(t["columns"], r, strict=True)) for r in t["rows"]]

    speed = {r["method"]: r for r in rows("speed")}
    assert set(speed) == {"plain (ours)", "HF generate", "speculative (ours)", "HF assisted"}
    assert all(r["tokens_per_s"] > 0 and math.isfinite(r["speedup"]) for r in speed.values())
    acc = rows("acceptance")[0]
    assert 0 <= acc["alpha"] <= 1 and acc["tau"] >= 1 and 0 < acc["cost_ratio_c"]
    assert acc["beta"] == pytest.approx(acc["alpha"])  # greedy: beta counts the same agreements
    assert all(r["identical"] for r in rows("identity"))
    assert all(r["match"] for r in rows("tree_check"))
    assert all(0 <= r["p_value"] <= 1 for r in rows("distribution"))
    assert {r["gamma"] for r in rows("gamma_sweep")} == set(lab.Config.quick().gammas)
    texts = [c["text"] for c in d["claims"]]
    assert any("identical to the target" in t for t in texts) and any("Leviathan" in t for t in texts)
    assert all(c["measured"] for c in d["claims"])
    assert all(c["holds"] is not None or c["note"] for c in d["claims"])


def _assert_usage_error(r: subprocess.CompletedProcess, *needles: str) -> None:
    assert r.returncode == 2, (r.returncode, r.stderr)
    err = r.stderr.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    for n in needles:
        assert n in err, err


@pytest.mark.parametrize("args, needle", [
    (("--gamma", "0"), "--gamma"),
    (("--temperature", "-0.5"), "--temperature"),
])
def test_bad_input_exits_2(args, needle):
    _assert_usage_error(_cli("--device", "cpu", "--no-save", *args), needle)


def test_draft_with_another_vocabulary_exits_2(tmp_path):
    cfg = json.loads((lab_weights() / "config.json").read_text())
    cfg["vocab_size"] = 100
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    _assert_usage_error(_cli("--device", "cpu", "--no-save", "--draft", str(tmp_path)), "100", "4096")


def lab_weights():
    from llmlab.core.models import builtin_path

    return builtin_path("tiny-draft")


def test_config_validation():
    for bad in (dict(gamma=0), dict(temperature=-1.0), dict(gammas=(0, 2)), dict(tree=(2, 0)), dict(top_p=0.0),
                dict(prompts=0), dict(prompts=33), dict(confidence=1.5), dict(new_tokens=1)):
        with pytest.raises(ValueError):
            lab.Config(**bad)
    q = lab.Config.quick()
    assert q.new_tokens < lab.Config().new_tokens and len(q.gammas) < len(lab.Config().gammas)
    assert lab.Config(temperature=0.7).params().temperature == 0.7
