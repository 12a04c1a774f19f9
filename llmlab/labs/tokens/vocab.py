"""Part 3 of the tokens lab: what a vocabulary of V rows costs in bytes and in a timed decode step."""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np
import torch

from llmlab.core.device import Device
from llmlab.core.render import track
from llmlab.core.stats import summary
from llmlab.core.timing import interleaved
from llmlab.labs.tokens.config import Config

# ---------------------------------------------------------------- part 3: vocabulary size


def shape_config(cfg: Config, vocab: int, layers: int):
    """A LlamaConfig of cfg.shape's layer shape at vocabulary `vocab`, `layers` layers, untied head."""
    from transformers import LlamaConfig

    from llmlab.core.flops import shape
    from llmlab.core.models import load_config

    s = shape(load_config(cfg.shape))
    return LlamaConfig(vocab_size=vocab, hidden_size=s["hidden"], intermediate_size=s["intermediate"],
                       num_hidden_layers=layers, num_attention_heads=s["heads"], num_key_value_heads=s["kv_heads"],
                       head_dim=s["head_dim"], tie_word_embeddings=False, max_position_embeddings=4096)


def layer_bytes(cfg: Config, dtype_bytes: int) -> int:
    """Weight bytes of one decoder layer of cfg.shape (attention + SwiGLU MLP; norms left out)."""
    from llmlab.core.flops import shape
    from llmlab.core.models import load_config

    s = shape(load_config(cfg.shape))
    h, hd = s["hidden"], s["head_dim"]
    return dtype_bytes * (2 * h * s["heads"] * hd + 2 * h * s["kv_heads"] * hd + 3 * h * s["intermediate"])


def sweep_layers(cfg: Config, device: Device, dtype_bytes: int) -> int:
    """cfg.layers; on CUDA at least enough layers that the body's weights are llc_multiple x the device's L2."""
    if not device.is_cuda:
        return cfg.layers
    from llmlab.core.device import last_level_cache_bytes

    return max(cfg.layers, math.ceil(cfg.llc_multiple * last_level_cache_bytes(device) / layer_bytes(cfg, dtype_bytes)))


def sweep_dtype(device: Device) -> torch.dtype:
    """BF16 on a GPU (what serving runs), FP32 on a CPU (no fast BF16 matmul on most)."""
    return torch.bfloat16 if device.is_cuda else torch.float32


def build(conf, device: Device, dtype: torch.dtype, seed: int):
    """LlamaForCausalLM at random weights (N(0, 0.02), norms 1), in eval mode on the device."""
    from transformers import LlamaForCausalLM
    from transformers.initialization import no_init_weights

    with torch.device(device.torch), no_init_weights():
        model = LlamaForCausalLM(conf).to(dtype)
    g = torch.Generator(device=device.torch).manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() < 2:
                p.fill_(1.0)
            else:
                p.copy_(torch.randn(p.shape, generator=g, device=device.torch, dtype=torch.float32).mul_(0.02))
    return model.eval()


def body_params(model) -> int:
    """Matmul parameters of the decoder layers: everything but the embedding, the LM head and the norms."""
    skip = {model.get_input_embeddings().weight.data_ptr(), model.get_output_embeddings().weight.data_ptr()}
    return sum(p.numel() for p in model.parameters() if p.dim() >= 2 and p.data_ptr() not in skip)


def vocab_row(conf, cfg: Config, device: Device) -> dict:
    """Bytes counted from the tensors, and a decode step against the LM head alone, timed in turns."""
    from llmlab.inference import decode

    dtype = sweep_dtype(device)
    model = build(conf, device, dtype, cfg.seed)
    emb, head = model.get_input_embeddings().weight, model.get_output_embeddings().weight
    v, d, b = conf.vocab_size, conf.hidden_size, emb.element_size()
    g = torch.Generator(device=device.torch).manual_seed(cfg.seed)
    prompt = torch.randint(0, v, (1, cfg.context), generator=g, device=device.torch)  # (1, C)
    token = prompt[:, -1:]  # (1, 1)
    cache = decode.new_cache(model)
    h = torch.randn(1, 1, d, generator=g, device=device.torch).to(dtype)  # (1, 1, d): the last hidden state
    with torch.inference_mode():
        decode.forward(model, prompt, cache)
        logits = decode.forward(model, token, cache)  # (1, 1, V)
        fns = {"step": lambda: decode.forward(model, token, cache), "head": lambda: model.lm_head(h)}
        timing = interleaved(fns, cfg.repeats, device, setups={"step": lambda: decode.crop(cache, cfg.context)})
    step, head_s = summary(timing.seconds["step"]), summary(timing.seconds["head"])
    shares = [hh / s for hh, s in zip(timing.seconds["head"], timing.seconds["step"], strict=True)]
    body = body_params(model)
    row = dict(vocab=v, hidden=d, layers=conf.num_hidden_layers, dtype=str(dtype).removeprefix("torch."),
               bytes_per_value=b, embed_B=emb.untyped_storage().nbytes(),
               head_B=0 if head.data_ptr() == emb.data_ptr() else head.untyped_storage().nbytes(),
               formula_embed_B=v * d * b, formula_head_B=v * d * b,
               logits_B_per_token=logits[0, -1].numel() * logits.element_size(), formula_logits_B_per_token=v * b,
               body_params=body, head_flops=2 * d * v, step_flops=2 * (d * v + body),
               step_ms=1e3 * step.median, step_ms_p10=1e3 * step.p10, step_ms_p90=1e3 * step.p90,
               head_ms=1e3 * head_s.median, head_GBps=head.untyped_storage().nbytes() / head_s.median / 1e9,
               head_share=float(np.median(shares)),
               formula_share=d * v / (d * v + body))
    return row


def vocab_rows(cfg: Config, device: Device, layers: int, progress=None) -> Iterator[dict]:
    """One row per vocabulary size, as it is measured (a Ctrl-C keeps the sizes done)."""
    from llmlab.core.flops import shape
    from llmlab.core.models import load_config

    full = shape(load_config(cfg.shape))
    for v in track(progress, cfg.vocab_sizes, "vocabulary: bytes and a timed decode step"):
        row = vocab_row(shape_config(cfg, v, layers), cfg, device)
        per_layer = row["body_params"] // layers
        row["full_layers"] = full["layers"]
        row["formula_share_full"] = row["hidden"] * v / (row["hidden"] * v + full["layers"] * per_layer)
        yield row
