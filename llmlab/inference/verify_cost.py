"""The verify-cost curve: what one target forward over k tokens costs against one token, k = 1..16.

Speculative decoding's premise is that verifying k drafted tokens in one forward costs about one decode
step, because decode is memory-bound: the weights are read once per forward whatever k is. That holds
while k tokens' FLOPs stay under the time the weights take to stream. A model that lives in the cache
(the built-in pair on a CPU) is compute- and overhead-bound instead, so its curve rises at once. Two
regimes are measured with the same code: the model at hand, and an `arch:` model with random weights
(a timing only) cut to enough layers that its weights are several times the last-level cache.

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
from llmlab.inference.speculative import expected_tau


def verify_curve(model, device: Device, ks: tuple[int, ...], samples: int, context: int = 64) -> dict[int, float]:
    """Median ms of one cached forward over k new tokens after `context` tokens, each k in turn, `samples` times."""
    vocab = model.config.vocab_size
    ids = torch.arange(context + max(ks), device=device.torch)[None] % (vocab - 1) + 1  # (1, S): tokens only shape the timing
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


def dram_model(arch: str, llc_multiple: int, device: Device, seed: int = 0):
    """The `arch` architecture, random weights, cut to the fewest layers whose FP32 weights are at least
    llc_multiple x the last-level cache (CPU: the largest cache in sysfs; GPU: L2). Returns (model, info)."""
    from transformers import AutoModelForCausalLM
    from transformers.initialization import no_init_weights

    from llmlab.core.device import cpu_caches, last_level_cache_bytes
    from llmlab.core.models import _fill_random, arch_config, param_count

    llc = last_level_cache_bytes(device)
    llc_read = device.is_cuda or bool(cpu_caches())
    conf = arch_config(arch)
    full = conf.num_hidden_layers
    want = llc_multiple * llc
    for layers in range(1, full + 1):
        conf.num_hidden_layers = layers
        if 4 * param_count(conf) >= want:
            break
    with torch.device(device.torch), no_init_weights():
        model = AutoModelForCausalLM.from_config(conf, dtype=torch.float32)
    _fill_random(model, seed)
    model.tie_weights()
    nbytes = 4 * sum(p.numel() for p in model.parameters())
    return model.eval(), dict(model=f"arch:{arch} x{layers} layers", weights_MB=nbytes / 1e6, llc_MB=llc / 1e6,
                              llc_read=llc_read)


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
    return dict(regime=regime, model=model, alpha=a, cost_ratio_c=c, verify_k4=at(4), verify_k8=at(8), verify_k16=at(16),
                best_gamma=best, predicted_speedup=speed(best), predicted_free_verify=expected_tau(a, best) / (best * c + 1))
