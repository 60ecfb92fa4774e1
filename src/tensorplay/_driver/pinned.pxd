# SPDX-License-Identifier: Apache-2.0
from libc.stdint cimport uintptr_t


cdef class PinnedMemory:
    cdef readonly uintptr_t ptr     # the buffer's address (a placeholder for an empty one)
    cdef readonly size_t size
    cdef readonly int device        # whose context allocated it (every device may use it)
    cdef set _uses                  # (stream handle, its CUcontext) of queued work that may read it
    cdef object __weakref__

    cdef int _use(self, uintptr_t stream, uintptr_t context) except -1
