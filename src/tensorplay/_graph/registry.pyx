# SPDX-License-Identifier: Apache-2.0
"""The open-capture registry: what an error needs to say about each graph
capture open in the process (which graph, stream, device, mode, thread and
where it began), and the capture that forbids beginning another."""

cimport cython
from cuda.bindings cimport cydriver
from libc.stdint cimport uintptr_t

from tensorplay._graph.streams cimport mode_name

import threading

from tensorplay._frames import call_site as user_call_site


@cython.final
cdef class OpenCapture:
    """What an error needs to say about an open capture. It refers to no
    graph: a graph dropped mid-capture dies, and its __dealloc__ ends the
    capture."""

    def sentence(self):
        """Return the capture as one sentence: what is capturing where, since when, and how to end it."""
        return (f"{self.graph} is capturing in '{mode_name(self.mode)}' mode on stream "
                f"{self.stream:#x} of cuda:{self.device} in thread {self.thread!r}, since capture_begin at "
                f"{self.site}; end it with capture_end() (or reset()) on that thread, or use "
                f"capture_error_mode='thread_local' for captures that overlap")


cdef dict _open_captures = {}        # id(graph) -> OpenCapture


cdef bint captures_open() noexcept:
    """Whether any tensorplay capture is open in the process (a replay asks
    before it looks whether its stream captures)."""
    return len(_open_captures) != 0


def describe_open_captures():
    """Return one sentence per open capture, or '' when none is open (CudaError messages carry it;
    tensorplay/__init__.py gives the driver floor this function)."""
    return " ".join(c.sentence() for c in list(_open_captures.values()))


def open_captures():
    """Return the open captures of this process (OpenCapture records)."""
    return list(_open_captures.values())


cdef str call_site():
    """file:line (function) of the nearest caller outside tensorplay (the one walker, tensorplay._frames)."""
    return user_call_site()


cdef OpenCapture forbidding():
    """An open capture that forbids beginning another: one in global mode
    (any other thread's unsafe call would invalidate it)."""
    for c in _open_captures.values():
        if (<OpenCapture>c).mode == cydriver.CU_STREAM_CAPTURE_MODE_GLOBAL:
            return <OpenCapture>c
    return None


cdef OpenCapture register_open(object graph, int device, uintptr_t stream, int mode, unsigned long thread_id,
                               str site):
    """Record ``graph``'s capture, begun on this thread, as open."""
    cdef OpenCapture c = OpenCapture.__new__(OpenCapture)
    c.graph = f"CUDAGraph at {id(graph):#x}"
    c.device = device
    c.stream = stream
    c.mode = mode
    c.thread = threading.current_thread().name
    c.thread_id = thread_id
    c.site = site
    _open_captures[id(graph)] = c
    return c


cdef OpenCapture opened_by(object graph):
    """The record of ``graph``'s open capture, or None."""
    return _open_captures.get(id(graph))


cdef void forget_open(object graph) noexcept:
    """``graph``'s capture is no longer open (never raises)."""
    try:
        _open_captures.pop(id(graph), None)
    except BaseException:
        pass
