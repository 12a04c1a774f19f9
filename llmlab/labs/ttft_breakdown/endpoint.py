"""The ttft lab against a running server: `llmlab ttft --endpoint URL` (vLLM, SGLang, TGI, llama.cpp,
`llmlab serve`: anything that speaks OpenAI's /v1/completions with streaming).

The in-process lab stamps every phase itself; here the client stamps every chunk
(llmlab/loadgen/client.py, vLLM bench serve's definitions) and the server's own phases are joined to
each request where it reports them (llmlab/loadgen/probe.py: `timings`, or /metrics histogram deltas
around a request run alone). `discover` asks the server what it is before the run (the lab's check);
the run measures the server it found. Parts, in the order they run:

1. one request alone, phase by phase: client + network, server queue, prefill, first decode;
2. prompt length: 16 .. --prompt-len tokens (clamped to the server's context), TTFT = a + b T fitted
   on the fastest sample of each length; 1 / b is the server's prefill rate as a client sees it, set
   beside the slope of the server's own prefill times;
3. prefix probe: one long prefix sent twice (fresh each pair); the drop in TTFT is the prefix cache,
   cross-checked with `cache_n` or the prefix-cache counters;
4. load: --concurrency / --request-rate / --burstiness, warm-up excluded, TTFT/TPOT/ITL/E2EL
   (p50/p90/p99) and throughput, with what GenAI-Perf, llmperf and guidellm would call the same run.

Every request is a row of `endpoint_requests`, failed ones with their error; the tables are written
as they fill, so Ctrl-C keeps what was measured. A run where every request failed exits 3.
httpx is imported inside the coroutine that uses it: `llmlab --help` imports this package (for its Config).
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import asdict, replace
from types import SimpleNamespace

import numpy as np
import pandas as pd

from llmlab.core.models import load_tokenizer
from llmlab.core.render import track
from llmlab.core.results import Chart, Claim, Col, LabResult, View, empty_table
from llmlab.labs.ttft_breakdown.config import Config
from llmlab.labs.ttft_breakdown.fits import linear_fit
from llmlab.loadgen import metrics, probe
from llmlab.loadgen.client import RequestRecord, calculate_metrics, run_load

HELPER_TIMEOUT_S = 30.0  # /tokenize and /metrics calls (not the requests measured: --request-timeout)
ALONE_TOKENS = 128  # the "one request alone" prompt, and the load's: so alone and under load compare
PREFIX_DROP = 0.2  # the second request of a probe must be >= 20% faster ...
PREFIX_SHARE = 0.5  # ... and the server must report >= half the prefix as cached, where it reports it
FIT_REL = 0.2  # TTFT = a + bT within 20% at every prompt length: beyond, attention's T^2 (or a cache) bends the line
SLOPE_TOL = 0.25  # the client's TTFT slope within 25% of the server's own prefill slope


class Rows:
    """The tables of an endpoint run, written into the result after every request (Ctrl-C keeps them)."""

    def __init__(self, res: LabResult):
        self.res = res
        self.requests: list[dict] = []
        self.probe: list[dict] = []
        self.load: list[RequestRecord] = []  # the load's records as they complete (client.run_load's sink)
        self.load_added = False

    def add(self, scenario: str, rec: RequestRecord, delta: dict | None, target: int) -> dict:
        row = {"scenario": scenario, "target_tokens": target, "prompt_tokens": rec.prompt_tokens or target,
               "output_tokens": rec.output_tokens, "output_tokens_from": rec.output_tokens_source,
               **probe.waterfall(rec, delta), "tpot_ms": 1e3 * rec.tpot_s, "e2el_ms": 1e3 * rec.e2el_s,
               "error": rec.error}
        self.requests.append(row)
        self.flush()
        return row

    def add_load(self, target: int) -> None:
        if not self.load_added:
            self.load_added = True
            for rec in sorted(self.load, key=lambda r: r.index):
                self.add("load", rec, None, target)

    def flush(self) -> None:
        if self.requests:
            self.res.add_table("endpoint_requests", self.requests)
        if self.probe:
            self.res.add_table("prefix_probe", self.probe)


def discover(cfg: Config) -> Config:
    """Ask --endpoint what it is (UsageError, exit 2, when it cannot serve the run): the Config with the
    answer in `endpoint_found`, which `measure` then uses instead of asking again."""
    srv = probe.discover(cfg.endpoint, cfg.model, cfg.api_key_env)  # its own timeouts, not --request-timeout's
    return replace(cfg, endpoint_found=srv)


def measure(cfg: Config, res: LabResult, progress) -> None:
    """Every endpoint part into `res`, against the server check() found (asked here when it was not)."""
    srv = cfg.endpoint_found or probe.discover(cfg.endpoint, cfg.model, cfg.api_key_env)
    res.env["server"] = srv.card()
    for n in srv.notes:
        res.note(n)
    if not srv.tokenize:
        res.note("the server offers no /tokenize: prompt lengths are calibrated from usage.prompt_tokens "
                 "(the table shows the counts it reported)")
    count = _token_counter(cfg, srv, res)
    rows = Rows(res)
    try:
        asyncio.run(_measure(cfg, srv, count, rows, res, progress))
    finally:  # Ctrl-C included: the load's finished requests, then the summaries of whatever was measured
        rows.add_load(min(ALONE_TOKENS, cfg.prompt_len))
        rows.flush()
        _summaries(rows, res, cfg)


def _token_counter(cfg, srv: probe.Server, res: LabResult):
    if srv.usage:
        return None
    if cfg.tokenizer:
        tok = load_tokenizer(cfg.tokenizer)
        res.note(f"the server sends no usage: output tokens counted with --tokenizer {cfg.tokenizer}")
        return lambda text: len(tok(text, add_special_tokens=False)["input_ids"])
    res.note("the server sends no usage and no --tokenizer was named: output tokens are chunks, and a chunk is not "
             "always a token (TPOT is then per chunk)")
    return None


def lengths(cfg, srv: probe.Server, res: LabResult) -> list[int]:
    top = cfg.prompt_len
    if srv.max_model_len:
        room = srv.max_model_len - cfg.new_tokens - 8  # the salt's rounding and the server's own special tokens
        if top > room:
            res.note(f"--prompt-len {top} is beyond the server's context ({srv.max_model_len}): clamped to {room}")
            top = room
    lo = min(16, top)
    pts = np.geomspace(lo, top, cfg.sweep_points) if cfg.sweep_points > 1 else np.array([top])
    return sorted({int(round(p)) for p in pts} | {top})


async def _measure(cfg, srv: probe.Server, count, rows: Rows, res: LabResult, progress) -> None:
    import httpx

    sweep = lengths(cfg, srv, res)
    top = sweep[-1]
    text = probe.corpus_text(max(8 * (top + 64), 200_000))  # ~50k tokens: distinct offsets
    prompts = probe.Prompts(srv, text, probe.run_tag(cfg.seed))
    alone_len = min(ALONE_TOKENS, top)
    # the completions' timeout (stream_completion's own clock); /tokenize and /metrics get HELPER_TIMEOUT_S
    t_out = cfg.request_timeout
    async with httpx.AsyncClient(timeout=httpx.Timeout(max(t_out, HELPER_TIMEOUT_S)), headers=srv.headers) as c:
        async def one(scenario, n_tokens, max_tokens, warm=False, prompt=None):
            prompt = prompt or await prompts.make(c, n_tokens)
            rec, delta = await probe.alone(c, srv, prompt, max_tokens, len(rows.requests), t_out, count)
            prompts.calibrate(prompt, rec)
            return None if warm else rows.add(scenario, rec, delta, n_tokens)

        for _ in track(progress, range(cfg.warmup), "warm-up (excluded)"):
            await one("warm-up", alone_len, 2, warm=True)
        if not prompts.exact:  # text prompts: one more calibration at the longest length
            await one("calibration", top, 1, warm=True)
        for _ in track(progress, range(cfg.chat_repeats), "one request alone"):
            await one("alone", alone_len, cfg.new_tokens)
        for n in track(progress, sweep, "prompt-length sweep"):
            for _ in range(cfg.sweep_repeats):
                await one(f"prompt {n}", n, 2)
        for k in track(progress, range(cfg.prefix_probes), "prefix probe"):
            salt = prompts.salt()
            pair = []
            for i in range(2):
                prompt = await prompts.make(c, top, salt, tail=f"\nQuestion {i + 1}:")
                pair.append(await one(f"prefix {i + 1}", top, 2, prompt=prompt))
            rows.probe.append(_probe_row(k, *pair))
            rows.flush()
    if cfg.load_requests:
        payloads = []
        async with httpx.AsyncClient(timeout=httpx.Timeout(HELPER_TIMEOUT_S), headers=srv.headers) as c:
            for _ in range(cfg.load_requests):
                p = await prompts.make(c, alone_len)
                payloads.append({"model": srv.model, "prompt": p["prompt"], "max_tokens": cfg.new_tokens,
                                 "temperature": 0.0, "ignore_eos": True})
        what = f"load: {cfg.load_requests} requests, concurrency {cfg.concurrency}"
        task = None if progress is None else progress.add_task(what, total=None)
        run = await run_load(srv.completions, payloads, concurrency=cfg.concurrency, request_rate=cfg.request_rate,
                             burstiness=cfg.burstiness, timeout_s=t_out, api_key_env=cfg.api_key_env,
                             count_tokens=count, seed=cfg.seed, sink=rows.load)
        if task is not None:
            progress.remove_task(task)
        res.env["load_duration_s"] = run.duration_s
        rows.add_load(alone_len)


def _probe_row(k: int, first: dict, second: dict) -> dict:
    ok = first["error"] is None and second["error"] is None
    return {"pair": k + 1, "prompt_tokens": second["prompt_tokens"], "first_ttft_ms": first["ttft_ms"],
            "second_ttft_ms": second["ttft_ms"], "drop": 1 - second["ttft_ms"] / first["ttft_ms"] if ok else math.nan,
            "first_cached": first["cache_n"], "second_cached": second["cache_n"], "phases_from": second["phases_from"],
            "error": first["error"] or second["error"]}


def _summaries(rows: Rows, res: LabResult, cfg) -> None:
    """The per-scenario waterfall, the sweep with its fit, the load's metrics (from the request rows)."""
    req = pd.DataFrame(rows.requests)
    if req.empty:
        return
    good = req[req["error"].isna()]
    res.add_table("endpoint_waterfall", waterfall_rows(good))
    sweep = good[good["scenario"].str.startswith("prompt ")]
    if len(sweep):
        srows, fit = sweep_rows(sweep)
        res.add_table("endpoint_sweep", srows)
        res.add_table("endpoint_fit", [fit])
    if rows.load and "load_duration_s" in res.env:
        m = calculate_metrics(rows.load, res.env["load_duration_s"])
        res.add_table("endpoint_load", [{"concurrency": cfg.concurrency, "request_rate": cfg.request_rate,
                                         "burstiness": cfg.burstiness, **asdict(m)}])
        res.add_table("endpoint_latency", [{"metric": k.upper(),
                                            **{s: getattr(m, f"{s}_{k}_ms") for s in ("mean", "p50", "p90", "p99")}}
                                           for k in ("ttft", "tpot", "itl", "e2el")])
        ok = [SimpleNamespace(send_ns=r.send_ns, token_ns=r.chunk_ns, n=r.output_tokens, tpot_ms=1e3 * r.tpot_s,
                              itl_ms=[1e3 * g for g in r.itl_s])
              for r in rows.load if r.ok and (r.output_tokens or 0) > 1]
        if ok:
            res.add_table("metric_definitions", [{"requests": "load", **r} for r in metrics.tool_metrics(ok)])


def _med(s: pd.Series) -> float | None:
    s = pd.to_numeric(s, errors="coerce").dropna()
    return float(s.median()) if len(s) else None


def waterfall_rows(good: pd.DataFrame) -> list[dict]:
    out = []
    for name, g in good.groupby("scenario", sort=False):
        if name.startswith("prefix"):
            continue
        out.append({"scenario": name, "n": len(g), "prompt_tokens": int(g["prompt_tokens"].median()),
                    **{k: _med(g[k]) for k in ("client_net_ms", "queue_ms", "prefill_ms", "ttft_ms",
                                               "first_decode_ms")},
                    "phases_from": g["phases_from"].mode().iloc[0]})
    return out


def sweep_rows(sweep: pd.DataFrame) -> tuple[list[dict], dict]:
    """One row per prompt length; TTFT = a + bT least squares on each length's fastest sample (contention on a
    shared machine only ever adds time); the same fit on the server's prefill times where it reports them."""
    rows = []
    for _, g in sweep.groupby("target_tokens"):
        pre = _med(g["prefill_ms"])
        t = int(g["prompt_tokens"].median())
        prefilled = g["prompt_n"].median() if g["prompt_n"].notna().any() else t  # the server's own count
        rows.append({"prompt_tokens": t, "n": len(g), "ttft_median_ms": float(g["ttft_ms"].median()),
                     "ttft_min_ms": float(g["ttft_ms"].min()), "prefill_ms": pre,
                     "server_tok_per_s": prefilled / pre * 1e3 if pre else None})
    x = np.array([r["prompt_tokens"] for r in rows], float)
    fit = {"points": len(rows), **linear_fit(x, np.array([r["ttft_min_ms"] for r in rows], float))}
    pre = [r["prefill_ms"] for r in rows]
    if all(p is not None for p in pre) and len(rows) >= 2:
        s = linear_fit(x, np.array(pre, float))
        fit.update(server_a_ms=s["a_ms"], server_b_ms_per_tok=s["b_ms_per_tok"], server_tok_per_s=s["tok_per_s"])
    for r in rows:
        r["fit_ms"] = fit["a_ms"] + fit["b_ms_per_tok"] * r["prompt_tokens"]
    return rows, fit


def exit_code(result: LabResult) -> tuple[int, str] | None:
    req = result.tables.get("endpoint_requests")
    if req is not None and len(req) and req["error"].notna().all():
        where = result.env.get("server", {}).get("endpoint", "the endpoint")
        return 3, f"every request to {where} failed ({req['error'].iloc[-1]})"
    return None


# ---------------------------------------------------------------- judge


def judge(result: LabResult) -> list[Claim]:
    t = result.tables
    return [_errors(t.get("endpoint_requests")), _within(t.get("endpoint_requests")), _linear(t.get("endpoint_fit")),
            _slopes(t.get("endpoint_fit")), _prefix(t.get("prefix_probe"))]


def _errors(req) -> Claim:
    cid, text = "ttft_breakdown.endpoint_no_failed_requests", "Every request to the server completed"
    if empty_table(req):
        return Claim(cid, text, "0 failed", "no requests", None, "no request was sent")
    bad = req[req["error"].notna()]
    first = f"; first: {bad['error'].iloc[0][:60]}" if len(bad) else ""
    return Claim(cid, text, "0 failed", f"{len(bad)} of {len(req)} failed ({len(bad) / len(req):.0%}){first}",
                 len(bad) == 0, "failed requests are kept in the requests table with their error")


def _within(req) -> Claim:
    cid = "ttft_breakdown.endpoint_phases_within_ttft"
    text = "Harness check: the server's queue + prefill fit inside the client's TTFT"
    exp = "queue + prefill <= TTFT, every request"
    rep = None if empty_table(req) else req[req["error"].isna() & req["prefill_ms"].notna()]
    if rep is None or not len(rep):
        return Claim(cid, text, exp, "not reported", None,
                     "the server reports no phases (no timings, no vLLM-style /metrics)")
    gap = rep["client_net_ms"].astype(float)
    return Claim(cid, text, exp, f"{len(rep)} requests; client + network {gap.min():.2f}-{gap.max():.2f} ms",
                 bool((gap >= -0.05).all()),
                 "a server clock or a phase that ends after the first token reached the client")


def _linear(fit) -> Claim:
    cid, text = "ttft_breakdown.endpoint_ttft_linear_in_prompt", "TTFT grows linearly with the prompt: TTFT = a + b T"
    exp = f"within {FIT_REL:.0%} at every length"
    if empty_table(fit) or fit.iloc[0]["points"] < 3 or pd.isna(fit.iloc[0].get("worst_rel_err", math.nan)):
        return Claim(cid, text, exp, "fewer than 3 lengths", None,
                     "needs 3+ prompt lengths (--prompt-len, sweep points)")
    f = fit.iloc[0]
    return Claim(cid, text, exp,
                 f"a {f['a_ms']:.1f} ms + T / {f['tok_per_s']:,.0f} tok/s; worst {f['worst_rel_err']:.0%} off",
                 bool(f["worst_rel_err"] <= FIT_REL and f["b_ms_per_tok"] > 0),
                 "a curve, not a line: attention's T^2 grows with the prompt (the in-process lab fits a + bT + cT^2)")


def _slopes(fit) -> Claim:
    cid = "ttft_breakdown.endpoint_slope_is_prefill"
    text = "The prompt costs prefill, not network: TTFT's slope = the server's prefill slope"
    exp = f"within {SLOPE_TOL:.0%}"
    if empty_table(fit) or "server_b_ms_per_tok" not in fit or pd.isna(fit.iloc[0]["server_b_ms_per_tok"]):
        return Claim(cid, text, exp, "not reported", None, "the server reports no prefill time")
    f = fit.iloc[0]
    r = f["b_ms_per_tok"] / f["server_b_ms_per_tok"]
    return Claim(cid, text, exp,
                 f"client {f['tok_per_s']:,.0f} vs server {f['server_tok_per_s']:,.0f} tok/s ({r:.2f}x)",
                 bool(abs(r - 1) <= SLOPE_TOL),
                 "a per-token cost outside prefill: the upload, or tokenizing a text prompt")


def _prefix(pp) -> Claim:
    cid, text = "ttft_breakdown.endpoint_prefix_reuse", "A repeated prefix is served from the server's prefix cache"
    exp = f"2nd TTFT >= {PREFIX_DROP:.0%} lower; cached >= {PREFIX_SHARE:.0%} of the prefix where reported"
    ok = None if empty_table(pp) else pp[pp["error"].isna()]
    if ok is None or not len(ok):
        return Claim(cid, text, exp, "no probe", None, "no prefix probe completed")
    drop = float(ok["drop"].median())
    cached = pd.to_numeric(ok["second_cached"], errors="coerce")
    share = float((cached / ok["prompt_tokens"]).median()) if cached.notna().all() else None
    tokens = int(ok["prompt_tokens"].iloc[0])
    meas = f"TTFT -{drop:.0%}" + (f"; {share:.0%} of {tokens} tokens cached" if share is not None
                                  else "; cache not reported")
    holds = drop >= PREFIX_DROP and (share is None or share >= PREFIX_SHARE)
    return Claim(cid, text, exp, meas, bool(holds),
                 "prefix caching is off, or the prefix is evicted between the two requests")


# ---------------------------------------------------------------- report


def views(result: LabResult) -> list[View]:
    srv = result.env.get("server", {})
    out = [
        View("1. Where TTFT goes at this endpoint",
             f"{srv.get('endpoint', '?')} ({srv.get('model', '?')}): the server's own phases "
             f"({_source(result)}) and the client's stamps, per scenario (medians, ms)", "endpoint_waterfall",
             (Col("scenario", "scenario", "text", 12), Col("prompt_tokens", "prompt tok", "int"),
              Col("client_net_ms", "client + net", ",.1f"), Col("queue_ms", "queue", ",.1f"),
              Col("prefill_ms", "prefill", ",.1f"), Col("ttft_ms", "TTFT", ",.1f"),
              Col("first_decode_ms", "1st decode", ",.1f")),
             chart=Chart("TTFT waterfall (ms, medians)", "endpoint_waterfall", "scenario",
                         ["client_net_ms", "queue_ms", "prefill_ms"], kind="stacked", xlabel="scenario")),
        View("2. Prompt length", "How fast does the server prefill? TTFT = a + b T on each length's fastest request",
             "endpoint_sweep",
             (Col("prompt_tokens", "prompt tokens", "int"), Col("ttft_median_ms", "TTFT ms"),
              Col("ttft_min_ms", "fastest ms"), Col("fit_ms", "fit ms"), Col("prefill_ms", "server prefill ms"),
              Col("server_tok_per_s", "server tok/s", ",.0f"))),
        View("3. Prefix probe", "The same long prefix twice: how much faster is the second first token?",
             "prefix_probe",
             (Col("pair", "pair", "int"), Col("prompt_tokens", "prompt tok", "int"),
              Col("first_ttft_ms", "1st TTFT ms"), Col("second_ttft_ms", "2nd TTFT ms"), Col("drop", "drop", "%"),
              Col("second_cached", "cached tok (server)", "int"))),
        View("4. Under load", _load_question(result), "endpoint_latency",
             (Col("metric", "metric", "text"), Col("mean", "mean ms"), Col("p50", "p50 ms"), Col("p90", "p90 ms"),
              Col("p99", "p99 ms"))),
        View("5. One run, four tools' per-token latency",
             "The same load requests: what each benchmark tool would report (ms)", "metric_definitions",
             (Col("tool", "tool", "text", 22), Col("metric", "metric", "text", 26), Col("value_ms", "ms", ",.2f"))),
    ]
    req = result.tables.get("endpoint_requests")
    if not empty_table(req) and req["error"].notna().any():
        out.append(View("6. Failed requests", "Which requests failed, and why?", "endpoint_requests",
                        (Col("scenario", "scenario", "text", 12), Col("prompt_tokens", "prompt tok", "int"),
                         Col("error", "error", "text", 50)),
                        rows=lambda df: df[df["error"].notna()], max_rows=6))
    return out


def _source(result: LabResult) -> str:
    req = result.tables.get("endpoint_requests")
    if empty_table(req):
        return "none"
    src = sorted(set(req["phases_from"].dropna()) - {"not reported"})
    return "from " + " and ".join(src) if src else "not reported"


def _load_question(result: LabResult) -> str:
    ld = result.tables.get("endpoint_load")
    if empty_table(ld):
        return "TTFT, TPOT, ITL and E2EL under load (vLLM bench serve's definitions)"
    r = ld.iloc[0]
    unlimited = pd.isna(r["request_rate"]) or math.isinf(r["request_rate"])
    rate = "as fast as allowed" if unlimited else f"{r['request_rate']:g}/s (burstiness {r['burstiness']:g})"
    return (f"{int(r['completed'])} ok, {int(r['failed'])} failed ({r['error_rate']:.0%}); "
            f"concurrency {int(r['concurrency'])}, arrivals {rate}: {r['output_throughput']:,.0f} output tok/s, "
            f"{r['request_throughput']:.2f} req/s")


def headline(result: LabResult, claims: list[Claim]) -> str:
    t = result.tables
    wf, fit, pp = t.get("endpoint_waterfall"), t.get("endpoint_fit"), t.get("prefix_probe")
    lat = t.get("endpoint_latency")
    if empty_table(wf):
        return "No request to the endpoint completed."
    a = wf[wf["scenario"] == "alone"]
    parts = []
    if len(a):
        r = a.iloc[0]
        split = (f" (prefill {r['prefill_ms']:.1f}, queue {r['queue_ms'] or 0:.1f}, "
                 f"client + network {r['client_net_ms']:.1f})"
                 if pd.notna(r["prefill_ms"]) else " (server phases not reported)")
        parts.append(f"Alone, a {int(r['prompt_tokens'])}-token prompt's first token takes "
                     f"{r['ttft_ms']:.1f} ms{split}")
    if not empty_table(fit) and pd.notna(fit.iloc[0]["tok_per_s"]):
        sw = t.get("endpoint_sweep")
        top = sw.iloc[-1] if not empty_table(sw) else None
        a_ms = fit.iloc[0]["a_ms"]
        at_top = (f" ({top['prompt_tokens'] / (top['ttft_min_ms'] - a_ms) * 1e3:,.0f} at {int(top['prompt_tokens']):,})"
                  if top is not None and top["ttft_min_ms"] > a_ms else "")
        parts.append(f"prefill runs at {fit.iloc[0]['tok_per_s']:,.0f} tok/s{at_top}")
    if not empty_table(pp) and pp["drop"].notna().any():
        parts.append(f"a repeated prefix cuts TTFT by {pp['drop'].median():.0%}")
    if not empty_table(lat):
        p99 = lat.set_index("metric").loc["TTFT", "p99"]
        parts.append(f"under load p99 TTFT is {p99:,.0f} ms")
    return "; ".join(parts) + "."
