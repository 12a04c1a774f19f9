"""The llmlab command line: one thin command per lab, plus `env`, `models`, `generate`, `tiny`.

Each lab command parses its own options into the lab's Config and hands over to `run_lab`,
which resolves the device, runs the lab under telemetry, renders and saves the result.
torch and transformers are imported inside the commands, so `llmlab --help` stays instant.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console

from llmlab.core.errors import MeasurementError, UsageError

app = typer.Typer(
    name="llmlab",
    help="Hands-on, measured labs for LLM inference on your own hardware (a CUDA GPU, or the CPU).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
)

out = Console()  # stdout: tables, charts, claims (or only JSON with --json)
err = Console(stderr=True)  # stderr: progress, notices, errors

LABS = "Labs"
TOOLS = "Tools"
COMMON = "Common options"

# -- options every lab takes (shared aliases, one help panel)
DeviceOpt = Annotated[str, typer.Option("--device", "-d", help="auto | cpu | cuda | cuda:N. auto takes cuda:0 when there is one.", rich_help_panel=COMMON)]
GpuOpt = Annotated[Optional[int], typer.Option("--gpu", help="GPU index: --gpu N is --device cuda:N.", rich_help_panel=COMMON, show_default=False)]
QuickOpt = Annotated[bool, typer.Option("--quick", help="Small sweeps: seconds on a 2-core CPU (what tests and CI run).", rich_help_panel=COMMON)]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print only the JSON result on stdout.", rich_help_panel=COMMON)]
OutOpt = Annotated[Path, typer.Option("--out", help="Folder for results (<out>/<lab>/<stamp>-<device>.json + CSVs).", rich_help_panel=COMMON)]
NoSaveOpt = Annotated[bool, typer.Option("--no-save", help="Do not write results.", rich_help_panel=COMMON)]
SeedOpt = Annotated[int, typer.Option("--seed", help="Seed for torch, random and numpy.", rich_help_panel=COMMON)]
ModelOpt = Annotated[str, typer.Option("--model", "-m", help="tiny | tiny-draft | a Hugging Face id or local path | arch:NAME (random weights: timing only).")]


@dataclasses.dataclass(frozen=True)
class Common:
    device: str = "auto"
    gpu: int | None = None
    quick: bool = False
    json: bool = False
    out: Path = Path("results")
    no_save: bool = False
    seed: int = 0


def run_lab(lab: str, common: Common, **overrides) -> None:
    """Build the Config, run the lab under telemetry, render, save; exit with the contract's code."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from llmlab.core.device import device_card, resolve_device
    from llmlab.core.results import check_writable, command_line, utc_stamp
    from llmlab.core.telemetry import Telemetry

    module = importlib.import_module(f"llmlab.labs.{lab.replace('-', '_')}")
    device = resolve_device(common.device, common.gpu)
    if not common.no_save:
        check_writable(common.out)
    base = module.Config.quick() if common.quick else module.Config()
    fields = {f.name for f in dataclasses.fields(base)}
    given = {k: v for k, v in overrides.items() if v is not None}
    if "seed" in fields:
        given["seed"] = common.seed
    try:
        cfg = dataclasses.replace(base, **given)
    except ValueError as exc:  # Config.__post_init__ validates
        raise UsageError(str(exc)) from None
    _seed(common.seed)
    if common.device in ("auto", "") and common.gpu is None:
        err.print(f"[dim]device: {device.spec} ({device.name}){'' if device.is_cuda else ' — no CUDA GPU found, using the CPU'}[/]")
    started = datetime.now(timezone.utc)
    progress = Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"), TimeElapsedColumn(), console=err, transient=True)
    with Telemetry(device) as tel, progress:
        result = module.run(cfg, device, progress)
    result.env = {
        "command": command_line(),
        "utc": started.isoformat(timespec="seconds"),
        "utc_stamp": utc_stamp(),
        "seed": common.seed,
        "quick": common.quick,
        "device": device_card(device),
        "telemetry": tel.summary(),
        **result.env,
    }
    if common.json:
        sys.stdout.write(result.to_json() + "\n")
    else:
        from llmlab.core.render import render

        render(result, out)
    if not common.no_save:
        path = result.save(common.out, device.slug())
        err.print(f"[dim]saved {path}[/]")
    if result.interrupted:
        raise typer.Exit(130)


def _seed(seed: int) -> None:
    import random

    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


@app.callback()
def _root(
    version: Annotated[bool, typer.Option("--version", help="Print the version and exit.")] = False,
) -> None:
    """Hands-on, measured labs for LLM inference on your own hardware (a CUDA GPU, or the CPU).

    Every lab measures, prints tables, charts and claims with verdicts, and saves its numbers
    under results/. Start with `llmlab env`, then any lab with --quick.
    """
    if version:
        from llmlab import __version__

        out.print(f"llmlab {__version__}")
        raise typer.Exit(0)


# ---------------------------------------------------------------- tools


@app.command(rich_help_panel=TOOLS)
def env(
    device: DeviceOpt = "auto",
    gpu: GpuOpt = None,
    json_: JsonOpt = False,
    seconds: Annotated[float, typer.Option(help="How long to sample telemetry.", min=0.1, max=60)] = 1.0,
) -> None:
    """The device card (GPU or CPU), a telemetry sample, and versions."""
    from llmlab.core.device import device_card, resolve_device
    from llmlab.core.specs import bandwidth_spec_GBps, peak_for
    from llmlab.core.telemetry import sample

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
    from rich.pretty import Pretty

    out.print(Pretty(data, expand_all=True))


# ---------------------------------------------------------------- labs


# ---------------------------------------------------------------- entry point


def main() -> None:
    """Run the app; errors become one line on stderr with the contract's exit code."""
    try:
        rc = app(standalone_mode=False)
    except (UsageError, MeasurementError) as exc:
        err.print(f"[bold red]error:[/] {exc}", highlight=False, soft_wrap=True)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        err.print("[yellow]interrupted[/]")
        sys.exit(130)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except Exception as exc:
        if hasattr(exc, "format_message") and hasattr(exc, "exit_code"):  # Click usage errors
            err.print(f"[bold red]error:[/] {exc.format_message()}", highlight=False, soft_wrap=True)
            sys.exit(exc.exit_code)
        if type(exc).__name__ == "Abort":
            sys.exit(130)
        raise
    sys.exit(rc if isinstance(rc, int) else 0)


if __name__ == "__main__":
    main()
