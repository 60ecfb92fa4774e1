# SPDX-License-Identifier: Apache-2.0
"""Reductions: a block-per-row tree reduction in shared memory, with a second
pass over per-chunk partials when few rows are long (so a full reduction of a
large tensor still spreads over the whole GPU). Half types accumulate in
float32, float32 in float32, float64 in float64, integers in int64."""

from __future__ import annotations

import math
import numbers
import struct

import numpy as np

from .. import _dtypes as dt, return_types
from .._tensor_api import Tensor, _empty_cuda, empty, full
from . import _codegen, _kernels
from ._elementwise import apply
from ._views import permute

THREADS = 256

# op: (combine kind, has index)
_KINDS = {
    "sum": ("sum", False), "prod": ("prod", False), "amax": ("max", False), "amin": ("min", False),
    "argmax": ("max", True), "argmin": ("min", True), "all": ("all", False), "any": ("any", False),
}


def _acc_dtype(op, d):
    if op in ("all", "any"):
        return dt.bool_
    if op in ("sum", "prod"):
        if d.kind in "biu":
            return dt.int64
        return dt.float64 if d is dt.float64 else dt.float32
    return dt.float32 if d in (dt.float16, dt.bfloat16) else d


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


def _limits(acc):
    """(lowest, highest) C literals of an accumulator type."""
    if acc.kind == "f":
        if acc is dt.float64:
            inf = "__longlong_as_double(0x7ff0000000000000LL)"
        else:
            inf = "__int_as_float(0x7f800000)"
        return f"(-{inf})", inf
    if acc is dt.bool_:
        return "false", "true"
    info = np.iinfo(acc.numpy_dtype)
    lo = f"({info.min + 1}LL - 1)" if acc is dt.int64 else str(info.min)
    return f"(({acc.ctype}){lo})", f"(({acc.ctype}){info.max}LL)"


def _reduce_source(name, kind, with_index, in_dt, in_is_acc, acc, out_dt, final, scaled):
    c_acc = _codegen.compute_ctype(acc)
    lo, hi = _limits(acc)
    identity = {"sum": "0", "prod": "1", "max": lo, "min": hi, "all": "true", "any": "false"}[kind]
    if kind in ("max", "min"):
        better = ">" if kind == "max" else "<"
        nan = "(b.v != b.v && a.v == a.v)" if acc.kind == "f" else "false"
        both_nan = "(b.v != b.v && a.v != a.v)" if acc.kind == "f" else "false"
        a_nan = "(a.v != a.v)" if acc.kind == "f" else "false"
        combine = (f"  if ({nan}) return b;\n  if ({a_nan} && !{both_nan}) return a;\n"
                   f"  if ({both_nan} || b.v == a.v) return (b.i < a.i) ? b : a;\n"
                   f"  return (b.v {better} a.v) ? b : a;")
    else:
        op = {"sum": "a.v + b.v", "prod": "a.v * b.v", "all": "a.v && b.v", "any": "a.v || b.v"}[kind]
        combine = f"  tp_pair r; r.v = {op}; r.i = 0; return r;"
    in_t = acc if in_is_acc else in_dt
    load = _codegen.load_expr(in_t, "in", "k")
    if kind in ("all", "any"):
        load = f"(({load}) != 0)"
    index = "in_idx[k]" if (with_index and in_is_acc) else "j"
    value = "s.v" if not scaled else f"({c_acc})(s.v * scale)"
    if final:
        store = _codegen.store_stmt(out_dt, "out", "b", value) if not with_index else "out[b] = s.i;"
    else:
        store = f"out[b] = s.v; if (out_idx) out_idx[b] = s.i;"
    out_ctype = (out_dt.ctype if final else acc.ctype) if not (final and with_index) else "long long"
    return (_codegen.PREAMBLE +
            f"struct tp_pair {{ {c_acc} v; long long i; }};\n"
            f"__device__ __forceinline__ tp_pair tp_combine(tp_pair a, tp_pair b) {{\n{combine}\n}}\n"
            f'extern "C" __global__ void {name}(const {in_t.ctype}* __restrict__ in, '
            f"const long long* __restrict__ in_idx, {out_ctype}* __restrict__ out, "
            f"long long* __restrict__ out_idx, long long inner, long long chunks, long long chunk_len, "
            f"double scale) {{\n"
            "  long long b = blockIdx.x;\n"
            "  long long row = b / chunks, ch = b % chunks;\n"
            "  long long start = ch * chunk_len;\n"
            "  long long end = start + chunk_len < inner ? start + chunk_len : inner;\n"
            f"  tp_pair s; s.v = {identity}; s.i = 0x7fffffffffffffffLL;\n"
            "  for (long long j = start + threadIdx.x; j < end; j += blockDim.x) {\n"
            "    long long k = row * inner + j;\n"
            f"    tp_pair x; x.v = ({c_acc})({load}); x.i = {index};\n"
            "    s = tp_combine(s, x);\n"
            "  }\n"
            f"  __shared__ tp_pair sh[{THREADS}];\n"
            "  sh[threadIdx.x] = s;\n"
            "  __syncthreads();\n"
            f"  for (int w = {THREADS // 2}; w > 0; w >>= 1) {{\n"
            "    if (threadIdx.x < w) sh[threadIdx.x] = tp_combine(sh[threadIdx.x], sh[threadIdx.x + w]);\n"
            "    __syncthreads();\n"
            "  }\n"
            "  if (threadIdx.x == 0) {\n"
            "    s = sh[0];\n"
            f"    {store}\n"
            "  }\n"
            "}\n")


def _launch_reduce(op, src, outer, inner, out, scale=None):
    """Reduce contiguous CUDA ``src`` viewed as [outer, inner] into ``out`` (outer elements)."""
    kind, with_index = _KINDS[op]
    dev = src._device_index_
    acc = _acc_dtype(op, src.dtype)
    sms = _kernels.sm_count(dev)
    chunks = 1
    if outer < 2 * sms and inner > 8192:
        chunks = min(-(-inner // 4096), max(1, (4 * sms) // max(outer, 1)))
    chunk_len = -(-inner // chunks)
    scaled = scale is not None
    stream = None

    def run(in_t, in_is_acc, in_idx_ptr, out_ptr, out_idx_ptr, n_inner, n_chunks, n_chunk_len, final):
        key = ("reduce", op, in_t.code, in_is_acc, out.dtype.code, final, scaled)

        def make():
            name = f"tp_reduce_{op}_{in_t.name}_{out.dtype.name}_{int(in_is_acc)}{int(final)}{int(scaled)}"
            return _reduce_source(name, kind, with_index, in_t, in_is_acc, acc, out.dtype, final, scaled), name
        f = _kernels.cached_function(key, dev, make)
        params = struct.pack("<QQQQqqqd", in_ptr_holder[0], in_idx_ptr, out_ptr, out_idx_ptr,
                             n_inner, n_chunks, n_chunk_len, scale if scaled else 1.0)
        f.launch(outer * n_chunks, THREADS, params, 0, stream)

    in_ptr_holder = [src.data_ptr()]
    if chunks == 1:
        run(src.dtype, False, 0, out.data_ptr(), 0, inner, 1, inner, True)
        return out
    part = _empty_cuda((outer * chunks,), acc, dev)
    part_idx = _empty_cuda((outer * chunks,), dt.int64, dev) if with_index else None
    run(src.dtype, False, 0, part.data_ptr(), part_idx.data_ptr() if with_index else 0,
        inner, chunks, chunk_len, False)
    in_ptr_holder[0] = part.data_ptr()
    run(src.dtype, True, part_idx.data_ptr() if with_index else 0, out.data_ptr(), 0,
        chunks, 1, chunks, True)
    return out


def _norm_dims(t, dim):
    if dim is None:
        return tuple(range(t.ndim))
    dims = dim if isinstance(dim, (tuple, list)) else (dim,)
    out = []
    for d in dims:
        d = t._dim(d)
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
        if out._device_index_ != t._device_index_:
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
    src = permute(t, kept + list(dims)).contiguous() if dims != tuple(range(t.ndim - len(dims), t.ndim)) \
        else t.contiguous()
    if inner == 0:
        ident = {"sum": 0, "prod": 1, "all": True, "any": False}[op]
        return dst.fill_(ident if scale is None else float("nan"))
    target = dst if dst.is_contiguous() else empty(dst.shape, dtype=dst.dtype, device=dst.device)
    _launch_reduce(op, src, outer, inner, target, scale)
    if target is not dst:
        dst.copy_(target)
    return dst


def _reduce_cpu(op, t, dims, keepdim, dst, scale):
    a = t.numpy()
    acc = _acc_dtype(op, t.dtype)
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
    np.copyto(dst.numpy(), np.asarray(r), casting="unsafe")
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
    work = _acc_dtype("sum", a.dtype)
    prod = empty(a.shape, dtype=work, device=a.device)
    apply("mul", a, b, out=prod)        # products rounded once, in the accumulator type
    return reduce("sum", prod).to(a.dtype if a.dtype.kind == "f" else work)
