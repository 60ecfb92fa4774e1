# SPDX-License-Identifier: Apache-2.0
"""Page-locked (pinned) host memory: buffers from cuMemHostAlloc that NumPy
arrays, and so CPU tensors, sit on, and copies between them and a device.

A copy from or to pinned memory runs asynchronously (the DMA engine reads
or writes the buffer while the host goes on) and can be captured into a
CUDA graph, where it reads or writes the buffer again at every replay. Both
need the buffer alive until the work that uses it has run, so a buffer
remembers the streams of work that may still use it (``record_stream``, as
the device allocator's blocks do). When its last user drops it, it is freed
at once if none is recorded; otherwise an event is recorded on each of
those streams and cuMemFreeHost runs once they have all completed. Freeing
never happens while a tensorplay capture is open (cuMemFreeHost may
synchronize, which would break it): such frees wait for the next pinned
allocation or free after the captures end.

Each buffer is its own cuMemHostAlloc and cuMemFreeHost, with no cache of
freed buffers as PyTorch's CachingHostAllocator keeps: page-locking costs
tens of microseconds to milliseconds per call, so pin a buffer once and
reuse it (copy new values into it) rather than pinning in a loop.
"""

cimport cython
from cpython.buffer cimport PyBuffer_FillInfo
from cuda.bindings cimport cydriver
from libc.stdint cimport uintptr_t

from tensorplay._driver.context cimport (check, ensure_context, get_current_device, open_capture_count,
                                         primary_context, validate_device)

import builtins

import numpy as np

from tensorplay._driver.context import CudaUnavailableError

# Python's memoryview (in Cython the name is Cython's own type)
cdef object _memoryview = builtins.memoryview

# the address an empty buffer exports (NumPy wants one that is not NULL)
cdef char _empty_buffer[16]

cdef Py_ssize_t _live = 0            # PinnedMemory buffers alive
cdef Py_ssize_t _live_bytes = 0
cdef list _pending = []              # _PendingFree: buffers dropped while work may still read them


@cython.final
cdef class _PendingFree:
    """A dropped buffer whose free waits for the work recorded on it."""
    cdef uintptr_t ptr
    cdef int device
    cdef set uses                    # (stream, context)
    cdef list events                 # CUevent handles as ints, once recorded
    cdef bint recorded


cdef void _free_host(uintptr_t ptr, int device) noexcept:
    """cuMemFreeHost, never raising (a dead context has freed it already)."""
    try:
        ensure_context(device)
    except BaseException:
        pass
    with nogil:
        cydriver.cuMemFreeHost(<void*>ptr)


cdef uintptr_t _record_event(uintptr_t stream, uintptr_t context) noexcept:
    """An event recorded on ``stream`` of ``context`` now (0 when that fails:
    the stream is waited for instead, so whatever it queued has run)."""
    cdef cydriver.CUevent ev = NULL
    cdef cydriver.CUcontext previous
    cdef cydriver.CUresult r
    with nogil:
        # the stream's context, pushed and popped: the thread's current
        # context (which ensure_context tracks) is left as it was
        if cydriver.cuCtxPushCurrent(<cydriver.CUcontext>context) != cydriver.CUDA_SUCCESS:
            cydriver.cuStreamSynchronize(<cydriver.CUstream>stream)
            return 0
        r = cydriver.cuEventCreate(&ev, cydriver.CU_EVENT_DISABLE_TIMING)
        if r == cydriver.CUDA_SUCCESS:
            r = cydriver.cuEventRecord(ev, <cydriver.CUstream>stream)
            if r != cydriver.CUDA_SUCCESS:
                cydriver.cuEventDestroy(ev)
                ev = NULL
        if ev == NULL:
            cydriver.cuStreamSynchronize(<cydriver.CUstream>stream)
        cydriver.cuCtxPopCurrent(&previous)
    return <uintptr_t>ev


cdef bint _try_free(_PendingFree p, bint wait) noexcept:
    """Free ``p`` if the work recorded on it has completed (``wait``: wait
    for it); False while some is still running."""
    cdef cydriver.CUresult r
    cdef uintptr_t ev
    try:
        if not p.recorded:
            p.events = []
            for stream, context in p.uses:
                ev = _record_event(stream, context)
                if ev:
                    p.events.append(ev)
            p.recorded = True
        while p.events:
            ev = p.events[len(p.events) - 1]
            with nogil:
                if wait:
                    r = cydriver.cuEventSynchronize(<cydriver.CUevent>ev)
                else:
                    r = cydriver.cuEventQuery(<cydriver.CUevent>ev)
            # any other answer (a dead context) counts as done: nothing runs there any more
            if r == cydriver.CUDA_ERROR_NOT_READY:
                return False
            cydriver.cuEventDestroy(<cydriver.CUevent>ev)
            p.events.pop()
    except BaseException:
        pass
    _free_host(p.ptr, p.device)
    return True


cdef Py_ssize_t _free_pending(bint wait) noexcept:
    """Free the dropped buffers whose recorded work has completed (never
    while a capture is open); return how many still wait."""
    global _pending
    if open_capture_count() or not _pending:
        return len(_pending)
    todo = _pending
    _pending = []                    # a buffer dropped meanwhile queues here
    for p in todo:
        if not _try_free(<_PendingFree>p, wait):
            _pending.append(p)
    return len(_pending)


@cython.final
cdef class PinnedMemory:
    """Page-locked host memory of ``size`` bytes (cuMemHostAlloc with
    CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP: every device and
    context may use it, and kernels may read it through its address).

    Exports the bytes through the buffer protocol (writable), so
    ``numpy.frombuffer`` puts an array on it; the buffer lives while any
    array over it does, and while work recorded with ``record_stream`` may
    still read it.

    Parameters
    ----------
    size : int
        Bytes; 0 allocates nothing.

    Raises
    ------
    CudaUnavailableError
        Without a usable GPU: pinning host memory needs the driver.
    """

    def __cinit__(self, size_t size):
        global _live, _live_bytes
        cdef int d = get_current_device()
        cdef void* p = NULL
        cdef cydriver.CUresult r = cydriver.CUDA_SUCCESS
        cdef cydriver.CUstreamCaptureMode mode
        self.ptr = <uintptr_t>_empty_buffer
        self.size = 0
        self.device = d
        try:
            validate_device(d)
        except CudaUnavailableError as exc:
            raise CudaUnavailableError(f"page-locked (pinned) host memory needs CUDA, but {exc}") from None
        _free_pending(False)
        if size == 0:
            return
        for attempt in range(2):
            mode = cydriver.CU_STREAM_CAPTURE_MODE_RELAXED
            with nogil:
                ensure_context(d)
                # a global capture elsewhere refuses the call otherwise; relax
                # this thread for it, as for cuMemAlloc in the device allocator
                check(cydriver.cuThreadExchangeStreamCaptureMode(&mode))
                r = cydriver.cuMemHostAlloc(&p, size, cydriver.CU_MEMHOSTALLOC_PORTABLE
                                            | cydriver.CU_MEMHOSTALLOC_DEVICEMAP)
                check(cydriver.cuThreadExchangeStreamCaptureMode(&mode))
            if r != cydriver.CUDA_ERROR_OUT_OF_MEMORY or attempt or not _pending:
                break
            _free_pending(True)      # out of memory: wait for the dropped buffers, then retry
        check(r)
        self.ptr = <uintptr_t>p
        self.size = size
        _live += 1
        _live_bytes += size

    def __dealloc__(self):
        global _live, _live_bytes
        cdef _PendingFree p
        if self.size == 0:
            return
        try:
            _live -= 1
            _live_bytes -= self.size
            if self._uses or open_capture_count():
                p = _PendingFree.__new__(_PendingFree)
                p.ptr = self.ptr
                p.device = self.device
                p.uses = self._uses if self._uses else set()
                p.recorded = False
                _pending.append(p)
                _free_pending(False)
                return
        except BaseException:
            pass
        _free_host(self.ptr, self.device)

    def __getbuffer__(self, Py_buffer* buffer, int flags):
        PyBuffer_FillInfo(buffer, self, <void*>self.ptr, self.size, 0, flags)

    def __releasebuffer__(self, Py_buffer* buffer):
        pass

    cdef int _use(self, uintptr_t stream, uintptr_t context) except -1:
        if self.size == 0:
            return 0
        if self._uses is None:
            self._uses = set()
        self._uses.add((stream, context))
        return 0

    def record_stream(self, uintptr_t stream):
        """Mark the buffer as read by the work queued on ``stream`` (a
        stream handle of any device): when the buffer is dropped, it is
        freed only after the work queued there by then has run."""
        cdef cydriver.CUcontext ctx = NULL
        if stream <= 2:
            # the legacy and per-thread default streams belong to the
            # current context
            with nogil:
                check(cydriver.cuCtxGetCurrent(&ctx))
            if ctx == NULL:
                ctx = primary_context(self.device)
        else:
            with nogil:
                check(cydriver.cuStreamGetCtx(<cydriver.CUstream>stream, &ctx))
        self._use(stream, <uintptr_t>ctx)

    def __repr__(self):
        return f"<PinnedMemory {self.size} bytes at {self.ptr:#x}>"


def pinned_memory_of(array):
    """The PinnedMemory under NumPy ``array``, or None for any other memory.

    Followed down to the owner of the memory: array bases, the memoryview
    ``numpy.frombuffer`` keeps, and the ``base`` of the objects other
    views keep (``as_strided``'s).
    """
    b = array
    for _ in range(64):
        if isinstance(b, PinnedMemory) or b is None:
            break
        b = b.obj if isinstance(b, _memoryview) else getattr(b, "base", None)
    return b if isinstance(b, PinnedMemory) else None


def empty_pinned(shape, dtype):
    """A new NumPy array of ``shape`` and NumPy ``dtype`` over pinned memory
    (uninitialised, C-contiguous)."""
    dtype = np.dtype(dtype)
    n = 1
    for s in shape:
        n *= s
    return np.frombuffer(PinnedMemory(n * dtype.itemsize), dtype=dtype).reshape(shape)


def copy_to_device(PinnedMemory mem not None, uintptr_t dst, uintptr_t src, size_t nbytes, int device,
                   uintptr_t stream, bint blocking):
    """cuMemcpyHtoDAsync of ``nbytes`` at ``src`` inside ``mem`` to device
    address ``dst`` on ``stream`` of ``device``; return True when ``stream``
    is capturing (the copy became a graph node that reads ``mem`` at every
    replay: the caller keeps ``mem`` alive with the graph).

    Outside a capture, ``blocking`` waits for the stream (the host may then
    change the buffer, as after a pageable copy); otherwise ``mem`` records
    the stream, so it outlives the copy however soon it is dropped.
    """
    return _copy(mem, src, dst, nbytes, device, stream, blocking, False)


def copy_to_host(PinnedMemory mem not None, uintptr_t dst, uintptr_t src, size_t nbytes, int device,
                 uintptr_t stream, bint blocking):
    """cuMemcpyDtoHAsync of ``nbytes`` at device address ``src`` to ``dst``
    inside ``mem`` on ``stream`` of ``device``; return True when ``stream``
    is capturing (the copy became a graph node that writes ``mem`` at every
    replay: the caller keeps ``mem`` alive with the graph).

    Outside a capture, ``blocking`` waits for the stream (the host may then
    read the buffer); otherwise the values arrive once the stream gets there
    (wait for it before reading) and ``mem`` records the stream, so it
    outlives the copy however soon it is dropped.
    """
    return _copy(mem, dst, src, nbytes, device, stream, blocking, True)


cdef bint _copy(PinnedMemory mem, uintptr_t host, uintptr_t dev_ptr, size_t nbytes, int device,
                uintptr_t stream, bint blocking, bint to_host) except -1:
    cdef cydriver.CUstreamCaptureStatus status = cydriver.CU_STREAM_CAPTURE_STATUS_NONE
    if host < mem.ptr or host + nbytes > mem.ptr + mem.size:
        raise ValueError(f"{nbytes} bytes at {host:#x} are not inside {mem!r}")
    with nogil:
        ensure_context(device)
        check(cydriver.cuStreamIsCapturing(<cydriver.CUstream>stream, &status))
        if nbytes:
            if to_host:
                check(cydriver.cuMemcpyDtoHAsync(<void*>host, <cydriver.CUdeviceptr>dev_ptr, nbytes,
                                                 <cydriver.CUstream>stream))
            else:
                check(cydriver.cuMemcpyHtoDAsync(<cydriver.CUdeviceptr>dev_ptr, <const void*>host, nbytes,
                                                 <cydriver.CUstream>stream))
            if blocking and status == cydriver.CU_STREAM_CAPTURE_STATUS_NONE:
                check(cydriver.cuStreamSynchronize(<cydriver.CUstream>stream))
    if status != cydriver.CU_STREAM_CAPTURE_STATUS_NONE:
        return True
    if nbytes and not blocking:
        mem._use(stream, <uintptr_t>primary_context(device))
    return False


def free_pending_pinned(bint wait=False):
    """Free the dropped pinned buffers whose recorded work has completed
    (``wait``: wait for it); return how many still wait. Nothing is freed
    while a capture is open."""
    return _free_pending(wait)


def pinned_memory_stats():
    """``{"buffers", "bytes", "pending_frees"}``: pinned buffers alive,
    their bytes, and dropped buffers waiting for their work (after freeing
    those whose work completed)."""
    n = _free_pending(False)
    return {"buffers": _live, "bytes": _live_bytes, "pending_frees": n}
