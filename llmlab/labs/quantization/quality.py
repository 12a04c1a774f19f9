"""How the quantization lab measures quality against FP32: the KL of next-token distributions, with the
weights or the KV cache (quantized as it is written) in a format."""

from __future__ import annotations


class QDQCache:
    """A DynamicCache whose update() quantize-dequantizes K and V as they enter (the decode loop's emulation).
    Built lazily as a subclass so this module imports without transformers."""

    def __new__(cls, fmt: str, config):
        from transformers import DynamicCache

        from llmlab.inference import quant

        class _QDQ(DynamicCache):
            def update(self, key_states, value_states, layer_idx, *args, **kwargs):  # (B, H, T, D) each
                return super().update(quant.qdq_kv(key_states, fmt), quant.qdq_kv(value_states, fmt),
                                      layer_idx, *args, **kwargs)

        return _QDQ(config=config)


def kl_divergence(ref, model, ids, tokens: int, seq_len: int = 256, cache_fmt: str | None = None) -> tuple[float,
                                                                                                           float]:
    """(mean KL(p_ref || p_model) per token in nats, model's loss in nats) over the first `tokens` held-out tokens.
    With cache_fmt, `model` runs with K and V quantize-dequantized as they enter its cache."""
    import torch
    import torch.nn.functional as F

    from llmlab.inference import decode

    n_win = max(1, min(len(ids) - 1, tokens) // seq_len)
    kl, loss, count = 0.0, 0.0, 0
    with torch.no_grad():
        for start in range(0, n_win, 8):
            rows = range(start, min(n_win, start + 8))
            x = torch.stack([ids[r * seq_len : (r + 1) * seq_len] for r in rows])  # (B, T)
            y = torch.stack([ids[r * seq_len + 1 : (r + 1) * seq_len + 1] for r in rows])
            lp_ref = F.log_softmax(ref(input_ids=x).logits.float(), -1)  # (B, T, V)
            if cache_fmt is None:
                logits = model(input_ids=x).logits
            else:
                logits = decode.forward(model, x, QDQCache(cache_fmt, model.config), logits_to_keep=0)
            lp = F.log_softmax(logits.float(), -1)
            kl += (lp_ref.exp() * (lp_ref - lp)).sum().item()
            loss += F.nll_loss(lp.flatten(0, 1), y.flatten(), reduction="sum").item()
            count += y.numel()
    return kl / count, loss / count
