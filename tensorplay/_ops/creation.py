# SPDX-License-Identifier: Apache-2.0
"""Creation helpers for numerical code: linspace, eye, cat, stack; and the
Tensor methods that make tensors like one (new_zeros, new_ones, new_full,
new_empty)."""

from __future__ import annotations

import numbers

import numpy as np

from tensorplay import _dtypes as dt
from tensorplay._tensor.args import cast_into, normalize_dim, resolve_device
from tensorplay._tensor.creation import empty, full, ones, tensor, zeros
from tensorplay._tensor.tensor import Tensor
from tensorplay._kernels import cache as _kernels
from tensorplay._ops.promotion import result_type


def linspace(start, end, steps, *, dtype=None, device=None):
    """Make a 1-D tensor of ``steps`` evenly spaced values from ``start`` to ``end``, inclusive.

    As ``torch.linspace``, the values are computed from ``start`` for the
    first half and from ``end`` for the second, so both ends are exact.

    Parameters
    ----------
    start, end : float
        The first and the last value.
    steps : int
        The number of values (0 gives an empty tensor).
    dtype : dtype, str or None, optional
        Default float32.
    device : device, str, int or None, optional
        Default the CPU.

    Returns
    -------
    Tensor
        The values.
    """
    for v in (start, end):
        if isinstance(v, bool) or not isinstance(v, numbers.Real):
            raise TypeError(f"linspace takes real numbers, got {v!r}")
    if isinstance(steps, bool) or not isinstance(steps, numbers.Integral) or steps < 0:
        raise ValueError(f"linspace: steps must be a non-negative int, got {steps!r}")
    d = dt.default_float if dtype is None else dt.as_dtype(dtype)
    dev = resolve_device(device)
    out = empty(steps, dtype=d, device=device)
    if steps == 0:
        return out
    step = (end - start) / (steps - 1) if steps > 1 else 0.0
    if dev < 0:
        cast_into(out.numpy(), np.linspace(start, end, steps))
        return out
    # symmetric evaluation, as PyTorch: from the start for the first half, from the end after
    expr = "((double)i < s3 / 2.0) ? (s0 + s1 * (double)i) : (s2 - s1 * (s3 - 1.0 - (double)i))"
    _kernels.launch_elementwise("linspace", expr, out, (), (), (float(start), step, float(end), float(steps)),
                                ("f", "f", "f", "f"))
    return out


def eye(n, m=None, *, dtype=None, device=None):
    """Make a 2-D tensor with ones on the diagonal and zeros elsewhere.

    Parameters
    ----------
    n : int
        The number of rows.
    m : int, optional
        The number of columns; default ``n``.
    dtype : dtype, str or None, optional
        Default float32.
    device : device, str, int or None, optional
        Default the CPU.

    Returns
    -------
    Tensor
        The (n, m) identity matrix.
    """
    m = n if m is None else m
    for v in (n, m):
        if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 0:
            raise ValueError(f"eye: sizes must be non-negative ints, got {v!r}")
    d = dt.default_float if dtype is None else dt.as_dtype(dtype)
    out = empty((n, m), dtype=d, device=device)
    if out.numel() == 0:
        return out
    if out.is_cpu:
        cast_into(out.numpy(), np.eye(n, m))
        return out
    _kernels.launch_elementwise("eye", "(i / s0) == (i % s0)", out, (), (), (m,), ("i",))
    return out


def _tensor_list(tensors, what):
    """``tensors`` as a non-empty list of tensors, or the error ``what`` raises."""
    tensors = list(tensors)
    if not tensors:
        raise ValueError(f"{what} needs at least one tensor")
    if not all(isinstance(t, Tensor) for t in tensors):
        raise TypeError(f"{what} expects a sequence of tensors")
    return tensors


def cat(tensors, dim=0, *, out=None):
    """Concatenate ``tensors`` along the existing dimension ``dim``.

    Parameters
    ----------
    tensors : sequence of Tensor
        At least one tensor, all on one device, of one number of dimensions
        (at least 1) and equal sizes outside ``dim``; their dtypes promote
        (:func:`result_type`).
    dim : int, optional
        The dimension to join along; default 0.
    out : Tensor, optional
        Write the result here.

    Returns
    -------
    Tensor
        The joined tensor.
    """
    tensors = _tensor_list(tensors, "cat")
    ref = tensors[0]
    d = normalize_dim(dim, ref.ndim) if ref.ndim else 0
    if ref.ndim == 0:
        raise ValueError("cat cannot concatenate 0-d tensors; use stack")
    for t in tensors[1:]:
        if t.ndim != ref.ndim or any(a != b for i, (a, b) in enumerate(zip(t.shape, ref.shape)) if i != d):
            raise ValueError(f"cat: shapes {ref.shape} and {t.shape} differ outside dim {d}")
        if t._device_index != ref._device_index:
            raise ValueError(f"cat: tensors on {ref.device} and {t.device}")
    rtype = result_type(*tensors)
    shape = list(ref.shape)
    shape[d] = sum(t.shape[d] for t in tensors)
    if out is None:
        out = empty(tuple(shape), dtype=rtype, device=ref.device)
    elif out.shape != tuple(shape):
        raise ValueError(f"cat: out has shape {out.shape}, expected {tuple(shape)}")
    pos = 0
    for t in tensors:
        n = t.shape[d]
        if n:
            idx = (slice(None),) * d + (slice(pos, pos + n),)
            out[idx] = t
        pos += n
    return out


def stack(tensors, dim=0, *, out=None):
    """Join equally shaped ``tensors`` along a new dimension ``dim``.

    Parameters
    ----------
    tensors : sequence of Tensor
        At least one tensor, all of one shape and on one device.
    dim : int, optional
        Where the new dimension goes; default 0.
    out : Tensor, optional
        Write the result here.

    Returns
    -------
    Tensor
        A tensor with one more dimension, of size ``len(tensors)`` at ``dim``.
    """
    tensors = _tensor_list(tensors, "stack")
    shape = tensors[0].shape
    for t in tensors:
        if t.shape != shape:
            raise ValueError(f"stack expects equal shapes, got {shape} and {t.shape}")
    n = len(shape) + 1
    if isinstance(dim, bool) or not isinstance(dim, numbers.Integral) or not -n <= dim < n:
        raise IndexError(f"stack: dim {dim!r} out of range for {n} dims")
    return cat([t.unsqueeze(dim % n) for t in tensors], dim % n, out=out)


# ------------------------------------------------------------------ Tensor methods
# installed on Tensor by _methods.install (as Tensor.<name without tensor_>)

_NEW_DOC = """Make a tensor of shape ``size`` {what}, with this tensor's dtype and device by default.

As ``torch.Tensor.{name}``.

Parameters
----------
{size}
dtype : dtype, str or None, optional
    The dtype; default this tensor's.
device : device, str, int or None, optional
    The device; default this tensor's.
pin_memory : bool, optional
    Make a CPU tensor in page-locked (pinned) host memory.

Returns
-------
Tensor
    A new tensor.
"""
_SIZE = """*size : int or sequence of int
    The shape: ``new_zeros(2, 3)`` or ``new_zeros((2, 3))``."""


def _like(self, dtype, device):
    return (self.dtype if dtype is None else dtype), (self.device if device is None else device)


def tensor_new_empty(self, *size, dtype=None, device=None, pin_memory=False):
    d, where = _like(self, dtype, device)
    return empty(*size, dtype=d, device=where, pin_memory=pin_memory)


def tensor_new_zeros(self, *size, dtype=None, device=None, pin_memory=False):
    d, where = _like(self, dtype, device)
    return zeros(*size, dtype=d, device=where, pin_memory=pin_memory)


def tensor_new_ones(self, *size, dtype=None, device=None, pin_memory=False):
    d, where = _like(self, dtype, device)
    return ones(*size, dtype=d, device=where, pin_memory=pin_memory)


def tensor_new_full(self, size, fill_value, *, dtype=None, device=None, pin_memory=False):
    d, where = _like(self, dtype, device)
    return full(size, fill_value, dtype=d, device=where, pin_memory=pin_memory)


tensor_new_empty.__doc__ = _NEW_DOC.format(what="without initialising its elements", name="new_empty", size=_SIZE)
tensor_new_zeros.__doc__ = _NEW_DOC.format(what="filled with zeros", name="new_zeros", size=_SIZE)
tensor_new_ones.__doc__ = _NEW_DOC.format(what="filled with ones", name="new_ones", size=_SIZE)
tensor_new_full.__doc__ = _NEW_DOC.format(
    what="filled with ``fill_value``", name="new_full",
    size="size : int or sequence of int\n    The shape.\nfill_value : bool, int or float\n"
         "    The value of every element; it must fit the dtype (as for :func:`tensorplay.full`).")

TENSOR_METHODS = {"new_empty": tensor_new_empty, "new_zeros": tensor_new_zeros, "new_ones": tensor_new_ones,
                  "new_full": tensor_new_full}
