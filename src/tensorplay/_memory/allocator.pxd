# SPDX-License-Identifier: Apache-2.0
from cuda.bindings cimport cydriver
from libc.stdint cimport uintptr_t
from libcpp.map cimport map as cmap
from libcpp.pair cimport pair
from libcpp.vector cimport vector


cdef struct Block:
    cydriver.CUdeviceptr ptr
    size_t size
    size_t requested            # bytes asked for (allocated blocks)
    uintptr_t stream            # the stream it is reused on (a body's stream counts as its root's)
    Block* prev                 # neighbours inside one segment (split blocks)
    Block* next
    void* pool                  # the Pool that owns the segment (borrowed: pools outlive their segments)
    bint allocated
    bint small
    int holds                   # reasons a freed block is not reusable yet: pending events, deferrals
    unsigned long long alloc_seq    # allocation order, to compare with conditional bodies' opening
    long long cross_capture     # serial of the capture that used it on another stream


# Free blocks ordered by (stream, size, address): best fit on the same stream.
ctypedef pair[uintptr_t, pair[size_t, uintptr_t]] FreeKey
ctypedef pair[FreeKey, Block*] FreeEntry


cdef struct PendingEvent:
    uintptr_t event
    Block* block


cdef struct StreamHold:         # a block freed with record_stream during a capture
    Block* block
    uintptr_t stream


cdef struct Stat:
    long long current
    long long peak
    long long allocated
    long long freed


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


cdef class Pool:
    cdef readonly long long id
    cdef readonly int device
    cdef public int graph_refs          # graphs holding this (private) pool
    cdef cmap[FreeKey, Block*] small_free
    cdef cmap[FreeKey, Block*] large_free
    cdef cmap[uintptr_t, Block*] segment_heads     # segment address -> its first block
    cdef readonly long long live_blocks
    cdef readonly long long held_blocks
    cdef readonly long long segments
    cdef readonly size_t reserved_bytes
    cdef readonly size_t allocated_bytes
    cdef readonly CaptureState capture             # the capture allocating into it, if any
    cdef vector[uintptr_t] release_events          # replays of released graphs, waited on before cuMemFree

    cdef cmap[FreeKey, Block*]* free_map(self, bint small) noexcept


cdef class BodyFrame:
    cdef uintptr_t stream
    cdef unsigned long long capture_id
    cdef unsigned long long open_seq
    cdef vector[Block*] deferred        # allocated before this body opened, freed inside it


cdef class CaptureState:
    cdef readonly Pool pool
    cdef readonly unsigned long long capture_id
    cdef readonly uintptr_t stream
    cdef readonly long long serial
    cdef list bodies                    # [BodyFrame], innermost last
    cdef dict aliases                   # body stream -> root capture stream
    cdef dict keepalive                 # id -> storage from outside the pool used by the capture
    cdef dict scratch                   # key -> memory the capture's work uses until it ends (workspaces)
    cdef vector[Block*] deferred        # used on another stream during the capture, freed in it
    cdef readonly object thread
    cdef readonly bint ended
    cdef uintptr_t key_stream(self, uintptr_t stream) noexcept


cdef class DeviceAllocator:
    cdef readonly int device
    cdef readonly Backend backend
    cdef dict pools                      # id -> Pool
    cdef Pool default_pool
    cdef dict captures                   # capture id (root or body) -> CaptureState
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
    cdef void record_stream_frees(self) noexcept
    cdef Block* find_free(self, size_t rsize, uintptr_t stream, Pool pool, bint small) noexcept
    cdef Block* new_segment(self, size_t rsize, uintptr_t stream, Pool pool, bint small) except NULL
    cdef void split(self, Block* b, size_t rsize, Pool pool) noexcept
    cdef void insert_free(self, Block* b, Pool pool) noexcept
    cdef int release_cached(self) except -1
    cdef int free_segments(self, Pool pool) except -1
    cdef void maybe_release(self, Pool pool) noexcept
    cdef int release_freeable(self) except -1


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


cdef DeviceAllocation allocate(size_t nbytes, int device, cydriver.CUstream stream)
cdef DeviceAllocator get_allocator(int device)
cdef int open_capture_count() noexcept nogil
cdef int note_capture_use(object storage) except -1
