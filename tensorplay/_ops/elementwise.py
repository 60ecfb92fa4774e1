# SPDX-License-Identifier: Apache-2.0
"""Elementwise operations: one description per op drives both the CUDA kernel
(generated C) and the CPU path (NumPy), so CPU results are the reference.

An op's operands are tensors or Python scalars (weak types, passed to the
kernel as arguments, never materialised as tensors). Results follow PyTorch's
type promotion; half types compute in float32.
"""

from __future__ import annotations

import numbers

import numpy as np

from tensorplay import _dtypes as dt
from tensorplay._tensor.args import broadcast_shape, broadcast_strides, cast_into
from tensorplay._tensor.creation import empty
from tensorplay._tensor.tensor import Tensor, as_source, empty_cuda, host_to_cuda, is_literal
from tensorplay._tensor.base import plan_key as _plan_key
from tensorplay._kernels import cache as _kernels
from tensorplay._kernels import codegen as _codegen
from tensorplay._ops.promotion import can_cast, result_type

# ------------------------------------------------------------------ C helpers

def _f(name, c):
    """The C math function for compute type ``c`` (expf for float, exp for double)."""
    return name + "f" if c == "float" else name


def _is_float_c(c):
    return c in ("float", "double")


def _nan_extreme(cmp):
    """maximum (cmp '>') / minimum (cmp '<'), propagating NaN as PyTorch does."""
    def gen(c, x, y):
        pick = f"(({x}) {cmp} ({y}) ? ({x}) : ({y}))"
        if _is_float_c(c):
            return f"(({x}) != ({x}) ? ({x}) : (({y}) != ({y}) ? ({y}) : {pick}))"
        return pick
    return gen


def _floordiv(c, x, y):
    if _is_float_c(c):
        return f"tp_ffloordiv<{c}>({x}, {y})"
    return f"tp_floordiv<{c}>({x}, {y})"


def _remainder(c, x, y):
    if _is_float_c(c):
        return f"tp_fremainder<{c}>({x}, {y})"
    return f"tp_remainder<{c}>({x}, {y})"


def _pow(c, x, y):
    if _is_float_c(c):
        return f"{_f('pow', c)}({x}, {y})"
    return f"tp_ipow<{c}>({x}, {y})"


OPS_PREAMBLE = r"""
template <class T> __device__ __forceinline__ T tp_floordiv(T a, T b) {
  if (b == 0) return 0;
  T q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) q -= 1;
  return q;
}
template <class T> __device__ __forceinline__ T tp_remainder(T a, T b) {
  if (b == 0) return 0;
  T r = a % b;
  if (r != 0 && ((r < 0) != (b < 0))) r += b;
  return r;
}
// Python's float floor division (NumPy's npy_divmod): exact where floor(a / b) is not
template <class T> __device__ __forceinline__ T tp_ffloordiv(T a, T b) {
  if (b == 0) return a / b;
  T mod = fmod(a, b);
  T div = (a - mod) / b;
  if (mod != 0 && ((b < 0) != (mod < 0))) div -= 1;
  if (div != 0) {
    T fl = floor(div);
    if (div - fl > (T)0.5) fl += 1;
    return fl;
  }
  return copysign((T)0, a / b);
}
template <class T> __device__ __forceinline__ T tp_fremainder(T a, T b) {
  T r = fmod(a, b);
  if (r != 0 && ((r < 0) != (b < 0))) r += b;
  return r;
}
template <class T> __device__ __forceinline__ T tp_ipow(T base, T e) {
  if (e < 0) return (base == 1) ? 1 : ((base == -1) ? ((e % 2) ? -1 : 1) : 0);
  T r = 1;
  while (e) { if (e & 1) r *= base; base *= base; e >>= 1; }
  return r;
}
"""

# ------------------------------------------------------------------ op table
# rule: how the result dtype follows the operands
#   arith      result_type(operands)
#   true_div   result_type, integers and bool -> default float
#   compare    bool result, computed in result_type(operands)
#   logical    bool result and computation
#   bitwise    result_type; integers and bool only
#   float      input float dtype, else default float
#   same       input dtype
#   predicate  bool result, computed in the input's type

OPS = {
    # binary
    "add": ("arith", lambda c, x, y: f"({x}) + ({y})", np.add),
    "sub": ("arith", lambda c, x, y: f"({x}) - ({y})", np.subtract),
    "mul": ("arith", lambda c, x, y: f"({x}) * ({y})", np.multiply),
    "div": ("true_div", lambda c, x, y: f"({x}) / ({y})", np.true_divide),
    "floor_divide": ("arith", _floordiv, np.floor_divide),
    "remainder": ("arith", _remainder, np.remainder),
    "pow": ("arith", _pow, np.power),
    "maximum": ("arith", _nan_extreme(">"), np.maximum),
    "minimum": ("arith", _nan_extreme("<"), np.minimum),
    "eq": ("compare", lambda c, x, y: f"({x}) == ({y})", np.equal),
    "ne": ("compare", lambda c, x, y: f"({x}) != ({y})", np.not_equal),
    "lt": ("compare", lambda c, x, y: f"({x}) < ({y})", np.less),
    "le": ("compare", lambda c, x, y: f"({x}) <= ({y})", np.less_equal),
    "gt": ("compare", lambda c, x, y: f"({x}) > ({y})", np.greater),
    "ge": ("compare", lambda c, x, y: f"({x}) >= ({y})", np.greater_equal),
    "logical_and": ("logical", lambda c, x, y: f"(({x}) != 0) && (({y}) != 0)", np.logical_and),
    "logical_or": ("logical", lambda c, x, y: f"(({x}) != 0) || (({y}) != 0)", np.logical_or),
    "logical_xor": ("logical", lambda c, x, y: f"(({x}) != 0) != (({y}) != 0)", np.logical_xor),
    "bitwise_and": ("bitwise", lambda c, x, y: f"({x}) & ({y})", np.bitwise_and),
    "bitwise_or": ("bitwise", lambda c, x, y: f"({x}) | ({y})", np.bitwise_or),
    "bitwise_xor": ("bitwise", lambda c, x, y: f"({x}) ^ ({y})", np.bitwise_xor),
    # unary
    "neg": ("same", lambda c, x: f"-({x})", np.negative),
    "abs": ("same", lambda c, x: f"(({x}) < 0 ? -({x}) : ({x}))", np.abs),
    "exp": ("float", lambda c, x: f"{_f('exp', c)}({x})", np.exp),
    "log": ("float", lambda c, x: f"{_f('log', c)}({x})", np.log),
    "log1p": ("float", lambda c, x: f"{_f('log1p', c)}({x})", np.log1p),
    "expm1": ("float", lambda c, x: f"{_f('expm1', c)}({x})", np.expm1),
    "sqrt": ("float", lambda c, x: f"{_f('sqrt', c)}({x})", np.sqrt),
    "rsqrt": ("float", lambda c, x: f"{_f('rsqrt', c)}({x})", lambda a: 1 / np.sqrt(a)),
    "sin": ("float", lambda c, x: f"{_f('sin', c)}({x})", np.sin),
    "cos": ("float", lambda c, x: f"{_f('cos', c)}({x})", np.cos),
    "tanh": ("float", lambda c, x: f"{_f('tanh', c)}({x})", np.tanh),
    "sigmoid": ("float", lambda c, x: f"(({c})1 / (({c})1 + {_f('exp', c)}(-({x}))))",
                lambda a: 1 / (1 + np.exp(-a))),
    "relu": ("same", lambda c, x: f"((({x}) != ({x}) || ({x}) > 0) ? ({x}) : ({c})0)",
             lambda a: np.where(np.isnan(a) | (a > 0), a, 0).astype(a.dtype) if a.dtype.kind == "f"
             else np.maximum(a, 0)),
    "floor": ("same", lambda c, x: f"{_f('floor', c)}({x})" if _is_float_c(c) else x, np.floor),
    "ceil": ("same", lambda c, x: f"{_f('ceil', c)}({x})" if _is_float_c(c) else x, np.ceil),
    "round": ("same", lambda c, x: f"{_f('rint', c)}({x})" if _is_float_c(c) else x, np.round),
    "sign": ("same", lambda c, x: (f"(({x}) != ({x}) ? ({x}) : ({c})((({x}) > 0) - (({x}) < 0)))"
                                   if _is_float_c(c) else f"({c})((({x}) > 0) - (({x}) < 0))"), np.sign),
    "isnan": ("predicate", lambda c, x: f"(({x}) != ({x}))", np.isnan),
    "isinf": ("predicate", lambda c, x: f"isinf({x})" if _is_float_c(c) else "false", np.isinf),
    "isfinite": ("predicate", lambda c, x: f"isfinite({x})" if _is_float_c(c) else "true", np.isfinite),
    "logical_not": ("logical", lambda c, x: f"!(({x}) != 0)", np.logical_not),
    "bitwise_not": ("bitwise", lambda c, x: f"~({x})" if c != "bool" else f"!({x})", np.invert),
}


def numpy_compute_dtype(d):
    """The NumPy dtype the CPU path computes dtype ``d`` in (float32 for the half types)."""
    return np.float32 if d in (dt.float16, dt.bfloat16) else d.numpy_dtype


def _dtypes_for(op, rule, operands):
    """(result dtype, compute dtype) of ``op`` over ``operands``."""
    r = result_type(*operands)
    if rule == "arith":
        if op == "sub" and r is dt.bool_:
            raise TypeError("subtracting bool tensors is not supported; use logical_xor() or ^")
        if op == "neg" and r is dt.bool_:
            raise TypeError("negating a bool tensor is not supported; use logical_not() or ~")
        return r, r
    if rule == "same":
        if op == "neg" and r is dt.bool_:
            raise TypeError("negating a bool tensor is not supported; use logical_not() or ~")
        return r, r
    if rule == "true_div":
        r = r if r.kind == "f" else dt.default_float
        return r, r
    if rule == "float":
        r = r if r.kind == "f" else dt.default_float
        return r, r
    if rule == "compare":
        return dt.bool_, r
    if rule == "predicate":
        return dt.bool_, r
    if rule == "logical":
        return dt.bool_, dt.bool_
    if rule == "bitwise":
        if r.kind == "f":
            raise TypeError(f"{op} is only defined for integer and bool tensors, not {r.name}")
        return r, r
    raise AssertionError(rule)


def _check_operand(x):
    if isinstance(x, Tensor):
        return x
    if isinstance(x, (bool, numbers.Real, np.generic)) and not isinstance(x, np.ndarray):
        if isinstance(x, np.generic):
            x = x.item()
        return x
    if isinstance(x, (list, tuple, np.ndarray)):
        return as_source(x)
    raise TypeError(f"unsupported operand type {type(x).__name__}; expected a Tensor or a real number")


def _operand_device(operands, given):
    """The device of an op over checked ``operands`` (``given``: as passed):
    host data given as a list, tuple or NumPy array (not a CPU tensor) takes
    the device of the tensor operands (see _host_data_to)."""
    tensors = [x for x, g in zip(operands, given) if isinstance(g, Tensor)]
    return _device_of(tensors) if tensors else -1


def _host_data_to(device, operands, given):
    """Copy the host-data operands (as _operand_device tells them) to CUDA
    ``device``, in place in ``operands``, once every check has passed, by
    the host-data rule of copy_: lists and tuples up to
    PARAM_UPLOAD_MAX_BYTES inside kernel parameters, so a capture can hold
    them; NumPy arrays as CPU tensors are (read at every replay from pinned
    memory, refused inside a capture from pageable memory). 0-d host data
    stays a scalar argument."""
    for k, (x, g) in enumerate(zip(operands, given)):
        if isinstance(x, Tensor) and not isinstance(g, Tensor) and x.ndim:
            operands[k] = host_to_cuda(x, device, is_literal(g))


def _device_of(tensors):
    devs = {t._device_index for t in tensors}
    if len(devs) > 1:
        # 0-dim CPU tensors combine with any device, as in PyTorch
        non_scalar = {t._device_index for t in tensors if not (t.is_cpu and t.ndim == 0)}
        if len(non_scalar) > 1:
            names = sorted(str(t.device) for t in tensors)
            raise ValueError(f"expected all tensors on one device, got {', '.join(names)}")
        return non_scalar.pop()
    return devs.pop()


def _prepare_out(out, shape, result, device, op):
    if out is None:
        return empty(shape, dtype=result, device="cpu" if device < 0 else f"cuda:{device}")
    if not isinstance(out, Tensor):
        raise TypeError(f"out must be a Tensor, got {type(out).__name__}")
    if out.shape != tuple(shape):
        raise ValueError(f"{op}: out has shape {out.shape}, the result has shape {tuple(shape)}")
    if out._device_index != device:
        raise ValueError(f"{op}: out is on {out.device}, the operands on "
                         f"{'cpu' if device < 0 else f'cuda:{device}'}")
    if not can_cast(result, out.dtype):
        raise TypeError(f"{op}: result type {result.name} can't be cast to the out dtype {out.dtype.name}")
    return out


# Plans of CUDA calls seen before (ElementwisePlans in the library's one plan
# cache), keyed by op and the operands' dtypes, shapes, strides and scalar
# types: a repeated call skips promotion, broadcasting and geometry, and only
# packs pointers and scalars.
# (_plan_key, compiled: the op, in-place flag and one bytes object of the
# operands' scalar types and CUDA tensors' dtype, device, shape and strides)
_get_plan = _kernels.plans.get
_put_plan = _kernels.plans.put


def _run_plan(plan, operands, out):
    """Launch ElementwisePlan ``plan`` over ``operands`` into ``out`` (allocated when None)."""
    if out is None:
        out = empty_cuda(plan.shape, plan.dtype, plan.device)
    plan.launch_plan.launch_operands(out, operands, plan.tensor_pos, plan.scalar_pos)
    return out


def apply(op, *operands, out=None, _inplace=False):
    """Run elementwise ``op`` over tensor/scalar ``operands``."""
    key = _plan_key(op, operands, out, _inplace)
    if key is not None:
        plan = _get_plan(key)
        if plan is not None:
            return _run_plan(plan, operands, out)
    rule, cgen, npfn = OPS[op]
    given = operands
    operands = [_check_operand(x) for x in operands]
    tensors = [x for x in operands if isinstance(x, Tensor)]
    if not tensors:
        raise TypeError(f"{op} needs at least one tensor operand")
    result, compute = _dtypes_for(op, rule, operands)
    shape = ()
    for t in tensors:
        shape = broadcast_shape(shape, t.shape)
    device = _operand_device(operands, given)
    if _inplace:
        if not can_cast(result, out.dtype):
            raise TypeError(f"{op}_: result type {result.name} can't be cast to the tensor's dtype "
                            f"{out.dtype.name}")
        if shape != out.shape:
            raise ValueError(f"{op}_: the result shape {shape} does not match the tensor's shape {out.shape}")
    out = _prepare_out(out, shape, result, device, op)
    if out.numel() == 0:
        return out
    if device < 0:
        return _apply_cpu(npfn, operands, compute, out)
    _host_data_to(device, operands, given)
    launch = _apply_cuda(op, cgen, operands, compute, out, device)
    if key is not None:
        tensor_pos = [k for k, x in enumerate(operands) if isinstance(x, Tensor)]
        scalar_pos = [k for k, x in enumerate(operands) if not isinstance(x, Tensor)]
        kinds = ["f" if compute.kind == "f" else "i"] * len(scalar_pos)
        _put_plan(key, _kernels.ElementwisePlan(out.dtype, out.shape, device, launch, tensor_pos,
                                                scalar_pos, kinds))
    return out


def _apply_cpu(npfn, operands, compute, out):
    cd = numpy_compute_dtype(compute)
    # silent as on the GPU: an integer zero divisor gives 0, a scalar past
    # the compute type's range wraps or becomes ±inf
    with np.errstate(all="ignore"):
        args = [x.numpy().astype(cd, copy=False) if isinstance(x, Tensor) else np.asarray(x).astype(cd)
                for x in operands]
        try:
            r = npfn(*args)
        except TypeError:
            if cd != np.bool_:
                raise
            r = npfn(*[a.astype(np.int8) for a in args])   # NumPy lacks some bool loops (sign)
    cast_into(out.numpy(), r)
    return out


def _apply_cuda(op, cgen, operands, compute, out, device):
    c = _codegen.compute_ctype(compute)
    ins, in_strides, scalars, kinds, names = [], [], [], [], []
    shape = out.shape
    for x in operands:
        if isinstance(x, Tensor):
            if x.is_cpu:          # a 0-dim CPU tensor: a scalar argument
                x = x.item()
            else:
                names.append(f"(({c})a{len(ins)})")
                ins.append(x)
                in_strides.append(broadcast_strides(x, shape))
                continue
        if compute.kind == "f":
            kinds.append("f")
            scalars.append(float(x))
        else:
            kinds.append("i")
            scalars.append(int(x))
        names.append(f"(({c})s{len(scalars) - 1})")
    expr = cgen(c, *names)
    key = (op, compute.code, tuple(isinstance(x, Tensor) and not x.is_cpu for x in operands))
    return _kernels.launch_elementwise(key, expr, out, ins, in_strides, scalars, kinds, OPS_PREAMBLE)


# ------------------------------------------------------------------ where / clamp

def where(condition, input, other, *, out=None):
    """Choose elements of ``input`` where ``condition`` is true, else of ``other``.

    The three operands broadcast together; the result dtype is
    :func:`result_type` of ``input`` and ``other``.

    Parameters
    ----------
    condition : Tensor
        Where to take ``input`` (nonzero is true).
    input : Tensor or number
        The values where ``condition`` is true.
    other : Tensor or number
        The values elsewhere.
    out : Tensor, optional
        Write the result here (the broadcast shape).

    Returns
    -------
    Tensor
        The chosen values.

    Notes
    -----
    On CUDA tensors this launches one generated NVRTC kernel on the current
    stream (cuLaunchKernel).
    """
    given = (condition, input, other)
    operands = [_check_operand(v) for v in given]
    if not isinstance(operands[0], Tensor):
        raise TypeError("where: condition must be a tensor")
    result = result_type(operands[1], operands[2])
    tensors = [t for t in operands if isinstance(t, Tensor)]
    shape = ()
    for t in tensors:
        shape = broadcast_shape(shape, t.shape)
    device = _operand_device(operands, given)
    out = _prepare_out(out, shape, result, device, "where")
    if out.numel() == 0:
        return out
    if device >= 0:
        _host_data_to(device, operands, given)
    condition, x, y = operands
    if device < 0:
        cd = numpy_compute_dtype(result)
        with np.errstate(all="ignore"):
            vals = [np.asarray(v.numpy() if isinstance(v, Tensor) else v).astype(cd) for v in (x, y)]
        cast_into(out.numpy(), np.where(condition.numpy().astype(bool), *vals))
        return out
    c = _codegen.compute_ctype(result)
    ins, strides, scalars, kinds, names = [], [], [], [], []
    shape = out.shape
    for k, v in enumerate((condition, x, y)):
        if isinstance(v, Tensor) and v.is_cuda:
            names.append(f"a{len(ins)}" if k == 0 else f"(({c})a{len(ins)})")
            ins.append(v)
            strides.append(broadcast_strides(v, shape))
        else:
            v = v.item() if isinstance(v, Tensor) else v
            kinds.append("f" if result.kind == "f" else "i")
            scalars.append(float(v) if result.kind == "f" else int(v))
            names.append(f"(({c})s{len(scalars) - 1})")
    expr = f"(({names[0]}) != 0) ? ({names[1]}) : ({names[2]})"
    key = ("where", result.code, tuple(isinstance(v, Tensor) and v.is_cuda for v in (condition, x, y)))
    _kernels.launch_elementwise(key, expr, out, ins, strides, scalars, kinds)
    return out


def clamp(input, min=None, max=None, *, out=None):
    """Limit the elements of ``input`` to the range [``min``, ``max``].

    As ``torch.clamp``: NaN stays NaN, and with ``min > max`` every element
    becomes ``max``.

    Parameters
    ----------
    input : Tensor
        The values.
    min : Tensor, number or None, optional
        The lower bound (broadcast); None for none.
    max : Tensor, number or None, optional
        The upper bound (broadcast); None for none.
    out : Tensor, optional
        Write the result here.

    Returns
    -------
    Tensor
        The clamped values.

    Raises
    ------
    ValueError
        If both bounds are None.
    """
    x = input
    if min is None and max is None:
        raise ValueError("clamp needs min, max or both")
    r = x
    if min is not None:
        r = apply("maximum", r, min, out=out if max is None else None)
    if max is not None:
        r = apply("minimum", r, max, out=out)
    return r


# ------------------------------------------------------------------ isclose / allclose

def isclose(input, other, rtol=1e-05, atol=1e-08, equal_nan=False):
    """Test which elements of ``input`` are close to those of ``other``.

    As ``torch.isclose``: ``|input - other| <= atol + rtol * |other|``,
    elementwise, or equal (infinities of one sign are close to each other
    only); NaN is close to NaN only with ``equal_nan``. The operands
    broadcast together and must have one dtype; bool operands compare as
    float32.

    Parameters
    ----------
    input : Tensor
        The first operand.
    other : Tensor
        The second operand, of ``input``'s dtype.
    rtol : float, optional
        The relative tolerance, at least 0.
    atol : float, optional
        The absolute tolerance, at least 0.
    equal_nan : bool, optional
        Count two NaNs as close.

    Returns
    -------
    Tensor
        A bool tensor of the broadcast shape.

    Raises
    ------
    TypeError
        If an operand is not a tensor or the dtypes differ.
    ValueError
        For a negative tolerance.

    Notes
    -----
    On CUDA tensors this launches a few generated elementwise kernels on the
    current stream (no host read: a CUDA graph can capture it).
    """
    if not isinstance(input, Tensor) or not isinstance(other, Tensor):
        raise TypeError("isclose expects two tensors")
    if input.dtype is not other.dtype:
        raise TypeError(f"isclose: expected both tensors to have one dtype, got {input.dtype.name} and "
                        f"{other.dtype.name}")
    if rtol < 0 or atol < 0:
        raise ValueError(f"isclose: the tolerances must be non-negative, got rtol={rtol} and atol={atol}")
    close = apply("eq", input, other)
    if equal_nan and input.dtype.kind == "f":
        close = apply("logical_or", close, apply("logical_and", apply("isnan", input), apply("isnan", other)))
    if rtol == 0 and atol == 0:
        return close
    a, b = input, other
    if a.dtype is dt.bool_:
        a, b = a.to(dt.default_float), b.to(dt.default_float)
    allowed = apply("add", apply("abs", apply("mul", b, rtol)), atol)
    actual = apply("abs", apply("sub", a, b))
    within = apply("logical_and", apply("isfinite", actual), apply("le", actual, allowed))
    return apply("logical_or", close, within)


def allclose(input, other, rtol=1e-05, atol=1e-08, equal_nan=False):
    """Test whether every element of ``input`` is close to ``other``'s.

    ``isclose(...).all()`` as a Python bool, as ``torch.allclose``; see
    :func:`isclose` for the test.

    Parameters
    ----------
    input : Tensor
        The first operand.
    other : Tensor
        The second operand, of ``input``'s dtype.
    rtol : float, optional
        The relative tolerance, at least 0.
    atol : float, optional
        The absolute tolerance, at least 0.
    equal_nan : bool, optional
        Count two NaNs as close.

    Returns
    -------
    bool
        True when every element is close.

    Notes
    -----
    On CUDA tensors the answer is read to the host, which waits for the
    current stream: it cannot be captured in a CUDA graph (use
    :func:`isclose` and ``all()`` there, which stay on the device).
    """
    from_isclose = isclose(input, other, rtol, atol, equal_nan)
    return bool(from_isclose.all().item())


# ------------------------------------------------------------------ tril / triu

_TRI_DOC = """Return the {which} triangular part of the matrices in ``input``; the other elements are zero.

As ``torch.{name}``: the elements on and {side} diagonal ``diagonal`` of
each matrix (the last two dimensions) are kept. Diagonal 0 is the main
diagonal, a positive one lies above it, a negative one below.

Parameters
----------
input : Tensor
    A tensor of at least 2 dimensions.
diagonal : int, optional
    Which diagonal bounds the kept part; default 0.
out : Tensor, optional
    Write the result here (``input``'s shape; a dtype it can be cast to).

Returns
-------
Tensor
    The result, ``input``'s shape and dtype.

Raises
------
ValueError
    If ``input`` has fewer than 2 dimensions.

Notes
-----
On CUDA tensors this launches one generated NVRTC kernel on the current
stream (cuLaunchKernel).
"""


def _triangle(name, keep, input, diagonal, out):
    if not isinstance(input, Tensor):
        raise TypeError(f"{name} expects a Tensor, got {type(input).__name__}")
    if input.ndim < 2:
        raise ValueError(f"{name}: the input must have at least 2 dimensions, it has {input.ndim}")
    if isinstance(diagonal, bool) or not isinstance(diagonal, numbers.Integral):
        raise TypeError(f"{name}: diagonal must be an int, got {type(diagonal).__name__}")
    out = _prepare_out(out, input.shape, input.dtype, input._device_index, name)
    if out.numel() == 0:
        return out
    rows, cols = input.shape[-2], input.shape[-1]
    if input.is_cpu:
        fn = np.tril if keep == "<=" else np.triu
        cast_into(out.numpy(), fn(input.numpy(), int(diagonal)))
        return out
    c = _codegen.compute_ctype(input.dtype)
    expr = f"(((i % s0) - ((i / s0) % s1)) {keep} s2) ? a0 : (({c})0)"
    _kernels.launch_elementwise((name,), expr, out, (input,), (input.strides,), (cols, rows, int(diagonal)),
                                ("i", "i", "i"))
    return out


def tril(input, diagonal=0, *, out=None):
    return _triangle("tril", "<=", input, diagonal, out)


def triu(input, diagonal=0, *, out=None):
    return _triangle("triu", ">=", input, diagonal, out)


tril.__doc__ = _TRI_DOC.format(which="lower", name="tril", side="below")
triu.__doc__ = _TRI_DOC.format(which="upper", name="triu", side="above")
