# SPDX-License-Identifier: Apache-2.0
"""Raw memory copies and fills between host and device addresses, and the
questions a copy asks first (is a capture under way? whose memory is this?).

Addresses are ints; the caller keeps the host buffers alive for the call.
"""

from cuda.bindings cimport cydriver
from libc.stdint cimport uintptr_t

from tensorplay._driver.context cimport check, ensure_context, open_capture_count, primary_context
from tensorplay._driver.context import make_error


cdef int _refuse_in_capture(int device, uintptr_t stream, str reason) except -1:
    cdef cydriver.CUstreamCaptureStatus status
    with nogil:
        ensure_context(device)
        check(cydriver.cuStreamIsCapturing(<cydriver.CUstream>stream, &status))
    if status != cydriver.CU_STREAM_CAPTURE_STATUS_NONE:
        raise make_error(cydriver.CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, reason)
    return 0


def refuse_in_capture(int device, uintptr_t stream, str reason):
    """Raise CudaError CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED saying ``reason``
    while ``stream`` of ``device`` is capturing; otherwise do nothing.

    The only driver call is cuStreamIsCapturing, which a capture allows, so
    the capture stays valid after the error.
    """
    _refuse_in_capture(device, stream, reason)


def memcpy_htod_async(uintptr_t dst, uintptr_t src_host, size_t nbytes, int device, uintptr_t stream):
    """cuMemcpyHtoDAsync; from pageable memory the driver stages the data
    before returning, so the host buffer may be dropped afterwards."""
    if nbytes == 0:
        return
    # the driver would capture a copy from this pageable buffer, which is
    # gone by the time the graph replays
    _refuse_in_capture(device, stream, "a copy from pageable host memory cannot be captured in a CUDA graph: "
                                       "copy the data into a CUDA tensor before the capture")
    with nogil:
        check(cydriver.cuMemcpyHtoDAsync(<cydriver.CUdeviceptr>dst, <const void*>src_host, nbytes,
                                         <cydriver.CUstream>stream))


def memcpy_dtoh(uintptr_t dst_host, uintptr_t src, size_t nbytes, int device, uintptr_t stream):
    """cuMemcpyDtoHAsync on ``stream``, then wait for that stream (GIL released)."""
    if nbytes == 0:
        return
    with nogil:
        ensure_context(device)
        check(cydriver.cuMemcpyDtoHAsync(<void*>dst_host, <cydriver.CUdeviceptr>src, nbytes,
                                         <cydriver.CUstream>stream))
        check(cydriver.cuStreamSynchronize(<cydriver.CUstream>stream))


def host_reads_blocked(int device, uintptr_t stream):
    """Return True when copying device memory to the host now would break a
    CUDA graph capture.

    True while a tensorplay capture is open on any device or thread (the
    process-wide count: no driver call), or while ``stream`` of ``device`` is
    capturing for another library (cuStreamIsCapturing; the legacy stream
    answers CUDA_ERROR_STREAM_CAPTURE_IMPLICIT while another stream captures).
    """
    cdef cydriver.CUstreamCaptureStatus status = cydriver.CU_STREAM_CAPTURE_STATUS_NONE
    cdef cydriver.CUresult r
    if open_capture_count():
        return True
    with nogil:
        ensure_context(device)
        # not check(): the result code is part of the answer
        r = cydriver.cuStreamIsCapturing(<cydriver.CUstream>stream, &status)
    if r == cydriver.CUDA_ERROR_STREAM_CAPTURE_IMPLICIT:
        return True
    return r == cydriver.CUDA_SUCCESS and status != cydriver.CU_STREAM_CAPTURE_STATUS_NONE


def memcpy_dtod_async(uintptr_t dst, uintptr_t src, size_t nbytes, int device, uintptr_t stream):
    """cuMemcpyAsync between two allocations of one device."""
    if nbytes == 0:
        return
    with nogil:
        ensure_context(device)
        check(cydriver.cuMemcpyAsync(<cydriver.CUdeviceptr>dst, <cydriver.CUdeviceptr>src, nbytes,
                                     <cydriver.CUstream>stream))


def memcpy_peer_async(uintptr_t dst, int dst_device, uintptr_t src, int src_device,
                      size_t nbytes, uintptr_t stream):
    """cuMemcpyPeerAsync; works with or without peer access enabled."""
    if nbytes == 0:
        return
    cdef cydriver.CUcontext dctx = primary_context(dst_device)
    cdef cydriver.CUcontext sctx = primary_context(src_device)
    with nogil:
        ensure_context(dst_device)
        check(cydriver.cuMemcpyPeerAsync(<cydriver.CUdeviceptr>dst, dctx, <cydriver.CUdeviceptr>src,
                                         sctx, nbytes, <cydriver.CUstream>stream))


def memset_d8_async(uintptr_t dst, unsigned char value, size_t nbytes, int device, uintptr_t stream):
    """cuMemsetD8Async: set ``nbytes`` bytes from ``dst`` to ``value`` on ``stream``."""
    if nbytes == 0:
        return
    with nogil:
        ensure_context(device)
        check(cydriver.cuMemsetD8Async(<cydriver.CUdeviceptr>dst, value, nbytes, <cydriver.CUstream>stream))


def pointer_device(uintptr_t ptr):
    """Return the device ordinal owning device address ``ptr`` (CudaError if it
    is not device memory), cuPointerGetAttribute."""
    cdef int ordinal = -1
    cdef int mtype = 0
    with nogil:
        check(cydriver.cuPointerGetAttribute(&mtype, cydriver.CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                                             <cydriver.CUdeviceptr>ptr))
        check(cydriver.cuPointerGetAttribute(&ordinal, cydriver.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                                             <cydriver.CUdeviceptr>ptr))
    return ordinal, mtype
