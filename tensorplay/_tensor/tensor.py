# SPDX-License-Identifier: Apache-2.0
"""``tensorplay.Tensor``: creation, movement, copies, basic views."""

from __future__ import annotations

import builtins
import math
import numbers
import operator
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from tensorplay import _dtypes as dt
from tensorplay._memory.allocator import _allocate
from tensorplay._driver.context import CudaUnavailableError, device_index as _cuda_device_index
from tensorplay._driver.context import synchronize as synchronize_context
from tensorplay._device import as_device, device as _device_cls
from tensorplay._tensor.dlpack import DLPACK_DEVICE_CPU, DLPACK_DEVICE_CUDA, to_capsule as _dlpack_capsule
from tensorplay._kernels import cache as _kernels
from tensorplay._kernels.param_upload import PARAM_UPLOAD_MAX_BYTES, launch_param_write
from tensorplay._driver.memcpy import host_reads_blocked as _host_reads_blocked
from tensorplay._driver.memcpy import (memcpy_dtod_async, memcpy_dtoh, memcpy_htod_async, memcpy_peer_async, memset_d8_async,
                      refuse_in_capture)
from tensorplay._driver.stream import Event, ExternalStream, current_stream, current_stream_handle_of
from tensorplay._tensor.base import MAX_DIMS, TensorBase

if TYPE_CHECKING:
    from tensorplay.types import DeviceLike

__all__ = ["Tensor", "tensor", "empty", "zeros", "ones", "full", "arange", "empty_like",
           "zeros_like", "ones_like", "full_like", "from_numpy", "is_tensor"]


# ------------------------------------------------------------------ helpers

def _parse_size(size):
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


def _contiguous_strides(shape):
    strides = [1] * len(shape)
    acc = 1
    for i in range(len(shape) - 1, -1, -1):
        strides[i] = acc
        acc *= max(shape[i], 1)
    return tuple(strides)


def _resolve_device(device):
    """-> -1 for CPU, else a validated CUDA device index."""
    d = as_device(device)
    if d.type == "cpu":
        return -1
    return _cuda_device_index(d.index)


def _resolve_dtype(dtype, default=None):
    if dtype is None:
        return default if default is not None else dt.default_float
    return dt.as_dtype(dtype)


def _new_cuda(storage, ptr, shape, strides, dtype, device):
    t = Tensor.__new__(Tensor)
    t._set_cuda(storage, ptr, shape, strides, dtype.code, device)
    return t


def _new_cpu(array, dtype=None):
    t = Tensor.__new__(Tensor)
    t._set_cpu(array, (dtype or dt.from_numpy_dtype(array.dtype)).code)
    return t


def _empty_cuda(shape, dtype, device):
    n = 1
    for s in shape:
        n *= s
    storage = _allocate(n * dtype.itemsize, device, current_stream_handle_of(device))
    return _new_cuda(storage, storage.ptr, shape, _contiguous_strides(shape), dtype, device)


def _broadcast_shape(a, b):
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


def _to_numpy_data(data, dtype):
    """Host array (any layout) of ``data`` in ``dtype`` (inferred when None)."""
    if isinstance(data, Tensor):
        arr = data.numpy()
        src = arr
    else:
        src = data
        if isinstance(data, (list, tuple)) and any(isinstance(x, Tensor) for x in _flat_iter(data)):
            src = [x.numpy() if isinstance(x, Tensor) else x for x in data]
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


# ------------------------------------------------------------------ creation

def tensor(data, *, dtype=None, device=None):
    """Make a new tensor holding a copy of ``data``.

    As ``torch.tensor``: Python floats give float32, ints int64, bools bool;
    NumPy arrays keep their dtype.

    Parameters
    ----------
    data : object
        A number, nested sequences of numbers, a NumPy array or a tensor.
    dtype : dtype, str or None, optional
        The dtype; by default inferred from ``data``.
    device : device, str, int or None, optional
        Where: ``"cpu"`` (the default), ``"cuda"``, ``"cuda:1"``, a device
        index or a :class:`device`.

    Returns
    -------
    Tensor
        A new tensor. For CUDA, host data of up to 4096 bytes is written by
        a kernel carrying it in its parameters (so a CUDA graph capture can
        hold it), larger data is copied with cuMemcpyHtoDAsync, both on the
        current stream; a tensor's data is copied on the device.

    Raises
    ------
    CudaError
        ``CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED`` for more than 4096 bytes of
        host data inside a CUDA graph capture (before any GPU work; the
        capture stays usable).
    """
    dev = _resolve_device(device)
    if isinstance(data, Tensor):
        # a copy on the device where it can be: capturable for CUDA data
        d = data.dtype if dtype is None else dt.as_dtype(dtype)
        return data.to(dtype=d, device=_device_cls("cpu") if dev < 0 else _device_cls("cuda", dev), copy=True)
    arr, d = _to_numpy_data(data, dtype)
    if dev < 0:
        return _new_cpu(np.array(arr, dtype=d.numpy_dtype, copy=True), d)
    _refuse_large_upload_in_capture(arr.nbytes, dev)
    out = _empty_cuda(arr.shape, d, dev)
    _upload(out, np.ascontiguousarray(arr))
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
    return _new_cpu(array)


def empty(*size, dtype=None, device=None):
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

    Returns
    -------
    Tensor
        The new tensor.
    """
    shape = _parse_size(size)
    d = _resolve_dtype(dtype)
    dev = _resolve_device(device)
    if dev < 0:
        return _new_cpu(np.empty(shape, dtype=d.numpy_dtype), d)
    return _empty_cuda(shape, d, dev)


def zeros(*size, dtype=None, device=None):
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

    Returns
    -------
    Tensor
        The new tensor.
    """
    t = empty(*size, dtype=dtype, device=device)
    return t.zero_()


def ones(*size, dtype=None, device=None):
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

    Returns
    -------
    Tensor
        The new tensor.
    """
    return empty(*size, dtype=dtype, device=device).fill_(1)


def full(size, fill_value, *, dtype=None, device=None):
    """Make a tensor of shape ``size`` filled with ``fill_value``.

    Parameters
    ----------
    size : int or sequence of int
        The shape.
    fill_value : bool, int or float
        The value, cast to the dtype.
    dtype : dtype, str or None, optional
        By default the value's: bool, int64 or float32.
    device : device, str, int or None, optional
        Where: ``"cpu"`` (the default), ``"cuda"``, ``"cuda:1"``, a device
        index or a :class:`device`.

    Returns
    -------
    Tensor
        The new tensor.
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
    return empty(size, dtype=dtype, device=device).fill_(fill_value)


def arange(start, end=None, step=1, *, dtype=None, device=None):
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
    dev = _resolve_device(device)
    if dev < 0:
        work = np.float64 if d.kind == "f" else np.int64
        with np.errstate(over="ignore"):         # the cast wraps or saturates, as on the GPU
            return _new_cpu(np.arange(start, end, step, dtype=work).astype(d.numpy_dtype), d)
    out = _empty_cuda((n,), d, dev)
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


def _like(t, dtype, device, what=None):
    """The dtype and device of a ``*_like`` result: ``t``'s unless given."""
    if not isinstance(t, Tensor):
        prefix = f"{what}: " if what else ""
        raise TypeError(f"{prefix}expected a Tensor, got {type(t).__name__}")
    return (t.dtype if dtype is None else dtype), (t.device if device is None else device)


def empty_like(input, *, dtype=None, device=None):
    """Make a tensor of ``input``'s shape without initialising its elements.

    Parameters
    ----------
    input : Tensor
        The tensor whose shape, dtype and device the new one takes.
    dtype : dtype, str or None, optional
        Default ``input.dtype``.
    device : device, str, int or None, optional
        Default ``input.device``.

    Returns
    -------
    Tensor
        The new tensor.
    """
    d, dev = _like(input, dtype, device)
    return empty(input.shape, dtype=d, device=dev)


def zeros_like(input, *, dtype=None, device=None):
    """Make a tensor of ``input``'s shape filled with zeros.

    Parameters
    ----------
    input : Tensor
        The tensor whose shape, dtype and device the new one takes.
    dtype : dtype, str or None, optional
        Default ``input.dtype``.
    device : device, str, int or None, optional
        Default ``input.device``.

    Returns
    -------
    Tensor
        The new tensor.
    """
    d, dev = _like(input, dtype, device)
    return zeros(input.shape, dtype=d, device=dev)


def ones_like(input, *, dtype=None, device=None):
    """Make a tensor of ``input``'s shape filled with ones.

    Parameters
    ----------
    input : Tensor
        The tensor whose shape, dtype and device the new one takes.
    dtype : dtype, str or None, optional
        Default ``input.dtype``.
    device : device, str, int or None, optional
        Default ``input.device``.

    Returns
    -------
    Tensor
        The new tensor.
    """
    d, dev = _like(input, dtype, device)
    return ones(input.shape, dtype=d, device=dev)


def full_like(input, fill_value, *, dtype=None, device=None):
    """Make a tensor of ``input``'s shape filled with ``fill_value``.

    Parameters
    ----------
    input : Tensor
        The tensor whose shape, dtype and device the new one takes.
    fill_value : bool, int or float
        The value, cast to the dtype.
    dtype : dtype, str or None, optional
        Default ``input.dtype``.
    device : device, str, int or None, optional
        Default ``input.device``.

    Returns
    -------
    Tensor
        The new tensor.
    """
    d, dev = _like(input, dtype, device)
    return full(input.shape, fill_value, dtype=d, device=dev)


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


# ------------------------------------------------------------------ transfers

# Called with a device index at every synchronizing host read, so kernels that
# flag errors on the device (out-of-range device indices) are reported there.
device_error_checks: list[Callable[[int], None]] = []


def run_device_error_checks(dev):
    for check in device_error_checks:
        check(dev)


def synchronize(device: DeviceLike = None) -> None:
    """Wait for all work on ``device`` to finish, cuCtxSynchronize.

    Device-side index errors found by kernels since the last check are
    raised here, as IndexError.

    Parameters
    ----------
    device : device, str, int or None, optional
        Default the current device.
    """
    synchronize_context(device)
    run_device_error_checks(_cuda_device_index(device))


def _upload(dst, host):
    """Copy the contiguous host array ``host`` (dst's dtype and shape) into
    contiguous CUDA ``dst`` on the current stream: up to PARAM_UPLOAD_MAX_BYTES
    inside a kernel's parameters (capturable, see _kernels.param_upload),
    larger data with cuMemcpyHtoDAsync (callers first refuse that inside a
    capture with _refuse_large_upload_in_capture)."""
    dev = dst._device_index
    stream = current_stream_handle_of(dev)
    if host.nbytes <= PARAM_UPLOAD_MAX_BYTES:
        launch_param_write(dst.data_ptr(), host.tobytes(), dev, stream)
    else:
        memcpy_htod_async(dst.data_ptr(), host.ctypes.data, host.nbytes, dev, stream)


def _refuse_large_upload_in_capture(nbytes, dev):
    """Raise CudaError CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, before any GPU
    work, when ``nbytes`` of host data are too many to reach device ``dev``
    inside the capture running on its current stream."""
    if nbytes > PARAM_UPLOAD_MAX_BYTES:
        refuse_in_capture(dev, current_stream_handle_of(dev), (
            f"{nbytes} bytes of host data cannot be copied to the GPU inside a CUDA graph capture: "
            f"up to {PARAM_UPLOAD_MAX_BYTES} bytes travel inside the graph (in kernel parameters), "
            f"larger data needs a copy from pageable host memory, which a graph cannot hold; "
            f"create the tensor before the capture, or copy the data into a CUDA tensor made before it"))


def _capture_repr(t):
    """The repr of a CUDA tensor while a capture is open: what is known
    without reading the device."""
    return (f"tensor(<captured: not readable during a CUDA graph capture>, shape={tuple(t.shape)}, "
            f"dtype={t.dtype!r}, device='{t.device}')")


def _download(src):
    """A new host array with ``src``'s values (waits for the current stream)."""
    if not src.is_contiguous():
        src = src.contiguous()
    d = src.dtype
    out = np.empty(src.shape, dtype=d.numpy_dtype)
    dev = src._device_index
    memcpy_dtoh(out.ctypes.data, src.data_ptr(), out.nbytes, dev, current_stream_handle_of(dev))
    run_device_error_checks(dev)
    return out


# Converts a foreign array (CUDA Array Interface or DLPack) to a Tensor; the
# interop layer above installs it (register_foreign_converter) at import.
_foreign_converter = [None]


def register_foreign_converter(convert):
    """Install ``convert(obj) -> Tensor`` for operands with
    ``__cuda_array_interface__`` or ``__dlpack__`` (tensorplay._tensor.interop does)."""
    _foreign_converter[0] = convert


def _as_source(src):
    if isinstance(src, Tensor):
        return src
    if isinstance(src, (numbers.Number, np.generic, np.ndarray, list, tuple)):
        arr, _ = _to_numpy_data(src, None)
        return _new_cpu(arr)
    if (hasattr(src, "__cuda_array_interface__") or hasattr(src, "__dlpack__")) and _foreign_converter[0]:
        return _foreign_converter[0](src)
    raise TypeError(f"cannot copy from {type(src).__name__}")


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


def _overlaps(a, b):
    """True when two CUDA tensors' memory ranges intersect (and are not identical views)."""
    if a._device_index != b._device_index or a.numel() == 0 or b.numel() == 0:
        return False
    (a0, a1), (b0, b1) = byte_span(a), byte_span(b)
    if a1 <= b0 or b1 <= a0:
        return False
    return not (a.data_ptr() == b.data_ptr() and a.shape == b.shape and a.strides == b.strides)


def copy_into(dst, src):
    """``dst.copy_(src)``: any device pair, dtype casts, broadcasting, strides."""
    src = _as_source(src)
    shape = dst.shape
    if src.shape != shape:
        broadcast_strides(src, shape)   # ValueError if src cannot broadcast to dst
    if dst.is_cpu:
        host = src._array if src.is_cpu else _download(src)
        np.copyto(dst._array, host, casting="unsafe")
        return dst
    dev = dst._device_index
    if src.is_cpu:
        host = src._array
        if src.shape == shape and dst.is_contiguous():
            _refuse_large_upload_in_capture(dst.nbytes, dev)
            _upload(dst, np.ascontiguousarray(host, dtype=dst.dtype.numpy_dtype))
            return dst
        # uploaded as it is, then cast, broadcast and laid out on the device
        _refuse_large_upload_in_capture(src.nbytes, dev)
        tmp = _empty_cuda(src.shape, src.dtype, dev)
        _upload(tmp, np.ascontiguousarray(host))
        src = tmp
    elif src._device_index != dev:
        src = _to_device(src, dev)
    elif _overlaps(dst, src):
        src = src.clone()
    if src.shape == shape and src.dtype is dst.dtype and src.is_contiguous() and dst.is_contiguous():
        memcpy_dtod_async(dst.data_ptr(), src.data_ptr(), dst.nbytes, dev, current_stream_handle_of(dev))
        return dst
    src_strides = broadcast_strides(src, shape)
    # only copies whose innermost strides differ can be transposes: the common
    # strided copies skip the tiling decision
    if (len(shape) < 2 or src_strides[-1] == dst.strides[-1]
            or not _kernels.launch_tiled_copy(dst, src, src_strides)):
        _kernels.launch_elementwise("copy", "a0", dst, (src,), (src_strides,))
    return dst


def _to_device(src, dev):
    """A contiguous copy of CUDA ``src`` on device ``dev`` (peer copy, ordered after
    the work queued on src's current stream)."""
    if not src.is_contiguous():
        src = src.contiguous()
    out = _empty_cuda(src.shape, src.dtype, dev)
    sdev = src._device_index
    dst_stream = current_stream(dev)
    ev = Event()
    ev.record(current_stream(sdev))
    dst_stream.wait_event(ev)
    memcpy_peer_async(out.data_ptr(), dev, src.data_ptr(), sdev, src.nbytes, dst_stream.handle)
    # later work on the source's stream (reuse of its memory included) waits for the copy
    ev2 = Event()
    ev2.record(dst_stream)
    current_stream(sdev).wait_event(ev2)
    return out


# ------------------------------------------------------------------ the class

def _fill_scalar(t, value):
    d = t.dtype
    if isinstance(value, Tensor):
        if value.numel() != 1:
            raise ValueError(f"fill_ takes a scalar or a one-element tensor, got shape {value.shape}")
        value = value.item()
    if isinstance(value, (np.generic,)):
        value = value.item()
    if isinstance(value, bool):
        value = int(value)
    if not isinstance(value, numbers.Real):
        raise TypeError(f"fill value must be a real number, got {type(value).__name__}")
    if t.is_cpu:
        t._array[...] = value
        return t
    if d.kind == "f":
        kind, v = "f", float(value)
    else:
        if isinstance(value, float):
            if value != value or value in (float("inf"), float("-inf")):
                if d.kind == "b":
                    kind, v = "i", 1
                else:
                    raise ValueError(f"cannot fill a {d.name} tensor with {value}")
            else:
                kind, v = "i", (1 if (d.kind == "b" and value != 0) else int(value))
        else:
            kind, v = "i", int(value)
        if d.kind == "b":
            v = 1 if v != 0 else 0
        elif not (-(1 << 63) <= v < (1 << 63)):
            raise OverflowError(f"value {value} does not fit in {d.name}")
    _kernels.launch_elementwise("fill", "s0", t, (), (), (v,), (kind,))
    return t


class Tensor(TensorBase):
    """An n-dimensional array on the CPU (a NumPy array underneath) or on a CUDA
    device (memory from the caching allocator). Make one with
    :func:`tensorplay.tensor`, :func:`tensorplay.empty` and friends.

    CUDA work is queued on the current stream and does not wait, except where
    a host value is produced (``item``, ``tolist``, ``numpy``, ``bool``).
    """

    __slots__ = ()

    def __init__(self, *args, **kwargs):
        raise TypeError("use tensorplay.tensor(), tensorplay.empty() and friends to make tensors")

    # ---------------------------------------------------------------- metadata

    @property
    def dtype(self):
        """The element type, a :class:`tensorplay.dtype`."""
        return dt.ALL_DTYPES[self._dtype_code]

    @property
    def device(self):
        """Where the tensor lives, a :class:`tensorplay.device` (``cpu`` or ``cuda:N``)."""
        i = self._device_index
        return _device_cls("cpu") if i < 0 else _device_cls("cuda", i)

    def size(self, dim=None):
        """Return the shape, or the size of dimension ``dim``.

        Parameters
        ----------
        dim : int, optional
            A dimension (negative counts from the end).

        Returns
        -------
        tuple of int or int
            :attr:`shape` without ``dim``, ``shape[dim]`` with it.
        """
        if dim is None:
            return self.shape
        return self.shape[self._dim(dim)]

    def stride(self, dim=None):
        """Return the strides in elements, or the stride of dimension ``dim``.

        Parameters
        ----------
        dim : int, optional
            A dimension (negative counts from the end).

        Returns
        -------
        tuple of int or int
            :attr:`strides` without ``dim``, ``strides[dim]`` with it.
        """
        if dim is None:
            return self.strides
        return self.strides[self._dim(dim)]

    def _dim(self, dim):
        if isinstance(dim, bool) or not isinstance(dim, numbers.Integral):
            raise TypeError(f"dimension must be an int, got {dim!r}")
        n = self.ndim
        if not -max(n, 1) <= dim < max(n, 1):
            raise IndexError(f"dimension {dim} out of range for a {n}-d tensor")
        return dim % max(n, 1)

    def __len__(self):
        if self.ndim == 0:
            raise TypeError("len() of a 0-d tensor")
        return self.shape[0]

    def __iter__(self):
        if self.ndim == 0:
            raise TypeError("iteration over a 0-d tensor")
        return (self[i] for i in range(self.shape[0]))

    def __repr__(self):
        if self.is_cuda and _host_reads_blocked(self._device_index,
                                                current_stream_handle_of(self._device_index)):
            return _capture_repr(self)     # a host copy would break the capture
        arr = self.numpy()
        body = np.array2string(arr.astype(np.float32) if self.dtype is dt.bfloat16 else arr,
                               separator=", ", prefix="tensor(")
        extra = []
        if self.is_cuda:
            extra.append(f"device='{self.device}'")
        if self.dtype not in (dt.float32, dt.int64, dt.bool_):
            extra.append(f"dtype={self.dtype!r}")
        return "tensor(" + body + "".join(", " + e for e in extra) + ")"

    # ---------------------------------------------------------------- movement

    def numpy(self):
        """Return the values as a NumPy array.

        For CPU tensors the array shares this tensor's memory; for CUDA
        tensors it is a host copy (cuMemcpyDtoHAsync, then the current stream
        is waited for, so it cannot be captured).
        """
        if self.is_cpu:
            return self._array
        return _download(self)

    def __array__(self, dtype=None, copy=None):
        if self.is_cuda:
            raise TypeError("a CUDA tensor cannot be converted to NumPy implicitly; use .cpu() or .numpy()")
        a = self._array
        if dtype is not None:
            a = a.astype(dtype, copy=bool(copy))
        elif copy:
            a = a.copy()
        return a

    def item(self):
        """Return the value of a one-element tensor as a Python scalar."""
        if self.numel() != 1:
            raise ValueError(f"item() needs exactly one element, the tensor has {self.numel()}")
        return self.numpy().reshape(()).item() if self.dtype is not dt.bfloat16 else \
            float(self.numpy().reshape(()).astype(np.float32))

    def tolist(self):
        """Return the values as nested Python lists (a Python scalar for a 0-d tensor).

        CUDA tensors are copied to the host first (waits for the current
        stream, so it cannot be captured); bfloat16 values become floats.
        """
        a = self.numpy()
        if self.dtype is dt.bfloat16:
            a = a.astype(np.float32)
        return a.tolist()

    def __bool__(self):
        if self.numel() != 1:
            raise ValueError(f"the truth value of a tensor with {self.numel()} elements is ambiguous")
        return bool(self.item())

    def __int__(self):
        return int(self.item())

    def __float__(self):
        return float(self.item())

    def __index__(self):
        if self.dtype.kind not in "iub":
            raise TypeError(f"only integer tensors can be used as an index, not {self.dtype.name}")
        return operator.index(self.item())

    def cpu(self):
        """Return a CPU copy (self when already on the CPU)."""
        return self if self.is_cpu else self.to("cpu")

    def cuda(self, device=None):
        """Return a copy on CUDA device ``device`` (default: current); self when already there."""
        idx = _cuda_device_index(device)
        return self.to(_device_cls("cuda", idx))

    def to(self, *args, dtype=None, device=None, copy=False, non_blocking=False):
        """Return this tensor on another device and/or with another dtype.

        ``to('cuda')``, ``to(tensorplay.float16)``,
        ``to('cuda:0', tensorplay.float16)``, ``to(other_tensor)`` (its device
        and dtype), or the keywords.

        Parameters
        ----------
        *args : device, str, int, dtype or Tensor
            A device and/or a dtype, or a tensor to match.
        dtype : dtype, str or None, optional
            The dtype wanted.
        device : device, str, int or None, optional
            The device wanted.
        copy : bool, optional
            Copy even when nothing changes.
        non_blocking : bool, optional
            Accepted for PyTorch compatibility; copies are always ordered
            on the current stream.

        Returns
        -------
        Tensor
            ``self`` when nothing changes and ``copy`` is False, else a new tensor.
        """
        for a in args:
            if isinstance(a, Tensor):
                device, dtype = a.device, a.dtype
            elif isinstance(a, dt.dtype) or (isinstance(a, str) and a in dt._BY_NAME) or \
                    isinstance(a, (np.dtype, type)):
                dtype = a
            else:
                device = a
        d = self.dtype if dtype is None else dt.as_dtype(dtype)
        if device is None:
            dev = self._device_index
        else:
            dev = _resolve_device(device)
        if not copy and d is self.dtype and dev == self._device_index:
            return self
        if self.is_cpu and dev >= 0:
            _refuse_large_upload_in_capture(self.numel() * d.itemsize, dev)    # before allocating
        out = empty(self.shape, dtype=d, device="cpu" if dev < 0 else _device_cls("cuda", dev))
        return copy_into(out, self)

    def clone(self):
        """Return a contiguous copy on the same device."""
        return copy_into(empty_like(self), self)

    def contiguous(self):
        """Return self if contiguous, else a contiguous copy."""
        return self if self.is_contiguous() else self.clone()

    def copy_(self, src, non_blocking=False):
        """Copy ``src`` into this tensor, in place.

        Any device pair, dtype casts, broadcasting of ``src`` to this shape
        and any layout. Asynchronous on the current stream for CUDA
        destinations (cuMemcpyAsync for contiguous same-dtype copies, a
        generated copy kernel otherwise). Host data of up to 4096 bytes is
        written by a kernel carrying it in its parameters, which a CUDA
        graph capture can hold; larger host data is copied with
        cuMemcpyHtoDAsync and raises CudaError
        (CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED) inside a capture.

        Parameters
        ----------
        src : Tensor, array-like or number
            The values; NumPy arrays, sequences, numbers and objects with
            ``__cuda_array_interface__`` or ``__dlpack__`` are accepted.
        non_blocking : bool, optional
            Accepted for PyTorch compatibility.

        Returns
        -------
        Tensor
            ``self``.
        """
        return copy_into(self, src)

    def fill_(self, value):
        """Fill this tensor with ``value`` (cast to its dtype), in place; return ``self``."""
        return _fill_scalar(self, value)

    def zero_(self):
        """Fill with zeros in place (cuMemsetD8Async when contiguous)."""
        if self.is_cuda and self.is_contiguous():
            dev = self._device_index
            memset_d8_async(self.data_ptr(), 0, self.nbytes, dev, current_stream_handle_of(dev))
            return self
        return _fill_scalar(self, 0)

    def record_stream(self, stream):
        """Mark this tensor's memory as in use by ``stream``.

        When the tensor dies, the caching allocator reuses its memory only
        after the work queued on ``stream`` by then has finished (an event
        recorded there, cuEventRecord), as ``torch.Tensor.record_stream``.

        Parameters
        ----------
        stream : Stream
            A stream of this tensor's device.
        """
        return TensorBase.record_stream(self, stream)

    # ---------------------------------------------------------------- interop

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        """Export this tensor through DLPack (the ``__dlpack__`` protocol).

        For CUDA tensors, ``stream`` is the consumer's stream: it is made to
        wait for this device's current stream (an event, cuStreamWaitEvent).
        """
        if dl_device is not None and tuple(dl_device) != tuple(self.__dlpack_device__()):
            if tuple(dl_device)[0] == 1:
                return self.cpu().__dlpack__(max_version=max_version, copy=False)
            raise BufferError(f"cannot export to DLPack device {dl_device}")
        if copy:
            return self.clone().__dlpack__(stream=stream, max_version=max_version)
        if self.is_cpu:
            kw = {} if max_version is None else {"max_version": max_version}
            return self._array.__dlpack__(**kw)
        if stream is not None and stream != -1:
            if isinstance(stream, bool) or not isinstance(stream, int):
                raise TypeError(f"stream must be an int or None, got {type(stream).__name__}")
            consumer = 0 if stream == 1 else stream
            mine = current_stream_handle_of(self._device_index)
            if consumer != mine:
                ev = Event()
                ev.record(current_stream(self._device_index))
                ExternalStream(consumer, device=self._device_index).wait_event(ev)
        versioned = max_version is not None and tuple(max_version)[0] >= 1
        return _dlpack_capsule(self, versioned)

    def __dlpack_device__(self):
        """Return ``(device_type, device_id)`` of DLPack: ``(1, 0)`` for the CPU, ``(2, N)`` for cuda:N."""
        if self.is_cpu:
            return (DLPACK_DEVICE_CPU, 0)
        return (DLPACK_DEVICE_CUDA, self._device_index)

    # ---------------------------------------------------------------- views

    def _view_of(self, shape, strides, offset_elems=0):
        """A CUDA view sharing storage (the storage keeps the memory alive)."""
        return _new_cuda(self._storage, self.data_ptr() + offset_elems * self.itemsize,
                         tuple(shape), tuple(strides), self.dtype, self._device_index)

    def _cpu_view(self, array):
        return _new_cpu(array, self.dtype)

