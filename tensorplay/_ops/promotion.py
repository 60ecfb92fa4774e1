# SPDX-License-Identifier: Apache-2.0
"""Type promotion with PyTorch's rules.

Operands rank in three priorities: tensors with dimensions, zero-dimensional
tensors, then Python scalars (weak types). A lower-priority operand changes
the result only when its category (bool < integer < floating) is higher.
"""

from __future__ import annotations

import numbers

import numpy as np

from tensorplay import _dtypes as dt
from tensorplay._tensor.base import TensorBase as Tensor     # the compiled base: no import of the Tensor API

_CAT = {"b": 0, "u": 1, "i": 1, "f": 2}


def category(d):
    return _CAT[d.kind]


def promote_types(type1, type2):
    """Return the smallest dtype both ``type1`` and ``type2`` cast to safely.

    As ``torch.promote_types``: bool < integers < floating types;
    float16 with bfloat16 gives float32, uint8 with a signed type of its size
    or smaller the next larger signed type.

    Parameters
    ----------
    type1, type2 : dtype or str
        The dtypes (or their names).

    Returns
    -------
    dtype
        The promoted dtype.
    """
    a, b = dt.as_dtype(type1), dt.as_dtype(type2)
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
    """Return the dtype of an elementwise operation's result over ``operands``.

    PyTorch's rules (``torch.result_type``): tensors with dimensions rank
    first, then 0-d tensors, then Python scalars; a lower-ranked operand
    changes the result only when its category (bool < integer < floating) is
    higher, so ``int8 tensor + 1`` stays int8 and ``int8 tensor + 1.5`` is
    float32.

    Parameters
    ----------
    *operands : Tensor, number or dtype
        The operands; a dtype counts as a tensor with dimensions.

    Returns
    -------
    dtype
        The result dtype.

    Raises
    ------
    TypeError
        Without operands, or for an operand that is not a tensor, a real
        number or a dtype.
    """
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
    """Test whether a result of dtype ``from_`` may be written into ``to``.

    This is the rule of in-place operations and ``out=`` (as
    ``torch.can_cast``): the category may not go down, so floating into
    integer and integer into bool are refused; any size within a category is
    allowed.

    Parameters
    ----------
    from_ : dtype or str
        The result's dtype.
    to : dtype or str
        The destination's dtype.

    Returns
    -------
    bool
        True if the cast is allowed.
    """
    return category(dt.as_dtype(from_)) <= category(dt.as_dtype(to))
