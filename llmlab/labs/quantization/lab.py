"""The quantization lab's run: the formats checked, then parts 1-4 into tables (never printed, never judged here)."""

from __future__ import annotations

import math

from llmlab.core.device import Device, threads_for, torch_threads
from llmlab.core.errors import UsageError
from llmlab.core.results import LabResult
from llmlab.labs.quantization.config import LAB, VERSION, Config
from llmlab.labs.quantization.kvcache import kv_fit_rows, part_kv_bytes, part_kv_quality
from llmlab.labs.quantization.weights import part_speed, part_weights

GPU_MEMORY_SHARE = 0.5  # a GPU's speed model: every format's copy together in half the free memory
L2_MULTIPLE = 8  # ... and its smallest copy's weights at least 8x the L2, so decode streams them from HBM


# ---------------------------------------------------------------- set-up


def _formats(cfg: Config) -> tuple[list[str], list[str]]:
    """FP32 first (the reference), then the asked formats; UsageError for one this torch cannot run."""
    from llmlab.inference import quant

    w = ["fp32"] + [f for f in cfg.weights if f != "fp32"]
    kv = ["fp32"] + [f for f in cfg.kv if f != "fp32"]
    for names, flag in ((w, "--weights"), (kv, "--kv")):
        bad = [n for n in names if n not in quant.runnable([n])]
        if bad:
            raise UsageError(f"{flag} {','.join(bad)}: this torch has no float8_e4m3fn (needs torch >= 2.1); "
                             f"formats it can run: {', '.join(quant.runnable(names))}")
    return w, kv


def _check_groups(model, formats) -> None:
    from llmlab.inference import quant

    for f in formats:
        m = quant._INT4.match(f)
        if not m:
            continue
        g = int(m.group(1))
        bad = sorted({p.shape[1] for _, p in quant.quantizable(model) if p.shape[1] % g})
        if bad:
            raise UsageError(f"--weights {f}: group size {g} does not divide the input dimension {bad[0]} of "
                             "this model; use a divisor of "
                             f"{math.gcd(*[p.shape[1] for _, p in quant.quantizable(model)])}")


def _heldout(tokenizer):
    from llmlab.tiny.card import heldout_ids

    return heldout_ids(tokenizer)


# ---------------------------------------------------------------- run


def run(cfg: Config, device: Device, progress=None) -> LabResult:
    """Measures. Fills tables; never prints, never judges."""
    import torch

    from llmlab.core.models import load
    from llmlab.inference import quant

    res = LabResult.new(LAB, VERSION, cfg)
    wfmts, kvfmts = _formats(cfg)
    lm = load("tiny", device)
    _check_groups(lm.model, wfmts)
    arch_fmts = ["fp32"] + [f for f in cfg.arch_weights if f != "fp32"]
    with torch_threads(None if device.is_cuda else threads_for(cfg.threads, res.note)), res.guard():
        res.env["torch_threads"] = torch.get_num_threads()
        ids = _heldout(lm.tokenizer).to(device.torch)
        res.add_table("weights", part_weights(lm.model, lm.tokenizer, ids, wfmts, cfg))
        res.add_table("kernels", [quant.probe(f, device.torch) for f in wfmts])
        if device.is_cuda:
            tiny_bytes = sum(p.numel() * p.element_size() for p in lm.model.parameters())
            res.add_table("speed", _gpu_speed(cfg, device, wfmts, arch_fmts, tiny_bytes, res))
        else:
            speed = part_speed(lm.model, "tiny", wfmts, cfg, device)
            res.add_table("speed", speed)
            if cfg.arch:
                model, label = _arch_model(cfg.arch, cfg.arch_layers, device, cfg.seed)
                _check_groups(model, arch_fmts)
                speed += part_speed(model, label, arch_fmts, cfg, device, cfg.arch_decode_tokens, cfg.arch_repeats)
                del model
                res.add_table("speed", speed)
        res.add_table("kv_bytes", part_kv_bytes(lm.model, ids, kvfmts, cfg, device))
        res.add_table("kv_quality", part_kv_quality(lm.model, lm.tokenizer, ids, kvfmts, cfg, device))
        res.add_table("kv_fit", kv_fit_rows(kvfmts, cfg.gpu_gb))
        res.note("quality: weights replaced by their quantize-dequantize round trip, compute in FP32 "
                 "(the format's rounding, not a kernel's)")
        kernels = res.tables["kernels"].to_dict("records")
        emul = [r["format"] for r in kernels if r["path"] == quant.EMUL]
        res.note("kernels checked against the dequantized weights first; " +
                 (f"emulated on this {device.kind} (dequantize+FP32, not the format's speed): {', '.join(emul)}"
                  if emul else "every format ran a real kernel"))
        for r in kernels:
            if r["why"]:
                res.note(f"{r['format']}: {r['kernel']} failed its probe, emulated ({r['why']})")
    return res


def _arch_model(ref: str, layers: int, device: Device, seed: int):
    """An arch: shape cut to `layers`, built on the device with random weights (timing only)."""
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.initialization import no_init_weights

    from llmlab.core.models import _fill_random, arch_config

    conf = arch_config(ref.split(":", 1)[1])
    full, conf.num_hidden_layers = conf.num_hidden_layers, layers
    with torch.device(device.torch), no_init_weights():
        model = AutoModelForCausalLM.from_config(conf, dtype=torch.float32).eval()
    _fill_random(model, seed)
    model.tie_weights()
    return model, f"{ref} ({layers} of {full} layers)"


# bytes per parameter each format's timed copy holds (QuantLinear keeps the format's tensors; INT4's kernel its own too)
_COPY_BYTES = {"fp32": 4.0, "bf16": 2.0, "fp16": 2.0, "int8": 1.1, "fp8-tensor": 1.1, "fp8-channel": 1.1}


def gpu_speed_layers(ref: str, formats, free_bytes: int, l2_bytes: int) -> tuple[int, int, bool]:
    """(layers, full layers, leaves L2 behind) of the GPU speed model: as many layers of `ref` as let the
    original FP32 model, one FP32 copy in the making and every format's copy fit in GPU_MEMORY_SHARE of
    the free memory; it leaves L2 behind when the smallest copy's matrices are >= L2_MULTIPLE x L2."""
    from llmlab.core.flops import Shape
    from llmlab.core.models import arch_config

    conf = arch_config(ref.split(":", 1)[1])
    shape = Shape.of(conf)
    per_layer = sum(k * n for name, k, n, _ in shape.matmuls() if name != "lm_head")
    fixed = shape.hidden * shape.vocab * (1 if conf.tie_word_embeddings else 2)  # embedding + LM head
    per_param = 8.0 + sum(_COPY_BYTES.get(f, 1.2) for f in formats)  # 1.2: INT4 values + scales, twice
    layers = int((GPU_MEMORY_SHARE * free_bytes / per_param - fixed) // per_layer)
    layers = max(1, min(conf.num_hidden_layers, layers))
    smallest = min(_COPY_BYTES.get(f, 0.6) for f in formats) * (layers * per_layer + shape.hidden * shape.vocab)
    return layers, conf.num_hidden_layers, smallest >= L2_MULTIPLE * l2_bytes


def _gpu_speed(cfg: Config, device: Device, wfmts, arch_fmts, tiny_bytes: int, res: LabResult) -> list[dict]:
    """The speed part on a GPU: the formats with a kernel here, on cfg.gpu_arch sized from the free memory and L2."""
    from llmlab.core.device import last_level_cache_bytes
    from llmlab.inference import quant

    fmts = list(dict.fromkeys(arch_fmts + [f for f in wfmts if quant.probe(f, device.torch)["path"] != quant.EMUL]))
    l2 = last_level_cache_bytes(device)
    layers, full, beyond = gpu_speed_layers(cfg.gpu_arch, fmts, device.free_memory_bytes(), l2)
    model, label = _arch_model(cfg.gpu_arch, layers, device, cfg.seed)
    _check_groups(model, fmts)
    res.note(f"speed part on {device.spec}: {label}, random weights (tiny's {tiny_bytes / 2**20:.0f} MB sit in the "
             "GPU's "
             f"{l2 / 2**20:.0f} MB L2); " + ("its smallest copy is >= 8x the L2" if beyond else
                                           "even so its smallest copy is < 8x the L2: partly cache-bound"))
    try:
        return part_speed(model, label, fmts, cfg, device, cfg.arch_decode_tokens, cfg.arch_repeats)
    finally:
        del model
