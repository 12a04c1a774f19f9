"""kvcache-growth: the formula against published numbers and real HF caches, the fit, and the CLI."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from llmlab.core.device import Device
from llmlab.core.models import ARCHS, arch_config, load
from llmlab.core.results import LabResult, find
from llmlab.labs import kvcache_growth as kv
from llmlab.labs.kvcache_growth import quadratic


@pytest.fixture(scope="module")
def tiny():
    return load("tiny", "cpu").model


# ---------------------------------------------------------------- the formula


@pytest.mark.parametrize("name,kib", [("llama-2-7b", 512), ("llama-3-8b", 128), ("llama-3.1-70b", 320),
                                      ("mistral-7b", 128), ("qwen2.5-7b", 56)])
def test_bf16_kib_per_token_matches_published_arithmetic(name, kib):
    assert kv.kv_bytes(arch_config(name), kv.cache_dtype("bf16")) == kib * 1024


def test_cache_dtypes_and_scale_overhead():
    c = arch_config("llama-3-8b")
    bf16 = kv.kv_bytes(c, kv.cache_dtype("bf16"))
    assert kv.kv_bytes(c, kv.cache_dtype("fp32")) == 2 * bf16
    assert kv.kv_bytes(c, kv.cache_dtype("fp8")) == bf16 / 2
    g64, g32 = kv.cache_dtype("int4-g64"), kv.cache_dtype("int4-g32")
    assert g64.bytes_per_elem == 0.5 + 2 / 64 and g64.scale_overhead == pytest.approx(0.0625)
    assert g32.bytes_per_elem == 0.5 + 2 / 32 and g32.scale_overhead == pytest.approx(0.125)
    assert kv.cache_dtype("int4") == g64 and kv.cache_dtype("bfloat16").name == "bf16"
    with pytest.raises(ValueError, match="unknown cache dtype"):
        kv.cache_dtype("int3")


def test_sliding_window_caps_only_mistral():
    assert kv.sliding_window(arch_config("mistral-7b")) == 4096
    assert kv.sliding_window(arch_config("qwen2.5-7b")) is None  # the field exists, switched off
    assert kv.sliding_window(arch_config("llama-3-8b")) is None
    m = arch_config("mistral-7b")
    assert kv.kv_cache_bytes(m, 32768, 1, 2) == kv.kv_cache_bytes(m, 4096, 1, 2) == 4096 * 128 * 1024
    assert kv.cached_tokens(10, 4, hf_dynamic=True) == 3 and kv.cached_tokens(3, 4) == 3


def test_attention_kind():
    assert [kv.attention_kind(h, k) for h, k in [(32, 32), (32, 8), (32, 1)]] == ["MHA", "GQA-4", "MQA"]


# ---------------------------------------------------------------- the real cache


def _cfg(**kw):
    return kv.Config(**{**dict(batches=(1, 3), lengths=(1, 5, 17, 40), static_max_len=40, gen_tokens=8), **kw})


def test_measured_cache_bytes_equal_the_formula_at_every_length(tiny):
    weights = sum(p.numel() * p.element_size() for p in tiny.parameters())
    rows, notes = kv.measure_cache_rows(tiny, Device("cpu"), _cfg(), weights)
    assert not notes
    assert {(r["cache"], r["batch"]) for r in rows} == {("dynamic", 1), ("dynamic", 3), ("static", 1)}
    for r in rows:
        assert r["match"] and r["measured_bytes"] == r["formula_bytes"], r
        if r["cache"] == "dynamic":  # 2 x 6 layers x 2 KV heads x 64 x 4 bytes per token
            assert r["measured_bytes"] == r["batch"] * r["seq_len"] * 6144 == r["storage_bytes"]
        else:  # preallocated from the first token
            assert r["cached_tokens"] == 40 and r["measured_bytes"] == 40 * 6144


def test_sweep_stops_at_the_context_limit_and_cpu_budget(tiny):
    cfg = _cfg(batches=(1, 4), lengths=(8, 16, 32, 9000), cpu_token_budget=64)
    rows, notes = kv.measure_cache_rows(tiny, Device("cpu"), cfg, 1)
    assert max(r["seq_len"] for r in rows if r["batch"] == 1) == 32
    assert max(r["seq_len"] for r in rows if r["batch"] == 4) == 16
    assert any("context limit" in n for n in notes) and any("CPU budget" in n for n in notes)


def test_sliding_window_skeleton_matches_hf():
    rows = kv.sliding_window_rows(kv.Config(window_probe=8))
    assert all(r["match"] for r in rows)
    assert [r["cached_tokens"] for r in rows] == [min(r["seq_len"], 7) for r in rows]


def test_skeleton_caches_match_the_formula_for_every_registry_model():
    for name in ARCHS:
        assert kv.measured_kv_per_token(name, tokens=3) == kv.kv_bytes(arch_config(name), 2), name


def test_allocator_rows_run_with_stand_in_counters(tiny):
    mem = (lambda: 0, lambda: 0, lambda: None)
    rows = kv.allocator_rows(tiny, Device("cpu"), _cfg(batches=(2,), lengths=(4, 9)), mem=mem)
    assert [(r["cache"], r["seq_len"]) for r in rows] == [("dynamic", 4), ("dynamic", 9), ("static", 4), ("static", 9)]
    assert all(r["cache_bytes"] == 2 * r["seq_len"] * 6144 for r in rows)


class _Box(Device):
    def total_memory_bytes(self) -> int:
        return 100 * 2**30


def test_registry_capacity_is_budget_over_bytes_per_token():
    rows = {r["model"]: r for r in kv.registry_rows(kv.Config(), _Box("cpu"))}
    l3 = rows["llama-3-8b"]
    budget = 0.9 * 100 * 2**30 - l3["weights_bf16_GiB"] * 2**30
    assert l3["kv_cache_tokens"] == int(budget // (128 * 1024))
    assert l3["max_concurrency"] == pytest.approx(budget / (4096 * 128 * 1024))
    assert l3["GiB_at_128k"] == 16 and rows["llama-2-7b"]["GiB_at_4k"] == 2
    assert rows["mistral-7b"]["GiB_at_128k"] == 0.5  # the window caps it
    assert rows["llama-3.1-70b"]["weights_fit"] is False and rows["llama-3.1-70b"]["kv_cache_tokens"] == 0


def test_growth_chart_rows_grow_linearly_per_layout_and_the_window_caps_one():
    import pandas as pd

    from llmlab.labs.kvcache_growth.registry import kv_growth_rows

    reg = pd.DataFrame(kv.registry_rows(kv.Config(), _Box("cpu")))
    df = pd.DataFrame(kv_growth_rows(reg, kv.Config()))
    assert set(df["layout"]) == {"llama-2-7b (MHA)", "llama-3-8b (GQA)", "mistral-7b (window)"}
    gib = df.pivot(index="context", columns="model", values="GiB")
    assert gib.index[0] == 256 and gib.index[-1] == max(kv.Config().contexts)
    assert (gib["llama-2-7b"] / gib["llama-3-8b"] == 4).all()  # 32 vs 8 KV heads at every length
    assert gib.loc[131072, "llama-3-8b"] == 16 and gib.loc[131072, "mistral-7b"] == 0.5  # the window caps it
    assert gib["mistral-7b"].loc[8192:].nunique() == 1


# ---------------------------------------------------------------- the quadratic trap


def test_fit_tells_quadratic_from_linear():
    n = np.arange(1, 101, dtype=float)
    rng = np.random.default_rng(0)
    quad = np.cumsum(0.01 + 0.0003 * n) + rng.normal(0, 1e-3, n.size)
    line = np.cumsum(0.01 + rng.normal(0, 1e-3, n.size))
    fq, fl = kv.fit_total_time(n, quad), kv.fit_total_time(n, line)
    assert kv.is_quadratic(fq) and fq[2]["coef"][0] == pytest.approx(0.00015, rel=0.05)
    assert not kv.is_quadratic(fl) and fl[1]["r2"] > 0.999


def test_without_cache_generates_the_same_tokens(tiny):
    ids = torch.randint(0, 4096, (2, 5), generator=torch.Generator().manual_seed(0))
    a, ta = kv.generate_with_cache(tiny, ids, 6)
    b, tb = kv.generate_without_cache(tiny, ids, 6)
    assert torch.equal(a, b) and len(ta) == len(tb) == 6


def test_config_validation():
    for bad in (dict(cache_dtype="int3"), dict(lengths=(4, 2)), dict(gen_repeats=1), dict(batches=(0,)),
                dict(memory_utilization=1.5), dict(dtype="int8")):
        with pytest.raises(ValueError):
            kv.Config(**bad)


# ---------------------------------------------------------------- judge: every claim can hold and fail


W = 1000  # weights bytes of the fixtures' model; 10 B per token -> N = 100 tokens


def _real(rows):
    """real_cache rows (cache, batch, seq_len, measured bytes) for a model of W bytes and 10 B/token."""
    out = []
    for cache, b, n, measured in rows:
        held = n if cache == "dynamic" else 64
        out.append(dict(cache=cache, batch=b, seq_len=n, cached_tokens=held, measured_bytes=measured,
                        formula_bytes=b * held * 10, weights_bytes=W, cache_over_weights=measured / W,
                        tokens_to_outweigh=W / 10))
    return out


def _result(**tables) -> LabResult:
    res = LabResult(lab="kvcache-growth", version=kv.VERSION, config={"model": "toy"})
    for name, rows in tables.items():
        res.add_table(name, rows)
    return res


GOOD_REAL = [("dynamic", 1, 16, 160), ("dynamic", 1, 64, 640), ("dynamic", 4, 16, 640), ("dynamic", 4, 64, 2560),
             ("static", 1, 16, 640)]


def test_judge_bytes_match_formula_holds_and_fails():
    assert find(kv.judge(_result(real_cache=_real(GOOD_REAL))), "kvcache_growth.bytes_match_formula").holds is True
    off = [*GOOD_REAL[:-1], ("static", 1, 16, 641)]  # one byte off
    c = find(kv.judge(_result(real_cache=_real(off))), "kvcache_growth.bytes_match_formula")
    assert c.holds is False and c.measured.startswith("4/5 rows exact")


def test_judge_cache_outweighs_weights_from_measured_rows():
    """The crossing is judged from measured cache rows, not passed as a literal True."""
    c = find(kv.judge(_result(real_cache=_real(GOOD_REAL))), "kvcache_growth.cache_outweighs_weights")
    assert c.holds is True and "b=4 x 64" in c.measured and "4/4 rows" in c.measured
    # a cache measured above the weights before N tokens (say a leak): the claim fails
    leak = [("dynamic", 1, 16, 1600), *GOOD_REAL[1:]]
    assert find(kv.judge(_result(real_cache=_real(leak))), "kvcache_growth.cache_outweighs_weights").holds is False
    # no row reaches N: not measured, and the note says how to reach it
    small = [r for r in GOOD_REAL if r[3] < W]
    c = find(kv.judge(_result(real_cache=_real(small))), "kvcache_growth.cache_outweighs_weights")
    assert c.holds is None and "--batches" in c.note


def test_registry_alone_makes_no_outweighs_claim():
    """The registry's 'outweighs at N' is a formula column, never a claim."""
    reg = [dict(model="llama-2-7b", bf16_KiB_per_token=512.0, measured_bf16_KiB_per_token=512.0),
           dict(model="llama-3-8b", bf16_KiB_per_token=128.0, measured_bf16_KiB_per_token=128.0)]
    ids = [c.id for c in kv.judge(_result(registry=reg))]
    assert ids == ["kvcache_growth.dynamic_cache_copies", "kvcache_growth.gqa_4x_smaller"]


def test_judge_gqa_holds_and_fails():
    reg = [dict(model="llama-2-7b", bf16_KiB_per_token=512.0, measured_bf16_KiB_per_token=512.0),
           dict(model="llama-3-8b", bf16_KiB_per_token=128.0, measured_bf16_KiB_per_token=128.0)]
    c = find(kv.judge(_result(registry=reg)), "kvcache_growth.gqa_4x_smaller")
    assert c.holds is True and "4.00x" in c.measured
    reg[1]["measured_bf16_KiB_per_token"] = 256.0  # a cache that kept every query head's K/V
    c = find(kv.judge(_result(registry=reg)), "kvcache_growth.gqa_4x_smaller")
    assert c.holds is False and "2.00x" in c.measured


def test_judge_sliding_window_holds_and_fails():
    rows = [dict(window=8, seq_len=n, cached_tokens=min(n, 7), formula_tokens=min(n, 7), measured_bytes=min(n, 7) * 10,
                 formula_bytes=min(n, 7) * 10) for n in (4, 7, 8, 16)]
    assert find(kv.judge(_result(sliding_window=rows)), "kvcache_growth.sliding_window_caps").holds is True
    rows[-1].update(cached_tokens=16, measured_bytes=160)  # the cache kept growing past the window
    c = find(kv.judge(_result(sliding_window=rows)), "kvcache_growth.sliding_window_caps")
    assert c.holds is False and c.measured == "<= 16 tokens to length 16; 3/4 rows exact"


def test_judge_allocator_holds_fails_and_is_not_measured_without_a_gpu():
    rows = [dict(cache="dynamic", oom=False, step_peak_extra_bytes=4 * 2**20),
            dict(cache="static", oom=False, step_peak_extra_bytes=1 * 2**20)]
    assert find(kv.judge(_result(allocator=rows)), "kvcache_growth.dynamic_cache_copies").holds is True
    rows[1]["step_peak_extra_bytes"] = 8 * 2**20
    assert find(kv.judge(_result(allocator=rows)), "kvcache_growth.dynamic_cache_copies").holds is False
    res = _result()
    res.skip("allocator", "no GPU")
    c = find(kv.judge(res), "kvcache_growth.dynamic_cache_copies")
    assert c.holds is None and c.note == "not measured: no GPU"


def _fits(n=48, a=1e-4, quad_ssr=1e-4, lin_ssr=1e-2, equal=None):
    return [dict(mode="without cache", n_max=n, quad_a_s_per_tok2=a, quad_ssr=quad_ssr, lin_ssr=lin_ssr,
                 step_ms_first=5.0, step_ms_last=12.0, tokens_equal=n if equal is None else equal, tokens_compared=n),
            dict(mode="with cache", n_max=n, quad_a_s_per_tok2=1e-7, quad_ssr=1e-5, lin_ssr=1.1e-5, step_ms_first=4.0,
                 step_ms_last=4.1, tokens_equal=n if equal is None else equal, tokens_compared=n)]


def test_judge_quadratic_holds_fails_and_needs_enough_tokens():
    q = "kvcache_growth.no_cache_quadratic"
    assert find(kv.judge(_result(generation_fits=_fits())), q).holds is True
    # the parabola fits no better
    assert find(kv.judge(_result(generation_fits=_fits(quad_ssr=0.9e-2))), q).holds is False
    assert find(kv.judge(_result(generation_fits=_fits(a=-1e-6))), q).holds is False  # bending down
    c = find(kv.judge(_result(generation_fits=_fits(n=8))), q)
    assert c.holds is None and "8 tokens" in c.note


def test_judge_same_output_holds_and_fails():
    s = "kvcache_growth.cache_same_output"
    assert find(kv.judge(_result(generation_fits=_fits())), s).holds is True
    c = find(kv.judge(_result(generation_fits=_fits(equal=47))), s)
    assert c.holds is False and c.measured == "47/48 tokens equal"


# ---------------------------------------------------------------- end to end


def test_cli_quick_end_to_end(quick_run):
    res = LabResult.from_dict(quick_run("kvcache-growth").data)
    assert res.lab == "kvcache-growth" and res.judge_version == kv.JUDGE_VERSION
    assert (res.tables["real_cache"]["measured_bytes"] == res.tables["real_cache"]["formula_bytes"]).all()
    kib = res.tables["registry"].set_index("model")["measured_bf16_KiB_per_token"]
    assert kib["llama-2-7b"] == 512 and kib["llama-3-8b"] == 128
    assert find(res.claims, "kvcache_growth.bytes_match_formula").holds is True
    assert find(res.claims, "kvcache_growth.gqa_4x_smaller").holds is True
    assert find(res.claims, "kvcache_growth.sliding_window_caps").holds is True
    # batch 16 x 256 crosses tiny's 3,757
    assert find(res.claims, "kvcache_growth.cache_outweighs_weights").holds is True
    assert find(res.claims, "kvcache_growth.cache_same_output").holds is True
    assert find(res.claims, "kvcache_growth.dynamic_cache_copies").holds is None and "allocator" in res.skipped
    # the saved run re-judges to the same verdicts
    saved = LabResult.from_json(quick_run("kvcache-growth").json_path.read_text())
    assert [(c.id, c.holds) for c in kv.judge(saved)] == [(c.id, c.holds) for c in res.claims]
    assert kv.views(saved) and kv.headline(saved, res.claims).startswith("The KV cache is exactly the formula")


@pytest.mark.parametrize("args", [["--cache-dtype", "int3"], ["--model", "no-such-model"]])
def test_bad_input_exits_2_with_one_line(args, cli):
    p = cli("kvcache-growth", *args, "--no-save")
    assert p.returncode == 2
    errors = [line for line in p.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in p.stderr


def test_trap_times_through_core_interleaved(tiny, monkeypatch):
    """The trap's timing is core.timing.interleaved, the one interleaved timing loop."""
    import llmlab.core.timing as timing

    calls = []
    real = timing.interleaved

    def spy(fns, repeats, device, **kw):
        calls.append((list(fns), repeats, sorted(kw)))
        return real(fns, repeats, device, **kw)

    monkeypatch.setattr(timing, "interleaved", spy)
    t = kv.trap(tiny, Device("cpu"), _cfg(gen_tokens=8, gen_repeats=2, trap_budget_s=60.0))
    assert calls == [(["without cache", "with cache"], 2, ["first", "rounds"])]
    assert t["n_tokens"] == 8 and t["tokens_match"] == 8
    for m in t["modes"].values():
        assert m["runs"].shape == (2, 8) and m["total_stats"].n == 2


# ---------------------------------------------------------------- the trap on a GPU: sized from the device


def test_trap_tokens_follow_where_the_per_token_term_shows(tiny):
    """4x the context at which a no-cache forward doubles its shortest time; the cap when it never does."""
    cfg = _cfg(gen_tokens=48, max_trap_tokens=8192)
    fixed_then_linear = lambda n: max(1.0, n / 300)  # noqa: E731  (1 ms of launches until ~300 tokens of compute)
    n, why = kv.trap_tokens(tiny, Device("cpu"), cfg, forward_ms=fixed_then_linear)
    assert n == 4 * 1024 and "1024 tokens" in why  # 512/300 < 2 ms, 1024/300 >= 2 ms
    n, why = kv.trap_tokens(tiny, Device("cpu"), cfg, forward_ms=lambda n: 1.0)  # flat: never doubles
    cap = min(8192, tiny.config.max_position_embeddings - cfg.gen_prompt)
    assert n == cap and "the cap" in why
    n, _ = kv.trap_tokens(tiny, Device("cpu"), cfg, forward_ms=lambda n: n / 10)  # doubles at once
    assert n == max(cfg.gen_tokens, 4 * 128)


def test_trap_setup_changes_nothing_on_a_cpu(tiny):
    res = LabResult.new(kv.LAB, kv.VERSION, _cfg())
    model, cfg = kv.trap_setup(res, tiny, Device("cpu"), _cfg(gen_tokens=48))
    assert model is tiny and cfg.gen_tokens == 48 and res.env["trap_model"] == "tiny"


def test_trap_setup_on_a_gpu_takes_a_model_past_l2_and_device_sized_tokens(tiny, monkeypatch):
    from llmlab.core import models, roofs

    monkeypatch.setattr(roofs, "gpu_speed_model",
                        lambda ref, choice, device, dtype: ("arch:qwen2.5-0.5b", "arch:qwen2.5-0.5b (why)"))
    monkeypatch.setattr(models, "load", lambda ref, device, dtype: type("LM", (), {"model": tiny})())
    monkeypatch.setattr(quadratic, "trap_tokens", lambda model, device, cfg: (1024, "1024 tokens from the device"))
    res = LabResult.new(kv.LAB, kv.VERSION, _cfg())
    _, cfg = kv.trap_setup(res, tiny, Device("cuda:0"), _cfg(gen_tokens=160))
    assert cfg.gen_tokens == 1024 and res.env["trap_model"] == "arch:qwen2.5-0.5b"
    assert any("qwen2.5-0.5b" in n for n in res.notes) and any("from the device" in n for n in res.notes)
