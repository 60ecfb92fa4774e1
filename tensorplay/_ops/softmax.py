# SPDX-License-Identifier: Apache-2.0
"""``softmax`` and ``log_softmax`` along a dimension, on the CPU (NumPy) and
CUDA, made of the reductions and elementwise kernels: the largest value of
each slice, ``exp(x - max)`` in one kernel, its sum, and one kernel for the
quotient (or ``x - max - log(sum)``). Half types compute in float32."""

from __future__ import annotations

import numpy as np

from tensorplay import _dtypes as dt
from tensorplay._tensor.args import broadcast_strides, cast_into, normalize_dim
from tensorplay._tensor.creation import empty
from tensorplay._tensor.tensor import Tensor, empty_cuda
from tensorplay._kernels import cache as _kernels
from tensorplay._ops.elementwise import numpy_compute_dtype
from tensorplay._ops.reduce import reduce

__all__ = ["softmax", "log_softmax", "softmax_along"]


def softmax_along(op, input, dim, dtype):
    """``softmax`` or ``log_softmax`` (``op``) of ``input`` along ``dim``,
    ``input`` cast to ``dtype`` first when given."""
    if not isinstance(input, Tensor):
        raise TypeError(f"{op} expects a Tensor, got {type(input).__name__}")
    d = input.dtype if dtype is None else dt.as_dtype(dtype)
    if d.kind != "f":
        raise TypeError(f"{op}: needs a floating tensor or a floating dtype, got {d.name}")
    x = input if input.dtype is d else input.to(d)
    k = normalize_dim(dim, x.ndim)
    out = empty(x.shape, dtype=d, device=x.device)
    if out.numel() == 0:
        return out
    if x.ndim == 0:
        x = x.reshape(1)
    if x.is_cpu:
        a = x.numpy().astype(numpy_compute_dtype(d))
        with np.errstate(all="ignore"):
            z = a - a.max(axis=k, keepdims=True)
            e = np.exp(z)
            s = e.sum(axis=k, keepdims=True)
            r = e / s if op == "softmax" else z - np.log(s)
        cast_into(out.numpy(), r.reshape(out.shape))
        return out
    dev = x._device_index
    acc = dt.float64 if d is dt.float64 else dt.float32
    c = acc.ctype
    f = "" if acc is dt.float64 else "f"
    m = reduce("amax", x, k, True)
    e = empty_cuda(x.shape, acc, dev)
    _kernels.launch_elementwise(("softmax_exp",), f"exp{f}((({c})a0) - (({c})a1))", e,
                                (x, m), (x.strides, broadcast_strides(m, x.shape)))
    s = reduce("sum", e, k, True)
    dst = out.reshape(x.shape)
    if op == "softmax":
        _kernels.launch_elementwise(("softmax_div",), f"(({c})a0) / (({c})a1)", dst,
                                    (e, s), (e.strides, broadcast_strides(s, x.shape)))
    else:
        _kernels.launch_elementwise(("log_softmax",), f"(({c})a0) - (({c})a1) - log{f}(({c})a2)", dst,
                                    (x, m, s), (x.strides, broadcast_strides(m, x.shape),
                                                broadcast_strides(s, x.shape)))
    return out


_DOC = """Return the {what} of ``input`` along ``dim``.

As ``torch.{name}``: {formula}, computed from ``x - max(x)`` along ``dim``
so that large values do not overflow. Half types compute in float32 and
round once at the end. A slice holding NaN, or only ``-inf``, gives NaN.

Parameters
----------
input : Tensor
    A floating tensor (or pass a floating ``dtype``).
dim : int
    The dimension the {what} is taken along (negative counts from the end).
dtype : dtype, str or None, optional
    Cast ``input`` to this floating dtype first; the result has it.

Returns
-------
Tensor
    The result, ``input``'s shape.

Raises
------
TypeError
    If ``input`` is not a tensor, or neither it nor ``dtype`` is floating.
IndexError
    If ``dim`` is out of range.

Notes
-----
On CUDA: an ``amax`` and a ``sum`` reduction along ``dim`` and two
generated elementwise kernels (``exp(x - max)``, then {last}), on the
current stream; a CUDA graph can capture them.
"""


def softmax(input, dim, dtype=None):
    return softmax_along("softmax", input, dim, dtype)


def log_softmax(input, dim, dtype=None):
    return softmax_along("log_softmax", input, dim, dtype)


softmax.__doc__ = _DOC.format(what="softmax", name="softmax",
                              formula="``exp(x) / sum(exp(x))`` of each slice", last="the quotient")
log_softmax.__doc__ = _DOC.format(what="logarithm of the softmax", name="log_softmax",
                                  formula="``x - log(sum(exp(x)))`` of each slice",
                                  last="``x - max - log(sum)``")
