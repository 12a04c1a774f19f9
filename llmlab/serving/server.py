"""`llmlab serve`: an OpenAI-compatible HTTP server over the engine (FastAPI + uvicorn, SSE).

Reading order: `AsyncEngine` (the engine steps in a background thread; requests go in through a
queue, tokens come back to each request's asyncio.Queue) -> `Metrics` (Prometheus, vLLM's names and
buckets) -> `create_app` (routes) -> `serve` (load, check exact, run uvicorn).

Routes: POST /v1/completions, POST /v1/chat/completions (stream true/false; SSE chunks ending in
`data: [DONE]`; stream_options.include_usage; max_tokens, temperature, top_p, top_k, min_p, seed,
stop, and vLLM's ignore_eos), GET /v1/models, GET /health, GET /metrics, and GET /v1/engine/stats
(llmlab's own: counters and the recent step records, what the tests and labs read), and vLLM's
POST /tokenize and /detokenize (what the ttft lab's --endpoint uses for prompts of an exact length).

One SSE chunk per generated token (so a client's chunk count equals the token count here; the
usage block says so anyway). The final chunk (and a non-streamed response) carries `timings`
shaped after llama.cpp's server (`prompt_n` tokens computed, `cache_n` prefix-cache hits,
`prompt_ms` scheduled -> first token, `predicted_n`, `predicted_ms` first token -> finished,
per-token and per-second figures) plus `queue_ms` (arrival -> scheduled).

Errors are OpenAI-shaped ({"error": {"message", "type", "param", "code"}}): 400 for malformed JSON
and bad values (max_tokens < 1 or beyond the context, a prompt longer than the context, negative
temperature), 404 for an unknown model, 422 for fields of the wrong type. A client that
disconnects mid-stream aborts its sequence: its blocks go back to the pool at the next step.

References:
- OpenAI API reference: completions, chat completions, streaming (`stream_options.include_usage`).
- vLLM `entrypoints/openai/api_server.py`, `v1/metrics/loggers.py` (metric names and buckets).
- llama.cpp `tools/server/README.md` (`timings`).
"""

from __future__ import annotations

import asyncio
import json
import queue
import threading
import time
import uuid
from collections import deque
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, ValidationError
from starlette.requests import ClientDisconnect

if TYPE_CHECKING:  # torch loads with the engine: `llmlab serve` checks its port before paying for that
    from llmlab.serving.engine import Engine
    from llmlab.serving.scheduler import RequestParams, Sequence

now_ns = time.perf_counter_ns

# vLLM's buckets (v1/metrics/loggers.py), in seconds
TTFT_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0]
ITL_BUCKETS = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0]
REQUEST_BUCKETS = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0]


class APIError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, type_: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.param, self.type = status, message, param, type_


# ---------------------------------------------------------------- metrics


class Metrics:
    """Prometheus metrics in a registry of their own (several apps can live in one process)."""

    def __init__(self):
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = r = CollectorRegistry()
        h = lambda name, doc, buckets: Histogram(f"llmlab:{name}", doc, buckets=buckets, registry=r)  # noqa: E731
        self.ttft = h("time_to_first_token_seconds", "Arrival to first token.", TTFT_BUCKETS)
        self.queue = h("request_queue_time_seconds", "Arrival to scheduled (time in the waiting queue).", REQUEST_BUCKETS)
        self.prefill = h("request_prefill_time_seconds", "Scheduled to first token.", REQUEST_BUCKETS)
        self.decode = h("request_decode_time_seconds", "First token to finished.", REQUEST_BUCKETS)
        self.itl = h("inter_token_latency_seconds", "Gap between consecutive tokens of a request.", ITL_BUCKETS)
        self.e2e = h("e2e_request_latency_seconds", "Arrival to finished.", REQUEST_BUCKETS)
        self.running = Gauge("llmlab:num_requests_running", "Requests in the running batch.", registry=r)
        self.waiting = Gauge("llmlab:num_requests_waiting", "Requests waiting to be scheduled.", registry=r)
        self.kv_usage = Gauge("llmlab:kv_cache_usage_perc", "Fraction of KV blocks in use (1 = full).", registry=r)
        self.prefix_queries = Counter("llmlab:prefix_cache_queries", "Prompt tokens looked up in the prefix cache.", registry=r)
        self.prefix_hits = Counter("llmlab:prefix_cache_hits", "Prompt tokens found in the prefix cache.", registry=r)
        self.preemptions = Counter("llmlab:num_preemptions", "Sequences preempted (blocks freed, recomputed later).", registry=r)
        self.prompt_tokens = Counter("llmlab:prompt_tokens", "Prompt tokens of finished requests.", registry=r)
        self.generation_tokens = Counter("llmlab:generation_tokens", "Generated tokens.", registry=r)
        self.success = Counter("llmlab:request_success", "Finished requests by reason.", ["finished_reason"], registry=r)

    def finished(self, s: Sequence) -> None:
        if s.first_token_ns:
            self.ttft.observe((s.first_token_ns - s.arrival_ns) / 1e9)
            self.prefill.observe((s.first_token_ns - s.scheduled_ns) / 1e9)
            self.decode.observe((s.finished_ns - s.first_token_ns) / 1e9)
        if s.scheduled_ns:
            self.queue.observe((s.scheduled_ns - s.arrival_ns) / 1e9)
        self.e2e.observe((s.finished_ns - s.arrival_ns) / 1e9)
        self.prompt_tokens.inc(len(s.prompt_ids))
        self.success.labels(s.finish_reason or "abort").inc()


def timings(s: Sequence, end_ns: int | None = None) -> dict:
    """llama.cpp-style timings of one request (+ queue_ms), from the engine's stamps."""
    end = s.finished_ns or end_ns or now_ns()
    cache_n = max(s.num_cached_prompt, 0)
    prompt_n = len(s.prompt_ids) - cache_n
    prompt_ms = (s.first_token_ns - s.scheduled_ns) / 1e6 if s.first_token_ns else 0.0
    predicted_n = len(s.output_ids)
    predicted_ms = (end - s.first_token_ns) / 1e6 if s.first_token_ns else 0.0
    return {
        "queue_ms": (s.scheduled_ns - s.arrival_ns) / 1e6 if s.scheduled_ns else 0.0,
        "cache_n": cache_n, "prompt_n": prompt_n, "prompt_ms": prompt_ms,
        "prompt_per_token_ms": prompt_ms / prompt_n if prompt_n else 0.0,
        "prompt_per_second": 1e3 * prompt_n / prompt_ms if prompt_ms else 0.0,
        "predicted_n": predicted_n, "predicted_ms": predicted_ms,
        "predicted_per_token_ms": predicted_ms / (predicted_n - 1) if predicted_n > 1 else 0.0,
        "predicted_per_second": 1e3 * (predicted_n - 1) / predicted_ms if predicted_ms else 0.0,
    }


# ---------------------------------------------------------------- the engine in a thread


@dataclass(eq=False)
class Handle:
    """One request as the HTTP side sees it."""

    prompt_ids: list[int]
    params: RequestParams
    arrival_ns: int
    tokenized_ns: int
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue = field(default_factory=asyncio.Queue)  # token ids, then None when finished
    seq: Sequence | None = None


class AsyncEngine:
    """Steps the engine in a background thread; add/abort go through a queue the thread drains between steps."""

    def __init__(self, engine: Engine, metrics: Metrics):
        self.engine, self.metrics = engine, metrics
        self.inbox: queue.SimpleQueue = queue.SimpleQueue()
        self.wake = threading.Event()
        self.stop = threading.Event()
        self.handles: dict[int, Handle] = {}
        self.recent_steps: deque = deque(maxlen=512)
        self.max_seqs_in_step = 0
        self.error: str | None = None
        self.thread = threading.Thread(target=self._loop, name="llmlab-engine", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def shutdown(self) -> None:
        self.stop.set()
        self.wake.set()
        self.thread.join(timeout=10)

    def submit(self, h: Handle) -> None:
        self.inbox.put(("add", h))
        self.wake.set()

    def abort(self, h: Handle) -> None:
        self.inbox.put(("abort", h))
        self.wake.set()

    def _drain(self) -> None:
        while True:
            try:
                op, h = self.inbox.get_nowait()
            except queue.Empty:
                return
            if op == "add":
                h.seq = self.engine.add_request(h.prompt_ids, h.params, h.arrival_ns, h.tokenized_ns)
                self.handles[h.seq.seq_id] = h
            elif h.seq is not None and self.handles.pop(h.seq.seq_id, None) is not None:
                self.engine.abort(h.seq)
                self.metrics.finished(h.seq)

    def _loop(self) -> None:
        m = self.metrics
        q0 = h0 = p0 = 0
        while not self.stop.is_set():
            self._drain()
            if not self.engine.has_work():
                self.wake.wait(0.05)
                self.wake.clear()
                continue
            try:
                out = self.engine.step()
            except Exception as exc:  # a bug must not leave clients waiting forever
                self.error = f"{type(exc).__name__}: {exc}"
                for h in list(self.handles.values()):
                    self.engine.abort(h.seq)
                    h.loop.call_soon_threadsafe(h.events.put_nowait, None)
                self.handles.clear()
                continue
            if out is None:
                continue
            self.recent_steps.append(asdict(out.record))
            self.max_seqs_in_step = max(self.max_seqs_in_step, out.record.num_seqs)
            sends: list[tuple[Handle, Any]] = []
            for seq, tok in out.tokens:
                h = self.handles.get(seq.seq_id)
                if h is None:
                    continue
                if len(seq.token_ns) > 1:
                    m.itl.observe((seq.token_ns[-1] - seq.token_ns[-2]) / 1e9)
                sends.append((h, tok))
            m.generation_tokens.inc(len(out.tokens))
            for seq in out.finished:
                h = self.handles.pop(seq.seq_id, None)
                if h is not None:
                    m.finished(seq)
                    sends.append((h, None))
            sc = self.engine.scheduler
            m.prefix_queries.inc(sc.prefix_queries - q0)
            m.prefix_hits.inc(sc.prefix_hits - h0)
            m.preemptions.inc(sc.num_preemptions - p0)
            q0, h0, p0 = sc.prefix_queries, sc.prefix_hits, sc.num_preemptions
            m.running.set(len(sc.running))
            m.waiting.set(len(sc.waiting))
            m.kv_usage.set(self.engine.blocks.num_used / self.engine.blocks.num_blocks)
            if sends:
                loop = sends[0][0].loop
                loop.call_soon_threadsafe(lambda s=sends: [h.events.put_nowait(x) for h, x in s])
        m.running.set(0)

    def stats(self) -> dict:
        e, sc = self.engine, self.engine.scheduler
        for _ in range(3):
            try:
                steps = list(self.recent_steps)
                break
            except RuntimeError:  # appended to while copied
                steps = []
        return {
            "num_steps": e.num_steps, "num_blocks": e.blocks.num_blocks, "block_size": e.cfg.block_size,
            "blocks_in_use": e.blocks.num_used, "running": len(sc.running), "waiting": len(sc.waiting),
            "num_preemptions": sc.num_preemptions, "prefix_cache_queries": sc.prefix_queries, "prefix_cache_hits": sc.prefix_hits,
            "max_seqs_in_a_step": self.max_seqs_in_step, "max_model_len": e.max_model_len, "error": self.error,
            "recent_steps": steps,
        }


# ---------------------------------------------------------------- request parsing


class StreamOptions(BaseModel):
    include_usage: bool = False


class CommonRequest(BaseModel):
    model_config = ConfigDict(extra="allow")
    model: str | None = None
    max_tokens: int | None = None
    temperature: float = 1.0  # OpenAI's default
    top_p: float = 1.0
    top_k: int = 0  # 0 (or vLLM's -1) = off
    min_p: float = 0.0
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    ignore_eos: bool = False  # vLLM's extension: generate exactly max_tokens
    n: int = 1


class CompletionRequest(CommonRequest):
    prompt: str | list[int] | list[str]


class Message(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: str
    content: str | None = ""


class ChatRequest(CommonRequest):
    messages: list[Message]
    max_completion_tokens: int | None = None


class TokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="allow")
    model: str | None = None
    prompt: str
    n: int = 1


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="allow")
    model: str | None = None
    tokens: list[int]
    n: int = 1


def render_messages(tokenizer, messages: list[dict]) -> str:
    """The tokenizer's chat template when it has one; else llmlab's plain one (ttft lab's render_chat)."""
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    from llmlab.inference.serving import render_chat

    system = "\n".join(m["content"] or "" for m in messages if m["role"] == "system")
    turns = [m for m in messages if m["role"] != "system"]
    history = "".join(f"{m['role']}: {m['content'] or ''}\n" for m in turns[:-1])
    return render_chat(tokenizer, system, history + (turns[-1]["content"] or "" if turns else ""))[0]


# ---------------------------------------------------------------- the app


def create_app(engine: Engine, tokenizer, model_name: str):
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

    from llmlab.serving.scheduler import RequestParams

    metrics = Metrics()
    aeng = AsyncEngine(engine, metrics)
    tokenizer.model_max_length = 2**62  # /tokenize may count a text longer than the context; completions check it themselves
    eos_ids = engine.eos_ids

    @asynccontextmanager
    async def lifespan(app):
        aeng.start()
        yield
        aeng.shutdown()

    app = FastAPI(title="llmlab serve", lifespan=lifespan)
    app.state.engine, app.state.metrics = aeng, metrics

    @app.exception_handler(APIError)
    async def api_error(_req, exc: APIError):
        return JSONResponse({"error": {"message": exc.message, "type": exc.type, "param": exc.param, "code": exc.status}}, status_code=exc.status)

    def fail(status, message, param=None):
        raise APIError(status, message, param)

    async def parse(request, schema):
        try:
            body = json.loads(await request.body())
        except ClientDisconnect:  # gone before its body arrived (a client timeout): nothing to serve, nothing to log
            raise APIError(499, "client closed the request", type_="client_closed_request") from None
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            fail(400, f"malformed JSON body: {exc}")
        if not isinstance(body, dict):
            fail(400, "the JSON body must be an object")
        try:
            req = schema.model_validate(body)
        except ValidationError as exc:
            e = exc.errors()[0]
            raise APIError(422, f"{'.'.join(map(str, e['loc']))}: {e['msg']}", str(e["loc"][0]), "validation_error") from None
        if req.model is not None and req.model != model_name:
            raise APIError(404, f"The model `{req.model}` does not exist (this server serves `{model_name}`).", "model", "NotFoundError")
        if req.n != 1:
            fail(400, "only n=1 is supported", "n")
        return req

    def make_params(req, n_prompt: int, max_tokens: int | None) -> RequestParams:
        if max_tokens is None:
            max_tokens = 16 if isinstance(req, CompletionRequest) else max(1, min(256, engine.max_model_len - n_prompt))  # OpenAI: 16 for completions
        try:
            params = RequestParams(max_tokens=max_tokens, temperature=req.temperature, top_p=req.top_p, top_k=max(req.top_k, 0),
                                   min_p=req.min_p, seed=req.seed, ignore_eos=req.ignore_eos)
            engine.check_request(n_prompt, params)
        except ValueError as exc:
            fail(400, str(exc))
        return params

    def tokenize(text: str) -> list[int]:
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    async def run(request, req, prompt_ids, params, arrival, chat: bool):
        h = Handle(prompt_ids, params, arrival, now_ns(), asyncio.get_running_loop())
        aeng.submit(h)
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        created = int(time.time())
        stops = [req.stop] if isinstance(req.stop, str) else (req.stop or [])

        async def tokens():
            """Yield (text piece, finish_reason or None) per token; detokenizes incrementally, applies stop strings."""
            out_ids, sent = [], ""
            while True:
                tok = await h.events.get()
                if tok is None:
                    if aeng.error:
                        raise APIError(500, f"engine error: {aeng.error}", type_="server_error")
                    yield "", h.seq.finish_reason
                    return
                if tok not in eos_ids:
                    out_ids.append(tok)
                text = tokenizer.decode(out_ids, skip_special_tokens=True)
                cut = min((i for i in (text.find(s) for s in stops if s) if i >= 0), default=-1)
                if cut >= 0:
                    aeng.abort(h)
                    yield text[len(sent):cut], "stop"
                    return
                piece = "" if text.endswith("\ufffd") else text[len(sent):]
                sent += piece
                yield piece, None

        def usage():
            n_out = len(h.seq.output_ids) if h.seq else 0
            return {"prompt_tokens": len(prompt_ids), "completion_tokens": n_out, "total_tokens": len(prompt_ids) + n_out}

        obj = ("chat.completion" if chat else "text_completion")
        if not req.stream:
            text, reason = "", None
            try:
                async for piece, fin in tokens():
                    text += piece
                    reason = fin or reason
            finally:
                if reason is None:
                    aeng.abort(h)
            choice = {"index": 0, "finish_reason": reason, "logprobs": None}
            choice.update({"message": {"role": "assistant", "content": text}} if chat else {"text": text})
            return JSONResponse({"id": rid, "object": obj, "created": created, "model": model_name, "choices": [choice],
                                 "usage": usage(), "timings": timings(h.seq)})

        include_usage = bool(req.stream_options and req.stream_options.include_usage)

        def chunk(piece: str | None, reason, first=False, **extra) -> str:
            if piece is None:
                choices = []
            elif chat:
                delta = {"role": "assistant", "content": piece} if first else {"content": piece}
                choices = [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason}]
            else:
                choices = [{"index": 0, "text": piece, "logprobs": None, "finish_reason": reason}]
            body = {"id": rid, "object": obj + (".chunk" if chat else ""), "created": created, "model": model_name, "choices": choices, **extra}
            return f"data: {json.dumps(body)}\n\n"

        async def sse():
            done = False
            try:
                # A token goes out as soon as it arrives, unless more is already queued behind it: then it waits
                # for that, so the last token's chunk carries finish_reason (the engine sends a sequence's last
                # token and its end together). Holding every token back one step would add a decode step to TTFT.
                pending = None
                first = True
                async for piece, fin in tokens():
                    if fin is not None:
                        text = (pending or "") + piece
                        extra = {} if include_usage else {"timings": timings(h.seq)}
                        done = True
                        yield chunk(text, fin, first, **extra)
                        break
                    if pending is not None:
                        yield chunk(pending, None, first)
                        first, pending = False, None
                    if h.events.empty():
                        yield chunk(piece, None, first)
                        first = False
                    else:
                        pending = piece
                if include_usage:
                    yield chunk(None, None, usage=usage(), timings=timings(h.seq))
                yield "data: [DONE]\n\n"
            finally:
                if not done:
                    aeng.abort(h)  # the client went away (or an error): free the blocks

        return StreamingResponse(sse(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})

    @app.post("/v1/completions")
    async def completions(request: Request):
        arrival = now_ns()
        req = await parse(request, CompletionRequest)
        prompt = req.prompt
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
            if len(prompt) != 1:
                fail(400, "only one prompt per request is supported", "prompt")
            prompt = prompt[0]
        ids = tokenize(prompt) if isinstance(prompt, str) else list(prompt)
        if any(not 0 <= t < engine.model.config.vocab_size for t in ids):
            fail(400, "prompt token ids out of the vocabulary", "prompt")
        return await run(request, req, ids, make_params(req, len(ids), req.max_tokens), arrival, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        arrival = now_ns()
        req = await parse(request, ChatRequest)
        if not req.messages:
            fail(400, "messages is empty", "messages")
        ids = tokenize(render_messages(tokenizer, [m.model_dump() for m in req.messages]))
        return await run(request, req, ids, make_params(req, len(ids), req.max_completion_tokens or req.max_tokens), arrival, chat=True)

    @app.post("/tokenize")
    async def tokenize_route(request: Request):
        """vLLM's shape: {"model"?, "prompt"} -> {"tokens", "count", "max_model_len"}; the ids a completion of that
        prompt would see (this server adds no special tokens to completions, so neither does this)."""
        req = await parse(request, TokenizeRequest)
        ids = tokenize(req.prompt)
        return {"tokens": ids, "count": len(ids), "max_model_len": engine.max_model_len}

    @app.post("/detokenize")
    async def detokenize_route(request: Request):
        req = await parse(request, DetokenizeRequest)
        if any(not 0 <= t < engine.model.config.vocab_size for t in req.tokens):
            fail(400, "token ids out of the vocabulary", "tokens")
        return {"prompt": tokenizer.decode(req.tokens)}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": model_name, "object": "model", "created": 0, "owned_by": "llmlab",
                                            "max_model_len": engine.max_model_len}]}

    @app.get("/health")
    async def health():
        if aeng.error:
            return JSONResponse({"status": "error", "error": aeng.error}, status_code=500)
        return {"status": "ok"}

    @app.get("/metrics")
    async def prometheus():
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/engine/stats")
    async def stats():
        return aeng.stats()

    return app


# ---------------------------------------------------------------- `llmlab serve`


def serve(model: str = "tiny", host: str = "127.0.0.1", port: int = 8000, device: str = "auto", max_num_seqs: int = 64,
          kv_blocks: int = 1024, prefix_cache: bool = True, max_num_batched_tokens: int = 512, log=print) -> None:
    """Load the model, check the engine exact against HF, then serve until Ctrl-C."""
    import socket

    from llmlab.core.errors import UsageError

    with socket.socket() as sock:  # fail fast, with one line, before loading anything
        try:
            sock.bind((host, port))
        except OSError as exc:
            raise UsageError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    import torch
    import uvicorn

    from llmlab.core.device import resolve_device
    from llmlab.core.models import load
    from llmlab.serving.engine import Engine, EngineConfig, check_exact

    dev = resolve_device(device, None)
    lm = load(model, dev)
    if lm.tokenizer is None:
        raise UsageError(f"{model} has no tokenizer (arch: models have random weights): serve needs a trained model")
    try:
        cfg = EngineConfig(num_blocks=kv_blocks, max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                           enable_prefix_cache=prefix_cache)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    g = torch.Generator().manual_seed(0)
    probe = [torch.randint(1, lm.config.vocab_size, (n,), generator=g).tolist() for n in (7, 21)]
    exact = check_exact(Engine(lm.model, EngineConfig(num_blocks=8, max_num_batched_tokens=16)), probe, max_new_tokens=4)
    engine = Engine(lm.model, cfg, lm.tokenizer.eos_token_id)
    log(f"llmlab serve: {model} on {dev.spec}, {cfg.num_blocks} KV blocks x {cfg.block_size} tokens, max {cfg.max_num_seqs} seqs, "
        f"prefix cache {'on' if prefix_cache else 'off'}, context {engine.max_model_len}; exact vs HF (max |logit diff| "
        f"{exact['max_abs_logit_diff']:.1e}); http://{host}:{port}/v1")
    uvicorn.run(create_app(engine, lm.tokenizer, model), host=host, port=port, log_level="warning", timeout_graceful_shutdown=5)
