# SPDX-License-Identifier: Apache-2.0
"""Moving tensor data between the host and the devices: uploads (in kernel
parameters or by cuMemcpyHtoDAsync) and what a capture refuses of them,
downloads, peer copies, ``tensorplay.cuda.synchronize``, and the two things
the tensor core receives from the floors above it. Copies from pinned host
memory are tensorplay._driver.pinned's (see tensor.copy_into).

What the tensor core receives from above
----------------------------------------
The tensor core sits below the ops and below interop, yet two of its paths
run code from there: a host read reports the index errors that the
indexing kernels flagged on the device, and ``copy_`` accepts foreign
arrays (CUDA Array Interface, DLPack), which interop converts. Each is a
slot here, filled with a ``register_*`` function; ``tensorplay/__init__.py``
fills them all in one place, once every module is imported (no module
registers anything as a side effect of being imported), so the order of
imports does not matter. Until then the slots are empty: no check runs and
foreign arrays are refused.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from tensorplay._driver.context import device_index as cuda_device_index
from tensorplay._driver.context import synchronize as synchronize_context
from tensorplay._driver.memcpy import memcpy_dtoh, memcpy_htod_async, memcpy_peer_async, refuse_in_capture
from tensorplay._driver.stream import Event, current_stream, current_stream_handle_of, raise_host_errors
from tensorplay._driver.teardown import run_deferred_teardown
from tensorplay._kernels.param_upload import PARAM_UPLOAD_MAX_BYTES, launch_param_write

if TYPE_CHECKING:
    from tensorplay._device import DeviceLike

__all__ = ["register_device_error_check", "run_device_error_checks", "register_foreign_converter",
           "foreign_converter", "synchronize", "upload", "refuse_large_upload_in_capture",
           "refuse_host_array_in_capture", "download", "peer_copy"]


# ------------------------------------------------------------------ what comes from above

# Called with a device index at every synchronizing host read, so kernels that
# flag errors on the device (out-of-range device indices) are reported there.
# What host functions (launch_host_func) raised is one of them.
_device_error_checks: list[Callable[[int], None]] = [raise_host_errors]

# Converts a foreign array (CUDA Array Interface or DLPack) to a Tensor.
_foreign_converter: list[Callable[[object], object] | None] = [None]


def register_device_error_check(check):
    """Run ``check(device_index)`` at every synchronizing host read (once, however often registered)."""
    if check not in _device_error_checks:
        _device_error_checks.append(check)


def run_device_error_checks(dev):
    """Raise the errors the registered checks find on device ``dev``."""
    for check in _device_error_checks:
        check(dev)


def register_foreign_converter(convert):
    """Install ``convert(obj) -> Tensor`` for operands with
    ``__cuda_array_interface__`` or ``__dlpack__`` (tensorplay._tensor.interop's as_tensor)."""
    _foreign_converter[0] = convert


def foreign_converter():
    """The registered converter of foreign arrays, or None."""
    return _foreign_converter[0]


# ------------------------------------------------------------------ copies and waits

def upload(dst, host):
    """Copy the contiguous host array ``host`` (dst's dtype and shape) into
    contiguous CUDA ``dst`` on the current stream: up to PARAM_UPLOAD_MAX_BYTES
    inside a kernel's parameters (capturable, see _kernels.param_upload),
    larger data with cuMemcpyHtoDAsync (callers first refuse that inside a
    capture with refuse_large_upload_in_capture)."""
    dev = dst._device_index
    stream = current_stream_handle_of(dev)
    if host.nbytes <= PARAM_UPLOAD_MAX_BYTES:
        launch_param_write(dst.data_ptr(), host.tobytes(), dev, stream)
    else:
        memcpy_htod_async(dst.data_ptr(), host.ctypes.data, host.nbytes, dev, stream)


def refuse_large_upload_in_capture(nbytes, dev):
    """Raise CudaError CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, before any GPU
    work, when ``nbytes`` of host data are too many to reach device ``dev``
    inside the capture running on its current stream."""
    if nbytes > PARAM_UPLOAD_MAX_BYTES:
        refuse_in_capture(dev, current_stream_handle_of(dev), (
            f"{nbytes} bytes of host data cannot be copied to the GPU inside a CUDA graph capture: "
            f"up to {PARAM_UPLOAD_MAX_BYTES} bytes travel inside the graph (in kernel parameters), "
            f"larger data needs a copy from pageable host memory, which a graph cannot hold; "
            f"create the tensor before the capture, or copy the data into a CUDA tensor made before it"))


def refuse_host_array_in_capture(dev):
    """Raise CudaError CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, before any GPU
    work, while the current stream of device ``dev`` captures: a CPU tensor
    or NumPy array in pageable memory can change after the capture, and a
    graph cannot read pageable memory when it replays (PyTorch refuses it
    too). Pinned host memory is read at every replay instead; Python numbers
    and lists, which cannot change, are copied into the graph."""
    refuse_in_capture(dev, current_stream_handle_of(dev), (
        "a CPU tensor or NumPy array in pageable memory cannot be copied to the GPU inside a CUDA graph "
        "capture: the graph would replay the values it holds now, not the ones it holds at each replay; "
        "pin it (tensor.pin_memory(), or pin_memory=True when making it) so that every replay reads it "
        "again, or copy it into a CUDA tensor before the capture (Python numbers and lists are copied "
        "into the graph as they are)"))


def download(src):
    """A new host array with CUDA ``src``'s values (waits for the current
    stream). Refused inside a capture: the graph would write a buffer that
    is gone by its replays, and the values are not there yet."""
    dev = src._device_index
    refuse_in_capture(dev, current_stream_handle_of(dev), (
        "copying CUDA memory to pageable host memory (.numpy(), .item(), .tolist(), .cpu(), or copy_ into a "
        "CPU tensor) cannot be captured in a CUDA graph: the values are not computed until a replay; copy "
        "into a CPU tensor in pinned memory (pin_memory()) made before the capture, which every replay "
        "writes, and read it after the replay (or in a host function queued after the copy)"))
    if not src.is_contiguous():
        src = src.contiguous()
    d = src.dtype
    out = np.empty(src.shape, dtype=d.numpy_dtype)
    memcpy_dtoh(out.ctypes.data, src.data_ptr(), out.nbytes, dev, current_stream_handle_of(dev))
    run_device_error_checks(dev)
    return out


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
    run_deferred_teardown()              # what died inside a capture, now that the work is done
    run_device_error_checks(cuda_device_index(device))


def peer_copy(out, src):
    """Copy contiguous CUDA ``src`` into contiguous ``out`` (same dtype and
    shape) on another device, ordered after the work queued on src's current
    stream; return ``out``."""
    dev, sdev = out._device_index, src._device_index
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
