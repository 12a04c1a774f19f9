"""The train-vs-infer lab's verdicts, headline and views, from the tables alone."""

from __future__ import annotations

from llmlab.core.results import Chart, Claim, Col, LabResult, View

STEP_RATIO_BAND = (2.0, 4.5)  # napkin 3x (backward ~2x forward); AdamW and overheads widen it
FLOP_RATIO_TOL = 0.10  # the training step's counted FLOPs are 3x the forward's within 10%
PARALLEL_MIN = 10.0  # teacher forcing is at least 10x the tokens/s of generating one at a time


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
                            f"{ratio:.1f}x ({tr.total_B / 2**20:.0f} vs {inf.total_B / 2**20:.0f} MiB, {inf.model})",
                            ratio >= 4))
    par = _rows(result, "parallel")
    if par is not None:
        x = float(par.set_index("mode").loc["parallel", "x_sequential"])
        claims.append(Claim("train_vs_infer.parallel_vs_sequential",
                            "training sees every position at once; generation one at a time",
                            f">= {PARALLEL_MIN:g}x tokens/s for one forward over T vs T decode steps",
                            f"{x:.0f}x ({par.tokens_per_s.iloc[0]:,.0f} vs {par.tokens_per_s.iloc[1]:,.0f} tokens/s)",
                            x >= PARALLEL_MIN))
    learn = _rows(result, "learning")
    if learn is None:
        claims.append(Claim("train_vs_infer.inference_does_not_learn", "running inference does not change the model",
                            "same hash, no .grad, same answer", "-", None,
                            note=result.skipped.get("learning", "not measured")))
    else:
        before, gen, step = learn.iloc[0], learn.iloc[1], learn.iloc[2]
        same = gen.weights_hash == before.weights_hash and gen.params_with_grad == 0 and bool(gen.answer_same)
        claims.append(Claim("train_vs_infer.inference_does_not_learn", "running inference does not change the model",
                            "same weights hash, no .grad, same answer to the same prompt and seed",
                            f"hash {'unchanged' if gen.weights_hash == before.weights_hash else 'CHANGED'}, "
                            f"{int(gen.params_with_grad)} params with .grad, answer "
                            f"{'identical' if gen.answer_same else 'different'} after {int(gen.tokens)} tokens", same))
        learned = step.weights_hash != before.weights_hash and step.conversation_loss < gen.conversation_loss
        claims.append(Claim("train_vs_infer.training_step_learns",
                            "one training step on the conversation changes the model",
                            "weights hash changes and loss after < loss before, on that conversation",
                            f"hash {'changed' if step.weights_hash != before.weights_hash else 'unchanged'}; loss "
                            f"{gen.conversation_loss:.3f} -> {step.conversation_loss:.3f}; answer "
                            + ("unchanged" if step.answer_same else
                               f"differs from token {int(step.answer_first_diff)}"),
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
             "memory", (Col("regime", "regime"), Col("weights_B", "weights MiB", ".1f"),
                        Col("grads_B", "grads MiB", ".1f"),
                        Col("optimizer_B", "Adam MiB", ".1f"), Col("activations_B", "activations MiB", ".1f"),
                        Col("kv_cache_B", "KV MiB", ".2f")),
             rows=lambda df: _mib(df[df.model == df.model.iloc[0]]),
             chart=Chart("MiB per regime (first model)", "memory_chart", "regime",
                         ["weights", "grads", "Adam", "activations", "KV"], kind="stacked", ylabel="MiB")),
        View("   ... and Llama 3 8B on one 80 GB GPU, by formula", "Does it fit for inference? For training?", "fits",
             (Col("regime", "regime", width=40), Col("bytes_per_param", "B / param", "int"),
              Col("total_GB", "GB", ".0f"),
              Col("fits_80GB", "fits 80 GB"))),
        View("3. Why answers come one word at a time", "T positions in one forward vs T decode steps: tokens/s?",
             "parallel", (Col("mode", "mode"), Col("tokens", "T", "int"), Col("time_ms", "ms"),
                          Col("tokens_per_s", "tokens / s", "int"), Col("x_sequential", "x one at a time", "x"))),
        View("4. Inference does not learn", "Does generating change the weights? Does one training step?", "learning",
             (Col("stage", "stage", width=32), Col("weights_hash", "weights sha256"),
              Col("params_with_grad", ".grad", "int"),
              Col("answer_same", "same answer"), Col("conversation_loss", "loss on it", ".3f"))),
    ]


def _mib(df):
    df = df.copy()
    for c in ("weights_B", "grads_B", "optimizer_B", "activations_B", "kv_cache_B"):
        df[c] = df[c] / 2**20
    return df
