"""The serving lab's model: the built-in tiny on a CPU, an arch: shape sized to the GPU on CUDA."""

from __future__ import annotations

from llmlab.core.device import Device
from llmlab.labs.serving.config import Config

# ---------------------------------------------------------------- the model


def _dtype(device: Device):
    import torch

    if not device.is_cuda:
        return torch.float32
    return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16


def arch_model(name: str, device: Device, dtype, memory_share: float = 0.5):
    """`arch:name` with random weights (a timing only) in `dtype`: all its layers, or as many as fit in
    `memory_share` of the free memory (the rest is for the KV pools and the exactness check's HF forward)."""
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.initialization import no_init_weights

    from llmlab.core.flops import param_count
    from llmlab.core.models import _fill_random, arch_config

    conf = arch_config(name)
    elem = torch.empty(0, dtype=dtype).element_size()
    while conf.num_hidden_layers > 1 and elem * param_count(conf) > memory_share * device.free_memory_bytes():
        conf.num_hidden_layers -= 1
    with torch.device(device.torch), no_init_weights():
        model = AutoModelForCausalLM.from_config(conf, dtype=dtype)
    _fill_random(model)
    model.tie_weights()
    return model.eval(), f"arch:{name} x{conf.num_hidden_layers} layers (random weights)"


def speed_model(cfg: Config, device: Device):
    """(model, what it is): cfg.model, except that on CUDA the default tiny becomes cfg.gpu_arch (see the top)."""
    from llmlab.core.device import last_level_cache_bytes
    from llmlab.core.models import load

    dtype = _dtype(device)
    if device.is_cuda and cfg.model == "tiny":
        model, name = arch_model(cfg.gpu_arch, device, dtype)
    else:
        model, name = load(cfg.model, device, dtype=str(dtype).removeprefix("torch.")).model, cfg.model
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    cache = last_level_cache_bytes(device)
    return model, dict(model=name, dtype=str(dtype).removeprefix("torch."), weights_MB=weights / 1e6,
                       cache="L2" if device.is_cuda else "last-level cache", cache_MB=cache / 1e6,
                       weights_over_cache=weights / cache)
