"""Benchmark: `llmlab serve` through HTTP, alone or against another OpenAI-compatible server (the peer).

The client (llmlab.loadgen.client: streamed /v1/completions, vLLM's metric definitions) runs a closed
loop: C clients, each sending its next request when its last reply has ended, at C = 1, 8 and 32. Every
request: a 40-token prompt (random token ids, a different prompt per request so that no prefix cache
helps; the same prompts for both servers), 64 output tokens (`ignore_eos`), greedy (temperature 0).
Each server gets a warm-up first (two single requests, then one round at the largest C), excluded.
Printed per C: output tokens/s, TTFT p50 / p99 and ITL p50 (ms).

This script starts `llmlab serve` (the built-in `tiny`, on the CPU, on a free port of 127.0.0.1; it
waits for /health) and measures it at every C; with --peer URL it measures the peer too, with the
same client and the same payloads: one server after the other, never both under load (the idle one
waits). --repeats N makes N passes, the order flipped each pass, each pass with new prompts; the
table shows medians. The prompts are drawn from --seed, new for every run unless given (printed, so a run can
be repeated): a peer that stays up between runs keeps its prompt caches (llama-server's slots do), and a
prompt it saw in an earlier run would reach it prefilled. The peer is not started here (llama.cpp's recipe:
benchmarks/llamacpp.sh).
With a peer it prints llmlab / peer (the median of the passes' ratios) against the serving goals,
each marked met or missed:
- concurrency 1: output tokens/s >= 0.5x the peer's;
- concurrency 32: output tokens/s >= 1.0x the peer's;
- concurrency 32: TTFT p50 no worse than the peer's (ratio <= 1.0).

Threads: the output states each side's thread settings. Ours: --threads sets OMP_NUM_THREADS for the
server process (torch's intra-op threads), --cpus pins it with taskset. The peer's are whatever it
was started with: --peer-note says it in words (e.g. "llama-server -t 1 -np 32, taskset -c 0"), and
its /props (llama.cpp) adds its slot count. For a fair run both sides get the same cores.

Every completed request must have had its --prompt-len prompt and --new-tokens output tokens (`usage`):
a request that stops early or is counted differently is reported as failed, not averaged in.
`make bench-serve` runs this (PEER=URL -> --peer, PEER_NOTE -> --peer-note, SERVE_ARGS for the rest).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import random
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

from llmlab.loadgen.client import calculate_metrics, run_load
from llmlab.tools.gpucheck import _free_port, _wait_health, stop_process  # gpu-check starts llmlab serve so

REPO = Path(__file__).resolve().parent.parent
TINY = REPO / "llmlab" / "tiny" / "weights" / "tiny"
# (what, concurrency, metric, llmlab / peer must be: ">=" or "<=", bar)
GOALS = [("output tokens/s", 1, "output_throughput", ">=", 0.5),
         ("output tokens/s", 32, "output_throughput", ">=", 1.0),
         ("TTFT p50 (no worse)", 32, "p50_ttft_ms", "<=", 1.0)]


def get_json(url: str, timeout_s: float = 2.0) -> dict | None:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            return json.loads(resp.read()) if resp.status == 200 else None
    except (OSError, ValueError):
        return None


@contextlib.contextmanager
def llmlab_server(threads: int, cpus: str | None, start_timeout_s: float):
    """`llmlab serve` (tiny, CPU) on a free port of 127.0.0.1 until the block ends; yields its base URL."""
    port = _free_port()
    cmd = [sys.executable, "-m", "llmlab", "serve", "--model", "tiny", "--device", "cpu", "--port", str(port)]
    if cpus:
        if not shutil.which("taskset"):
            raise SystemExit("--cpus needs taskset (util-linux)")
        cmd = ["taskset", "-c", cpus, *cmd]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "HF_HUB_OFFLINE": "1"}
    base = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryFile("w+") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
        try:
            why = _wait_health(base, proc, start_timeout_s)
            if why:
                log.seek(0)
                raise SystemExit(f"llmlab serve: {why}:\n{log.read()[-2000:]}")
            yield base
        finally:
            stop_process(proc)


def vocab_size() -> int:
    return json.loads((TINY / "config.json").read_text())["vocab_size"]


def payloads(n: int, prompt_len: int, new_tokens: int, seed: tuple[int, int]) -> list[dict]:
    """n requests of `prompt_len` random token ids (id 0 is tiny's only special token: left out)."""
    rng = random.Random(f"{seed[0]}/{seed[1]}")
    vocab = vocab_size()
    return [{"prompt": [rng.randrange(1, vocab) for _ in range(prompt_len)], "max_tokens": new_tokens,
             "temperature": 0.0, "ignore_eos": True} for _ in range(n)]


def measure(base: str, api_key_env: str | None, *, args, label: str, pass_no: int) -> dict[int, dict]:
    """Warm-up, then every concurrency: {C: the row of metrics}. The prompts depend on (seed, pass, C) only: the
    same for both servers, new in every pass (a prompt seen before would hit a prefix cache)."""
    url = base.rstrip("/") + "/v1/completions"
    top = max(args.concurrency)
    load = lambda ps, c, w: asyncio.run(run_load(url, ps, concurrency=c, warmup=w, timeout_s=args.timeout,  # noqa: E731
                                                 api_key_env=api_key_env))
    load(payloads(top, args.prompt_len, args.new_tokens, seed=(args.seed, 10_000 + pass_no)), top, 2)
    rows = {}
    for c in args.concurrency:
        n = max(c * args.rounds, args.min_requests)
        run = load(payloads(n, args.prompt_len, args.new_tokens, seed=(args.seed, 1_000 * pass_no + c)), c, 0)
        timed = [r for r in run.records if not r.warmup]
        bad = [r for r in timed if r.ok and (r.output_tokens != args.new_tokens or r.prompt_tokens != args.prompt_len)]
        for r in bad:  # counted as failed: the comparison is of 40 + 64 token requests only
            r.error = f"{r.prompt_tokens} prompt + {r.output_tokens} output tokens ({r.output_tokens_source})"
        m = calculate_metrics(run.records, run.duration_s)
        errors = sorted({r.error for r in timed if not r.ok})
        rows[c] = dict(m.__dict__, errors=errors, chunks_per_token=_chunks_per_token(timed))
        print(f"  {label}: C={c}: {m.output_throughput:,.0f} output tokens/s, TTFT p50 {m.p50_ttft_ms:.1f} ms "
              f"(p99 {m.p99_ttft_ms:.1f}), ITL p50 {m.p50_itl_ms:.2f} ms, {m.completed} done, {m.failed} failed"
              + (f" ({'; '.join(errors)[:200]})" if errors else ""), flush=True)
    return rows


def _chunks_per_token(records) -> float:
    """Streamed chunks with text per output token (1.0: one chunk per token, so ITL is per token)."""
    good = [r for r in records if r.ok and r.output_tokens]
    return sum(len(r.chunk_ns) for r in good) / max(sum(r.output_tokens for r in good), 1)


def median_rows(passes: list[dict[int, dict]]) -> dict[int, dict]:
    """One row per C: each number the median over the passes, tokens/s also its range, failures summed."""
    rows = {}
    for c in passes[0]:
        ms = [p[c] for p in passes]
        row = {k: statistics.median(m[k] for m in ms) for k, v in ms[0].items() if isinstance(v, (int, float))}
        tps = [m["output_throughput"] for m in ms]
        rows[c] = row | {"failed": sum(m["failed"] for m in ms), "completed": sum(m["completed"] for m in ms),
                         "tps_range": (min(tps), max(tps))}
    return rows


def table(results: dict[str, list[dict[int, dict]]]) -> list[str]:
    n = len(next(iter(results.values())))
    head = f"{'server':14s} {'C':>3s} {'requests':>8s} {'tokens/s':>9s} {'TTFT p50':>9s} {'TTFT p99':>9s} " \
           f"{'ITL p50':>8s} {'failed':>6s}" + ("  tokens/s min-max" if n > 1 else "")
    lines = [head, "-" * len(head)]
    for name, passes in results.items():
        for c, m in median_rows(passes).items():
            lo, hi = m["tps_range"]
            lines.append(f"{name:14s} {c:3d} {m['completed']:8d} {m['output_throughput']:9,.0f} "
                         f"{m['p50_ttft_ms']:9.1f} {m['p99_ttft_ms']:9.1f} {m['p50_itl_ms']:8.2f} {m['failed']:6d}"
                         + (f"  {lo:,.0f}-{hi:,.0f}" if n > 1 else ""))
    note = f"times in ms; each number the median of {n} passes (requests: all passes)" if n > 1 else "times in ms"
    return [*lines, note]


def ratios(ours: list[dict[int, dict]], peer: list[dict[int, dict]]) -> list[str]:
    """One line per goal: the median over passes of llmlab / peer, the bar, met or missed (or why not judged)."""
    lines = []
    for what, c, key, op, bar in GOALS:
        name = f"C={c:<2d} {what}"
        if c not in ours[0] or c not in peer[0]:
            lines.append(f"  {name:30s} not measured (concurrency {c} not in --concurrency)")
            continue
        pairs = [(a[c][key], b[c][key]) for a, b in zip(ours, peer, strict=True)]
        if any(a[c]["failed"] or b[c]["failed"] for a, b in zip(ours, peer, strict=True)) or \
                not all(x > 0 and y > 0 for x, y in pairs):
            lines.append(f"  {name:30s} not judged: a side had failed requests or no value")
            continue
        rs = [x / y for x, y in pairs]
        r = statistics.median(rs)
        met = r >= bar if op == ">=" else r <= bar
        unit = "tokens/s" if key == "output_throughput" else "ms"
        a, b = statistics.median(x for x, _ in pairs), statistics.median(y for _, y in pairs)
        each = f"; passes {', '.join(f'{x:.2f}' for x in rs)}" if len(rs) > 1 else ""
        lines.append(f"  {name:30s} {r:5.2f}x (llmlab {a:,.1f}, peer {b:,.1f} {unit}{each}); goal {op} {bar}x: "
                     f"{'met' if met else 'MISSED'}")
    return lines


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        cpu = next(ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                   if ln.startswith("model name"))
    git = lambda *a: subprocess.run(["git", *a], cwd=REPO, capture_output=True, text=True).stdout.strip()  # noqa: E731
    rev, dirty = git("rev-parse", "--short", "HEAD"), git("status", "--porcelain", "--untracked-files=no", "llmlab")
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    return (f"{cpu}, {os.cpu_count()} CPUs, load average {load} at the start; llmlab at {rev or '?'}"
            f"{' + uncommitted changes in llmlab/' if dirty else ''}")


def _csv_ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--peer", help="base URL of another OpenAI-compatible server, e.g. http://127.0.0.1:8090")
    ap.add_argument("--peer-note", default="", help="the peer's thread and core settings, in words, for the output")
    ap.add_argument("--concurrency", type=_csv_ints, default=[1, 8, 32], help="closed-loop clients, comma-separated")
    ap.add_argument("--rounds", type=int, default=4, help="requests each client sends per concurrency level")
    ap.add_argument("--min-requests", type=int, default=16, help="timed requests per level at least (C = 1: 16)")
    ap.add_argument("--prompt-len", type=int, default=40)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=1, help="passes over both servers, order flipped each pass")
    ap.add_argument("--threads", type=int, default=1, help="llmlab serve's OMP_NUM_THREADS (torch threads)")
    ap.add_argument("--cpus", default=None, help="pin llmlab serve to these CPUs (taskset -c LIST), e.g. 0")
    ap.add_argument("--seed", type=int, default=None, help="the prompts' seed (default: a new one every run)")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds per request")
    ap.add_argument("--start-timeout", type=float, default=180.0, help="seconds for llmlab serve to answer /health")
    args = ap.parse_args()
    if args.seed is None:
        args.seed = random.SystemRandom().randrange(10**6)
    if not args.concurrency or min(args.concurrency) < 1 or min(args.rounds, args.repeats) < 1:
        ap.error("--concurrency needs values >= 1, --rounds and --repeats >= 1")
    return args


def main() -> None:
    args = parse()
    print(f"bench-serve on {machine()}")
    print("command: python -m benchmarks.serve " + " ".join(shlex.quote(a) for a in sys.argv[1:]))
    print(f"closed loop at C = {', '.join(map(str, args.concurrency))}: each client sends its next request when its "
          f"last reply ended, {args.rounds} requests per client (at least {args.min_requests} a level);")
    print(f"{args.prompt_len}-token prompts (random ids, one per request, the same for both servers), "
          f"{args.new_tokens} output tokens, ignore_eos, greedy, prompt seed {args.seed} (--seed repeats them); "
          "warm-up first; the client runs on "
          + (f"CPUs {sorted(os.sched_getaffinity(0))}" if hasattr(os, "sched_getaffinity") else "any CPU"))
    ours_threads = f"OMP_NUM_THREADS={args.threads}, " + (f"taskset -c {args.cpus}" if args.cpus else "not pinned")
    print(f"llmlab serve: tiny, cpu, float32, defaults otherwise; {ours_threads}", flush=True)
    if args.peer:
        props = get_json(args.peer.rstrip("/") + "/props") or {}
        seen = ", ".join(f"{k} {props[k]}" for k in ("total_slots", "build_info") if k in props)
        print(f"peer {args.peer}: {args.peer_note or 'thread settings not given (--peer-note)'}"
              + (f"; its /props: {seen}" if seen else ""), flush=True)
    results: dict[str, list[dict[int, dict]]] = {"llmlab serve": []} | ({"peer": []} if args.peer else {})
    with llmlab_server(args.threads, args.cpus, args.start_timeout) as base:
        urls = {"llmlab serve": (base, None), "peer": (args.peer, "OPENAI_API_KEY")}
        for r in range(args.repeats):  # one server after the other, the order flipped each pass
            for name in (list(results) if r % 2 == 0 else list(reversed(results))):
                results[name].append(measure(*urls[name], args=args, label=f"pass {r + 1}: {name}", pass_no=r))
    print()
    print("\n".join(table(results)))
    for name, passes in results.items():
        odd = {c: m["chunks_per_token"] for c, m in median_rows(passes).items()
               if abs(m["chunks_per_token"] - 1) > 0.01}
        if odd:
            print(f"note: {name} streamed {odd} chunks with choices per output token (by C): a chunk without a "
                  "token (a final finish_reason chunk) adds a near-0 gap to the pooled ITL, as in vLLM's client")
    print("load average at the end: " + ", ".join(f"{x:.1f}" for x in os.getloadavg()))
    if args.peer:
        print("\nllmlab / peer, against the goals:")
        print("\n".join(ratios(results["llmlab serve"], results["peer"])))


if __name__ == "__main__":
    main()
