# SPDX-License-Identifier: Apache-2.0
"""Random tensors: rand, randn, randint and their ``_like`` forms, Bernoulli
draws, dropout, and the in-place methods (``uniform_``, ``normal_``,
``bernoulli_``, ``exponential_``, ``random_``).

Each op draws from one generator (``generator=``, else the device's
default) at its current offset and advances the offset by one (see
``tensorplay._kernels.philox`` for the layout). The CPU path is NumPy over
the same Philox stream and the same exact arithmetic as the CUDA kernels,
so both give the same bits for the same seed. Elements are numbered in
row-major order of the shape, whatever the strides.
"""

from __future__ import annotations

import math
import numbers

import numpy as np

from tensorplay import _dtypes as dt
from tensorplay._kernels import random_kernels as _rk
from tensorplay._kernels import philox as _philox
from tensorplay._random.generator import cpu_seed_and_offset, cuda_state_ptr, generator_for
from tensorplay._tensor.args import cast_into, overlaps, parse_size, resolve_device, resolve_dtype
from tensorplay._tensor.creation import empty, like_dtype_device
from tensorplay._tensor.tensor import Tensor, copy_into, empty_cuda

__all__ = ["rand", "randn", "randint", "rand_like", "randn_like", "randint_like", "bernoulli", "dropout",
           "uniform_", "normal_", "bernoulli_", "exponential_", "random_", "tensor_bernoulli", "TENSOR_METHODS"]

# the largest finite value of each floating dtype (bfloat16's written out: older ml_dtypes
# builds make np.finfo refuse it)
_FLOAT_MAX = {"float16": 65504.0, "bfloat16": float.fromhex("0x1.fep127"),
              "float32": float(np.finfo(np.float32).max), "float64": float(np.finfo(np.float64).max)}
# integers [-2**digits, 2**digits] are exact in each floating dtype
_FLOAT_DIGITS = {"float16": 11, "bfloat16": 8, "float32": 24, "float64": 53}


def _numpy_compute(d):
    return np.float64 if d is dt.float64 else np.float32


def _require_floating(d, what):
    if d.kind != "f":
        raise TypeError(f"{what}: expected a floating dtype (float16, bfloat16, float32, float64), got {d.name}")


def _real(x, name, what):
    if isinstance(x, Tensor):
        if x.numel() != 1:
            raise TypeError(f"{what}: {name} must be a number, got a tensor of shape {x.shape}")
        x = x.item()
    if isinstance(x, (bool, np.bool_)) or not isinstance(x, numbers.Real):
        raise TypeError(f"{what}: {name} must be a real number, got {type(x).__name__}")
    return float(x)


def _int(x, name, what):
    if isinstance(x, (bool, np.bool_)) or not isinstance(x, numbers.Integral):
        raise TypeError(f"{what}: {name} must be an int, got {type(x).__name__}")
    return int(x)


def _flat_input(t, shape, compute):
    """``t`` broadcast to ``shape`` as a flat host array in ``compute`` (CPU path)."""
    return np.broadcast_to(t.numpy(), shape).reshape(-1).astype(compute)


def _fill(t, op, scalars, generator, what, inp=None, mode=None):
    """Fill ``t`` (any layout) with random op ``op``'s values; return ``t``.

    ``inp`` is a tensor on ``t``'s device broadcastable to its shape
    (Bernoulli's probabilities, dropout's values)."""
    dev = t._device_index
    if t.numel() == 0:
        if generator is not None:
            generator_for(generator, dev, what)
        return t
    gen = generator_for(generator, dev, what)
    variant = inp.dtype if op == "bernoulli_tensor" else mode
    if dev < 0:
        seed, offset = cpu_seed_and_offset(gen)
        host_in = None
        if inp is not None:
            host_in = _flat_input(inp, t.shape, _numpy_compute(inp.dtype))
        vals = _philox.values(op, t.dtype.name, seed, offset, t.numel(), scalars, host_in, mode)
        cast_into(t.numpy(), vals.reshape(t.shape))
        return t
    target = t if t.is_contiguous() else empty_cuda(t.shape, t.dtype, dev)
    if inp is not None:
        if inp.shape != t.shape:
            inp = inp.expand(t.shape)
        inp = inp.contiguous()
        if overlaps(target, inp):         # a shifted view of the output: thread i would read what i+1 writes
            inp = inp.clone()
    _rk.launch(op, target, cuda_state_ptr(gen), scalars, inp, variant)
    if target is not t:
        copy_into(t, target)
    return t


def _check_generator(generator, device, what):
    """Refuse a wrong ``generator=`` before anything is allocated."""
    if generator is not None:
        generator_for(generator, resolve_device(device), what)


def _check_same_device(a, b, what):
    if a._device_index != b._device_index:
        raise ValueError(f"{what}: expected tensors on one device, got {a.device} and {b.device}")


# ------------------------------------------------------------------ in place

def uniform_(self, from_=0, to=1, *, generator=None):
    """Fill this tensor with uniform values in [``from_``, ``to``), in place; return it.

    ``from_ + (to - from_) * u`` with ``u`` in [0, 1) exactly representable
    in the dtype (24 random bits for float32, 11 float16, 8 bfloat16, 53
    float64), computed in float32 (float64 for float64) without fused
    multiply-adds, then rounded to the dtype: for float16 and bfloat16 a
    value may round up to ``to``, as in PyTorch.

    Parameters
    ----------
    from_ : float, optional
        The lower bound (PyTorch's ``from``).
    to : float, optional
        The upper bound.
    generator : Generator, optional
        Draw from this generator (on the tensor's device); default the
        device's default generator.

    Returns
    -------
    Tensor
        ``self``.

    Raises
    ------
    TypeError
        For a non-floating tensor.
    ValueError
        When ``from_ > to``, a bound is not finite or ``to - from_``
        exceeds the dtype's range.
    """
    what = "uniform_"
    _require_floating(self.dtype, what)
    low, high = _real(from_, "from", what), _real(to, "to", what)
    if not (math.isfinite(low) and math.isfinite(high)):
        raise ValueError(f"{what}: from and to must be finite, got from={low}, to={high}")
    if low > high:
        raise ValueError(f"{what} expects to return a [from, to) range, but found from={low} > to={high}")
    span = high - low
    if span > _FLOAT_MAX[self.dtype.name]:
        raise ValueError(f"{what}: to - from = {span} exceeds the largest {self.dtype.name}")
    return _fill(self, "uniform", (low, span), generator, what)


def normal_(self, mean=0, std=1, *, generator=None):
    """Fill this tensor with normal values of mean ``mean`` and standard deviation ``std``, in place.

    Box-Muller over pairs of 32-bit draws, with a logarithm, sine and cosine
    made of correctly rounded operations only, so CPU and CUDA give the
    same bits: ``z * std + mean`` in float32 (float64 for float64), then
    rounded to the dtype.

    Parameters
    ----------
    mean : float, optional
        The mean.
    std : float, optional
        The standard deviation, non-negative.
    generator : Generator, optional
        Draw from this generator (on the tensor's device).

    Returns
    -------
    Tensor
        ``self``.

    Raises
    ------
    TypeError
        For a non-floating tensor.
    ValueError
        For a negative or non-finite ``std``, or a non-finite ``mean``.
    """
    what = "normal_"
    _require_floating(self.dtype, what)
    m, s = _real(mean, "mean", what), _real(std, "std", what)
    if not math.isfinite(m) or not math.isfinite(s):
        raise ValueError(f"{what}: mean and std must be finite, got mean={m}, std={s}")
    if s < 0:
        raise ValueError(f"{what} expects std >= 0.0, but found std {s}")
    return _fill(self, "normal", (m, s), generator, what)


def exponential_(self, lambd=1, *, generator=None):
    """Fill this tensor with exponential values of rate ``lambd``, in place; return it.

    ``(-1 / lambd) * log(u)`` with ``u`` in (0, 1] (24 random bits, 53
    for float64) and the exactly rounded logarithm of :meth:`normal_`;
    ``log(1)`` counts as minus half a step of ``u``'s grid, and values
    below the dtype's smallest positive one become it, so that, as in
    PyTorch, no value is 0.

    Parameters
    ----------
    lambd : float, optional
        The rate, positive.
    generator : Generator, optional
        Draw from this generator (on the tensor's device).

    Returns
    -------
    Tensor
        ``self``.

    Raises
    ------
    TypeError
        For a non-floating tensor.
    ValueError
        For ``lambd <= 0`` (or not finite).
    """
    what = "exponential_"
    _require_floating(self.dtype, what)
    lam = _real(lambd, "lambd", what)
    if not (lam > 0 and math.isfinite(lam)):
        raise ValueError(f"{what} expects lambda > 0.0 (and finite), but found lambda={lam}")
    return _fill(self, "exponential", (lam,), generator, what)


def bernoulli_(self, p=0.5, *, generator=None):
    """Fill this tensor with 0 and 1, 1 with probability ``p``, in place; return it.

    Element ``i`` is 1 when ``w * 2**-32 < p[i]`` for its 32-bit draw ``w``
    (in float64), so ``p`` is resolved to 2**-32.

    Parameters
    ----------
    p : float or Tensor, optional
        The probability, or a floating tensor of probabilities on this
        tensor's device broadcastable to its shape (values below 0 act as 0,
        above 1 as 1: they are not checked, which would need a host read).
    generator : Generator, optional
        Draw from this generator (on the tensor's device).

    Returns
    -------
    Tensor
        ``self`` (any dtype).

    Raises
    ------
    ValueError
        For a number ``p`` outside [0, 1], or ``p`` on another device or not
        broadcastable.
    TypeError
        For a non-floating tensor ``p``.
    """
    what = "bernoulli_"
    if isinstance(p, Tensor):
        _require_floating(p.dtype, f"{what}: p")
        _check_same_device(self, p, what)
        try:
            np.broadcast_shapes(p.shape, self.shape)
        except ValueError:
            raise ValueError(f"{what}: p of shape {p.shape} does not broadcast to {self.shape}") from None
        if np.broadcast_shapes(p.shape, self.shape) != self.shape:
            raise ValueError(f"{what}: p of shape {p.shape} does not broadcast to {self.shape}")
        return _fill(self, "bernoulli_tensor", (), generator, what, inp=p)
    prob = _real(p, "p", what)
    if not 0.0 <= prob <= 1.0:
        raise ValueError(f"{what} expects p to be in [0, 1], but got p={prob}")
    return _fill(self, "bernoulli", (prob,), generator, what)


def _int_range(d):
    """[lowest, highest] integer values of dtype ``d`` that ``random_`` draws from."""
    if d.kind == "b":
        return 0, 1
    if d.kind == "f":
        k = _FLOAT_DIGITS[d.name]
        return -(1 << k), 1 << k
    info = np.iinfo(d.numpy_dtype)
    return int(info.min), int(info.max)


def _integers(t, low, high, generator, what):
    """Fill ``t`` with integers in [low, high) (``high`` may be the dtype's max + 1)."""
    lo_ok, hi_ok = _int_range(t.dtype)
    if low >= high:
        raise ValueError(f"{what} expects 'from' to be less than 'to', but got from={low} >= to={high}")
    if low < lo_ok or high - 1 > hi_ok:
        raise ValueError(f"{what}: [{low}, {high}) is outside the values {t.dtype.name} holds exactly "
                         f"([{lo_ok}, {hi_ok}])")
    span = high - low
    mode = _philox.integer_mode(span)
    span_arg = span - (1 << 64) if span >= (1 << 63) else span     # two's complement, long long slot
    if mode == "full":
        span_arg = 0
    return _fill(t, "random", (low, span_arg), generator, what, mode=mode)


_MISSING = object()


def random_(self, *args, generator=None, **kwargs):
    """Fill this tensor with integers drawn uniformly, in place; return it.

    As PyTorch: ``random_(to)`` draws from [0, ``to``), ``random_(from_,
    to)`` from [``from_``, ``to``), ``random_(from_, None)`` from
    [``from_``, the dtype's largest], and ``random_()`` from [0, the dtype's
    largest] for integer dtypes, [0, 2**digits] for floating ones (every
    such integer is exact: 2**24 for float32, 2**11 float16, 2**8 bfloat16,
    2**53 float64), {0, 1} for bool.

    A span below 2**32 values takes one 32-bit draw per element, ``(w *
    span) >> 32``; a larger one a 64-bit draw, ``(w * span) >> 64``, and the
    whole int64 range the 64 bits themselves. Each value's frequency is
    off by at most ``span / 2**32`` (resp. ``2**64``) relative.

    Parameters
    ----------
    from_ : int, optional
        The lowest value (PyTorch's ``from``); alone, it is ``to``.
    to : int or None, optional
        One past the highest value; None for the dtype's largest.
    generator : Generator, optional
        Draw from this generator (on the tensor's device).

    Returns
    -------
    Tensor
        ``self``.

    Raises
    ------
    ValueError
        When the range is empty or holds values the dtype cannot hold exactly.
    """
    what = "random_"
    frm, to = _MISSING, _MISSING
    for key, value in kwargs.items():
        if key in ("from_", "from"):
            frm = value
        elif key == "to":
            to = value
        else:
            raise TypeError(f"{what}() got an unexpected keyword argument {key!r}")
    if len(args) > 2:
        raise TypeError(f"{what}() takes at most 2 positional arguments ({len(args)} given)")
    if len(args) == 2:
        if frm is not _MISSING or to is not _MISSING:
            raise TypeError(f"{what}(): from and to given twice")
        frm, to = args
    elif len(args) == 1:
        if to is _MISSING and frm is _MISSING:
            to = args[0]                         # random_(to)
        elif frm is _MISSING:
            frm = args[0]
        else:
            raise TypeError(f"{what}(): from given twice")
    lo_ok, hi_ok = _int_range(self.dtype)
    low = 0 if frm is _MISSING else _int(frm, "from", what)
    if to is _MISSING or to is None:
        if frm is not _MISSING and to is _MISSING:
            raise TypeError(f"{what}(): with from, give to as well (None for the dtype's largest)")
        high = hi_ok + 1
    else:
        high = _int(to, "to", what)
    return _integers(self, low, high, generator, what)


# ------------------------------------------------------------------ functions

def rand(*size, generator=None, dtype=None, device=None):
    """Make a tensor of shape ``size`` filled with uniform values in [0, 1).

    Each value is ``k * 2**-bits``, ``k`` the top ``bits`` of a draw: 24 for
    float32, 11 float16, 8 bfloat16, 53 (of a 64-bit draw) float64, so every
    value is exact in the dtype and never 1. See :meth:`Tensor.uniform_`.

    Parameters
    ----------
    *size : int or sequence of int
        The shape.
    generator : Generator, optional
        Draw from this generator (on ``device``); default the device's
        default generator.
    dtype : dtype, str or None, optional
        A floating dtype; default float32.
    device : device, str, int or None, optional
        Default the CPU.

    Returns
    -------
    Tensor
        The values.

    Notes
    -----
    On CUDA one generated NVRTC kernel on the current stream draws and
    advances the generator's device-side offset (it can be captured; each
    replay draws new values).
    """
    shape = parse_size(size)
    d = resolve_dtype(dtype)
    _require_floating(d, "rand")
    _check_generator(generator, device, "rand")
    return _fill(empty(shape, dtype=d, device=device), "uniform", (0.0, 1.0), generator, "rand")


def randn(*size, generator=None, dtype=None, device=None):
    """Make a tensor of shape ``size`` filled with standard normal values.

    Box-Muller, four values per Philox block, with exactly rounded
    arithmetic only (CPU and CUDA agree bit for bit); see
    :meth:`Tensor.normal_`.

    Parameters
    ----------
    *size : int or sequence of int
        The shape.
    generator : Generator, optional
        Draw from this generator (on ``device``).
    dtype : dtype, str or None, optional
        A floating dtype; default float32.
    device : device, str, int or None, optional
        Default the CPU.

    Returns
    -------
    Tensor
        The values.
    """
    shape = parse_size(size)
    d = resolve_dtype(dtype)
    _require_floating(d, "randn")
    _check_generator(generator, device, "randn")
    return _fill(empty(shape, dtype=d, device=device), "normal", (0.0, 1.0), generator, "randn")


def _size_arg(size, what):
    if isinstance(size, (str, bytes)) or not hasattr(size, "__iter__"):
        raise TypeError(f"{what}: size must be a tuple of ints, got {type(size).__name__}")
    return parse_size((tuple(size),))


def randint(low=0, high=None, size=None, *, generator=None, dtype=None, device=None):
    """Make a tensor of shape ``size`` filled with integers drawn uniformly from [``low``, ``high``).

    ``randint(high, size)`` counts from 0, as PyTorch. The draw is
    multiply-shift (see :meth:`Tensor.random_`).

    Parameters
    ----------
    low : int, optional
        The lowest value, default 0.
    high : int
        One past the highest value.
    size : sequence of int
        The shape (a tuple or list).
    generator : Generator, optional
        Draw from this generator (on ``device``).
    dtype : dtype, str or None, optional
        Default int64; floating dtypes take integers they hold exactly.
    device : device, str, int or None, optional
        Default the CPU.

    Returns
    -------
    Tensor
        The values.

    Raises
    ------
    ValueError
        When ``low >= high`` or the range does not fit the dtype.
    """
    what = "randint"
    if size is None:
        if high is None:
            raise TypeError(f"{what}() needs high and size: randint(high, size) or randint(low, high, size)")
        low, high, size = 0, low, high
    if high is None:
        raise TypeError(f"{what}() needs high")
    shape = _size_arg(size, what)
    lo, hi = _int(low, "low", what), _int(high, "high", what)
    _check_generator(generator, device, what)
    t = empty(shape, dtype=resolve_dtype(dtype, dt.int64), device=device)
    return _integers(t, lo, hi, generator, what)


def rand_like(input, *, generator=None, dtype=None, device=None):
    """Make a tensor of ``input``'s shape filled with uniform values in [0, 1); see :func:`rand`.

    Parameters
    ----------
    input : Tensor
        The tensor whose shape, dtype and device the new one takes.
    generator : Generator, optional
        Draw from this generator.
    dtype : dtype, str or None, optional
        Default ``input.dtype`` (floating).
    device : device, str, int or None, optional
        Default ``input.device``.

    Returns
    -------
    Tensor
        The values.
    """
    d, dev = like_dtype_device(input, dtype, device, "rand_like")
    return rand(input.shape, generator=generator, dtype=d, device=dev)


def randn_like(input, *, generator=None, dtype=None, device=None):
    """Make a tensor of ``input``'s shape filled with standard normal values; see :func:`randn`.

    Parameters
    ----------
    input : Tensor
        The tensor whose shape, dtype and device the new one takes.
    generator : Generator, optional
        Draw from this generator.
    dtype : dtype, str or None, optional
        Default ``input.dtype`` (floating).
    device : device, str, int or None, optional
        Default ``input.device``.

    Returns
    -------
    Tensor
        The values.
    """
    d, dev = like_dtype_device(input, dtype, device, "randn_like")
    return randn(input.shape, generator=generator, dtype=d, device=dev)


def randint_like(input, low=0, high=None, *, generator=None, dtype=None, device=None):
    """Make a tensor of ``input``'s shape filled with integers from [``low``, ``high``); see :func:`randint`.

    ``randint_like(input, high)`` counts from 0.

    Parameters
    ----------
    input : Tensor
        The tensor whose shape, dtype and device the new one takes.
    low : int, optional
        The lowest value, default 0.
    high : int
        One past the highest value.
    generator : Generator, optional
        Draw from this generator.
    dtype : dtype, str or None, optional
        Default ``input.dtype``.
    device : device, str, int or None, optional
        Default ``input.device``.

    Returns
    -------
    Tensor
        The values.
    """
    what = "randint_like"
    d, dev = like_dtype_device(input, dtype, device, what)
    if high is None:
        low, high = 0, low
    low, high = _int(low, "low", what), _int(high, "high", what)
    _check_generator(generator, dev, what)
    t = empty(input.shape, dtype=d, device=dev)
    return _integers(t, low, high, generator, what)


def bernoulli(input, *, generator=None):
    """Draw 0 or 1 for each element of ``input``: 1 with probability ``input[i]``.

    Parameters
    ----------
    input : Tensor
        The probabilities (a floating tensor; values are not checked:
        below 0 acts as 0, above 1 as 1).
    generator : Generator, optional
        Draw from this generator (on ``input``'s device).

    Returns
    -------
    Tensor
        0 and 1 in ``input``'s dtype and shape; see :meth:`Tensor.bernoulli_`.
    """
    if not isinstance(input, Tensor):
        raise TypeError(f"bernoulli: expected a Tensor, got {type(input).__name__}")
    _require_floating(input.dtype, "bernoulli")
    _check_generator(generator, input.device, "bernoulli")
    out = empty(input.shape, dtype=input.dtype, device=input.device)
    return _fill(out, "bernoulli_tensor", (), generator, "bernoulli", inp=input)


def apply_dropout(input, p, train, inplace, generator, what):
    """Dropout of ``input`` (``tensorplay.dropout`` and ``nn.functional.dropout``):
    ``input`` itself when ``train`` is False, else a new tensor (or ``input``
    when ``inplace``); ``what`` names the caller in errors."""
    if not isinstance(input, Tensor):
        raise TypeError(f"{what}: expected a Tensor, got {type(input).__name__}")
    prob = _real(p, "p", what)
    if not 0.0 <= prob <= 1.0:
        raise ValueError(f"dropout probability has to be between 0 and 1, but got {prob}")
    if not isinstance(train, (bool, np.bool_)):
        raise TypeError(f"{what}: train/training must be a bool, got {type(train).__name__}")
    _require_floating(input.dtype, what)
    if not train:
        return input
    _check_generator(generator, input.device, what)
    keep = 1.0 - prob
    scale = 0.0 if keep == 0.0 else 1.0 / keep       # p == 1: every value becomes 0 * x
    out = input if inplace else empty(input.shape, dtype=input.dtype, device=input.device)
    # in place, each element is read before it is written, by the same thread (or from a copy)
    return _fill(out, "dropout", (keep, scale), generator, what, inp=input)


def dropout(input, p=0.5, train=True, *, generator=None):
    """Zero each element of ``input`` with probability ``p`` and scale the others by ``1 / (1 - p)``.

    As ``torch.dropout``: element ``i`` is kept when ``w * 2**-32 < 1 - p``
    for its 32-bit draw ``w``; the result is ``(x * keep) * scale`` in
    float32 (float64 for float64), so ``p = 1`` gives zeros (NaN stays NaN).

    Parameters
    ----------
    input : Tensor
        A floating tensor.
    p : float, optional
        The probability of zeroing, in [0, 1].
    train : bool, optional
        False returns ``input`` itself.
    generator : Generator, optional
        Draw from this generator (on ``input``'s device).

    Returns
    -------
    Tensor
        A new tensor (``input`` when ``train`` is False).

    Raises
    ------
    ValueError
        For ``p`` outside [0, 1].
    """
    return apply_dropout(input, p, train, False, generator, "dropout")


def tensor_bernoulli(self, *, generator=None):
    """Draw 0 or 1 for each element: 1 with probability the element's value; see :func:`tensorplay.bernoulli`."""
    return bernoulli(self, generator=generator)


TENSOR_METHODS = {"uniform_": uniform_, "normal_": normal_, "exponential_": exponential_,
                  "bernoulli_": bernoulli_, "random_": random_, "bernoulli": tensor_bernoulli}
