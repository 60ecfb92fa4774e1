# SPDX-License-Identifier: Apache-2.0
from cuda.bindings cimport cydriver
from libc.stdint cimport uintptr_t
from libcpp.vector cimport vector

from tensorplay._memory.backend cimport Backend
from tensorplay._memory.pool cimport Block, BodyFrame, CaptureState, Pool, Stat
from tensorplay._memory.routing cimport CaptureRoutes


cdef struct PendingEvent:
    uintptr_t event
    Block* block


cdef struct StreamHold:         # a block freed with record_stream during a capture
    Block* block
    uintptr_t stream


cdef class DeviceAllocator:
    cdef readonly int device
    cdef readonly Backend backend
    cdef dict pools                      # id -> Pool
    cdef Pool default_pool
    cdef CaptureRoutes routes            # the open captures allocating into its pools
    cdef vector[PendingEvent] pending    # record_stream events not yet seen complete
    cdef vector[StreamHold] stream_holds # record_stream frees waiting for no capture
    cdef vector[uintptr_t] event_cache   # completed events, reused
    cdef set freeable                    # ids of pools to release once no capture is open
    cdef unsigned long long alloc_seq
    cdef Stat st_allocation[3]          # [all, small pool, large pool], PyTorch's stats
    cdef Stat st_segment[3]
    cdef Stat st_active[3]
    cdef Stat st_allocated_bytes[3]
    cdef Stat st_reserved_bytes[3]
    cdef Stat st_active_bytes[3]
    cdef Stat st_requested_bytes[3]
    cdef long long n_ooms, n_alloc_retries, n_device_alloc, n_device_free

    cdef Pool route(self, uintptr_t stream, uintptr_t* key)
    cdef Block* malloc_block(self, size_t size, uintptr_t stream, Pool pool) except NULL
    cdef void free_block(self, Block* b, Pool pool, object recorded) noexcept
    cdef void release_hold(self, Block* b) noexcept
    cdef void _hold(self, Block* b, Pool pool) noexcept
    cdef void _make_reusable(self, Block* b, Pool pool) noexcept
    cdef uintptr_t _event_on(self, uintptr_t stream) except? 0
    cdef bint _stream_capturing(self, uintptr_t stream) noexcept
    cdef bint _synchronize_quietly(self) noexcept
    cdef void _close_body(self, CaptureState st, BodyFrame f) noexcept
    cdef int process_events(self, bint wait) except -1
    cdef int _process_events_now(self, bint wait) except -1
    cdef void record_stream_frees(self) noexcept
    cdef void _record_stream_frees_now(self) noexcept
    cdef Block* new_segment(self, size_t rsize, uintptr_t stream, Pool pool, bint small) except NULL
    cdef cydriver.CUresult _reserve(self, cydriver.CUdeviceptr* ptr, size_t size, Pool pool) except? cydriver.CUDA_ERROR_UNKNOWN
    cdef int _give_back(self, cydriver.CUdeviceptr ptr, Pool pool) except -1
    cdef int release_cached(self) except -1
    cdef int free_segments(self, Pool pool) except -1
    cdef void maybe_release(self, Pool pool, bint may_tear_down=*) noexcept
    cdef int release_freeable(self, bint may_tear_down=*) except -1


cdef class DeviceAllocation:
    """One allocation from the caching allocator; frees itself when it dies."""
    cdef Block* block
    cdef Pool pool
    cdef DeviceAllocator allocator
    cdef readonly uintptr_t ptr
    cdef readonly size_t size
    cdef readonly int device
    cdef readonly uintptr_t stream
    cdef object recorded_streams


cdef DeviceAllocator get_allocator(int device)
cdef list device_allocators()
cdef int c_note_capture_use(object storage) except -1
