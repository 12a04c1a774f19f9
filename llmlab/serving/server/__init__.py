"""`llmlab serve`: an OpenAI-compatible HTTP server over the engine (FastAPI + uvicorn, SSE).

Reading order: `protocol` (strict request models, the body cap, OpenAI's error shape) -> `guard`
(Host, cross-origin and API-key checks in front of every route) -> `async_engine` (the engine
stepped by one background thread, every fault contained) -> `stops` (stop strings on the decoded
text) -> `logprobs` (OpenAI's two logprobs shapes) -> `app` (the routes) and `sse` (streamed
answers) -> `metrics` (Prometheus, vLLM's names, buckets and `model_name` label; llama.cpp-style
timings) -> `launch` (`serve`: dtype, KV pool sized from free memory on CUDA, exactness check, uvicorn).

Routes: POST /v1/completions, POST /v1/chat/completions (stream true/false; SSE chunks ending in
`data: [DONE]`; stream_options.include_usage; max_tokens / max_completion_tokens, temperature,
top_p, top_k, min_p, seed, stop, n, echo (completions), logprobs (completions' k; chat's logprobs
and top_logprobs), logit_bias, frequency / presence penalties, user, and vLLM's ignore_eos,
repetition_penalty, min_tokens, stop_token_ids and return_tokens_as_token_ids), GET /v1/models,
GET /health, GET /metrics, GET /v1/engine/stats (llmlab's own: counters, faults and the recent
step records, what the tests and labs read), and vLLM's POST /tokenize and /detokenize (what the
ttft lab's --endpoint uses for prompts of an exact length).

One SSE chunk per generated token (so a client's chunk count equals the token count here; the
usage block says so anyway). The final chunk (and a non-streamed response) carries `timings`
shaped after llama.cpp's server (`prompt_n` tokens computed, `cache_n` prefix-cache hits,
`prompt_ms` scheduled -> first token, `predicted_n`, `predicted_ms` first token -> last token,
per-token and per-second figures) plus `queue_ms` (arrival -> scheduled).

Errors are OpenAI-shaped ({"error": {"message", "type", "param", "code"}}): 400 for malformed
JSON, wrong types, values out of range, options this server cannot honour and prompts beyond the
context; 401 without the API key; 403 cross-origin; 404 for an unknown model or route; 405; 413
for a body over the cap; 500 for a request the engine failed (that request alone); 503 once the
engine thread is gone.

References:
- OpenAI API reference: completions, chat completions, streaming (`stream_options.include_usage`).
- vLLM `entrypoints/openai/api_server.py`, `protocol.py` (seed range, _SAMPLING_EPS), the stop
  string check of `v1/engine/detokenizer.py`, `v1/metrics/loggers.py` (metric names and buckets).
- llama.cpp `tools/server/README.md` (`timings`).
"""

from llmlab.serving.server.app import create_app
from llmlab.serving.server.launch import serve

__all__ = ["create_app", "serve"]
