"""Train, measure and document the built-in pair: `build_pair` (what `llmlab tiny train` runs),
`measure` (re-measure shipped or trained weights), `write_card` (MODEL_CARD.md + metrics.json).

Every number in the card comes from `llmlab.tiny.evaluate` on this machine, next to the command
that measured it.

References:
- Mitchell et al. 2019, Model Cards for Model Reporting: https://arxiv.org/abs/1810.03993
"""

from __future__ import annotations

import json
import math
import platform
import re
import time
from dataclasses import asdict
from pathlib import Path

from llmlab.tiny.train import OnStep, TrainConfig, TrainReport, train_pair

WEIGHTS = Path(__file__).resolve().parent / "weights"


MEASURED_BY = "llmlab.tiny.evaluate.evaluate_pair on the saved folders (what llmlab tiny train runs after training)"

def corpus_ids(tokenizer, cfg: TrainConfig):
    """(train_ids, heldout_ids) of the config's corpus under a given (shipped) tokenizer."""
    import torch

    from llmlab.tiny.corpus import Corpus, build_corpus, topic_documents
    from llmlab.tiny.tokenizer import encode_documents

    if cfg.corpus == "topics":
        docs = [t for _, t in topic_documents()]
        corpus = Corpus(train=docs[4:], heldout=docs[:4])
    else:
        corpus = build_corpus()
    as_ids = lambda docs: torch.tensor(encode_documents(tokenizer, docs), dtype=torch.long)  # noqa: E731
    return as_ids(corpus.train), as_ids(corpus.heldout)


def heldout_ids(tokenizer):
    """Only the held-out stream of the full corpus (reads ~5 % of the files: quick, for tests)."""
    import torch

    from llmlab.tiny.corpus import build_corpus
    from llmlab.tiny.tokenizer import encode_documents

    return torch.tensor(encode_documents(tokenizer, build_corpus(heldout_only=True).heldout), dtype=torch.long)


def _load_pair(folder: Path):
    """(target, draft, tokenizer, seconds the three take to load from disk: the best of 3 loads, since
    other jobs on the machine only ever add to it). The clock starts after the imports (the Llama
    classes included): what is timed is loading these weights, not importing torch."""
    import transformers.models.llama.modeling_llama  # noqa: F401  (the model's code, imported before the clock)
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # local files load in milliseconds; our own bar is the one to show
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        target = AutoModelForCausalLM.from_pretrained(folder / "tiny").eval()
        draft = AutoModelForCausalLM.from_pretrained(folder / "tiny-draft").eval()
        tok = AutoTokenizer.from_pretrained(folder / "tiny")
        times.append(time.perf_counter() - t0)
    return target, draft, tok, min(times)


def _evaluate(folder: Path, loaded, train_ids, held, cfg: TrainConfig, timing: bool) -> dict:
    from llmlab.tiny.evaluate import evaluate_pair

    target, draft, tok, load_seconds = loaded
    m = evaluate_pair(target, draft, tok, train_ids, held, eval_tokens=cfg.eval_tokens, timing=timing)
    m["load_seconds"] = load_seconds
    m["size_mb"] = sum(_folder_bytes(Path(folder) / name) for name in ("tiny", "tiny-draft")) / 1e6
    return m


def measure(folder: Path = WEIGHTS, cfg: TrainConfig = TrainConfig(), timing: bool = True) -> dict:
    """Every model-card number for the pair in folder (default: the shipped one)."""
    loaded = _load_pair(Path(folder))
    train_ids, held = corpus_ids(loaded[2], cfg)
    return _evaluate(folder, loaded, train_ids, held, cfg, timing)


def remeasure(folder: Path, command: str) -> dict:
    """Measure a trained folder again and rewrite its metrics.json and MODEL_CARD.md, keeping the
    training report (what `llmlab tiny eval --write-card` runs)."""
    folder = Path(folder)
    payload = json.loads((folder / "metrics.json").read_text())
    payload["metrics"] = measure(folder)
    payload["measured_by"] = public_command(command)
    payload["env"]["measured_utc"] = _env()["utc"]
    (folder / "metrics.json").write_text(json.dumps(payload, indent=2, default=str) + "\n")
    render_card(folder)
    return payload["metrics"]


def build_pair(cfg: TrainConfig, out: Path, on_step: OnStep | None = None, timing: bool = True,
               command: str = "llmlab tiny train") -> tuple[TrainReport, dict]:
    """Train both models into out/, measure them, write out/MODEL_CARD.md and out/metrics.json."""
    out = Path(out)
    report, data = train_pair(cfg, out, on_step)
    loaded = _load_pair(out)  # measure what was saved, as a user will load it
    metrics = _evaluate(out, loaded, data.train_ids, data.heldout_ids, cfg, timing)
    write_card(out, report, metrics, command)
    return report, metrics


def _folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def _env() -> dict:
    from llmlab.core.device import cpu_cores, cpu_model_name, versions

    return {"cpu": cpu_model_name(), **cpu_cores(), "python": platform.python_version(),
            **{k: v for k, v in versions().items() if k in ("torch", "transformers", "tokenizers")},
            "utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


_ABS_PATH = re.compile(r"(?<![\w.<])(?:~|[A-Za-z]:)?[/\\](?:[\w.+-]+[/\\])*[\w.+-]+")


def public_command(command: str) -> str:
    """The command as the card shows it: absolute paths of the training machine (a scratch folder, a
    home directory) become `<dir>`; they say nothing to a reader and leak the trainer's file system."""
    return _ABS_PATH.sub("<dir>", command)


def write_card(out: Path, report: TrainReport, m: dict, command: str) -> None:
    """metrics.json (every measured number) and MODEL_CARD.md rendered from it."""
    out = Path(out)
    tail = lambda xs: sum(xs[-20:]) / max(1, len(xs[-20:]))  # noqa: E731  (mean of the last 20 steps)
    payload = {"report": asdict(report) | {"target_losses": None, "draft_losses": None},
               "final_train_loss_target": tail(report.target_losses),
               "final_train_kl_draft": tail(report.draft_losses),
               "metrics": m, "sizes_bytes": {name: _folder_bytes(out / name) for name in ("tiny", "tiny-draft")},
               "env": _env(), "command": public_command(command)}
    (out / "metrics.json").write_text(json.dumps(payload, indent=2, default=str) + "\n")
    render_card(out)


def render_card(out: Path) -> None:
    """MODEL_CARD.md from out/metrics.json (re-renderable without re-measuring)."""
    out = Path(out)
    payload = json.loads((out / "metrics.json").read_text())
    m = payload["metrics"]
    lines = [*_header_lines(payload), *_architecture_lines(payload), *_data_lines(payload),
             *_training_lines(payload), *_quality_lines(m), *_decode_lines(payload),
             *_goal_lines(m), *_copy_lines(m), *_loop_lines(m), *_sample_lines(m), *_limit_lines(payload)]
    (out / "MODEL_CARD.md").write_text("\n".join(lines))


def _limit_lines(payload: dict) -> list[str]:
    report = payload["report"]
    minutes = (report["target_seconds"] + report["draft_seconds"]) / 60
    threads = report["config"]["threads"]
    on = f"{threads} CPU thread{'s' if threads > 1 else ''}" if threads else "all CPU threads"
    return ["", "## Limits", "",
            f"Trained for {minutes:.0f} minutes on {on}: it continues Python-documentation-like",
            "text and code, it does not follow instructions, and greedy text can still repeat itself on prompts other",
            "than the loop check's. Use it to measure inference, never to judge answers.", ""]


def _header_lines(payload: dict) -> list[str]:
    m, env = payload["metrics"], payload["env"]
    load = f", 1-minute load average {m['load_average_1m']:.1f} when timed" if "load_average_1m" in m else ""
    return [
        "# tiny / tiny-draft: the built-in model pair",
        "",
        "Two small Llama models (`LlamaForCausalLM`) sharing one byte-level BPE tokenizer, trained from scratch on",
        "text every Python install carries: `pydoc_data.topics`, the standard library's docstrings and a slice of",
        "its source. `tiny` is the target; `tiny-draft` is its speculative-decoding draft, distilled from it",
        "(KL to the target's logits). They are real trained models, but tiny: good enough to show how inference",
        "behaves, not to answer questions.",
        "",
        f"- Trained by: `{public_command(payload['command'])}`.",
        f"- Measured by: `{payload.get('measured_by', MEASURED_BY)}`;",
        "  `llmlab tiny eval` re-measures the shipped pair.",
        f"- Machine: {env['cpu']}, {env['logical']} logical CPUs, torch threads {m.get('torch_threads', 'n/a')}"
        f"{load}; Python {env['python']}, torch {env['torch']}, transformers {env['transformers']}; {env['utc']}.",
        "",
    ]


def _architecture_lines(payload: dict) -> list[str]:
    cfg, m, sizes = payload["report"]["config"], payload["metrics"], payload["sizes_bytes"]
    lines = [
        "## Architecture",
        "",
        "| | layers | hidden | heads / KV heads | head_dim | intermediate | vocab | max positions | params | on disk |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, arch, n in (("tiny", cfg["target"], m["params_target"]), ("tiny-draft", cfg["draft"], m["params_draft"])):
        lines.append(f"| `{name}` | {arch['layers']} | {arch['hidden']} | {arch['heads']} / {arch['kv_heads']} | "
                     f"{arch['hidden'] // arch['heads']} | {arch['intermediate']} | {cfg['vocab_size']} | 8192 | "
                     f"{n / 1e6:.2f} M | {sizes[name] / 1e6:.1f} MB |")
    return [*lines, "",
            "RoPE (theta 10000), RMSNorm, SwiGLU, tied input/output embeddings, float32 safetensors.",
            f"Positions past the {cfg['seq_len']}-token training windows work (RoPE) but were never trained on.",
            ""]


def _data_lines(payload: dict) -> list[str]:
    report, env = payload["report"], payload["env"]
    return [
        "## Data",
        "",
        f"- Corpus sha256 (first 16 hex): `{report['corpus_sha256']}` (Python {env['python']}; another version's",
        "  standard library gives another corpus).",
        f"- Train: {report['train_bytes'] / 1e6:.2f} MB of text, {report['train_tokens']:,} tokens; held out (whole",
        f"  documents, 5 % chosen by a hash of their names): {report['heldout_bytes'] / 1e6:.2f} MB, "
        f"{report['heldout_tokens']:,} tokens.",
        f"- Tokenizer: byte-level BPE, vocab {report['config']['vocab_size']}, `<|endoftext|>` (id 0) as bos/eos/pad.",
        "",
    ]


def _training_lines(payload: dict) -> list[str]:
    report = payload["report"]
    cfg = report["config"]
    return [
        "## Training",
        "",
        f"- Seed {cfg['seed']}, windows of {cfg['seq_len']} tokens, batch {cfg['batch_size']}, AdamW (0.9, 0.95), "
        f"weight decay {cfg['weight_decay']}, {_schedule(cfg)}, "
        f"gradient clip {cfg['grad_clip']}, torch threads {cfg['threads'] or 'default'}.",
        f"- `tiny`: {report['target_steps']} steps at peak LR {cfg['target_lr']} in "
        f"{report['target_seconds'] / 60:.1f} min; "
        f"train loss (mean of the last 20 steps) {payload['final_train_loss_target']:.3f}.",
        f"- `tiny-draft`: {report['draft_steps']} steps of distillation (KL(target || draft), "
        f"T = {cfg['distill_temperature']}) at peak LR {cfg['draft_lr']} in {report['draft_seconds'] / 60:.1f} min; "
        f"final KL {payload['final_train_kl_draft']:.3f} nats/token.",
        *_copying_lines(cfg, report),
        *_curriculum_lines(cfg, report),
        *_probe_lines(report),
        f"- Reproduce: `llmlab tiny train --out DIR{_copy_steps_flag(cfg)} --target-steps {report['target_steps']} "
        f"--draft-steps {report['draft_steps']} --threads {cfg['threads'] or 1}` (seed {cfg['seed']}; same Python "
        f"and torch for the same bits).",
        "",
    ]


def _schedule(cfg: dict) -> str:
    """The LR schedule in words; configs from before the WSD schedule name a warm-up fraction instead."""
    floor = f"{int(cfg['min_lr_frac'] * 100)} %"
    if "warmup_steps" not in cfg:
        return f"linear warm-up over the first {cfg.get('warmup_frac', 0):.0%} of the steps, then cosine to {floor}"
    return (f"{cfg['warmup_steps']} steps of linear warm-up, the peak, then cosine to {floor} over the last "
            f"{cfg.get('decay_frac', 1):.0%} of the steps (WSD)")


def _copy_steps_flag(cfg: dict) -> str:
    return f" --copy-steps {cfg['copy_steps']}" if cfg.get("copy_steps") is not None else ""


def _copying_lines(cfg: dict, report: dict) -> list[str]:
    """The copying phase (llmlab/tiny/copying.py), for runs that had one."""
    rec = report.get("copying") or {}
    if not rec.get("steps"):
        return []
    probes = rec["probes"]
    shown = probes[:: max(1, math.ceil(len(probes) / 10))]
    shown += [] if not probes or shown[-1] == probes[-1] else [probes[-1]]
    curve = ", ".join(f"{step}: {share:.2f} ({span} of {window})" for step, window, span, share in shown)
    return [
        f"- Copying phase first: {rec['steps']:,} steps of {cfg['copy_tokens']:,} random-id tokens at LR "
        f"{cfg['copy_lr']} in {rec['seconds'] / 60:.1f} min, windows tiled with repeated pairs, the loss on",
        f"  the second readings, window lengths {', '.join(str(w) for w, _ in cfg['copy_levels'])} unlocked as the "
        f"copy probe passed {cfg['copy_promote']:.0%}; then every {cfg['copy_maintain_every']}th text-phase step "
        f"is such a batch. Probe (step: share of the second reading predicted (span of window)): {curve}.",
    ]


def _probe_lines(report: dict) -> list[str]:
    """The copy probe during training (TrainConfig.probe_every), at most 12 points of it."""
    probes = report.get("target_copy_probe") or []
    if not probes:
        return []
    shown = probes[:: max(1, math.ceil(len(probes) / 12))]
    shown += [] if shown[-1] == probes[-1] else [probes[-1]]
    curve = ", ".join(f"{step}: {share:.2f}" for step, share in shown)
    return [f"- Copy probe during training (the share of a random passage's second reading `tiny` predicts, "
            f"at step): {curve}."]


def _quality_lines(m: dict) -> list[str]:
    a = m["agreement"]
    return [
        "## Held-out quality",
        "",
        f"Next-token cross-entropy on the first {m['eval_tokens']:,} held-out tokens (windows of 256).",
        "",
        "| model | loss (nats/token) | perplexity |",
        "|---|---|---|",
        f"| `tiny` | {m['loss_target']:.3f} | {m['ppl_target']:.1f} |",
        f"| `tiny-draft` | {m['loss_draft']:.3f} | {m['ppl_draft']:.1f} |",
        f"| unigram baseline (train token frequencies) | {m['loss_unigram']:.3f} | {m['ppl_unigram']:.1f} |",
        "",
        f"**Greedy agreement {a['agreement']:.3f}**: along `tiny`'s greedy continuation ({a['new_tokens']} tokens) of "
        f"{a['prompts']} held-out prompts of 32 tokens, the fraction of {a['positions']} positions where",
        "`tiny-draft`'s argmax equals `tiny`'s (the per-token acceptance rate of greedy speculative decoding).",
        f"Target self-consistency (teacher-forced argmax vs its own KV-cached greedy tokens): "
        f"{a['target_self_consistency']:.3f}.",
        "",
    ]


def _decode_lines(payload: dict) -> list[str]:
    m = payload["metrics"]
    if "decode_target" not in m:
        return []
    dt, dd, a = m["decode_target"], m["decode_draft"], m["agreement"]
    return [
        "## Decode cost",
        "",
        f"A plain KV-cached greedy loop (one forward per token, batch 1, 32-token prompt; the step speculative "
        f"decoding repeats, without HF `generate`'s per-token bookkeeping): the median of {dt['new_tokens']} steps, "
        f"the median over {dt['repeats']} repeats",
        "after a warm-up, the two models alternating (min - max of the per-repeat medians):",
        "",
        f"- `tiny`: {dt['median_ms']:.2f} ms/token ({dt['min_ms']:.2f} - {dt['max_ms']:.2f})",
        f"- `tiny-draft`: {dd['median_ms']:.2f} ms/token ({dd['min_ms']:.2f} - {dd['max_ms']:.2f})",
        f"- cost ratio c = {m['c_ratio']:.3f}; with agreement a = {a['agreement']:.2f} and k = 4 drafted tokens, "
        f"Leviathan et al. predict (1 - a^5) / ((1 - a)(4c + 1)) = {m['expected_speedup_k4']:.2f}x.",
        "",
        "Timings depend on the machine and on what else runs on it; re-measure with `llmlab tiny eval`.",
        "",
    ]


def _sample_lines(m: dict) -> list[str]:
    lines = ["## Sample continuations (greedy, 40 tokens)", ""]
    for prompt, outs in m["samples"].items():
        for name in ("tiny", "tiny-draft"):
            lines.append(f"- `{name}` ← {json.dumps(prompt)}: {json.dumps(outs[name])}")
    return lines


def _curriculum_lines(cfg: dict, report: dict) -> list[str]:
    """The copying curriculum and the epochs, for runs that record them (older cards did not)."""
    if "span_share" not in cfg:
        return []
    tokens = report["target_steps"] * cfg["batch_size"] * cfg["seq_len"]
    return [
        f"- Tokens seen by `tiny`: {tokens:,} = {tokens / report['train_tokens']:.1f} epochs of the train split.",
        f"- Copying curriculum: {cfg['span_share']:.0%} of training windows repeat one of their own real-text spans "
        f"({cfg['repeat_min']}-{cfg['repeat_max']} tokens) later in the window, {cfg['random_share']:.0%} carry a span "
        f"of "
        "random token ids twice (the induction-head setup), the rest are plain text. Real corpora teach",
        "  copying through repetition at a scale one CPU thread cannot train on; this states it outright. The",
        "  draft is distilled on the same windows. Held-out numbers are measured on plain held-out text.",
    ]


def _section(title: str, intro: list[str], rows: list[str]) -> list[str]:
    """A card section: its heading, the paragraph saying how it was measured, its rows, a blank line."""
    return [f"## {title}", "", *intro, *rows, ""]


def _goal_lines(m: dict) -> list[str]:
    from llmlab.tiny.evaluate import goal_rows

    rows = goal_rows(m)
    if not rows:
        return []
    intro = ["copy_heldout / copy_random: second-reading accuracy (see Copying); draft_gap: loss_draft - loss_target;",
             "agreement: greedy agreement (above); c_ratio: decode cost ratio (below); loops: loop-check prompts whose",
             "greedy text loops (below); size_mb: both folders on disk; load_seconds: both models and the tokenizer",
             "from disk (`from_pretrained`, after the imports, best of 3).", "",
             "| metric | measured | goal | |", "|---|---|---|---|"]
    lines = []
    for r in rows:
        value = f"{r['value']:.3f}" if isinstance(r["value"], float) else r["value"]
        lines.append(f"| {r['metric']} | {value} | {r['goal']} | {'held' if r['held'] else '**missed**'} |")
    return _section("Goals", intro, lines)


def _copy_lines(m: dict) -> list[str]:
    if "copy" not in m:
        return []
    intro = ["Greedy next-token accuracy on a passage read twice in a row (the second reading is what a model that",
             "copies predicts; the first is ordinary prediction): 16 held-out passages of 64 tokens, and 16",
             "sequences of 64 random token ids (seed 0).", "",
             "| model | held-out: first / second reading | random ids: first / second reading |", "|---|---|---|"]
    lines = []
    for key, name in (("target", "tiny"), ("draft", "tiny-draft")):
        h, r = m["copy"][key], m["copy_random_detail"][key]
        lines.append(f"| `{name}` | {h['first_read']:.1%} / {h['second_read']:.1%} "
                     f"| {r['first_read']:.1%} / {r['second_read']:.1%} |")
    return _section("Copying", intro, lines)


def _loop_lines(m: dict) -> list[str]:
    if "loop_check" not in m:
        return []
    intro = ["`tiny`'s greedy text, 64 new tokens per prompt: a loop is a stretch of max(16, 3p) tokens repeating with",
             "a period p <= 8 tokens.", ""]
    lines = []
    for r in m["loop_check"]:
        verdict = f"loops (period {r['period']})" if r["period"] else "no loop"
        lines.append(f"- {json.dumps(r['prompt'])}: {verdict}: {json.dumps(r['text'])}")
    return _section("Loop check", intro, lines)
