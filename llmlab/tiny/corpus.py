"""The built-in pair's corpus: text that every Python install carries, built deterministically.

Three parts, in a fixed order (sorted names), so the same Python version always yields the same bytes:
- `pydoc_data.topics`: the English help topics of the language reference (what `help("if")` shows);
- the docstrings of the standard library, read with `ast` (no import: no side effects, no platform
  differences between importable modules);
- a slice of standard-library source: code is very predictable, which helps a small draft agree
  with its target (a speculative-decoding draft is only as useful as its agreement).

Documents are split into train / held-out by a hash of their name, so the held-out slice is whole
documents the models never saw, and stays the same when the corpus grows.

References:
- https://docs.python.org/3/library/ast.html#ast.get_docstring
- https://docs.python.org/3/library/pydoc.html (pydoc_data.topics)
"""

from __future__ import annotations

import ast
import hashlib
import sysconfig
from dataclasses import dataclass
from pathlib import Path

EOT = "<|endoftext|>"  # the document separator, also the tokenizer's special end-of-text token

# Folders of the standard library left out: tests are huge and repetitive, the rest is vendored
# or platform-specific code, not the library's own English.
_SKIP_DIRS = {"test", "tests", "idle_test", "site-packages", "dist-packages", "lib2to3", "ensurepip",
              "__pycache__", "turtledemo", "pydoc_data", "encodings", "config-3"}


@dataclass(frozen=True)
class Corpus:
    train: list[str]  # documents, each a string without the EOT separator
    heldout: list[str]

    def train_text(self) -> str:
        return EOT.join(self.train)

    def heldout_text(self) -> str:
        return EOT.join(self.heldout)

    def sha256(self) -> str:
        """A fingerprint of the exact text, recorded in the model card."""
        h = hashlib.sha256()
        for part in (self.train_text(), "\0", self.heldout_text()):
            h.update(part.encode("utf-8"))
        return h.hexdigest()[:16]


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def stdlib_files() -> list[Path]:
    """The standard library's .py files, sorted by relative path."""
    root = stdlib_root()
    files = [p for p in root.rglob("*.py") if not (_SKIP_DIRS & set(p.relative_to(root).parts[:-1]))]
    return sorted(files, key=lambda p: p.relative_to(root).as_posix())


def topic_documents() -> list[tuple[str, str]]:
    from pydoc_data.topics import topics

    return [(f"topic:{k}", topics[k].strip()) for k in sorted(topics)]


def docstring_documents(files: list[Path], keep=lambda name: True) -> list[tuple[str, str]]:
    """One document per module: its docstrings (module, classes, functions) in source order."""
    docs = []
    root = stdlib_root()
    for path in files:
        if not keep(f"doc:{path.relative_to(root).as_posix()}"):
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue  # a few stdlib files are templates or use another encoding: skip them
        parts = []
        for node in [tree, *ast.walk(tree)]:
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node, clean=True)
                if doc and len(doc) >= 40:  # one-liners like "Return x." teach little
                    parts.append(doc if isinstance(node, ast.Module) else f"{node.name}: {doc}")
        if parts:
            docs.append((f"doc:{path.relative_to(root).as_posix()}", "\n\n".join(dict.fromkeys(parts))))
    return docs


def source_documents(files: list[Path], max_bytes: int, keep=lambda name: True) -> list[tuple[str, str]]:
    """Source of the smallest-first modules until max_bytes: many whole files beat a few big ones.
    keep: which of the chosen documents to return (the choice itself never depends on it)."""
    docs, total = [], 0
    root = stdlib_root()
    for path in sorted(files, key=lambda p: (p.stat().st_size, p.relative_to(root).as_posix())):
        try:
            text = path.read_text(encoding="utf-8").strip()
        except (UnicodeDecodeError, ValueError):
            continue
        if len(text) < 200 or EOT in text:  # stubs teach little; EOT would forge a document boundary
            continue
        if total + len(text) > max_bytes:
            break
        total += len(text)
        name = f"src:{path.relative_to(root).as_posix()}"
        if keep(name):
            docs.append((name, text))
    return sorted(docs)


def heldout_of(name: str, fraction: float) -> bool:
    """Deterministic split by document name (not Python's salted hash())."""
    digest = hashlib.sha256(name.encode()).digest()
    return int.from_bytes(digest[:4], "big") / 2**32 < fraction


def build_corpus(heldout_fraction: float = 0.05, source_bytes: int = 4_000_000, heldout_only: bool = False) -> Corpus:
    """Topics + docstrings + source; 5 % of documents held out (a few hundred kB: enough for a
    stable loss estimate, small enough that evaluation takes seconds). 4 MB of source beside the
    ~2 MB of English widens the corpus to ~1.7 M tokens, so a run of an hour sees it several times
    (more epochs of a narrow corpus would overfit; source is what every install carries most of).
    heldout_only: read only the held-out documents (fast; `train` is then empty)."""
    files = stdlib_files()
    keep = (lambda name: heldout_of(name, heldout_fraction)) if heldout_only else (lambda name: True)
    docs = ([d for d in topic_documents() if keep(d[0])] + docstring_documents(files, keep)
            + source_documents(files, source_bytes, keep))
    train, held = [], []
    for name, text in docs:
        (held if heldout_of(name, heldout_fraction) else train).append(text.replace(EOT, ""))
    return Corpus(train=train, heldout=held)
