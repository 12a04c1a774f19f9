"""Property: any request to `llmlab serve` gets a 2xx or a 4xx, never a 5xx, and the next normal request
still succeeds. Hypothesis builds request bodies over the fields of the request models (right and wrong
types, edge values, unknown keys, raw JSON text with NaN and deep nesting) and sends them over HTTP to a
real server; the examples are bounded so the file stays within ~30 s on 2 cores."""

from __future__ import annotations

import json

import httpx
import pytest
from conftest import start_serve, stop_serve
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llmlab.serving.server.protocol import ChatRequest, CompletionRequest

KV_BLOCKS = 16  # a 256-token context: a generated request that runs is short
EXAMPLES = 120

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 40), st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True), st.floats(-3, 3), st.text(max_size=12),
    st.sampled_from(["", "\ud800", "\x00", "tiny", "gpt-4", "yes", "5", "NaN", "\n"]),
)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=12,
)
TYPED = {  # each field with a value of its own type, edge values included
    "model": st.sampled_from(["tiny", "gpt-4"]),
    "temperature": st.sampled_from([0.0, 1e-40, 0.7, 2.0]),
    "top_p": st.floats(1e-9, 1.0),
    "top_k": st.integers(-1, 50),
    "min_p": st.floats(0.0, 1.0),
    "seed": st.integers(-(2**63), 2**63 - 1),
    "stop": st.one_of(st.text(max_size=3), st.lists(st.text(max_size=3), max_size=3)),
    "stream": st.booleans(),
    "stream_options": st.fixed_dictionaries({}, optional={"include_usage": st.booleans()}),
    "ignore_eos": st.booleans(),
    "n": st.just(1),
    "return_tokens_as_token_ids": st.booleans(),
    "logit_bias": st.dictionaries(st.integers(0, 4095).map(str), st.floats(-100, 100), max_size=3),
    "frequency_penalty": st.floats(-2, 2),
    "presence_penalty": st.floats(-2, 2),
    "repetition_penalty": st.floats(0.5, 2),
    "min_tokens": st.integers(0, 6),
    "stop_token_ids": st.lists(st.integers(0, 4095), max_size=3),
    "user": st.text(max_size=5),
}
SHORT = {"max_tokens": st.integers(1, 6)}  # always given (a mutation may change it): the defaults run up to 256 tokens
completion = st.fixed_dictionaries(
    {"prompt": st.one_of(st.text(max_size=60), st.lists(st.integers(0, 4095), min_size=1, max_size=20)), **SHORT},
    optional={**TYPED, "echo": st.booleans(), "logprobs": st.one_of(st.none(), st.integers(0, 20))},
)
chat = st.fixed_dictionaries(
    {
        "messages": st.lists(
            st.fixed_dictionaries(
                {"role": st.sampled_from(["system", "user", "assistant"]), "content": st.text(max_size=40)}
            ),
            min_size=1,
            max_size=3,
        ),
        **SHORT,
    },
    optional={**TYPED, "logprobs": st.one_of(st.none(), st.booleans()), "top_logprobs": st.integers(0, 20)},
)
ANY_FIELD = sorted(set(CompletionRequest.model_fields) | set(ChatRequest.model_fields) | {"junk", "prompt", "messages"})


def mutated(body: st.SearchStrategy) -> st.SearchStrategy:
    """A well-typed body with up to two fields set to anything at all."""
    return st.tuples(body, st.dictionaries(st.sampled_from(ANY_FIELD), values, max_size=2)).map(
        lambda t: {**t[0], **t[1]}
    )


requests = st.one_of(
    st.tuples(st.just("/v1/completions"), st.one_of(completion, mutated(completion))),
    st.tuples(st.just("/v1/chat/completions"), st.one_of(chat, mutated(chat))),
    st.tuples(st.just("/tokenize"), mutated(st.fixed_dictionaries({"prompt": st.text(max_size=30)}))),
    st.tuples(
        st.just("/detokenize"), mutated(st.fixed_dictionaries({"tokens": st.lists(st.integers(-1, 5000), max_size=8)}))
    ),
)
routes = st.sampled_from(["/v1/completions", "/v1/chat/completions", "/tokenize", "/detokenize"])
raw_text = st.sampled_from(['{"prompt": "a", "temperature": NaN}', '{"prompt": ' + "[" * 5000 + "]" * 5000 + "}",
                            '{"prompt": "\\udc00"}', "", "null", "{", '{"prompt": "a"}' * 2, "\xff"])


@pytest.fixture(scope="module")
def server():
    base, proc = start_serve("--max-num-seqs", "8", "--kv-blocks", str(KV_BLOCKS))
    with httpx.Client(base_url=base, timeout=60) as client:
        yield client
    stop_serve(proc)


def send(client: httpx.Client, route: str, content: str) -> int:
    with client.stream("POST", route, content=content.encode("utf-8", "surrogatepass"),
                       headers={"content-type": "application/json"}) as r:
        r.read()  # a stream too, to its end: a fault mid-stream would show as an error event, checked below
        if r.headers.get("content-type", "").startswith("text/event-stream"):
            assert '"server_error"' not in r.text, r.text[-500:]
        return r.status_code


def normal_request_succeeds(client: httpx.Client) -> None:
    r = client.post("/v1/completions", json={"prompt": "x = 1", "max_tokens": 1, "temperature": 0})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 1, r.text


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(request=requests)
def test_any_json_request_is_answered_without_a_5xx(server, request):
    route, body = request
    status = send(server, route, json.dumps(body))
    assert 200 <= status < 300 or 400 <= status < 500, (status, route, body)
    normal_request_succeeds(server)


@settings(
    max_examples=len(raw_text.elements) * 2,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(route=routes, raw=raw_text)
def test_any_raw_body_is_answered_without_a_5xx(server, route, raw):
    assert 400 <= send(server, route, raw) < 500
    normal_request_succeeds(server)
