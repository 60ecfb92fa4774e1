# SPDX-License-Identifier: Apache-2.0
from cuda.bindings cimport cydriver


cdef class Stream:
    cdef cydriver.CUstream _handle
    cdef int _device
    cdef bint _owned
    cdef int _priority
    cdef object _owner          # keeps a foreign stream's owner alive

    @staticmethod
    cdef Stream _wrap(cydriver.CUstream handle, int device, object owner)


cdef class Event:
    cdef cydriver.CUevent _handle
    cdef int _device            # -1 until first recorded
    cdef unsigned int _flags
    cdef bint _timing
    cdef bint _external

    cdef int _create_on(self, int device) except -1
    cdef int _record_on(self, cydriver.CUstream stream, int device) except -1


cdef cydriver.CUstream current_stream_handle(int device) noexcept nogil
cdef void set_current_stream_handle(int device, cydriver.CUstream handle) noexcept nogil
cdef Stream as_stream(object obj, int device=*)
cdef int stream_wait_stream(cydriver.CUstream waiter, cydriver.CUstream waitee, int device) except -1
cdef void keep_host_error(int device, str what, object exc) noexcept
cdef int refuse_in_conditional_body(cydriver.CUstream stream, str what) except -1
