# SPDX-License-Identifier: Apache-2.0
from libc.stdint cimport uintptr_t


cdef class OpenCapture:
    cdef readonly str graph
    cdef readonly int device
    cdef readonly uintptr_t stream
    cdef readonly int mode
    cdef readonly str thread
    cdef readonly unsigned long thread_id
    cdef readonly str site


cdef bint captures_open() noexcept
cdef str call_site()
cdef OpenCapture forbidding()
cdef OpenCapture register_open(object graph, int device, uintptr_t stream, int mode, unsigned long thread_id,
                               str site)
cdef OpenCapture opened_by(object graph)
cdef void forget_open(object graph) noexcept
