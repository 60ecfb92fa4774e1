# SPDX-License-Identifier: Apache-2.0
"""Zero-copy exchange with other libraries: DLPack and the CUDA Array Interface."""

from __future__ import annotations

import numpy as np

from tensorplay import _dtypes as dt
from tensorplay._driver.context import device_index as _cuda_device_index
from tensorplay._tensor.dlpack import DLPACK_DEVICE_CPU, DLPACK_DEVICE_CUDA, dlpack_import
from tensorplay._driver.memcpy import pointer_device
from tensorplay._driver.stream import Event, ExternalStream, current_stream, current_stream_handle_of
from tensorplay._tensor.base import ForeignStorage
from tensorplay._tensor.args import contiguous_strides
from tensorplay._tensor.creation import tensor
from tensorplay._tensor.tensor import Tensor, new_cpu, new_cuda

__all__ = ["from_dlpack", "as_tensor"]



def _span_bytes(shape, strides, itemsize):
    """Bytes from the first element to one past the furthest one."""
    if any(s == 0 for s in shape):
        return 0
    hi = sum((s - 1) * st for s, st in zip(shape, strides) if st > 0)
    return (hi + 1) * itemsize


def _check_device_pointer(ptr, device, what):
    if ptr == 0:
        return
    ordinal, _ = pointer_device(ptr)
    if ordinal != device:
        raise ValueError(f"{what}: pointer {ptr:#x} belongs to cuda:{ordinal}, not cuda:{device}")


def from_dlpack(ext_tensor):
    """Make a tensor sharing memory with ``ext_tensor`` through DLPack.

    For CUDA data the producer is asked (through the ``stream`` argument of
    ``__dlpack__``) to order its pending work before this thread's current
    stream, so the tensor can be used at once. No copy is made; the tensor
    keeps the producer's memory alive.

    Parameters
    ----------
    ext_tensor : object
        Anything with ``__dlpack__`` and ``__dlpack_device__`` (a PyTorch,
        CuPy, JAX or NumPy array), or an unconsumed DLPack capsule.

    Returns
    -------
    Tensor
        A CUDA tensor over the same device memory, or a CPU tensor over the
        same host memory.

    Raises
    ------
    BufferError
        For devices other than the CPU and CUDA, and for unsupported dtypes.
    """
    obj = ext_tensor
    if type(obj).__name__ == "PyCapsule":
        capsule = obj
    else:
        if not hasattr(obj, "__dlpack__"):
            raise TypeError(f"{type(obj).__name__} does not support DLPack (__dlpack__)")
        dev_type, dev_id = obj.__dlpack_device__()
        if dev_type == DLPACK_DEVICE_CPU:
            arr = np.from_dlpack(obj)
            return new_cpu(arr)
        if dev_type != DLPACK_DEVICE_CUDA:
            raise BufferError(f"unsupported DLPack device type {dev_type}")
        dev = _cuda_device_index(int(dev_id))
        s = current_stream_handle_of(dev)
        stream_arg = 1 if s == 0 else s       # DLPack: 1 is the legacy default stream
        try:
            capsule = obj.__dlpack__(stream=stream_arg, max_version=(1, 1))
        except TypeError:
            capsule = obj.__dlpack__(stream=stream_arg)
    owner, ptr, shape, strides, (code, bits, lanes), (dev_type, dev_id), _ro = dlpack_import(capsule)
    d = dt.from_dlpack_type(code, bits, lanes)
    if dev_type == DLPACK_DEVICE_CPU:
        raise BufferError("CPU DLPack capsules: pass the producing object instead (NumPy imports them)")
    if dev_type != DLPACK_DEVICE_CUDA:
        raise BufferError(f"unsupported DLPack device type {dev_type}")
    dev = _cuda_device_index(int(dev_id))
    if strides is None:
        strides = contiguous_strides(shape)
    storage = ForeignStorage(owner, ptr, _span_bytes(shape, strides, d.itemsize), dev)
    return new_cuda(storage, ptr, shape, strides, d, dev)


def _from_cuda_array_interface(obj):
    cai = obj.__cuda_array_interface__
    try:
        shape = tuple(int(s) for s in cai["shape"])
        typestr = cai["typestr"]
        ptr, _readonly = cai["data"]
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"malformed __cuda_array_interface__ of {type(obj).__name__}: {exc}") from None
    if cai.get("mask") is not None:
        raise ValueError("__cuda_array_interface__ masks are not supported")
    d = dt.from_typestr(typestr)
    if cai.get("strides") is None:
        strides = contiguous_strides(shape)
    else:
        bs = tuple(int(s) for s in cai["strides"])
        if any(s % d.itemsize for s in bs):
            raise ValueError(f"strides {bs} are not multiples of the item size {d.itemsize}")
        strides = tuple(s // d.itemsize for s in bs)
    ptr = int(ptr or 0)
    if ptr:
        dev, _ = pointer_device(ptr)
    else:
        dev = _cuda_device_index(None)
    stream = cai.get("stream") if cai.get("version", 0) >= 3 else None
    if stream is not None:
        if stream == 0:
            raise ValueError("__cuda_array_interface__ stream 0 is disallowed by the protocol")
        producer = {1: 0, 2: 2}.get(stream, stream)   # 1: legacy default, 2: per-thread default
        mine = current_stream_handle_of(dev)
        if producer != mine:
            ev = Event()
            ev.record(ExternalStream(producer, device=dev))
            current_stream(dev).wait_event(ev)
    storage = ForeignStorage(obj, ptr, _span_bytes(shape, strides, d.itemsize), dev)
    return new_cuda(storage, ptr, shape, strides, d, dev)


def as_tensor(data, dtype=None, device=None):
    """Make a tensor from ``data``, sharing its memory where possible.

    Tensors are returned as they are; objects with
    ``__cuda_array_interface__`` (v3) or ``__dlpack__`` are wrapped without
    a copy; NumPy arrays become CPU tensors over the same memory; anything
    else is copied as :func:`tensor` does. A copy also happens when
    ``dtype`` or ``device`` asks for one.

    Parameters
    ----------
    data : object
        A tensor, an object exporting device or host memory, a NumPy array,
        or nested sequences of numbers.
    dtype : dtype, str or None, optional
        The dtype wanted; default the data's own.
    device : device, str, int or None, optional
        The device wanted; default where the data is.

    Returns
    -------
    Tensor
        A tensor sharing ``data``'s memory when no conversion was needed.
    """
    obj = data
    if isinstance(obj, Tensor):
        t = obj
    elif hasattr(obj, "__cuda_array_interface__"):
        try:
            t = _from_cuda_array_interface(obj)
        except TypeError:
            if not hasattr(obj, "__dlpack__"):
                raise
            # the interface has no typestr for some dtypes (PyTorch's bfloat16: '<V2'); DLPack has
            t = from_dlpack(obj)
    elif hasattr(obj, "__dlpack__") and not isinstance(obj, np.ndarray):
        t = from_dlpack(obj)
    elif isinstance(obj, np.ndarray) and obj.dtype.isnative:
        try:
            t = new_cpu(obj)
        except TypeError:
            t = tensor(obj, dtype=dtype, device=device)
    else:
        return tensor(obj, dtype=dtype, device=device)
    if dtype is not None or device is not None:
        t = t.to(dtype=dtype, device=device)
    return t
