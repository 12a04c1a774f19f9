"""Serving: a small paged, continuously batching engine, an OpenAI-compatible server over it, and a
streaming client that measures any OpenAI-compatible server.

Reading order: `block_manager` (paged KV blocks, prefix hashes) -> `scheduler` (sequences, token
budget, preemption) -> `model_runner` (the ragged Llama forward over the block tables) -> `engine`
(one step: schedule, run, sample, stamp) -> `server` (HTTP, SSE, /metrics) -> `client` (load
generator and vLLM-style metrics).

Why `llmlab/serving/` and not `llmlab/inference/engine.py` (as issue 13 first wrote): DESIGN.md's
layout puts the engine, the server and the client together under `serving/`, one layer above
`inference/` (arrows point `serving -> inference -> core`); the engine uses `inference.sampling`
and is checked against `inference.decode`, so it sits above them. `inference/serving.py` stays
the ttft lab's single-worker simulator.
"""
