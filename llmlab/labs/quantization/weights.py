"""Parts 1-3 of the quantization lab: weight formats' quality against FP32, and decode speed per format."""

from __future__ import annotations

import copy
import math

from llmlab.core.device import Device
from llmlab.core.stats import summary
from llmlab.labs.quantization.config import Config
from llmlab.labs.quantization.quality import kl_divergence


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
                         formula_bytes=b["matrix_bytes_formula"],
                         bytes_match=b["matrix_bytes"] == b["matrix_bytes_formula"],
                         other_bytes=b["other_bytes"], total_bytes=total, bits_per_param=8 * b["matrix_bytes"] / params,
                         x_fp32=total / (4 * params + b["other_bytes"]), x_bf16=total / (2 * params + b["other_bytes"]),
                         loss=loss, loss_delta=loss - ref_loss, ppl_delta=math.exp(loss - ref_loss) - 1, kl=kl,
                         agreement=agree["agreement"], positions=agree["positions"], eval_tokens=cfg.eval_tokens))
        del q
    return rows


def part_speed(model, label: str, formats, cfg: Config, device: Device, tokens: int = 0,
               repeats: int = 0) -> list[dict]:
    """Decode tokens/s per format and batch; each model's Linears swapped for QuantLinear (the path is named)."""
    import torch

    from llmlab.core.device import last_level_cache_bytes
    from llmlab.core.timing import interleaved
    from llmlab.inference import decode, quant

    models, paths, wbytes = {}, {}, {}
    for fmt in formats:
        m = copy.deepcopy(model)
        paths[fmt] = quant.quantize_linears(m, fmt)
        # what the path reads
        wbytes[fmt] = sum(mod.nbytes for mod in m.modules() if isinstance(mod, quant.QuantLinear))
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
