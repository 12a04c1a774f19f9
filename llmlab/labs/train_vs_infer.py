"""Lab: training vs inference — training does two things (forward, then backward + update), inference one.

Parts, in the order of the article ("AI Inference, part 1"):
1. the cost of one step: a forward (inference), forward + backward, forward + backward + AdamW,
   over the same B x T tokens, timed in interleaved rounds; FLOPs counted by
   torch.utils.flop_counter.FlopCounterMode beside the napkin 2N (forward) and 6N (training).
2. memory: bytes per parameter of each regime, counted tensor by tensor: weights, gradients
   (after backward), AdamW's two moments (optimizer.state), the activations autograd saves for
   backward (saved_tensors_hooks, each storage once), and inference's KV cache + logits.
   On a GPU torch.cuda.max_memory_allocated is recorded beside it. Scaled to Llama 3 8B by formula.
3. why answers come one word at a time: T positions in one teacher-forced forward vs T
   sequential decode steps (KV cache on), tokens/s of each on the same model.
4. inference does not learn: generate a conversation, check the weights' hash, .grad and a
   re-run with the same prompt and seed; then one AdamW step on that conversation and check again.

References:
- Kaplan et al. 2020 (arXiv 2001.08361), section 2.1: forward ~ 2N FLOPs per token, training ~ 6N.
- ZeRO (Rajbhandari et al. 2020, arXiv 1910.02054), section 3.1: mixed-precision Adam keeps
  16 bytes per parameter (2 weights + 2 grads + 4 master + 4 + 4 moments); FP32 Adam also 16.
- torch.utils.flop_counter.FlopCounterMode; torch.autograd.graph.saved_tensors_hooks.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch

from llmlab.core.device import Device, threads_for, torch_threads
from llmlab.core.results import Chart, Claim, Col, LabResult, View
from llmlab.core.stats import summary
from llmlab.core.timing import interleaved

LAB = "train-vs-infer"
VERSION = 1
JUDGE_VERSION = 1
GPU_GB = 80  # the "one 80 GB GPU" of the fits table (A100/H100 80 GB)
STEP_RATIO_BAND = (2.0, 4.5)  # napkin 3x (backward ~2x forward); AdamW and overheads widen it
FLOP_RATIO_TOL = 0.10  # the training step's counted FLOPs are 3x the forward's within 10%
PARALLEL_MIN = 10.0  # teacher forcing is at least 10x the tokens/s of generating one at a time


@dataclass(frozen=True)
class Config:
    models: tuple[str, ...] = ("tiny", "arch:qwen2.5-0.5b")  # real trained weights + a real shape (random weights)
    arch_layers: int = 2  # arch: models are cut to this many layers: the shape of a layer, not 24 of them
    batch: int = 4  # B sequences per step: a small training batch
    seq_len: int = 128  # T tokens per sequence: a short training context
    repeats: int = 5  # interleaved timing rounds (median, p10, p90)
    gen_tokens: int = 1000  # the conversation inference generates in part 4 (the 1,000)
    answer_tokens: int = 32  # the answer compared before and after, same prompt and seed
    lr: float = 1e-3  # AdamW learning rate of part 4's single step (a common fine-tuning rate)
    threads: int = 0  # torch CPU threads; 0 keeps torch's default
    seed: int = 0

    def __post_init__(self):
        if not self.models:
            raise ValueError("--models needs at least one model")
        if self.batch < 1 or self.seq_len < 8:
            raise ValueError(f"--batch must be >= 1 and --seq-len >= 8, got {self.batch}, {self.seq_len}")
        if self.repeats < 1 or self.arch_layers < 1 or self.threads < 0:
            raise ValueError("repeats and arch layers must be >= 1, threads >= 0")
        if self.gen_tokens < 16 or self.answer_tokens < 4:
            raise ValueError(f"--gen-tokens must be >= 16 and answer tokens >= 4, got {self.gen_tokens}")
        if not self.lr > 0:
            raise ValueError(f"--lr must be > 0, got {self.lr}")

    @classmethod
    def quick(cls) -> Config:
        return cls(models=("tiny",), batch=2, seq_len=48, repeats=3, gen_tokens=64, answer_tokens=12)


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
    train_peak = peak(lambda: model(input_ids=ids, labels=ids, use_cache=False).loss.backward()) if device.is_cuda else None
    model.zero_grad(set_to_none=True)
    del opt
    common = dict(model=label, params=n, tokens=ids.numel())
    return [
        dict(**common, regime="inference", weights_B=weights, grads_B=0, optimizer_B=0, activations_B=act_inf, kv_cache_B=kv,
             total_B=weights + act_inf + kv, optimizer_elems=0, allocator_peak_B=inf_peak),
        dict(**common, regime="training (AdamW)", weights_B=weights, grads_B=grads, optimizer_B=optim, activations_B=acts,
             kv_cache_B=0, total_B=weights + grads + optim + acts, optimizer_elems=optim_elems, allocator_peak_B=train_peak),
    ]


def memory_chart_rows(memory: list[dict]) -> list[dict]:
    """The first model's regimes in MiB, one column per kind of bytes (the stacked chart)."""
    first = [r for r in memory if r["model"] == memory[0]["model"]] if memory else []
    return [dict(regime=r["regime"].split(" ")[0], weights=r["weights_B"] / 2**20, grads=r["grads_B"] / 2**20,
                 Adam=r["optimizer_B"] / 2**20, activations=r["activations_B"] / 2**20, KV=r["kv_cache_B"] / 2**20)
            for r in first]


def fits_rows() -> list[dict]:
    """Llama 3 8B on one 80 GB GPU, by formula (ZeRO's 16 bytes per parameter for mixed-precision Adam)."""
    from llmlab.core.models import arch_config, kv_bytes_per_token, param_count

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


# ---------------------------------------------------------------- judge


def _rows(result: LabResult, table: str):
    df = result.tables.get(table)
    return None if df is None or df.empty else df


def judge(result: LabResult) -> list[Claim]:
    """Every verdict from the tables alone."""
    claims: list[Claim] = []
    steps = _rows(result, "steps")
    if steps is not None:
        first = steps[steps.model == steps.model.iloc[0]].set_index("regime")
        fwd, bwd = first.loc["inference: forward"], first.loc["training: forward + backward"]
        r = bwd.flops / fwd.flops
        claims.append(Claim("train_vs_infer.training_flops_3x", "a training step costs 3x the FLOPs of a forward",
                            f"3x within {FLOP_RATIO_TOL:.0%} (backward = 2 matmuls per forward matmul)",
                            f"{r:.2f}x ({bwd.flops / 1e9:.2f} vs {fwd.flops / 1e9:.2f} GFLOP counted, {fwd.model})",
                            abs(r / 3 - 1) <= FLOP_RATIO_TOL))
        per = fwd.flops_per_token_per_param
        claims.append(Claim("train_vs_infer.forward_2n", "a forward costs about 2N FLOPs per token",
                            "1.9N-2.6N per token (2 x matmul parameters, + attention)",
                            f"{per:.2f}N per token ({fwd.model}, T={int(result.config.get('seq_len', 0))})",
                            1.9 <= per <= 2.6, note="attention's T^2 work adds to 2N as T grows"))
        tr = first.loc["training: + AdamW step"].x_forward
        lo, hi = STEP_RATIO_BAND
        claims.append(Claim("train_vs_infer.step_time_3x", "a training step takes about 3x a forward's time",
                            f"~3x ({lo:g}-{hi:g}x)", f"{tr:.2f}x ({first.loc['training: + AdamW step'].time_ms:.1f} vs "
                            f"{fwd.time_ms:.1f} ms)", lo <= tr <= hi,
                            note="small models on a CPU pay per-op overhead that the FLOP count does not see"))
    mem = _rows(result, "memory")
    if mem is not None:
        m = mem[mem.model == mem.model.iloc[0]].set_index("regime")
        inf, tr = m.loc["inference"], m.loc["training (AdamW)"]
        state_bpp = (tr.weights_B + tr.grads_B + tr.optimizer_B) / tr.params
        claims.append(Claim("train_vs_infer.adam_16_bytes", "training keeps 16 bytes per parameter before activations",
                            "4 weights + 4 grads + 8 Adam moments = 16 B/param (FP32)",
                            f"{state_bpp:.2f} B/param; optimizer {tr.optimizer_elems / tr.params:.2f} values/param",
                            abs(state_bpp - 16) < 0.01 and tr.optimizer_elems == 2 * tr.params))
        ratio = tr.total_B / inf.total_B
        claims.append(Claim("train_vs_infer.training_memory_ratio", "training needs several times inference's memory",
                            ">= 4x (16 vs 4 B/param, plus saved activations)",
                            f"{ratio:.1f}x ({tr.total_B / 2**20:.0f} vs {inf.total_B / 2**20:.0f} MiB, {inf.model})", ratio >= 4))
    par = _rows(result, "parallel")
    if par is not None:
        x = float(par.set_index("mode").loc["parallel", "x_sequential"])
        claims.append(Claim("train_vs_infer.parallel_vs_sequential", "training sees every position at once; generation one at a time",
                            f">= {PARALLEL_MIN:g}x tokens/s for one forward over T vs T decode steps",
                            f"{x:.0f}x ({par.tokens_per_s.iloc[0]:,.0f} vs {par.tokens_per_s.iloc[1]:,.0f} tokens/s)",
                            x >= PARALLEL_MIN))
    learn = _rows(result, "learning")
    if learn is None:
        claims.append(Claim("train_vs_infer.inference_does_not_learn", "running inference does not change the model",
                            "same hash, no .grad, same answer", "-", None, note=result.skipped.get("learning", "not measured")))
    else:
        before, gen, step = learn.iloc[0], learn.iloc[1], learn.iloc[2]
        same = gen.weights_hash == before.weights_hash and gen.params_with_grad == 0 and bool(gen.answer_same)
        claims.append(Claim("train_vs_infer.inference_does_not_learn", "running inference does not change the model",
                            "same weights hash, no .grad, same answer to the same prompt and seed",
                            f"hash {'unchanged' if gen.weights_hash == before.weights_hash else 'CHANGED'}, "
                            f"{int(gen.params_with_grad)} params with .grad, answer "
                            f"{'identical' if gen.answer_same else 'different'} after {int(gen.tokens)} tokens", same))
        learned = step.weights_hash != before.weights_hash and step.conversation_loss < gen.conversation_loss
        claims.append(Claim("train_vs_infer.training_step_learns", "one training step on the conversation changes the model",
                            "weights hash changes and loss after < loss before, on that conversation",
                            f"hash {'changed' if step.weights_hash != before.weights_hash else 'unchanged'}; loss "
                            f"{gen.conversation_loss:.3f} -> {step.conversation_loss:.3f}; answer "
                            + ("unchanged" if step.answer_same else f"differs from token {int(step.answer_first_diff)}"),
                            learned))
    return claims


def headline(result: LabResult, claims: list[Claim]) -> str:
    steps, par = _rows(result, "steps"), _rows(result, "parallel")
    if steps is None or par is None:
        return ""
    first = steps[steps.model == steps.model.iloc[0]].set_index("regime")
    x = float(par.set_index("mode").loc["parallel", "x_sequential"])
    return (f"A training step cost {first.loc['training: + AdamW step'].x_forward:.1f}x a forward here and keeps "
            f"16 B/param of state; but generating is {x:.0f}x slower per token than reading, because each new "
            "token waits for the one before it.")


def views(result: LabResult) -> list[View]:
    return [
        View("1. The cost of one step", "What does a training step cost against an inference forward, same tokens?",
             "steps", (Col("model", "model", width=14), Col("regime", "regime", width=28), Col("time_ms", "ms"),
                       Col("x_forward", "x forward", "x"), Col("flops_per_token_per_param", "FLOPs / token / N", ".2f"),
                       Col("napkin_per_token_per_param", "napkin", ".0f"))),
        View("2. Memory: bytes per parameter", "What does each regime hold in memory, counted tensor by tensor?",
             "memory", (Col("regime", "regime"), Col("weights_B", "weights MiB", ".1f"), Col("grads_B", "grads MiB", ".1f"),
                        Col("optimizer_B", "Adam MiB", ".1f"), Col("activations_B", "activations MiB", ".1f"),
                        Col("kv_cache_B", "KV MiB", ".2f")),
             rows=lambda df: _mib(df[df.model == df.model.iloc[0]]),
             chart=Chart("MiB per regime (first model)", "memory_chart", "regime",
                         ["weights", "grads", "Adam", "activations", "KV"], kind="stacked", ylabel="MiB")),
        View("   ... and Llama 3 8B on one 80 GB GPU, by formula", "Does it fit for inference? For training?", "fits",
             (Col("regime", "regime", width=40), Col("bytes_per_param", "B / param", "int"), Col("total_GB", "GB", ".0f"),
              Col("fits_80GB", "fits 80 GB"))),
        View("3. Why answers come one word at a time", "T positions in one forward vs T decode steps: tokens/s?",
             "parallel", (Col("mode", "mode"), Col("tokens", "T", "int"), Col("time_ms", "ms"),
                          Col("tokens_per_s", "tokens / s", "int"), Col("x_sequential", "x one at a time", "x"))),
        View("4. Inference does not learn", "Does generating change the weights? Does one training step?", "learning",
             (Col("stage", "stage", width=32), Col("weights_hash", "weights sha256"), Col("params_with_grad", ".grad", "int"),
              Col("answer_same", "same answer"), Col("conversation_loss", "loss on it", ".3f"))),
    ]


def _mib(df):
    df = df.copy()
    for c in ("weights_B", "grads_B", "optimizer_B", "activations_B", "kv_cache_B"):
        df[c] = df[c] / 2**20
    return df
