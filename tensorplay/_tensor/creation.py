# SPDX-License-Identifier: Apache-2.0
"""Making tensors: ``tensor``, ``from_numpy``, ``empty``, ``zeros``, ``ones``,
``full``, ``arange`` and the ``*_like`` forms, and ``is_tensor``."""

from __future__ import annotations

import math
import numbers

import numpy as np

from tensorplay import _dtypes as dt
from tensorplay._device import device as _device_cls
from tensorplay._kernels import cache as _kernels
from tensorplay._tensor.args import numpy_data, parse_size, resolve_device, resolve_dtype
from tensorplay._driver.pinned import pinned_memory_of
from tensorplay._tensor.tensor import Tensor, copy_into, empty_cuda, empty_host, is_literal, new_cpu
from tensorplay._tensor.transfer import refuse_large_upload_in_capture, upload

__all__ = ["tensor", "empty", "zeros", "ones", "full", "arange", "empty_like", "zeros_like", "ones_like", "full_like",
           "from_numpy", "is_tensor", "like_dtype_device", "arange_length", "arange_kernel_args"]


def tensor(data, *, dtype=None, device=None, pin_memory=False):
    """Make a new tensor holding a copy of ``data``.

    As ``torch.tensor``: Python floats give float32, ints int64, bools bool;
    NumPy arrays and tensors keep their dtype.

    Python numbers must fit the dtype, as in PyTorch (NumPy 2 agrees but
    for one case): ints must lie in an integer dtype's range (for unsigned
    dtypes negative ints down to minus the largest value wrap around, so
    -1 gives 255 in uint8, where NumPy raises), floats given for an integer
    dtype must be finite and in its range (then they are truncated toward
    zero), anything fits bool (nonzero is True), and floating dtypes round,
    to ±inf past their range. NumPy arrays and tensors given with another
    dtype are cast silently, as :meth:`Tensor.to` casts.

    Parameters
    ----------
    data : object
        A number, nested sequences of numbers, a NumPy array or a tensor.
    dtype : dtype, str or None, optional
        The dtype; by default inferred from ``data``.
    device : device, str, int or None, optional
        Where: ``"cpu"`` (the default), ``"cuda"``, ``"cuda:1"``, a device
        index or a :class:`device`.
    pin_memory : bool, optional
        Make a CPU tensor in page-locked (pinned) host memory, as
        :meth:`Tensor.pin_memory` does (RuntimeError with a CUDA device,
        CudaUnavailableError without a GPU).

    Returns
    -------
    Tensor
        A new tensor. For CUDA, host data of up to 4096 bytes is written by
        a kernel carrying it in its parameters (so a CUDA graph capture can
        hold it), larger data is copied with cuMemcpyHtoDAsync, both on the
        current stream; a tensor's data is copied on the device.

    Raises
    ------
    OverflowError
        If a Python number does not fit the dtype (the message names both).
    ValueError
        If nested sequences are ragged (their lengths differ at one depth).
    TypeError
        If ``data`` holds something other than numbers (strings, None,
        complex numbers), or ``dtype`` is not a dtype.
    CudaError
        ``CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED`` inside a CUDA graph
        capture for more than 4096 bytes of numbers and sequences, and for
        a CPU tensor or NumPy array in pageable memory (before any GPU
        work; the capture stays usable). Host data follows the rule of
        :meth:`Tensor.copy_`.
    """
    dev = resolve_device(device)
    _check_pin_memory(pin_memory, dev)
    if isinstance(data, Tensor):
        # a copy on the device where it can be: capturable for CUDA data
        d = data.dtype if dtype is None else dt.as_dtype(dtype)
        out = data.to(dtype=d, device=_device_cls("cpu") if dev < 0 else _device_cls("cuda", dev), copy=True)
        return out.pin_memory() if pin_memory else out
    arr, d = numpy_data(data, dtype)
    if dev < 0:
        if pin_memory:
            out = empty_host(arr.shape, d, pin_memory=True)
            out._array[...] = arr
            return out
        return new_cpu(np.array(arr, copy=True), d)
    if not is_literal(data):
        # a NumPy array: by the host-data rule of copy_ (from pinned memory
        # with a cast on the device, pageable memory refused in a capture)
        src = data if pinned_memory_of(data) is not None else arr
        return copy_into(empty_cuda(arr.shape, d, dev), src, literal=False)
    refuse_large_upload_in_capture(arr.nbytes, dev)
    out = empty_cuda(arr.shape, d, dev)
    upload(out, np.ascontiguousarray(arr))
    return out


def from_numpy(ndarray):
    """Make a CPU tensor sharing memory with the NumPy array ``ndarray``.

    Writes through either are seen by the other. bfloat16 arrays come from
    ``ml_dtypes``.

    Parameters
    ----------
    ndarray : numpy.ndarray
        An array of a supported dtype in native byte order.

    Returns
    -------
    Tensor
        A CPU tensor over the array's memory.
    """
    array = ndarray
    if not isinstance(array, np.ndarray):
        raise TypeError(f"expected a numpy.ndarray, got {type(array).__name__}")
    if not array.dtype.isnative:
        raise ValueError("non-native byte order is not supported; use array.astype(array.dtype.newbyteorder('='))")
    return new_cpu(array)


def empty(*size, dtype=None, device=None, pin_memory=False):
    """Make a tensor of shape ``size`` without initialising its elements.

    CUDA memory comes from the caching allocator, ordered on the current
    stream (inside a capture, from the capture's pool).

    Parameters
    ----------
    *size : int or sequence of int
        The shape: ``empty(2, 3)``, ``empty((2, 3))`` or ``empty([2, 3])``.
    dtype : dtype, str or None, optional
        Default float32.
    device : device, str, int or None, optional
        Where: ``"cpu"`` (the default), ``"cuda"``, ``"cuda:1"``, a device
        index or a :class:`device`.
    pin_memory : bool, optional
        Make a CPU tensor in page-locked (pinned) host memory, as
        :meth:`Tensor.pin_memory` does (RuntimeError with a CUDA device,
        CudaUnavailableError without a GPU).

    Returns
    -------
    Tensor
        The new tensor.
    """
    shape = parse_size(size)
    d = resolve_dtype(dtype)
    dev = resolve_device(device)
    _check_pin_memory(pin_memory, dev)
    if dev < 0:
        return empty_host(shape, d, pin_memory)
    return empty_cuda(shape, d, dev)


def _check_pin_memory(pin_memory, dev):
    """RuntimeError for ``pin_memory=True`` with CUDA device index ``dev``
    (as PyTorch: only CPU tensors are pinned)."""
    if pin_memory and dev >= 0:
        raise RuntimeError(f"pin_memory=True makes a CPU tensor in page-locked host memory; it cannot be "
                           f"used with device 'cuda:{dev}'")


def zeros(*size, dtype=None, device=None, pin_memory=False):
    """Make a tensor of shape ``size`` filled with zeros.

    On CUDA the memory is cleared with cuMemsetD8Async on the current stream.

    Parameters
    ----------
    *size : int or sequence of int
        The shape.
    dtype : dtype, str or None, optional
        Default float32.
    device : device, str, int or None, optional
        Where: ``"cpu"`` (the default), ``"cuda"``, ``"cuda:1"``, a device
        index or a :class:`device`.
    pin_memory : bool, optional
        Make a CPU tensor in page-locked (pinned) host memory, as
        :meth:`Tensor.pin_memory` does (RuntimeError with a CUDA device,
        CudaUnavailableError without a GPU).

    Returns
    -------
    Tensor
        The new tensor.
    """
    t = empty(*size, dtype=dtype, device=device, pin_memory=pin_memory)
    return t.zero_()


def ones(*size, dtype=None, device=None, pin_memory=False):
    """Make a tensor of shape ``size`` filled with ones.

    Parameters
    ----------
    *size : int or sequence of int
        The shape.
    dtype : dtype, str or None, optional
        Default float32.
    device : device, str, int or None, optional
        Where: ``"cpu"`` (the default), ``"cuda"``, ``"cuda:1"``, a device
        index or a :class:`device`.
    pin_memory : bool, optional
        Make a CPU tensor in page-locked (pinned) host memory, as
        :meth:`Tensor.pin_memory` does (RuntimeError with a CUDA device,
        CudaUnavailableError without a GPU).

    Returns
    -------
    Tensor
        The new tensor.
    """
    return empty(*size, dtype=dtype, device=device, pin_memory=pin_memory).fill_(1)


def full(size, fill_value, *, dtype=None, device=None, pin_memory=False):
    """Make a tensor of shape ``size`` filled with ``fill_value``.

    Parameters
    ----------
    size : int or sequence of int
        The shape.
    fill_value : bool, int or float
        The value; it must fit the dtype, as in :meth:`Tensor.fill_`.
    dtype : dtype, str or None, optional
        By default the value's: bool, int64 or float32.
    device : device, str, int or None, optional
        Where: ``"cpu"`` (the default), ``"cuda"``, ``"cuda:1"``, a device
        index or a :class:`device`.
    pin_memory : bool, optional
        Make a CPU tensor in page-locked (pinned) host memory, as
        :meth:`Tensor.pin_memory` does (RuntimeError with a CUDA device,
        CudaUnavailableError without a GPU).

    Returns
    -------
    Tensor
        The new tensor.

    Raises
    ------
    OverflowError
        If ``fill_value`` does not fit the dtype (the message names both).
    """
    if dtype is None:
        if isinstance(fill_value, (bool, np.bool_)):
            dtype = dt.bool_
        elif isinstance(fill_value, numbers.Integral):
            dtype = dt.int64
        else:
            dtype = dt.default_float
    if isinstance(size, numbers.Integral):
        size = (size,)
    return empty(size, dtype=dtype, device=device, pin_memory=pin_memory).fill_(fill_value)


def arange(start, end=None, step=1, *, dtype=None, device=None, pin_memory=False):
    """Make a 1-D tensor of the values from ``start`` up to (not including) ``end`` by ``step``.

    ``arange(n)`` counts from 0 to ``n - 1``. The values are NumPy's:
    ``numpy.arange(start, end, step)`` computed in int64 for integer and
    bool dtypes, in float64 for floating ones, then cast; there are
    ``ceil((end - start) / step)`` of them (none when that is not positive).
    On CUDA one kernel computes them on the current stream (no host copy,
    so it can be captured in a CUDA graph).

    Parameters
    ----------
    start : int or float
        The first value (or, alone, ``end``, counting from 0).
    end : int or float, optional
        The bound, not included.
    step : int or float, optional
        The spacing, nonzero; default 1.
    dtype : dtype, str or None, optional
        By default int64 when every argument is an int, else float32.
    device : device, str, int or None, optional
        Where: ``"cpu"`` (the default), ``"cuda"``, ``"cuda:1"``, a device
        index or a :class:`device`.
    pin_memory : bool, optional
        Make a CPU tensor in page-locked (pinned) host memory, as
        :meth:`Tensor.pin_memory` does (RuntimeError with a CUDA device,
        CudaUnavailableError without a GPU).

    Returns
    -------
    Tensor
        The values.

    Raises
    ------
    TypeError
        If an argument is not a real number (bools are not).
    ValueError
        If ``step`` is zero or the length is NaN.
    OverflowError
        If the length or a value does not fit in int64.
    """
    if end is None:
        start, end = 0, start
    start, end, step = (_arange_number(v) for v in (start, end, step))
    if step == 0:
        raise ValueError("arange step must be non-zero")
    if dtype is None:
        all_int = all(isinstance(v, int) for v in (start, end, step))
        dtype = dt.int64 if all_int else dt.default_float
    d = dt.as_dtype(dtype)
    n = arange_length(start, end, step)
    if n:
        kind, expr, scalars = arange_kernel_args(start, step, d)    # checks the values on both paths
    dev = resolve_device(device)
    _check_pin_memory(pin_memory, dev)
    if dev < 0:
        work = np.float64 if d.kind == "f" else np.int64
        with np.errstate(over="ignore"):         # the cast wraps or saturates, as on the GPU
            out = new_cpu(np.arange(start, end, step, dtype=work).astype(d.numpy_dtype), d)
        return out.pin_memory() if pin_memory else out
    out = empty_cuda((n,), d, dev)
    if n:
        _kernels.launch_elementwise(("arange", kind), expr, out, (), (), scalars, (kind,) * len(scalars))
    return out


def _arange_number(v):
    """An arange argument as a Python int or float (NumPy scalars too), so the
    CPU and CUDA paths compute with the same values."""
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, numbers.Real):
        raise TypeError(f"arange takes real numbers, got {v!r}")
    return int(v) if isinstance(v, numbers.Integral) else float(v)


_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1


def arange_length(start, end, step):
    """The number of values of ``arange(start, end, step)`` (Python ints or
    floats), as NumPy counts them: ``ceil((end - start) / step)`` in Python
    arithmetic (exact for ints), 0 when that is not positive."""
    span = end - start
    if span == 0:
        return 0
    try:
        q = span / step
    except OverflowError:
        raise OverflowError("arange: overflow while computing the length") from None
    if math.isnan(q):
        raise ValueError(f"arange: cannot compute the length of arange({start}, {end}, {step})")
    if math.isinf(q) or math.ceil(q) > _INT64_MAX:
        raise OverflowError(f"arange: the length of arange({start}, {end}, {step}) does not fit in int64")
    if q == 0:
        # the quotient underflowed (or step is infinite): NumPy counts its sign
        return 0 if math.copysign(1.0, q) < 0 else 1
    return max(0, math.ceil(q))


def arange_kernel_args(start, step, d):
    """(scalar kind, expression, scalars) of the CUDA arange kernel over the
    linear index ``i`` for dtype ``d``, reproducing NumPy's ``arange``: the
    first value ``start``, the second ``start + step`` (Python arithmetic),
    then ``first + i * (second - first)``, in int64 (wrapping) for integer
    and bool dtypes, in float64 rounded at each operation (no fused
    multiply-add, as NumPy's loop) for floating ones; the store casts."""
    if d.kind == "f":
        try:
            first, second = float(start), float(start + step)
        except OverflowError:
            raise OverflowError(f"arange: {start} or {start} + {step} does not fit in float64") from None
        expr = "((i == 0) ? s0 : ((i == 1) ? s2 : __dadd_rn(s0, __dmul_rn((double)i, s1))))"
        return "f", expr, (first, second - first, second)
    first, second = int(start), int(start + step)
    for v in (first, second):
        if not _INT64_MIN <= v <= _INT64_MAX:
            raise OverflowError(f"arange: the value {v} does not fit in int64")
    delta = ((second - first - _INT64_MIN) % (1 << 64)) + _INT64_MIN    # int64's wrapping difference
    expr = "((long long)((unsigned long long)s0 + (unsigned long long)i * (unsigned long long)s1))"
    return "i", expr, (first, delta)


def like_dtype_device(t, dtype, device, what=None):
    """The dtype and device of a ``*_like`` result: ``t``'s unless given."""
    if not isinstance(t, Tensor):
        prefix = f"{what}: " if what else ""
        raise TypeError(f"{prefix}expected a Tensor, got {type(t).__name__}")
    return (t.dtype if dtype is None else dtype), (t.device if device is None else device)


def empty_like(input, *, dtype=None, device=None, pin_memory=False):
    """Make a tensor of ``input``'s shape without initialising its elements.

    Parameters
    ----------
    input : Tensor
        The tensor whose shape, dtype and device the new one takes.
    dtype : dtype, str or None, optional
        Default ``input.dtype``.
    device : device, str, int or None, optional
        Default ``input.device``.
    pin_memory : bool, optional
        Make a CPU tensor in page-locked (pinned) host memory, as
        :meth:`Tensor.pin_memory` does (RuntimeError with a CUDA device,
        CudaUnavailableError without a GPU).

    Returns
    -------
    Tensor
        The new tensor.
    """
    d, dev = like_dtype_device(input, dtype, device)
    return empty(input.shape, dtype=d, device=dev, pin_memory=pin_memory)


def zeros_like(input, *, dtype=None, device=None, pin_memory=False):
    """Make a tensor of ``input``'s shape filled with zeros.

    Parameters
    ----------
    input : Tensor
        The tensor whose shape, dtype and device the new one takes.
    dtype : dtype, str or None, optional
        Default ``input.dtype``.
    device : device, str, int or None, optional
        Default ``input.device``.
    pin_memory : bool, optional
        Make a CPU tensor in page-locked (pinned) host memory, as
        :meth:`Tensor.pin_memory` does (RuntimeError with a CUDA device,
        CudaUnavailableError without a GPU).

    Returns
    -------
    Tensor
        The new tensor.
    """
    d, dev = like_dtype_device(input, dtype, device)
    return zeros(input.shape, dtype=d, device=dev, pin_memory=pin_memory)


def ones_like(input, *, dtype=None, device=None, pin_memory=False):
    """Make a tensor of ``input``'s shape filled with ones.

    Parameters
    ----------
    input : Tensor
        The tensor whose shape, dtype and device the new one takes.
    dtype : dtype, str or None, optional
        Default ``input.dtype``.
    device : device, str, int or None, optional
        Default ``input.device``.
    pin_memory : bool, optional
        Make a CPU tensor in page-locked (pinned) host memory, as
        :meth:`Tensor.pin_memory` does (RuntimeError with a CUDA device,
        CudaUnavailableError without a GPU).

    Returns
    -------
    Tensor
        The new tensor.
    """
    d, dev = like_dtype_device(input, dtype, device)
    return ones(input.shape, dtype=d, device=dev, pin_memory=pin_memory)


def full_like(input, fill_value, *, dtype=None, device=None, pin_memory=False):
    """Make a tensor of ``input``'s shape filled with ``fill_value``.

    Parameters
    ----------
    input : Tensor
        The tensor whose shape, dtype and device the new one takes.
    fill_value : bool, int or float
        The value; it must fit the dtype, as in :meth:`Tensor.fill_`.
    dtype : dtype, str or None, optional
        Default ``input.dtype``.
    device : device, str, int or None, optional
        Default ``input.device``.
    pin_memory : bool, optional
        Make a CPU tensor in page-locked (pinned) host memory, as
        :meth:`Tensor.pin_memory` does (RuntimeError with a CUDA device,
        CudaUnavailableError without a GPU).

    Returns
    -------
    Tensor
        The new tensor.
    """
    d, dev = like_dtype_device(input, dtype, device)
    return full(input.shape, fill_value, dtype=d, device=dev, pin_memory=pin_memory)


def is_tensor(obj):
    """Test whether ``obj`` is a :class:`Tensor`.

    Parameters
    ----------
    obj : object
        Anything.

    Returns
    -------
    bool
        ``isinstance(obj, tensorplay.Tensor)``.
    """
    return isinstance(obj, Tensor)
