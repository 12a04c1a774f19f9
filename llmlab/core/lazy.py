"""Lazy attributes of a package: a lab package's `__init__` names its API without importing torch.

`llmlab --help` imports every lab's `config` module, and Python runs the package's `__init__` first:
an `__init__` that imported the lab's parts would load torch (seconds) for a help screen. The
package binds its Config eagerly and its other names through `lazy(__name__, {...})`, which imports
the submodule on first use (PEP 562), so `llmlab.labs.tokens.run` still works as before.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable


def lazy(package: str, names: dict[str, str]) -> Callable[[str], object]:
    """A module `__getattr__` for `package`: `names` maps an attribute to the submodule that defines it."""

    def __getattr__(attr: str) -> object:
        sub = names.get(attr)
        if sub is None:
            raise AttributeError(f"module {package!r} has no attribute {attr!r}")
        value = getattr(importlib.import_module(f"{package}.{sub}"), attr)
        setattr(sys.modules[package], attr, value)  # later lookups skip __getattr__
        return value

    return __getattr__

