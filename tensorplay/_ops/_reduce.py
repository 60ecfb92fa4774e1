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

from .. import _dtypes as dt
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


# ------------------------------------------------------------------ composites

def _check_arg_dim(op, t, dim):
    if dim is not None and isinstance(dim, (tuple, list)):
        raise TypeError(f"{op} takes a single dim or None")


def argmax(t, dim=None, keepdim=False):
    _check_arg_dim("argmax", t, dim)
    return reduce("argmax", t, dim, keepdim)


def argmin(t, dim=None, keepdim=False):
    _check_arg_dim("argmin", t, dim)
    return reduce("argmin", t, dim, keepdim)


def max_(t, dim=None, keepdim=False):
    """max(t) -> the largest value; max(t, dim) -> (values, indices)."""
    if dim is None:
        return reduce("amax", t)
    return reduce("amax", t, dim, keepdim), reduce("argmax", t, dim, keepdim)


def min_(t, dim=None, keepdim=False):
    if dim is None:
        return reduce("amin", t)
    return reduce("amin", t, dim, keepdim), reduce("argmin", t, dim, keepdim)


def _count(t, dim):
    n = 1
    for d in _norm_dims(t, dim):
        n *= t.shape[d]
    return n


def mean(t, dim=None, keepdim=False, dtype=None, out=None):
    d = t.dtype if dtype is None else dt.as_dtype(dtype)
    if d.kind != "f":
        raise TypeError(f"mean(): could not infer the output dtype from {d.name}; pass a floating dtype")
    src = t if t.dtype is d else t.to(d)
    n = _count(t, dim)
    return reduce("sum", src, dim, keepdim, d, out, scale=(1.0 / n) if n else float("nan"))


def var(t, dim=None, correction=1, keepdim=False, out=None):
    """Variance with Bessel-style ``correction`` (1: unbiased), two passes in
    float32 (float64 for float64 input)."""
    if t.dtype.kind != "f":
        raise TypeError(f"var/std need a floating tensor, got {t.dtype.name}")
    work = dt.float64 if t.dtype is dt.float64 else dt.float32
    x = t.to(work)
    n = _count(t, dim)
    m = mean(x, dim, keepdim=True)
    dev = apply("sub", x, m)
    sq = apply("mul", dev, dev)
    denom = n - correction
    # no degrees of freedom left: 0 * inf and the empty reduction both give NaN, as PyTorch
    scale = (1.0 / denom) if denom > 0 else float("inf")
    r = reduce("sum", sq, dim, keepdim, scale=scale).to(t.dtype)
    if out is not None:
        out.copy_(r)
        return out
    return r


def std(t, dim=None, correction=1, keepdim=False, out=None):
    r = apply("sqrt", var(t, dim, correction, keepdim))
    if out is not None:
        out.copy_(r)
        return out
    return r


def norm(t, p=2, dim=None, keepdim=False):
    """Vector p-norm over ``dim`` (all elements when None): p = 2, 1, inf, -inf, 0, or any real."""
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


def dot(a, b):
    """Inner product of two 1-D tensors of one dtype (float products accumulate in float32/64)."""
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
