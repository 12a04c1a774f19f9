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
SDPA calls take no mask where none is needed (a prefill with nothing cached is plain causal; decodes
of equal length read exactly their keys), so a fused kernel can run; on CUDA, where SDPA's GQA call
with a mask falls to the math path, K/V are expanded to the query heads when that gets a fused
kernel. `backends` counts which backend each kind of call got (torch's own dispatcher is asked).
There is no paged-attention kernel for batches here: that is what vLLM's and FlashInfer's kernels add.
One exception, on the CPU in float32: a step that is one sequence's decode runs as one compiled call
through every layer (inference/cpu_decode.py), attention reading the keys through the block table in
place; on a 2-core AMD EPYC tiny's single-sequence step went from 2.3 to 1.1 ms. It counts as "decode compiled".

The layers are `llmlab.inference.llama`'s, shared with tensor parallelism: the model's own HF
modules (Linear layers, embeddings, the rotary embedding module, so RoPE scaling is computed
exactly as HF computes it for the config) composed as RMSNorm -> attention -> residual ->
RMSNorm -> SwiGLU -> residual; this runner brings the attention over the paged cache.

References:
- nano-vllm `engine/model_runner.py`: slot mapping (block_table[pos // B] * B + pos % B).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from llmlab.inference.cpu_decode import CpuDecoder
from llmlab.inference.linear import plain
from llmlab.inference.llama import expand_kv, head_counts, layer_forward, layers_of, rms_norm, rope


@dataclass
class Batch:
    """One step's ragged batch, built by the engine (every tensor a view of one host-to-device copy)."""

    input_ids: torch.Tensor  # (N,) the new tokens of all scheduled sequences, concatenated
    positions: torch.Tensor  # (N,) each token's position in its sequence
    slots: torch.Tensor  # (N,) where each new token's K/V are written in the flat cache
    prefills: list[tuple[int, int, int, torch.Tensor]]  # (start row, new tokens, context length, block table (nb,))
    decode_rows: torch.Tensor  # (Nd,) rows of decode tokens in the batch
    decode_tables: torch.Tensor  # (Nd, max_blocks) block tables of the decoding sequences, padded with block 0
    decode_lens: torch.Tensor  # (Nd,) keys each decoding sequence has (its context, the new token included)
    decode_len: int | None  # the one length when every decode has the same (then no mask), else None
    logit_rows: torch.Tensor  # (M,) rows whose logits are wanted


# ---------------------------------------------------------------- SDPA backends

def sdpa_backend(q, k, v, mask=None, is_causal: bool = False, enable_gqa: bool = False) -> str:
    """The backend torch's SDPA dispatcher picks for these inputs (FLASH_ATTENTION, EFFICIENT_ATTENTION,
    CUDNN_ATTENTION, MATH, ...): what `F.scaled_dot_product_attention` would run, asked without running it."""
    from torch.nn.attention import SDPBackend

    choice = torch._fused_sdp_choice(q, k, v, mask, 0.0, is_causal, enable_gqa=enable_gqa)
    return SDPBackend(choice).name


class ModelRunner:
    def __init__(self, model, num_blocks: int, block_size: int):
        cfg = model.config
        self.model = model
        self.base = model.model  # LlamaModel (or Qwen2Model, MistralModel): embed_tokens, layers, norm, rotary_emb
        self.layers = layers_of(model)
        self.lm_head = plain(model.lm_head, self.base.embed_tokens)  # the embedding when tied to it
        self.n_heads, self.n_kv, self.head_dim = head_counts(cfg)
        self.eps = cfg.rms_norm_eps
        self.scale = self.head_dim**-0.5
        p = next(model.parameters())
        self.device, self.dtype = p.device, p.dtype
        self.block_size = block_size
        shape = (cfg.num_hidden_layers, num_blocks * block_size, self.n_kv, self.head_dim)
        self.k_cache = torch.zeros(shape, device=self.device, dtype=self.dtype)  # (L, slots, Hkv, D)
        self.v_cache = torch.zeros(shape, device=self.device, dtype=self.dtype)
        # On CUDA SDPA's GQA path has no fused kernel with a mask: K/V are expanded to the query heads where that
        # gets one. The CPU's SDPA has a fused kernel either way, so it keeps the GQA call.
        self.expand_kv_for_fused = self.device.type == "cuda"
        self._plans: dict[tuple, tuple[bool, str]] = {}  # (kind, masked, causal) -> (expand K/V, backend)
        self.backends: Counter[str] = Counter()  # "decode EFFICIENT_ATTENTION" -> SDPA calls ("compiled": the kernel's)
        # A decode step of one sequence on the CPU in float32: one compiled call through every layer (None elsewhere)
        self.cpu_decoder = CpuDecoder.build(self.layers, self.k_cache, self.v_cache, cfg.intermediate_size, block_size,
                                            self.eps, self.scale)

    # ---------------------------------------------------------------- attention

    def _plan(self, q, k, v, mask, is_causal: bool) -> tuple[bool, str]:
        """(expand K/V?, the backend SDPA will pick) for one kind of call: GQA as is unless only expansion
        gets a fused kernel."""
        gqa = self.n_heads != self.n_kv
        backend = sdpa_backend(q, k, v, mask, is_causal, enable_gqa=gqa)
        if gqa and self.expand_kv_for_fused and backend == "MATH":
            g = self.n_heads // self.n_kv
            expanded = sdpa_backend(q, expand_kv(k, g), expand_kv(v, g), mask, is_causal)
            if expanded != "MATH":
                return True, expanded
        return False, backend

    def attend(self, kind: str, q, k, v, mask=None, is_causal: bool = False) -> torch.Tensor:
        """q (B, Hq, Tq, D), k/v (B, Hkv, Tk, D) -> (B, Hq, Tq, D) through SDPA; the backend it gets is counted."""
        key = (kind, mask is not None, is_causal)
        if key not in self._plans:
            self._plans[key] = self._plan(q, k, v, mask, is_causal)
        expand, backend = self._plans[key]
        self.backends[f"{kind} {backend}"] += 1
        gqa = self.n_heads != self.n_kv
        if expand:
            k, v = expand_kv(k, self.n_heads // self.n_kv), expand_kv(v, self.n_heads // self.n_kv)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal, scale=self.scale,
                                              enable_gqa=gqa and not expand)

    def prefill_attention(self, q, k_all, v_all, n_new: int) -> torch.Tensor:
        """q (n, Hq, D), k_all/v_all (ctx, Hkv, D) -> (n, Hq, D); query i sits at position ctx - n + i."""
        ctx = k_all.shape[0]
        qt, kt, vt = q.transpose(0, 1)[None], k_all.transpose(0, 1)[None], v_all.transpose(0, 1)[None]  # (1, H, T, D)
        if ctx == n_new:  # nothing cached before the chunk: plain causal, no mask
            o = self.attend("prefill", qt, kt, vt, is_causal=True)
        else:  # a chunk after cached keys: causal offset by ctx - n (SDPA's is_causal aligns top-left, so a mask)
            qpos = torch.arange(ctx - n_new, ctx, device=q.device)[:, None]  # (n, 1)
            mask = torch.arange(ctx, device=q.device)[None, :] <= qpos  # (n, ctx)
            o = self.attend("prefill-after-cache", qt, kt, vt, mask=mask)
        return o[0].transpose(0, 1)  # (n, Hq, D)

    def decode_attention(self, q, kb, vb, tables, lens, same_len: int | None) -> torch.Tensor:
        """q (Nd, Hq, D); kb/vb (blocks, B, Hkv, D); tables (Nd, nb); lens (Nd,) keys per sequence -> (Nd, Hq, D).

        One query per sequence: when every sequence has `same_len` keys, the gathered keys are cut to exactly
        that many and need no mask; otherwise a mask hides each sequence's padding past its length."""
        nd, nb = tables.shape
        # (Nd, Hkv, T, D)
        k = kb.index_select(0, tables.view(-1)).view(nd, nb * self.block_size, self.n_kv, self.head_dim).transpose(1, 2)
        v = vb.index_select(0, tables.view(-1)).view(nd, nb * self.block_size, self.n_kv, self.head_dim).transpose(1, 2)
        if same_len is not None:
            o = self.attend("decode", q.unsqueeze(2), k[:, :, :same_len], v[:, :, :same_len])
        else:
            mask = torch.arange(nb * self.block_size, device=q.device)[None, :] < lens[:, None]  # (Nd, nb * B)
            o = self.attend("decode-ragged", q.unsqueeze(2), k, v, mask=mask[:, None, None, :])
        return o.squeeze(2)  # (Nd, Hq, D)

    # ---------------------------------------------------------------- one layer's attention

    def attention(self, li: int, q, k, v, b: Batch) -> torch.Tensor:
        """Layer `li`: write the step's K/V into the paged cache, attend -> (N, Hq, D)."""
        kc, vc = self.k_cache[li], self.v_cache[li]  # (slots, Hkv, D)
        kc[b.slots] = k
        vc[b.slots] = v
        kb = kc.view(-1, self.block_size, self.n_kv, self.head_dim)  # (blocks, B, Hkv, D)
        vb = vc.view(-1, self.block_size, self.n_kv, self.head_dim)
        if not b.prefills:  # every row a decode, in order (build_batch): no scatter into a fresh output
            return self.decode_attention(q, kb, vb, b.decode_tables, b.decode_lens, b.decode_len)
        o = torch.empty_like(q)  # (N, Hq, D)
        for start, n_new, ctx, table in b.prefills:
            k_all = kb.index_select(0, table).view(-1, self.n_kv, self.head_dim)[:ctx]  # (ctx, Hkv, D)
            v_all = vb.index_select(0, table).view(-1, self.n_kv, self.head_dim)[:ctx]
            o[start : start + n_new] = self.prefill_attention(q[start : start + n_new], k_all, v_all, n_new)
        if b.decode_rows.numel():
            o[b.decode_rows] = self.decode_attention(q[b.decode_rows], kb, vb, b.decode_tables, b.decode_lens,
                                                     b.decode_len)
        return o

    # ---------------------------------------------------------------- the forward

    @torch.inference_mode()
    def forward(self, b: Batch) -> torch.Tensor:
        """One ragged step -> logits (M, V) for `b.logit_rows`, float32."""
        x = self.base.embed_tokens(b.input_ids)  # (N, hidden)
        cos, sin = rope(self.base.rotary_emb, x, b.positions)  # (N, 1, D) each
        one_decode = not b.prefills and x.shape[0] == 1 == b.logit_rows.numel() and cos.shape[-1] == self.head_dim
        if self.cpu_decoder is not None and one_decode:
            n_keys = b.decode_len if b.decode_len is not None else int(b.decode_lens[0])
            self.cpu_decoder(x, cos.reshape(-1).contiguous(), sin.reshape(-1).contiguous(), b.decode_tables[0], n_keys,
                             int(b.slots[0]))
            self.backends["decode compiled"] += len(self.layers)
            return self.lm_head(rms_norm(x, self.base.norm.weight, self.eps)).float()  # (1, V): the one row's logits
        for li, layer in enumerate(self.layers):
            x = layer_forward(x, layer, cos, sin, self.eps, lambda q, k, v, li=li: self.attention(li, q, k, v, b))
        x = rms_norm(x[b.logit_rows], self.base.norm.weight, self.eps)  # (M, hidden): the LM head only where needed
        return self.lm_head(x).float()  # (M, V)
