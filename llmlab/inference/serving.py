"""A tiny streaming server: one request timed phase by phase, one FCFS worker, Poisson arrivals.

Reading order: `render_chat` -> `serve` (one request: retrieval, template + tokenize, prefill,
first token, decode steps) -> `Delayed` / `slowed_forward` (test hooks: a known delay inside one
component, to check that the breakdown attributes it to its phase) -> `poisson_offsets` / `burst_offsets` -> `run_fcfs` (one worker that
sleeps until the next arrival when idle) -> queueing theory (`md1_wait`, `mm1_wait`, `mg1_wait`,
`lindley`, `finite_run_waits`) -> streaming metrics (`vllm_metrics`, `tool_metrics`).

Every phase has its own start and end stamp (time.perf_counter_ns; the device is synchronised
before a phase that launched GPU work ends), so the phases do not add up to the TTFT by
construction: what they miss is the harness's own overhead, reported as the remainder.

Metric definitions (read from each tool's source):
- vLLM `benchmarks/benchmark_serving.py` (`calculate_metrics`): TTFT = first token - send;
  E2EL = last token - send; TPOT = (E2EL - TTFT) / (n - 1) per request; ITL = every gap between
  consecutive chunks, pooled over requests.
- GenAI-Perf (triton-inference-server/perf_analyzer, `llm_profile_data_parser.py`): its
  "inter_token_latency" is (request latency - TTFT) / (n - 1) per request, i.e. vLLM's TPOT.
- llmperf (ray-project/llmperf, `openai_chat_completions_client.py` + `token_benchmark_ray.py`):
  inter_token_latency = sum(time_to_next_token) / n, where the list starts with the TTFT, so it
  is (last token - send) / n: the first token's wait is inside the "inter-token" number.
- guidellm (vllm-project/guidellm, `schemas/request_stats.py`): time_per_output_token_ms =
  (last token - start) / n (includes TTFT); inter_token_latency_ms = (last - first) / (n - 1).

Queueing (one server, FCFS): M/D/1 mean wait Wq = rho / (2 mu (1 - rho)) = rho D / (2 (1 - rho))
(Pollaczek-Khinchine with deterministic service D = 1/mu); M/M/1 Wq = rho D / (1 - rho).
M/G/1 (any service distribution): Wq = lambda E[S^2] / (2 (1 - rho)). Lindley's recursion
W[k] = max(0, W[k-1] + S[k-1] - (A[k] - A[k-1])) gives the exact FCFS waits of any arrival
sequence A and service times S.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

# The built-in tokenizer has no chat template: this plain-text one (ChatML-like markers, spelled
# out as ordinary text) stands in for it. A tokenizer that ships a template uses its own.
CHAT_TEMPLATE = "<|system|>\n{system}\n<|user|>\n{user}\n<|assistant|>\n"
RAG_USER = "Answer from the context below.\n\nContext:\n{context}\n\nQuestion: {question}"
SYSTEM = "You are a helpful assistant for Python questions. Answer briefly."

now_ns = time.perf_counter_ns


def render_chat(tokenizer, system: str, user: str) -> tuple[str, str]:
    """(prompt text, which template): the tokenizer's own chat template when it has one."""
    if getattr(tokenizer, "chat_template", None):
        msgs = [{"role": "system", "content": system}, {"role": "user", "content": user}]
        return tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True), "tokenizer"
    return CHAT_TEMPLATE.format(system=system, user=user), "llmlab plain-text"


# ---------------------------------------------------------------- one request


@dataclass
class Request:
    user: str  # the user's message (for RAG: the question; retrieval adds the context)
    new_tokens: int = 16  # exactly this many tokens are streamed (EOS ignored, like vLLM's ignore_eos)
    system: str = SYSTEM
    max_prompt_tokens: int | None = None  # keep only the last N prompt tokens (the context limit)
    send_ns: int = 0  # when the client sent it; 0 = "now", set by `serve`


@dataclass
class Trace:
    """What one request did, in perf_counter_ns stamps."""

    send_ns: int
    start_ns: int = 0  # the worker picked it up: queue wait = start - send
    phases: dict[str, tuple[int, int]] = field(default_factory=dict)  # name -> (start, end), before the first token
    token_ns: list[int] = field(default_factory=list)  # when the client received each token
    step_ns: list[tuple[int, int]] = field(default_factory=list)  # each decode step (start, end)
    end_ns: int = 0  # the worker is free again
    prompt_tokens: int = 0
    template: str = ""
    tokens: list[int] = field(default_factory=list)  # the streamed token ids
    text: str = ""

    # -- the vLLM-benchmark metrics, in ms
    @property
    def ttft_ms(self) -> float:
        return (self.token_ns[0] - self.send_ns) / 1e6

    @property
    def e2e_ms(self) -> float:
        return (self.token_ns[-1] - self.send_ns) / 1e6

    @property
    def n(self) -> int:
        return len(self.token_ns)

    @property
    def tpot_ms(self) -> float:
        return (self.e2e_ms - self.ttft_ms) / (self.n - 1) if self.n > 1 else math.nan

    @property
    def itl_ms(self) -> list[float]:
        return [(b - a) / 1e6 for a, b in zip(self.token_ns[:-1], self.token_ns[1:], strict=True)]

    @property
    def service_ms(self) -> float:
        """How long the worker was busy with this request."""
        return (self.end_ns - self.start_ns) / 1e6

    # -- the breakdown
    @property
    def queue_ms(self) -> float:
        return (self.start_ns - self.send_ns) / 1e6

    def phase_ms(self, name: str) -> float:
        a, b = self.phases.get(name, (0, 0))
        return (b - a) / 1e6

    @property
    def attributed_ms(self) -> float:
        return self.queue_ms + sum(self.phase_ms(p) for p in self.phases)

    @property
    def unattributed_ms(self) -> float:
        """TTFT minus its phases: the harness's own time between the stamps."""
        return self.ttft_ms - self.attributed_ms

    def breakdown(self) -> dict[str, float]:
        row = {"queue_ms": self.queue_ms}
        row.update({f"{p}_ms": self.phase_ms(p) for p in PHASES})
        row.update(sum_of_phases_ms=self.attributed_ms, ttft_ms=self.ttft_ms, unattributed_ms=self.unattributed_ms,
                   unattributed_pct=100 * self.unattributed_ms / self.ttft_ms)
        return row


PHASES = ("retrieval", "template_tokenize", "prefill", "first_token")  # in the order they run


def serve(model, tokenizer, device, req: Request, retrieve: Callable[[str], str] | None = None,
          on_token: Callable[[str], None] | None = None) -> Trace:
    """Serve one streaming request, greedy, and time each phase. The first token's receipt closes TTFT.

    retrieval (RAG only) -> template + tokenize (+ copy ids to the device) -> prefill forward (cache
    allocation included, device synchronised) -> first token (argmax, .item(), detokenize) -> stream
    -> decode steps, each: one-token forward, argmax, detokenize, stream.
    """
    import torch

    from llmlab.inference.decode import decode_one_token, new_cache, prefill

    tr = Trace(send_ns=req.send_ns or now_ns())
    tr.start_ns = now_ns()
    sync = device.synchronize
    received = tr.token_ns

    def emit(piece: str) -> None:  # the client: it stamps the token when it gets it
        received.append(now_ns())
        if on_token:
            on_token(piece)

    with torch.inference_mode():
        user = req.user
        if retrieve is not None:
            t0 = now_ns()
            user = retrieve(req.user)
            tr.phases["retrieval"] = (t0, now_ns())
        t0 = now_ns()
        text, tr.template = render_chat(tokenizer, req.system, user)
        ids = tokenizer(text, return_tensors="pt", add_special_tokens=False)["input_ids"]
        if req.max_prompt_tokens and ids.shape[1] > req.max_prompt_tokens:
            ids = ids[:, -req.max_prompt_tokens:]  # keep the end: the question and the assistant tag
        ids = ids.to(device.torch)  # (1, S)
        tr.phases["template_tokenize"] = (t0, now_ns())
        tr.prompt_tokens = int(ids.shape[1])

        t0 = now_ns()
        cache = new_cache(model)
        logits = prefill(model, ids, cache)  # (1, V)
        sync()
        tr.phases["prefill"] = (t0, now_ns())

        t0 = now_ns()
        tok = logits.argmax(dim=-1, keepdim=True)  # (1, 1)
        tid = int(tok)  # a device -> host copy: synchronises on a GPU
        piece = tokenizer.decode([tid])
        tr.phases["first_token"] = (t0, now_ns())
        emit(piece)
        pieces, ids_out = [piece], [tid]

        for _ in range(req.new_tokens - 1):
            t0 = now_ns()
            tok = decode_one_token(model, tok, cache).argmax(dim=-1, keepdim=True)
            tid = int(tok)
            piece = tokenizer.decode([tid])
            tr.step_ns.append((t0, now_ns()))
            emit(piece)
            pieces.append(piece)
            ids_out.append(tid)
    tr.text, tr.tokens = "".join(pieces), ids_out
    tr.end_ns = now_ns()
    return tr


# ---------------------------------------------------------------- attribution hooks: a known delay in one component


def spin(seconds: float) -> None:
    """Busy-wait until `seconds` after now (a deadline, so a descheduled spin still ends on time when it can:
    time.sleep overshoots by milliseconds on a loaded machine, which would blur a known delay)."""
    end = now_ns() + int(seconds * 1e9)
    while now_ns() < end:
        pass


class Delayed:
    """`inner` with `delay_s` of busy-wait added before each call of one method ("__call__" = encode for a
    tokenizer, "decode" = detokenize). Everything else passes through, so `serve` sees the same object.
    """

    def __init__(self, inner, delay_s: float, method: str = "__call__"):
        self._inner, self._delay_s, self._method = inner, delay_s, method

    def __call__(self, *args, **kwargs):
        if self._method == "__call__":
            spin(self._delay_s)
        return self._inner(*args, **kwargs)

    def __getattr__(self, name: str):
        attr = getattr(self._inner, name)
        if name != self._method:
            return attr

        def delayed(*args, **kwargs):
            spin(self._delay_s)
            return attr(*args, **kwargs)

        return delayed


class slowed_forward:  # noqa: N801 (a context manager used like a function)
    """`with slowed_forward(model, 0.05):` every forward of `model` (prefill and each decode step) takes
    `delay_s` longer: a forward pre-hook that busy-waits, removed on exit."""

    def __init__(self, model, delay_s: float):
        self.model, self.delay_s, self.handle = model, delay_s, None

    def __enter__(self):
        self.handle = self.model.register_forward_pre_hook(lambda module, args: spin(self.delay_s))
        return self.model

    def __exit__(self, *exc) -> bool:
        self.handle.remove()
        return False


# ---------------------------------------------------------------- arrivals and the worker


def poisson_offsets(rate: float, n: int, rng: np.random.Generator) -> np.ndarray:
    """Arrival times (s from the start) of a Poisson process: exponential gaps of mean 1/rate."""
    if rate <= 0:
        raise ValueError("the arrival rate must be > 0 requests/s")
    return np.cumsum(rng.exponential(1.0 / rate, size=n))


def burst_offsets(n: int) -> np.ndarray:
    """n requests that all arrive at once."""
    return np.zeros(n)


def sleep_until(t_ns: int, spin_ns: int = 2_000_000) -> None:
    """Sleep to `spin_ns` before t_ns, then spin: time.sleep overshoots by ~0.1 ms idle, by
    milliseconds on a loaded machine, and the overshoot would count as queue wait."""
    while (left := t_ns - now_ns()) > 0:
        if left > spin_ns:
            time.sleep((left - spin_ns) / 1e9)


def run_fcfs(offsets_s, serve_one: Callable[[int], Trace], lead_s: float = 0.005) -> list[Trace]:
    """One worker, first come first served: request k arrives at t0 + offsets_s[k].

    The schedule is fixed in advance; a single thread plays both the arrivals and the worker: when
    idle it sleeps until the next arrival, when busy the next request waits (its send time stays
    its arrival time). `serve_one(send_ns)` serves one request and returns its Trace.
    """
    t0 = now_ns() + int(lead_s * 1e9)
    traces = []
    for off in sorted(float(o) for o in offsets_s):
        arrival = t0 + int(off * 1e9)
        sleep_until(arrival)  # returns at once when the worker is late (the request queued)
        traces.append(serve_one(arrival))
    return traces


# ---------------------------------------------------------------- queueing theory


def md1_wait(rho: float, service_s: float) -> float:
    """M/D/1 mean queue wait (s): rho D / (2 (1 - rho)); inf at rho >= 1."""
    return rho * service_s / (2 * (1 - rho)) if rho < 1 else math.inf


def mm1_wait(rho: float, service_s: float) -> float:
    """M/M/1 mean queue wait (s): rho D / (1 - rho); inf at rho >= 1."""
    return rho * service_s / (1 - rho) if rho < 1 else math.inf


def lindley(arrivals_s, services_s) -> np.ndarray:
    """Exact FCFS single-server waits for these arrival times and service times (s)."""
    a, s = np.asarray(arrivals_s, float), np.asarray(services_s, float)
    w = np.zeros(len(a))
    for k in range(1, len(a)):
        w[k] = max(0.0, w[k - 1] + s[k - 1] - (a[k] - a[k - 1]))
    return w


def mg1_wait(rate: float, services_s) -> float:
    """M/G/1 mean queue wait (s), Pollaczek-Khinchine: lambda E[S^2] / (2 (1 - rho)); inf at rho >= 1."""
    s = np.asarray(services_s, float)
    rho = rate * s.mean()
    return rate * float(np.mean(s * s)) / (2 * (1 - rho)) if rho < 1 else math.inf


def finite_run_waits(rate: float, services_s, n: int, reps: int, rng: np.random.Generator) -> dict[str, float]:
    """Queue waits of n Poisson arrivals into an EMPTY single-server FCFS queue, over `reps` simulated runs.

    Service times are drawn from `services_s` (one value: M/D/1; measured samples: M/G/1 with the
    measured distribution). A short run starts empty and never reaches the steady state the
    formulas describe (the relaxation time grows like D / (1 - rho)^2), so this is the fair
    expectation for n requests.
    """
    gaps = rng.exponential(1.0 / rate, size=(reps, n))  # (R, n)
    svc = rng.choice(np.atleast_1d(np.asarray(services_s, float)), size=(reps, n))  # (R, n)
    w = np.zeros((reps, n))
    for k in range(1, n):
        w[:, k] = np.maximum(0.0, w[:, k - 1] + svc[:, k - 1] - gaps[:, k])
    return {"mean_s": float(w.mean()), "p50_s": float(np.median(w)), "p90_s": float(np.quantile(w, 0.9)),
            "p99_s": float(np.quantile(w, 0.99))}


# ---------------------------------------------------------------- streaming metrics


def pct(xs, qs=(50, 90, 99)) -> dict[str, float]:
    """p50/p90/p99 (numpy's linear interpolation, as vLLM's benchmark uses) and the mean."""
    xs = np.asarray([x for x in xs if not math.isnan(x)], float)
    if xs.size == 0:
        return {**{f"p{q}_ms": math.nan for q in qs}, "mean_ms": math.nan, "n": 0}
    return {**{f"p{q}_ms": float(np.percentile(xs, q)) for q in qs}, "mean_ms": float(xs.mean()), "n": int(xs.size)}


def vllm_metrics(traces: list[Trace]) -> dict[str, dict[str, float]]:
    """TTFT, TPOT, ITL, E2EL as vLLM's benchmark_serving computes them (ITL pooled over requests)."""
    return {
        "TTFT": pct([t.ttft_ms for t in traces]),
        "TPOT": pct([t.tpot_ms for t in traces]),
        "ITL": pct([g for t in traces for g in t.itl_ms]),
        "E2EL": pct([t.e2e_ms for t in traces]),
    }


def tool_metrics(traces: list[Trace]) -> list[dict]:
    """The "per-token latency" each tool would report for the same requests (mean over requests, ms)."""

    def mean(f):
        return float(np.mean([f(t) for t in traces]))

    first = lambda t: (t.token_ns[0] - t.send_ns) / 1e6  # noqa: E731
    last = lambda t: (t.token_ns[-1] - t.send_ns) / 1e6  # noqa: E731
    return [
        dict(tool="vLLM benchmark_serving", metric="TPOT", formula="(E2EL - TTFT) / (n - 1)", value_ms=mean(lambda t: t.tpot_ms)),
        dict(tool="vLLM benchmark_serving", metric="ITL (mean of pooled gaps)", formula="every token gap, pooled",
             value_ms=float(np.mean([g for t in traces for g in t.itl_ms]))),
        dict(tool="GenAI-Perf", metric="inter_token_latency", formula="(request latency - TTFT) / (n - 1)",
             value_ms=mean(lambda t: (last(t) - first(t)) / (t.n - 1))),
        dict(tool="llmperf", metric="inter_token_latency", formula="(TTFT + sum of gaps) / n = (last - send) / n",
             value_ms=mean(lambda t: last(t) / t.n)),
        dict(tool="guidellm", metric="time_per_output_token_ms", formula="(last - start) / n",
             value_ms=mean(lambda t: last(t) / t.n)),
        dict(tool="guidellm", metric="inter_token_latency_ms", formula="(last - first) / (n - 1)",
             value_ms=mean(lambda t: (last(t) - first(t)) / (t.n - 1))),
    ]


# ---------------------------------------------------------------- cold start (runs in a fresh process)

COLD_START_CODE = (
    "import time; t0 = time.monotonic_ns()\n"
    "import torch; t1 = time.monotonic_ns()\n"
    "import transformers; t2 = time.monotonic_ns()\n"
    "from llmlab.inference.serving import cold_start_child\n"
    "cold_start_child({'start': t0, 'import_torch': t1, 'import_transformers': t2})\n"
)
COLD_START_TAG = "LLMLAB_COLD_START "


def cold_start_child(stamps: dict[str, int]) -> None:
    """The child of `python -c COLD_START_CODE ref device user new_tokens warm_repeats threads`.

    Stamps (time.monotonic_ns, a system-wide clock the parent shares) each step of a cold start,
    serves the same request once cold and `warm_repeats` times warm, and prints one JSON line.
    """
    import json
    import os
    import sys

    import torch
    from transformers import AutoModelForCausalLM

    from llmlab.core.device import resolve_device
    from llmlab.core.models import arch_config, classify, load_tokenizer

    ref, device_spec, user = sys.argv[1], sys.argv[2], sys.argv[3]
    new_tokens, warm_repeats, threads = int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
    if threads:
        torch.set_num_threads(threads)  # the same as the parent's run
    mono_minus_perf = time.monotonic_ns() - time.perf_counter_ns()
    stamps["import_llmlab"] = time.monotonic_ns()
    device = resolve_device(device_spec)
    if device.is_cuda:  # the CUDA context is created by the first CUDA call
        torch.zeros(1, device=device.torch)
        device.synchronize()
    stamps["device_init"] = time.monotonic_ns()
    kind, loc = classify(ref)
    tokenizer = load_tokenizer("tiny" if kind == "arch" else ref)
    stamps["load_tokenizer"] = time.monotonic_ns()
    if kind == "arch":
        model, weight_bytes = AutoModelForCausalLM.from_config(arch_config(loc)), 0
    else:
        model = AutoModelForCausalLM.from_pretrained(loc, dtype=torch.float32)
        weight_bytes = sum(os.path.getsize(os.path.join(loc, f)) for f in os.listdir(loc)
                           if f.endswith((".safetensors", ".bin"))) if os.path.isdir(loc) else 0
    model.eval()
    stamps["read_weights"] = time.monotonic_ns()
    model.to(device.torch)
    device.synchronize()
    stamps["to_device"] = time.monotonic_ns()
    req = Request(user, new_tokens=new_tokens)
    cold = serve(model, tokenizer, device, req)
    stamps["first_token"] = cold.token_ns[0] + mono_minus_perf
    warm = [serve(model, tokenizer, device, Request(user, new_tokens=new_tokens)) for _ in range(warm_repeats)]
    out = {"stamps": stamps, "weight_bytes": weight_bytes, "n_params": sum(p.numel() for p in model.parameters()),
           "cold": cold.breakdown(), "warm": [w.breakdown() for w in warm], "prompt_tokens": cold.prompt_tokens}
    sys.stdout.write(COLD_START_TAG + json.dumps(out) + "\n")
    sys.stdout.flush()


def cold_start(ref: str, device_spec: str, user: str, new_tokens: int, warm_repeats: int = 3, threads: int = 0,
               timeout_s: float = 600) -> dict:
    """Spawn a fresh interpreter that loads `ref` and serves one request; return its stamps.

    Adds the parent's own view: `spawn_ns` (just before the process is created) and `exit_ns`
    (after it has exited), on the same monotonic clock as the child's stamps.
    """
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[2])  # so the child imports this very tree
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("TRANSFORMERS_VERBOSITY", "error")
    cmd = [sys.executable, "-c", COLD_START_CODE, ref, device_spec, user, str(new_tokens), str(warm_repeats), str(threads)]
    spawn = time.monotonic_ns()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env)
    exit_ns = time.monotonic_ns()
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(COLD_START_TAG)]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        raise RuntimeError(f"the cold-start child failed (exit {proc.returncode}): {tail[0]}")
    return {**json.loads(lines[-1][len(COLD_START_TAG):]), "spawn_ns": spawn, "exit_ns": exit_ns}
