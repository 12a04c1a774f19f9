"""The serving lab's run: the engine checked exact, then parts 1-6 into tables (never printed, never judged here)."""

from __future__ import annotations

import random

import numpy as np

from llmlab.core.device import Device, torch_threads
from llmlab.core.errors import UsageError
from llmlab.core.results import LabResult
from llmlab.labs.serving.config import LAB, VERSION, Config
from llmlab.labs.serving.cost import cost_rows, kv_knee, train_serve_rows
from llmlab.labs.serving.drivers import busy_reading, closed_loop, make_engine, random_prompts, records
from llmlab.labs.serving.endpoint import part_endpoint
from llmlab.labs.serving.model import speed_model
from llmlab.labs.serving.scheduling import capacity_formula_rows, part_capacity, part_chunked, part_prefix, part_static

# ---------------------------------------------------------------- run


def run(cfg: Config, device: Device, progress=None) -> LabResult:
    """Measures. Fills tables; never prints, never judges."""
    import torch

    res = LabResult.new(LAB, VERSION, cfg)
    with torch_threads(None if device.is_cuda else cfg.threads), res.guard(), torch.inference_mode():
        model, about = speed_model(cfg, device)
        vocab = model.config.vocab_size
        rng = random.Random(cfg.seed)
        res.env["engine"] = about
        if about["model"] != cfg.model:
            res.note(f"the engine's parts ran {about['model']} in {about['dtype']} ({about['weights_MB']:,.0f} MB of "
                     "weights, "
                     f"{about['weights_over_cache']:.0f}x the {about['cache_MB']:.0f} MB L2): tiny would sit in the L2")
        part_exact(res, model, vocab, rng)
        if cfg.endpoint:
            part_endpoint(res, cfg, vocab, rng)
        else:
            part_concurrency(res, cfg, model, device, vocab, rng)
            part_prefix(res, cfg, model, vocab, rng)
        for table, fn in (("static_vs_continuous", part_static), ("capacity", part_capacity),
                          ("chunked", part_chunked)):
            if cfg.endpoint:
                res.skip(table, "needs the in-process engine (--endpoint measures part 1, the concurrency sweep)")
            else:
                fn(res, cfg, model, vocab, rng)
        res.add_table("capacity_formula", capacity_formula_rows())
        if "concurrency" in res.tables:
            part_cost(res, cfg)
    return res


def part_exact(res, model, vocab: int, rng) -> None:
    """The engine against HF at every position it computes (prefill chunks, decodes, prefix-hit follow-ups):
    the measured diff and greedy flag go into the table; the judge decides."""
    from llmlab.serving.engine.llm_engine import check_exact

    eng = make_engine(model, enable_prefix_cache=True, max_num_batched_tokens=48)
    prompts = random_prompts(3, 40, vocab, rng) + [random_prompts(1, 20, vocab, rng)[0]]
    res.add_table("exactness", [check_exact(eng, prompts, max_new_tokens=6, strict=False)])


def _model_costs(model, device: Device) -> dict:
    from llmlab.core.flops import Shape
    from llmlab.core.specs import bandwidth_spec_GBps, peak_for

    shape = Shape.of(model.config)
    p = next(model.parameters())
    elem = p.element_size()
    dtype = {4: "fp32", 2: "fp16" if str(p.dtype) == "torch.float16" else "bf16"}.get(elem, "fp32")
    bw, bw_source = bandwidth_spec_GBps(device)[0], "spec sheet"
    if not bw:  # a CPU has no spec row: measure the STREAM triad (the roofline lab's kernel)
        from llmlab.core.roofs import bandwidth_GBps

        bw, bw_source = bandwidth_GBps(device, "triad"), "measured STREAM triad"
    peak, peak_source = peak_for(device, dtype)
    return dict(flops_per_token=2 * shape.matmul_params, weight_bytes=elem * shape.matmul_params,
                kv_bytes_per_token=elem * shape.kv_elems_per_token, peak_gflops=peak or float("nan"),
                peak_source=peak_source,
                bandwidth_GBps=bw, bandwidth_source=bw_source)


def part_concurrency(res, cfg: Config, model, device: Device, vocab: int, rng) -> None:
    from llmlab.loadgen.client import calculate_metrics

    costs = _model_costs(model, device)
    rows, steps = [], []
    for c in cfg.levels():
        eng = make_engine(model, max_num_seqs=c, max_num_batched_tokens=max(512, c * 2), enable_prefix_cache=False)
        closed_loop(eng, random_prompts(1, cfg.prompt_len, vocab, rng), 1, 2)  # warm-up
        eng.reset_stats()
        n = max(8, c * cfg.requests_per_level)
        prompts = random_prompts(n, cfg.prompt_len, vocab, rng)
        def serve(eng=eng, prompts=prompts, c=c):
            return closed_loop(eng, prompts, c, cfg.output_len)

        (seqs, wall), busy, busy_source = busy_reading(device, serve)
        m = calculate_metrics(records(seqs), wall)
        dec = [s for s in eng.steps if s.num_prefill_tokens == 0 and s.num_decodes > 0]
        step_ms = float(np.median([s.step_ms for s in dec])) if dec else float("nan")
        batch = float(np.mean([s.num_decodes for s in dec])) if dec else float("nan")
        ctx = cfg.prompt_len + cfg.output_len / 2  # mean context a decode step reads
        rows.append(dict(concurrency=c, requests=n, output_tokens_per_s=m.output_throughput,
                         requests_per_s=m.request_throughput,
                         p50_ttft_ms=m.p50_ttft_ms, p99_ttft_ms=m.p99_ttft_ms, p50_itl_ms=m.p50_itl_ms,
                         p99_itl_ms=m.p99_itl_ms,
                         p50_tpot_ms=m.p50_tpot_ms, decode_step_ms=step_ms, decodes_per_step=batch,
                         compute_util=costs["flops_per_token"] * m.output_throughput / (costs["peak_gflops"] * 1e9),
                         bandwidth_util=(costs["weight_bytes"] +
                                         batch * ctx * costs["kv_bytes_per_token"]) / (step_ms / 1e3)
                         / (costs["bandwidth_GBps"] * 1e9), device_busy=busy, busy_source=busy_source,
                         peak_gflops=costs["peak_gflops"], bandwidth_GBps=costs["bandwidth_GBps"]))
        steps += [dict(concurrency=c, decodes=s.num_decodes, step_ms=s.step_ms) for s in dec]
        res.add_table("concurrency", rows)
        # SDPA calls of the last level, by kind
        res.env.setdefault("engine", {})["attention_backends"] = eng.attention_backends
    st = res.add_table("steps", steps).groupby("decodes", as_index=False).step_ms.median()
    st["ms_per_token"] = st.step_ms / st.decodes
    res.add_table("step_time", st)
    res.env["model_costs"] = costs


def part_cost(res, cfg: Config) -> None:
    """$ per 1M tokens at each concurrency; the training run against a GPU-year of serving (the engine's only)."""
    from llmlab.core.specs import gpu_spec
    from llmlab.serving.engine.llm_engine import EngineConfig

    conc = res.tables["concurrency"]
    knee = None if cfg.endpoint else kv_knee(cfg, EngineConfig().num_blocks)  # part 1's engines keep the default pool
    res.add_table("cost", cost_rows(conc, cfg.price_per_hour, knee))
    spec = gpu_spec(cfg.train_gpu)
    if "compute_util" not in conc:
        res.skip("train_vs_serve", "needs the engine's compute use (a server's FLOPs are not visible from a client)")
    else:
        res.add_table("train_vs_serve", train_serve_rows(cfg, conc, spec.bf16_tflops, spec.name))


def check(cfg: Config) -> None:
    """Before the run: part 6's GPU and model must be known, an --endpoint must answer (one line, exit 2)."""
    from llmlab.core.models import arch_config
    from llmlab.core.specs import gpu_spec

    spec = gpu_spec(cfg.train_gpu)
    if spec is None or not spec.bf16_tflops:
        raise UsageError(f"--train-gpu {cfg.train_gpu!r}: not a GPU the spec registry knows with a BF16 peak "
                         "(e.g. H100, A100, H200)")
    arch_config(cfg.train_model)  # an unknown name is a UsageError naming the registry's
    if cfg.endpoint is not None:
        from llmlab.loadgen.probe import check_reachable

        check_reachable(cfg.endpoint)
