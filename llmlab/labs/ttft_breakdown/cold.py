"""The cold start: a fresh process loads the model and serves one request, its weights read from disk.

`ColdWeights` makes the weight files cold (dropped from the page cache, or copied fresh where another
process maps them) and measures the disk's and the link's rates; `cold_start` runs the fresh
processes (pipeline.cold_start) and turns their stamps into one row per step.

torch is imported inside _upload_gbps: `llmlab --help` imports this package (for its Config).
"""

from __future__ import annotations

import math
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from llmlab.core import disk
from llmlab.core.device import Device
from llmlab.core.models import classify
from llmlab.core.render import track
from llmlab.core.results import LabResult
from llmlab.labs.ttft_breakdown import pipeline
from llmlab.labs.ttft_breakdown.config import Config
from llmlab.labs.ttft_breakdown.pipeline import QUESTIONS
from llmlab.loadgen.metrics import named_stats

COLD_RESIDENT_MAX = 0.05  # a cold read finds at most 5% of the weights' pages still in the page cache
COPY_MAX_BYTES = 8 << 30  # copy weights fresh (when the originals cannot be dropped) only up to 8 GiB
DISK_PROBE_BYTES = 2 << 30  # the disk's read rate from at most 2 GiB of the weights
NAPKIN_MODEL_PARAMS = 70e9  # the "90-second" cold start of a 70B model, from this machine's disk and link

COLD_STEPS = {  # stamp -> what happened since the previous one, in the order they run
    "start": "interpreter start", "import_torch": "import torch", "import_transformers": "import transformers",
    "import_llmlab": "import llmlab + model classes", "device_init": "device init (CUDA context)",
    "load_tokenizer": "load tokenizer", "read_weights": "read weights + build model",
    "to_device": "move weights to device", "first_token": "first request (cold)",
}


def cold_start(cfg: Config, device: Device, threads: int, progress, res: LabResult) -> list[dict]:
    """`cfg.cold_starts` fresh processes, their weights cold: one row per step (median, min, max ms), then
    the totals against the same request warm; the disk and link rates go into the `cold_read` table."""
    cold = ColdWeights.prepare(cfg.model)
    read = cold.rows(device)
    res.add_table("cold_read", read)
    val = {r["item"]: r["value"] for r in read}
    gbps = val.get("disk_read")
    runs = []
    for _ in track(progress, range(cfg.cold_starts), "cold starts (fresh processes)"):
        cold.drop()  # each fresh process reads its weights from disk, not from the page cache
        runs.append(pipeline.cold_start(cold.ref, device.spec, QUESTIONS[0], cfg.new_tokens, 3, threads))
    cold.cleanup()
    wb = runs[0]["weight_bytes"]
    warm = [w["ttft_ms"] for r in runs for w in r["warm"]]
    warm_prefill = float(np.median([w["prefill_ms"] for r in runs for w in r["warm"]]))
    upload = val.get("napkin_70b_upload")
    expected = {"read_weights": f"{wb / 1e6:.0f} MB at {gbps:.2f} GB/s = {wb / gbps / 1e6:.0f} ms" if gbps else "",
                "first_token": f"warm TTFT {float(np.median(warm)):.1f} ms",
                "to_device": f"70B: {upload:,.0f} s at the upload rate" if upload else "0 on the CPU (no copy)",
                "device_init": "the CUDA context, once" if device.is_cuda else "0 on the CPU",
                # the measured small model beside the napkin of a big one, from this disk
                "spawn_to_first_token": f"70B (BF16) read: {val['napkin_70b_read']:,.0f} s" if gbps else ""}
    rows, steps = [], list(COLD_STEPS)
    for i, step in enumerate(steps):  # each step lasts from the previous stamp (the spawn for the first) to its own
        ms = [(r["stamps"][step] - (r["stamps"][steps[i - 1]] if i else r["spawn_ns"])) / 1e6 for r in runs]
        rows.append({"step": step, "phase": COLD_STEPS[step], **_step_ms(ms), "expected": expected.get(step, "")})
    totals = {
        "spawn_to_first_token": ("spawn -> first token",
                                 [(r["stamps"]["first_token"] - r["spawn_ns"]) / 1e6 for r in runs]),
        "warm_ttft": ("the same request, warm", warm),
        "spawn_to_exit": ("spawn -> process exit", [(r["exit_ns"] - r["spawn_ns"]) / 1e6 for r in runs]),
        "first_forward_extra": ("cold - warm prefill", [r["cold"]["prefill_ms"] - warm_prefill for r in runs]),
    }
    rows += [{"step": k, "phase": label, **_step_ms(v), "expected": expected.get(k, "")}
             for k, (label, v) in totals.items()]
    return rows


@dataclass
class ColdWeights:
    """The model's weight files made cold: dropped from the page cache, or copied fresh where another
    process maps the originals (its pages cannot be dropped), then checked with mincore."""

    ref: str  # what the cold-start child loads: the model, or the fresh copy's folder
    files: list[Path]
    source: str
    tmp: Path | None = None

    @classmethod
    def prepare(cls, model: str) -> ColdWeights:
        kind, loc = classify(model)
        files = _weight_files(loc) if kind in ("builtin", "path") else []
        cold = cls(model, files, "the model's own files")
        if files and cold.drop() > COLD_RESIDENT_MAX and sum(f.stat().st_size for f in files) <= COPY_MAX_BYTES:
            tmp = Path(tempfile.mkdtemp(prefix="llmlab-cold-"))
            shutil.copytree(loc, tmp / "model")
            # another process maps the originals, so their pages cannot be dropped: a copy can be
            cold = cls(str(tmp / "model"), _weight_files(str(tmp / "model")), "fresh copy (originals mapped)", tmp)
        return cold

    def drop(self) -> float:
        """Drop the files from the page cache; the share still resident afterwards (1.0 when unknown)."""
        if not self.files or not disk.drop_page_cache(self.files):
            return 1.0
        left = disk.resident_fraction(self.files)
        return 1.0 if left is None else left

    def rows(self, device: Device) -> list[dict]:
        """The disk's cold read rate, the link's upload rate, and the napkin of a 70B model's cold start."""
        if not self.files:
            return [{"item": "weight_files", "what": "weight files", "value": math.nan, "unit": "",
                     "how": "none (arch: random weights)"}]
        size = sum(f.stat().st_size for f in self.files)
        left = self.drop()
        n, sec = disk.timed_read(self.files, DISK_PROBE_BYTES)
        gbps = n / sec / 1e9
        link = _upload_gbps(device)
        big = NAPKIN_MODEL_PARAMS * 2  # BF16
        rows = [("weights", "weights", size / 1e6, "MB", self.source),
                ("resident_after_drop", "cached after drop", 100 * left, "%", "mincore after fadvise DONTNEED"),
                ("disk_read", "disk read, cold", gbps, "GB/s", f"{n / 1e6:.0f} MB in 16 MiB reads"),
                ("upload", "upload to device", link or math.nan, "GB/s",
                 "pinned, 256 MiB" if link else "none: the CPU computes from RAM"),
                ("napkin_70b_read", "70B: read weights", big / gbps / 1e9, "s",
                 f"{big / 1e9:.0f} GB (BF16) / disk rate")]
        if link:
            rows.append(("napkin_70b_upload", "70B: upload", big / link / 1e9, "s",
                         f"{big / 1e9:.0f} GB / upload rate"))
        return [dict(zip(("item", "what", "value", "unit", "how"), r, strict=True)) for r in rows]

    def cleanup(self) -> None:
        if self.tmp is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)


def _weight_files(loc: str) -> list[Path]:
    return sorted(p for p in Path(loc).iterdir() if p.suffix in (".safetensors", ".bin"))


def _upload_gbps(device: Device) -> float | None:
    """Best of 3 pinned 256 MiB host-to-device copies, in GB/s; None on the CPU."""
    if not device.is_cuda:
        return None
    import torch

    host = torch.empty(256 << 20, dtype=torch.uint8, pin_memory=True)
    best = math.inf
    for _ in range(3):
        device.synchronize()
        t0 = time.perf_counter()
        host.to(device.torch, non_blocking=True)
        device.synchronize()
        best = min(best, time.perf_counter() - t0)
    return host.numel() / best / 1e9


def _step_ms(ms: list[float]) -> dict:
    """median, min and max of a step's durations (ms) over the runs, and how many runs."""
    return {k if k == "n" else f"{k}_ms": v for k, v in named_stats(ms, ("median", "min", "max", "n")).items()}
