"""Part 4 of the quantization lab: KV cache formats' bytes, error, quality in the decode loop, and fit."""

from __future__ import annotations

import math

from llmlab.core.device import Device
from llmlab.labs.quantization.config import Config
from llmlab.labs.quantization.quality import QDQCache, kl_divergence


def part_kv_bytes(model, ids, formats, cfg: Config, device: Device) -> list[dict]:
    """A real prefill cache of kv_tokens held-out tokens, each layer's K and V packed per format: bytes and error."""
    import torch

    from llmlab.inference import decode, quant

    cache = decode.new_cache(model)
    with torch.no_grad():
        decode.forward(model, ids[: cfg.kv_tokens].unsqueeze(0), cache)
    kvs = [(layer.keys, layer.values) for layer in cache.layers]  # each (1, H, T, D)
    b, h, t, d = kvs[0][0].shape
    rows = []
    for fmt in formats:
        measured = formula = 0
        err = {"k": [0.0, 0.0], "v": [0.0, 0.0]}
        for k, v in kvs:
            for name, x in (("k", k), ("v", v)):
                qt = quant.quantize_kv(x, fmt)
                measured += qt.nbytes
                formula += quant.kv_bytes_formula(b, h, t, d, fmt)
                err[name][0] += (quant.dequantize_kv(qt) - x.float()).pow(2).sum().item()
                err[name][1] += x.float().pow(2).sum().item()
        rows.append(dict(format=fmt, tokens=t, layers=len(kvs), kv_heads=h, head_dim=d, bytes=measured,
                         formula_bytes=formula, bytes_match=measured == formula, bytes_per_token=measured / t,
                         long_context_bytes_per_token=2 * len(kvs) * h * d * quant.kv_bytes_per_value(fmt, d),
                         rel_err_k=math.sqrt(err["k"][0] / err["k"][1]),
                         rel_err_v=math.sqrt(err["v"][0] / err["v"][1])))
    fp8 = next((r for r in rows if r["format"] == "fp8"), None)
    for r in rows:
        r["x_fp8_bytes"] = r["bytes"] / fp8["bytes"] if fp8 else None  # measured: packed bytes of the same cache
    return rows


def part_kv_quality(model, tokenizer, ids, formats, cfg: Config, device: Device) -> list[dict]:
    """Loss, KL and greedy agreement of tiny when K and V are quantize-dequantized as they enter the cache."""
    import torch

    from llmlab.inference import decode
    from llmlab.tiny.evaluate import greedy_continue, heldout_prompts

    prompts = heldout_prompts(ids.cpu(), n=cfg.agree_prompts, eot_id=tokenizer.eos_token_id or 0).to(ids.device)
    seq = greedy_continue(model, prompts, cfg.agree_tokens)  # (B, P + N): FP32 cache's greedy tokens
    p = prompts.shape[1]
    rows, ref_loss = [], None
    for fmt in formats:
        kl, loss = kl_divergence(model, model, ids, cfg.kl_tokens, cache_fmt=fmt)
        ref_loss = loss if ref_loss is None else ref_loss  # formats[0] is fp32
        with torch.no_grad():
            logits = decode.forward(model, seq[:, :-1], QDQCache(fmt, model.config), logits_to_keep=0)
        agree = (logits[:, p - 1 :].argmax(-1) == seq[:, p:]).float()
        rows.append(dict(format=fmt, loss=loss, loss_delta=loss - ref_loss, ppl_delta=math.exp(loss - ref_loss) - 1,
                         kl=kl, agreement=agree.mean().item(), positions=agree.numel(), eval_tokens=cfg.kl_tokens))
    return rows


WEIGHTS_FOR_FIT = {"llama-3-8b": "bf16", "llama-3.1-70b": "fp8"}  # 70B in BF16 (141 GB) does not fit 80 GB


def kv_fit_rows(formats, gpu_gb: float) -> list[dict]:
    """Tokens of KV that fit on one GPU after the weights, by formula (long-context bytes per token)."""
    from llmlab.core.flops import kv_bytes_per_token, param_count, shape
    from llmlab.core.models import arch_config
    from llmlab.inference import quant

    rows = []
    for name, wfmt in WEIGHTS_FOR_FIT.items():
        conf = arch_config(name)
        weights = param_count(conf) * (2 if wfmt == "bf16" else 1)
        d = shape(conf)["head_dim"]
        free = gpu_gb * 1e9 - weights
        for f in formats:
            bpt = kv_bytes_per_token(conf, 1) * quant.kv_bytes_per_value(f, d)
            rows.append(dict(model=f"arch:{name}", weights=f"{wfmt.upper()} {weights / 1e9:.0f} GB", kv_format=f,
                             bytes_per_token=bpt, free_GB=free / 1e9, tokens=max(0, int(free // bpt))))
        fp8 = next((r for r in rows if r["model"] == f"arch:{name}" and r["kv_format"] == "fp8"), None)
        for r in rows:
            if r["model"] == f"arch:{name}":
                r["x_fp8"] = r["tokens"] / fp8["tokens"] if fp8 and fp8["tokens"] else None
    return rows
