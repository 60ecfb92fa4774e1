# SPDX-License-Identifier: Apache-2.0
"""The argument helpers of the tensor core and the ops: sizes, dtypes,
devices and dimensions as the functions take them, broadcast shapes and
strides, the bytes a CUDA tensor spans, and host data as NumPy arrays.

Nothing here makes a tensor, so the Tensor class (``tensor``) and every
layer above can use these."""

from __future__ import annotations

import math
import numbers

import ml_dtypes
import numpy as np

from tensorplay import _dtypes as dt
from tensorplay._device import as_device
from tensorplay._driver.context import device_index as cuda_device_index
from tensorplay._tensor.base import MAX_DIMS, TensorBase

__all__ = ["parse_size", "contiguous_strides", "resolve_device", "resolve_dtype", "normalize_dim", "broadcast_shape",
           "broadcast_strides", "byte_span", "overlaps", "integer_range", "largest_finite", "value_fits",
           "check_value", "cast_into", "cast_array", "numpy_data"]


def parse_size(size):
    """empty(2, 3), empty((2, 3)) and empty([2, 3]) all mean shape (2, 3)."""
    if len(size) == 1 and not isinstance(size[0], numbers.Integral):
        size = size[0]
        if isinstance(size, (str, bytes)) or not hasattr(size, "__iter__"):
            raise TypeError(f"size must be ints or a sequence of ints, got {type(size).__name__}")
        size = tuple(size)
    out = []
    for s in size:
        if isinstance(s, bool) or not isinstance(s, numbers.Integral):
            raise TypeError(f"size must contain ints, got {s!r} ({type(s).__name__})")
        s = int(s)
        if s < 0:
            raise ValueError(f"negative dimension {s} in size {tuple(size)}")
        out.append(s)
    if len(out) > MAX_DIMS:
        raise ValueError(f"tensors have at most {MAX_DIMS} dimensions, got {len(out)}")
    return tuple(out)


def contiguous_strides(shape):
    """The row-major strides, in elements, of a contiguous tensor of ``shape``."""
    strides = [1] * len(shape)
    acc = 1
    for i in range(len(shape) - 1, -1, -1):
        strides[i] = acc
        acc *= max(shape[i], 1)
    return tuple(strides)


def resolve_device(device):
    """-> -1 for CPU, else a validated CUDA device index."""
    d = as_device(device)
    if d.type == "cpu":
        return -1
    return cuda_device_index(d.index)


def resolve_dtype(dtype, default=None):
    """``dtype`` as a :class:`tensorplay.dtype`; None gives ``default`` (else the default float)."""
    if dtype is None:
        return default if default is not None else dt.default_float
    return dt.as_dtype(dtype)


def normalize_dim(dim, ndim):
    """Dimension ``dim`` (negative counts from the end) of an ``ndim``-d
    tensor as an index in ``[0, ndim)`` (0-d tensors take 0 and -1)."""
    if isinstance(dim, bool) or not isinstance(dim, numbers.Integral):
        raise TypeError(f"dimension must be an int, got {dim!r}")
    if not -max(ndim, 1) <= dim < max(ndim, 1):
        raise IndexError(f"dimension {dim} out of range for a {ndim}-d tensor")
    return dim % max(ndim, 1)


def broadcast_shape(a, b):
    """NumPy broadcasting of two shapes; ValueError when they don't broadcast."""
    n = max(len(a), len(b))
    a2 = (1,) * (n - len(a)) + tuple(a)
    b2 = (1,) * (n - len(b)) + tuple(b)
    out = []
    for x, y in zip(a2, b2):
        if x == y or y == 1:
            out.append(x)
        elif x == 1:
            out.append(y)
        else:
            raise ValueError(f"shapes {tuple(a)} and {tuple(b)} cannot be broadcast together")
    return tuple(out)


def broadcast_strides(t, shape):
    """``t``'s strides seen at ``shape`` (0 on broadcast dims); ValueError when
    ``t.shape`` does not broadcast to ``shape``."""
    ts, st = t.shape, t.strides
    if len(ts) > len(shape):
        raise ValueError(f"shape {ts} cannot be broadcast to {tuple(shape)}")
    pad = len(shape) - len(ts)
    out = [0] * pad
    for i, (s, stride) in enumerate(zip(ts, st)):
        target = shape[pad + i]
        if s == target:
            out.append(stride if s != 1 else 0)
        elif s == 1:
            out.append(0)
        else:
            raise ValueError(f"shape {ts} cannot be broadcast to {tuple(shape)}")
    return tuple(out)


def byte_span(t):
    """The device addresses ``[lo, hi)`` a CUDA tensor's elements lie in."""
    lo = hi = t.data_ptr()
    for s, st in zip(t.shape, t.strides):
        ext = (s - 1) * st * t.itemsize
        if ext < 0:
            lo += ext
        else:
            hi += ext
    return lo, hi + t.itemsize


def overlaps(a, b):
    """True when two CUDA tensors' memory ranges intersect (and are not identical views)."""
    if a._device_index != b._device_index or a.numel() == 0 or b.numel() == 0:
        return False
    (a0, a1), (b0, b1) = byte_span(a), byte_span(b)
    if a1 <= b0 or b1 <= a0:
        return False
    return not (a.data_ptr() == b.data_ptr() and a.shape == b.shape and a.strides == b.strides)


# ------------------------------------------------------------------ values and casts
#
# Two rules, as PyTorch has them:
#  * a Python number given for a dtype (tensor(), full(), fill_) must fit it,
#    else OverflowError (value_fits, check_value);
#  * a cast of existing values (a tensor, a NumPy array) is silent and
#    gives the values the CUDA kernels store (cast_into; the generated store
#    is codegen.store_stmt).

def integer_range(d):
    """``(lowest, highest)`` of integer dtype ``d``, as Python ints."""
    info = np.iinfo(d.numpy_dtype)
    return int(info.min), int(info.max)


def largest_finite(d):
    """The largest finite value of floating dtype ``d``, as a Python float."""
    return float(ml_dtypes.finfo(d.numpy_dtype).max)


def value_fits(x, d, fill=False):
    """True when the Python number ``x`` (bool, int or float) fits dtype ``d``.

    PyTorch's rule (c10's checked_convert): anything fits bool; an int fits
    an integer dtype inside its range, or for unsigned dtypes down to minus
    the largest value (which wraps around: -1 gives 255 in uint8); a float
    fits an integer dtype when finite and inside the range (it is then
    truncated toward zero); any number fits a floating dtype (rounded,
    ±inf past the range), except for ``fill`` values (full, fill_), which
    must be NaN, infinite or at most the dtype's largest finite value."""
    if isinstance(x, bool) or d.kind == "b":
        return True
    if d.kind in "iu":
        lo, hi = integer_range(d)
        if isinstance(x, int):
            return (-hi if d.kind == "u" else lo) <= x <= hi
        return math.isfinite(x) and lo <= x <= hi
    try:
        f = float(x)
    except OverflowError:          # an int beyond float64
        return False
    return not fill or not math.isfinite(f) or abs(f) <= largest_finite(d)


def _misfit_error(x, d, fill=False):
    """The OverflowError for the Python number ``x`` that does not fit dtype ``d``."""
    if d.kind in "iu":
        lo, hi = integer_range(d)
        limits = f"{lo} to {hi}"
        if d.kind == "u":
            limits += f"; negative ints down to -{hi} wrap around"
        if isinstance(x, float) and not math.isfinite(x):
            limits += "; NaN and infinities have no integer value"
    else:
        limits = f"largest finite value {largest_finite(d)!r}"
    what = "fill value" if fill else "value"
    text = repr(x)
    if len(text) > 24:                 # an int of hundreds of digits
        text = f"{text[:12]}...{text[-4:]} ({len(text.lstrip('-'))} digits)"
    return OverflowError(f"{what} {text} does not fit {d.name} ({limits})")


def _python_number(x):
    """A real number as a Python bool, int or float (NumPy scalars, bfloat16
    ones included); None for anything else (complex numbers included)."""
    if isinstance(x, (bool, np.bool_)):
        return bool(x)
    if isinstance(x, numbers.Integral):
        return int(x)
    if isinstance(x, numbers.Real) or (isinstance(x, np.generic) and x.dtype == dt.bfloat16.numpy_dtype):
        return float(x)
    return None


def check_value(value, d, fill=False):
    """``value`` (a Python or NumPy number) as the Python number stored in
    dtype ``d``: an int for integer dtypes (truncated toward zero; negative
    ints wrapped into unsigned ones), 0 or 1 for bool (nonzero is 1, NaN
    included), a float for floating dtypes. OverflowError naming the value
    and the dtype when it does not fit (see value_fits)."""
    x = _python_number(value)
    if x is None:
        raise TypeError(f"expected a real number, got {type(value).__name__}")
    if not value_fits(x, d, fill):
        raise _misfit_error(x, d, fill)
    if d.kind == "b":
        return 1 if x != 0 else 0
    if d.kind in "iu":
        return int(x) % (1 << (8 * d.itemsize)) if d.kind == "u" else int(x)
    return float(x)


def cast_into(dst, src):
    """Copy host array ``src`` (broadcast to dst's shape) into host array
    ``dst``, casting as the CUDA kernels do and without NumPy warnings.

    Floating values cast to an integer dtype are truncated toward zero,
    saturate at the dtype's limits and NaN becomes 0; integers cast to a
    narrower integer dtype wrap around; to bool, nonzero (NaN included) is
    True; floating casts round to nearest, overflowing to ±inf."""
    src = np.asarray(src)
    with np.errstate(all="ignore"):
        if dst.dtype.kind not in "iu" or not (src.dtype.kind == "f" or src.dtype == dt.bfloat16.numpy_dtype):
            np.copyto(dst, src, casting="unsafe")
            return dst
        info = np.iinfo(dst.dtype)
        a = src.astype(np.float64, copy=False)          # every half and float32 value exactly
        # float(info.max) rounds up to 2**63 for int64: >= still picks exactly the values past the top
        high, low, nan = a >= float(info.max), a <= float(info.min), np.isnan(a)
        np.copyto(dst, a, casting="unsafe", where=~(high | low | nan))
        np.copyto(dst, info.max, where=high)
        np.copyto(dst, info.min, where=low)
        np.copyto(dst, 0, where=nan)
    return dst


def cast_array(arr, d):
    """Host array ``arr`` in dtype ``d`` (itself when it already is), cast as cast_into does."""
    if arr.dtype == d.numpy_dtype:
        return arr
    return cast_into(np.empty(arr.shape, dtype=d.numpy_dtype), arr)


# ------------------------------------------------------------------ host data

def numpy_data(data, dtype):
    """Host array (any layout) of ``data`` in ``dtype`` (inferred when None)
    and that dtype: a tensor or a NumPy array or scalar (cast silently, see
    cast_into), or Python numbers and nested sequences of them (tensors and
    arrays among them), which must fit the dtype (OverflowError otherwise,
    see value_fits).

    Inference, as ``torch.tensor``: tensors, NumPy arrays and scalars keep
    their dtype; Python bools give bool, ints int64, floats float32."""
    d = None if dtype is None else dt.as_dtype(dtype)
    if isinstance(data, TensorBase):
        return cast_array(data.numpy(), d or data.dtype), d or data.dtype
    if isinstance(data, (np.ndarray, np.generic)):
        arr = np.asarray(data)
        if arr.dtype == object:
            return _exact(_flatten(arr.tolist(), "array"), d)
        if not _numeric(arr.dtype):
            raise TypeError(f"cannot make a tensor from a NumPy array of dtype {arr.dtype.name}: "
                            f"tensors hold bool, integer and floating values")
        d = d or dt.from_numpy_dtype(arr.dtype)
        return cast_array(arr, d), d
    return _python_data(data, d)


def _numeric(np_dtype):
    """True for NumPy's bool, integer and floating dtypes (bfloat16 included)."""
    return np_dtype.kind in "biuf" or np_dtype == dt.bfloat16.numpy_dtype


def _python_data(data, d):
    """numpy_data for Python numbers and (nested) sequences: NumPy converts,
    value_fits judges; values NumPy cannot hold exactly (ints past 64 bits,
    ints mixed with floats past 2**53) go one by one."""
    src = data
    if isinstance(data, (list, tuple)) and any(isinstance(x, TensorBase) for x in data):
        src = [x.numpy() if isinstance(x, TensorBase) else x for x in data]
    try:
        arr = np.asarray(src)
    except (ValueError, TypeError, OverflowError):
        arr = None
    if arr is None or not _numeric(arr.dtype):
        return _exact(_flatten(src, "data"), d)       # raises for ragged and non-numeric data
    k = arr.dtype.kind
    if d is None:
        if k == "b":
            return arr, dt.bool_
        if k in "iu":
            d = dt.int64
        elif arr.size and float(np.max(np.abs(arr))) >= 2.0 ** 63:
            # ints past int64 beside negative ones become float64 in NumPy: were there floats?
            return _exact(_flatten(src, "data"), None)
        else:
            return cast_array(arr, dt.default_float), dt.default_float
    if d.kind in "iu" and k != "b" and arr.size and not _fast_fits(arr, d):
        return _exact(_flatten(src, "data"), d)        # exact values, or the first misfit named
    return cast_array(arr, d), d


def _fast_fits(arr, d):
    """True when every value of ``arr`` (NumPy's array of Python numbers,
    integer or float64) fits integer dtype ``d`` and converts exactly by a
    NumPy cast; False means: look at each value."""
    lo, hi = integer_range(d)
    mn, mx = arr.min(), arr.max()
    if arr.dtype.kind not in "iu":
        # the floats may be ints NumPy rounded (exact below 2**53); negative
        # ints wrapping into unsigned dtypes need the per-value look
        return (math.isfinite(mn) and math.isfinite(mx) and lo <= float(mn) and float(mx) <= hi
                and max(-float(mn), float(mx)) < 2.0 ** 53)
    return (-hi if d.kind == "u" else lo) <= int(mn) and int(mx) <= hi


def _exact(flat, d):
    """(array, dtype) of the Python numbers ``flat = (values, shape)`` for
    dtype ``d`` (inferred when None), converted one by one; OverflowError
    naming the first value that does not fit."""
    values, shape = flat
    if d is None:
        kinds = {type(x) for x in values}
        d = dt.default_float if float in kinds else (dt.int64 if int in kinds else
                                                       (dt.bool_ if values else dt.default_float))
    stored = [check_value(x, d) for x in values]
    with np.errstate(all="ignore"):                       # floats past the range round to ±inf
        return np.array(stored, dtype=d.numpy_dtype).reshape(shape), d


def _flatten(x, path):
    """(the Python numbers of nested sequences ``x`` in row-major order, the
    shape); ValueError for ragged sequences, TypeError naming what is not a
    number (``path`` names ``x`` in the messages)."""
    values = []
    shape = _walk(x, path, values)
    return values, shape


def _walk(x, path, values):
    if isinstance(x, TensorBase):
        x = x.numpy()
    if isinstance(x, np.ndarray):
        if x.ndim == 0:
            x = x[()]
        elif _numeric(x.dtype):
            values.extend(x.reshape(-1).tolist())          # Python numbers (bfloat16's as floats)
            return x.shape
        else:
            x = x.tolist()
    if isinstance(x, (list, tuple)):
        shapes = [_walk(y, f"{path}[{i}]", values) for i, y in enumerate(x)]
        for i, s in enumerate(shapes[1:], 1):
            if s != shapes[0]:
                raise ValueError(f"cannot make a tensor from ragged nested sequences: {path}[{i}] "
                                 f"{_shape_text(s)} but {path}[0] {_shape_text(shapes[0])}; the "
                                 f"sequences at each depth must have the same length")
        return (len(x),) + (shapes[0] if shapes else ())
    n = _python_number(x)
    if n is None:
        kind = "complex numbers are not supported" if isinstance(x, complex) or (
            isinstance(x, np.generic) and x.dtype.kind == "c") else "tensors hold bool, int and float values"
        text = repr(x)
        text = text if len(text) <= 40 else text[:37] + "..."
        where = "" if path in ("data", "array") else f" at {path}"
        raise TypeError(f"cannot make a tensor from {type(x).__name__} {text}{where}: {kind}")
    values.append(n)
    return ()


def _shape_text(shape):
    return "is a number" if not shape else f"has length {shape[0]}" + (
        f" (shape {shape})" if len(shape) > 1 else "")
