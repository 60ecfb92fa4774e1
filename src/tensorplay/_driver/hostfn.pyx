# SPDX-License-Identifier: Apache-2.0
"""Host functions on a stream: a Python callable queued in stream order
(cuLaunchHostFunc) and run on the driver's thread with the GIL taken; inside
a graph capture, a host node that runs at every replay.

What a function raises is kept, by device, and raised as HostFunctionError at
the next synchronize of that device (``Stream.synchronize``, and above this
floor ``tensorplay.cuda.synchronize`` and copies to the host)."""

cimport cython
from cpython.ref cimport Py_DECREF, Py_INCREF
from cuda.bindings cimport cydriver
from libc.stdint cimport uintptr_t

from tensorplay._driver.context cimport check, ensure_context
from tensorplay._driver.stream cimport Stream, as_stream, keep_host_error, refuse_in_conditional_body
from tensorplay._driver.teardown cimport drop_reference_later, set_driver_thread

import atexit

# Set at interpreter exit: a graph destroyed then (its user objects released
# on a driver thread) or replayed then leaks its callables instead of taking
# a GIL that may be going away.
cdef bint _exiting = False


def _at_exit():
    global _exiting
    _exiting = True


atexit.register(_at_exit)


@cython.final
cdef class HostCall:
    """One queued host function: the callable and where it runs. A graph's
    holds a reference through a user object for as long as the graph (its
    executables and clones) lives; an eager one holds one for its one run."""
    cdef object fn
    cdef int device
    cdef uintptr_t stream
    cdef bint in_graph

    def __repr__(self):
        return (f"host function {self.fn!r} on stream {self.stream:#x} of cuda:{self.device}"
                + (" (a graph's host node)" if self.in_graph else ""))


cdef void _run(void* data) noexcept with gil:
    """The driver's call: run the function, keep what it raises. This is the
    driver's thread: what the function drops waits to be torn down, and the
    run's own reference is dropped on the main thread."""
    cdef HostCall call = <HostCall>data
    if not _exiting:
        set_driver_thread(True)
        try:
            call.fn()
        except BaseException as exc:
            keep_host_error(call.device, repr(call), exc)
        finally:
            set_driver_thread(False)
    if not call.in_graph:
        call = None
        drop_reference_later(data)   # the reference launch_host_func took for this one run


cdef void _release(void* data) noexcept nogil:
    """The graph's user object is destroyed, on whichever thread the driver
    chooses: its reference is dropped on the main thread (dropping it here
    could free graphs, memory or PyTorch's pools from the driver's thread)."""
    if _exiting:
        return
    drop_reference_later(data)


cdef int retain_in_graph(cydriver.CUgraph graph, object obj) except -1:
    """Make ``graph`` hold a reference to ``obj`` for its life: a user object
    (cuUserObjectCreate) moved to the graph (cuGraphRetainUserObject), so
    that executables instantiated from it, clones and graphs it is a child
    of hold it too. The driver releases it once the last of them is
    destroyed and their launches are done, on a thread of its choosing: the
    reference is then handed to the main thread (drop_reference_later),
    never dropped there. Costs every launch of the graph a wait for the
    previous one (docs/design.md): only for graphs that are not ours."""
    cdef cydriver.CUuserObject keeper = NULL
    cdef cydriver.CUresult r
    Py_INCREF(obj)
    r = cydriver.cuUserObjectCreate(&keeper, <void*>obj, _release, 1, cydriver.CU_USER_OBJECT_NO_DESTRUCTOR_SYNC)
    if r != cydriver.CUDA_SUCCESS:
        Py_DECREF(obj)
        check(r)
    r = cydriver.cuGraphRetainUserObject(graph, keeper, 1, cydriver.CU_GRAPH_USER_OBJECT_MOVE)
    if r != cydriver.CUDA_SUCCESS:
        cydriver.cuUserObjectRelease(keeper, 1)      # its destructor drops the reference
        check(r)
    return 0


def launch_host_func(fn, stream=None):
    """Queue ``fn()`` on ``stream`` (default: the current stream), cuLaunchHostFunc.

    It runs once the work queued before it is done, on a thread of the
    driver, with the GIL taken; work queued after it waits for it. Inside a
    graph capture it becomes a host node: it runs at every replay, and the
    graph keeps ``fn`` alive. ``fn`` must not call CUDA (tensorplay's GPU
    work, synchronize, copies: the driver forbids it there) nor wait for
    work queued after it.

    What ``fn`` raises is kept and raised as
    :class:`~tensorplay.cuda.HostFunctionError` (the original as its
    ``__cause__``) at the next synchronize of the stream's device:
    ``Stream.synchronize()``, ``tensorplay.cuda.synchronize()``, or a copy
    to the host (``.item()``, ``.numpy()``, ``.tolist()``).

    Parameters
    ----------
    fn : callable
        Called with no arguments.
    stream : Stream or stream-like, optional
        Default the current stream of the current device.

    Raises
    ------
    TypeError
        If ``fn`` is not callable.
    RuntimeError
        Inside a conditional node's body, where the driver allows no host
        nodes (at capture time, the capture left intact).
    """
    if not callable(fn):
        raise TypeError(f"launch_host_func: fn must be callable, got {type(fn).__name__}")
    cdef Stream s = as_stream(stream)
    cdef cydriver.CUstreamCaptureStatus status = cydriver.CU_STREAM_CAPTURE_STATUS_NONE
    cdef cydriver.CUgraph g = NULL
    cdef cydriver.CUresult r
    with nogil:
        ensure_context(s._device)
        check(cydriver.cuStreamGetCaptureInfo(s._handle, &status, NULL, &g, NULL, NULL, NULL))
    cdef HostCall call = HostCall.__new__(HostCall)
    call.fn = fn
    call.device = s._device
    call.stream = <uintptr_t>s._handle
    call.in_graph = status == cydriver.CU_STREAM_CAPTURE_STATUS_ACTIVE
    if call.in_graph:
        refuse_in_conditional_body(s._handle, "launch_host_func")
        retain_in_graph(g, call)     # the graph, its executables and clones keep the call alive
    else:
        Py_INCREF(call)          # released by _run after its one run
    with nogil:
        r = cydriver.cuLaunchHostFunc(s._handle, _run, <void*>call)
    if r != cydriver.CUDA_SUCCESS:
        if not call.in_graph:
            Py_DECREF(call)
        check(r)
