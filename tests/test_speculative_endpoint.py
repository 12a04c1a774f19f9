"""`llmlab speculative --endpoint URL --baseline URL` against two real `llmlab serve` subprocesses over HTTP:
the interleaved pairs, the same-text check, the judge on tables that hold and fail, bad input (exit 2)."""

from __future__ import annotations

import os
import subprocess
import sys

import pandas as pd
import pytest
from conftest import ROOT, free_port, start_serve, stop_serve

from llmlab.core.results import LabResult, find
from llmlab.labs import speculative
from llmlab.labs.speculative import endpoint as E


@pytest.fixture(scope="module")
def servers():
    a, pa = start_serve("--max-num-seqs", "2", "--kv-blocks", "64")
    try:
        b, pb = start_serve("--max-num-seqs", "2", "--kv-blocks", "64")
    except BaseException:
        stop_serve(pa)
        raise
    yield a, b
    stop_serve(pa)
    stop_serve(pb)


def spec(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "80", "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "llmlab", "speculative", *args], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=ROOT)


@pytest.fixture(scope="module")
def run(servers, tmp_path_factory):
    out = tmp_path_factory.mktemp("spec-endpoint")
    a, b = servers
    p = spec("--endpoint", a, "--baseline", b, "--quick", "--new-tokens", "12", "--prompts", "2", "--repeats", "2",
             "--out", str(out))
    return p, out


def test_two_servers_end_to_end(run):
    p, out = run
    assert p.returncode == 0, p.stderr[-3000:]
    res = LabResult.from_json(next((out / "speculative").glob("*.json")).read_text())
    req = res.tables["endpoint_requests"]
    # quote, edit (1 each in --quick) and 2 open prompts, 2 rounds, both sides
    assert len(req) == 2 * 4 * 2 and req["error"].isna().all()
    assert (req.groupby(["round", "prompt"])["side"].nunique() == 2).all()
    assert (req["output_tokens"] <= 12).all() and (req["tokens_source"] == "usage").all()
    # the order flips within each round, so neither side always goes first
    firsts = req.groupby(["round", "prompt"])["side"].first()
    assert set(firsts) == set(E.SIDES)
    # the same model on both servers: greedy texts are identical, and the claim says so
    assert find(res.claims, "speculative.endpoint_same_output").holds is True
    assert find(res.claims, "speculative.endpoint_faster").holds in (True, False)
    assert set(res.tables["endpoint_speed"]["workload"]) == {"quote", "edit", "open", "all"}
    lines = p.stdout.splitlines()
    assert len(lines) <= 120 and max(map(len, lines)) <= 80
    assert "Speculation on the server" in p.stdout and "What this run found" in p.stdout


def _requests(ratios: list[float], differ: bool = False) -> pd.DataFrame:
    rows = []
    for i, r in enumerate(ratios):
        for side, tps in (("speculative", 100.0 * r), ("baseline", 100.0)):
            text = "abc" if side == "baseline" or not (differ and i == 0) else "abd"
            rows.append(dict(side=side, round=0, prompt=i, workload="quote", output_tokens=10, tokens_source="usage",
                             chunks=10 if side == "baseline" else 4, ttft_ms=5.0, e2el_ms=5.0 + 9e3 / tps,
                             decode_tok_per_s=tps, text=text, error=None))
    return pd.DataFrame(rows)


def _judged(req: pd.DataFrame) -> dict:
    res = LabResult(lab="speculative", version=2, config={"endpoint": "http://a", "baseline": "http://b"})
    res.add_table("endpoint_requests", req)
    E.summarise(res)
    return {c.id: c for c in speculative.judge(res)}


def test_judge_holds_and_fails():
    c = _judged(_requests([1.6, 1.5, 1.4, 1.7, 1.5, 1.3]))
    assert c["speculative.endpoint_faster"].holds is True and c["speculative.endpoint_same_output"].holds is True
    c = _judged(_requests([1.02, 0.97, 1.01, 0.99, 1.0, 0.98], differ=True))
    assert c["speculative.endpoint_faster"].holds is False
    same = c["speculative.endpoint_same_output"]
    assert same.holds is False and "5/6" in same.measured and "character 2" in same.measured
    assert _judged(_requests([1.5, 1.5]))["speculative.endpoint_faster"].holds is None  # too few pairs


def test_sign_test_against_the_binomial():
    assert E.sign_test_p(5, 5) == pytest.approx(1 / 32)
    assert E.sign_test_p(0, 6) == 1.0
    assert E.sign_test_p(8, 10) == pytest.approx((45 + 10 + 1) / 1024)


@pytest.mark.parametrize("args, says", [
    (["--endpoint", "http://127.0.0.1:1"], "--endpoint and --baseline go together"),
    (["--endpoint", "http://a:1", "--baseline", "http://a:1"], "same URL"),
    (["--endpoint", "ftp://a", "--baseline", "http://b:1"], "http(s) URL"),
])
def test_bad_input_exits_2_with_one_line(args, says, cli):
    p = cli("speculative", *args, "--no-save")
    assert p.returncode == 2 and says in p.stderr and "Traceback" not in p.stderr


def test_an_unreachable_server_exits_2(cli):
    dead = f"http://127.0.0.1:{free_port()}"
    p = cli("speculative", "--endpoint", dead, "--baseline", f"http://127.0.0.1:{free_port()}", "--no-save")
    assert p.returncode == 2 and "not reachable" in p.stderr
