"""The CLI's tool commands: env, models, generate, show, serve, and the tiny group (train, eval).

A command's summary stays on one line: in rich markup mode a line break in it prints in the list of
commands, so a summary longer than a source line is given as help= (joined strings), not a docstring.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from llmlab.cli.app import TOOLS, DeviceOpt, GpuOpt, JsonOpt, ModelOpt, SeedOpt, TablesOpt, _check_tables, app, err, out
from llmlab.cli.card import card_lines
from llmlab.core.device import device_card, resolve_device
from llmlab.core.errors import UsageError
from llmlab.core.models import model_rows
from llmlab.core.specs import bandwidth_spec_GBps, peak_for
from llmlab.core.telemetry import sample
from llmlab.labs import judged, module
from llmlab.tiny.evaluate import goal_rows


@app.command(rich_help_panel=TOOLS, help="The device card (GPU or CPU), the spec sheet's peaks, a telemetry sample, "
                                         "and versions (--json: the same as JSON).")
def env(
    device: DeviceOpt = "auto",
    gpu: GpuOpt = None,
    json_: JsonOpt = False,
    seconds: Annotated[float, typer.Option(help="How long to sample telemetry.", min=0.1, max=60)] = 1.0,
) -> None:
    dev = resolve_device(device, gpu)
    card = device_card(dev)
    peaks = {d: peak_for(dev, d) for d in (("fp32", "tf32", "bf16", "fp16") if dev.is_cuda else ("fp32", "bf16"))}
    spec = {
        "peak_gflops": {d: g for d, (g, _) in peaks.items()},
        "peak_source": next(iter(peaks.values()))[1],
        "bandwidth_GBps": bandwidth_spec_GBps(dev)[0],
    }
    data = {"device": card, "spec": spec, "telemetry": sample(dev, seconds)}
    if json_:
        sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")
        return
    for line in card_lines(data, out.width):
        out.print(line, highlight=False, markup=False)


@app.command("models", rich_help_panel=TOOLS)
def models_(
    device: DeviceOpt = "auto",
    gpu: GpuOpt = None,
    json_: JsonOpt = False,
    dtype: Annotated[str, typer.Option(
        help="Weights dtype for the size and fit columns: bfloat16 | float16 | float32.")] = "bfloat16",
) -> None:
    """The built-in pair and the arch: registry: parameters, KV bytes per token (BF16), whether each fits."""
    dev = resolve_device(device, gpu)
    rows = model_rows(dev, dtype)
    if json_:
        sys.stdout.write(json.dumps({"device": dev.spec, "dtype": dtype, "models": rows}, indent=2) + "\n")
        return
    import pandas as pd  # lazy: pandas costs start-up time (and core.render, core.results import it)

    from llmlab.core.render import table_lines
    from llmlab.core.results import Col

    df = pd.DataFrame([dict(ref=r["ref"], params=f"{r['params'] / 1e9:.2f} B" if r["params"] >= 1e9 else
                            f"{r['params'] / 1e6:.1f} M", layers=r["layers"], heads=f"{r['heads']}/{r['kv_heads']}",
                            head_dim=r["head_dim"], kv_kib=r["kv_bytes_per_token"] / 1024,
                            weights_gib=r["weights_bytes"] / 2**30, fits="yes" if r["fits"] else "NO") for r in rows])
    cols = [Col("ref", "model", "text"), Col("params", "params", "text"), Col("layers", "layers", "int"),
            Col("heads", "heads / kv", "text"), Col("head_dim", "head dim", "int"),
            Col("kv_kib", "KV KiB/token"), Col("weights_gib", "weights GiB", ".2f"), Col("fits", "fits", "text")]
    out.print(f"models: {dtype} weights on {dev.spec}; arch: = random weights, timings only", highlight=False)
    for line in table_lines(df, cols, out.width)[0]:
        out.print(line)
    out.print("[dim]KV bytes/token = 2 (K and V) x layers x kv_heads x head_dim x 2 bytes (BF16)[/]")


@app.command("generate", rich_help_panel=TOOLS)
def generate_(
    prompt: Annotated[str, typer.Argument(help="The text to continue.")],
    model: ModelOpt = "tiny",
    device: DeviceOpt = "auto",
    gpu: GpuOpt = None,
    max_new_tokens: Annotated[int, typer.Option("--max-new-tokens", "-n", min=1, help="Tokens to generate.")] = 64,
    temperature: Annotated[float, typer.Option(
        min=0.0, help="Sampling temperature, as chat tools default to; 0 = greedy (top-p then unused).")] = 0.8,
    top_p: Annotated[float, typer.Option(
        "--top-p", min=0.0, max=1.0,
        help="Sample from the smallest set of tokens holding this much probability (1 = all).")] = 0.95,
    seed: SeedOpt = 0,
    trust_remote_code: Annotated[bool, typer.Option(
        "--trust-remote-code", help="Allow a model's own Python code (only if you trust it).")] = False,
) -> None:
    """Stream a continuation token by token, to see the model you are measuring."""
    from llmlab.core.models import load
    from llmlab.inference.decode import SamplingParams, stream_text  # lazy: torch costs start-up time

    lm = load(model, resolve_device(device, gpu), trust_remote_code=trust_remote_code)
    if lm.tokenizer is None:
        raise UsageError(f"{lm.ref} has random weights and no tokenizer: generate needs a trained model")
    if not prompt:
        raise UsageError("the prompt is empty")
    params = SamplingParams(temperature=temperature, top_p=top_p) if temperature > 0 else SamplingParams()
    mode = (f"sampled: temperature {temperature}, top-p {top_p}, seed {seed}" if temperature > 0
            else "greedy (temperature 0)")
    sys.stdout.write(prompt)
    sys.stdout.flush()
    n, t0 = 0, time.perf_counter()
    for piece in stream_text(lm.model, lm.tokenizer, prompt, max_new_tokens, params, seed):
        sys.stdout.write(piece)
        sys.stdout.flush()
        n += 1
    sys.stdout.write("\n")
    dt = time.perf_counter() - t0
    err.print(f"[dim]{lm.ref}, {mode}: {n} tokens in {dt:.2f} s "
              f"({1000 * dt / max(n, 1):.1f} ms/token, prefill included)[/]")


@app.command("show", rich_help_panel=TOOLS, help="Re-render a saved run and re-judge it with the lab's current "
                                                 "judge (says when the verdicts or the judge changed).")
def show(
    path: Annotated[Path, typer.Argument(
        help="A saved result: results/<lab>/<stamp>-<device>.json.", show_default=False)],
    tables: TablesOpt = "report",
    json_: JsonOpt = False,
) -> None:
    from llmlab.core.render import render  # lazy: pandas costs start-up time
    from llmlab.core.results import LabResult

    _check_tables(tables)
    try:
        result = LabResult.from_json(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise UsageError(f"{path}: cannot read it ({exc.strerror})") from None
    except (ValueError, KeyError, TypeError) as exc:
        raise UsageError(f"{path}: not an llmlab result ({exc})") from None
    try:
        mod = module(result.lab)
    except ModuleNotFoundError:
        raise UsageError(f"{path}: lab '{result.lab}' is not part of this llmlab") from None
    saved = {c.id: c.verdict for c in result.claims}
    result.claims, views, headline = judged(result, mod)
    now = getattr(mod, "JUDGE_VERSION", 0)
    if result.judge_version != now:
        err.print(f"[yellow]judged again with judge v{now}; this file was judged with v{result.judge_version}[/]")
    changed = [f"{c.id}: {saved[c.id]} -> {c.verdict}" for c in result.claims
               if c.id in saved and saved[c.id] != c.verdict]
    for line in changed:
        err.print(f"[yellow]verdict changed since saved: {line}[/]")
    if json_:
        sys.stdout.write(result.to_json() + "\n")
        return
    render(result, out, views=views, headline=headline, tables=tables, saved=path)


@app.command("serve", rich_help_panel=TOOLS, help="An OpenAI-compatible server (/v1/completions, "
                                                  "/v1/chat/completions, /metrics) over llmlab's paged, continuously "
                                                  "batching engine.")
def serve_(
    model: ModelOpt = "tiny",
    host: Annotated[str, typer.Option(
        help="Address to listen on (127.0.0.1: this machine only). The Host header must name it.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=1, max=65535, help="TCP port.")] = 8000,
    device: DeviceOpt = "auto",
    gpu: GpuOpt = None,
    dtype: Annotated[str, typer.Option(
        "--dtype", help="auto | float32 | bfloat16 | float16. auto: bfloat16 on a GPU, float32 on the CPU.")] = "auto",
    max_num_seqs: Annotated[int, typer.Option(
        "--max-num-seqs", min=1, help="Most sequences in one step's batch.")] = 64,
    kv_blocks: Annotated[Optional[int], typer.Option(
        "--kv-blocks", min=1,
        help="KV cache pool, in blocks of 16 tokens. Default: 1024 on the CPU; on CUDA what free memory leaves "
             "after the weights.",
        show_default=False)] = None,
    gpu_memory_utilization: Annotated[float, typer.Option(
        "--gpu-memory-utilization", min=0.05, max=1.0,
        help="CUDA: fraction of the GPU's memory the server may fill (weights, activations, KV pool), "
             "as in vLLM.")] = 0.9,
    max_num_batched_tokens: Annotated[int, typer.Option(
        "--max-num-batched-tokens", min=1, help="Token budget of one step (longer prompts are chunked).")] = 512,
    no_prefix_cache: Annotated[bool, typer.Option("--no-prefix-cache", help="Switch the prefix cache off.")] = False,
    api_key: Annotated[Optional[str], typer.Option(
        "--api-key", envvar="LLMLAB_API_KEY",
        help="Require `Authorization: Bearer KEY` on every route but /health (prefer the environment variable: "
             "a command line is visible to other users).",
        show_default=False)] = None,
) -> None:
    from llmlab.serving.server import serve  # lazy: torch and the web stack cost start-up time

    serve(model, host, port, device, max_num_seqs, kv_blocks, not no_prefix_cache, max_num_batched_tokens,
          log=err.print, gpu=gpu, dtype=dtype, gpu_memory_utilization=gpu_memory_utilization, api_key=api_key)


tiny_app = typer.Typer(help="The built-in model pair (tiny, tiny-draft): train it, measure it.", no_args_is_help=True)
app.add_typer(tiny_app, name="tiny", rich_help_panel=TOOLS)


def _tiny_summary(metrics: dict) -> None:
    a = metrics["agreement"]["agreement"]
    out.print(f"held-out loss: tiny {metrics['loss_target']:.3f}, tiny-draft {metrics['loss_draft']:.3f}, "
              f"unigram {metrics['loss_unigram']:.3f} nats/token (perplexity {metrics['ppl_target']:.1f} / "
              f"{metrics['ppl_draft']:.1f} / {metrics['ppl_unigram']:.1f})")
    out.print(f"greedy agreement: {a:.3f} over {metrics['agreement']['positions']} positions")
    for r in goal_rows(metrics):
        held = "held" if r["held"] else "MISSED"
        out.print(f"goal {r['metric']}: {r['value']:.3f} ({r['goal']}) {held}", highlight=False)
    if "c_ratio" in metrics:
        out.print(f"decode: tiny {metrics['decode_target']['median_ms']:.2f} ms/token, tiny-draft "
                  f"{metrics['decode_draft']['median_ms']:.2f} ms/token, c = {metrics['c_ratio']:.3f}, "
                  f"predicted speed-up at k = 4: {metrics['expected_speedup_k4']:.2f}x")


@tiny_app.command("train")
def tiny_train(
    out_dir: Annotated[Path, typer.Option(
        "--out", help="Folder for tiny/, tiny-draft/, MODEL_CARD.md, metrics.json.")] = Path("tiny-pair"),
    minutes: Annotated[Optional[float], typer.Option(
        min=0.1,
        help="Wall-clock budget for both models (the target gets 80 %): steps are sized from a timed trial step "
             "and re-sized from the real pace every 50 steps until the LR decay starts. Default: the shipped "
             "run's fixed steps.",
        show_default=False)] = None,
    target_steps: Annotated[Optional[int], typer.Option(
        min=1, help="Steps for tiny (default: the shipped run's).", show_default=False)] = None,
    draft_steps: Annotated[Optional[int], typer.Option(
        min=1, help="Distillation steps for tiny-draft (default: the shipped run's).", show_default=False)] = None,
    copy_steps: Annotated[Optional[int], typer.Option(
        min=0, help="Steps of the copying phase on random ids, before text (default: until the copy probe reaches "
                    "its goal; 0 skips it). The model card's reproduce line gives the count of its run.",
        show_default=False)] = None,
    seed: SeedOpt = 0,
    threads: Annotated[Optional[int], typer.Option(
        min=1, help="torch threads (default: torch's).", show_default=False)] = None,
    micro: Annotated[bool, typer.Option("--micro", help="A toy run of seconds (what the tests train).")] = False,
) -> None:
    """Reproduce the built-in pair from scratch: corpus, tokenizer, tiny, then tiny-draft distilled from it."""
    from llmlab.core.results import command_line  # lazy: pandas costs start-up time
    from llmlab.tiny.card import build_pair  # lazy: the trainer loads torch when it runs
    from llmlab.tiny.train import TrainConfig

    base = TrainConfig.micro() if micro else TrainConfig()
    given = dict(target_steps=target_steps, draft_steps=draft_steps, threads=threads, copy_steps=copy_steps)
    cfg = dataclasses.replace(base, seed=seed, minutes=minutes, **{k: v for k, v in given.items() if v is not None})
    progress = Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                        TextColumn("loss {task.fields[loss]}"), TimeElapsedColumn(), TimeRemainingColumn(), console=err)
    tasks: dict[str, int] = {}

    def on_step(phase: str, step: int, total: int, loss: float, copy: float | None = None) -> None:
        if phase not in tasks:
            label = {"copy": "tiny (copying, random ids)", "target": "tiny (cross-entropy)"}.get(
                phase, "tiny-draft (KL to tiny)")
            tasks[phase] = progress.add_task(label, total=total, loss="-")
        progress.update(tasks[phase], completed=step, total=total, loss=f"{loss:.3f}")
        if copy is not None:  # the induction-head probe: say it whether or not the output is a terminal
            progress.console.print(f"{phase} step {step}: copies {copy:.0%} of a random passage read twice "
                                   "(the goal at the end: 80%)", highlight=False)
        if not err.is_terminal and (step % 25 == 0 or step == total):  # a log file (nohup): one line per 25 steps
            now = datetime.now(timezone.utc)
            err.print(f"{now:%H:%M:%S} {phase} step {step}/{total} loss {loss:.3f}", highlight=False)

    err.print("[dim]building the corpus and the tokenizer...[/]")
    with progress:
        report, metrics = build_pair(cfg, out_dir, on_step, command=command_line())
    _tiny_summary(metrics)
    err.print(f"[dim]saved {out_dir}/tiny, {out_dir}/tiny-draft, {out_dir}/MODEL_CARD.md[/]")


@tiny_app.command("eval", help="Re-measure a pair against its goals: copying (held-out and random passages read "
                               "twice), held-out loss, draft gap, greedy agreement, decode cost ratio c, greedy loops, "
                               "size, load time.")
def tiny_eval(
    weights: Annotated[Optional[Path], typer.Option(
        help="A folder with tiny/ and tiny-draft/ (default: the shipped pair).", show_default=False)] = None,
    json_: JsonOpt = False,
    no_timing: Annotated[bool, typer.Option("--no-timing", help="Skip the decode ms/token measurement.")] = False,
    threads: Annotated[Optional[int], typer.Option(
        min=1, help="torch threads (default: torch's).", show_default=False)] = None,
    write_card: Annotated[bool, typer.Option(
        "--write-card",
        help="Rewrite the folder's metrics.json and MODEL_CARD.md with these numbers (keeps its training "
             "report).")] = False,
) -> None:
    import torch  # lazy: torch costs start-up time

    from llmlab.core.results import command_line
    from llmlab.tiny.card import WEIGHTS, measure, remeasure

    if threads:
        torch.set_num_threads(threads)

    folder = weights or WEIGHTS
    if not (folder / "tiny" / "config.json").is_file() or not (folder / "tiny-draft" / "config.json").is_file():
        raise UsageError(f"'{folder}' has no tiny/ and tiny-draft/ model folders")
    metrics = remeasure(folder, command_line()) if write_card else measure(folder, timing=not no_timing)
    if json_:
        sys.stdout.write(json.dumps(metrics, indent=2) + "\n")
    else:
        _tiny_summary(metrics)
