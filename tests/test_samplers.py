"""The samplers lab: config checks, its metrics against hand counts, and the CLI end to end."""

from __future__ import annotations

import json
import subprocess
import sys

import pandas as pd
import pytest
import torch

from llmlab.labs import samplers as L


@pytest.mark.parametrize(
    "kwargs,words",
    [
        ({"top_p": 1.5}, "top-p"),
        ({"top_k": 0}, "top-k"),
        ({"top_k": -2}, "top-k"),
        ({"temperature": 0.0}, "greedy"),
        ({"temperature": -1.0}, "temperature"),
        ({"min_p": -0.1}, "min-p"),
        ({"temperatures": (0.5, 0.0)}, "greedy"),
        ({"prompt": "  "}, "prompt"),
    ],
)
def test_config_rejects_bad_settings(kwargs, words):
    with pytest.raises(ValueError, match=words):
        L.Config(**kwargs)


def test_quick_config_is_valid_and_smaller():
    q, full = L.Config.quick(), L.Config()
    assert q.samples < full.samples and len(q.batch_sizes) < len(full.batch_sizes)


def test_text_metrics_by_hand():
    tokens = torch.tensor([[1, 2, 3, 4, 1, 2, 3, 4], [5, 5, 5, 5, 0, 9, 9, 9]])  # row 2 ends at EOS (0)
    zeros = torch.zeros_like(tokens, dtype=torch.float32)
    m = L.text_metrics({"tokens": tokens, "logp": zeros - 1.0, "ent_model": zeros + 2.0, "ent_sampled": zeros}, eos=0)
    assert m["tokens"] == 12  # 8 + 4 before EOS
    assert m["distinct_1"] == pytest.approx(5 / 12)  # {1,2,3,4,5}
    assert m["distinct_2"] == pytest.approx(5 / 10)  # {12,23,34,41} + {55}
    # rep-4: row 1 has 5 4-grams, 4 distinct -> 0.2; row 2 has 1 -> 0
    assert m["rep_4"] == pytest.approx(0.1)
    assert m["mean_logprob"] == -1.0 and m["entropy_model_nats"] == 2.0


def test_mass_bins_cover_the_kept_set_in_mass_order():
    target = torch.tensor([0.4, 0.0, 0.3, 0.2, 0.1, 0.0])
    bins = L.mass_bins(target, n_bins=4)
    assert bins.tolist()[1] == -1 and bins.tolist()[5] == -1
    assert bins[0] <= bins[2] <= bins[3] <= bins[4]  # most likely first


def test_spearman_matches_pandas():
    a = pd.Series([1.0, 2.0, 3.0, 4.0, 5.0])
    b = pd.Series([5.0, 6.0, 7.0, 8.0, 7.0])
    assert L.spearman(a, b) == pytest.approx(a.corr(b, method="spearman"))
    assert L.spearman(a, -a) == pytest.approx(-1.0)


def test_entropy_of_uniform_and_one_hot():
    assert float(L.entropy(torch.full((8,), 1 / 8))) == pytest.approx(torch.log(torch.tensor(8.0)).item())
    assert float(L.entropy(torch.tensor([1.0, 0.0, 0.0]))) == pytest.approx(0.0)


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "llmlab", "samplers", *args], capture_output=True, text=True, timeout=240)


@pytest.mark.parametrize("args", [("--top-p", "1.5"), ("--top-k", "0"), ("--top-k", "-1"), ("--temperature", "0"), ("--min-p", "-0.1")])
def test_cli_bad_input_exits_2_with_one_line(args, monkeypatch, capsys):
    from llmlab import cli

    monkeypatch.setattr(sys, "argv", ["llmlab", "samplers", "--device", "cpu", "--quick", "--no-save", *args])
    with pytest.raises(SystemExit) as exc:
        cli.main()
    assert exc.value.code == 2
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in err
    if args[0] == "--temperature":
        assert "greedy" in lines[0]


def test_cli_bad_input_in_a_real_process():
    r = _cli("--device", "cpu", "--quick", "--no-save", "--top-p", "1.5")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert len([ln for ln in r.stderr.splitlines() if ln.strip()]) == 1


@pytest.mark.slow
def test_cli_quick_json_end_to_end():
    r = _cli("--device", "cpu", "--quick", "--json", "--no-save")
    assert r.returncode == 0, r.stderr[-2000:]
    data = json.loads(r.stdout)
    from llmlab.core.results import LabResult

    tables = LabResult.from_dict(data).tables
    for name in ("fates", "fates_tokens", "sure_vs_unsure", "quality", "temperature_sweep", "distribution", "latency", "decode_share"):
        assert not tables[name].empty, name
    fates = tables["fates"].set_index("strategy")
    assert fates.loc["greedy", "kept_tokens"] == 1 and fates.loc["temperature", "mass_kept"] == pytest.approx(1.0)
    assert fates.loc["top_k", "kept_tokens"] >= 40 and fates.loc["top_p", "mass_kept"] >= 0.9 - 1e-6
    lat = tables["latency"]
    assert (lat["latency_median_ms"] > 0).all() and set(lat["impl"]) >= {"argmax", "hf+multinomial", "ours+race", "ours sorting-free"}
    assert tables["distribution"]["samples_outside_kept_set"].iloc[0] == 0
    texts = {c["text"] for c in data["claims"]}
    assert "top-p costs about 9x greedy" in texts
    for c in data["claims"]:
        assert c["measured"] and (c["holds"] is not None or c["note"].startswith("not measured"))
