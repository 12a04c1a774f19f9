"""The train-vs-infer lab's run: the cost of a step, memory, one token at a time, inference does not learn."""

from __future__ import annotations

import hashlib

import torch

from llmlab.core.device import Device, threads_for, torch_threads
from llmlab.core.results import LabResult
from llmlab.core.stats import summary
from llmlab.core.timing import interleaved
from llmlab.labs.train_vs_infer.config import LAB, VERSION, Config

GPU_GB = 80  # the "one 80 GB GPU" of the fits table (A100/H100 80 GB)


# ---------------------------------------------------------------- set-up


def load_model(ref: str, cfg: Config, device: Device):
    """The model in train mode (dropout is 0 in these configs); arch: models cut to cfg.arch_layers."""
    from llmlab.core.models import arch_config, load

    if ref.startswith("arch:"):
        from transformers import AutoModelForCausalLM

        conf = arch_config(ref.split(":", 1)[1])
        conf.num_hidden_layers = cfg.arch_layers
        torch.manual_seed(cfg.seed)
        model = AutoModelForCausalLM.from_config(conf).to(device.torch)
        return model, None, f"{ref} ({cfg.arch_layers} layers, random weights)"
    lm = load(ref, device)
    return lm.model, lm.tokenizer, ref


def matmul_params(model) -> int:
    """Parameters that enter a matmul per token: everything but the embedding lookup and the norms."""
    emb = model.get_input_embeddings().weight
    n = sum(p.numel() for name, p in model.named_parameters() if p.dim() >= 2 and p is not emb)
    head = model.get_output_embeddings()
    if head is not None and head.weight is emb:  # tied: the LM head is a matmul with the embedding
        n += emb.numel()
    return n


def weights_hash(model) -> str:
    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(t.detach().float().cpu().numpy().tobytes())
    return h.hexdigest()[:16]


def _tensor_bytes(tensors) -> int:
    seen, total = set(), 0
    for t in tensors:
        s = t.untyped_storage()
        key = (s.data_ptr(), s.nbytes())
        if key not in seen:
            seen.add(key)
            total += s.nbytes()
    return total


# ---------------------------------------------------------------- run


def run(cfg: Config, device: Device, progress=None) -> LabResult:
    """Measures. Fills tables; never prints, never judges."""
    res = LabResult.new(LAB, VERSION, cfg)
    with torch_threads(None if device.is_cuda else threads_for(cfg.threads, res.note)), res.guard():
        res.env["torch_threads"] = torch.get_num_threads()
        steps, memory = [], []
        for ref in cfg.models:
            model, tok, label = load_model(ref, cfg, device)
            steps += part_step_cost(model, label, cfg, device)
            memory += part_memory(model, label, cfg, device)
            if ref == cfg.models[0]:
                res.add_table("parallel", part_parallel(model, cfg, device))
                if tok is not None:
                    res.add_table("learning", part_learning(model, cfg, device))
                else:
                    res.skip("learning", f"{ref} has random weights: its answers mean nothing")
            del model
            res.add_table("steps", steps)
            res.add_table("memory", memory)
        res.add_table("memory_chart", memory_chart_rows(memory))
        res.add_table("fits", fits_rows())
        res.note("arch: models have random weights and a cut layer count: their rows are timings and byte counts, "
                 "not quality")
    return res


def _batch(model, cfg: Config, device: Device) -> torch.Tensor:
    g = torch.Generator().manual_seed(cfg.seed)
    return torch.randint(0, model.config.vocab_size, (cfg.batch, cfg.seq_len), generator=g).to(device.torch)  # (B, T)


def part_step_cost(model, label: str, cfg: Config, device: Device) -> list[dict]:
    """Forward, forward + backward, forward + backward + AdamW over the same (B, T) batch."""
    from torch.utils.flop_counter import FlopCounterMode

    ids = _batch(model, cfg, device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-9)  # a real step at a rate too small to matter here

    def forward():
        with torch.no_grad():
            model(input_ids=ids, use_cache=False)

    def backward():
        model.zero_grad(set_to_none=True)
        model(input_ids=ids, labels=ids, use_cache=False).loss.backward()

    def step():
        backward()
        opt.step()

    fns = {"inference: forward": forward, "training: forward + backward": backward, "training: + AdamW step": step}
    flops = {}
    for name, fn in fns.items():
        with FlopCounterMode(display=False) as fc:
            fn()
        flops[name] = fc.get_total_flops()
    timing = interleaved(fns, cfg.repeats, device)
    model.zero_grad(set_to_none=True)
    n, tokens = matmul_params(model), ids.numel()
    base = summary(timing.seconds["inference: forward"]).median
    rows = []
    for name in fns:
        s = summary(timing.seconds[name])
        rows.append(dict(model=label, regime=name, tokens=tokens, matmul_params=n, time_ms=1e3 * s.median,
                         time_ms_p10=1e3 * s.p10, time_ms_p90=1e3 * s.p90, x_forward=s.median / base,
                         flops=flops[name], flops_per_token_per_param=flops[name] / tokens / n,
                         napkin_per_token_per_param=2.0 if name.startswith("inference") else 6.0))
    return rows


def part_memory(model, label: str, cfg: Config, device: Device) -> list[dict]:
    """Bytes of each regime, tensor by tensor (and the allocator's peak on a GPU)."""
    from llmlab.inference import decode

    ids = _batch(model, cfg, device)
    params = list(model.parameters())
    n = sum(p.numel() for p in params)
    weights = _tensor_bytes(params)
    param_ptrs = {p.untyped_storage().data_ptr() for p in params}

    def peak(fn) -> int | None:
        if not device.is_cuda:
            return None
        torch.cuda.reset_peak_memory_stats(device.torch)
        fn()
        return torch.cuda.max_memory_allocated(device.torch)

    cache = decode.new_cache(model)
    with torch.no_grad():
        logits = decode.forward(model, ids, cache, logits_to_keep=0)  # (B, T, V): a prefill's logits
    kv = _tensor_bytes(t for layer in cache.layers for t in (layer.keys, layer.values))
    act_inf = logits.numel() * logits.element_size()
    inf_peak = peak(lambda: model(input_ids=ids, use_cache=True)) if device.is_cuda else None
    del logits, cache

    saved: list[torch.Tensor] = []

    def pack(t):
        if t.untyped_storage().data_ptr() not in param_ptrs:  # weights saved for backward are not activations
            saved.append(t)
        return t

    opt = torch.optim.AdamW(params, lr=1e-9)
    model.zero_grad(set_to_none=True)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = model(input_ids=ids, labels=ids, use_cache=False).loss
    acts = _tensor_bytes(saved)
    saved.clear()
    loss.backward()
    opt.step()
    grads = _tensor_bytes(p.grad for p in params if p.grad is not None)
    state = [t for s in opt.state.values() for t in s.values() if torch.is_tensor(t) and t.dim() > 0]
    optim = _tensor_bytes(state)
    optim_elems = sum(t.numel() for t in state)
    train_peak = peak(lambda: model(input_ids=ids, labels=ids,
                                    use_cache=False).loss.backward()) if device.is_cuda else None
    model.zero_grad(set_to_none=True)
    del opt
    common = dict(model=label, params=n, tokens=ids.numel())
    return [
        dict(**common, regime="inference", weights_B=weights, grads_B=0, optimizer_B=0, activations_B=act_inf,
             kv_cache_B=kv,
             total_B=weights + act_inf + kv, optimizer_elems=0, allocator_peak_B=inf_peak),
        dict(**common, regime="training (AdamW)", weights_B=weights, grads_B=grads, optimizer_B=optim,
             activations_B=acts,
             kv_cache_B=0, total_B=weights + grads + optim + acts, optimizer_elems=optim_elems,
             allocator_peak_B=train_peak),
    ]


def memory_chart_rows(memory: list[dict]) -> list[dict]:
    """The first model's regimes in MiB, one column per kind of bytes (the stacked chart)."""
    first = [r for r in memory if r["model"] == memory[0]["model"]] if memory else []
    return [dict(regime=r["regime"].split(" ")[0], weights=r["weights_B"] / 2**20, grads=r["grads_B"] / 2**20,
                 Adam=r["optimizer_B"] / 2**20, activations=r["activations_B"] / 2**20, KV=r["kv_cache_B"] / 2**20)
            for r in first]


def fits_rows() -> list[dict]:
    """Llama 3 8B on one 80 GB GPU, by formula (ZeRO's 16 bytes per parameter for mixed-precision Adam)."""
    from llmlab.core.flops import kv_bytes_per_token, param_count
    from llmlab.core.models import arch_config

    conf = arch_config("llama-3-8b")
    n, kv = param_count(conf), kv_bytes_per_token(conf, 2)
    ctx = 8192
    rows = [dict(regime="inference, BF16 weights + 8k-token KV", bytes_per_param=2, state_GB=2 * n / 1e9,
                 other_GB=kv * ctx / 1e9, other="KV cache, 1 sequence of 8,192 tokens"),
            dict(regime="training, mixed-precision AdamW", bytes_per_param=16, state_GB=16 * n / 1e9, other_GB=None,
                 other="+ activations (grow with batch x length)")]
    for r in rows:
        r["total_GB"] = r["state_GB"] + (r["other_GB"] or 0)
        r["fits_80GB"] = r["total_GB"] <= GPU_GB
        r["params"] = n
    return rows


def part_parallel(model, cfg: Config, device: Device) -> list[dict]:
    """T positions in one teacher-forced forward vs T decode steps, same model and T (batch 1)."""
    from llmlab.inference import decode

    model.eval()
    t = cfg.seq_len
    ids = _batch(model, cfg, device)[:1]  # (1, T)

    def parallel():
        with torch.no_grad():
            model(input_ids=ids, use_cache=False)

    def sequential():
        decode.generate(model, ids[:, :1], t - 1)

    timing = interleaved({"parallel": parallel, "sequential": sequential}, cfg.repeats, device)
    rows = []
    for name, how in (("parallel", "one forward over all T positions (training sees them at once)"),
                      ("sequential", "T - 1 decode steps after a 1-token prompt (KV cache on)")):
        s = summary(timing.seconds[name]).median
        rows.append(dict(mode=name, how=how, tokens=t, time_ms=1e3 * s, tokens_per_s=t / s))
    rows[0]["x_sequential"] = rows[0]["tokens_per_s"] / rows[1]["tokens_per_s"]
    rows[1]["x_sequential"] = 1.0
    model.train()
    return rows


def part_learning(model, cfg: Config, device: Device) -> list[dict]:
    """Generate a conversation; weights, grads and the answer stay put. One AdamW step on it; they move."""
    from llmlab.inference import decode
    from llmlab.inference.decode import SamplingParams

    model.eval()
    prompt = torch.tensor([[model.config.bos_token_id or 1]], device=device.torch)  # (1, 1)
    sampling = SamplingParams(temperature=0.8)

    def answer() -> list[int]:
        g = torch.Generator(device=device.torch).manual_seed(cfg.seed)
        return decode.generate(model, prompt, cfg.answer_tokens, sampling, g).tokens[0].tolist()

    def loss_on(conv: torch.Tensor) -> float:
        with torch.no_grad():
            return float(model(input_ids=conv, labels=conv, use_cache=False).loss)

    h0, a0 = weights_hash(model), answer()
    g = torch.Generator(device=device.torch).manual_seed(cfg.seed + 1)
    conv = torch.cat([prompt, decode.generate(model, prompt, cfg.gen_tokens, sampling, g).tokens], 1)  # (1, 1 + n)
    loss0 = loss_on(conv)
    h1, grads1, a1 = weights_hash(model), sum(p.grad is not None for p in model.parameters()), answer()
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
    model(input_ids=conv, labels=conv, use_cache=False).loss.backward()
    opt.step()
    model.zero_grad(set_to_none=True)
    model.eval()
    h2, a2, loss2 = weights_hash(model), answer(), loss_on(conv)
    return [
        dict(stage="before", weights_hash=h0, params_with_grad=0, answer_same=True, answer_first_diff=-1,
             conversation_loss=None, tokens=0),
        dict(stage=f"after generating {cfg.gen_tokens} tokens", weights_hash=h1, params_with_grad=grads1,
             answer_same=a1 == a0, answer_first_diff=_first_diff(a0, a1),
             conversation_loss=loss0, tokens=cfg.gen_tokens),
        dict(stage=f"after one AdamW step (lr {cfg.lr:g})", weights_hash=h2, params_with_grad=0, answer_same=a2 == a0,
             answer_first_diff=_first_diff(a0, a2), conversation_loss=loss2, tokens=cfg.gen_tokens),
    ]


def _first_diff(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y), -1)
