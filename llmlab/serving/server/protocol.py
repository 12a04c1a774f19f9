"""The request side of the OpenAI API: strict request models, the body reader and the error shape.

Rules:
- Types are strict (pydantic strict mode): `"5"` or `true` is not a number, `"yes"` not a boolean,
  NaN and Infinity are refused (in the JSON text and as values); ranges follow OpenAI's
  (temperature [0, 2], top_p (0, 1], penalties [-2, 2]) and torch's seed range (int64).
- A field OpenAI does not define (and llmlab does not take from vLLM) is refused, as OpenAI
  refuses it ("Unrecognized request argument"): no option is ever ignored silently.
- An option llmlab cannot honour (best_of, suffix, tools, response_format) is refused with 400
  naming the field, unless it carries its no-op value (best_of 1). `n` is served: n sequences of
  the prompt (choice i sampled with seed + i when a seed is given); so are logit_bias, the
  frequency, presence and repetition penalties, min_tokens and stop_token_ids (the engine's
  `logits_processors`), and logprobs (completions' `logprobs: k`, chat's `logprobs: true` with
  `top_logprobs: k`, k <= 20), except the prompt's (completions' echo with logprobs: 400).
- The body is capped (413) before it is parsed; JSON nested deeper than Python can parse,
  a lone UTF-16 surrogate or a body that is not an object is a 400.
- Every error has OpenAI's shape: {"error": {"message", "type", "param", "code"}}.
"""

from __future__ import annotations

import json
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

# a whole 128 K-token context is ~0.5-1 MB of text or token ids; 4 MiB leaves room for JSON escapes
MAX_BODY_BYTES = 4 << 20
INT64 = 2**63  # torch.Generator.manual_seed's signed range, as vLLM bounds `seed`
MAX_LOGPROBS = 20  # alternatives per token: OpenAI's chat bound and vLLM's default max_logprobs


class APIError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, type_: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.param, self.type = status, message, param, type_

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.status}}


STRICT = ConfigDict(strict=True, extra="forbid", allow_inf_nan=False)


class StreamOptions(BaseModel):
    model_config = STRICT
    include_usage: bool = False
    continuous_usage_stats: Literal[False] = False  # vLLM's: usage in every chunk is not served


class CommonRequest(BaseModel):
    model_config = STRICT
    model: str | None = None
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    temperature: float = Field(1.0, ge=0.0, le=2.0)  # OpenAI's default and range
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(0, ge=-1)  # 0 (or vLLM's -1) = off
    min_p: float = Field(0.0, ge=0.0, le=1.0)
    seed: int | None = Field(None, ge=-INT64, lt=INT64)
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    ignore_eos: bool = False  # vLLM's extension: generate exactly max_tokens
    return_tokens_as_token_ids: bool = False  # vLLM's: logprobs name tokens "token_id:<id>"
    user: str | None = None  # OpenAI's end-user id: metadata, nothing to honour
    n: int = Field(1, ge=1, le=16)  # sequences of the prompt, one choice each
    logit_bias: dict[str, Annotated[float, Field(ge=-100.0, le=100.0)]] | None = None  # token id (a string) -> bias
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    repetition_penalty: float | None = Field(None, gt=0.0, le=10.0)  # vLLM's
    min_tokens: int | None = Field(None, ge=0)  # vLLM's
    stop_token_ids: list[int] | None = None  # vLLM's


class CompletionRequest(CommonRequest):
    prompt: str | list[int] | list[str]
    echo: bool = False
    logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)  # the sampled token's and the k most likely
    best_of: int | None = Field(None, ge=1)
    suffix: str | None = None


class TextPart(BaseModel):
    model_config = STRICT
    type: Literal["text"]
    text: str


class Message(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart] | None = ""
    name: str | None = None

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(p.text for p in self.content)
        return self.content or ""


class ChatRequest(CommonRequest):
    messages: list[Message] = Field(min_length=1)
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)  # with logprobs: true
    tools: list[dict] | None = None
    tool_choice: Literal["none", "auto"] | None = None
    response_format: dict | None = None


class TokenizeRequest(BaseModel):
    model_config = STRICT
    model: str | None = None
    prompt: str
    add_special_tokens: Literal[False] = False  # completions add none either


class DetokenizeRequest(BaseModel):
    model_config = STRICT
    model: str | None = None
    tokens: list[int]


def unsupported(req: CommonRequest) -> str | None:
    """The first option set to a value this server cannot honour, or None."""
    no_op = {}
    if isinstance(req, CompletionRequest):
        no_op.update(best_of=req.best_of in (None, 1), suffix=not req.suffix)
    if isinstance(req, ChatRequest):
        no_op.update(tools=not req.tools, response_format=req.response_format in (None, {"type": "text"}))
    return next((name for name, ok in no_op.items() if not ok), None)


def logprobs_wanted(req: CommonRequest) -> int | None:
    """The alternatives per token the request asks for (0: only the sampled token's), None for no logprobs;
    APIError(400) for a combination that cannot be served."""
    if isinstance(req, CompletionRequest):
        if req.logprobs is not None and req.echo:
            raise APIError(400, "`logprobs` with `echo` (the prompt's log-probabilities) is not supported by this "
                                "server: drop one of them", "logprobs")
        return req.logprobs
    if isinstance(req, ChatRequest):
        if req.top_logprobs and not req.logprobs:
            raise APIError(400, "`top_logprobs` needs `logprobs: true`", "top_logprobs")
        return (req.top_logprobs or 0) if req.logprobs else None
    return None


async def read_body(request, limit: int = MAX_BODY_BYTES) -> bytes:
    """The raw body, refused with 413 past `limit` bytes (declared or streamed) before it is all read."""
    from starlette.requests import ClientDisconnect

    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise APIError(
            413,
            f"the request body is {int(declared)} bytes; this server takes at most {limit}",
            type_="request_too_large",
        )
    chunks, size = [], 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise APIError(
                    413,
                    f"the request body is over {limit} bytes, the most this server takes",
                    type_="request_too_large",
                )
            chunks.append(chunk)
    except ClientDisconnect:  # gone before its body arrived (a client timeout): nothing to serve, nothing to log
        raise APIError(499, "client closed the request", type_="client_closed_request") from None
    return b"".join(chunks)


def _no_constant(name: str):
    raise ValueError(f"{name} is not a JSON number")


def parse_json(raw: bytes) -> dict:
    """JSON text -> a dict, or APIError(400): malformed, NaN/Infinity, too deep, a lone surrogate, not an object."""
    try:
        body = json.loads(raw, parse_constant=_no_constant)
    except RecursionError:
        raise APIError(400, "the JSON body is nested too deeply") from None
    except (ValueError, UnicodeDecodeError) as exc:  # JSONDecodeError is a ValueError
        raise APIError(400, f"malformed JSON body: {exc}") from None
    if not isinstance(body, dict):
        raise APIError(400, "the JSON body must be an object")
    try:
        json.dumps(body, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise APIError(400, "the JSON body holds a lone UTF-16 surrogate (not valid Unicode text)") from None
    except RecursionError:
        raise APIError(400, "the JSON body is nested too deeply") from None
    return body


def validate(schema: type[BaseModel], body: dict) -> BaseModel:
    """A strict model of the body, or APIError(400) naming the first field at fault."""
    try:
        return schema.model_validate(body)
    except ValidationError as exc:
        e = exc.errors(include_url=False)[0]
        where = ".".join(map(str, e["loc"]))
        if e["type"] == "extra_forbidden":
            raise APIError(400, f"Unrecognized request argument supplied: {where}", where) from None
        raise APIError(400, f"{where}: {e['msg']}", str(e["loc"][0]) if e["loc"] else None) from None
    except RecursionError:
        raise APIError(400, "the JSON body is nested too deeply") from None
