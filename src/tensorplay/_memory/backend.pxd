# SPDX-License-Identifier: Apache-2.0
from cuda.bindings cimport cydriver
from libc.stdint cimport uintptr_t


cdef class Backend:
    """Where segments and events come from: the driver, or a fake for tests."""
    cdef readonly int device
    cdef cydriver.CUresult malloc(self, cydriver.CUdeviceptr* ptr, size_t n) except? cydriver.CUDA_ERROR_UNKNOWN
    cdef int free(self, cydriver.CUdeviceptr ptr) except -1
    cdef uintptr_t create_event(self) except? 0
    cdef int record_event(self, uintptr_t event, uintptr_t stream) except -1
    cdef bint event_done(self, uintptr_t event, bint wait) noexcept
    cdef void destroy_event(self, uintptr_t event) noexcept
    cdef int synchronize(self) except -1
    cdef unsigned long long capture_id(self, uintptr_t stream) except? 0
    cdef tuple mem_info(self)
    # sleepable segments: addresses kept, physical memory given back and mapped again
    cdef bint supports_sleep(self) except -1
    cdef size_t granularity(self) except 0
    cdef cydriver.CUresult map_segment(self, cydriver.CUdeviceptr* ptr, size_t n, long long pool) except? cydriver.CUDA_ERROR_UNKNOWN
    cdef int free_mapped(self, cydriver.CUdeviceptr ptr) except -1
    cdef int sleep_segments(self, long long pool, size_t* nbytes) except -1
    cdef cydriver.CUresult wake_segments(self, long long pool, size_t* nbytes) except? cydriver.CUDA_ERROR_UNKNOWN
    cdef void route_capture(self, unsigned long long capture_id, long long pool) noexcept
    cdef void unroute_capture(self, unsigned long long capture_id) noexcept

