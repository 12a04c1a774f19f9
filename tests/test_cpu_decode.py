"""The compiled single-sequence decode step (inference/cpu_decode.py, cpu_kernels.c): the engine's logits with
it equal HF's own forward at every decode position, for the layer shapes it accepts (GQA and MHA, q/k/v
biases, scaled RoPE, a block table that is not contiguous), and layers it does not compute keep torch's path."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM

from llmlab.inference import cpu_kernels
from llmlab.serving.engine.llm_engine import Engine, EngineConfig, check_exact, computed_logits, hf_logits
from llmlab.serving.engine.scheduler import RequestParams

ATOL = 1e-4
needs_compiler = pytest.mark.skipif(cpu_kernels.library() is None, reason="no C compiler here: torch's path runs")
SMALL = dict(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
             head_dim=16, max_position_embeddings=512)


def prompts_of(lengths, seed=0, vocab=300):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(1, vocab, (n,), generator=g).tolist() for n in lengths]


def _model(cls, cfg_cls, **kw):
    torch.manual_seed(0)
    return cls(cfg_cls(**{**SMALL, **kw})).eval()


@needs_compiler
@pytest.mark.parametrize("make", [
    lambda: _model(LlamaForCausalLM, LlamaConfig, num_key_value_heads=2),  # GQA, 2 query heads per KV head
    lambda: _model(LlamaForCausalLM, LlamaConfig, num_key_value_heads=4),  # MHA
    lambda: _model(Qwen2ForCausalLM, Qwen2Config, num_key_value_heads=2),  # biases on q/k/v
    lambda: _model(LlamaForCausalLM, LlamaConfig, num_key_value_heads=1, rope_scaling={  # Llama 3's scaled RoPE
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64}),
], ids=["gqa", "mha", "qwen2-bias", "llama3-rope"])
def test_one_sequence_decodes_through_the_kernel_exactly(make):
    eng = Engine(make(), EngineConfig(block_size=4))
    assert eng.runner.cpu_decoder is not None
    r = check_exact(eng, prompts_of([9]), max_new_tokens=12)
    assert r["max_abs_logit_diff"] <= ATOL and r["greedy_tokens_equal"]
    assert eng.attention_backends["decode compiled"] == 2 * (11 + 11)  # 2 layers x 2 rounds x 11 one-row decode steps


@needs_compiler
def test_a_scattered_block_table_is_read_through():
    """Two sequences take blocks in turn; the longer one then decodes alone through the kernel, reading its keys
    from blocks that are not adjacent."""
    model = _model(LlamaForCausalLM, LlamaConfig, num_key_value_heads=2)
    eng = Engine(model, EngineConfig(block_size=4, enable_prefix_cache=False))
    eng.record_logits = True
    a, b = prompts_of([6, 5], seed=3)
    long = eng.add_request(a, RequestParams(max_tokens=30, ignore_eos=True))
    short = eng.add_request(b, RequestParams(max_tokens=12, ignore_eos=True))
    while short.finish_reason is None:
        eng.step()
    table = list(long.block_table)
    assert any(y != x + 1 for x, y in zip(table, table[1:], strict=False))  # the two took blocks in turn
    before = eng.attention_backends.get("decode compiled", 0)
    while eng.has_work():
        eng.step()
    assert eng.attention_backends["decode compiled"] > before  # decoding alone: the kernel
    pos, got = computed_logits(long)
    assert float((got - hf_logits(model, long.token_ids[:-1])[pos]).abs().max()) <= ATOL


def test_layers_the_kernel_does_not_compute_keep_the_torch_path(monkeypatch):
    qwen3 = _model(Qwen3ForCausalLM, Qwen3Config, num_key_value_heads=2)  # q/k norms: not in the kernel
    eng = Engine(qwen3, EngineConfig(block_size=4))
    assert eng.runner.cpu_decoder is None
    assert check_exact(eng, prompts_of([9]), max_new_tokens=4)["max_abs_logit_diff"] <= ATOL
    assert "decode compiled" not in eng.attention_backends
    bf16 = _model(LlamaForCausalLM, LlamaConfig, num_key_value_heads=2)
    assert Engine(bf16, EngineConfig(dtype="bfloat16")).runner.cpu_decoder is None
    monkeypatch.setenv("LLMLAB_CPU_KERNELS", "0")
    monkeypatch.setattr(cpu_kernels, "_state", {})
    off = Engine(_model(LlamaForCausalLM, LlamaConfig, num_key_value_heads=2), EngineConfig(block_size=4))
    assert off.runner.cpu_decoder is None
    assert check_exact(off, prompts_of([9]), max_new_tokens=4)["max_abs_logit_diff"] <= ATOL
