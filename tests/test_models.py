"""llmlab.core.models: references, the arch: registry, the built-ins; core.flops: sizes from the config."""

from __future__ import annotations

import json

import pytest

from llmlab.core import flops, models
from llmlab.core.errors import UsageError
from llmlab.inference.decode import stream_text


def test_kv_bytes_per_token_known_values():
    # 2 x 32 layers x 32 KV heads x 128 x 2 bytes = 512 KiB (Llama-2-7B, MHA)
    assert flops.kv_bytes_per_token(models.arch_config("llama-2-7b"), 2) == 524288
    # GQA: 8 KV heads instead of 32 -> a quarter
    assert flops.kv_bytes_per_token(models.arch_config("llama-3-8b"), 2) == 131072
    assert flops.kv_bytes_per_token(models.ARCHS["llama-3-8b"], 2) == 131072  # the registry dict works too


def test_kv_bytes_uses_explicit_head_dim():
    from transformers import LlamaConfig

    cfg = LlamaConfig(num_hidden_layers=2, hidden_size=256, num_attention_heads=4, num_key_value_heads=2, head_dim=32)
    assert flops.kv_bytes_per_token(cfg, 4) == 2 * 2 * 2 * 32 * 4
    cfg = LlamaConfig(num_hidden_layers=2, hidden_size=256, num_attention_heads=4, num_key_value_heads=2)
    assert flops.kv_bytes_per_token(cfg, 2) == 2 * 2 * 2 * 64 * 2


@pytest.mark.parametrize("name", sorted(models.ARCHS))
def test_param_count_matches_a_meta_model(name):
    """The formula against the real module tree, built on the meta device (no memory)."""
    import torch
    from transformers import AutoModelForCausalLM

    cfg = models.arch_config(name)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg)
    assert flops.param_count(cfg) == sum(p.numel() for p in model.parameters())
    assert models.estimate_bytes(cfg, "bfloat16") == 2 * flops.param_count(cfg)


def test_published_sizes_roughly():
    billions = {n: flops.param_count(models.arch_config(n)) / 1e9 for n in models.ARCHS}
    assert 6.6 < billions["llama-2-7b"] < 6.8
    assert 7.9 < billions["llama-3-8b"] < 8.1
    assert 70 < billions["llama-3.1-70b"] < 71.5
    assert 1.2 < billions["llama-3.2-1b"] < 1.3
    assert 7.1 < billions["mistral-7b"] < 7.3
    assert 0.45 < billions["qwen2.5-0.5b"] < 0.55
    assert 1.5 < billions["qwen2.5-1.5b"] < 1.6
    assert 7.5 < billions["qwen2.5-7b"] < 7.7


def test_arch_config_values():
    c = models.arch_config("arch:mistral-7b")
    assert (c.model_type, c.sliding_window, c.num_key_value_heads) == ("mistral", 4096, 8)
    c = models.load_config("arch:llama-3.1-70b")
    assert c.num_hidden_layers == 80 and c.max_position_embeddings == 131072


@pytest.mark.parametrize("ref", ["tinyy", "gpt2", "arch:llama-9", "", "not a model"])
def test_unknown_refs_raise_usage_error(ref):
    with pytest.raises(UsageError) as e:
        models.load_config(ref)
    assert "\n" not in str(e.value)


def test_unknown_ref_lists_builtins():
    with pytest.raises(UsageError, match="tiny, tiny-draft"):
        models.load("no-such-model")


def test_folder_without_config(tmp_path):
    with pytest.raises(UsageError, match="no config.json"):
        models.load_config(str(tmp_path))
    with pytest.raises(UsageError, match="no such folder"):
        models.load_config(str(tmp_path / "missing"))


def test_remote_code_refused(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(
        {"model_type": "custom-thing", "auto_map": {"AutoConfig": "configuration_x.XConfig"}}))
    with pytest.raises(UsageError, match="trust-remote-code"):
        models.load(str(tmp_path))


def test_hub_offline_is_one_clear_line(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", "/nonexistent-llmlab-test")
    import huggingface_hub.constants as hc

    monkeypatch.setattr(hc, "HF_HUB_OFFLINE", True)
    models.hub_reachable.cache_clear()
    with pytest.raises(UsageError, match="unreachable") as e:
        models.load_config("some-org/some-model")
    assert "\n" not in str(e.value)
    models.hub_reachable.cache_clear()


def test_hub_without_network_fails_fast(monkeypatch):
    import time

    import huggingface_hub.constants as hc

    monkeypatch.setattr(hc, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(hc, "ENDPOINT", "https://127.0.0.1:9")  # nothing listens on the discard port
    models.hub_reachable.cache_clear()
    t0 = time.perf_counter()
    with pytest.raises(UsageError, match="unreachable"):
        models.load("some-org/some-model")
    assert time.perf_counter() - t0 < 10  # no retry-with-back-off loop
    models.hub_reachable.cache_clear()


def test_arch_too_big_is_refused_whatever_the_host_ram(monkeypatch):
    """The refusal follows the free-memory query, not this host's RAM (a 2 TB GPU node used to load 70B here)."""
    from llmlab.core.device import Device

    monkeypatch.setattr(Device, "free_memory_bytes", lambda self: 64 * 2**30)  # a 64 GiB box
    with pytest.raises(UsageError, match="64.0 GiB free"):
        models.load("arch:llama-3.1-70b", "cpu", "bfloat16")  # 141 GB of weights
    monkeypatch.setattr(Device, "free_memory_bytes", lambda self: 2**41)  # 2 TiB free: the same config fits
    ok, need, free = models.fits(models.load_config("arch:llama-3.1-70b"), "bfloat16", "cpu")
    assert ok and 130e9 < need < 150e9 and free == 2**41


def test_builtins_load_offline_through_plain_transformers(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    for name in models.BUILTINS:
        path = models.builtin_path(name)
        model = AutoModelForCausalLM.from_pretrained(path)
        tok = AutoTokenizer.from_pretrained(path)
        assert model.config.model_type == "llama"
        assert model.config.max_position_embeddings >= 8192
        assert tok.eos_token == "<|endoftext|>"
        assert (path / "model.safetensors").is_file()


def test_load_builtin():
    lm = models.load("tiny")
    assert (lm.kind, lm.timing_only) == ("builtin", False)
    assert 5e6 <= lm.n_params <= 15e6
    assert lm.n_params == flops.param_count(lm.config)
    assert lm.config.num_key_value_heads < lm.config.num_attention_heads  # GQA
    draft = models.load("tiny-draft")
    assert draft.n_params < lm.n_params
    assert draft.tokenizer.get_vocab() == lm.tokenizer.get_vocab()


def test_shipped_size_under_40_mb():
    total = sum(p.stat().st_size for p in models.WEIGHTS_DIR.rglob("*") if p.is_file())
    assert total <= 40e6


def test_stream_text_yields_pieces():
    lm = models.load("tiny")
    pieces = list(stream_text(lm.model, lm.tokenizer, "The for statement", max_new_tokens=8))
    assert 1 <= len(pieces) <= 8 and "".join(pieces)


def test_arch_loads_as_timing_only(monkeypatch):
    # a toy entry in the registry: the same code path as arch:qwen2.5-0.5b, without allocating 1 GB
    toy = dict(models.ARCHS["qwen2.5-0.5b"], layers=2, hidden=64, heads=4, kv_heads=2, head_dim=16,
               intermediate=128, vocab=512)
    monkeypatch.setitem(models.ARCHS, "toy", toy)
    lm = models.load("arch:toy", "cpu", "bfloat16")
    assert lm.timing_only and lm.tokenizer is None and lm.kind == "arch"
    assert lm.n_params == flops.param_count(lm.config)
    assert all(p.isfinite().all() for p in lm.model.parameters())
    with pytest.raises(ValueError, match="no tokenizer"):
        next(stream_text(lm.model, lm.tokenizer, "hi"))


def test_model_rows_cover_registry():
    rows = models.model_rows("cpu")
    refs = [r["ref"] for r in rows]
    assert refs[:2] == list(models.BUILTINS)
    assert {r[5:] for r in refs[2:]} == set(models.ARCHS)
    for r in rows:
        assert r["kv_bytes_per_token"] == 2 * r["layers"] * r["kv_heads"] * r["head_dim"] * 2


def test_cli_models_json_matches_the_formula():
    from typer.testing import CliRunner

    from llmlab.main import app

    r = CliRunner().invoke(app, ["models", "--json", "--device", "cpu"])
    assert r.exit_code == 0, r.output
    rows = {m["ref"]: m for m in json.loads(r.stdout)["models"]}
    assert set(rows) == set(models.BUILTINS) | {"arch:" + a for a in models.ARCHS}
    for name, a in models.ARCHS.items():
        row = rows["arch:" + name]
        assert row["kv_bytes_per_token"] == 2 * a["layers"] * a["kv_heads"] * a["head_dim"] * 2
        assert row["timing_only"] is True
    assert rows["arch:llama-2-7b"]["kv_bytes_per_token"] == 524288


def test_cli_generate_streams_the_builtin():
    from typer.testing import CliRunner

    from llmlab.main import app

    r = CliRunner().invoke(app, ["generate", "-n", "6", "--device", "cpu", "def f(x):"])
    assert r.exit_code == 0, r.output
    assert r.stdout.startswith("def f(x):") and len(r.stdout.strip()) > len("def f(x):")
