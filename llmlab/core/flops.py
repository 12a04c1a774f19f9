"""Formulas of a Llama-family decoder from its config: its sizes, parameters and KV bytes per token,
and the FLOPs and bytes of one forward, prefill and decode.

Two phases, one formula each:
- `prefill_cost(shape, tokens=T, batch=B)`: one forward over B prompts of T tokens that fills the
  KV cache; the LM head runs on the last position only (`logits_to_keep=1`, as generation does).
- `decode_cost(shape, context=T, batch=B)`: one decode step of B sequences, each with T tokens
  already in the KV cache; the new token attends to T + 1 positions.

FLOPs (a multiply-add is 2 FLOPs):
- every weight matmul (q, k, v, o, gate, up, down per layer; the LM head once): 2 x M x K x N,
  with M the rows that go through it (B x T in prefill, B in decode, B for the LM head);
- attention: QK^T and PV, 2 x 2 x heads x head_dim per (query, key) pair. Prefill with a causal
  mask has T(T+1)/2 pairs per sequence (the work a causal kernel must do; `causal=False` counts
  the dense T x T that a math-path kernel computes and `FlopCounterMode` reports); decode has T + 1.
- norms, RoPE, SiLU, residual adds and softmax are not counted (O(hidden) per token, < 1% here);
  biases (Qwen2's q/k/v) are not counted either, as `FlopCounterMode` does not count them.
GQA: K and V have kv_heads heads, so k_proj and v_proj are kv_heads x head_dim wide and the KV
cache holds kv_heads heads; the attention FLOPs use the query heads (each query head attends).

Bytes (each byte a kernel must read or write, once: STREAM's and the roofline lab's convention):
- weights: every matmul weight read once per forward, whatever the batch (elem x matmul params);
- KV cache: prefill writes B x T positions and its attention reads them once; decode reads
  B x T positions and writes B new ones (2 x layers x kv_heads x head_dim x elem per position);
- activations: each matmul reads its input (M x K) and writes its output (M x N) once; attention
  reads Q and writes O; the embedding lookup reads B x T rows. Elementwise ops are not counted.
A CPU with the model in its last-level cache, or a fused kernel, moves fewer bytes from DRAM:
these are the bytes the operations need, the roofline's x axis, not a cache simulation.

References:
- Kaplan et al., "Scaling Laws for Neural Language Models" (2020), table 1: forward FLOPs
  ~ 2N + 2 n_layer n_ctx d_attn per token.
- Chen, "Transformer Inference Arithmetic" (kipp.ly, 2022): FLOPs and bytes per token,
  the batch at which decode turns compute-bound.
- Pope et al., "Efficiently Scaling Transformer Inference" (2022): prefill vs decode costs.
- Ainslie et al., "GQA" (2023): grouped K/V heads.
- torch.utils.flop_counter.FlopCounterMode: what `llmlab.inference.flopcount` counts, to cross-check these.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# ---------------------------------------------------------------- sizes from the config


def shape(config) -> dict:
    """layers, hidden, heads, kv_heads, head_dim, intermediate, vocab, tied: from an HF config or an ARCHS entry."""
    if isinstance(config, dict):
        c = config
        return dict(layers=c["layers"], hidden=c["hidden"], heads=c["heads"], kv_heads=c["kv_heads"],
                    head_dim=c.get("head_dim") or c["hidden"] // c["heads"], intermediate=c["intermediate"],
                    vocab=c["vocab"], tied=c.get("tie_word_embeddings", False), bias=c["model_type"] == "qwen2")
    heads = config.num_attention_heads
    return dict(
        layers=config.num_hidden_layers, hidden=config.hidden_size, heads=heads,
        kv_heads=getattr(config, "num_key_value_heads", None) or heads,
        head_dim=getattr(config, "head_dim", None) or config.hidden_size // heads,
        intermediate=config.intermediate_size, vocab=config.vocab_size,
        tied=bool(getattr(config, "tie_word_embeddings", False)),
        bias=getattr(config, "model_type", "") == "qwen2" or bool(getattr(config, "attention_bias", False)),
    )



def kv_bytes_per_token(config, bytes_per_elem: float = 2) -> int:
    """K and V of every layer for one token: 2 x layers x kv_heads x head_dim x bytes (BF16 by default)."""
    s = shape(config)
    return int(2 * s["layers"] * s["kv_heads"] * s["head_dim"] * bytes_per_elem)


def param_count(config) -> int:
    """Parameters of a Llama-family decoder (llama, mistral, qwen2), from the config alone."""
    s = shape(config)
    h, hd, q, kv = s["hidden"], s["head_dim"], s["heads"], s["kv_heads"]
    attn = h * q * hd + 2 * h * kv * hd + q * hd * h + ((q + 2 * kv) * hd if s["bias"] else 0)
    mlp = 3 * h * s["intermediate"]  # gate, up, down (SwiGLU)
    per_layer = attn + mlp + 2 * h  # + two RMSNorm weights
    embed = s["vocab"] * h
    return embed + s["layers"] * per_layer + h + (0 if s["tied"] else embed)


# ---------------------------------------------------------------- costs of a forward


@dataclass(frozen=True)
class Shape:
    """The sizes of a Llama-family decoder (llama, mistral, qwen2) that its costs depend on."""

    layers: int
    hidden: int
    heads: int  # query heads
    kv_heads: int  # K/V heads (GQA: fewer than heads; MHA: equal)
    head_dim: int
    intermediate: int  # SwiGLU width (gate and up project to it, down back from it)
    vocab: int

    @classmethod
    def of(cls, config) -> Shape:
        """From an HF config (or an `llmlab.core.models.ARCHS` entry)."""
        s = shape(config)
        return cls(s["layers"], s["hidden"], s["heads"], s["kv_heads"], s["head_dim"], s["intermediate"], s["vocab"])

    def matmuls(self) -> list[tuple[str, int, int, int]]:
        """(name, K, N, count per forward) of every weight matmul: (M, K) @ (K, N)."""
        h, hd, q, kv, i, n = self.hidden, self.head_dim, self.heads, self.kv_heads, self.intermediate, self.layers
        return [
            ("q_proj", h, q * hd, n),
            ("k_proj", h, kv * hd, n),
            ("v_proj", h, kv * hd, n),
            ("o_proj", q * hd, h, n),
            ("gate_proj", h, i, n),
            ("up_proj", h, i, n),
            ("down_proj", i, h, n),
            ("lm_head", h, self.vocab, 1),
        ]

    @property
    def matmul_params(self) -> int:
        """Weights every forward reads (the LM head counts once even when tied to the embedding)."""
        return sum(k * n * c for _, k, n, c in self.matmuls())

    @property
    def kv_elems_per_token(self) -> int:
        """K and V of every layer for one position: 2 x layers x kv_heads x head_dim."""
        return 2 * self.layers * self.kv_heads * self.head_dim


@dataclass(frozen=True)
class Cost:
    """FLOPs and bytes of one forward, split by where they come from."""

    tokens: int  # new positions per sequence in this forward (T for prefill, 1 for decode)
    batch: int
    linear_flops: int  # weight matmuls, LM head included
    attn_flops: int  # QK^T and PV
    weight_bytes: int
    kv_bytes: int  # KV cache read + written
    act_bytes: int  # matmul inputs and outputs, Q and O, embedding rows

    @property
    def flops(self) -> int:
        return self.linear_flops + self.attn_flops

    @property
    def bytes(self) -> int:
        return self.weight_bytes + self.kv_bytes + self.act_bytes

    @property
    def intensity(self) -> float:
        """FLOP per byte: above the machine's ridge point compute bounds it, below it memory does."""
        return self.flops / self.bytes


def _linear(shape: Shape, rows: int, head_rows: int, elem: int) -> tuple[int, int, int]:
    """(FLOPs, weight bytes, activation bytes) of the weight matmuls: `rows` through each layer, `head_rows`
    through the LM head."""
    flops = weight = act = 0
    for name, k, n, count in shape.matmuls():
        m = head_rows if name == "lm_head" else rows
        flops += 2 * m * k * n * count
        weight += elem * k * n * count
        act += elem * m * (k + n) * count  # (M, K) in, (M, N) out
    return flops, weight, act


def _attention(shape: Shape, pairs: int, queries: int, elem: int) -> tuple[int, int]:
    """(FLOPs, Q + O bytes) of attention over `pairs` (query, key) pairs and `queries` query positions, all layers."""
    qo = shape.heads * shape.head_dim
    return 4 * qo * pairs * shape.layers, elem * 2 * queries * qo * shape.layers


def prefill_cost(shape: Shape, tokens: int, batch: int = 1, elem: int = 2, causal: bool = True) -> Cost:
    """One prefill of `batch` prompts of `tokens` tokens each; `elem` bytes per weight/activation (2: BF16)."""
    if tokens < 1 or batch < 1:
        raise ValueError("tokens and batch must be >= 1")
    rows = batch * tokens
    lin, weight, act = _linear(shape, rows, batch, elem)
    pairs = batch * (tokens * (tokens + 1) // 2 if causal else tokens * tokens)
    attn, qo = _attention(shape, pairs, rows, elem)
    kv = 2 * elem * rows * shape.kv_elems_per_token  # written once, read once by attention
    embed = elem * rows * shape.hidden
    return Cost(tokens, batch, lin, attn, weight, kv, act + qo + embed)


def decode_cost(shape: Shape, context: int, batch: int = 1, elem: int = 2) -> Cost:
    """One decode step: `batch` sequences with `context` positions cached each, one new token per sequence."""
    if context < 0 or batch < 1:
        raise ValueError("context must be >= 0 and batch >= 1")
    lin, weight, act = _linear(shape, batch, batch, elem)
    attn, qo = _attention(shape, batch * (context + 1), batch, elem)
    kv = elem * batch * (context + 1) * shape.kv_elems_per_token  # read the cache (+ the new position), write one
    embed = elem * batch * shape.hidden
    return Cost(1, batch, lin, attn, weight, kv, act + qo + embed)


def kv_bytes(shape: Shape, tokens: int, elem: int = 2) -> int:
    """Bytes of one sequence's KV cache after `tokens` positions (what disaggregated serving moves)."""
    return elem * tokens * shape.kv_elems_per_token


def crossover_batch(shape: Shape, ridge: float, context: int, elem: int = 2) -> float:
    """The decode batch B at which decode's intensity reaches `ridge` FLOP/byte (inf if it never does).

    FLOPs and bytes are both affine in B: flops = f1*B, bytes = W + b1*B (W the weights, b1 the
    per-sequence KV and activations), so intensity = ridge at B = ridge*W / (f1 - ridge*b1).
    With no KV and FP16 weights this is B ~ ridge: each weight (2 bytes) does 2 FLOPs per sequence.
    """
    one, two = decode_cost(shape, context, 1, elem), decode_cost(shape, context, 2, elem)
    f1, b1 = two.flops - one.flops, two.bytes - one.bytes
    w = one.bytes - b1
    return ridge * w / (f1 - ridge * b1) if f1 > ridge * b1 else math.inf
