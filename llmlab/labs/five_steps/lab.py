"""The five-steps lab's run: the walk through the model's own steps, and where the time goes."""

from __future__ import annotations

import time

import torch

from llmlab.core.device import Device, torch_threads
from llmlab.core.results import LabResult
from llmlab.core.stats import summary
from llmlab.labs.five_steps.config import LAB, VERSION, Config

STEPS = ("1. embed", "2. attention", "3. MLP", "norms", "4. LM head", "5. sample")
LOGIT_TOL = 1e-5  # hand run vs forward, FP32


# ---------------------------------------------------------------- the model's own steps


def parts(model) -> dict[str, list[torch.nn.Module]]:
    """The modules of each step, in a Llama-family model (HF's module names)."""
    inner = model.model
    return {"1. embed": [inner.embed_tokens, inner.rotary_emb],
            "2. attention": [layer.self_attn for layer in inner.layers],
            "3. MLP": [layer.mlp for layer in inner.layers],
            "norms": [n for layer in inner.layers for n in (layer.input_layernorm, layer.post_attention_layernorm)] +
            [inner.norm],
            "4. LM head": [model.lm_head]}


def hand_run(model, ids: torch.Tensor, record=None) -> torch.Tensor:
    """The five steps' first four by hand, calling the model's submodules in order.

    Returns the (B, V) logits of the last position."""
    inner = model.model
    t = ids.shape[1]
    h = inner.embed_tokens(ids)  # (B, T, d)
    pe = inner.rotary_emb(h, torch.arange(t, device=ids.device)[None])  # cos, sin: (1, T, head_dim)
    # (1, 1, T, T) causal
    mask = torch.full((t, t), float("-inf"), device=ids.device, dtype=h.dtype).triu(1)[None, None]
    if record:
        record("1. embed", "token ids -> vectors", h)
    for i, layer in enumerate(inner.layers):
        a = layer.self_attn(hidden_states=layer.input_layernorm(h), position_embeddings=pe, attention_mask=mask)[0]
        h = h + a  # residual
        m = layer.mlp(layer.post_attention_layernorm(h))
        h = h + m  # residual
        if record and i == 0:
            record("2. attention", f"layer 1 of {len(inner.layers)}", a)
            record("3. MLP", f"layer 1 of {len(inner.layers)}", m)
    h = inner.norm(h)
    logits = model.lm_head(h[:, -1:])  # (B, 1, V)
    if record:
        record("2-3. x layers", f"after all {len(inner.layers)} layers + final norm", h)
        record("4. LM head", "one score per vocabulary word", logits)
    return logits[:, -1]


def load_model(ref: str, device: Device, layers: int | None = None, meta: bool = False):
    """(model, tokenizer or None, label). arch: models get random weights, optionally cut to `layers`."""
    from llmlab.core.models import arch_config, load

    if ref.startswith("arch:"):
        from transformers import AutoModelForCausalLM

        conf = arch_config(ref.split(":", 1)[1])
        full = conf.num_hidden_layers
        if layers:
            conf.num_hidden_layers = min(layers, full)
        with torch.device("meta" if meta else device.torch):
            model = AutoModelForCausalLM.from_config(conf)
        return model.eval(), None, full
    lm = load(ref, device)
    return lm.model, lm.tokenizer, lm.model.config.num_hidden_layers


# ---------------------------------------------------------------- run


def run(cfg: Config, device: Device, progress=None) -> LabResult:
    """Measures. Fills tables; never prints, never judges."""
    res = LabResult.new(LAB, VERSION, cfg)
    with torch_threads(None if device.is_cuda else cfg.threads), res.guard(), torch.inference_mode():
        model, tok, _ = load_model(cfg.model, device)
        ids = tok(cfg.prompt, return_tensors="pt", add_special_tokens=False)["input_ids"].to(device.torch)  # (1, T)
        t = len(tok.encode(cfg.prompt, add_special_tokens=False))  # T as the tokenizer counts it, apart from the tensor
        res.add_table("walk", walk_rows(model, ids, cfg.model, t, tok, cfg.seed))
        res.add_table("candidates", candidate_rows(model, ids, tok, cfg))
        big, _, big_layers = load_model(cfg.big, device, meta=True)
        res.add_table("walk_big", walk_rows(big, torch.zeros(1, t, dtype=torch.long, device="meta"), cfg.big, t))
        del big
        res.add_table("hand_run", [hand_check(model, ids)])
        timing = time_steps(model, cfg, device, cfg.model, model.config.num_hidden_layers)
        res.add_table("time", timing)
        for ref in cfg.sizes:
            m, _, full = load_model(ref, device, layers=cfg.size_layers)
            timing += time_steps(m, cfg, device, ref, full)
            del m
            res.add_table("time", timing)
        shares = res.add_table("shares", share_rows(timing))
        first = shares[shares.model == cfg.model]
        res.add_table("chart_decode", first[first.phase == "decode"])
        if cfg.sizes:
            res.add_table("sizes", shares[shares.phase == "decode"])
        else:
            res.skip("sizes", "--quick times tiny only; the full run adds larger arch: shapes")
        res.note(f"Llama 3 8B's walk runs on torch's meta device: real module shapes, no weights, no arithmetic; "
                 f"arch: sizes are timed on {cfg.size_layers} of their layers, attention and MLP scaled to all layers")
    return res


def predicted_shapes(config, t: int) -> dict[str, tuple[int, ...]]:
    """Each step's output shape from the config alone: T tokens in, d wide, V scores out, one id picked."""
    d, v = config.hidden_size, config.vocab_size
    return {"1. tokenize": (1, t), "1. embed": (1, t, d), "2. attention": (1, t, d), "3. MLP": (1, t, d),
            "2-3. x layers": (1, t, d), "4. LM head": (1, 1, v), "5. sample": (1,)}


def walk_rows(model, ids: torch.Tensor, label: str, t: int, tok=None, seed: int = 0) -> list[dict]:
    """The walk's rows: each step's measured shape beside the shape `predicted_shapes` gives for T = `t`.
    The sample row also keeps the id drawn (None on the meta device: shapes only, no values)."""
    expect = predicted_shapes(model.config, t)
    rows = [dict(model=label, step="1. tokenize", what=_pieces(tok, ids) if tok else f"{ids.shape[1]} token ids",
                 shape=str(tuple(ids.shape)), expected=str(expect["1. tokenize"]), token_id=None,
                 vocab=model.config.vocab_size)]

    def record(step, what, x):
        rows.append(dict(model=label, step=step, what=what, shape=str(tuple(x.shape)), expected=str(expect[step]),
                         token_id=None, vocab=model.config.vocab_size))

    logits = hand_run(model, ids, record)  # (1, V)
    if logits.is_meta:
        pick, what = logits.argmax(-1), "argmax (meta device: the shape only)"  # (1,)
    else:
        pick, what = _sample(logits, seed), "softmax -> pick one id"
    record("5. sample", what, pick)
    rows[-1]["token_id"] = None if pick.is_meta else int(pick[0])
    return rows


def _sample(logits: torch.Tensor, seed: int) -> torch.Tensor:
    """(B, V) logits -> (B,) sampled ids."""
    from llmlab.inference import sampling

    return sampling.sample(logits.float(), generator=generator_on(logits.device, seed))


def generator_on(device: torch.device, seed: int) -> torch.Generator:
    """A seeded generator on `device`: a generator draws only on its own device (a CPU one cannot sample CUDA
    logits)."""
    return torch.Generator(device=device).manual_seed(seed)


def _pieces(tok, ids: torch.Tensor) -> str:
    return " ".join(f"[{_show(tok.decode([i]))}]" for i in ids[0].tolist())


def _show(piece: str) -> str:
    """A token's text with newlines and tabs visible (a leading space stays a space)."""
    return piece.encode("unicode_escape").decode("ascii")


def candidate_rows(model, ids: torch.Tensor, tok, cfg: Config) -> list[dict]:
    """Top-5 words after step 4, and what greedy and top-p pick (step 5)."""
    from llmlab.inference import sampling

    logits = model(input_ids=ids).logits[:, -1].float()  # (1, V)
    p = torch.softmax(logits, -1)[0]
    top = torch.topk(p, 5)
    picked_p = int(sampling.sample(logits, generator=generator_on(logits.device, cfg.seed), top_p=cfg.top_p)[0])
    greedy = int(logits.argmax(-1)[0])
    rows = [dict(rank=i + 1, word=_show(tok.decode([t])), token_id=int(t), probability=float(pr),
                 greedy_pick=int(t) == greedy, top_p_pick=int(t) == picked_p) for i,
                 (pr, t) in enumerate(zip(top.values, top.indices, strict=True))]
    if picked_p not in top.indices.tolist():
        rows.append(dict(rank=int((p > p[picked_p]).sum()) + 1, word=_show(tok.decode([picked_p])), token_id=picked_p,
                         probability=float(p[picked_p]), greedy_pick=False, top_p_pick=True))
    return rows


def hand_check(model, ids: torch.Tensor) -> dict:
    """Step 4's logits by hand vs the model's forward; step 5's greedy word vs generate's first token."""
    from llmlab.inference import decode

    by_hand = hand_run(model, ids).float()
    forward = model(input_ids=ids).logits[:, -1].float()
    gen = int(decode.generate(model, ids, 1).tokens[0, 0])
    return dict(max_abs_logit_diff=float((by_hand - forward).abs().max()), tolerance=LOGIT_TOL,
                hand_token=int(by_hand.argmax(-1)[0]), generate_token=gen)


# ---------------------------------------------------------------- where the time goes


class StepClock:
    """Forward pre/post hooks that add each step's wall time (device synchronised at each stamp)."""

    def __init__(self, model, device: Device):
        self.device, self.acc, self.handles = device, dict.fromkeys(STEPS, 0.0), []
        for step, mods in parts(model).items():
            for m in mods:
                self.handles.append(m.register_forward_pre_hook(self._start))
                self.handles.append(m.register_forward_hook(self._stop(step)))
        self._t0 = 0.0

    def _start(self, mod, args):
        self.device.synchronize()
        self._t0 = time.perf_counter()

    def _stop(self, step):
        def hook(mod, args, out):
            self.device.synchronize()
            self.acc[step] += time.perf_counter() - self._t0
        return hook

    def reset(self):
        self.acc = dict.fromkeys(STEPS, 0.0)

    def close(self):
        for h in self.handles:
            h.remove()


def time_steps(model, cfg: Config, device: Device, label: str, full_layers: int) -> list[dict]:
    """Per-step time, FLOPs and bytes of one decode step (context cfg.context) and one prefill (cfg.prefill_tokens)."""
    from llmlab.core.flops import Shape
    from llmlab.inference import decode, sampling

    g = torch.Generator().manual_seed(cfg.seed)  # token ids drawn on the CPU, then moved
    pick = generator_on(device.torch, cfg.seed)  # step 5 draws on the logits' device
    vocab = model.config.vocab_size
    run_layers = model.config.num_hidden_layers
    scale = full_layers / run_layers  # attention and MLP measured on run_layers, scaled to the full model
    shape = Shape.of(model.config)
    rows = []
    for phase, new in (("decode", 1), ("prefill", cfg.prefill_tokens)):
        ctx = torch.randint(0, vocab, (1, cfg.context), generator=g).to(device.torch)
        x = torch.randint(0, vocab, (1, new), generator=g).to(device.torch)  # (1, new)
        clock, per, totals = StepClock(model, device), {s: [] for s in STEPS}, []
        try:
            for r in range(cfg.repeats + 1):  # the first is a warm-up
                cache = decode.new_cache(model)
                if phase == "decode":
                    decode.forward(model, ctx, cache)
                clock.reset()
                device.synchronize()
                t0 = time.perf_counter()
                # (1, V)
                logits = decode.forward(model, x, cache if phase == "decode" else decode.new_cache(model))[:, -1]
                device.synchronize()
                t1 = time.perf_counter()
                sampling.sample(logits.float(), generator=pick, top_p=cfg.top_p)
                device.synchronize()
                clock.acc["5. sample"] = time.perf_counter() - t1
                if r:
                    totals.append(t1 - t0)
                    for s in STEPS:
                        per[s].append(clock.acc[s])
        finally:
            clock.close()
        flops, counted, params = _flops(model, shape, phase, new, cfg.context, x)
        fwd = summary(totals).median
        med = {s: summary(per[s]).median for s in STEPS}
        for s in STEPS:
            k = scale if s in ("2. attention", "3. MLP", "norms") else 1.0
            rows.append(dict(model=label, layers=full_layers, layers_run=run_layers, phase=phase, tokens=new, step=s,
                             time_ms=1e3 * med[s] * k, flops=flops.get(s, 0) * (k if s != "5. sample" else 1),
                             counted_flops=counted.get(s, 0) * k, param_bytes=params.get(s, 0) * k,
                             forward_ms=1e3 * (fwd +
                                               (scale - 1) * (med["2. attention"] + med["3. MLP"] + med["norms"])),
                             measured_forward_ms=1e3 * fwd, stamped_ms=1e3 * sum(med[s] for s in STEPS[:5])))
    return rows


def _flops(model, shape, phase: str, new: int, context: int, x: torch.Tensor):
    """(formula FLOPs by step, FlopCounterMode FLOPs by step, parameter bytes by step) of one forward as timed.
    The counter counts SDPA on every device (core.flops' mapping for the CPU kernel), so attention's core is in both."""
    from torch.utils.flop_counter import FlopCounterMode

    from llmlab.inference.flopcount import sdpa_flop_mapping

    t = shape
    rows = new  # positions through each layer (batch 1)
    pairs = new * (context + 1) if phase == "decode" else new * new  # FlopCounterMode counts SDPA's dense T x T
    lin = {n: 2 * rows * k * m * c for n, k, m, c in t.matmuls() if n != "lm_head"}
    core = 4 * t.heads * t.head_dim * pairs * t.layers  # QK^T and PV
    formula = {"2. attention": sum(v for n, v in lin.items() if n.endswith(("q_proj", "k_proj", "v_proj", "o_proj"))) +
               core,
               "3. MLP": sum(v for n, v in lin.items() if n in ("gate_proj", "up_proj", "down_proj")),
               "4. LM head": 2 * 1 * t.hidden * t.vocab}
    counted: dict[str, int] = {}
    from llmlab.inference import decode

    cache = decode.new_cache(model)
    if phase == "decode":
        decode.forward(model, torch.zeros(1, context, dtype=torch.long, device=x.device), cache)
    with FlopCounterMode(display=False, custom_mapping=sdpa_flop_mapping()) as fc:
        decode.forward(model, x, cache)
    counts = fc.get_flop_counts()
    for name, ops in counts.items():
        total = sum(ops.values())
        if name.endswith(".self_attn"):
            counted["2. attention"] = counted.get("2. attention", 0) + total
        elif name.endswith(".mlp"):
            counted["3. MLP"] = counted.get("3. MLP", 0) + total
        elif name.endswith("lm_head"):
            counted["4. LM head"] = total
    elem = next(model.parameters()).element_size()
    params = {s: elem * sum(p.numel() for m in mods for p in m.parameters()) for s, mods in parts(model).items()}
    params["1. embed"] = elem * new * t.hidden  # a lookup reads only the rows of the new tokens
    return formula, counted, params


def share_rows(timing: list[dict]) -> list[dict]:
    """Each step's share of time, FLOPs and parameter bytes, per model and phase."""
    import pandas as pd

    df = pd.DataFrame(timing)
    out = []
    for (model, phase), g in df.groupby(["model", "phase"], sort=False):
        tt, ft, bt = g.time_ms.sum(), g.flops.sum(), g.param_bytes.sum()
        for r in g.itertuples():
            out.append(dict(model=model, phase=phase, step=r.step, time_share=r.time_ms / tt, flop_share=r.flops / ft,
                            byte_share=r.param_bytes / bt))
    return out
