# SPDX-License-Identifier: Apache-2.0
from cuda.bindings cimport cydriver
from libc.stdint cimport uintptr_t
from libcpp.map cimport map as cmap
from libcpp.pair cimport pair
from libcpp.vector cimport vector


cdef struct Block:
    cydriver.CUdeviceptr ptr
    size_t size
    cydriver.CUstream stream
    Block* prev                 # neighbours inside one segment (split blocks)
    Block* next
    bint allocated
    bint small
    int pending_events          # record_stream events not yet completed

# Free blocks ordered by (stream, size, address): best fit on the same stream.
ctypedef pair[uintptr_t, pair[size_t, uintptr_t]] FreeKey
ctypedef pair[FreeKey, Block*] FreeEntry


cdef class Pool:
    cdef readonly long long id
    cdef readonly int device
    cdef public int graph_refs          # graphs holding this (private) pool
    cdef cmap[FreeKey, Block*] small_free
    cdef cmap[FreeKey, Block*] large_free
    cdef readonly long long live_blocks
    cdef readonly long long segments
    cdef readonly size_t reserved_bytes

    cdef cmap[FreeKey, Block*]* free_map(self, bint small) noexcept


cdef class DeviceAllocator:
    cdef readonly int device
    cdef dict pools                      # id -> Pool
    cdef Pool default_pool
    cdef list routes                     # [(capture_id, Pool)] while captures are under way
    cdef list pending                    # [(CUevent handle as int, Block address as int)]
    cdef size_t allocated, peak_allocated, reserved, peak_reserved
    cdef long long n_allocs, n_frees, n_segment_allocs, n_segment_frees, n_ooms, n_active

    cdef Block* malloc_block(self, size_t size, cydriver.CUstream stream, Pool pool) except NULL
    cdef void free_block(self, Block* b, Pool pool, object recorded) noexcept
    cdef Pool route(self, cydriver.CUstream stream)
    cdef void _maybe_forget(self, Pool p) noexcept
    cdef int process_events(self, bint wait) except -1
    cdef Block* find_free(self, size_t rsize, cydriver.CUstream stream, Pool pool, bint small) noexcept
    cdef Block* new_segment(self, size_t rsize, cydriver.CUstream stream, Pool pool, bint small) except NULL
    cdef cydriver.CUresult raw_alloc(self, cydriver.CUdeviceptr* ptr, size_t n) except? cydriver.CUDA_ERROR_UNKNOWN
    cdef void split(self, Block* b, size_t rsize, Pool pool) noexcept
    cdef void insert_free(self, Block* b, Pool pool) noexcept
    cdef int release_cached(self) except -1
    cdef int _release_pool_segments(self, Pool pool, cmap[FreeKey, Block*]* m) except -1


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
