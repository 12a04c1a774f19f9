"""Units as a person reads them, for every printed size (the env card, the HTML report): light, no imports."""

from __future__ import annotations


def human_bytes(n: float) -> str:
    """1536 -> '1.5 KiB', 25276071936 -> '23.5 GiB' (binary units, as caches and memory are sized)."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" or n == int(n) else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"  # unreachable: the loop returns at TiB
