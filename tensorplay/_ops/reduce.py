# SPDX-License-Identifier: Apache-2.0
"""Reductions: the 15 public functions (sum, prod, amax, amin, all, any,
argmax, argmin, max, min, mean, var, std, norm, dot), their dtype rules and
CPU path, and the launches of the reduction kernels with their partials.
The kernels and the plans that shape the launches are
``tensorplay._kernels.reduce_kernels``."""

from __future__ import annotations

import math
import numbers
import struct

import numpy as np

from tensorplay import _dtypes as dt
from tensorplay import return_types
from tensorplay._tensor.args import cast_into, normalize_dim
from tensorplay._tensor.creation import empty
from tensorplay._tensor.tensor import Tensor, empty_cuda
from tensorplay._kernels import cache as _kernels
from tensorplay._kernels import reduce_kernels
from tensorplay._kernels.reduce_kernels import KINDS, acc_dtype, reduce_function
from tensorplay._ops.elementwise import apply
from tensorplay._ops.views import permute


def _result_dtype(op, d, dtype):
    if dtype is not None:
        return dt.as_dtype(dtype)
    if op in ("sum", "prod"):
        return dt.int64 if d.kind in "biu" else d
    if op in ("argmax", "argmin"):
        return dt.int64
    if op in ("all", "any"):
        return dt.bool_
    return d


def _launch_rows(op, src, outer, inner, out, scale=None, in_is_acc=False, in_idx=None, src_dtype=None):
    """Reduce contiguous CUDA ``src`` viewed as [outer, inner] into ``out`` (outer elements)."""
    kind, with_index = KINDS[op]
    dev = src._device_index
    in_dt = src_dtype if src_dtype is not None else src.dtype
    acc = acc_dtype(op, in_dt)
    warps, chunks, chunk_len = reduce_kernels.row_plan(outer, inner, _kernels.sm_count(dev))
    scaled = scale is not None
    in_t = acc if in_is_acc else in_dt
    # vectors of 16 bytes: the row start must be 16-byte aligned and every row
    # (chunk lengths are multiples of 16 elements) a whole number of vectors
    width = 16 // in_t.itemsize
    vw = width if (inner % width == 0 and not src.data_ptr() & 15) else 1
    blocks = outer * chunks if warps > 1 else -(-(outer * chunks) // 8)
    in_idx_ptr = in_idx.data_ptr() if in_idx is not None else 0
    if chunks == 1:
        f = reduce_function(op, "row", in_dt, in_is_acc, out.dtype, True, scaled, dev, warps)
        f.launch(blocks, 256, struct.pack("<QQQQqqqqqd", src.data_ptr(), in_idx_ptr, out.data_ptr(), 0,
                                          outer, inner, 1, inner, vw, scale if scaled else 1.0), 0, None)
        return out
    part = empty_cuda((outer * chunks,), acc, dev)
    part_idx = empty_cuda((outer * chunks,), dt.int64, dev) if with_index else None
    f = reduce_function(op, "row", in_dt, in_is_acc, out.dtype, False, scaled, dev, warps)
    f.launch(blocks, 256, struct.pack("<QQQQqqqqqd", src.data_ptr(), in_idx_ptr, part.data_ptr(),
                                      part_idx.data_ptr() if with_index else 0,
                                      outer, inner, chunks, chunk_len, vw, 1.0), 0, None)
    return _launch_rows(op, part, outer, chunks, out, scale, True, part_idx, in_dt)


def _launch_columns(op, src, a, r, b, out, scale=None, in_is_acc=False, in_idx=None, src_dtype=None):
    """Reduce contiguous CUDA ``src`` viewed as [a, r, b] over r into ``out`` ([a, b])."""
    kind, with_index = KINDS[op]
    dev = src._device_index
    in_dt = src_dtype if src_dtype is not None else src.dtype
    acc = acc_dtype(op, in_dt)
    in_t = acc if in_is_acc else in_dt
    width = reduce_kernels.column_width(in_t.itemsize)
    splits, rows = reduce_kernels.column_plan(a, r, b, in_t.itemsize, _kernels.sm_count(dev))
    colblocks = -(-b // (32 * width))
    vw = width if (b % width == 0 and src.data_ptr() % (width * in_t.itemsize) == 0) else 1
    scaled = scale is not None
    in_idx_ptr = in_idx.data_ptr() if in_idx is not None else 0
    final = splits == 1
    if final:
        dst, dst_idx = out, None
    else:
        dst = empty_cuda((splits * a * b,), acc, dev)
        dst_idx = empty_cuda((splits * a * b,), dt.int64, dev) if with_index else None
    f = reduce_function(op, "column", in_dt, in_is_acc, out.dtype, final, scaled, dev, 0)
    f.launch((a * colblocks, splits), 256,
             struct.pack("<QQQQqqqqqqd", src.data_ptr(), in_idx_ptr, dst.data_ptr(),
                         dst_idx.data_ptr() if dst_idx is not None else 0,
                         a, r, b, rows, colblocks, vw, scale if (scaled and final) else 1.0), 0, None)
    if final:
        return out
    return _launch_columns(op, dst, 1, splits, a * b, out, scale, True, dst_idx, in_dt)


def _norm_dims(t, dim):
    if dim is None:
        return tuple(range(t.ndim))
    dims = dim if isinstance(dim, (tuple, list)) else (dim,)
    out = []
    for d in dims:
        d = normalize_dim(d, t.ndim)
        if d in out:
            raise ValueError(f"dimension {d} appears more than once in dim={dim!r}")
        out.append(d)
    return tuple(sorted(out))


def reduce(op, t, dim=None, keepdim=False, dtype=None, out=None, scale=None):
    """Reduce ``t`` over ``dim`` (all dims when None) with ``op``."""
    if not isinstance(t, Tensor):
        raise TypeError(f"{op} expects a Tensor, got {type(t).__name__}")
    if not isinstance(keepdim, int):
        raise TypeError(f"keepdim must be a bool, got {type(keepdim).__name__}")
    dims = _norm_dims(t, dim)
    kept = [i for i in range(t.ndim) if i not in dims]
    shape = t.shape
    out_shape = tuple(1 if i in dims else s for i, s in enumerate(shape)) if keepdim else \
        tuple(shape[i] for i in kept)
    inner = 1
    for d in dims:
        inner *= shape[d]
    outer = 1
    for i in kept:
        outer *= shape[i]
    result = _result_dtype(op, t.dtype, dtype)
    if inner == 0 and op in ("amax", "amin", "argmax", "argmin"):
        raise IndexError(f"{op}(): cannot reduce over a zero-size dimension (no identity)")
    if out is not None:
        if not isinstance(out, Tensor):
            raise TypeError(f"out must be a Tensor, got {type(out).__name__}")
        if out.shape != out_shape:
            raise ValueError(f"{op}: out has shape {out.shape}, the result has shape {out_shape}")
        if out._device_index != t._device_index:
            raise ValueError(f"{op}: out is on {out.device}, the input on {t.device}")
        if out.dtype is not result:
            raise TypeError(f"{op}: out has dtype {out.dtype.name}, expected {result.name}")
        dst = out
    else:
        dst = empty(out_shape, dtype=result, device=t.device)
    if dst.numel() == 0:
        return dst
    if t.is_cpu:
        return _reduce_cpu(op, t, dims, keepdim, dst, scale)
    if inner == 0:
        ident = {"sum": 0, "prod": 1, "all": True, "any": False}[op]
        return dst.fill_(ident if scale is None else float("nan"))
    target = dst if dst.is_contiguous() else empty(dst.shape, dtype=dst.dtype, device=dst.device)
    strategy = reduce_kernels.reduction_strategy(shape, dims)
    if strategy[0] == "row":
        _launch_rows(op, t.contiguous(), outer, inner, target, scale)
    elif strategy[0] == "column":
        _, a, r, b = strategy
        _launch_columns(op, t.contiguous(), a, r, b, target, scale)
    else:
        _launch_rows(op, permute(t, kept + list(dims)).contiguous(), outer, inner, target, scale)
    if target is not dst:
        dst.copy_(target)
    return dst


def _reduce_cpu(op, t, dims, keepdim, dst, scale):
    a = t.numpy()
    acc = acc_dtype(op, t.dtype)
    axis = dims
    with np.errstate(all="ignore"):
        if op in ("sum", "prod"):
            r = (np.sum if op == "sum" else np.prod)(a.astype(acc.numpy_dtype), axis=axis, keepdims=keepdim)
            if scale is not None:
                r = r * scale if r.size else np.full(r.shape, np.nan)
        elif op in ("amax", "amin"):
            r = (np.max if op == "amax" else np.min)(a.astype(acc.numpy_dtype), axis=axis, keepdims=keepdim)
        elif op in ("all", "any"):
            r = (np.all if op == "all" else np.any)(a.astype(bool), axis=axis, keepdims=keepdim)
        else:
            fn = np.argmax if op == "argmax" else np.argmin
            b = a.astype(acc.numpy_dtype)
            if len(dims) == t.ndim:
                r = fn(b.reshape(-1))
                r = np.asarray(r).reshape((1,) * t.ndim if keepdim else ())
            elif len(dims) == 1:
                r = fn(b, axis=dims[0], keepdims=keepdim)
            else:
                raise ValueError(f"{op} reduces over one dimension or all of them")
    cast_into(dst.numpy(), r)
    return dst


# ------------------------------------------------------------------ the public reductions
# Named with a trailing underscore here (this module uses the builtins max,
# min, sum, all and any); _public gives each its public name.

_DIM = """dim : int, sequence of int or None, optional
    The dimensions to reduce; None (the default) reduces over all of them."""
_KEEPDIM = """keepdim : bool, optional
    Keep the reduced dimensions, with size 1."""
_OUT = """out : Tensor, optional
    Write the result here: its shape must be the result's and its dtype the
    result dtype."""
_CUDA = """On CUDA tensors this launches generated NVRTC reduction kernels on the
current stream (cuLaunchKernel); it does not wait for them."""


def _public(name, doc=None):
    """Give a function its public name (``tensorplay.<name>``) and its docstring."""
    def deco(fn):
        fn.__name__ = fn.__qualname__ = name
        fn.__module__ = "tensorplay"
        if doc is not None:
            fn.__doc__ = doc.format(DIM=_DIM, KEEPDIM=_KEEPDIM, OUT=_OUT, CUDA=_CUDA)
        return fn
    return deco


_SIMPLE_DOC = """{summary}

{detail}

Parameters
----------
input : Tensor
    The tensor to reduce.
{{DIM}}
{{KEEPDIM}}{extra}
{{OUT}}

Returns
-------
Tensor
    {returns}

Notes
-----
{{CUDA}}
"""

_DTYPE = """
dtype : dtype, str or None, optional
    The dtype of the result (and of the accumulation); by default the input's
    dtype, int64 for bool and integer inputs."""


@_public("sum", _SIMPLE_DOC.format(
    summary="Sum the elements of ``input`` over ``dim``.",
    detail="Half types and float32 accumulate in float32, float64 in float64, bool and\n"
           "integers in int64 (PyTorch's promotion: integer sums are int64).",
    extra=_DTYPE, returns="The sums; a 0-d tensor when every dimension is reduced."))
def sum_(input, dim=None, keepdim=False, *, dtype=None, out=None):
    return reduce("sum", input, dim, keepdim, dtype, out)


@_public("prod", _SIMPLE_DOC.format(
    summary="Multiply the elements of ``input`` over ``dim``.",
    detail="Accumulates as :func:`sum` does; the product of no elements is 1.",
    extra=_DTYPE, returns="The products."))
def prod(input, dim=None, keepdim=False, *, dtype=None, out=None):
    return reduce("prod", input, dim, keepdim, dtype, out)


@_public("amax", _SIMPLE_DOC.format(
    summary="Return the largest elements of ``input`` over ``dim``.",
    detail="NaN propagates: a slice holding a NaN gives NaN. Reducing over a\n"
           "zero-size dimension raises IndexError (there is no identity).",
    extra="", returns="The largest values, in ``input``'s dtype."))
def amax(input, dim=None, keepdim=False, *, out=None):
    return reduce("amax", input, dim, keepdim, out=out)


@_public("amin", _SIMPLE_DOC.format(
    summary="Return the smallest elements of ``input`` over ``dim``.",
    detail="NaN propagates: a slice holding a NaN gives NaN. Reducing over a\n"
           "zero-size dimension raises IndexError (there is no identity).",
    extra="", returns="The smallest values, in ``input``'s dtype."))
def amin(input, dim=None, keepdim=False, *, out=None):
    return reduce("amin", input, dim, keepdim, out=out)


@_public("all", _SIMPLE_DOC.format(
    summary="Test whether every element of ``input`` over ``dim`` is nonzero.",
    detail="The test of no elements is True.",
    extra="", returns="A bool tensor."))
def all_(input, dim=None, keepdim=False, *, out=None):
    return reduce("all", input, dim, keepdim, out=out)


@_public("any", _SIMPLE_DOC.format(
    summary="Test whether any element of ``input`` over ``dim`` is nonzero.",
    detail="The test of no elements is False.",
    extra="", returns="A bool tensor."))
def any_(input, dim=None, keepdim=False, *, out=None):
    return reduce("any", input, dim, keepdim, out=out)


def _check_arg_dim(op, dim):
    if dim is not None and isinstance(dim, (tuple, list)):
        raise TypeError(f"{op} takes a single dim or None")


_ARG_DOC = """Return the index of the {which} element of ``input`` along ``dim``.

With ``dim=None`` the index is into the flattened tensor. Ties give the
first index; a NaN counts as {which} (its index is returned).

Parameters
----------
input : Tensor
    The tensor to search.
dim : int or None, optional
    The dimension to search along; None (the default) searches all elements.
{{KEEPDIM}}

Returns
-------
Tensor
    The indices, int64.

Notes
-----
{{CUDA}}
"""


@_public("argmax", _ARG_DOC.format(which="largest"))
def argmax(input, dim=None, keepdim=False):
    _check_arg_dim("argmax", dim)
    return reduce("argmax", input, dim, keepdim)


@_public("argmin", _ARG_DOC.format(which="smallest"))
def argmin(input, dim=None, keepdim=False):
    _check_arg_dim("argmin", dim)
    return reduce("argmin", input, dim, keepdim)


_EXTREME_DOC = """Return the {which} element of ``input``, or the {which} values along ``dim`` and where they are.

``{name}(input)`` is :func:`a{name}` over all elements (a 0-d tensor);
``{name}(input, dim)`` returns the named tuple
:class:`tensorplay.return_types.{name}` ``(values, indices)``, as
``torch.{name}`` does. Ties give the first index; NaN propagates.

Parameters
----------
input : Tensor
    The tensor to reduce.
dim : int, optional
    The dimension to reduce along.
keepdim : bool, optional
    Keep ``dim``, with size 1 (with ``dim`` only).

Returns
-------
Tensor or return_types.{name}
    The {which} element (without ``dim``), or ``(values, indices)`` with
    indices int64.

Notes
-----
{{CUDA}}
"""


@_public("max", _EXTREME_DOC.format(which="largest", name="max"))
def max_(input, dim=None, keepdim=False):
    if dim is None:
        return reduce("amax", input)
    _check_arg_dim("max", dim)
    return return_types.max(reduce("amax", input, dim, keepdim), reduce("argmax", input, dim, keepdim))


@_public("min", _EXTREME_DOC.format(which="smallest", name="min"))
def min_(input, dim=None, keepdim=False):
    if dim is None:
        return reduce("amin", input)
    _check_arg_dim("min", dim)
    return return_types.min(reduce("amin", input, dim, keepdim), reduce("argmin", input, dim, keepdim))


def _count(t, dim):
    n = 1
    for d in _norm_dims(t, dim):
        n *= t.shape[d]
    return n


@_public("mean", """Return the mean of the elements of ``input`` over ``dim``.

Sums in the accumulator type (float32 for half types and float32, float64
for float64) and scales once; the mean of no elements is NaN.

Parameters
----------
input : Tensor
    A floating tensor (or pass a floating ``dtype``).
{DIM}
{KEEPDIM}
dtype : dtype, str or None, optional
    The floating dtype of the result; ``input`` is cast to it first.
{OUT}

Returns
-------
Tensor
    The means.

Raises
------
TypeError
    If neither ``input`` nor ``dtype`` is floating.

Notes
-----
{CUDA}
""")
def mean(input, dim=None, keepdim=False, *, dtype=None, out=None):
    d = input.dtype if dtype is None else dt.as_dtype(dtype)
    if d.kind != "f":
        raise TypeError(f"mean(): could not infer the output dtype from {d.name}; pass a floating dtype")
    src = input if input.dtype is d else input.to(d)
    n = _count(input, dim)
    return reduce("sum", src, dim, keepdim, d, out, scale=(1.0 / n) if n else float("nan"))


_VAR_DOC = """Return the {what} of the elements of ``input`` over ``dim``.

Two passes (the mean, then the squared deviations) in float32, or float64
for float64 input; the result has ``input``'s dtype. With no degrees of
freedom left (``N - correction <= 0``) the result is NaN, as in PyTorch.

Parameters
----------
input : Tensor
    A floating tensor.
{{DIM}}
correction : int, optional
    Subtracted from the number of elements ``N`` in the divisor: 1 (the
    default) is Bessel's correction (the unbiased estimate), 0 the
    population {what}.
{{KEEPDIM}}
out : Tensor, optional
    Write the result here (cast to its dtype).

Returns
-------
Tensor
    The {what}s.

Notes
-----
{{CUDA}}
"""


@_public("var", _VAR_DOC.format(what="variance"))
def var(input, dim=None, *, correction=1, keepdim=False, out=None):
    if input.dtype.kind != "f":
        raise TypeError(f"var/std need a floating tensor, got {input.dtype.name}")
    work = dt.float64 if input.dtype is dt.float64 else dt.float32
    x = input.to(work)
    n = _count(input, dim)
    m = mean(x, dim, keepdim=True)
    dev = apply("sub", x, m)
    sq = apply("mul", dev, dev)
    denom = n - correction
    # no degrees of freedom left: 0 * inf and the empty reduction both give NaN, as PyTorch
    scale = (1.0 / denom) if denom > 0 else float("inf")
    r = reduce("sum", sq, dim, keepdim, scale=scale).to(input.dtype)
    if out is not None:
        out.copy_(r)
        return out
    return r


@_public("std", _VAR_DOC.format(what="standard deviation"))
def std(input, dim=None, *, correction=1, keepdim=False, out=None):
    r = apply("sqrt", var(input, dim, correction=correction, keepdim=keepdim))
    if out is not None:
        out.copy_(r)
        return out
    return r


@_public("norm", """Return the vector p-norm of ``input`` over ``dim``.

Computes in float32 (float64 for float64 input) and returns ``input``'s
dtype.

Parameters
----------
input : Tensor
    A floating tensor.
p : float, optional
    The order: 2 (the default, Euclidean), 1, ``inf`` (largest absolute
    value), ``-inf`` (smallest), 0 (number of nonzero elements), or any
    other real number (``sum(abs(x)**p)**(1/p)``).
{DIM}
{KEEPDIM}

Returns
-------
Tensor
    The norms.

Notes
-----
{CUDA}
""")
def norm(input, p=2, dim=None, keepdim=False):
    t = input
    if t.dtype.kind != "f":
        raise TypeError(f"norm needs a floating tensor, got {t.dtype.name}")
    if not isinstance(p, numbers.Real) or isinstance(p, bool):
        raise TypeError(f"norm: p must be a real number, got {p!r}")
    a = apply("abs", t)
    if p == math.inf:
        return reduce("amax", a, dim, keepdim)
    if p == -math.inf:
        return reduce("amin", a, dim, keepdim)
    work = dt.float64 if t.dtype is dt.float64 else dt.float32
    if p == 0:
        r = reduce("sum", apply("ne", t, 0).to(work), dim, keepdim)
    elif p == 1:
        r = reduce("sum", a.to(work), dim, keepdim)
    elif p == 2:
        w = t.to(work)
        r = apply("sqrt", reduce("sum", apply("mul", w, w), dim, keepdim))
    else:
        r = apply("pow", reduce("sum", apply("pow", a.to(work), float(p)), dim, keepdim), 1.0 / p)
    return r.to(t.dtype)


@_public("dot", """Return the inner product of two 1-D tensors of one dtype.

Each product is rounded once in the accumulator type (float32 for half
types and float32, float64 for float64, int64 for integers), then summed
as :func:`sum` does.

Parameters
----------
input : Tensor
    A 1-D tensor.
tensor : Tensor
    A 1-D tensor of the same size and dtype.

Returns
-------
Tensor
    A 0-d tensor: ``input``'s dtype for floating inputs, int64 for integers.

Notes
-----
{CUDA}
""")
def dot(input, tensor):
    a, b = input, tensor
    if not (isinstance(a, Tensor) and isinstance(b, Tensor)):
        raise TypeError("dot expects two tensors")
    if a.ndim != 1 or b.ndim != 1:
        raise ValueError(f"dot expects 1-D tensors, got {a.ndim}-D and {b.ndim}-D")
    if a.shape != b.shape:
        raise ValueError(f"dot: sizes differ ({a.shape[0]} and {b.shape[0]})")
    if a.dtype is not b.dtype:
        raise TypeError(f"dot expects one dtype, got {a.dtype.name} and {b.dtype.name}")
    work = acc_dtype("sum", a.dtype)
    prod = empty(a.shape, dtype=work, device=a.device)
    apply("mul", a, b, out=prod)        # products rounded once, in the accumulator type
    return reduce("sum", prod).to(a.dtype if a.dtype.kind == "f" else work)
