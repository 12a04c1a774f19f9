"""The llmlab command line: one command per lab, generated from its Config, and the tool commands.

`app` (the Typer app, its consoles and the options every lab takes) and `run_lab` (the one path from
a command line to a saved result) are in `cli.app`; the lab commands in `cli.labs`; env, models,
generate, show, serve and tiny in `cli.commands`. `llmlab.main` adds the tools' commands on top.
"""

from llmlab.cli import commands, labs  # noqa: F401  (commands registers the tool commands on app)
from llmlab.cli.app import Common, app, err, main, out, run_lab

labs.register()

__all__ = ["Common", "app", "err", "main", "out", "run_lab"]
