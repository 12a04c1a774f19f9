"""The verify-cost curve: what one target forward over k tokens costs against one token, k = 1..16.

Speculative decoding's premise is that verifying k drafted tokens in one forward costs about one decode
step, because decode is memory-bound: the weights are read once per forward whatever k is. That holds
while k tokens' FLOPs stay under the time the weights take to stream. A model that lives in the cache
(the built-in pair on a CPU) is compute- and overhead-bound instead, so its curve rises at once. Two
regimes are measured with the same code: the model at hand, and an `arch:` model with random weights
(a timing only) with enough layers that its weights are several times the last-level cache the device
reports. On a GPU the built-in pair sits in L2, so the timed parts use `speed_pair`: an `arch:` target
and draft sized from the device's free memory and L2, never from CPU constants.

References: Leviathan et al. 2023 (arXiv 2211.17192), section 3.4 (the cost of verifying gamma + 1 tokens);
Williams, Waterman, Patterson 2009, "Roofline" (the ridge point between memory- and compute-bound).
"""

from __future__ import annotations

import math
import statistics
import time

import torch

from llmlab.core.device import Device
from llmlab.inference import decode
from llmlab.inference.speculative.metrics import expected_tau


def verify_curve(model, device: Device, ks: tuple[int, ...], samples: int, context: int = 64) -> dict[int, float]:
    """Median ms of one cached forward over k new tokens after `context` tokens, each k in turn, `samples` times."""
    vocab = model.config.vocab_size
    # (1, S): the tokens only shape the timing
    ids = torch.arange(context + max(ks), device=device.torch)[None] % (vocab - 1) + 1
    times: dict[int, list[float]] = {k: [] for k in ks}
    with torch.inference_mode():
        cache = decode.new_cache(model)
        decode.forward(model, ids[:, :context], cache)
        for k in ks:  # one untimed warm-up of every shape
            decode.forward(model, ids[:, context : context + k], cache, logits_to_keep=k)
            decode.crop(cache, context)
        for _ in range(samples):
            for k in ks:
                device.synchronize()
                t0 = time.perf_counter()
                decode.forward(model, ids[:, context : context + k], cache, logits_to_keep=k)
                device.synchronize()
                times[k].append((time.perf_counter() - t0) * 1e3)
                decode.crop(cache, context)
    return {k: statistics.median(v) for k, v in times.items()}


class TooLarge(ValueError):
    """The model a measurement needs does not fit in the memory this device has free: that part is not measured."""


MEMORY_SHARE = 0.5  # a sized model takes at most this share of the device's free memory (activations, peers)


def layers_for(conf, nbytes: int, dtype_bytes: int) -> int:
    """The fewest layers (at least 1) of `conf`'s shapes whose weights are at least nbytes. Past the published
    layer count the same layers repeat: the bytes, not the depth, set the regime."""
    from llmlab.core.flops import param_count

    conf.num_hidden_layers = 0
    base = param_count(conf)  # embeddings, head, final norm
    conf.num_hidden_layers = 1
    per_layer = param_count(conf) - base
    return max(1, math.ceil((nbytes / dtype_bytes - base) / per_layer))


def build_arch(arch: str, layers: int, device: Device, dtype: torch.dtype = torch.float32, seed: int = 0):
    """The `arch` architecture cut (or extended) to `layers` layers, random weights (a timing only), eval mode.
    Raises TooLarge when its weights exceed MEMORY_SHARE of the device's free memory."""
    from transformers import AutoModelForCausalLM
    from transformers.initialization import no_init_weights

    from llmlab.core.flops import param_count
    from llmlab.core.models import _fill_random, arch_config

    conf = arch_config(arch)
    kinds = getattr(conf, "layer_types", None)  # per-layer attention kinds: repeat the published pattern
    conf.num_hidden_layers = layers
    if kinds:
        conf.layer_types = [kinds[i % len(kinds)] for i in range(layers)]
    need, free = param_count(conf) * dtype.itemsize, device.free_memory_bytes()
    if need > MEMORY_SHARE * free:
        raise TooLarge(f"arch:{arch} x{layers} layers needs {need / 1e6:,.0f} MB of weights, more than "
                       f"{MEMORY_SHARE:.0%} of the {free / 1e6:,.0f} MB free")
    with torch.device(device.torch), no_init_weights():
        model = AutoModelForCausalLM.from_config(conf, dtype=dtype)
    _fill_random(model, seed)
    model.tie_weights()
    nbytes = dtype.itemsize * sum(p.numel() for p in model.parameters())
    return model.eval(), dict(model=f"arch:{arch} x{layers} layers", layers=layers, weights_MB=nbytes / 1e6)


def dram_model(arch: str, llc_multiple: int, device: Device, seed: int = 0, max_bytes: float = math.inf):
    """The `arch` architecture, random weights, with the fewest layers whose FP32 weights are at least
    llc_multiple x the last-level cache this device reports (CPU: the largest cache in sysfs; GPU: L2), as many
    layers past the published count as that takes. Returns (model, info); raises TooLarge when they do not fit
    in memory or exceed max_bytes (a run's time budget: streaming them is what each timed forward costs)."""
    from llmlab.core.device import cpu_caches, last_level_cache_bytes
    from llmlab.core.flops import param_count
    from llmlab.core.models import arch_config

    llc = last_level_cache_bytes(device)
    conf = arch_config(arch)
    layers = layers_for(conf, llc_multiple * llc, 4)
    conf.num_hidden_layers = layers
    if 4 * param_count(conf) > max_bytes:
        raise TooLarge(f"{llc_multiple}x the {llc / 1e6:,.0f} MB last-level cache takes arch:{arch} x{layers}, "
                       f"{4 * param_count(conf) / 1e6:,.0f} MB: over this run's {max_bytes / 1e6:,.0f} MB")
    try:
        model, info = build_arch(arch, layers, device, torch.float32, seed)
    except TooLarge as exc:
        raise TooLarge(f"{llc_multiple}x the {llc / 1e6:,.0f} MB last-level cache: {exc}") from None
    return model, dict(info, llc_MB=llc / 1e6, llc_read=device.is_cuda or bool(cpu_caches()))


def speed_layers(arch: str, free_bytes: int, l2_bytes: int, draft_share: float, llc_multiple: int,
                 dtype_bytes: int) -> tuple[int, int]:
    """(target layers, draft layers) of the timing pair, from the device's free memory and L2 alone.

    The target: as many layers as fit (up to the published count) in MEMORY_SHARE of the free memory beside
    its draft; the draft: the fewest layers whose weights are draft_share of the target's (the built-in
    pair's ratio). Raises TooLarge when the target cannot reach llc_multiple x L2 within that memory."""
    from llmlab.core.flops import param_count
    from llmlab.core.models import arch_config

    conf = arch_config(arch)
    published, budget = conf.num_hidden_layers, MEMORY_SHARE * free_bytes / (1 + draft_share)
    layers = min(published, max(1, layers_for(conf, int(budget), dtype_bytes) - 1))
    conf.num_hidden_layers = layers
    t_bytes = param_count(conf) * dtype_bytes
    if t_bytes < llc_multiple * l2_bytes or t_bytes > budget:
        raise TooLarge(f"arch:{arch}: {layers} layers ({t_bytes / 1e6:,.0f} MB) cannot be both >= {llc_multiple}x "
                       f"the {l2_bytes / 1e6:,.0f} MB L2 and within {budget / 1e6:,.0f} MB of the free memory")
    return layers, min(layers, layers_for(conf, int(draft_share * t_bytes), dtype_bytes))


def speed_pair(arch: str, device: Device, draft_share: float, llc_multiple: int, dtype: torch.dtype = torch.float32,
               seed: int = 0):
    """A target and a draft for timing on a GPU, both `arch` with random weights (a timing only), sized by
    `speed_layers` from this device's free memory and L2. Returns (target, draft, info)."""
    from llmlab.core.device import last_level_cache_bytes

    l2 = last_level_cache_bytes(device)
    t_layers, d_layers = speed_layers(arch, device.free_memory_bytes(), l2, draft_share, llc_multiple, dtype.itemsize)
    target, t_info = build_arch(arch, t_layers, device, dtype, seed)
    draft, d_info = build_arch(arch, d_layers, device, dtype, seed + 1)
    return target, draft, dict(target=t_info["model"], draft=d_info["model"], target_MB=t_info["weights_MB"],
                               draft_MB=d_info["weights_MB"], llc_MB=l2 / 1e6, dtype=str(dtype).removeprefix("torch."))


def interpolate(curve: dict[int, float], k: float) -> float:
    """The verify cost at k tokens, linear between the measured k (clamped to the measured range)."""
    ks = sorted(curve)
    k = min(max(k, ks[0]), ks[-1])
    lo = max(x for x in ks if x <= k)
    hi = min(x for x in ks if x >= k)
    return curve[lo] if hi == lo else curve[lo] + (curve[hi] - curve[lo]) * (k - lo) / (hi - lo)


def regime_prediction(regime: str, model: str, rel: dict[int, float], costs: dict) -> dict:
    """Leviathan's speed-up tau(alpha, g) / (g c + v(g + 1)) at the best g whose verify cost was measured."""
    a, c = costs["alpha"], costs["c"]
    speed = lambda g: expected_tau(a, g) / (g * c + interpolate(rel, g + 1))  # noqa: E731
    best = max(range(1, max(rel)), key=speed)
    at = lambda k: rel.get(k, math.nan)  # noqa: E731
    return dict(regime=regime, model=model, alpha=a, cost_ratio_c=c, verify_k4=at(4), verify_k8=at(8),
                verify_k16=at(16), best_gamma=best, predicted_speedup=speed(best),
                predicted_free_verify=expected_tau(a, best) / (best * c + 1))
