# SPDX-License-Identifier: Apache-2.0
"""The argument helpers of the tensor core and the ops: sizes, dtypes,
devices and dimensions as the functions take them, broadcast shapes and
strides, the bytes a CUDA tensor spans, and host data as NumPy arrays.

Nothing here makes a tensor, so the Tensor class (``tensor``) and every
layer above can use these."""

from __future__ import annotations

import numbers

import numpy as np

from tensorplay import _dtypes as dt
from tensorplay._device import as_device
from tensorplay._driver.context import device_index as cuda_device_index
from tensorplay._tensor.base import MAX_DIMS, TensorBase

__all__ = ["parse_size", "contiguous_strides", "resolve_device", "resolve_dtype", "normalize_dim", "broadcast_shape",
           "broadcast_strides", "byte_span", "overlaps", "numpy_data"]


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


def _infer_dtype(arr, data):
    """PyTorch's inference: NumPy arrays keep their dtype; Python floats are float32."""
    if isinstance(data, (np.ndarray, np.generic)):
        return dt.from_numpy_dtype(arr.dtype)
    k = arr.dtype.kind
    if k == "b":
        return dt.bool_
    if k in "iu":
        return dt.int64
    if k == "f":
        return dt.default_float
    raise TypeError(f"cannot make a tensor from data of NumPy dtype {arr.dtype}")


def numpy_data(data, dtype):
    """Host array (any layout) of ``data`` in ``dtype`` (inferred when None):
    a tensor, or numbers, sequences (tensors among them) and NumPy arrays."""
    if isinstance(data, TensorBase):
        arr = data.numpy()
        src = arr
    else:
        src = data
        if isinstance(data, (list, tuple)) and any(isinstance(x, TensorBase) for x in _flat_iter(data)):
            src = [x.numpy() if isinstance(x, TensorBase) else x for x in data]
        try:
            arr = np.asarray(src)
        except (ValueError, TypeError) as exc:
            raise TypeError(f"cannot make a tensor from {type(data).__name__}: {exc}") from None
        if arr.dtype == object:
            raise TypeError(f"cannot make a tensor from {type(data).__name__}: ragged or non-numeric data")
    d = _infer_dtype(arr, src) if dtype is None else dt.as_dtype(dtype)
    if arr.dtype != d.numpy_dtype:
        arr = arr.astype(d.numpy_dtype)
    return arr, d


def _flat_iter(x):
    if isinstance(x, (list, tuple)):
        for y in x:
            yield from _flat_iter(y)
    else:
        yield x
