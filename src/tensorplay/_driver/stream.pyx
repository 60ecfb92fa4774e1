# SPDX-License-Identifier: Apache-2.0
"""Streams, events and the per-thread, per-device current stream."""

cimport cython
from cuda.bindings cimport cydriver
from libc.stdint cimport uintptr_t

from tensorplay._driver.teardown cimport destroy_event, run_deferred
from tensorplay._driver.context cimport (LIVE_EVENTS, LIVE_STREAMS, check, count_live, ensure_context, get_current_device,
                               validate_device, MAX_DEVICES)

import os
import threading

from tensorplay._driver.context import device_index as _device_index_checked

cdef extern from "tp_tls.hpp" namespace "tp" nogil:
    uintptr_t tls_current_stream[64]


cdef cydriver.CUstream current_stream_handle(int device) noexcept nogil:
    return <cydriver.CUstream>tls_current_stream[device]


cdef void set_current_stream_handle(int device, cydriver.CUstream handle) noexcept nogil:
    tls_current_stream[device] = <uintptr_t>handle


# Python Stream objects made current, per thread, so a stream set current is
# never destroyed while its handle sits in the thread-local slot.
cdef object _held = threading.local()


cdef dict _held_streams():
    d = getattr(_held, "streams", None)
    if d is None:
        d = {}
        _held.streams = d
    return d


cdef int _resolve_device(object device) except -1:
    return _device_index_checked(device)


# Handles of dead Stream objects, by (device, priority), for the next Stream().
# Streams are never destroyed, as in PyTorch: the caching allocator keys its
# free blocks by stream handle, and a destroyed stream's handle could come
# back as a new stream that would then reuse blocks without waiting for the
# old stream's work. A recycled handle is the same CUDA stream, so stream
# order covers it.
cdef dict _recycled = {}


def _forget_streams_in_forked_child():
    _recycled.clear()     # the parent's handles mean nothing in the child


os.register_at_fork(after_in_child=_forget_streams_in_forked_child)


# What a host function queued with launch_host_func raised, by device, kept
# for the next synchronize of that device (tensorplay._driver.hostfn fills it).
cdef object _host_errors_lock = threading.Lock()
cdef dict _host_errors = {}


class HostFunctionError(RuntimeError):
    """A host function queued with ``launch_host_func`` raised; the original
    exception is this one's ``__cause__``."""


# The public module path: tracebacks and reprs show tensorplay.cuda.HostFunctionError.
HostFunctionError.__module__ = "tensorplay.cuda"


cdef void keep_host_error(int device, str what, object exc) noexcept:
    try:
        with _host_errors_lock:
            _host_errors.setdefault(device, []).append((what, exc))
    except BaseException:
        pass


def raise_host_errors(int device):
    """Raise HostFunctionError for the first exception a host function on
    ``device`` raised since the last call (the others counted in its
    message), and forget them all."""
    if not _host_errors:
        return
    with _host_errors_lock:
        errors = _host_errors.pop(device, None)
    if errors:
        what, exc = errors[0]
        more = f"; {len(errors) - 1} more raised after it" if len(errors) > 1 else ""
        raise HostFunctionError(f"{what} raised {type(exc).__name__}: {exc}{more}") from exc


# Set by the graph floor (tensorplay._graph.conditionals): for a stream
# handle, which conditional body it is capturing ("the body of a WHILE node"),
# or None. The driver allows no host or event nodes in conditional bodies.
cdef object _conditional_body_of = None


def set_conditional_body_test(fn):
    """Give this floor the function naming the conditional body a stream handle captures, or None."""
    global _conditional_body_of
    _conditional_body_of = fn


cdef int refuse_in_conditional_body(cydriver.CUstream stream, str what) except -1:
    """Raise when ``stream`` is capturing a conditional node's body, before
    the driver refuses the node (which would invalidate the capture)."""
    if _conditional_body_of is None:
        return 0
    body = _conditional_body_of(<uintptr_t>stream)
    if body:
        raise RuntimeError(f"{what}: the stream is capturing {body}, and the driver allows no host "
                           f"functions or event records and waits in conditional bodies (kernels, "
                           f"copies, memsets, child graphs and conditional nodes only); queue it before "
                           f"or after the conditional node")
    return 0


cdef bint _event_node_here(cydriver.CUstream stream, int device, str what) except -1:
    """Whether an external event's record or wait on ``stream`` becomes a
    graph node (the stream is capturing); refused, with the capture left
    intact, inside a conditional body."""
    cdef cydriver.CUstreamCaptureStatus status = cydriver.CU_STREAM_CAPTURE_STATUS_NONE
    with nogil:
        ensure_context(device)
        check(cydriver.cuStreamIsCapturing(stream, &status))
    if status != cydriver.CU_STREAM_CAPTURE_STATUS_ACTIVE:
        return False
    refuse_in_conditional_body(stream, what)
    return True


def cached_stream_count():
    """Streams kept for reuse by later Stream() calls (never destroyed)."""
    return sum(len(v) for v in _recycled.values())


cdef class Stream:
    """A CUDA stream on one device (cuStreamCreateWithPriority, non-blocking).

    A stream exists only on a device: without CUDA the constructor raises
    :class:`CudaUnavailableError` at once, as PyTorch's does.

    Parameters
    ----------
    device : int, str or None
        The device; default the current device.
    priority : int
        Lower numbers are higher priority; clamped to the device's range.
    """

    def __cinit__(self):
        self._handle = NULL
        self._device = -1
        self._owned = False
        self._owner = None
        self._priority = 0

    def __init__(self, device=None, int priority=0):
        cdef int d = _resolve_device(device)
        cdef int least = 0, greatest = 0
        cdef cydriver.CUstream h = NULL
        with nogil:
            ensure_context(d)
            check(cydriver.cuCtxGetStreamPriorityRange(&least, &greatest))
        if priority > least:
            priority = least
        if priority < greatest:
            priority = greatest
        spare = _recycled.get((d, priority))
        if spare:
            h = <cydriver.CUstream><uintptr_t>spare.pop()
        else:
            with nogil:
                check(cydriver.cuStreamCreateWithPriority(&h, cydriver.CU_STREAM_NON_BLOCKING, priority))
        self._handle = h
        self._device = d
        self._priority = priority
        self._owned = True
        count_live(LIVE_STREAMS, 1)

    @staticmethod
    cdef Stream _wrap(cydriver.CUstream handle, int device, object owner):
        cdef Stream s = Stream.__new__(Stream)
        s._handle = handle
        s._device = device
        s._owner = owner
        return s

    def __dealloc__(self):
        if self._owned and self._handle != NULL:
            try:
                _recycled.setdefault((self._device, self._priority), []).append(<uintptr_t>self._handle)
            except BaseException:
                pass
            count_live(LIVE_STREAMS, -1)
            self._handle = NULL

    @property
    def handle(self):
        """The CUstream as an int (0 is the legacy default stream)."""
        return <uintptr_t>self._handle

    @property
    def cuda_stream(self):
        """The CUstream as an int, as PyTorch and CuPy name it."""
        return <uintptr_t>self._handle

    @property
    def ptr(self):
        """The CUstream as an int, as CuPy's ``Stream.ptr``."""
        return <uintptr_t>self._handle

    @property
    def device_index(self):
        """The index of the stream's CUDA device."""
        return self._device

    @property
    def device(self):
        """The stream's device as a string, ``"cuda:N"``."""
        return f"cuda:{self._device}"

    @property
    def priority(self):
        """The stream's priority (lower is higher priority), cuStreamGetPriority."""
        cdef int p = 0
        with nogil:
            ensure_context(self._device)
            check(cydriver.cuStreamGetPriority(self._handle, &p))
        return p

    def __cuda_stream__(self):
        """Return ``(0, handle)``: the CUDA stream protocol of cuda.core."""
        return (0, <uintptr_t>self._handle)

    def query(self):
        """Return True if all work on the stream has completed, cuStreamQuery."""
        cdef cydriver.CUresult r
        with nogil:
            ensure_context(self._device)
            r = cydriver.cuStreamQuery(self._handle)
        if r == cydriver.CUDA_ERROR_NOT_READY:
            return False
        check(r)
        return True

    def synchronize(self):
        """Wait for all work on the stream, cuStreamSynchronize (GIL released).

        Raises HostFunctionError when a host function queued on the device
        (``launch_host_func``) raised since the last synchronize."""
        with nogil:
            ensure_context(self._device)
            check(cydriver.cuStreamSynchronize(self._handle))
        run_deferred()
        if _host_errors:
            raise_host_errors(self._device)

    def wait_event(self, event):
        """Make future work on this stream wait for ``event``, cuStreamWaitEvent.

        Inside a graph capture, an event made with ``external=True`` becomes
        an event wait node (CU_EVENT_WAIT_EXTERNAL): each replay waits for
        the event's latest record, by another graph or stream; otherwise a
        wait inside a capture only orders the capture's streams."""
        cdef Event e = _event_arg(event, "wait_event", "event")
        cdef unsigned int flags = 0
        if e._external and _event_node_here(self._handle, self._device, "wait_event"):
            e._create_on(self._device)      # a wait node needs the event, recorded yet or not
            flags = cydriver.CU_EVENT_WAIT_EXTERNAL
        if e._handle == NULL:
            return   # never recorded: nothing to wait for, as in PyTorch
        with nogil:
            ensure_context(self._device)
            check(cydriver.cuStreamWaitEvent(self._handle, e._handle, flags))

    def wait_stream(self, stream):
        """Make future work on this stream wait for all work queued on ``stream`` so far.

        Records a temporary event on ``stream`` and waits for it here
        (cuEventRecord, cuStreamWaitEvent).
        """
        cdef Stream other = as_stream(stream, self._device)
        if other._handle == self._handle and other._device == self._device:
            return
        stream_wait_stream(self._handle, other._handle, other._device)

    def record_event(self, event=None):
        """Record ``event`` (a new one if None) on this stream and return it."""
        cdef Event e = Event() if event is None else event
        e._record_on(self._handle, self._device)
        return e

    def __eq__(self, other):
        if not isinstance(other, Stream):
            return NotImplemented
        return (<Stream>other)._handle == self._handle and (<Stream>other)._device == self._device

    def __hash__(self):
        return hash((<uintptr_t>self._handle, self._device))

    def __repr__(self):
        return f"<tensorplay.cuda.Stream device=cuda:{self._device} handle={<uintptr_t>self._handle:#x}>"


cdef class ExternalStream(Stream):
    """Wrap a stream created elsewhere (PyTorch, CuPy, cuda.core) without owning it.

    Without CUDA it raises :class:`CudaUnavailableError`, whatever the
    handle (0, the legacy default stream, included), as PyTorch's does.

    Parameters
    ----------
    stream_ptr : int
        The CUstream handle.
    device : int, str or None
        Its device; default: asked of the driver (cuStreamGetDevice).
    owner : object
        Kept alive as long as this wrapper lives.
    """

    def __init__(self, stream_ptr, device=None, owner=None):
        if isinstance(stream_ptr, bool) or not isinstance(stream_ptr, int):
            raise TypeError(f"stream_ptr must be an int handle, got {type(stream_ptr).__name__}")
        if stream_ptr < 0:
            raise ValueError(f"stream_ptr must be non-negative, got {stream_ptr}")
        cdef cydriver.CUstream h = <cydriver.CUstream><uintptr_t>stream_ptr
        cdef cydriver.CUdevice dev
        cdef int d
        if device is None:
            d = get_current_device()
            validate_device(d)          # without CUDA there is no stream to wrap, not even stream 0
            if h != NULL and <uintptr_t>h > 2:
                with nogil:
                    ensure_context(d)
                    check(cydriver.cuStreamGetDevice(h, &dev))
                d = <int>dev
        else:
            d = _resolve_device(device)
        self._handle = h
        self._device = d
        self._owned = False
        self._owner = owner


cdef object _known_device(object handle, int device):
    """``device`` (the caller's) for a stream that is capturing, where the
    driver will not say its device (another library's capture stream
    passed to replay); None otherwise: ExternalStream asks the driver."""
    cdef cydriver.CUstreamCaptureStatus status = cydriver.CU_STREAM_CAPTURE_STATUS_NONE
    cdef cydriver.CUresult r
    cdef cydriver.CUstream h
    if device < 0 or not isinstance(handle, int) or handle <= 2:
        return None
    h = <cydriver.CUstream><uintptr_t>handle
    with nogil:
        ensure_context(device)
        r = cydriver.cuStreamIsCapturing(h, &status)
    return device if r == cydriver.CUDA_SUCCESS and status != cydriver.CU_STREAM_CAPTURE_STATUS_NONE else None


cdef Stream as_stream(object obj, int device=-1):
    """Coerce a Stream, an object with __cuda_stream__ or .cuda_stream, or an int;
    ``device``: the device the caller expects, taken for a capturing stream."""
    if isinstance(obj, Stream):
        return <Stream>obj
    if obj is None:
        d = get_current_device() if device < 0 else device
        validate_device(d)
        return Stream._wrap(current_stream_handle(d), d, None)
    proto = getattr(obj, "__cuda_stream__", None)
    if proto is not None:
        ver_handle = proto() if callable(proto) else proto
        try:
            handle = int(ver_handle[1])
        except (TypeError, IndexError, ValueError):
            raise TypeError(f"{type(obj).__name__}.__cuda_stream__ must return (version, handle)")
        return ExternalStream(handle, _known_device(handle, device), owner=obj)
    if hasattr(obj, "cuda_stream") and not isinstance(obj, int):
        handle = int(obj.cuda_stream)
        return ExternalStream(handle, _known_device(handle, device), owner=obj)
    if isinstance(obj, int) and not isinstance(obj, bool):
        return ExternalStream(obj, _known_device(obj, device))
    raise TypeError(
        f"expected a tensorplay.cuda.Stream or an object with __cuda_stream__, got {type(obj).__name__}")


def stream_of(obj, device=-1):
    """Return ``obj`` as a Stream: a Stream, an object with ``__cuda_stream__``, or None (the current one)."""
    return as_stream(obj, device)


cdef int stream_wait_stream(cydriver.CUstream waiter, cydriver.CUstream waitee, int device) except -1:
    """Make ``waiter`` wait for the work queued so far on ``waitee`` (one temporary event)."""
    cdef cydriver.CUevent ev = NULL
    cdef cydriver.CUresult r
    with nogil:
        ensure_context(device)
        check(cydriver.cuEventCreate(&ev, cydriver.CU_EVENT_DISABLE_TIMING))
        r = cydriver.cuEventRecord(ev, waitee)
        if r == cydriver.CUDA_SUCCESS:
            r = cydriver.cuStreamWaitEvent(waiter, ev, 0)
        # destroying an event with a pending wait is allowed: the wait still holds
        cydriver.cuEventDestroy(ev)
        check(r)
    return 0


@cython.freelist(8)
cdef class Event:
    """A CUDA event (cuEventCreate), created on the device of its first record.

    Constructing one touches no device, so it works without CUDA, as
    PyTorch's ``torch.cuda.Event``: the driver's event is created by the first
    :meth:`record`, which without CUDA raises :class:`CudaUnavailableError`.
    Until then :meth:`query` is True, :meth:`synchronize` returns at once,
    a stream's :meth:`~Stream.wait_event` on it waits for nothing and
    :meth:`elapsed_time` raises ValueError.

    Parameters
    ----------
    enable_timing : bool
        Record timestamps so that ``elapsed_time`` works.
    blocking : bool
        ``synchronize`` blocks the thread instead of spinning (CU_EVENT_BLOCKING_SYNC).
    external : bool
        Recorded inside a graph capture, the record becomes a node of the graph
        (CU_EVENT_RECORD_EXTERNAL) that runs at every replay, so events can time
        work inside a graph; waited for inside a capture, the wait becomes a
        node too (CU_EVENT_WAIT_EXTERNAL), so one graph can wait for another's
        record at replay time. Otherwise a record or wait inside a capture
        only orders the capture's streams. Neither node is allowed inside a
        conditional body (RuntimeError at capture time).
    """

    def __cinit__(self):
        self._handle = NULL
        self._device = -1

    # the arguments are __init__'s, so a wrong call names Event's own signature
    def __init__(self, bint enable_timing=False, bint blocking=False, bint external=False):
        self._timing = enable_timing
        self._external = external
        self._flags = 0 if enable_timing else cydriver.CU_EVENT_DISABLE_TIMING
        if blocking:
            self._flags |= cydriver.CU_EVENT_BLOCKING_SYNC

    def __dealloc__(self):
        if self._handle != NULL:
            destroy_event(self._device, self._handle)
            self._handle = NULL

    cdef int _create_on(self, int device) except -1:
        """Create the driver's event on ``device`` unless it exists (on ``device``)."""
        if self._handle == NULL:
            with nogil:
                ensure_context(device)
                check(cydriver.cuEventCreate(&self._handle, self._flags))
            self._device = device
            count_live(LIVE_EVENTS, 1)
        elif self._device != device:
            raise ValueError(
                f"event was created on cuda:{self._device} and cannot be used on a stream of cuda:{device}")
        return 0

    cdef int _record_on(self, cydriver.CUstream stream, int device) except -1:
        self._create_on(device)
        cdef unsigned int flags = 0
        if self._external and _event_node_here(stream, device, "Event.record"):
            flags = cydriver.CU_EVENT_RECORD_EXTERNAL
        with nogil:
            ensure_context(device)
            check(cydriver.cuEventRecordWithFlags(self._handle, stream, flags))
        return 0

    def record(self, stream=None):
        """Record the event on ``stream`` (default: the current stream), cuEventRecord."""
        cdef Stream s = as_stream(stream, self._device)
        self._record_on(s._handle, s._device)

    def wait(self, stream=None):
        """Make ``stream`` (default: current) wait for this event, cuStreamWaitEvent."""
        cdef Stream s = as_stream(stream, self._device)
        s.wait_event(self)

    def query(self):
        """Return True if the recorded work has completed (or never recorded), cuEventQuery."""
        if self._handle == NULL:
            return True
        cdef cydriver.CUresult r
        with nogil:
            r = cydriver.cuEventQuery(self._handle)
        if r == cydriver.CUDA_ERROR_NOT_READY:
            return False
        check(r)
        return True

    def synchronize(self):
        """Wait until the recorded work completes, cuEventSynchronize (GIL released)."""
        if self._handle == NULL:
            return
        with nogil:
            check(cydriver.cuEventSynchronize(self._handle))

    def elapsed_time(self, end):
        """Return the milliseconds between this event and ``end``, cuEventElapsedTime.

        Both events need ``enable_timing=True`` and must have been recorded.
        """
        cdef float ms = 0
        cdef Event e = _event_arg(end, "elapsed_time", "end")
        if not (self._timing and e._timing):
            raise ValueError("both events need enable_timing=True")
        if self._handle == NULL or e._handle == NULL:
            raise ValueError("both events must be recorded before elapsed_time")
        with nogil:
            check(cydriver.cuEventElapsedTime(&ms, self._handle, e._handle))
        return ms

    @property
    def handle(self):
        """The CUevent as an int (0 until the first record creates it)."""
        return <uintptr_t>self._handle

    @property
    def device_index(self):
        """The index of the event's CUDA device (-1 until the first record)."""
        return self._device

    def __repr__(self):
        if self._handle == NULL:
            return "<tensorplay.cuda.Event not recorded>"
        return f"<tensorplay.cuda.Event handle={<uintptr_t>self._handle:#x} device=cuda:{self._device}>"


cdef Event _event_arg(object obj, str method, str name):
    """``obj`` as an Event; TypeError naming the public class otherwise (not this module's)."""
    if not isinstance(obj, Event):
        raise TypeError(f"{method}: {name} must be a tensorplay.cuda.Event, got {type(obj).__name__}")
    return <Event>obj


# ------------------------------------------------------------------ current stream

def current_stream_handle_of(int device):
    """The current stream's handle on ``device`` as an int (no validation; hot path)."""
    return <uintptr_t>current_stream_handle(device)


def current_stream(device=None):
    """Return this thread's current stream on ``device`` (default: current device)."""
    cdef int d = _resolve_device(device)
    cdef cydriver.CUstream h = current_stream_handle(d)
    held = _held_streams().get(d)
    if held is not None and (<Stream>held)._handle == h:
        return held
    return Stream._wrap(h, d, None)


def default_stream(device=None):
    """Return the legacy default stream of ``device``."""
    cdef int d = _resolve_device(device)
    return Stream._wrap(NULL, d, None)


def set_stream(stream):
    """Make ``stream`` this thread's current stream on its device."""
    cdef Stream s = as_stream(stream)
    validate_device(s._device)
    _held_streams()[s._device] = s
    set_current_stream_handle(s._device, s._handle)


class stream:
    """Make ``stream`` the current stream of its device inside a ``with`` block.

    On exit the previous current stream of that device is restored. ``None``
    leaves the current stream unchanged, as in PyTorch.

    Parameters
    ----------
    stream : Stream, stream-like or None
        A :class:`Stream`, an object exporting one (``__cuda_stream__`` or
        ``cuda_stream``), or None.
    """

    def __init__(self, stream):
        self.stream = None if stream is None else as_stream(stream)
        self._prev = None

    def __enter__(self):
        if self.stream is None:
            return None
        self._prev = current_stream(self.stream.device_index)
        set_stream(self.stream)
        return self.stream

    def __exit__(self, *exc):
        if self._prev is not None:
            set_stream(self._prev)
        return False
