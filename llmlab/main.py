"""The `llmlab` entry point: the CLI's app with the tools' commands registered on it.

The CLI (labs, env, models, serve, tiny) sits below the tools (report, gpu-check), which run labs
through it; this module, above both, is the only one that imports the two.
"""

from llmlab.cli import app, main
from llmlab.tools import commands  # noqa: F401  (registers `llmlab report` on app)

__all__ = ["app", "main"]

if __name__ == "__main__":
    main()
