"""Serving: a small paged, continuously batching engine and an OpenAI-compatible server over it.

Reading order: `engine/` (`block_manager`: paged KV blocks, prefix hashes -> `scheduler`:
sequences, token budget, preemption -> `model_runner`: the ragged forward over the block tables,
`inference.llama`'s layers with a paged attention -> `llm_engine`: one step: schedule, run,
sample, stamp) -> `server/` (HTTP, SSE, /metrics) -> `chat` (the chat template the server and
the ttft lab share).

The engine uses `inference.llama` and `inference.sampling` and is checked against
`inference.decode`, so it sits one layer above `inference/`. What measures a server from outside
(client, probe, metrics) is `llmlab.loadgen`, beside this package: neither imports the other.
"""
