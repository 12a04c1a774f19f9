"""The routes: OpenAI's completions and chat completions (streamed or not), models, health, metrics,
llmlab's engine stats and vLLM's tokenize / detokenize.

Rules:
- A request is checked as early as it can be: body size (413) before parsing, strict types and
  ranges (400), the prompt's length before tokenizing where a bound on the tokens already says it
  is too long (no token of this vocabulary covers more than `max_token_chars` characters), then
  the exact count. Tokenizing runs off the event loop, so a long prompt stalls no other stream.
- temperature below 1e-5 is greedy (vLLM's rule): sampling at t -> 0 is greedy decoding, and
  dividing logits by 1e-40 overflows to inf.
- A client that goes away (streamed or not) aborts its sequence: its blocks go back to the pool.
- A request that fails in the engine gets a 500 (or, mid-stream, an `error` event) of its own;
  every other request goes on.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid
from concurrent.futures import Executor
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException

from llmlab.serving.chat import render_chat
from llmlab.serving.server.async_engine import AsyncEngine, Fault, Handle
from llmlab.serving.server.guard import Guard
from llmlab.serving.server.logprobs import Entry, LogprobsFormatter
from llmlab.serving.server.metrics import Metrics, timings
from llmlab.serving.server.protocol import (
    MAX_BODY_BYTES,
    APIError,
    ChatRequest,
    CompletionRequest,
    DetokenizeRequest,
    TokenizeRequest,
    logprobs_wanted,
    parse_json,
    read_body,
    unsupported,
    validate,
)
from llmlab.serving.server.sse import sse_response
from llmlab.serving.server.stops import TextStream

if TYPE_CHECKING:
    from llmlab.serving.engine.llm_engine import Engine

now_ns = time.perf_counter_ns
GREEDY_BELOW = 1e-5  # vLLM's _SAMPLING_EPS
DISCONNECT_POLL_S = 0.25  # how often a non-streamed request checks that its client is still there


def render_messages(tokenizer, messages: list[dict]) -> str:
    """The tokenizer's chat template when it has one; else llmlab's plain one (ttft lab's render_chat)."""
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    system = "\n".join(m["content"] for m in messages if m["role"] in ("system", "developer"))
    turns = [m for m in messages if m["role"] not in ("system", "developer")]
    history = "".join(f"{m['role']}: {m['content']}\n" for m in turns[:-1])
    return render_chat(tokenizer, system, history + (turns[-1]["content"] if turns else ""))[0]


def max_token_chars(tokenizer) -> int:
    """The most characters one token of this vocabulary (added tokens included) can stand for."""
    return max((len(t) for t in tokenizer.get_vocab()), default=1) or 1


class Server:
    """One model's routes over one AsyncEngine."""

    def __init__(self, engine: Engine, tokenizer, model_name: str, executor: Executor | None, max_body_bytes: int):
        self.engine, self.tokenizer, self.model_name = engine, tokenizer, model_name
        self.metrics = Metrics(model_name)
        self.aeng = AsyncEngine(engine, self.metrics, executor)
        self.max_body_bytes = max_body_bytes
        self.max_chars = max_token_chars(tokenizer) * engine.max_model_len
        self.vocab = engine.model.config.vocab_size
        # /tokenize may count a text longer than the context; completions check it themselves
        tokenizer.model_max_length = 2**62

    # ---------------------------------------------------------------- parsing

    async def parse(self, request: Request, schema):
        req = validate(schema, parse_json(await read_body(request, self.max_body_bytes)))
        if req.model is not None and req.model != self.model_name:
            raise APIError(404, f"The model `{req.model}` does not exist (this server serves `{self.model_name}`).",
                           "model", "NotFoundError")
        if schema in (CompletionRequest, ChatRequest) and (field := unsupported(req)) is not None:
            raise APIError(400, f"`{field}` is not supported by this server (only its default value is)", field)
        return req

    async def tokenize(self, text: str, param: str) -> list[int]:
        if len(text) > self.max_chars:  # every token covers at most max_token_chars characters
            raise APIError(400, f"the {param} has {len(text)} characters: more than {self.engine.max_model_len} "
                                f"tokens, this model's context", param)
        ids = await asyncio.to_thread(lambda: self.tokenizer(text, add_special_tokens=False)["input_ids"])
        self.check_length(len(ids), param)
        return ids

    def check_length(self, n: int, param: str) -> None:
        if n >= self.engine.max_model_len:
            raise APIError(
                400, f"the {param} has {n} tokens; this model's context is {self.engine.max_model_len} tokens", param
            )

    def check_ids(self, ids: list[int], param: str) -> None:
        if any(not 0 <= t < self.vocab for t in ids):
            raise APIError(400, f"{param}: token ids out of the vocabulary (0..{self.vocab - 1})", param)

    def logit_bias(self, bias: dict[str, float] | None) -> tuple[tuple[int, float], ...]:
        """OpenAI's {"token id": bias} -> ((id, bias), ...); 400 for a key that is not a token id here."""
        out = []
        for key, value in (bias or {}).items():
            if not (key.isdigit() and int(key) < self.vocab):
                raise APIError(400, f"logit_bias keys are token ids of this vocabulary (0..{self.vocab - 1}), "
                                    f"got {key!r}", "logit_bias")
            out.append((int(key), value))
        return tuple(sorted(out))

    def params(self, req, n_prompt: int, chat: bool):
        # torch comes with the engine: the server's modules import without it
        from llmlab.inference.sampling import SamplingParams
        from llmlab.serving.engine.scheduler import RequestParams

        max_tokens = req.max_completion_tokens or req.max_tokens
        if max_tokens is None:  # OpenAI: 16 for completions; chat: what the context leaves, at most 256
            max_tokens = max(1, min(256, self.engine.max_model_len - n_prompt)) if chat else 16
        temperature = 0.0 if req.temperature < GREEDY_BELOW else req.temperature
        if req.min_tokens and req.min_tokens > max_tokens:
            raise APIError(400, f"min_tokens {req.min_tokens} is more than max_tokens {max_tokens}", "min_tokens")
        self.check_ids(req.stop_token_ids or [], "stop_token_ids")
        try:
            sampling = SamplingParams(
                temperature=temperature, top_k=max(req.top_k, 0), top_p=req.top_p, min_p=req.min_p
            )
            params = RequestParams(
                max_tokens, sampling, seed=req.seed, ignore_eos=req.ignore_eos, logprobs=logprobs_wanted(req),
                stop_token_ids=frozenset(req.stop_token_ids or ()), logit_bias=self.logit_bias(req.logit_bias),
                min_tokens=req.min_tokens or 0, repetition_penalty=req.repetition_penalty or 1.0,
                frequency_penalty=req.frequency_penalty or 0.0, presence_penalty=req.presence_penalty or 0.0,
            )
            self.engine.check_request(n_prompt, params)
        except ValueError as exc:
            raise APIError(400, str(exc)) from None
        return params

    # ---------------------------------------------------------------- one request

    async def pieces(self, h: Handle, stream: TextStream):
        """Yield (text piece, finish_reason or None, logprobs entry or None) per token the client gets, then the
        rest of the text once the sequence ended; raises APIError(500) on a fault."""
        while True:
            ev = await h.events.get()
            if isinstance(ev, Fault):
                raise APIError(500, ev.message, type_="server_error")
            if ev is None:
                yield stream.flush(), h.seq.finish_reason, None
                return
            piece = stream.push(ev)
            # the engine recorded the token's logprobs before it sent the token
            entry = (ev, *h.seq.logprobs[stream.n_tokens - 1]) if h.params.logprobs is not None else None
            yield piece, ("stop" if stream.stopped else None), entry
            if stream.stopped:
                return

    async def run(self, request: Request, req, prompt_ids: list[int], arrival: int, chat: bool, echo: str = ""):
        if not self.aeng.alive:
            raise APIError(503, f"the engine has stopped: {self.aeng.dead}", type_="server_error")
        params = self.params(req, len(prompt_ids), chat)
        stops = [req.stop] if isinstance(req.stop, str) else (req.stop or [])
        choices = []
        # n sequences of one prompt, each a choice; a seed makes choice i what seed + i gives alone
        for i in range(req.n):
            p = params if i == 0 or params.seed is None else dataclasses.replace(params, seed=params.seed + i)
            stream = TextStream(self.tokenizer, stops, self.engine.eos_ids | p.stop_token_ids)
            h = Handle(prompt_ids, p, arrival, now_ns(), asyncio.get_running_loop(), count_at_close=bool(stream.stops))
            lp = None if p.logprobs is None else LogprobsFormatter(
                self.tokenizer, chat, len(echo), as_ids=req.return_tokens_as_token_ids)
            choices.append(Choice(i, h, stream, lp))
        # choices 1..n-1 are added once choice 0's prompt is computed (its blocks shared through the prefix
        # cache); they are on its handle before it is submitted, as the engine thread reads them after
        choices[0].h.followers = [c.h for c in choices[1:]]
        self.aeng.submit(choices[0].h)
        call = Call(self, choices, req, chat, echo)
        return sse_response(call) if req.stream else await call.whole(request)


@dataclass(eq=False)
class Choice:
    """One of a request's n sequences."""

    index: int
    h: Handle
    stream: TextStream
    lp: LogprobsFormatter | None = None  # set when the request asked for logprobs
    reason: str | None = None

    def logprobs(self, entries: list[Entry]) -> dict | None:
        return self.lp.format(entries) if self.lp is not None else None


class Call:
    """One submitted request's answer: the whole response, or (sse.py) its SSE stream. Always closes its handles."""

    def __init__(self, srv: Server, choices: list[Choice], req, chat: bool, echo: str):
        self.srv, self.choices, self.req, self.chat, self.echo = srv, choices, req, chat, echo
        self.rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        self.created = int(time.time())
        self.obj = "chat.completion" if chat else "text_completion"

    def close(self) -> None:
        for c in self.choices:
            self.srv.aeng.close(c.h, c.reason or "abort", c.stream.n_tokens)

    def usage(self) -> dict:
        n_prompt, n_out = len(self.choices[0].h.prompt_ids), sum(c.stream.n_tokens for c in self.choices)
        return {"prompt_tokens": n_prompt, "completion_tokens": n_out, "total_tokens": n_prompt + n_out}

    def timings(self) -> dict:
        """The first sequence's (llama.cpp's shape has one)."""
        c = self.choices[0]
        return timings(c.h.seq, c.stream.n_tokens) if c.h.seq else {}

    async def collect(self, c: Choice) -> tuple[str, list[Entry]]:
        text, entries = self.echo, []
        async for piece, fin, entry in self.srv.pieces(c.h, c.stream):
            text += piece
            entries += [entry] if entry is not None else []
            c.reason = fin or c.reason
        return text, entries

    async def whole(self, request: Request) -> Response:
        """The non-streamed answer; the sequences are aborted as soon as the client is seen gone."""
        task = asyncio.ensure_future(asyncio.gather(*(self.collect(c) for c in self.choices)))
        try:
            while not task.done():
                await asyncio.wait({task}, timeout=DISCONNECT_POLL_S)
                if not task.done() and await request.is_disconnected():
                    task.cancel()
                    return Response(status_code=499)
            texts = task.result()
        finally:
            if not task.done():
                task.cancel()
            self.close()
        choices = []
        for c, (text, entries) in zip(self.choices, texts, strict=True):
            choice = {"index": c.index, "finish_reason": c.reason, "logprobs": c.logprobs(entries)}
            choice.update({"message": {"role": "assistant", "content": text}} if self.chat else {"text": text})
            choices.append(choice)
        return JSONResponse({"id": self.rid, "object": self.obj, "created": self.created, "model": self.srv.model_name,
                             "choices": choices, "usage": self.usage(), "timings": self.timings()})


def add_routes(app: FastAPI, srv: Server) -> None:
    engine, tokenizer = srv.engine, srv.tokenizer

    @app.post("/v1/completions")
    async def completions(request: Request):
        arrival = now_ns()
        req = await srv.parse(request, CompletionRequest)
        prompt = req.prompt
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
            if len(prompt) != 1:
                raise APIError(400, "only one prompt per request is supported", "prompt")
            prompt = prompt[0]
        if isinstance(prompt, str):
            ids = await srv.tokenize(prompt, "prompt")
        else:
            ids = list(prompt)
            srv.check_length(len(ids), "prompt")
            srv.check_ids(ids, "prompt")
        echo = (prompt if isinstance(prompt, str) else tokenizer.decode(ids)) if req.echo else ""
        return await srv.run(request, req, ids, arrival, chat=False, echo=echo)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        arrival = now_ns()
        req = await srv.parse(request, ChatRequest)
        text = render_messages(tokenizer, [{"role": m.role, "content": m.text()} for m in req.messages])
        ids = await srv.tokenize(text, "messages")
        return await srv.run(request, req, ids, arrival, chat=True)

    @app.post("/tokenize")
    async def tokenize_route(request: Request):
        """vLLM's shape: {"model"?, "prompt"} -> {"tokens", "count", "max_model_len"}; the ids a completion of that
        prompt would see (this server adds no special tokens to completions, so neither does this)."""
        req = await srv.parse(request, TokenizeRequest)
        ids = await asyncio.to_thread(lambda: tokenizer(req.prompt, add_special_tokens=False)["input_ids"])
        return {"tokens": ids, "count": len(ids), "max_model_len": engine.max_model_len}

    @app.post("/detokenize")
    async def detokenize_route(request: Request):
        req = await srv.parse(request, DetokenizeRequest)
        srv.check_ids(req.tokens, "tokens")
        return {"prompt": await asyncio.to_thread(tokenizer.decode, req.tokens)}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": srv.model_name, "object": "model", "created": 0, "owned_by": "llmlab",
                                            "max_model_len": engine.max_model_len}]}

    @app.get("/health")
    async def health():
        aeng = srv.aeng
        if not aeng.alive:
            return JSONResponse(
                {"status": "error", "error": aeng.dead or "the engine thread has stopped"}, status_code=503
            )
        if aeng.num_faults:
            return {"status": "ok", "engine_faults": aeng.num_faults, "last_fault": aeng.last_fault}
        return {"status": "ok"}

    @app.get("/metrics")
    async def prometheus():
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return Response(generate_latest(srv.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/engine/stats")
    async def stats():
        return srv.aeng.stats()


def add_error_handlers(app: FastAPI) -> None:
    """Every error in OpenAI's shape, unknown routes and wrong methods included; never a plain-text 500."""

    @app.exception_handler(APIError)
    async def api_error(_req, exc: APIError):
        return JSONResponse(exc.body(), status_code=exc.status)

    @app.exception_handler(HTTPException)
    async def http_error(_req, exc: HTTPException):
        return JSONResponse(
            APIError(exc.status_code, str(exc.detail)).body(), status_code=exc.status_code, headers=exc.headers
        )

    @app.exception_handler(Exception)
    async def server_error(_req, exc: Exception):
        return JSONResponse(
            APIError(500, f"internal error: {type(exc).__name__}", type_="server_error").body(), status_code=500
        )


def create_app(engine: Engine, tokenizer, model_name: str, *, executor: Executor | None = None, host: str = "127.0.0.1",
               api_key: str | None = None, max_body_bytes: int = MAX_BODY_BYTES):
    """The ASGI app: routes behind the Guard (Host, cross-origin, API key). executor: the one thread torch runs on."""
    srv = Server(engine, tokenizer, model_name, executor, max_body_bytes)

    @asynccontextmanager
    async def lifespan(app):
        srv.aeng.start()
        yield
        srv.aeng.shutdown()

    app = FastAPI(title="llmlab serve", lifespan=lifespan)
    app.state.engine, app.state.metrics, app.state.server = srv.aeng, srv.metrics, srv
    add_error_handlers(app)
    add_routes(app, srv)
    app.add_middleware(Guard, bind=host, api_key=api_key)
    return app
