"""The engine: paged KV blocks, a token-budget scheduler, a ragged Llama forward, one step at a time.

`block_manager` -> `scheduler` -> `model_runner` -> `logits_processors` -> `llm_engine` (nano-vllm's
shape).
"""
