"""The speculative lab against running servers: `llmlab speculative --endpoint URL --baseline URL`.

--endpoint serves the model with speculative decoding on (vLLM `--speculative-config`, llama.cpp's
llama-server `-md DRAFT` or its n-gram lookup, SGLang's EAGLE ...), --baseline the same model with it
off. Both get the same prompts: the input-grounded quote and edit prompts (a stdlib function's source,
then its start again or renamed: where n-gram and draft speculation pay) and open-ended ones (the
control). Each request is greedy (temperature 0), --new-tokens long, sent alone; within a pair the two
servers run one right after the other, and the order flips every round, so a machine's drift hits both.

Per request, from the client's stamps (llmlab/loadgen/client.py): decode tokens/s = (output tokens - 1)
/ (E2EL - TTFT), the inverse of TPOT. A speculative server streams the tokens of an accepted run in one
chunk, so the gap between chunks is not a per-token figure: tokens per chunk is reported beside it
(above 1 on the speculative side is speculation seen from outside). Output tokens come from `usage`.

Claims: the texts are identical at temperature 0 (speculation changes the speed, never the output), and
speculation makes decoding faster: the median of the per-pair ratios above 1 with a one-sided sign test
p < 0.05. Every request is a row of `endpoint_requests`, failed ones with their error; a run where
every request failed exits 3. httpx is imported inside the coroutine: the CLI imports this package.
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import replace

import pandas as pd

from llmlab.core.render import track
from llmlab.core.results import Claim, Col, LabResult, View, empty_table
from llmlab.labs.speculative.config import Config
from llmlab.loadgen import probe
from llmlab.loadgen.client import RequestRecord, stream_completion

SIDES = ("speculative", "baseline")
SIGNIFICANCE = 0.05  # the sign test's level
MIN_PAIRS = 5  # below this even 5 wins of 5 (p = 0.031) cannot reach the level: not judged


def discover(cfg: Config) -> Config:
    """Ask both servers what they are (UsageError, exit 2, when one cannot serve the run)."""
    spec = probe.discover(cfg.endpoint, cfg.model, cfg.api_key_env)
    base = probe.discover(cfg.baseline, spec.model, cfg.api_key_env)
    return replace(cfg, endpoint_found=(spec, base))


def prompt_set(cfg: Config) -> list[tuple[str, str]]:
    """(workload, text): quote and edit (--workload-prompts each), then --prompts open-ended ones."""
    from llmlab.inference import workloads
    from llmlab.labs.speculative.pair import PROMPTS

    out = [(k, t) for k in workloads.KINDS if cfg.workload_prompts for t in workloads.prompts(k, cfg.workload_prompts)]
    return out + [("open", PROMPTS[i % len(PROMPTS)]) for i in range(cfg.prompts)]


def measure(cfg: Config, res: LabResult, progress) -> None:
    spec, base = cfg.endpoint_found or discover(cfg).endpoint_found
    res.env["server"] = spec.card()
    res.env["baseline_server"] = base.card()
    for side, srv in zip(SIDES, (spec, base), strict=True):
        res.notes += [f"{side}: {n}" for n in srv.notes]
        if not srv.usage:
            res.note(f"{side} sends no usage: its output tokens are chunks, and a speculative chunk holds several "
                     "tokens (its tokens/s is then per chunk)")
    rows: list[dict] = []
    try:
        asyncio.run(_measure(cfg, (spec, base), prompt_set(cfg), rows, progress))
    finally:  # Ctrl-C included: the pairs measured so far
        res.add_table("endpoint_requests", rows)
        summarise(res)
    res.note(f"greedy, {cfg.new_tokens} tokens per request, one request at a time, {cfg.repeats} rounds, the "
             "servers alternated within each pair and the order flipped each round")


async def _measure(cfg: Config, servers, prompts, rows: list[dict], progress) -> None:
    import httpx

    jobs = [(r, i) for r in range(cfg.repeats) for i in range(len(prompts))]
    async with httpx.AsyncClient(timeout=httpx.Timeout(cfg.request_timeout)) as client:
        for r, i in track(progress, jobs, "speculative vs baseline: interleaved pairs"):
            workload, text = prompts[i]
            order = (0, 1) if (r + i) % 2 == 0 else (1, 0)
            for k in order:
                srv = servers[k]
                payload = dict(model=srv.model, prompt=text, max_tokens=cfg.new_tokens, temperature=0.0,
                               seed=cfg.seed)
                rec = await stream_completion(client, srv.completions, payload, len(rows), srv.headers,
                                              cfg.request_timeout)
                rows.append(request_row(rec, SIDES[k], r, i, workload))


def request_row(rec: RequestRecord, side: str, rnd: int, prompt: int, workload: str) -> dict:
    n = rec.output_tokens or 0
    decode_s = rec.e2el_s - rec.ttft_s
    return dict(side=side, round=rnd, prompt=prompt, workload=workload, output_tokens=n,
                tokens_source=rec.output_tokens_source, chunks=len(rec.chunk_ns),
                ttft_ms=1e3 * rec.ttft_s, e2el_ms=1e3 * rec.e2el_s,
                decode_tok_per_s=(n - 1) / decode_s if rec.ok and n > 1 and decode_s > 0 else math.nan,
                text=rec.text, error=rec.error)


def pairs(req: pd.DataFrame) -> pd.DataFrame:
    """One row per (round, prompt) where both sides completed: both sides' figures and the ratio."""
    ok = req[req["error"].isna()]
    cols = ["round", "prompt", "workload"]
    keep = [*cols, "decode_tok_per_s", "ttft_ms", "output_tokens", "chunks", "text"]
    spec, base = (ok[ok["side"] == s][keep] for s in SIDES)
    both = spec.merge(base, on=cols, how="inner", suffixes=("_spec", "_base"))
    both["ratio"] = both["decode_tok_per_s_spec"] / both["decode_tok_per_s_base"]
    return both


def sign_test_p(wins: int, n: int) -> float:
    """One-sided sign test: P(X >= wins) for X ~ Binomial(n, 1/2)."""
    return sum(math.comb(n, k) for k in range(wins, n + 1)) / 2**n if n else 1.0


def summarise(res: LabResult) -> None:
    req = res.tables.get("endpoint_requests")
    if empty_table(req):
        return
    both = pairs(req)
    rows = []
    for workload, g in [*both.groupby("workload", sort=False), ("all", both)]:
        if g.empty:
            continue
        rows.append(dict(
            workload=workload, pairs=len(g), spec_tok_per_s=g["decode_tok_per_s_spec"].median(),
            base_tok_per_s=g["decode_tok_per_s_base"].median(), ratio=g["ratio"].median(),
            spec_tpot_ms=1e3 / g["decode_tok_per_s_spec"].median(),
            base_tpot_ms=1e3 / g["decode_tok_per_s_base"].median(),
            spec_ttft_ms=g["ttft_ms_spec"].median(), base_ttft_ms=g["ttft_ms_base"].median(),
            spec_tokens_per_chunk=(g["output_tokens_spec"] / g["chunks_spec"]).median(),
            base_tokens_per_chunk=(g["output_tokens_base"] / g["chunks_base"]).median(),
            faster=int((g["ratio"] > 1).sum())))
    res.add_table("endpoint_speed", rows)
    res.add_table("endpoint_outputs", [
        dict(workload=g["workload"].iloc[0], prompt=p, pairs=len(g),
             identical=int((g["text_spec"] == g["text_base"]).sum()),
             first_difference=_first_difference(g), tokens_spec=int(g["output_tokens_spec"].iloc[0]),
             tokens_base=int(g["output_tokens_base"].iloc[0]))
        for p, g in both.groupby("prompt", sort=True)])


def _first_difference(g: pd.DataFrame) -> int:
    """The first character where a pair's texts differ (-1: every pair identical)."""
    for a, b in zip(g["text_spec"], g["text_base"], strict=True):
        if a != b:
            return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
    return -1


def exit_code(result: LabResult) -> tuple[int, str] | None:
    req = result.tables.get("endpoint_requests")
    if req is not None and len(req) and req["error"].notna().all():
        return 3, f"every request failed ({req['error'].iloc[-1]})"
    return None


# ---------------------------------------------------------------- judge


def judge(result: LabResult) -> list[Claim]:
    t = result.tables
    return [_same_output(t.get("endpoint_outputs")), _faster(t.get("endpoint_requests"))]


def _same_output(out) -> Claim:
    cid, text = "speculative.endpoint_same_output", "Speculation on the server keeps the greedy text identical"
    if empty_table(out):
        return Claim(cid, text, "every pair identical", "no pair completed", None, "no pair of requests completed")
    same, n = int(out["identical"].sum()), int(out["pairs"].sum())
    bad = out[out["identical"] < out["pairs"]]
    where = (f"; prompt {int(bad['prompt'].iloc[0])} ({bad['workload'].iloc[0]}) differs from character "
             f"{int(bad['first_difference'].iloc[0])}") if len(bad) else ""
    return Claim(cid, text, "every pair identical (temperature 0)", f"{same}/{n} pairs identical{where}", same == n)


def _faster(req) -> Claim:
    cid, text = "speculative.endpoint_faster", "Speculation makes the server decode faster, one request at a time"
    expected = f"median per-pair ratio > 1.0x, sign test p < {SIGNIFICANCE}"
    both = pairs(req) if not empty_table(req) else None
    if both is None or len(both) < MIN_PAIRS:
        n = 0 if both is None else len(both)
        return Claim(cid, text, expected, f"{n} pairs", None, f"fewer than {MIN_PAIRS} pairs completed")
    r = both["ratio"].dropna()
    wins, n = int((r > 1).sum()), len(r)
    p = sign_test_p(wins, n)
    spec, base = both["decode_tok_per_s_spec"].median(), both["decode_tok_per_s_base"].median()
    return Claim(cid, text, expected, f"{r.median():.2f}x ({spec:,.0f} vs {base:,.0f} tok/s); faster in {wins}/{n} "
                 f"pairs, p = {p:.2g}", bool(r.median() > 1 and p < SIGNIFICANCE))


# ---------------------------------------------------------------- report


def views(result: LabResult) -> list[View]:
    spec = result.env.get("server", {}).get("endpoint", "--endpoint")
    base = result.env.get("baseline_server", {}).get("endpoint", "--baseline")
    return [
        View("1. Speculation on the server", f"{spec} against {base}: decode speed per workload (medians of "
             "interleaved pairs)", "endpoint_speed",
             (Col("workload", "workload", "text"), Col("pairs", "pairs", "int"),
              Col("spec_tok_per_s", "spec tok/s", ",.0f"), Col("base_tok_per_s", "base tok/s", ",.0f"),
              Col("ratio", "ratio", "x"), Col("spec_tpot_ms", "spec ms/tok", ".2f"),
              Col("base_tpot_ms", "base ms/tok", ".2f"), Col("spec_tokens_per_chunk", "spec tok/chunk", ".2f"),
              Col("spec_ttft_ms", "spec TTFT", ",.1f"), Col("base_ttft_ms", "base TTFT", ",.1f"))),
        View("2. The same text?", "Greedy: the speculative server's text against the baseline's, per prompt",
             "endpoint_outputs",
             (Col("prompt", "prompt", "int"), Col("workload", "workload", "text"), Col("pairs", "pairs", "int"),
              Col("identical", "identical", "int"), Col("first_difference", "first diff (char)", "int"),
              Col("tokens_spec", "spec tokens", "int"), Col("tokens_base", "base tokens", "int"))),
    ]


def headline(result: LabResult, claims: list[Claim]) -> str:
    sp = result.tables.get("endpoint_speed")
    if empty_table(sp):
        return "No pair of requests completed on both servers."
    a = sp[sp["workload"] == "all"].iloc[0]
    per = ", ".join(f"{r.workload} {r.ratio:.2f}x" for r in sp.itertuples() if r.workload != "all")
    same = next((c for c in claims if c.id == "speculative.endpoint_same_output"), None)
    text = "identical greedy text" if same and same.holds else "DIFFERENT greedy text (see part 2)"
    return (f"Speculation on the server decodes at {a['ratio']:.2f}x the baseline's tokens/s "
            f"({a['spec_tok_per_s']:,.0f} vs {a['base_tok_per_s']:,.0f}; {per}) with {text}.")
