"""The tokens lab's run: parts 1-3 on each model, into tables (never printed, never judged here)."""

from __future__ import annotations

import torch

from llmlab.core.device import Device, threads_for, torch_threads
from llmlab.core.results import LabResult
from llmlab.labs.tokens.config import LAB, VERSION, Config
from llmlab.labs.tokens.embeddings import corpus_ids, embedding_summary, example_rows, neighbour_rows
from llmlab.labs.tokens.tokenization import counting_rows, tokenization_rows
from llmlab.labs.tokens.vocab import sweep_dtype, sweep_layers, vocab_rows

# ---------------------------------------------------------------- run


def check(cfg: Config) -> None:
    """Every model must load a tokenizer (one line, exit 2, before anything is measured)."""
    from llmlab.core.models import classify

    for ref in cfg.models:
        classify(ref)
    classify(cfg.shape)


def _same_tokenizer(a, b) -> bool:
    return a.get_vocab() == b.get_vocab()


def run(cfg: Config, device: Device, progress=None) -> LabResult:
    """Measures. Fills tables; never prints, never judges."""
    from llmlab.core.models import load

    res = LabResult.new(LAB, VERSION, cfg)
    with torch_threads(None if device.is_cuda else threads_for(cfg.threads, res.note)), res.guard():
        res.env["torch_threads"] = torch.get_num_threads()
        tok_rows, count, nb, seen = [], [], [], []
        for ref in cfg.models:
            lm = load(ref, device)
            if not any(_same_tokenizer(lm.tokenizer, t) for t in seen):
                seen.append(lm.tokenizer)
                tok_rows += tokenization_rows(lm.tokenizer, ref)
                res.add_table("tokenization", tok_rows)
            count += counting_rows(lm.model, lm.tokenizer, ref, cfg, device)
            res.add_table("counting", count)
            ids = corpus_ids(lm.tokenizer, cfg.corpus_chars)
            emb = lm.model.get_input_embeddings().weight.detach()
            nb += neighbour_rows(emb, lm.tokenizer, ref, ids, cfg, progress)
            res.env.setdefault("corpus_tokens", {})[ref] = len(ids)
            del lm
            res.add_table("neighbours", nb)
            res.add_table("embedding_test", embedding_summary(res.tables["neighbours"], cfg))
            res.add_table("examples", example_rows(res.tables["neighbours"]))
        n = res.env["corpus_tokens"][cfg.models[0]]
        res.note(f"related = the same word up to case and leading space, a shared stem (4+ letters), or within "
                 f"+-{cfg.window} tokens >= {cfg.cooc_min} times and >= {cfg.cooc_ratio:g}x chance in {n:,} tokens of "
                 "held-out documents of the built-in corpus (tiny and tiny-draft never trained on them)")
        layers = res.env["vocab_layers"] = sweep_layers(cfg, device, sweep_dtype(device).itemsize)
        rows = []
        for row in vocab_rows(cfg, device, layers, progress):
            rows.append(row)
            res.add_table("vocab", rows)
        res.note(f"part 3 is {cfg.shape}'s layer shape cut to {layers} layers, untied head, random weights: a timing "
                 "and a byte count, not a quality claim")
    return res
