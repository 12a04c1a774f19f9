"""Lab: quantization — precision traded for memory and speed, in the weights and in the KV cache.

Parts:
1. weight formats on the built-in `tiny` (real weights): FP32, BF16, FP16, INT8 per-channel, INT4
   group-wise (sym/asym), FP8 E4M3 (per-tensor / per-channel). Quality with FP32 compute and the
   weights replaced by their quantize-dequantize round trip: held-out loss and perplexity delta vs
   FP32 (llmlab.tiny.evaluate.heldout_loss), greedy agreement with FP32 (greedy_agreement), KL of
   the next-token distributions.
2. bytes: measured from the packed tensors vs bits x params / 8 + scales (exact).
3. decode tokens/s per format at batch 1 and 16, interleaved rounds, the device synchronised at
   every step. Each row names its path: the device's kernel for the format (llmlab.inference.quant:
   FP32/BF16/FP16 matmul; INT8 torch._weight_int8pack_mm; INT4 _weight_int4pack_mm(_for_cpu); FP8
   torch._scaled_mm where the GPU has FP8 tensor cores), each checked against the dequantized
   reference before timing, or "dequantize+FP32 (emul)" (no kernel here: not the format's speed).
   On a CPU the full run adds an arch: shape cut to a few layers; on a GPU, whose L2 holds all of
   tiny, the speed part times an arch: shape with as many layers as the free memory holds (random
   weights: timing only).
4. KV formats (BF16, FP8 per-head scale, INT8 per-token scale, NVFP4): bytes of a real prefill cache
   measured vs the kvcache formula + scales; tokens that fit on an 80 GB GPU after the weights
   (formula); quality when K and V are quantize-dequantized as they enter the cache.

References:
- NVIDIA, "Optimizing Inference for Long Context and Large Batch Sizes with NVFP4 KV Cache"
  (E. Alvarez, 2025-12-08, developer.nvidia.com/blog): "NVFP4 cuts KV cache memory footprint by up
  to 50% [vs FP8] ... with <1% accuracy loss across code-generation, knowledge, and long-context
  benchmarks" (benchmark accuracy, not perplexity: our proxy is held-out perplexity).
- GPTQ (arXiv 2210.17323), AWQ (arXiv 2306.00978): INT4 g128 costs a few % perplexity on large models.
- LLM.int8() (arXiv 2208.07339); FP8 formats (arXiv 2209.05433); formulas in llmlab/inference/quant.py.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

from llmlab.core.device import Device, threads_for, torch_threads
from llmlab.core.errors import UsageError
from llmlab.core.results import Chart, Claim, Col, LabResult, View
from llmlab.core.stats import summary

# torch and llmlab.inference.quant load inside the functions: the CLI imports this module for its help

LAB = "quantization"
VERSION = 2  # 2: kernel paths per device (probed), synchronised steps, a device-sized model on a GPU, KV bytes measured
JUDGE_VERSION = 2
INT8_BYTES_MAX = 0.55  # "halves BF16": values 1 B vs 2 B, plus FP32 row scales and FP32 norms
INT8_LOSS_MAX = 0.01  # nats: LLM.int8()-style per-channel INT8 weight-only is near-lossless
INT4_PPL_MAX = 0.05  # GPTQ/AWQ: INT4 g128 within a few % perplexity (large models; a 5M model is more fragile)
NVFP4_FP8_MAX = 0.6  # "roughly halves": 0.5 B + 1/16 B of block scale per value against 1 B
NVFP4_PPL_MAX = 0.01  # the article's "<1% accuracy loss", read as <1% perplexity (a proxy)
TRACK_FRACTION = 0.7  # speed-up tracks bytes: at least 70% of the bytes ratio, real kernels only
GPU_MEMORY_SHARE = 0.5  # a GPU's speed model: every format's copy together in half the free memory
L2_MULTIPLE = 8  # ... and its smallest copy's weights at least 8x the L2, so decode streams them from HBM


@dataclass(frozen=True)
class Config:
    weights: tuple[str, ...] = ("fp32", "bf16", "fp16", "int8", "int4-g32", "int4-g128", "int4-g32-asym",
                                "int4-g128-asym", "fp8-tensor", "fp8-channel")  # quant.WEIGHT_FORMATS: every one (FP32 is the reference, always run)
    kv: tuple[str, ...] = ("bf16", "fp8", "int8", "nvfp4")  # the KV formats (FP32 cache is the reference)
    arch: str = "arch:qwen2.5-0.5b"  # a real shape for the speed part (random weights); "" = tiny only
    arch_layers: int = 2  # arch: cut to this many layers: the shape of a layer and the LM head, timing only
    arch_weights: tuple[str, ...] = ("fp32", "bf16", "int8")  # real kernels only: emulated INT4/FP8 take ~10 s a step
    arch_decode_tokens: int = 8  # a 136M-parameter LM head: ~0.5 s a step on 2 cores, so few tokens
    arch_repeats: int = 3  # and few rounds (the median of 3)
    gpu_arch: str = "arch:llama-3-8b"  # on a GPU the speed part's shape instead (tiny sits in L2), layers from free memory
    batches: tuple[int, ...] = (1, 16)  # the decode batches
    decode_tokens: int = 32  # tokens decoded per timed call
    prompt_len: int = 32  # prompt of the timed decode
    repeats: int = 5  # interleaved timing rounds (median)
    eval_tokens: int = 32_768  # held-out tokens for the loss (the model card's amount)
    kl_tokens: int = 8_192  # held-out tokens for the KL (a forward of FP32 and the format each)
    agree_prompts: int = 32  # x agree_tokens = 1,024 greedy positions (the number)
    agree_tokens: int = 32
    kv_tokens: int = 256  # length of the prefill whose cache is measured for bytes and error
    gpu_gb: float = 80.0  # the "80 GB GPU" of the fit table (A100/H100 80 GB)
    threads: int = 0  # torch CPU threads; 0 keeps torch's default (1 when oversubscribed)
    seed: int = 0

    def __post_init__(self):
        from llmlab.inference import quant

        for w in self.weights + self.arch_weights:
            quant.check_weight_format(w)
        for k in self.kv:
            quant.check_kv_format(k)
        if not self.weights or not self.kv:
            raise ValueError("--weights and --kv need at least one format each")
        if min(self.batches, default=0) < 1 or min(self.decode_tokens, self.arch_decode_tokens) < 2 or \
                min(self.repeats, self.arch_repeats) < 1:
            raise ValueError("batches must be >= 1, decode tokens >= 2, repeats >= 1")
        if self.eval_tokens < 512 or self.kl_tokens < 256 or self.agree_prompts < 1 or self.agree_tokens < 2:
            raise ValueError("--eval-tokens must be >= 512 (two 256-token windows); agreement needs >= 1 prompt")
        if self.kv_tokens < 16 or self.gpu_gb <= 0 or self.arch_layers < 1 or self.threads < 0:
            raise ValueError("kv tokens >= 16, GPU GB > 0, arch layers >= 1, threads >= 0")
        for a in (self.arch, self.gpu_arch):
            if a and not a.startswith("arch:"):
                raise ValueError(f"--arch {a!r}: give an arch:NAME shape (random weights) or ''")

    @classmethod
    def quick(cls) -> Config:
        return cls(**QUICK)


# --quick: tiny only, fewer formats, tokens and rounds (a dict, so the CLI's help reads it without torch)
QUICK = dict(weights=("fp32", "bf16", "int8", "int4-g128", "fp8-channel"), arch="", decode_tokens=8, prompt_len=16,
             repeats=2, eval_tokens=2048, kl_tokens=1024, agree_prompts=8, agree_tokens=16, kv_tokens=128)


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
                             f"this model; use a divisor of {math.gcd(*[p.shape[1] for _, p in quant.quantizable(model)])}")


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
    res.note(f"speed part on {device.spec}: {label}, random weights (tiny's {tiny_bytes / 2**20:.0f} MB sit in the GPU's "
             f"{l2 / 2**20:.0f} MB L2); " + ("its smallest copy is >= 8x the L2" if beyond else
                                           "even so its smallest copy is < 8x the L2: partly cache-bound"))
    try:
        return part_speed(model, label, fmts, cfg, device, cfg.arch_decode_tokens, cfg.arch_repeats)
    finally:
        del model


def kl_divergence(ref, model, ids, tokens: int, seq_len: int = 256, cache_fmt: str | None = None) -> tuple[float, float]:
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


def part_weights(model, tokenizer, ids, formats, cfg: Config) -> list[dict]:
    """Bytes (measured vs formula) and quality of each weight format on tiny, FP32 compute."""
    from llmlab.inference import quant
    from llmlab.tiny.evaluate import greedy_agreement, heldout_loss, heldout_prompts

    prompts = heldout_prompts(ids.cpu(), n=cfg.agree_prompts, eot_id=tokenizer.eos_token_id or 0).to(ids.device)
    params = sum(p.numel() for _, p in quant.quantizable(model))
    others = sum(p.numel() for p in model.parameters()) - params
    ref_loss = heldout_loss(model, ids, max_tokens=cfg.eval_tokens)
    rows = []
    for fmt in formats:
        q = copy.deepcopy(model)
        b = quant.fake_quantize_(q, fmt)
        loss = heldout_loss(q, ids, max_tokens=cfg.eval_tokens)
        kl, _ = kl_divergence(model, q, ids, cfg.kl_tokens)
        agree = greedy_agreement(model, q, prompts, cfg.agree_tokens)
        total = b["matrix_bytes"] + b["other_bytes"]
        rows.append(dict(format=fmt, matrix_params=params, other_params=others, matrix_bytes=b["matrix_bytes"],
                         formula_bytes=b["matrix_bytes_formula"], bytes_match=b["matrix_bytes"] == b["matrix_bytes_formula"],
                         other_bytes=b["other_bytes"], total_bytes=total, bits_per_param=8 * b["matrix_bytes"] / params,
                         x_fp32=total / (4 * params + b["other_bytes"]), x_bf16=total / (2 * params + b["other_bytes"]),
                         loss=loss, loss_delta=loss - ref_loss, ppl_delta=math.exp(loss - ref_loss) - 1, kl=kl,
                         agreement=agree["agreement"], positions=agree["positions"], eval_tokens=cfg.eval_tokens))
        del q
    return rows


def part_speed(model, label: str, formats, cfg: Config, device: Device, tokens: int = 0, repeats: int = 0) -> list[dict]:
    """Decode tokens/s per format and batch; each model's Linears swapped for QuantLinear (the path is named)."""
    import torch

    from llmlab.core.device import last_level_cache_bytes
    from llmlab.core.timing import interleaved
    from llmlab.inference import decode, quant

    models, paths, wbytes = {}, {}, {}
    for fmt in formats:
        m = copy.deepcopy(model)
        paths[fmt] = quant.quantize_linears(m, fmt)
        wbytes[fmt] = sum(mod.nbytes for mod in m.modules() if isinstance(mod, quant.QuantLinear))  # what the path reads
        models[fmt] = m
    llc = last_level_cache_bytes(device)
    g = torch.Generator().manual_seed(cfg.seed)
    rows = []
    for b in cfg.batches:
        prompt = torch.randint(0, model.config.vocab_size, (b, cfg.prompt_len), generator=g).to(device.torch)  # (B, S)
        gens: dict[str, list] = {f: [] for f in formats}
        fns = {f: (lambda f=f, gens=gens, prompt=prompt: gens[f].append(  # each step synchronised: the GPU's time
            decode.generate(models[f], prompt, tokens or cfg.decode_tokens, sync=device.synchronize))) for f in formats}
        timing = interleaved(fns, repeats or cfg.repeats, device)
        for f in formats:
            # tokens/s of the decode steps alone (each Generation times its steps; the prefill is left out)
            tps = summary([b / (sum(gen.step_s) / len(gen.step_s)) for gen in gens[f][1:]]).median
            rows.append(dict(model=label, device=device.kind, format=f, batch=b, path=paths[f],
                             real_kernel=quant.EMUL not in paths[f], linear_bytes=wbytes[f],
                             fits_in_cache=wbytes[f] <= llc, llc_bytes=llc,
                             call_s=summary(timing.seconds[f]).median, tokens_per_s=tps))
        base = next(r for r in rows if r["format"] == "fp32" and r["batch"] == b and r["model"] == label)
        for r in rows:
            if r["batch"] == b and r["model"] == label:
                r["speedup"] = r["tokens_per_s"] / base["tokens_per_s"]
                r["bytes_ratio"] = base["linear_bytes"] / r["linear_bytes"]
    return rows


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
                         rel_err_k=math.sqrt(err["k"][0] / err["k"][1]), rel_err_v=math.sqrt(err["v"][0] / err["v"][1])))
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
    from llmlab.core.models import arch_config, kv_bytes_per_token, param_count, shape
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


# ---------------------------------------------------------------- judge


def _rows(result: LabResult, table: str):
    df = result.tables.get(table)
    return None if df is None or df.empty else df


def _none(cid: str, text: str, expected: str, result: LabResult, table: str) -> Claim:
    return Claim(cid, text, expected, "-", None, note=result.skipped.get(table, f"no {table} table in this run"))


def judge(result: LabResult) -> list[Claim]:
    """Every verdict from the tables alone."""
    claims: list[Claim] = []
    w = _rows(result, "weights")
    kvb = _rows(result, "kv_bytes")
    kvq = _rows(result, "kv_quality")
    speed = _rows(result, "speed")

    t, e = "FP32 -> FP32 'quantization' is the identity", "loss delta = 0, agreement = 100%, KL = 0, 32 bits, exactly"
    if w is None or "fp32" not in set(w.format):
        claims.append(_none("quantization.fp32_identity", t, e, result, "weights"))
    else:
        r = w.set_index("format").loc["fp32"]
        ok = r.loss_delta == 0 and r.agreement == 1 and r.kl == 0 and r.bits_per_param == 32
        claims.append(Claim("quantization.fp32_identity", t, e, f"delta {r.loss_delta:.2g}, agreement {r.agreement:.1%}, "
                            f"KL {r.kl:.2g}, {r.bits_per_param:g} bits", bool(ok)))

    t, e = "bytes counted from the tensors equal the formula", "packed bytes = bits x params / 8 + scales, exactly, every format"
    tabs = [df for df in (w, kvb) if df is not None]
    if not tabs:
        claims.append(_none("quantization.bytes_match_formula", t, e, result, "weights"))
    else:
        bad = [f for df in tabs for f, ok in zip(df.format, df.bytes_match, strict=True) if not ok]
        n = sum(len(df) for df in tabs)
        claims.append(Claim("quantization.bytes_match_formula", t, e,
                            f"{n - len(bad)} of {n} formats exact" + (f"; off: {', '.join(bad)}" if bad else ""), not bad))

    t = "INT8 weights halve BF16's memory at a small loss cost"
    e = f"<= {INT8_BYTES_MAX}x BF16's bytes, |loss delta| <= {INT8_LOSS_MAX} nats"
    if w is None or "int8" not in set(w.format):
        claims.append(_none("quantization.int8_halves_memory", t, e, result, "weights"))
    else:
        r = w.set_index("format").loc["int8"]
        claims.append(Claim("quantization.int8_halves_memory", t, e,
                            f"{r.x_bf16:.3f}x BF16, loss delta {r.loss_delta:+.4f}, agreement {r.agreement:.1%}",
                            bool(r.x_bf16 <= INT8_BYTES_MAX and abs(r.loss_delta) <= INT8_LOSS_MAX)))

    t, e = "INT4 group-wise weights keep perplexity within a few %", f"the best INT4 format's perplexity delta <= +{INT4_PPL_MAX:.0%}"
    int4 = w[w.format.str.startswith("int4")] if w is not None else None
    if int4 is None or int4.empty:
        claims.append(_none("quantization.int4_perplexity", t, e, result, "weights"))
    else:
        best = int4.loc[int4.ppl_delta.idxmin()]
        claims.append(Claim("quantization.int4_perplexity", t, e,
                            f"{best.format}: {best.ppl_delta:+.1%} ({best.bits_per_param:.2f} bits/param)",
                            bool(best.ppl_delta <= INT4_PPL_MAX),
                            note="a 5M-parameter model has little redundancy; the papers measure 7B+ models"))

    t = "decode speed-up tracks the weight bytes ratio (memory-bound)"
    e = f"speed-up >= {TRACK_FRACTION:.0%} x bytes ratio: real kernels, smallest batch, the model with most bytes"
    sp = speed[(speed.format != "fp32") & speed.real_kernel & (speed.batch == speed.batch.min())] if speed is not None else None
    if sp is None or sp.empty:
        claims.append(_none("quantization.speedup_tracks_bytes", t, e, result, "speed"))
    else:
        big = sp[sp.linear_bytes == sp.linear_bytes.max()] if not sp.fits_in_cache.all() else sp
        big = sp[sp.model == big.model.iloc[0]]
        frac = big.speedup / big.bytes_ratio
        worst = big.loc[frac.idxmin()]
        holds = bool((frac >= TRACK_FRACTION).all())
        claims.append(Claim("quantization.speedup_tracks_bytes", t, e,
                            f"{worst.format}: {worst.speedup:.2f}x for {worst.bytes_ratio:.1f}x fewer bytes ({worst.model}, "
                            f"batch {int(worst.batch)})", holds, note=_speed_note(big, holds)))

    t = "NVFP4 KV roughly halves FP8's KV memory (NVIDIA)"
    e = f"NVFP4 / FP8 bytes counted from the packed tensors of one cache <= {NVFP4_FP8_MAX} (article: -50%)"
    if kvb is None or not {"fp8", "nvfp4"} <= set(kvb.format):
        claims.append(_none("quantization.nvfp4_kv_vs_fp8", t, e, result, "kv_bytes"))
    else:
        x = _nvfp4_over_fp8(kvb)
        claims.append(Claim("quantization.nvfp4_kv_vs_fp8", t, e, f"{x:.4f}x -> {1 / x:.2f}x the tokens in the same memory",
                            bool(x <= NVFP4_FP8_MAX), note="the E4M3 scale per 16 values adds 1/16 B per value"))

    t = "NVFP4 KV costs < 1% accuracy (NVIDIA)"
    e = f"perplexity delta < +{NVFP4_PPL_MAX:.0%} (NVFP4 K, V in the cache; a proxy)"
    if kvq is None or "nvfp4" not in set(kvq.format):
        claims.append(_none("quantization.nvfp4_kv_quality", t, e, result, "kv_quality"))
    else:
        r = kvq.set_index("format").loc["nvfp4"]
        claims.append(Claim("quantization.nvfp4_kv_quality", t, e,
                            f"{r.ppl_delta:+.2%} perplexity, agreement {r.agreement:.1%} (tiny)",
                            bool(r.ppl_delta < NVFP4_PPL_MAX),
                            note="the article measured benchmark accuracy of large models, not tiny's perplexity"))
    return claims


def _nvfp4_over_fp8(kvb) -> float:
    """NVFP4 / FP8 bytes of the same cache, as counted from the packed tensors (the `bytes` column)."""
    k = kvb.set_index("format")
    return float(k.loc["nvfp4", "bytes"] / k.loc["fp8", "bytes"])


def _where(speed) -> tuple[str, str]:
    """(the device's cache, its memory) in words, from the speed table's device column."""
    gpu = "device" in speed and (speed.device == "cuda").any()
    return ("the GPU's L2", "HBM") if gpu else ("the CPU's cache", "DRAM")


def _speed_note(rows, holds: bool) -> str:
    cache, memory = _where(rows)
    if rows.fits_in_cache.all():
        return f"the weights fit in {cache}: decode is not bound by {memory} bytes"
    return (f"beyond {cache}: fewer bytes from {memory}, and " +
            ("the kernels turn them into speed" if holds else "this device's kernels do not turn them into speed"))


def headline(result: LabResult, claims: list[Claim]) -> str:
    w, kvb, speed = _rows(result, "weights"), _rows(result, "kv_bytes"), _rows(result, "speed")
    if w is None or kvb is None or "int8" not in set(w.format) or not {"fp8", "nvfp4"} <= set(kvb.format):
        return ""
    r = w.set_index("format").loc["int8"]
    text = (f"INT8: {r.x_bf16:.2f}x BF16's bytes, loss delta {r.loss_delta:+.4f} nats; NVFP4 KV: "
            f"{1 / _nvfp4_over_fp8(kvb):.2f}x FP8's tokens.")
    verdict = next((c.holds for c in claims if c.id == "quantization.speedup_tracks_bytes"), None)
    if speed is None or verdict is None:
        return text
    on = "a GPU" if _where(speed)[1] == "HBM" else "a CPU"
    return text + (f" Decode on {on} tracked the bytes." if verdict else f" Decode on {on} followed the kernel, not the bytes.")


def views(result: LabResult) -> list[View]:
    return [
        View("1. Weight formats: bytes and quality (tiny, FP32 compute)",
             "Bytes (= the formula, exactly) vs held-out loss, KL and greedy agreement?", "weights",
             (Col("format", "format", width=14), Col("bits_per_param", "bits / param", ".2f"),
              Col("x_bf16", "x BF16 bytes", ".3f"), Col("loss_delta", "loss delta nats", "+.4f"),
              Col("ppl_delta", "ppl delta", "+.2%"), Col("kl", "KL nats", ".2e"), Col("agreement", "greedy agree", "%")),
             chart=Chart("loss delta vs bits per parameter", "weights", "bits_per_param", "loss_delta", kind="scatter",
                         xlabel="bits / param", ylabel="nats")),
        View("2. Decode speed", "Tokens/s per format, batch 1 and 16: does the speed-up track the bytes?", "speed",
             (Col("model", "model", width=14), Col("format", "format", width=14), Col("batch", "B", "int"),
              Col("tokens_per_s", "tok / s", "int"), Col("speedup", "x FP32", "x"), Col("bytes_ratio", "bytes / FP32", "x"),
              Col("path", "path", width=28)), max_rows=30),
        View("3. KV cache formats: bytes and error", "Bytes per token of tiny's real cache, against the formula?",
             "kv_bytes", (Col("format", "format"), Col("bytes_per_token", "B / token", ".1f"),
                          Col("bytes_match", "= formula"), Col("x_fp8_bytes", "x FP8", ".3f"),
                          Col("rel_err_k", "K rel err", ".2e"), Col("rel_err_v", "V rel err", ".2e"))),
        View("   ... quality with the cache quantized in the decode loop", "Loss, KL and greedy agreement vs an FP32 cache?",
             "kv_quality", (Col("format", "format"), Col("loss_delta", "loss delta nats", "+.4f"),
                            Col("ppl_delta", "ppl delta", "+.2%"), Col("kl", "KL nats", ".2e"),
                            Col("agreement", "greedy agree", "%"))),
        View("   ... tokens that fit on an 80 GB GPU after the weights", "How many tokens of KV per format (formula)?",
             "kv_fit", (Col("model", "model", width=18), Col("weights", "weights"), Col("kv_format", "KV"),
                        Col("bytes_per_token", "B / token", "int"), Col("tokens", "tokens", "int"), Col("x_fp8", "x FP8", "x")),
             rows=lambda df: df[df.kv_format != "fp32"]),
    ]
