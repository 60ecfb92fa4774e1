# SPDX-License-Identifier: Apache-2.0
"""matmul, mv, addmm and linear: cuBLASLt on CUDA tensors (see _blas.py), NumPy on CPU.

A product is described to cuBLASLt by its operands' strides (transposed and
broadcast operands pass without copies) and run by a plan that holds the
heuristic's algorithm. Two caches keep an eager call at a few microseconds of
host time: the plans, per problem signature (_blas.plan), and per function a
recipe (per thread, as the plans: a call sets its plan's bias pointer) keyed by the arguments' shapes, strides, dtype and pointer alignment
that goes straight to the plan.
"""

from __future__ import annotations

import math

import numpy as np

from tensorplay._kernels import cublaslt as _lt
from tensorplay import _dtypes as dt
from tensorplay._driver.stream import current_stream_handle_of
from tensorplay._tensor.args import broadcast_shape, broadcast_strides, cast_into
from tensorplay._tensor.creation import empty
from tensorplay._tensor.tensor import Tensor, empty_cuda
from tensorplay._ops import blas as _blas
from tensorplay._ops.elementwise import numpy_compute_dtype

_FLOATS = (dt.float16, dt.bfloat16, dt.float32, dt.float64)
ACTIVATIONS = (None, "relu", "gelu")

_MAX_RECIPES = 4096


def _cublaslt():
    """The binding, with the library loaded (CublasUnavailableError otherwise)."""
    _blas.ensure_loaded()
    return _lt


def _data_type(d):
    lt = _cublaslt()
    return {dt.float16: lt.R_16F, dt.bfloat16: lt.R_16BF, dt.float32: lt.R_32F, dt.float64: lt.R_64F}[d]


def _compute_type(d):
    lt = _cublaslt()
    if d is dt.float64:
        return lt.COMPUTE_64F
    if d is dt.float32 and _blas.tf32_allowed():
        return lt.COMPUTE_32F_FAST_TF32
    return lt.COMPUTE_32F


def _epilogue(activation, with_bias):
    lt = _cublaslt()
    if activation is None:
        return lt.EPILOGUE_BIAS if with_bias else lt.EPILOGUE_DEFAULT
    if activation == "relu":
        return lt.EPILOGUE_RELU_BIAS if with_bias else lt.EPILOGUE_RELU
    return lt.EPILOGUE_GELU_BIAS if with_bias else lt.EPILOGUE_GELU


# ------------------------------------------------------------------ checks

def _check_operands(op, *tensors):
    for t in tensors:
        if not isinstance(t, Tensor):
            raise TypeError(f"{op} expects tensors, got {type(t).__name__}")
    d = tensors[0].dtype
    for t in tensors[1:]:
        if t.dtype is not d:
            raise TypeError(f"{op} expects one dtype, got {' and '.join(x.dtype.name for x in tensors)}")
    if d not in _FLOATS:
        raise TypeError(f"{op} supports float16, bfloat16, float32 and float64, not {d.name}")
    dev = tensors[0]._device_index
    for t in tensors[1:]:
        if t._device_index != dev:
            raise ValueError(f"{op}: operands on {tensors[0].device} and {t.device}")


def _check_activation(op, activation):
    if activation not in ACTIVATIONS:
        raise ValueError(f"{op}: activation must be None, 'relu' or 'gelu', got {activation!r}")


def _check_out(op, out, shape, d):
    if out is not None and (not isinstance(out, Tensor) or out.shape != shape or out.dtype is not d):
        raise ValueError(f"{op}: out must be a {d.name} tensor of shape {shape}")


# ------------------------------------------------------------------ the product

class _Plan:
    """A product ready to run: cuBLASLt's plan and which operand goes first."""
    __slots__ = ("lt_plan", "swap", "device", "workspace_bytes")

    def __init__(self, lt_plan, swap, device):
        self.lt_plan = lt_plan
        self.swap = swap
        self.device = device
        self.workspace_bytes = _blas.workspace_limit(device) if lt_plan.workspace_size else 0

    def run(self, a_ptr, b_ptr, d_ptr, c_ptr=None, bias_ptr=0, alpha=1.0, beta=0.0):
        dev = self.device
        stream = current_stream_handle_of(dev)
        if self.workspace_bytes:
            ws = _lt.workspace(dev, stream, self.workspace_bytes)
            ws_ptr, ws_size = ws.ptr, ws.size
        else:
            ws_ptr = ws_size = 0
        first, second = (b_ptr, a_ptr) if self.swap else (a_ptr, b_ptr)
        self.lt_plan.run(first, second, d_ptr if c_ptr is None else c_ptr, d_ptr, bias_ptr, alpha, beta,
                         ws_ptr, ws_size, stream)


def _reserve_capture_workspace(dev):
    """Inside a capture, take its workspace before the output is allocated:
    a capture sharing a pool then gets the block an earlier one returned
    whole, rather than finding it split by an output (see capture_workspace)."""
    if _lt.captures_open():
        _lt.capture_workspace(dev, current_stream_handle_of(dev), _blas.workspace_limit(dev))


def _alignment(ptr, itemsize, ld, batch_stride):
    # every matrix of the batch starts at ptr + i * batch_stride
    return _blas.pointer_alignment(ptr | (batch_stride * itemsize) | (ld * itemsize))


def _make_plan(d, dev, M, N, K, batch, a_ptr, a_strides, b_ptr, b_strides, d_ptr, d_strides,
               epilogue, row_major_d):
    """The _Plan of one product, or a dict of the operands ('a', 'b') to copy
    first: "dense" (its layout has no unit stride) or "batch" (its batch
    dimensions don't collapse into one stride: materialize the broadcast);
    None when cuBLASLt can't write D's layout.

    ``*_strides`` are (batch..., row, column) strides in elements at the
    product's batch shape ``batch`` (0 on broadcast dimensions)."""
    lay = _blas.gemm_layout(M, N, K, a_strides[-2:], b_strides[-2:], d_strides[-2:], row_major_d)
    if lay is None:
        return None
    sa = _blas.collapse_batch(batch, a_strides[:-2])
    sb = _blas.collapse_batch(batch, b_strides[:-2])
    sd = _blas.output_batch_stride(batch, d_strides[:-2])
    if sd is None:
        return None
    copy = {name: "dense" for name in lay["copy"]}
    if sa is None:
        copy.setdefault("a", "batch")
    if sb is None:
        copy.setdefault("b", "batch")
    if copy:
        return copy
    count = math.prod(batch)
    if count > 2**31 - 1:
        raise ValueError(f"matmul: {count} matrices in one batch exceed cuBLASLt's limit")
    lt = _cublaslt()
    item = d.itemsize
    if lay["swap"]:
        (pa, lda, s1), (pb, ldb, s2) = (b_ptr, lay["lda"], sb), (a_ptr, lay["ldb"], sa)
    else:
        (pa, lda, s1), (pb, ldb, s2) = (a_ptr, lay["lda"], sa), (b_ptr, lay["ldb"], sb)
    key = (dev, d.code, _compute_type(d), lay["trans_a"], lay["trans_b"], lay["m"], lay["n"], K,
           lda, ldb, lay["ldd"], count, s1, s2, sd, epilogue,
           _alignment(pa, item, lda, s1), _alignment(pb, item, ldb, s2),
           _alignment(d_ptr, item, lay["ldd"], sd))

    def make(handle):
        return lt.MatmulPlan(handle, _data_type(d), key[2], lt.OP_T if key[3] else lt.OP_N,
                             lt.OP_T if key[4] else lt.OP_N, key[5], key[6], K, lda, ldb, key[10],
                             count, s1, s2, sd, epilogue, _data_type(d), _blas.workspace_limit(dev),
                             key[16], key[17], key[18])
    return _Plan(_blas.plan(key, dev, make), lay["swap"], dev)


def _store(key, recipe):
    recipes = _blas.tls_dict("recipes")
    if len(recipes) >= _MAX_RECIPES:
        recipes.clear()
    recipes[key] = recipe


def _run_recipe(recipe, a_ptr, b_ptr, bias_ptr=0, alpha=1.0):
    """A cached call: a new output and one cuBLASLt launch (no C operand)."""
    shape, d, dev, plan = recipe
    if plan.workspace_bytes:
        _reserve_capture_workspace(dev)
    res = empty_cuda(shape, d, dev)
    plan.run(a_ptr, b_ptr, res.data_ptr(), None, bias_ptr, alpha, 0.0)
    return res


def _matrix_strides(t, shape):
    """``t``'s strides at ``shape`` (batch..., rows, cols), 0 where broadcast,
    keeping the real strides of size-1 matrix dimensions (layouts use them)."""
    st = list(broadcast_strides(t, shape[:-2] + t.shape[-2:]))
    st[-2:] = t.strides[-2:]
    return tuple(st)


def _product(a, b, batch, M, N, K, d, epilogue=None, bias_ptr=0, alpha=1.0, beta=0.0, c_ptr=None,
             row_major_d=False):
    """D = alpha * A @ B + beta * C (+ bias and activation), A of batch x M x K,
    B of batch x K x N (broadcasting over batch), D written in place. Copies an
    operand only when cuBLASLt can't read its layout, and materializes a
    broadcast batch when no algorithm takes a zero batch stride. Returns the
    _Plan when no copy was needed (callers cache it), else None."""
    lt = _cublaslt()
    if epilogue is None:
        epilogue = lt.EPILOGUE_DEFAULT
    dev = d._device_index
    d_strides = d.strides
    copied = False
    for _ in range(4):
        a_strides = _matrix_strides(a, batch + (M, K))
        b_strides = _matrix_strides(b, batch + (K, N))
        try:
            plan = _make_plan(d.dtype, dev, M, N, K, batch, a.data_ptr(), a_strides, b.data_ptr(),
                              b_strides, d.data_ptr(), d_strides, epilogue, row_major_d)
        except lt.CublasError as exc:
            # NOT_SUPPORTED: no algorithm takes a zero (broadcast) batch stride
            if exc.status != 15 or 0 not in a_strides[:-2] + b_strides[:-2]:
                raise
            plan = {"a": "batch", "b": "batch"}
        if plan is None:
            raise AssertionError(f"matmul: cuBLASLt can't write an output of strides {d.strides}")
        if isinstance(plan, _Plan):
            plan.run(a.data_ptr(), b.data_ptr(), d.data_ptr(), c_ptr, bias_ptr, alpha, beta)
            return None if copied else plan
        copied = True
        if "a" in plan:
            a = a.contiguous() if plan["a"] == "dense" else a.expand(*(batch + (M, K))).contiguous()
        if "b" in plan:
            b = b.contiguous() if plan["b"] == "dense" else b.expand(*(batch + (K, N))).contiguous()
    raise AssertionError(f"matmul: no cuBLASLt layout for {batch + (M, N)}")


def _writable(d, row_major):
    """Whether cuBLASLt can write ``d`` (batch..., M, N) in place: a unit
    stride in its matrix (row-major when ``row_major``) and batch dimensions
    that collapse into one nonzero stride."""
    return (d.numel() > 0 and _blas.output_layout(*d.shape[-2:], d.strides[-2:], row_major) is not None
            and _blas.output_batch_stride(d.shape[:-2], d.strides[:-2]) is not None)


def _as_matrices(t, a_is_vector, b_is_vector):
    """A result of matmul's final shape viewed as (batch..., M, N)."""
    if b_is_vector:
        t = t.unsqueeze(-1)
    if a_is_vector:
        t = t.unsqueeze(-2)
    return t


# ------------------------------------------------------------------ matmul

def _matmul_shapes(a, b):
    if a.ndim == 0 or b.ndim == 0:
        raise ValueError(f"matmul needs operands of at least 1 dimension, got {a.ndim}-D and {b.ndim}-D")
    M, K = (1, a.shape[0]) if a.ndim == 1 else a.shape[-2:]
    K2, N = (b.shape[0], 1) if b.ndim == 1 else b.shape[-2:]
    if K != K2:
        raise ValueError(f"matmul: shapes {a.shape} and {b.shape} do not align ({K} != {K2})")
    try:
        batch = broadcast_shape(a.shape[:-2], b.shape[:-2])
    except ValueError:
        raise ValueError(f"matmul: batch dimensions of {a.shape} and {b.shape} do not broadcast") from None
    final = batch + ((M,) if a.ndim > 1 else ()) + ((N,) if b.ndim > 1 else ())
    return batch, M, N, K, final


def matmul(input, other, *, out=None):
    """Return the matrix product of ``input`` and ``other``.

    NumPy's and PyTorch's rules: a 1-D first operand is a row vector, a 1-D
    second operand a column vector (the added dimension is removed again),
    and operands of more dimensions are batches of matrices in their last two
    dimensions, the batch dimensions broadcasting. float16 and bfloat16 use
    tensor cores and accumulate in float32; float32 is full precision unless
    TF32 is allowed (:func:`tensorplay.set_float32_matmul_precision`);
    float64 accumulates in float64.

    Parameters
    ----------
    input : Tensor
        The left operand: float16, bfloat16, float32 or float64.
    other : Tensor
        The right operand, of the same dtype and device.
    out : Tensor, optional
        Write the product here (same dtype, the result's shape, any layout).

    Returns
    -------
    Tensor
        The product.

    Notes
    -----
    On CUDA tensors one cuBLASLt matmul on the current stream (loaded from
    the ``nvidia-cublas`` wheel; :class:`tensorplay.cuda.CublasUnavailableError`
    without it). Transposed and broadcast operands are passed as layouts, not
    copied; an operand with no unit stride is copied first.
    """
    a, b = input, other
    if out is None and type(a) is Tensor and type(b) is Tensor and a.is_cuda:
        key = ("mm", a.shape, a.strides, b.shape, b.strides, a._dtype_code, b._dtype_code,
               a._device_index, b._device_index, _blas.tf32_allowed(), a.data_ptr() & 15,
               b.data_ptr() & 15)
        recipe = _blas.tls_dict("recipes").get(key)
        if recipe is not None:
            return _run_recipe(recipe, a.data_ptr(), b.data_ptr())
    else:
        key = None
    _check_operands("matmul", a, b)
    batch, M, N, K, final = _matmul_shapes(a, b)
    _check_out("matmul", out, final, a.dtype)
    if a.is_cpu:
        r = np.matmul(a.numpy().astype(numpy_compute_dtype(a.dtype)), b.numpy().astype(numpy_compute_dtype(a.dtype)))
        res = out if out is not None else empty(final, dtype=a.dtype)
        cast_into(res.numpy(), np.asarray(r).reshape(final))
        return res
    d = a.dtype
    dev = a._device_index
    _cublaslt()
    _reserve_capture_workspace(dev)
    a_vec, b_vec = a.ndim == 1, b.ndim == 1
    res = out
    if out is None or not _writable(_as_matrices(out, a_vec, b_vec), False):
        res = empty_cuda(final, d, dev)
    if res.numel():
        if K == 0:
            res.zero_()
        else:
            a2 = a.unsqueeze(0) if a_vec else a
            b2 = b.unsqueeze(1) if b_vec else b
            plan = _product(a2, b2, batch, M, N, K, _as_matrices(res, a_vec, b_vec))
            if plan is not None and key is not None:
                _store(key, (final, d, dev, plan))
    if out is not None and res is not out:
        return out.copy_(res)
    return res


def mv(input, vec):
    """Return the product of the matrix ``input`` (M, K) and the vector ``vec`` (K,).

    Parameters
    ----------
    input : Tensor
        A 2-D tensor.
    vec : Tensor
        A 1-D tensor of the same dtype.

    Returns
    -------
    Tensor
        A 1-D tensor of size M; see :func:`matmul`.
    """
    a, v = input, vec
    if not (isinstance(a, Tensor) and isinstance(v, Tensor)) or a.ndim != 2 or v.ndim != 1:
        raise ValueError("mv expects a 2-D tensor and a 1-D tensor")
    return matmul(a, v)


# ------------------------------------------------------------------ addmm / linear

_GELU_C = math.sqrt(2.0 / math.pi)


def _activate_numpy(r, activation):
    if activation == "relu":
        return np.maximum(r, 0)
    if activation == "gelu":
        return 0.5 * r * (1.0 + np.tanh(_GELU_C * (r + 0.044715 * r ** 3)))
    return r


def _activate(t, activation):
    """The activation by elementwise ops (for products no epilogue covers)."""
    if activation == "relu":
        return t.relu_()
    if activation == "gelu":
        inner = (t + 0.044715 * t * t * t) * _GELU_C
        return t.mul_(inner.tanh_().add_(1.0)).mul_(0.5)
    return t


def _bias_vector(bias, N):
    """The pointer of ``bias`` when the bias epilogue can read it: N
    contiguous elements (shape (N,) or (1, N)), 16-byte aligned; else 0."""
    if bias.ndim == 0 or bias.ndim > 2 or bias.shape[-1] != N or (bias.ndim == 2 and bias.shape[0] != 1):
        return 0
    if N > 1 and bias.strides[-1] != 1:
        return 0
    p = bias.data_ptr()
    return p if p % 16 == 0 else 0


def _addmm_cuda(bias, a, b, M, N, K, beta, alpha, activation, out, shape):
    """beta * bias + alpha * (a @ b), then activation; a (M, K), b (K, N).
    Returns (result, plan-or-None): the plan when one cuBLASLt call did it
    all with no C operand (a bias epilogue, or beta 0), for callers to cache."""
    lt = _cublaslt()
    d = a.dtype
    dev = a._device_index
    _reserve_capture_workspace(dev)
    res = out if out is not None and _writable(out, True) else empty_cuda(shape, d, dev)
    if res.numel() == 0:
        return res, None
    # cuBLASLt's GELU epilogue computes its tanh in lower precision than float64
    fused = activation if not (activation == "gelu" and d is dt.float64) else None
    bias_ptr = _bias_vector(bias, N) if (beta == 1 and bias is not None and K > 0) else 0
    if bias_ptr:
        try:
            plan = _product(a, b, (), M, N, K, res, _epilogue(fused, True), bias_ptr, alpha, 0.0,
                            row_major_d=True)
            if fused != activation:
                _activate(res, activation)
                plan = None
            return res, plan
        except lt.CublasError as exc:
            if exc.status != 15:          # no algorithm with this epilogue: unfused below
                raise
    if bias is not None and beta != 0:
        res.copy_(bias.expand(M, N))
        c_beta = float(beta)
    else:
        c_beta = 0.0
    if K == 0:
        if c_beta == 0.0:
            res.zero_()
        elif c_beta != 1.0:
            res.mul_(c_beta)
        _activate(res, activation)
        return res, None
    try:
        plan = _product(a, b, (), M, N, K, res, _epilogue(fused, False), 0, alpha, c_beta)
    except lt.CublasError as exc:
        if exc.status != 15 or fused is None:
            raise
        _product(a, b, (), M, N, K, res, None, 0, alpha, c_beta)
        fused = plan = None
    if fused != activation:
        _activate(res, activation)
        plan = None
    return res, (plan if c_beta == 0.0 else None)


def addmm(input, mat1, mat2, *, beta=1, alpha=1, activation=None, out=None):
    """Return ``beta * input + alpha * (mat1 @ mat2)``, optionally activated.

    As ``torch.addmm``; ``activation`` ("relu" or "gelu") is tensorplay's
    extension, applied to the sum. With a vector ``input`` (the bias, shape
    (N,) or (1, N)) and ``beta == 1`` the bias and activation are a cuBLASLt
    epilogue of the product: one kernel, one node in a graph.

    Parameters
    ----------
    input : Tensor
        Added to the product; broadcasts to (M, N). Ignored when ``beta`` is 0.
    mat1 : Tensor
        (M, K), float16, bfloat16, float32 or float64.
    mat2 : Tensor
        (K, N), of the same dtype and device.
    beta : float, optional
        Scale of ``input`` (default 1).
    alpha : float, optional
        Scale of the product (default 1).
    activation : {None, "relu", "gelu"}, optional
        Applied last. "gelu" is the tanh approximation (cuBLASLt's GELU
        epilogue; ``torch.nn.functional.gelu(x, approximate="tanh")``).
    out : Tensor, optional
        Write the result here.

    Returns
    -------
    Tensor
        (M, N).
    """
    _check_activation("addmm", activation)
    bias, a, b = input, mat1, mat2
    if (out is None and type(a) is Tensor and type(b) is Tensor and type(bias) is Tensor and a.is_cuda
            and beta == 1):
        key = ("addmm", bias.shape, bias.strides, a.shape, a.strides, b.shape, b.strides, a._dtype_code,
               b._dtype_code, bias._dtype_code, a._device_index, b._device_index, bias._device_index,
               _blas.tf32_allowed(), activation, float(alpha), a.data_ptr() & 15, b.data_ptr() & 15,
               bias.data_ptr() & 15)
        recipe = _blas.tls_dict("recipes").get(key)
        if recipe is not None:
            return _run_recipe(recipe, a.data_ptr(), b.data_ptr(), bias.data_ptr(), float(alpha))
    else:
        key = None
    _check_operands("addmm", bias, a, b)
    if a.ndim != 2 or b.ndim != 2:
        raise ValueError(f"addmm expects 2-D matrices, got {a.ndim}-D and {b.ndim}-D")
    M, K = a.shape
    K2, N = b.shape
    if K != K2:
        raise ValueError(f"addmm: shapes {a.shape} and {b.shape} do not align ({K} != {K2})")
    try:
        broadcast_strides(bias, (M, N))
    except ValueError:
        raise ValueError(f"addmm: input of shape {bias.shape} does not broadcast to {(M, N)}") from None
    _check_out("addmm", out, (M, N), a.dtype)
    if a.is_cpu:
        cd = numpy_compute_dtype(a.dtype)
        r = float(alpha) * (a.numpy().astype(cd) @ b.numpy().astype(cd))
        if beta != 0:
            r = r + float(beta) * bias.numpy().astype(cd)
        res = out if out is not None else empty((M, N), dtype=a.dtype)
        cast_into(res.numpy(), _activate_numpy(r, activation).astype(cd))
        return res
    res, plan = _addmm_cuda(bias, a, b, M, N, K, beta, float(alpha), activation, out, (M, N))
    if plan is not None and key is not None:
        _store(key, ((M, N), a.dtype, a._device_index, plan))
    if out is not None and res is not out:
        return out.copy_(res)
    return res


def linear(input, weight, bias=None, *, activation=None):
    """Return ``input @ weight.T + bias``, optionally activated.

    As ``torch.nn.functional.linear``: ``input`` (..., in_features), ``weight``
    (out_features, in_features), ``bias`` (out_features,). The bias and
    ``activation`` (tensorplay's extension, as in :func:`addmm`) are fused into
    the cuBLASLt matmul; the transposed weight is read in place.

    Parameters
    ----------
    input : Tensor
        (..., in_features); float16, bfloat16, float32 or float64.
    weight : Tensor
        (out_features, in_features).
    bias : Tensor, optional
        (out_features,).
    activation : {None, "relu", "gelu"}, optional
        Applied last ("gelu": the tanh approximation).

    Returns
    -------
    Tensor
        (..., out_features).
    """
    _check_activation("linear", activation)
    x, w = input, weight
    if type(x) is Tensor and type(w) is Tensor and x.is_cuda and (bias is None or type(bias) is Tensor):
        key = ("linear", x.shape, x.strides, w.shape, w.strides, x._dtype_code, w._dtype_code,
               x._device_index, w._device_index, _blas.tf32_allowed(), activation, x.data_ptr() & 15,
               w.data_ptr() & 15, None if bias is None else
               (bias.shape, bias.strides, bias._dtype_code, bias._device_index, bias.data_ptr() & 15))
        recipe = _blas.tls_dict("recipes").get(key)
        if recipe is not None:
            return _run_recipe(recipe, x.data_ptr(), w.data_ptr(), 0 if bias is None else bias.data_ptr())
    else:
        key = None
    tensors = (x, w) if bias is None else (x, w, bias)
    _check_operands("linear", *tensors)
    if w.ndim != 2:
        raise ValueError(f"linear: weight must be 2-D (out_features, in_features), got {w.shape}")
    if x.ndim == 0 or x.shape[-1] != w.shape[1]:
        raise ValueError(f"linear: input of shape {x.shape} does not match weight {w.shape}")
    if bias is not None and bias.shape not in ((w.shape[0],), ()):
        raise ValueError(f"linear: bias must have shape ({w.shape[0]},), got {bias.shape}")
    shape = x.shape[:-1] + (w.shape[0],)
    x2 = x.reshape(-1, x.shape[-1])
    wt = w.transpose(0, 1)
    if x.is_cpu:
        if bias is not None:
            return addmm(bias, x2, wt, activation=activation).view(*shape)
        return _product_activated(x2, wt, activation).view(*shape)
    M, K = x2.shape
    res, plan = _addmm_cuda(bias, x2, wt, M, w.shape[0], K, 1 if bias is not None else 0, 1.0, activation,
                            None, (M, w.shape[0]))
    # cacheable when the rows were read in place (reshape made a view)
    if plan is not None and key is not None and x2.data_ptr() == x.data_ptr() and x2._storage is x._storage:
        _store(key, (shape, x.dtype, x._device_index, plan))
    return res.view(*shape)


def _product_activated(a, b, activation):
    """(a @ b), activated, on CPU tensors."""
    cd = numpy_compute_dtype(a.dtype)
    r = _activate_numpy(a.numpy().astype(cd) @ b.numpy().astype(cd), activation)
    res = empty(r.shape, dtype=a.dtype)
    cast_into(res.numpy(), r)
    return res
