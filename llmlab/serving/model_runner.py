"""The engine's own Llama-family forward over a ragged batch and a paged KV cache.

One step's tokens (every running decode's one token and every admitted prefill chunk) are
concatenated into one (N,) batch: embeddings, the q/k/v/o projections, the MLP and the LM head
run once over all N rows, with no padding to the longest sequence. Only attention is per
sequence, and it reads each sequence's keys and values through its block table:

- prefill chunks (more than one new token), one sequence at a time: its blocks gathered whole
  through its block table (`index_select` of (block_size, kv_heads, head_dim) blocks), then
  `F.scaled_dot_product_attention` with a causal mask offset by the tokens already cached;
- decode tokens (one new token each), all decoding sequences in one SDPA call: their block
  tables, padded with block 0 to the longest one in the step, gather (Nd, blocks * block_size)
  keys, and a mask hides the positions past each sequence's length. That padding is inside
  attention only (at most the longest context of the step's decodes), never in the matmuls.
  A fully ragged decode attention (scores per key, per-sequence softmax by scatter max and
  index_add, no padding) was exact too but 2-4x slower on a CPU: gathering single slots costs
  more than gathering whole blocks.
On CUDA the same calls run (SDPA picks its fused kernel where the mask allows, else the math
path); there is no paged-attention kernel here: that is what vLLM's and FlashInfer's kernels add.

The weights are the Hugging Face model's own modules (Linear layers, embeddings, the rotary
embedding module, so RoPE scaling is computed exactly as HF computes it for the config);
the composition is ours: RMSNorm -> attention (GQA, RoPE, optional Qwen3 q/k norms) ->
residual -> RMSNorm -> SwiGLU -> residual. Llama, Mistral (sliding window not applied: exact
only within the window), Qwen2 (q/k/v biases come with the Linear modules) and Qwen3.

References:
- HF transformers `models/llama/modeling_llama.py` (rotate_half, apply_rotary_pos_emb, LlamaRMSNorm).
- gpt-fast `model.py`: one small function per block, shape comments.
- nano-vllm `engine/model_runner.py`: slot mapping (block_table[pos // B] * B + pos % B).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class Batch:
    """One step's ragged batch, built by the engine."""

    input_ids: torch.Tensor  # (N,) the new tokens of all scheduled sequences, concatenated
    positions: torch.Tensor  # (N,) each token's position in its sequence
    slots: torch.Tensor  # (N,) where each new token's K/V are written in the flat cache
    prefills: list[tuple[int, int, int, torch.Tensor]]  # (start row, new tokens, context length, block table (nb,))
    decode_rows: torch.Tensor  # (Nd,) rows of decode tokens in the batch
    decode_tables: torch.Tensor  # (Nd, max_blocks) block tables of the decoding sequences, padded with block 0
    decode_mask: torch.Tensor  # (Nd, max_blocks * block_size) True where a position holds one of the sequence's keys
    logit_rows: torch.Tensor  # (M,) rows whose logits are wanted


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x (N, H): x / rms(x) * weight, in float32 as HF computes it, back to x's dtype."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x (N, heads, D), cos/sin (N, 1, D)."""
    return x * cos + rotate_half(x) * sin


class ModelRunner:
    def __init__(self, model, num_blocks: int, block_size: int):
        cfg = model.config
        self.model = model
        self.base = model.model  # LlamaModel (or Qwen2Model, MistralModel): embed_tokens, layers, norm, rotary_emb
        self.n_heads = cfg.num_attention_heads
        self.n_kv = getattr(cfg, "num_key_value_heads", None) or self.n_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.n_heads
        self.eps = cfg.rms_norm_eps
        self.scale = self.head_dim**-0.5
        p = next(model.parameters())
        self.device, self.dtype = p.device, p.dtype
        self.block_size = block_size
        shape = (cfg.num_hidden_layers, num_blocks * block_size, self.n_kv, self.head_dim)
        self.k_cache = torch.zeros(shape, device=self.device, dtype=self.dtype)  # (L, slots, Hkv, D)
        self.v_cache = torch.zeros(shape, device=self.device, dtype=self.dtype)

    # ---------------------------------------------------------------- attention

    def prefill_attention(self, q, k_all, v_all, n_new: int) -> torch.Tensor:
        """q (n, Hq, D), k_all/v_all (ctx, Hkv, D) -> (n, Hq, D); query i sits at position ctx - n + i."""
        ctx = k_all.shape[0]
        qt, kt, vt = q.transpose(0, 1)[None], k_all.transpose(0, 1)[None], v_all.transpose(0, 1)[None]  # (1, H, T, D)
        if ctx == n_new:
            o = F.scaled_dot_product_attention(qt, kt, vt, is_causal=True, scale=self.scale, enable_gqa=True)
        else:
            qpos = torch.arange(ctx - n_new, ctx, device=q.device)[:, None]  # (n, 1)
            mask = torch.arange(ctx, device=q.device)[None, :] <= qpos  # (n, ctx)
            o = F.scaled_dot_product_attention(qt, kt, vt, attn_mask=mask, scale=self.scale, enable_gqa=True)
        return o[0].transpose(0, 1)  # (n, Hq, D)

    def decode_attention(self, q, kb, vb, tables, mask) -> torch.Tensor:
        """q (Nd, Hq, D); kb/vb (blocks, B, Hkv, D); tables (Nd, nb); mask (Nd, nb * B) -> (Nd, Hq, D)."""
        nd, nb = tables.shape
        k = kb.index_select(0, tables.view(-1)).view(nd, nb * self.block_size, self.n_kv, self.head_dim).transpose(1, 2)  # (Nd, Hkv, T, D)
        v = vb.index_select(0, tables.view(-1)).view(nd, nb * self.block_size, self.n_kv, self.head_dim).transpose(1, 2)
        o = F.scaled_dot_product_attention(q.unsqueeze(2), k, v, attn_mask=mask[:, None, None, :], scale=self.scale, enable_gqa=True)
        return o.squeeze(2)  # (Nd, Hq, D)

    # ---------------------------------------------------------------- one layer

    def attention_block(self, li: int, layer, h: torch.Tensor, cos, sin, b: Batch) -> torch.Tensor:
        attn = layer.self_attn
        n = h.shape[0]
        q = attn.q_proj(h).view(n, self.n_heads, self.head_dim)  # (N, Hq, D)
        k = attn.k_proj(h).view(n, self.n_kv, self.head_dim)  # (N, Hkv, D)
        v = attn.v_proj(h).view(n, self.n_kv, self.head_dim)
        if hasattr(attn, "q_norm"):  # Qwen3: RMSNorm over head_dim before RoPE
            q, k = attn.q_norm(q), attn.k_norm(k)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        kc, vc = self.k_cache[li], self.v_cache[li]  # (slots, Hkv, D)
        kc[b.slots] = k
        vc[b.slots] = v
        kb = kc.view(-1, self.block_size, self.n_kv, self.head_dim)  # (blocks, B, Hkv, D)
        vb = vc.view(-1, self.block_size, self.n_kv, self.head_dim)
        o = torch.empty_like(q)  # (N, Hq, D)
        for start, n_new, ctx, table in b.prefills:
            k_all = kb.index_select(0, table).view(-1, self.n_kv, self.head_dim)[:ctx]  # (ctx, Hkv, D)
            v_all = vb.index_select(0, table).view(-1, self.n_kv, self.head_dim)[:ctx]
            o[start : start + n_new] = self.prefill_attention(q[start : start + n_new], k_all, v_all, n_new)
        if b.decode_rows.numel():
            o[b.decode_rows] = self.decode_attention(q[b.decode_rows], kb, vb, b.decode_tables, b.decode_mask)
        return attn.o_proj(o.view(n, self.n_heads * self.head_dim))  # (N, hidden)

    @staticmethod
    def mlp(layer, h: torch.Tensor) -> torch.Tensor:
        m = layer.mlp  # SwiGLU: down(act(gate(h)) * up(h))
        return m.down_proj(m.act_fn(m.gate_proj(h)) * m.up_proj(h))

    # ---------------------------------------------------------------- the forward

    @torch.inference_mode()
    def forward(self, b: Batch) -> torch.Tensor:
        """One ragged step -> logits (M, V) for `b.logit_rows`, float32."""
        x = self.base.embed_tokens(b.input_ids)  # (N, hidden)
        cos, sin = self.base.rotary_emb(x[None], b.positions[None])  # (1, N, D) each, HF's own RoPE (scaling included)
        cos, sin = cos[0].unsqueeze(1).to(x.dtype), sin[0].unsqueeze(1).to(x.dtype)  # (N, 1, D)
        for li, layer in enumerate(self.base.layers):
            x = x + self.attention_block(li, layer, rms_norm(x, layer.input_layernorm.weight, self.eps), cos, sin, b)
            x = x + self.mlp(layer, rms_norm(x, layer.post_attention_layernorm.weight, self.eps))
        x = rms_norm(x[b.logit_rows], self.base.norm.weight, self.eps)  # (M, hidden): the LM head only where needed
        return self.model.lm_head(x).float()  # (M, V)
