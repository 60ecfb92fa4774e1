# SPDX-License-Identifier: Apache-2.0
from cuda.bindings cimport cydriver

cdef extern from "tp_limits.hpp":
    enum: MAX_DEVICES "TP_MAX_DEVICES"

# Kinds of driver objects counted while alive (leak checks): one counter each.
cdef enum LiveKind:
    LIVE_STREAMS = 0
    LIVE_EVENTS = 1
    LIVE_GRAPHS = 2
    LIVE_EXECS = 3
    LIVE_MODULES = 4
    NUM_LIVE_KINDS = 5

cdef void count_live(LiveKind kind, int delta) noexcept nogil

# Graph captures open in the process, all devices (the allocator counts them)
cdef int open_capture_count() noexcept nogil
cdef void count_open_capture(int delta) noexcept nogil

cdef int raise_cuda_error(cydriver.CUresult result) except -1 nogil

cdef inline int check(cydriver.CUresult result) except -1 nogil:
    """Raise CudaError for a failed driver call; takes the GIL only then."""
    if result == cydriver.CUDA_SUCCESS:
        return 0
    return raise_cuda_error(result)

cdef int ensure_context(int device) except -1 nogil
cdef cydriver.CUcontext primary_context(int device) except? NULL nogil
cdef int get_current_device() noexcept nogil
cdef int checked_device_count() except -1
cdef int validate_device(int device) except -1
