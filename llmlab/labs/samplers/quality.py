"""Part 2 of the samplers lab: what each strategy does to the text (diversity, repetition, likelihood)."""

from __future__ import annotations

import torch

from llmlab.core.device import Device
from llmlab.core.render import track
from llmlab.core.results import LabResult
from llmlab.inference import decode
from llmlab.inference import sampling as S
from llmlab.labs.samplers.config import STRATEGIES, Config
from llmlab.labs.samplers.fates import entropy, setting, show_token, strategy_kwargs

# ----------------------------------------------------------------------------- 2. quality


@torch.inference_mode()
def generate(lm, device: Device, prompt: str, n: int, max_new: int, kw: dict | None, gen: torch.Generator) -> dict:
    """n continuations (batched) with a KV cache; the model's own log-prob and entropy at each step."""
    ids = lm.tokenizer(prompt, return_tensors="pt").input_ids.to(device.torch).repeat(n, 1)  # (n, S)
    cache = decode.new_cache(lm.model)
    logits = decode.prefill(lm.model, ids, cache)  # (n, V)
    toks, logp, ent_model, ent_sampled = [], [], [], []
    for step in range(max_new):
        if kw is None:
            tok, ent_s = S.greedy(logits), torch.zeros(n, device=logits.device)
        else:
            pr = S.probs(logits, **kw)
            tok, ent_s = S.sample_multinomial(pr, gen), entropy(pr)
        lsm = logits.log_softmax(-1)
        toks.append(tok)
        logp.append(lsm.gather(-1, tok[:, None])[:, 0])
        ent_model.append(entropy(lsm.exp()))
        ent_sampled.append(ent_s)
        if step + 1 < max_new:
            logits = decode.decode_one_token(lm.model, tok[:, None], cache)
    stack = lambda xs: torch.stack(xs, 1).cpu()  # noqa: E731  (n, T)
    return {"tokens": stack(toks), "logp": stack(logp), "ent_model": stack(ent_model),
            "ent_sampled": stack(ent_sampled)}


def text_metrics(out: dict, eos: int | None) -> dict:
    """distinct-1/2 across the continuations, rep-4 within each, model log-prob and entropies."""
    seqs, lp, em, es = [], [], [], []
    for i, row in enumerate(out["tokens"].tolist()):
        T = row.index(eos) if eos is not None and eos in row else len(row)  # stop at end-of-text
        T = max(T, 1)
        seqs.append(row[:T])
        lp += out["logp"][i, :T].tolist()
        em += out["ent_model"][i, :T].tolist()
        es += out["ent_sampled"][i, :T].tolist()
    uni = [t for s in seqs for t in s]
    bi = [tuple(s[j : j + 2]) for s in seqs for j in range(len(s) - 1)]
    reps = []
    for s in seqs:
        grams = [tuple(s[j : j + 4]) for j in range(len(s) - 3)]
        if grams:
            reps.append(1 - len(set(grams)) / len(grams))
    mean = lambda xs: sum(xs) / len(xs) if xs else float("nan")  # noqa: E731
    return {
        "tokens": len(uni), "distinct_1": len(set(uni)) / max(len(uni), 1),
        "distinct_2": len(set(bi)) / max(len(bi), 1),
        "rep_4": mean(reps), "mean_logprob": mean(lp), "entropy_model_nats": mean(em), "entropy_sampled_nats": mean(es),
    }


def part_quality(res: LabResult, cfg: Config, lm, device: Device, progress) -> None:
    gen = torch.Generator(device=device.torch).manual_seed(cfg.seed)
    eos = lm.tokenizer.eos_token_id
    runs = [("strategy", name, strategy_kwargs(cfg, name)) for name in STRATEGIES]
    runs += [("temperature", f"t={t}", {"temperature": t}) for t in cfg.temperatures]
    strat_rows, sweep_rows = [], []
    for group, name, kw in track(progress, runs, "quality: generating"):
        out = generate(lm, device, cfg.prompt, cfg.samples, cfg.max_new_tokens, kw, gen)
        m = text_metrics(out, eos)
        sample = show_token(lm.tokenizer.decode(out["tokens"][0].tolist()))[:40]
        if group == "strategy":
            strat_rows.append({"strategy": name, "setting": setting(cfg, name), **m, "sample": sample})
        else:
            sweep_rows.append({"temperature": kw["temperature"], **m, "sample": sample})
    res.add_table("quality", strat_rows)
    res.add_table("temperature_sweep", sweep_rows)
