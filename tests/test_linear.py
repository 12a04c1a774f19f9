"""How the engine holds Linear layers (inference/linear.py): fused and re-stored without changing a value,
without a second copy of a weight, and with the model's own forward unchanged afterwards."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from llmlab.core.models import load
from llmlab.inference.linear import Fused, Separate, Sliced, fuse, plain
from llmlab.inference.llama import layers_of
from llmlab.serving.engine.llm_engine import Engine, EngineConfig, check_exact, hf_logits


def linears(out_sizes, inp=16, bias=False, seed=0):
    torch.manual_seed(seed)
    return [torch.nn.Linear(inp, n, bias=bias) for n in out_sizes]


def test_fused_outputs_equal_the_separate_projections_and_share_one_weight():
    owner = torch.nn.Module()
    mods = linears([8, 4, 4], bias=True)
    x = torch.randn(5, 16)
    want = [m(x) for m in mods]
    fused = fuse(owner, "_qkv", mods)
    assert isinstance(fused, Fused)
    for got, exp, m in zip(fused(x), want, mods, strict=True):
        torch.testing.assert_close(got, exp)
        torch.testing.assert_close(m(x), exp)  # the module still computes the same through its view
        assert m.weight.untyped_storage().data_ptr() == fused.proj.weight.untyped_storage().data_ptr()
    # CPU: stored input-major, so F.linear runs x @ (in, out)
    assert fused.proj.weight.t().is_contiguous()
    assert fuse(owner, "_qkv", mods) is fused  # a second engine on the same model reuses it


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="torch built without oneDNN")
def test_packed_weight_computes_the_linear_for_any_rows_and_follows_in_place_writes():
    """On the CPU a float32 weight carries oneDNN's packed copy, used from two rows on (one row is MKL's GEMV):
    the same values as F.linear for 1, 2, 33 and 600 rows and a batch of sequences, a strided input, a bias;
    and a weight written in place (load_state_dict) is packed again, not served stale."""
    lin = linears([24], inp=40, bias=True)[0]
    proj = plain(lin)
    assert isinstance(proj, Sliced) and proj.packed is not None
    for x in (torch.randn(1, 40), torch.randn(2, 40), torch.randn(33, 40), torch.randn(600, 40),
              torch.randn(3, 7, 40), torch.randn(9, 80)[:, ::2]):
        torch.testing.assert_close(proj(x), F.linear(x, lin.weight, lin.bias), atol=1e-5, rtol=1e-5)
    lin.load_state_dict({"weight": torch.ones(24, 40), "bias": torch.zeros(24)})
    torch.testing.assert_close(proj(torch.ones(4, 40)), torch.full((4, 24), 40.0))


def test_what_cannot_fuse_stays_separate():
    owner = torch.nn.Module()
    mixed = linears([4, 4]) + linears([4], bias=True)
    assert isinstance(fuse(owner, "_mixed", mixed), Separate)

    class Quantized(torch.nn.Linear):  # any Linear subclass (a quantized one) is called as a module
        pass

    q = Quantized(16, 4)
    sep = fuse(owner, "_q", [q, *linears([4])])
    assert isinstance(sep, Separate) and sep.projs[0] is q
    assert plain(q) is q


def test_tied_embedding_stays_tied_and_hf_forward_is_unchanged():
    lm = load("tiny", "cpu")
    model = lm.model
    prompt = list(range(5, 30))
    before = hf_logits(model, prompt)
    n_params = sum(p.numel() for p in model.parameters())
    Engine(model, EngineConfig(num_blocks=8))
    Engine(model, EngineConfig(num_blocks=8))
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert sum(p.numel() for p in model.parameters()) == n_params  # no parameter added or duplicated
    layer = layers_of(model)[0]
    attn = model.model.layers[0].self_attn
    assert attn.q_proj.weight.untyped_storage().data_ptr() == layer.qkv.proj.weight.untyped_storage().data_ptr()
    torch.testing.assert_close(hf_logits(model, prompt), before, atol=1e-4, rtol=0)


@pytest.mark.parametrize("family", ["qwen2", "qwen3"])
def test_engine_exact_for_biased_and_normed_projections(family):
    """Qwen2's q/k/v carry biases (fused with them); Qwen3 has q/k norms before RoPE (q/k/v fused, RoPE per
    projection): both against HF's own forward, on random weights."""
    from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM

    cls, config = {"qwen2": (Qwen2ForCausalLM, Qwen2Config), "qwen3": (Qwen3ForCausalLM, Qwen3Config)}[family]
    torch.manual_seed(0)
    model = cls(config(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256)).eval()
    report = check_exact(Engine(model, EngineConfig(num_blocks=32)), [list(range(1, 20)), list(range(5, 40))],
                         max_new_tokens=5)
    assert report["max_abs_logit_diff"] <= 1e-4 and report["greedy_tokens_equal"]


def test_cpu_gemv_computes_one_row_like_f_linear_for_every_layout_the_engine_makes(monkeypatch):
    """The compiled single-row GEMV (inference/cpu_kernels.py): the same values as F.linear for an input-major
    weight, a rank's column slice of one (row stride != width), with and without bias, odd sizes (a tail
    shorter than the 8-row pass); with LLMLAB_CPU_KERNELS=0 or no compiler the engine's Sliced uses torch's."""
    from llmlab.inference import cpu_kernels

    fn = cpu_kernels.kernel()
    if fn is None:
        pytest.skip("no C compiler here: the engine uses torch's GEMV")
    torch.manual_seed(0)
    full = torch.randn(40, 29).t().contiguous().t()  # (out 40, in 29) stored input-major
    for w, b in ((full, None), (full, torch.randn(40)), (full[8:19], torch.randn(11)), (full[:, 3:20], None)):
        assert cpu_kernels.usable(w)
        x = torch.randn(1, w.shape[1])
        torch.testing.assert_close(cpu_kernels.gemv(fn, x, w, b), F.linear(x, w, b), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(Sliced(w, b)(x[None]), F.linear(x[None], w, b), atol=1e-5, rtol=1e-5)
    assert not cpu_kernels.usable(torch.randn(40, 29))  # (out, in) row-major: not the layout it reads
    monkeypatch.setenv("LLMLAB_CPU_KERNELS", "0")
    monkeypatch.setattr(cpu_kernels, "_state", {})
    assert cpu_kernels.kernel() is None and Sliced(full).gemv is None
