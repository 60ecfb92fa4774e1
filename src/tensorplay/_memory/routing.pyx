# SPDX-License-Identifier: Apache-2.0
"""The capture bookkeeping of a device's allocator: which captures (and
their conditional bodies, by capture id) allocate into which pool, the
streams a body's blocks count as (its root's), and each thread's open
captures, innermost last (where pointer uses register: note_capture_use).
What happens to blocks when a capture or a body ends is the allocator's
(tensorplay._memory.allocator); this module only keeps the routes."""

cimport cython
from libc.stdint cimport uintptr_t
from libcpp.vector cimport vector

from tensorplay._memory.pool cimport Block, BodyFrame, CaptureState, Pool

import itertools
import threading

cdef object _capture_serials = itertools.count(1)
cdef object _tls = threading.local()         # .captures: this thread's open captures, innermost last


cdef list thread_captures():
    """This thread's open captures that track pointer uses, innermost last."""
    stack = getattr(_tls, "captures", None)
    if stack is None:
        stack = []
        _tls.captures = stack
    return stack


cdef CaptureState innermost_capture():
    """This thread's innermost open capture, or None (captures ended from
    another thread, by the collector, are dropped from the stack here)."""
    cdef list stack = getattr(_tls, "captures", None)
    while stack:
        st = <CaptureState>stack[len(stack) - 1]
        if not st.ended:
            return st
        stack.pop()
    return None


cdef vector[Block*]* deferral_of(CaptureState st, Block* b) noexcept:
    """Where block ``b``, freed while ``st`` captures into its pool, waits
    before it is reusable: the capture's end when the capture used it on
    another stream, the end of the outermost body opened after it was
    allocated (a WHILE body runs again); NULL: reusable now."""
    cdef BodyFrame f
    if b.cross_capture == st.serial:
        return &st.deferred
    for obj in st.bodies:               # outermost first
        f = <BodyFrame>obj
        if b.alloc_seq <= f.open_seq:
            return &f.deferred
    return NULL


@cython.final
cdef class CaptureRoutes:
    """The open captures of one allocator by capture id (a body's id maps to its root's state)."""

    def __cinit__(self):
        self.captures = {}

    cdef CaptureState begin(self, Pool pool, unsigned long long capture_id, uintptr_t stream, bint track):
        cdef CaptureState st = CaptureState.__new__(CaptureState)
        st.pool = pool
        st.capture_id = capture_id
        st.stream = stream
        st.serial = next(_capture_serials)
        st.bodies = []
        st.aliases = {}
        st.keepalive = {}
        st.scratch = {}
        st.thread = threading.get_ident()
        st.ended = False
        pool.capture = st
        self.captures[capture_id] = st
        if track:
            thread_captures().append(st)
        return st

    cdef BodyFrame begin_body(self, CaptureState st, uintptr_t stream, unsigned long long capture_id,
                              unsigned long long open_seq):
        cdef BodyFrame f = BodyFrame.__new__(BodyFrame)
        f.stream = stream
        f.capture_id = capture_id
        f.open_seq = open_seq
        st.bodies.append(f)
        st.aliases[stream] = st.stream
        self.captures[capture_id] = st
        return f

    cdef void end_body(self, CaptureState st, BodyFrame f) noexcept:
        self.captures.pop(f.capture_id, None)
        st.aliases.pop(f.stream, None)

    cdef void end(self, CaptureState st) noexcept:
        """Forget ``st`` (its bodies ended first) here and on its thread's stack."""
        self.captures.pop(st.capture_id, None)
        st.ended = True
        st.pool.capture = None
        st.scratch = {}
        stack = getattr(_tls, "captures", None)
        if stack:
            for k in range(len(stack) - 1, -1, -1):
                if stack[k] is st:
                    del stack[k]
                    break

    cdef CaptureState state_of(self, unsigned long long capture_id):
        """The capture that ``capture_id`` (a root's or a body's) allocates for, or None."""
        if not capture_id or not self.captures:
            return None
        return self.captures.get(capture_id)

    def __len__(self):
        """The open root captures."""
        return len({id(s) for s in self.captures.values()})
