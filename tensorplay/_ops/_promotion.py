# SPDX-License-Identifier: Apache-2.0
"""Type promotion with PyTorch's rules.

Operands rank in three priorities: tensors with dimensions, zero-dimensional
tensors, then Python scalars (weak types). A lower-priority operand changes
the result only when its category (bool < integer < floating) is higher.
"""

from __future__ import annotations

import numbers

import numpy as np

from .. import _dtypes as dt

_CAT = {"b": 0, "u": 1, "i": 1, "f": 2}


def category(d):
    return _CAT[d.kind]


def promote_types(a, b):
    """The smallest dtype both ``a`` and ``b`` cast to safely (torch.promote_types)."""
    a, b = dt.as_dtype(a), dt.as_dtype(b)
    if a is b:
        return a
    if a.kind == "b":
        return b
    if b.kind == "b":
        return a
    if a.kind == "f" or b.kind == "f":
        if a.kind != "f":
            return b
        if b.kind != "f":
            return a
        if {a, b} == {dt.float16, dt.bfloat16}:
            return dt.float32
        return a if a.itemsize >= b.itemsize else b
    # both integers
    if a.kind == b.kind:                       # both signed (uint8 is the only unsigned)
        return a if a.itemsize >= b.itemsize else b
    signed, unsigned = (a, b) if a.kind == "i" else (b, a)
    if signed.itemsize > unsigned.itemsize:
        return signed
    return {1: dt.int16, 2: dt.int32, 4: dt.int64, 8: dt.int64}[unsigned.itemsize]


def _scalar_dtype(x):
    if isinstance(x, (bool, np.bool_)):
        return dt.bool_
    if isinstance(x, numbers.Integral):
        return dt.int64
    if isinstance(x, numbers.Real):
        return dt.default_float
    raise TypeError(f"unsupported operand {x!r} ({type(x).__name__}); expected a tensor or a real number")


def _combine(higher, lower):
    if higher is None:
        return lower
    if lower is None:
        return higher
    if higher.kind == "f":
        return higher
    if higher.kind == "b" or lower.kind == "f":
        return promote_types(higher, lower)
    return higher


def result_type(*operands):
    """The dtype of an elementwise result over ``operands`` (tensors, scalars
    or dtypes), as torch.result_type."""
    from .._tensor_api import Tensor
    dim_r = zero_r = wrapped_r = None
    for x in operands:
        if isinstance(x, Tensor):
            d = x.dtype
            if x.ndim:
                dim_r = d if dim_r is None else promote_types(dim_r, d)
            else:
                zero_r = d if zero_r is None else promote_types(zero_r, d)
        elif isinstance(x, dt.dtype):
            dim_r = x if dim_r is None else promote_types(dim_r, x)
        else:
            if isinstance(x, np.generic) and not isinstance(x, (np.bool_,)):
                x = x.item()
            d = _scalar_dtype(x)
            wrapped_r = d if wrapped_r is None else promote_types(wrapped_r, d)
    r = _combine(dim_r, _combine(zero_r, wrapped_r))
    if r is None:
        raise TypeError("result_type needs at least one operand")
    return r


def can_cast(from_, to):
    """True when ``from_`` may be written into ``to`` by an in-place op or ``out=``
    (no lowering of category: float -> int and int -> bool are refused)."""
    return category(dt.as_dtype(from_)) <= category(dt.as_dtype(to))
