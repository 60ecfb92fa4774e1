# SPDX-License-Identifier: Apache-2.0
"""Teardown that waits for a safe moment.

Objects die whenever Python drops them: the collector may free an earlier
graph, event or module in the middle of a later capture, and a host
function's references are dropped on the driver's own thread. Destroying
driver objects then is what breaks: a global-mode capture is invalidated by
the synchronizing calls (cuModuleUnload, cuMemFree, cuEventQuery) of any
thread, PyTorch's allocator refuses to free a pool while a capture of its own
is under way, and the driver's thread may call no CUDA at all.

So teardown asks ``destroy_must_wait()`` (a tensorplay capture is open in
the process, this is the driver's thread, or another library captures on
this thread) and, while it must, queues the work (``defer``); the queue runs
once no capture is open: at every capture's end and begin, and at
synchronize. References the driver's thread drops (host functions' user
objects) are handed to the interpreter's main thread through a pending call
(``drop_reference_later``), never decremented there.
"""

from cpython.ref cimport Py_DECREF, Py_INCREF
from cuda.bindings cimport cydriver
from libc.stdint cimport uintptr_t
from libcpp.vector cimport vector

from tensorplay._driver.context cimport (LIVE_EVENTS, LIVE_EXECS, LIVE_GRAPHS, LIVE_MODULES, count_live,
                                         ensure_context, open_capture_count)

cdef extern from "Python.h" nogil:
    int Py_AddPendingCall(int (*func)(void*) noexcept, void* arg)

cdef extern from * nogil:
    """
    #include <mutex>
    static thread_local int tp_driver_thread = 0;
    static std::mutex tp_drop_mutex;
    """
    int tp_driver_thread
    cppclass tp_mutex_t "std::mutex":
        void lock()
        void unlock()
    tp_mutex_t tp_drop_mutex

cdef vector[void*] _dropped                # references to drop on the main thread (under tp_drop_mutex)
cdef bint _pending_call_queued = False     # (under tp_drop_mutex)
cdef list _deferred = []                   # (fn, args) to call once no capture is open
cdef object _foreign_probe = None          # () -> bool: another library captures on this thread
cdef bint _running = False


cdef bint on_driver_thread() noexcept nogil:
    """True on the driver's thread while it runs one of our callbacks."""
    return tp_driver_thread != 0


cdef void set_driver_thread(bint on) noexcept nogil:
    global tp_driver_thread
    tp_driver_thread = 1 if on else 0


cdef bint teardown_must_wait() noexcept nogil:
    """A tensorplay capture is open in the process, or this is the driver's thread."""
    return open_capture_count() > 0 or tp_driver_thread != 0


cdef bint _foreign_capturing() noexcept:
    if _foreign_probe is None:
        return False
    try:
        return bool(_foreign_probe())
    except BaseException:
        return False


cdef bint destroy_must_wait() noexcept:
    """teardown_must_wait(), or another library (PyTorch, CuPy) is capturing on this thread."""
    return teardown_must_wait() or _foreign_capturing()


cdef int defer(object fn, tuple args) except -1:
    """Call ``fn(*args)`` once teardown may run (its errors ignored)."""
    _deferred.append((fn, args))
    return 0


cdef int _drain_dropped(void* unused) noexcept with gil:
    """The pending call: drop the references the driver's thread handed over."""
    global _pending_call_queued
    cdef vector[void*] todo
    cdef void* obj
    tp_drop_mutex.lock()
    todo.swap(_dropped)
    _pending_call_queued = False
    tp_drop_mutex.unlock()
    for obj in todo:
        Py_DECREF(<object>obj)       # what it frees defers its own teardown if it must
    return 0


cdef void drop_reference_later(void* obj) noexcept nogil:
    """Hand one reference to ``obj`` to the main thread (callable without
    the GIL, from the driver's thread)."""
    global _pending_call_queued
    cdef bint queue_call
    tp_drop_mutex.lock()
    _dropped.push_back(obj)
    queue_call = not _pending_call_queued
    _pending_call_queued = True
    tp_drop_mutex.unlock()
    if queue_call and Py_AddPendingCall(_drain_dropped, NULL) != 0:
        tp_drop_mutex.lock()
        _pending_call_queued = False     # the interpreter's queue is full: run_deferred drains it
        tp_drop_mutex.unlock()


cdef int run_deferred() noexcept:
    """Run the queued teardown if it may run now (a few rounds: teardown may
    queue more). Never raises."""
    global _running
    cdef int rounds
    if tp_driver_thread or _running:
        return 0
    _drain_dropped(NULL)
    if not _deferred or teardown_must_wait() or _foreign_capturing():
        return 0
    _running = True
    try:
        for rounds in range(4):
            todo = _deferred[:]
            del _deferred[:]
            for fn, args in todo:
                try:
                    fn(*args)
                except BaseException:
                    pass
            if not _deferred or teardown_must_wait():
                break
    finally:
        _running = False
    return 0


# ------------------------------------------------------------------ driver objects

def _destroy_graph_objects(int device, uintptr_t exec_graph, uintptr_t graph):
    destroy_graph_objects(device, <cydriver.CUgraphExec>exec_graph, <cydriver.CUgraph>graph)


cdef void destroy_graph_objects(int device, cydriver.CUgraphExec exec_graph, cydriver.CUgraph graph) noexcept:
    """cuGraphExecDestroy / cuGraphDestroy (either may be NULL), now or once
    teardown may run; counted out of the live objects when done."""
    if exec_graph == NULL and graph == NULL:
        return
    try:
        if destroy_must_wait():
            defer(_destroy_graph_objects, (device, <uintptr_t>exec_graph, <uintptr_t>graph))
            return
        ensure_context(device)
    except BaseException:
        return                      # no usable context (a forked child): nothing to destroy with
    if exec_graph != NULL and cydriver.cuGraphExecDestroy(exec_graph) == cydriver.CUDA_SUCCESS:
        count_live(LIVE_EXECS, -1)
    if graph != NULL and cydriver.cuGraphDestroy(graph) == cydriver.CUDA_SUCCESS:
        count_live(LIVE_GRAPHS, -1)


def _destroy_event(int device, uintptr_t event):
    destroy_event(device, <cydriver.CUevent>event)


cdef void destroy_event(int device, cydriver.CUevent event) noexcept:
    """cuEventDestroy, now or (on the driver's thread, which may call no
    CUDA) later; a capture may destroy events."""
    if event == NULL:
        return
    if tp_driver_thread:
        try:
            defer(_destroy_event, (device, <uintptr_t>event))
        except BaseException:
            pass
        return
    if cydriver.cuEventDestroy(event) == cydriver.CUDA_SUCCESS:
        count_live(LIVE_EVENTS, -1)


def _unload_module(int device, uintptr_t module):
    unload_module(device, <cydriver.CUmodule>module)


cdef void unload_module(int device, cydriver.CUmodule module) noexcept:
    """cuModuleUnload (it synchronizes: never inside a capture) now or once teardown may run."""
    if module == NULL:
        return
    try:
        if destroy_must_wait():
            defer(_unload_module, (device, <uintptr_t>module))
            return
        ensure_context(device)
    except BaseException:
        return
    if cydriver.cuModuleUnload(module) == cydriver.CUDA_SUCCESS:
        count_live(LIVE_MODULES, -1)


# ------------------------------------------------------------------ Python access

def set_foreign_capture_probe(probe):
    """``probe()`` -> bool: another library captures on this thread (set by
    tensorplay's top level; None: never)."""
    global _foreign_probe
    if probe is not None and not callable(probe):
        raise TypeError(f"set_foreign_capture_probe expects a callable or None, got {type(probe).__name__}")
    _foreign_probe = probe


def teardown_waits():
    """True while teardown of driver objects is queued rather than done."""
    return destroy_must_wait()


def defer_call(fn, *args):
    """Call ``fn(*args)`` now, or once no capture is open (its errors ignored)."""
    if not callable(fn):
        raise TypeError(f"defer_call expects a callable, got {type(fn).__name__}")
    if destroy_must_wait():
        defer(fn, args)
    else:
        try:
            fn(*args)
        except BaseException:
            pass


def run_deferred_teardown():
    """Run the queued teardown if no capture is open (capture end and
    synchronize do it); return how much is still queued."""
    run_deferred()
    return len(_deferred) + <Py_ssize_t>_dropped.size()


def deferred_teardown_count():
    """Queued teardown calls and references the driver's thread handed over."""
    return len(_deferred) + <Py_ssize_t>_dropped.size()


def drop_later(obj):
    """Hand one new reference to ``obj`` over as the driver's thread does
    (tests: the drop happens at the interpreter's next pending call)."""
    Py_INCREF(obj)
    with nogil:
        drop_reference_later(<void*>obj)


def call_as_driver_thread(fn, *args):
    """Call ``fn(*args)`` with this thread marked as the driver's (tests:
    teardown there waits as on the driver's thread)."""
    set_driver_thread(True)
    try:
        return fn(*args)
    finally:
        set_driver_thread(False)
