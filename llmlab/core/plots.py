"""matplotlib for the HTML report's figures, loaded on first use."""

from __future__ import annotations


def pyplot():
    """matplotlib.pyplot on the Agg backend (it draws into files, no display needed).

    Imported on the first call, not at start-up: matplotlib costs about half a second to import, and only
    the HTML report draws figures.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
