# SPDX-License-Identifier: Apache-2.0
"""``tensorplay.Tensor``, and what its methods need: making tensor objects
over host arrays and device memory, ``copy_`` between any devices, dtypes
and layouts, and ``fill_``.

The Tensor class is declared for type checkers in ``tensor.pyi`` beside
this module (written by scripts/gen_stubs.py), with the op methods that
``tensorplay._ops.methods`` installs at import time."""

from __future__ import annotations

import numbers
import operator
import pickle

import numpy as np

from tensorplay import _dtypes as dt
from tensorplay._memory.allocator import allocate, note_capture_use
from tensorplay._driver.context import device_index as cuda_device_index
from tensorplay._device import device as _device_cls
from tensorplay._tensor.dlpack import DLPACK_DEVICE_CPU, DLPACK_DEVICE_CUDA, to_capsule as _dlpack_capsule
from tensorplay._kernels import cache as _kernels
from tensorplay._driver.memcpy import host_reads_blocked, memcpy_dtod_async, memset_d8_async, refuse_in_capture
from tensorplay._driver.pinned import copy_to_device, copy_to_host, empty_pinned, pinned_memory_of
from tensorplay._driver.stream import Event, ExternalStream, current_stream, current_stream_handle_of
from tensorplay._tensor.args import (broadcast_strides, byte_span, cast_array, cast_into, check_value,
                                     contiguous_strides, normalize_dim, numpy_data, overlaps, resolve_device)
from tensorplay._tensor.base import TensorBase
from tensorplay._tensor.printing import format_tensor
from tensorplay._tensor.transfer import (download, foreign_converter, peer_copy, refuse_host_array_in_capture,
                                         refuse_large_upload_in_capture, run_device_error_checks, upload)

__all__ = ["Tensor", "new_cpu", "new_cuda", "empty_cuda", "empty_host", "view_of", "as_source", "is_literal",
           "copy_into", "host_to_cuda", "rebuild_tensor"]


# ------------------------------------------------------------------ tensor objects

def new_cuda(storage, ptr, shape, strides, dtype, device):
    """A CUDA tensor over ``ptr`` in ``storage`` (which keeps the memory alive)."""
    t = Tensor.__new__(Tensor)
    t._set_cuda(storage, ptr, shape, strides, dtype.code, device)
    return t


def new_cpu(array, dtype=None):
    """A CPU tensor over the NumPy ``array`` (its dtype's, or ``dtype``'s for bfloat16 arrays)."""
    t = Tensor.__new__(Tensor)
    t._set_cpu(array, (dtype or dt.from_numpy_dtype(array.dtype)).code)
    return t


def empty_cuda(shape, dtype, device):
    """An uninitialised contiguous tensor on CUDA device index ``device``, from
    the caching allocator on its current stream."""
    n = 1
    for s in shape:
        n *= s
    storage = allocate(n * dtype.itemsize, device, current_stream_handle_of(device))
    return new_cuda(storage, storage.ptr, shape, contiguous_strides(shape), dtype, device)


def empty_host(shape, dtype, pin_memory=False):
    """An uninitialised contiguous CPU tensor, in page-locked memory when
    ``pin_memory`` (CudaUnavailableError without a GPU)."""
    if pin_memory:
        return new_cpu(empty_pinned(shape, dtype.numpy_dtype), dtype)
    return new_cpu(np.empty(shape, dtype=dtype.numpy_dtype), dtype)


def _empty(shape, dtype, dev):
    """An uninitialised tensor on the CPU (``dev`` -1) or CUDA device index ``dev``."""
    if dev < 0:
        return empty_host(shape, dtype)
    return empty_cuda(shape, dtype, dev)


def view_of(t, shape, strides, offset_elems=0):
    """A view of CUDA ``t`` sharing its storage (the storage keeps the memory alive)."""
    return new_cuda(t._storage, t.data_ptr() + offset_elems * t.itemsize,
                    tuple(shape), tuple(strides), t.dtype, t._device_index)


# ------------------------------------------------------------------ copies

def as_source(src):
    """``src`` as a tensor to copy or compute from: a tensor itself, host data
    (numbers, sequences, NumPy arrays) as a CPU tensor, a foreign array
    (``__cuda_array_interface__`` or ``__dlpack__``) through the registered
    converter."""
    if isinstance(src, Tensor):
        return src
    if isinstance(src, (numbers.Number, np.generic, np.ndarray, list, tuple)):
        arr, _ = numpy_data(src, None)
        return new_cpu(arr)
    convert = foreign_converter()
    if (hasattr(src, "__cuda_array_interface__") or hasattr(src, "__dlpack__")) and convert:
        return convert(src)
    raise TypeError(f"cannot copy from {type(src).__name__}")


def is_literal(src):
    """True for host data whose values cannot change after the call that
    takes it (numbers, NumPy scalars, lists and tuples), which a CUDA graph
    capture may copy into the graph; False for tensors, NumPy arrays and
    foreign arrays, whose memory the caller keeps and may change before a
    replay."""
    return isinstance(src, (numbers.Number, np.generic, list, tuple))


def copy_into(dst, src, non_blocking=False, literal=None):
    """``dst.copy_(src)``: any device pair, dtype casts, broadcasting, strides.

    Host data bound for CUDA goes by what it is. From pinned memory: a
    cuMemcpyHtoDAsync that a capture records as a node reading the host
    buffer at every replay (see _from_pinned). Literals (``literal``, by
    default is_literal(src)): in kernel parameters up to
    PARAM_UPLOAD_MAX_BYTES, which a capture holds, larger ones only outside
    a capture. Other host memory (pageable CPU tensors and NumPy arrays):
    refused inside a capture (refuse_host_array_in_capture), uploaded as
    literals are outside one.
    """
    if literal is None:
        literal = is_literal(src)
    src = as_source(src)
    shape = dst.shape
    if src.shape != shape:
        broadcast_strides(src, shape)   # ValueError if src cannot broadcast to dst
    if dst.is_cpu:
        if not src.is_cpu and dst.is_contiguous():
            mem = pinned_memory_of(dst._array)
            if mem is not None:
                _to_pinned(dst, src, mem, non_blocking)
                return dst
        cast_into(dst._array, src._array if src.is_cpu else download(src))
        return dst
    dev = dst._device_index
    if src.is_cpu and not literal:
        mem = pinned_memory_of(src._array)
        if mem is not None:
            src = _from_pinned(dst, src, mem, non_blocking)
            if src is None:
                return dst
        else:
            refuse_host_array_in_capture(dev)    # not capturing: no size check below
    if src.is_cpu:
        host = src._array
        if src.shape == shape and dst.is_contiguous():
            if literal:
                refuse_large_upload_in_capture(dst.nbytes, dev)
            upload(dst, np.ascontiguousarray(cast_array(host, dst.dtype)))
            return dst
        # uploaded as it is, then cast, broadcast and laid out on the device
        if literal:
            refuse_large_upload_in_capture(src.nbytes, dev)
        tmp = empty_cuda(src.shape, src.dtype, dev)
        upload(tmp, np.ascontiguousarray(host))
        src = tmp
    elif src._device_index != dev:
        src = _to_device(src, dev)
    elif overlaps(dst, src):
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


def _from_pinned(dst, src, mem, non_blocking):
    """Copy CPU ``src``, on pinned memory ``mem``, toward CUDA ``dst`` with
    cuMemcpyHtoDAsync on the current stream: straight into ``dst`` when the
    dtypes, shapes and row-major layouts match (None returned); otherwise
    the bytes ``src`` spans go into a temporary on dst's device, returned as
    a CUDA tensor of src's layout for the cast and broadcast kernel.

    Inside a capture the copy becomes a graph node that reads the host
    buffer at every replay, and the graph keeps ``mem`` alive
    (note_capture_use). Outside one, ``non_blocking`` returns at once (mem
    outlives the copy: it records the stream), otherwise the stream is
    waited for, so the host may change the buffer on return."""
    dev = dst._device_index
    stream = current_stream_handle_of(dev)
    if src.numel() == 0:
        return None
    if src.shape == dst.shape and src.dtype is dst.dtype and src.is_contiguous() and dst.is_contiguous():
        out, target, nbytes, first = None, dst.data_ptr(), dst.nbytes, src.data_ptr()
    else:
        first, end = byte_span(src)
        nbytes = end - first
        storage = allocate(nbytes, dev, stream)
        out = new_cuda(storage, storage.ptr + (src.data_ptr() - first), src.shape, src.strides, src.dtype, dev)
        target = storage.ptr
    if copy_to_device(mem, target, first, nbytes, dev, stream, not non_blocking):
        note_capture_use(mem)
    return out


def _to_pinned(dst, src, mem, non_blocking):
    """Copy CUDA ``src`` into contiguous CPU ``dst`` on pinned memory ``mem``
    with cuMemcpyDtoHAsync on src's current stream, after casting and
    broadcasting on the device when the dtypes or layouts differ.

    Inside a capture the copy becomes a graph node that writes the host
    buffer at every replay (a host function queued after it may read it),
    and the graph keeps ``mem`` alive. Outside one, ``non_blocking`` returns
    at once (read ``dst`` after waiting for the stream), otherwise the
    stream is waited for and device errors are raised."""
    dev = src._device_index
    if dst.numel() == 0:
        return
    if not (src.shape == dst.shape and src.dtype is dst.dtype and src.is_contiguous()):
        src = copy_into(empty_cuda(dst.shape, dst.dtype, dev), src)
    if copy_to_host(mem, dst.data_ptr(), src.data_ptr(), dst.nbytes, dev, current_stream_handle_of(dev),
                    not non_blocking):
        note_capture_use(mem)
    elif not non_blocking:
        run_device_error_checks(dev)


def host_to_cuda(t, dev, literal, dtype=None):
    """CPU tensor ``t`` as a new contiguous CUDA tensor on device ``dev``
    (of ``dtype``, default t's), by the host-data rule of copy_into:
    ``literal`` says whether ``t`` was made from a literal (numbers, lists)
    inside the library, so that a capture may copy its values into the
    graph."""
    d = dtype or t.dtype
    # refused before allocating, as copy_into would refuse it after
    if literal:
        refuse_large_upload_in_capture(t.numel() * d.itemsize, dev)
    elif pinned_memory_of(t._array) is None:
        refuse_host_array_in_capture(dev)
    return copy_into(empty_cuda(t.shape, d, dev), t, literal=literal)


def _to_device(src, dev):
    """A contiguous copy of CUDA ``src`` on device ``dev`` (peer copy, ordered after
    the work queued on src's current stream)."""
    if not src.is_contiguous():
        src = src.contiguous()
    return peer_copy(empty_cuda(src.shape, src.dtype, dev), src)


def _fill_scalar(t, value):
    """``t.fill_(value)``: ``value`` (a real number or a one-element tensor),
    which must fit t's dtype (check_value with PyTorch's fill rule)."""
    if isinstance(value, Tensor):
        if value.numel() != 1:
            raise ValueError(f"fill_ takes a scalar or a one-element tensor, got shape {value.shape}")
        value = value.item()
    if isinstance(value, np.ndarray) or not isinstance(value, (numbers.Real, np.generic)):
        raise TypeError(f"fill value must be a real number, got {type(value).__name__}")
    v = check_value(value, t.dtype, fill=True)
    if t.is_cpu:
        t._array[...] = v
        return t
    _kernels.launch_elementwise("fill", "s0", t, (), (), (v,), ("f" if t.dtype.kind == "f" else "i",))
    return t


def rebuild_tensor(data, dtype_name, shape, device):
    """Make the tensor a pickle holds: ``data`` (its values' bytes, row-major)
    as ``shape`` of dtype ``dtype_name`` on ``device`` (``"cpu"`` or
    ``"cuda:N"``). Pickles name this function by its module and name
    (``Tensor.__reduce_ex__``): keep both, or leave an alias when moving it."""
    d = dt.BY_NAME[dtype_name]
    arr = np.frombuffer(data, dtype=d.numpy_dtype).reshape(shape)
    if not arr.flags.writeable:
        arr = arr.copy()
    t = new_cpu(arr, d)
    return t if device == "cpu" else t.to(device)


def _capture_repr(t):
    """The repr of a CUDA tensor while a capture is open: what is known
    without reading the device."""
    return (f"tensor(<captured: not readable during a CUDA graph capture>, shape={tuple(t.shape)}, "
            f"dtype={t.dtype!r}, device='{t.device}')")


# ------------------------------------------------------------------ the class

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
        return self.shape[normalize_dim(dim, self.ndim)]

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
        return self.strides[normalize_dim(dim, self.ndim)]

    def __len__(self):
        if self.ndim == 0:
            raise TypeError("len() of a 0-d tensor")
        return self.shape[0]

    def __iter__(self):
        if self.ndim == 0:
            raise TypeError("iteration over a 0-d tensor")
        return (self[i] for i in range(self.shape[0]))

    def __repr__(self):
        if self.is_cuda and host_reads_blocked(self._device_index,
                                               current_stream_handle_of(self._device_index)):
            return _capture_repr(self)     # a host copy would break the capture
        return format_tensor(self.numpy(), self.dtype, str(self.device) if self.is_cuda else None)

    # ---------------------------------------------------------------- movement

    def numpy(self):
        """Return the values as a NumPy array.

        For CPU tensors the array shares this tensor's memory; for CUDA
        tensors it is a host copy (cuMemcpyDtoHAsync, then the current stream
        is waited for, so it cannot be captured).
        """
        if self.is_cpu:
            return self._array
        return download(self)

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

    def cuda(self, device=None, non_blocking=False):
        """Return a copy on CUDA device ``device`` (default: current); self when
        already there. ``non_blocking`` as in :meth:`to`."""
        idx = cuda_device_index(device)
        return self.to(_device_cls("cuda", idx), non_blocking=non_blocking)

    def pin_memory(self):
        """Return a copy in page-locked (pinned) host memory; self when already pinned.

        Copies from pinned memory to a GPU run asynchronously with
        ``non_blocking=True`` (:meth:`to`, :meth:`copy_`), and inside a CUDA
        graph capture they become copies that read the host memory again at
        every replay: change the pinned tensor's values between replays and
        each replay sees the new ones. Copies from CUDA into a pinned tensor
        (``pinned.copy_(cuda_tensor)``) likewise write it at every replay.
        The memory is page-locked with
        cuMemHostAlloc (usable by every device) and freed when the last
        tensor over it is gone and the GPU work reading it has run; each
        call pins a new buffer (there is no cache of pinned buffers), so pin
        once and reuse the tensor.

        Returns
        -------
        Tensor
            A contiguous CPU tensor of the same values, dtype and shape.

        Raises
        ------
        RuntimeError
            For a CUDA tensor (only CPU tensors can be pinned).
        CudaUnavailableError
            Without a usable GPU: pinning host memory needs the CUDA driver.
        """
        if self.is_cuda:
            raise RuntimeError(f"cannot pin a CUDA tensor (on {self.device}): only CPU tensors can be pinned; "
                               f"pin_memory() copies a CPU tensor into page-locked host memory")
        if self.is_pinned():
            return self
        out = empty_host(self.shape, self.dtype, pin_memory=True)
        out._array[...] = self._array
        return out

    def is_pinned(self):
        """Return True for a CPU tensor in page-locked (pinned) host memory
        (:meth:`pin_memory`, ``pin_memory=True``); False otherwise, also for
        CUDA tensors and without a GPU."""
        return self.is_cpu and pinned_memory_of(self._array) is not None

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
            For a pinned CPU tensor (:meth:`pin_memory`) copied to CUDA:
            return as soon as the copy is queued on the current stream,
            as PyTorch does (its memory is kept until the copy has run;
            change its values only after waiting for the stream). Other
            copies behave the same either way: ordered on the current
            stream, and copies to the host wait for it.

        Returns
        -------
        Tensor
            ``self`` when nothing changes and ``copy`` is False, else a new tensor.

        Raises
        ------
        CudaError
            ``CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED`` for a CPU tensor in
            pageable memory copied to CUDA inside a CUDA graph capture
            (see :meth:`copy_`).

        Notes
        -----
        Casts are silent, as PyTorch's, and give the same values on the CPU
        and on CUDA: floating values cast to an integer dtype are truncated
        toward zero, saturate at the dtype's limits (300.0 gives 127 in
        int8, -1.0 gives 0 in uint8, inf the largest value) and NaN becomes
        0; integers cast to a narrower integer dtype wrap around (300 gives
        44 in int8); casts to bool give True for nonzero values, NaN
        included; floating casts round to nearest, overflowing to ±inf.
        PyTorch leaves float-to-integer casts past the range undefined (its
        CPU and CUDA results differ there); tensorplay defines them so.
        """
        for a in args:
            if isinstance(a, Tensor):
                device, dtype = a.device, a.dtype
            elif isinstance(a, dt.dtype) or (isinstance(a, str) and a in dt.BY_NAME) or \
                    isinstance(a, (np.dtype, type)):
                dtype = a
            else:
                device = a
        d = self.dtype if dtype is None else dt.as_dtype(dtype)
        if device is None:
            dev = self._device_index
        else:
            dev = resolve_device(device)
        if not copy and d is self.dtype and dev == self._device_index:
            return self
        if self.is_cpu and dev >= 0 and pinned_memory_of(self._array) is None:
            refuse_host_array_in_capture(dev)    # before allocating
        return copy_into(_empty(self.shape, d, dev), self, non_blocking)

    def clone(self):
        """Return a contiguous copy on the same device."""
        return copy_into(_empty(self.shape, self.dtype, self._device_index), self)

    def contiguous(self):
        """Return self if contiguous, else a contiguous copy."""
        return self if self.is_contiguous() else self.clone()

    def copy_(self, src, non_blocking=False):
        """Copy ``src`` into this tensor, in place.

        Any device pair, dtype casts, broadcasting of ``src`` to this shape
        and any layout. Asynchronous on the current stream for CUDA
        destinations (cuMemcpyAsync for contiguous same-dtype copies, a
        generated copy kernel otherwise).

        Host data reaches a CUDA tensor by what it is; inside a CUDA graph
        capture that decides what a replay copies:

        - a CPU tensor in pinned memory (:meth:`pin_memory`,
          ``pin_memory=True``), or a NumPy array over one: cuMemcpyHtoDAsync
          from it. A capture records the copy, so every replay reads the
          host memory again (the graph keeps it alive); with
          ``non_blocking=True`` the call returns without waiting;
        - Python numbers, NumPy scalars, lists and tuples: up to 4096 bytes
          are written by a kernel carrying them in its parameters, so a
          capture copies these values into the graph; more raise CudaError
          (``CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED``) inside a capture;
        - any other CPU tensor or NumPy array (pageable memory): copied
          outside a capture; inside one it raises CudaError
          (``CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED``), whatever its size,
          before any GPU work (the capture stays usable), since a graph
          cannot read pageable memory at replay and would silently keep
          today's values. Pin it, or copy it into a CUDA tensor before the
          capture.

        Values of another dtype are cast silently, by the rule of
        :meth:`to`, on the CPU and on CUDA alike.

        Parameters
        ----------
        src : Tensor, array-like or number
            The values; NumPy arrays, sequences, numbers and objects with
            ``__cuda_array_interface__`` or ``__dlpack__`` are accepted.
        non_blocking : bool, optional
            From pinned host memory to CUDA: return once the copy is
            queued (change the source only after waiting for the current
            stream). From CUDA into a CPU tensor in pinned memory: return
            once the copy is queued on the source's current stream (read
            ``self`` only after waiting for it). Other copies behave the
            same either way. Inside a CUDA graph capture, copies between
            pinned memory and CUDA become graph nodes that read or write
            the pinned memory at every replay; other copies between the
            host and CUDA are refused.

        Returns
        -------
        Tensor
            ``self``.
        """
        return copy_into(self, src, non_blocking)

    def fill_(self, value):
        """Fill this tensor with ``value``, in place.

        As ``torch.Tensor.fill_``, the value must fit the dtype: an int
        must lie in an integer dtype's range (for unsigned dtypes negative
        ints down to minus the largest value wrap around: -1 fills uint8
        with 255); a float given for an integer dtype must be finite and in
        its range (it is truncated toward zero); a value for a floating
        dtype must be NaN, infinite or at most its largest finite value (a
        finite value past it is refused, not rounded to infinity); anything
        fits bool (nonzero is True). :func:`tensorplay.full` and
        ``full_like`` follow the same rule.

        Parameters
        ----------
        value : bool, int, float or Tensor
            A real number, or a one-element tensor (its value).

        Returns
        -------
        Tensor
            ``self``.

        Raises
        ------
        OverflowError
            If the value does not fit the dtype (the message names both).
        """
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

    # ---------------------------------------------------------------- pickling and copies

    def __reduce_ex__(self, protocol):
        """Pickle the values, dtype, shape and device (as PyTorch: a CUDA
        tensor comes back on the same device index).

        A view pickles its own values, not its base's. CUDA values are read
        to the host here, which waits for the current stream; inside a CUDA
        graph capture that raises CudaError
        (``CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED``) and the capture stays
        usable."""
        if self.is_cuda:
            dev = self._device_index
            refuse_in_capture(dev, current_stream_handle_of(dev), (
                "a CUDA tensor cannot be pickled inside a CUDA graph capture: pickling reads its values "
                "to the host, which a capture cannot do; pickle it before or after the capture"))
            host = download(self)
        else:
            host = np.ascontiguousarray(self._array)
        raw = host.reshape(-1).view(np.uint8)
        data = pickle.PickleBuffer(raw) if protocol >= 5 else raw.tobytes()
        return (rebuild_tensor, (data, self.dtype.name, self.shape, str(self.device)))

    def __deepcopy__(self, memo):
        """Return a copy on the same device (:meth:`clone`), as PyTorch's ``copy.deepcopy``."""
        copy = self.clone()
        memo[id(self)] = copy
        return copy

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
