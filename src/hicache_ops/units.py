"""Byte counts for people, with the unit system explicit at every call.

SGLang sizes the host pool in decimal GB (--hicache-size, 1e9 bytes); Mooncake segments are sized
in binary units (MiB). Each figure is printed in the units its source uses.
"""

from __future__ import annotations

from typing import Literal

_UNITS = {
    "decimal": (1000, ("B", "KB", "MB", "GB", "TB")),
    "binary": (1024, ("B", "KiB", "MiB", "GiB", "TiB")),
}


def format_bytes(n: float, units: Literal["decimal", "binary"]) -> str:
    """`n` bytes in the largest unit below 1000 (decimal: KB = 1e3 B) or 1024 (binary: KiB = 2**10 B)."""
    step, names = _UNITS[units]
    value = float(n)
    for name in names[:-1]:
        if abs(value) < step:
            return f"{value:.0f} {name}" if name == "B" else f"{value:.2f} {name}"
        value /= step
    return f"{value:.2f} {names[-1]}"
