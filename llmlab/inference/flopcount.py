"""FLOPs as torch counts them: the cross-check of `llmlab.core.flops`' shape formulas.

`counted_flops` runs one forward (or builds the model on the meta device: shapes only) under
`torch.utils.flop_counter.FlopCounterMode`; `sdpa_flop_mapping` gives it the formula it lacks for
the CPU's flash-attention kernel (torch's own SDPA formula, as it counts the CUDA kernels).
"""

from __future__ import annotations


def counted_flops(model_or_config, tokens: int, context: int = 0, batch: int = 1) -> dict[str, int]:
    """FLOPs of one forward as `torch.utils.flop_counter.FlopCounterMode` counts them, by aten op.

    Given a loaded model, it runs on the model's device with random token ids. Given a config, the
    model is built on the meta device (no memory, no arithmetic: shapes only), so an 8B arch:
    shape costs no RAM (but a few seconds: every meta op runs Python shape code). `context` > 0
    first fills a KV cache of that many positions (not counted), then counts a forward of `tokens`
    new positions: tokens=1 is a decode step. Attention counts as dense T x T (the math path's bmm
    on meta; the CPU flash kernel mapped to torch's own SDPA formula), i.e. `causal=False`.
    """
    import torch
    from torch.utils.flop_counter import FlopCounterMode
    from transformers import AutoModelForCausalLM
    from transformers.initialization import no_init_weights

    from llmlab.inference.decode import forward, new_cache

    if isinstance(model_or_config, torch.nn.Module):
        model = model_or_config
    else:
        with torch.device("meta"), no_init_weights():
            model = AutoModelForCausalLM.from_config(model_or_config, dtype=torch.float32).eval()
    device = next(model.parameters()).device
    cache = new_cache(model)
    with torch.inference_mode():
        if context:
            forward(model, torch.zeros(batch, context, dtype=torch.long, device=device), cache)
        counter = FlopCounterMode(display=False, custom_mapping=sdpa_flop_mapping())
        with counter:
            forward(model, torch.zeros(batch, tokens, dtype=torch.long, device=device), cache)
    return {str(op).removeprefix("aten."): int(n) for op, n in counter.get_flop_counts()["Global"].items()}


def sdpa_flop_mapping() -> dict:
    """FlopCounterMode's `custom_mapping` for the SDPA kernel it has no formula for (the CPU's flash kernel):
    torch's own SDPA formula, dense T x T, as it counts the CUDA kernels."""
    import torch
    from torch.utils.flop_counter import sdpa_flop_count

    def cpu_flash(q, k, v, *args, **kwargs) -> int:  # shapes in (FlopCounterMode's wrapper)
        return sdpa_flop_count(q, k, v)

    return {torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: cpu_flash}
