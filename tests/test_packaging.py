"""Packaging and shipped files: what an install and a reader of the model card see (an SPDX license,
the runtime dependencies the code imports, no path of the training machine)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
tomllib = pytest.importorskip("tomllib")  # Python 3.11+; the checks are about the file, not the interpreter


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_pyproject_license_is_an_spdx_string():
    p = _pyproject()
    assert p["project"]["license"] == "MIT"  # the table form prints a deprecation box on every install
    req = next(r for r in p["build-system"]["requires"] if r.startswith("setuptools"))
    assert int(re.search(r">=(\d+)", req).group(1)) >= 77  # the first setuptools that reads the SPDX form


def test_pyproject_runtime_deps_cover_runtime_imports_of_scipy():
    deps = {re.split(r"[<>=!~ ;\[]", d)[0].lower() for d in _pyproject()["project"]["dependencies"]}
    importers = [p.relative_to(ROOT) for p in (ROOT / "llmlab").rglob("*.py")
                 if re.search(r"^\s*(from|import) scipy", p.read_text(), re.M)]
    assert importers, "nothing imports scipy any more: drop it from the dependencies"
    assert "scipy" in deps, f"{importers} import scipy at run time but it is not a runtime dependency"


_ABS = re.compile(r"(?<![\w.<])(?:/(?:tmp|home|work|root|Users|mnt|scratch|var)/|~/|[A-Za-z]:\\)")


@pytest.mark.parametrize("name", ["MODEL_CARD.md", "metrics.json"])
def test_model_card_names_no_path_of_the_training_machine(name):
    text = (ROOT / "llmlab" / "tiny" / "weights" / name).read_text()
    assert not _ABS.search(text), _ABS.search(text).group(0)


def test_card_writer_strips_absolute_paths_from_the_command():
    from llmlab.tiny.card import public_command

    assert (public_command("train_pair(...) in /tmp/real, then copied here")
            == "train_pair(...) in <dir>, then copied here")
    assert (public_command("llmlab tiny train --out ~/w/weights --threads 1")
            == "llmlab tiny train --out <dir> --threads 1")
    assert public_command("HF_HUB_OFFLINE=1 llmlab tiny eval --json") == "HF_HUB_OFFLINE=1 llmlab tiny eval --json"
