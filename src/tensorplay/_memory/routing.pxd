# SPDX-License-Identifier: Apache-2.0
from libc.stdint cimport uintptr_t
from libcpp.vector cimport vector

from tensorplay._memory.pool cimport Block, BodyFrame, CaptureState, Pool


cdef class CaptureRoutes:
    cdef dict captures                   # capture id (root or body) -> CaptureState

    cdef CaptureState begin(self, Pool pool, unsigned long long capture_id, uintptr_t stream, bint track)
    cdef BodyFrame begin_body(self, CaptureState st, uintptr_t stream, unsigned long long capture_id,
                              unsigned long long open_seq)
    cdef void end_body(self, CaptureState st, BodyFrame f) noexcept
    cdef void end(self, CaptureState st) noexcept
    cdef CaptureState state_of(self, unsigned long long capture_id)


cdef list thread_captures()
cdef CaptureState innermost_capture()
cdef vector[Block*]* deferral_of(CaptureState st, Block* b) noexcept
