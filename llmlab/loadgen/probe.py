"""Measure an OpenAI-compatible server from the outside: what it reports, prompts of an exact token
count, and its own phases joined to each request.

Reading order: `discover` (GET /v1/models, then what the server offers: /tokenize, `timings` in the
final chunk, vLLM-style histograms on /metrics; and that it streams at all) -> `Prompts` (exact token
counts through /tokenize, else text calibrated from `usage.prompt_tokens`) -> `scrape` / `metric_delta`
(histogram sums around a request run alone) -> `alone` (one request, its record and its server-side
phases) -> `waterfall` (TTFT cut into client + network, server queue, prefill; and the first decode).

Where the phases come from, best first:
- `timings` in the final chunk (llmlab serve: `queue_ms`, `prompt_ms` = scheduled -> first token,
  `cache_n`; llama.cpp: `prompt_ms`, `cache_n`, no queue): one request's own numbers;
- the deltas of vLLM-style histograms (`<prefix>:request_queue_time_seconds`, `..._prefill_...`,
  `..._decode_...`, `time_to_first_token_seconds`; prefix `vllm` or `llmlab`) around a request run
  alone: their `_count` must move by exactly one, else the delta is someone else's too and is dropped;
- nothing: the phase reads "not reported" (None), never a guess.

Prompts: every prompt starts in a way unique to the run and the request, so a server's prefix cache
cannot serve one request from another's blocks (the prefix probe repeats a prefix on purpose). With
/tokenize (vLLM: {"model", "prompt"}; llama.cpp: {"content"}) the prompt is sent as token ids,
exactly T of them; without it, as text whose length is calibrated from the server's usage, and the
record keeps the count the server reports.

The API key goes into the Authorization header only (client.api_headers): never into a card, a
record or an error message.
"""

from __future__ import annotations

import asyncio
import math
import os
from dataclasses import dataclass, field

from llmlab.core.errors import UsageError
from llmlab.loadgen.client import RequestRecord, api_headers, stream_completion

HISTOGRAMS = {"queue": "request_queue_time_seconds", "prefill": "request_prefill_time_seconds",
              "decode": "request_decode_time_seconds", "server_ttft": "time_to_first_token_seconds"}
PREFIX_COUNTERS = ("prefix_cache_queries_total", "prefix_cache_hits_total")


@dataclass
class Server:
    """What `discover` found; `card()` is what a result may keep (no key, no headers)."""

    base: str  # scheme://host:port (a trailing /v1 removed)
    model: str
    max_model_len: int | None
    tokenize: str  # "vllm" | "llama.cpp" | "": how /tokenize answers, if it does
    metrics_prefix: str  # "vllm" | "llmlab" | "": vLLM-style histograms on /metrics
    timings: bool  # the final chunk carried llama.cpp-style `timings`
    usage: bool  # the final chunk carried `usage` (stream_options.include_usage)
    notes: list[str] = field(default_factory=list)
    headers: dict = field(default_factory=dict, repr=False)

    @property
    def completions(self) -> str:
        return self.base + "/v1/completions"

    def card(self) -> dict:
        return {"endpoint": self.base, "model": self.model, "max_model_len": self.max_model_len,
                "tokenize": self.tokenize or "no",
                "metrics": f"{self.metrics_prefix}:* histograms" if self.metrics_prefix else "no",
                "timings": "yes" if self.timings else "no", "usage": "yes" if self.usage else "no"}


def base_url(endpoint: str) -> str:
    if not endpoint.startswith(("http://", "https://")):
        raise UsageError(f"--endpoint {endpoint!r}: give an http(s) URL, e.g. http://127.0.0.1:8000")
    base = endpoint.rstrip("/")
    return base[:-3] if base.endswith("/v1") else base


def check_reachable(endpoint: str) -> None:
    """Fail fast (UsageError, exit 2) when the URL is not http(s) or nothing answers there."""
    import httpx

    base = base_url(endpoint)
    try:
        httpx.get(base + "/v1/models", timeout=5)
    except httpx.HTTPError as exc:
        raise UsageError(f"--endpoint {base}: not reachable ({type(exc).__name__}: {_clip(exc)})") from None


def discover(endpoint: str, model: str | None, api_key_env: str | None, timeout_s: float = 10.0) -> Server:
    """Ask the server what it is and what it reports. Raises UsageError (exit 2) when it is unreachable,
    not OpenAI-compatible, refuses the key, or does not stream."""
    import httpx

    base = base_url(endpoint)
    headers = api_headers(api_key_env)
    with httpx.Client(timeout=httpx.Timeout(timeout_s), headers=headers) as c:
        try:
            r = c.get(base + "/v1/models")
        except httpx.HTTPError as exc:
            raise UsageError(f"--endpoint {base}: not reachable ({type(exc).__name__}: {_clip(exc)})") from None
        if r.status_code in (401, 403):
            raise UsageError(f"--endpoint {base}: HTTP {r.status_code}, the key was refused "
                             f"(the key is read from the environment variable --api-key-env names: {api_key_env})")
        if r.status_code != 200:
            raise UsageError(f"--endpoint {base}: GET /v1/models answered HTTP {r.status_code}: "
                             "not an OpenAI-compatible server")
        try:
            data = r.json()["data"]
            ids = [m["id"] for m in data]
        except (ValueError, KeyError, TypeError):
            raise UsageError(f"--endpoint {base}: GET /v1/models did not answer an OpenAI model list") from None
        if not ids:
            raise UsageError(f"--endpoint {base}: the server lists no model")
        notes = []
        name = model if model in ids else ids[0]
        if model and model not in ids:
            notes.append(f"the server does not serve {model!r}: measuring {name!r}, its first model")
        entry = data[ids.index(name)]
        ctx = entry.get("max_model_len") or _llamacpp_ctx(c, base)
        srv = Server(base, name, int(ctx) if ctx else None, _tokenize_kind(c, base, name), _metrics_prefix(c, base),
                     False, False, notes, headers)
    _check_streams(srv, timeout_s)
    return srv


def _clip(exc) -> str:
    return str(exc)[:160] or "no detail"


def _llamacpp_ctx(c, base: str) -> int | None:
    try:
        r = c.get(base + "/props")
        return int(r.json()["default_generation_settings"]["n_ctx"]) if r.status_code == 200 else None
    except Exception:  # any shape: the context is simply unknown
        return None


def _tokenize_kind(c, base: str, model: str) -> str:
    for kind, body in (("vllm", {"model": model, "prompt": "Hello world"}), ("llama.cpp", {"content": "Hello world"})):
        try:
            r = c.post(base + "/tokenize", json=body)
            if r.status_code == 200 and isinstance(r.json().get("tokens"), list) and r.json()["tokens"]:
                return kind
        except Exception:  # a route that is missing or answers otherwise: try the next shape
            continue
    return ""


def _metrics_prefix(c, base: str) -> str:
    try:
        r = c.get(base + "/metrics")
    except Exception:  # no /metrics: no server-side histograms
        return ""
    if r.status_code != 200:
        return ""
    for prefix in ("vllm", "llmlab"):
        if f"{prefix}:{HISTOGRAMS['prefill']}_count" in r.text:
            return prefix
    return ""


def _check_streams(srv: Server, timeout_s: float) -> None:
    """One 2-token streamed request: SSE must come back (and it says whether usage and timings do)."""
    import httpx

    body = {"model": srv.model, "prompt": "Hello", "max_tokens": 2, "stream": True,
            "stream_options": {"include_usage": True}}
    try:
        with httpx.Client(timeout=httpx.Timeout(max(timeout_s, 30.0)), headers=srv.headers) as c, \
                c.stream("POST", srv.completions, json=body) as r:
            if r.status_code in (404, 405):
                raise UsageError(f"--endpoint {srv.base}: POST /v1/completions answered HTTP {r.status_code}: "
                                 "not an OpenAI-compatible server")
            if r.status_code in (401, 403):
                raise UsageError(f"--endpoint {srv.base}: HTTP {r.status_code} on /v1/completions, the key was refused")
            if r.status_code != 200:
                srv.notes.append(f"the streaming probe failed with HTTP {r.status_code}: "
                                 "requests will show their errors")
                return
            kind = r.headers.get("content-type", "")
            lines = [line for line in r.iter_lines() if line.startswith("data:")]
    except httpx.HTTPError as exc:
        why = f"{type(exc).__name__}: {_clip(exc)}"
        raise UsageError(f"--endpoint {srv.base}: the streaming probe failed ({why})") from None
    if "text/event-stream" not in kind or not lines:
        raise UsageError(f"--endpoint {srv.base}: the server does not stream (stream: true answered "
                         f"{kind or 'no content type'}, no SSE data lines); TTFT needs a streaming server")
    srv.usage = any('"usage"' in line and '"completion_tokens"' in line for line in lines)
    srv.timings = any('"timings"' in line and '"prompt_ms"' in line for line in lines)


# ---------------------------------------------------------------- prompts


class Prompts:
    """Prompts of T tokens, each starting its own way, so no request hits another's cached prefix.

    Exact (the server has /tokenize): token ids = the server's special prefix (BOS, if it adds one), the
    run's tag, then corpus tokens from an offset of the request's own, then the tail: three /tokenize
    calls per run (plus one per distinct tail), none per request. Text: "[tag-k] " + corpus text + tail,
    its length in characters set by the chars per token the server's usage last reported."""

    STRIDE = 7919  # corpus tokens between two requests' starting offsets (a prime: no short cycle)

    def __init__(self, srv: Server, corpus: str, run_tag: str):
        self.srv, self.corpus, self.run_tag, self.n = srv, corpus, run_tag, 0
        self.exact = bool(srv.tokenize)
        self.chars_per_token = 4.0  # a first guess for text prompts, calibrated by `calibrate`
        self._ids: list[int] | None = None
        self._special: list[int] = []
        self._tag: list[int] = []
        self._tails: dict[str, list[int]] = {}

    def salt(self) -> int:
        self.n += 1
        return self.n

    async def _tokenize(self, client, text: str) -> list[int]:
        body = {"model": self.srv.model, "prompt": text} if self.srv.tokenize == "vllm" else {"content": text}
        r = await client.post(self.srv.base + "/tokenize", json=body)
        r.raise_for_status()
        return list(r.json()["tokens"])

    async def make(self, client, n_tokens: int, salt: int | None = None, tail: str = "") -> dict:
        """A completions `prompt` of n_tokens tokens (ids when exact, else text). Two prompts with the same
        salt and length share everything but their tails (the prefix probe)."""
        k = salt or self.salt()
        if not self.exact:
            head = f"[{self.run_tag}-{k}] "
            chars = max(int(round(n_tokens * self.chars_per_token)) - len(head) - len(tail), 0)
            text = self.corpus * (1 + chars // max(len(self.corpus), 1))
            return {"prompt": head + text[:chars] + tail, "target": n_tokens}
        if self._ids is None:
            self._special = await self._tokenize(client, "")  # what the server adds to any prompt (BOS)
            cut = len(self._special)
            self._ids = (await self._tokenize(client, self.corpus))[cut:]
            self._tag = (await self._tokenize(client, f"[{self.run_tag}] "))[cut:]
        if tail and tail not in self._tails:
            self._tails[tail] = (await self._tokenize(client, tail))[len(self._special):]
        end = self._tails.get(tail, [])
        fill = max(n_tokens - len(self._special) - len(self._tag) - len(end), 0)
        off = (k * self.STRIDE) % max(len(self._ids), 1)
        ids = (self._ids * (2 + fill // max(len(self._ids), 1)))[off:off + fill]
        return {"prompt": self._special + self._tag + ids + end, "target": n_tokens}

    def calibrate(self, sent: dict, rec: RequestRecord) -> None:
        """Text prompts: set chars per token to what the server counted for this one."""
        if self.exact or not rec.prompt_tokens or not isinstance(sent["prompt"], str):
            return
        self.chars_per_token = len(sent["prompt"]) / rec.prompt_tokens

def corpus_text(min_chars: int) -> str:
    """The built-in English help topics (real text), repeated to at least min_chars characters."""
    from llmlab.inference.retrieval import builtin_passages

    text = "\n\n".join(builtin_passages())
    return ((text + "\n\n") * (1 + min_chars // max(len(text), 1)))[:min_chars]


def run_tag(seed: int) -> str:
    """A short tag unique to this run (so a second run does not hit the first one's cached prefixes)."""
    return f"{seed}{os.urandom(3).hex()}"


# ---------------------------------------------------------------- /metrics deltas


async def scrape(client, srv: Server) -> dict[str, float] | None:
    """Sample name -> value summed over label sets, for the histograms and counters `metric_delta` reads."""
    if not srv.metrics_prefix:
        return None
    from prometheus_client.parser import text_string_to_metric_families

    try:
        text = (await client.get(srv.base + "/metrics")).text
    except Exception:  # a scrape that fails leaves this request's server phases "not reported"
        return None
    p = srv.metrics_prefix + ":"
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name.startswith(p) and (s.name.endswith(("_sum", "_count")) or s.name.endswith(PREFIX_COUNTERS)):
                out[s.name] = out.get(s.name, 0.0) + s.value
    return out


def metric_delta(before: dict | None, after: dict | None, prefix: str) -> dict | None:
    """Server phases of the one request that ran between two scrapes, in ms; None unless exactly one request
    finished."""
    if not before or not after:
        return None
    p = prefix + ":"
    count = p + HISTOGRAMS["prefill"] + "_count"
    if round(after.get(count, 0) - before.get(count, 0)) != 1:
        return None
    out = {}
    for key, name in HISTOGRAMS.items():
        n = after.get(f"{p}{name}_count", 0) - before.get(f"{p}{name}_count", 0)
        spent = after.get(f"{p}{name}_sum", 0) - before.get(f"{p}{name}_sum", 0)
        out[f"{key}_ms"] = 1e3 * spent if round(n) == 1 else None
    for c in PREFIX_COUNTERS:
        if p + c in after:
            out[c.removesuffix("_total")] = after[p + c] - before.get(p + c, 0)
    return out


async def alone(client, srv: Server, prompt: dict, max_tokens: int, index: int, timeout_s: float,
                count_tokens=None) -> tuple[RequestRecord, dict | None]:
    """One request with nothing else in flight (from us): its record, and the /metrics delta around it."""
    before = await scrape(client, srv)
    payload = {"model": srv.model, "prompt": prompt["prompt"], "max_tokens": max_tokens, "temperature": 0.0,
               "ignore_eos": True}
    rec = await stream_completion(client, srv.completions, payload, index, srv.headers, timeout_s, count_tokens)
    delta = None
    if before is not None and rec.ok:
        for _ in range(20):  # the server may record a request's histograms just after its last chunk
            delta = metric_delta(before, await scrape(client, srv), srv.metrics_prefix)
            if delta is not None:
                break
            await asyncio.sleep(0.05)
    return rec, delta


def waterfall(rec: RequestRecord, delta: dict | None = None) -> dict:
    """One request's TTFT cut into layers (ms): the server's queue and prefill where it reports them,
    client + network = the rest of the client's TTFT; and the first decode (first -> second chunk).
    None marks "not reported"."""
    t = rec.timings or {}
    d = delta or {}
    if t.get("prompt_ms") is not None:
        source, queue, prefill = "timings", t.get("queue_ms", d.get("queue_ms")), t["prompt_ms"]
    elif d.get("prefill_ms") is not None:
        source, queue, prefill = "/metrics", d.get("queue_ms"), d["prefill_ms"]
    else:
        source, queue, prefill = "not reported", None, None
    ttft = 1e3 * rec.ttft_s if rec.ok else math.nan
    known = (queue or 0.0) + (prefill or 0.0)
    cache = t.get("cache_n")
    if cache is None and d.get("prefix_cache_hits") is not None:
        cache = d["prefix_cache_hits"]
    gaps = rec.itl_s
    return {"phases_from": source, "ttft_ms": ttft, "queue_ms": queue, "prefill_ms": prefill,
            "client_net_ms": ttft - known if prefill is not None else None,
            "first_decode_ms": 1e3 * gaps[0] if gaps else None,
            "server_ttft_ms": d.get("server_ttft_ms"), "cache_n": cache,
            "prompt_n": t.get("prompt_n")}
