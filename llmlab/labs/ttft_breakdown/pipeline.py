"""One request served in-process and timed phase by phase, and the cold start in a fresh process.

Reading order: `time_request` (one request: retrieval, template + tokenize, prefill, first token, decode
steps) -> `Delayed` / `slowed_forward` (a known delay inside one component, to check that the
breakdown attributes it to its phase) -> `cold_start` (a fresh interpreter: imports, device,
weights, first token).

Every phase has its own start and end stamp (time.perf_counter_ns; the device is synchronised
before a phase that launched GPU work ends), so the phases do not add up to the TTFT by
construction: what they miss is the harness's own overhead, reported as the remainder.

torch, transformers and llmlab.inference are imported inside the functions that use them: `llmlab --help`
imports this package (for its Config), and the cold-start child stamps its own imports of torch and
transformers.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from llmlab.core.device import resolve_device
from llmlab.core.models import arch_config, classify, load_tokenizer
from llmlab.loadgen.metrics import Trace
from llmlab.serving.chat import render_chat

RAG_USER = "Answer from the context below.\n\nContext:\n{context}\n\nQuestion: {question}"
SYSTEM = "You are a helpful assistant for Python questions. Answer briefly."
# The chat questions every scenario asks (cycled), so chat, RAG and the queue serve the same work.
QUESTIONS = (
    "What does the with statement do with __enter__ and __exit__?",
    "How does a for loop use the iterator protocol?",
    "What is the difference between is and == when comparing objects?",
    "How do keyword-only arguments work in a function definition?",
    "What happens when an exception is raised inside a try statement with finally?",
)

now_ns = time.perf_counter_ns


# ---------------------------------------------------------------- one request


@dataclass
class Request:
    user: str  # the user's message (for RAG: the question; retrieval adds the context)
    new_tokens: int = 16  # exactly this many tokens are streamed (EOS ignored, like vLLM's ignore_eos)
    system: str = SYSTEM
    max_prompt_tokens: int | None = None  # keep only the last N prompt tokens (the context limit)
    send_ns: int = 0  # when the client sent it; 0 = "now", set by `time_request`


def time_request(model, tokenizer, device, req: Request, retrieve: Callable[[str], str] | None = None,
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
    tokenizer, "decode" = detokenize). Everything else passes through, so `time_request` sees the same object.
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


# ---------------------------------------------------------------- cold start (runs in a fresh process)

COLD_START_CODE = (
    "import time; t0 = time.monotonic_ns()\n"
    "import torch; t1 = time.monotonic_ns()\n"
    "import transformers; t2 = time.monotonic_ns()\n"
    "from llmlab.labs.ttft_breakdown.pipeline import cold_start_child\n"
    "cold_start_child({'start': t0, 'import_torch': t1, 'import_transformers': t2})\n"
)
COLD_START_TAG = "LLMLAB_COLD_START "


def cold_start_child(stamps: dict[str, int]) -> None:
    """The child of `python -c COLD_START_CODE ref device user new_tokens warm_repeats threads`.

    Stamps (time.monotonic_ns, a system-wide clock the parent shares) each step of a cold start,
    serves the same request once cold and `warm_repeats` times warm, and prints one JSON line.
    """
    import torch
    from transformers import AutoModelForCausalLM

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
    cold = time_request(model, tokenizer, device, req)
    stamps["first_token"] = cold.token_ns[0] + mono_minus_perf
    warm = [time_request(model, tokenizer, device, Request(user, new_tokens=new_tokens)) for _ in range(warm_repeats)]
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
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[3])  # so the child imports this very tree
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("TRANSFORMERS_VERBOSITY", "error")
    cmd = [sys.executable, "-c", COLD_START_CODE, ref, device_spec, user, str(new_tokens), str(warm_repeats),
           str(threads)]
    spawn = time.monotonic_ns()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env)
    exit_ns = time.monotonic_ns()
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(COLD_START_TAG)]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        raise RuntimeError(f"the cold-start child failed (exit {proc.returncode}): {tail[0]}")
    return {**json.loads(lines[-1][len(COLD_START_TAG):]), "spawn_ns": spawn, "exit_ns": exit_ns}
