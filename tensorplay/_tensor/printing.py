# SPDX-License-Identifier: Apache-2.0
"""The text of ``repr(tensor)``, as PyTorch prints it with its default print
options (``torch._tensor_str``): 4 digits after the point, scientific
notation when the values' magnitudes call for it, floats that are all
integers printed ``1.``, more than 1000 elements summarised with ``...``
(3 items at each edge), 80 columns, then ``device='cuda:0'`` and
``dtype=tensorplay.float16`` where PyTorch shows them (a dtype other than
float32, int64 and bool; an empty tensor's dtype unless float32).

It works on the host values, a NumPy array: the CPU tensor's own, a CUDA
tensor's downloaded copy.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from tensorplay import _dtypes as dt

__all__ = ["format_tensor", "PRECISION", "THRESHOLD", "EDGEITEMS", "LINEWIDTH"]

# PyTorch's default print options (torch.set_printoptions(profile="default"))
PRECISION = 4
THRESHOLD = 1000
EDGEITEMS = 3
LINEWIDTH = 80


class _Formatter:
    """PyTorch's _Formatter: one width and one mode for all the values shown."""

    def __init__(self, values: np.ndarray, floating: bool):
        self.floating = floating
        self.int_mode = True
        self.sci_mode = False
        self.max_width = 1
        flat = values.reshape(-1)
        if not floating:
            for v in flat.tolist():
                self.max_width = max(self.max_width, len(f"{v}"))
            return
        finite = flat.astype(np.float64)
        finite = finite[np.isfinite(finite) & (finite != 0)]
        if finite.size == 0:
            return
        magnitudes = np.abs(finite)
        lo, hi = float(magnitudes.min()), float(magnitudes.max())
        vals = finite.tolist()
        self.int_mode = bool(np.all(finite == np.ceil(finite)))
        if self.int_mode:
            # all integers: "1." (the point says float); scientific when they span much
            if hi / lo > 1000.0 or hi > 1.0e8:
                self.sci_mode = True
                self.max_width = max(len(f"{v:.{PRECISION}e}") for v in vals)
            else:
                self.max_width = max(self.max_width, max(len(f"{v:.0f}") + 1 for v in vals))
        elif hi / lo > 1000.0 or hi > 1.0e8 or lo < 1.0e-4:
            self.sci_mode = True
            self.max_width = max(len(f"{v:.{PRECISION}e}") for v in vals)
        else:
            self.max_width = max(self.max_width, max(len(f"{v:.{PRECISION}f}") for v in vals))

    def format(self, value: Any) -> str:
        if self.floating:
            if self.sci_mode:
                text = f"{value:{self.max_width}.{PRECISION}e}"
            elif self.int_mode:
                text = f"{value:.0f}"
                if not (math.isinf(value) or math.isnan(value)):
                    text += "."
            else:
                text = f"{value:.{PRECISION}f}"
        else:
            text = f"{value}"
        return (self.max_width - len(text)) * " " + text


def _summarized(a: np.ndarray) -> np.ndarray:
    """The values a summarised print shows (EDGEITEMS at each edge of each dimension)."""
    if a.ndim == 0:
        return a
    n = a.shape[0]
    if a.ndim == 1:
        return np.concatenate((a[:EDGEITEMS], a[-EDGEITEMS:])) if n > 2 * EDGEITEMS else a
    rows = [*range(EDGEITEMS), *range(n - EDGEITEMS, n)] if n > 2 * EDGEITEMS else range(n)
    return np.stack([_summarized(a[i]) for i in rows])


def _vector(a: np.ndarray, indent: int, summarize: bool, fmt: _Formatter) -> str:
    per_line = max(1, int(math.floor((LINEWIDTH - indent) / (fmt.max_width + 2))))
    if summarize and a.shape[0] > 2 * EDGEITEMS:
        data = ([fmt.format(v) for v in a[:EDGEITEMS].tolist()] + [" ..."]
                + [fmt.format(v) for v in a[-EDGEITEMS:].tolist()])
    else:
        data = [fmt.format(v) for v in a.tolist()]
    lines = [", ".join(data[i:i + per_line]) for i in range(0, len(data), per_line)]
    return "[" + (",\n" + " " * (indent + 1)).join(lines) + "]"


def _body(a: np.ndarray, indent: int, summarize: bool, fmt: _Formatter) -> str:
    if a.ndim == 0:
        return fmt.format(a.item())
    if a.ndim == 1:
        return _vector(a, indent, summarize, fmt)
    n = a.shape[0]
    if summarize and n > 2 * EDGEITEMS:
        slices = ([_body(a[i], indent + 1, summarize, fmt) for i in range(EDGEITEMS)] + ["..."]
                  + [_body(a[i], indent + 1, summarize, fmt) for i in range(n - EDGEITEMS, n)])
    else:
        slices = [_body(a[i], indent + 1, summarize, fmt) for i in range(n)]
    return "[" + ("," + "\n" * (a.ndim - 1) + " " * (indent + 1)).join(slices) + "]"


def _with_suffixes(text: str, suffixes: list[str], indent: int) -> str:
    """PyTorch's _add_suffixes: each suffix after a comma, on a new line when
    the last line would pass LINEWIDTH."""
    parts = [text]
    last_line_len = len(text) - text.rfind("\n") + 1
    for suffix in suffixes:
        if last_line_len + len(suffix) + 2 > LINEWIDTH:
            parts.append(",\n" + " " * indent + suffix)
            last_line_len = indent + len(suffix)
        else:
            parts.append(", " + suffix)
            last_line_len += len(suffix) + 2
    parts.append(")")
    return "".join(parts)


def format_tensor(values: np.ndarray, dtype: dt.dtype, device: str | None = None) -> str:
    """``repr`` of a tensor of ``dtype`` holding ``values`` (its shape), on
    ``device`` (``"cuda:0"``; None for the CPU), as PyTorch prints it."""
    prefix = "tensor("
    indent = len(prefix)
    suffixes = []
    if device is not None:
        suffixes.append(f"device='{device}'")
    if values.size == 0:
        if values.ndim != 1:
            suffixes.append(f"size={tuple(values.shape)}")
        if dtype is not dt.float32:
            suffixes.append(f"dtype={dtype!r}")
        body = "[]"
    else:
        if dtype not in (dt.float32, dt.int64, dt.bool_):
            suffixes.append(f"dtype={dtype!r}")
        a = values
        if dtype in (dt.float16, dt.bfloat16):
            a = a.astype(np.float32)            # as PyTorch, which prints them as float
        summarize = a.size > THRESHOLD
        fmt = _Formatter(_summarized(a) if summarize else a, dtype.is_floating_point)
        body = _body(a, indent, summarize, fmt)
    return _with_suffixes(prefix + body, suffixes, indent)
