# SPDX-License-Identifier: Apache-2.0
"""What the side-by-side benchmark scripts need before they start."""

from __future__ import annotations

from typing import Any

import tensorplay as tp


def gpu_and_torch(why_torch: str) -> tuple[Any, int | None]:
    """(torch, None) when a CUDA GPU and PyTorch are here; else (None, exit
    code) after saying what is missing: 0 without a GPU (nothing to measure
    on this machine), 1 without PyTorch (``why_torch`` says why it is needed)."""
    if not tp.cuda.is_available():
        print(f"no GPU: {tp.cuda.unavailable_reason()}")
        return None, 0
    try:
        import torch
    except ImportError:
        print(f"PyTorch is needed: {why_torch}")
        return None, 1
    return torch, None
