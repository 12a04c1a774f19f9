"""Input-grounded prompts for prompt-lookup decoding, built deterministically from the standard library.

Prompt lookup drafts the text that followed the last few tokens earlier in the context, so it pays
where the output re-uses the input. Three kinds of prompt, each real text every Python install carries
(the same Python version gives the same bytes):
- "quote": a stdlib function's source, then its first lines again under a "quoted again" comment: a
  model that copies continues the quote;
- "edit": a stdlib function's source, then its first line with the function renamed: a model that
  copies rewrites the function with that one change;
- "open" (the control) is not here: the lab uses held-out text of the model's corpus, where lookup
  has little to find unless the model repeats itself.

References:
- Saxena 2023, "Prompt Lookup Decoding" (github.com/apoorvumang/prompt-lookup-decoding): the
  summarise / edit / chat-over-documents cases where outputs copy their inputs.
- https://docs.python.org/3/library/inspect.html#inspect.getsource
"""

from __future__ import annotations

import importlib
import inspect

# Small, stable stdlib functions (present since Python 3.8), of pure-Python modules that are not frozen
# into the interpreter (3.11 freezes os, posixpath, ...: no source to read): 10-40 lines each.
FUNCTIONS = ("textwrap.dedent", "shutil.copyfileobj", "string.capwords", "fnmatch.filter",
             "base64.b64encode", "json.dump", "textwrap.indent", "shlex.quote")
MAX_CHARS = 1200  # a passage of about 300-400 tokens: the prompt, not the context, is what lookup searches
QUOTE_LINES = 2  # lines of the passage repeated to start the quote

KINDS = ("quote", "edit")


def function_source(dotted: str, max_chars: int = MAX_CHARS) -> str:
    """The source of a stdlib function, cut at a line boundary to at most max_chars."""
    mod, _, name = dotted.rpartition(".")
    src = inspect.getsource(getattr(importlib.import_module(mod), name))
    if len(src) <= max_chars:
        return src.rstrip("\n")
    return src[: src.rfind("\n", 0, max_chars)]


def quote_prompt(dotted: str) -> str:
    """The passage, then its first QUOTE_LINES lines again: continuing means quoting the rest."""
    src = function_source(dotted)
    head = "\n".join(src.splitlines()[:QUOTE_LINES])
    return f"{src}\n\n\n# {dotted}, quoted again:\n{head}\n"


def edit_prompt(dotted: str) -> str:
    """The function, then its first line with the function renamed: the rewrite is the function again."""
    src = function_source(dotted)
    name = dotted.rpartition(".")[2]
    new = f"{name}_v2"
    first = src.splitlines()[0].replace(f"def {name}(", f"def {new}(", 1)
    return f"{src}\n\n\n# The same function, renamed to {new}:\n{first}\n"


def prompts(kind: str, n: int) -> list[str]:
    """n prompt texts of one kind, over the first n functions of FUNCTIONS."""
    if kind not in KINDS:
        raise ValueError(f"workload kind must be one of {KINDS}, got {kind!r}")
    if not 1 <= n <= len(FUNCTIONS):
        raise ValueError(f"1..{len(FUNCTIONS)} prompts per workload, got {n}")
    make = quote_prompt if kind == "quote" else edit_prompt
    out = []
    for f in FUNCTIONS:
        try:
            out.append(make(f))
        except (OSError, TypeError):  # an install without .py sources: skip, say so if too few are left
            continue
        if len(out) == n:
            return out
    raise ValueError(f"only {len(out)} of the standard library's functions have source here, {n} asked")
