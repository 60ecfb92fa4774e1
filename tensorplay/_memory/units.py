# SPDX-License-Identifier: Apache-2.0
"""Byte counts for people: ``format_bytes``, the one formatter of the
allocator's messages, the memory summary and ``show_config``."""

from __future__ import annotations


def format_bytes(n: float, digits: int = 2) -> str:
    """Return ``n`` bytes in the largest binary unit below it, up to GiB.

    Whole bytes below 1 KiB (``"512 B"``), else ``digits`` decimals
    (``"1.50 MiB"``, ``"139.8 GiB"`` with ``digits=1``).
    """
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(size) < 1024 or unit == "GiB":
            break
        size /= 1024
    return f"{size:.0f} B" if unit == "B" else f"{size:.{digits}f} {unit}"
