"""Sizes in the words every view uses ("1.1 GB", "63 MB"): decimal units, one decimal. No I/O."""

from __future__ import annotations


def human_bytes(n: float) -> str:
    """``n`` bytes as "812 B", "63.0 MB", "1.1 GB" (powers of 1000)."""
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


__all__ = ["human_bytes"]
