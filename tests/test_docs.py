"""What the README and the lab sheets cite exists: every claim id and every result file.

A claim id is `<lab module>.<name>` in backticks (`roofline.decode_b1_compute_share`); the known ids
are those the newest reference run of each lab carries, re-judged with the current judge (the same
rows as the README's claims table). A result path is anything under `results/`; a path with `*` must
match at least one file, a path with `<...>` is a pattern in prose and is not checked.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from llmlab.tools import readme

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "labs").glob("*.md"))]
LAB_MODULES = ("tokens", "train_vs_infer", "five_steps", "prefill_decode", "gpu_parallelism", "roofline",
               "kvcache_growth", "samplers", "ttft_breakdown", "speculative", "serving", "quantization",
               "tensor_parallel")
_ID = re.compile(r"`((?:" + "|".join(LAB_MODULES) + r")\.[a-z][a-z0-9_]*)`")
_PATH = re.compile(r"results/[A-Za-z0-9_.*<>/-]*[A-Za-z0-9_*>/]")
_FILE_SUFFIXES = ("py", "md", "json", "csv", "txt", "html")


def _known_ids() -> set[str]:
    """Ids the reference runs carry, and ids written out whole in the labs' code (a claim only some runs make,
    such as ttft --endpoint's, has no committed reference run)."""
    ran = {c.id for run in readme.newest_runs(ROOT / readme.REFERENCE) for c in run.claims if getattr(c, "id", "")}
    code = "\n".join(p.read_text(encoding="utf-8") for p in (ROOT / "llmlab" / "labs").rglob("*.py"))
    quoted = re.compile(r"[\"']((?:" + "|".join(LAB_MODULES) + r")\.[a-z][a-z0-9_]*)[\"']")
    return ran | {m.group(1) for m in quoted.finditer(code)}


def _cited(pattern: re.Pattern) -> list[tuple[str, str]]:
    return [(doc.relative_to(ROOT).as_posix(), m.group(1) if m.groups() else m.group(0))
            for doc in DOCS for m in pattern.finditer(doc.read_text(encoding="utf-8"))]


@pytest.mark.parametrize("doc", [d.relative_to(ROOT).as_posix() for d in DOCS])
def test_every_cited_claim_id_exists(doc):
    known = _known_ids()
    cited = [cid for d, cid in _cited(_ID) if d == doc and cid.rsplit(".", 1)[1] not in _FILE_SUFFIXES]
    missing = sorted(set(cited) - known)
    assert not missing, f"{doc} cites claim ids no reference run has: {missing}"


@pytest.mark.parametrize("doc", [d.relative_to(ROOT).as_posix() for d in DOCS])
def test_every_cited_result_file_exists(doc):
    missing = []
    for d, path in _cited(_PATH):
        if d != doc or "<" in path:
            continue
        hits = list(ROOT.glob(path.rstrip("/"))) if "*" in path else [ROOT / path] if (ROOT / path).exists() else []
        if not hits:
            missing.append(path)
    assert not missing, f"{doc} cites result files that are not in the repository: {sorted(set(missing))}"


def test_the_id_pattern_finds_ids_and_skips_module_files():
    text = "see `roofline.decode_b1_compute_share` and `speculative.py`, not `core.results`"
    found = [m.group(1) for m in _ID.finditer(text)]
    assert found == ["roofline.decode_b1_compute_share", "speculative.py"]  # the .py one is dropped by suffix


def test_a_users_runs_never_land_among_the_reference_runs():
    """A lab saves under --out (default results/) as <out>/<lab>/...; the README and tests read only the reference
    runs, which no default run writes, and git ignores a user's runs."""
    from llmlab import cli

    default_out = Path(cli.Common.out)
    user_run = (ROOT / default_out / "speculative").resolve()
    reference = (ROOT / readme.REFERENCE).resolve()
    assert reference not in user_run.parents and user_run != reference
    def ignored(path: str) -> int:
        return subprocess.run(["git", "check-ignore", "-q", path], cwd=ROOT).returncode

    if ignored("results/speculative/x.json") == 128:
        pytest.skip("not a git checkout")
    assert ignored("results/speculative/x.json") == 0 and ignored("results/report.html") == 0
    assert ignored("results/reference/speculative/x.json") == 1
