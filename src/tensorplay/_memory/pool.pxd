# SPDX-License-Identifier: Apache-2.0
from cuda.bindings cimport cydriver
from libc.stdint cimport uintptr_t
from libcpp.map cimport map as cmap
from libcpp.pair cimport pair
from libcpp.vector cimport vector

# PyTorch's size classes (c10/cuda/CUDACachingAllocator.cpp)
cdef enum:
    ROUND = 512                     # every size is a multiple of this
    SMALL_SIZE = 1 << 20            # requests up to 1 MiB share small segments
    SMALL_SEGMENT = 2 << 20
    MIN_LARGE_ALLOC = 10 << 20      # requests under this share 20 MiB segments
    LARGE_SEGMENT = 20 << 20
    LARGE_ROUND = 2 << 20           # larger requests get a segment rounded to this

# indices of the statistics arrays: every block, those of small segments, of large ones
cdef enum:
    ALL = 0
    SMALL = 1
    LARGE = 2


cdef struct Stat:               # one of PyTorch's statistics, per kind [ALL, SMALL, LARGE]
    long long current
    long long peak
    long long allocated
    long long freed


cdef inline void stat_add(Stat* s, int kind, long long delta) noexcept:
    """Add ``delta`` to the 'all' entry and to the small or large entry."""
    cdef int i
    for i in (ALL, kind):
        s[i].current += delta
        if delta > 0:
            s[i].allocated += delta
            if s[i].current > s[i].peak:
                s[i].peak = s[i].current
        else:
            s[i].freed -= delta


cdef inline size_t round_size(size_t n) noexcept nogil:
    if n < <size_t>ROUND:
        return ROUND
    return (n + <size_t>ROUND - 1) // <size_t>ROUND * <size_t>ROUND


cdef inline size_t segment_size(size_t rsize) noexcept nogil:
    if rsize <= <size_t>SMALL_SIZE:
        return SMALL_SEGMENT
    if rsize < <size_t>MIN_LARGE_ALLOC:
        return LARGE_SEGMENT
    return (rsize + <size_t>LARGE_ROUND - 1) // <size_t>LARGE_ROUND * <size_t>LARGE_ROUND


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


cdef inline int kind_of(Block* b) noexcept nogil:
    return SMALL if b.small else LARGE


# Free blocks ordered by (stream, size, address): best fit on the same stream.
ctypedef pair[uintptr_t, pair[size_t, uintptr_t]] FreeKey
ctypedef pair[FreeKey, Block*] FreeEntry


cdef class Pool:
    cdef readonly long long id
    cdef readonly int device
    cdef public int graph_refs          # graphs holding this (private) pool
    cdef readonly bint sleepable        # address-reserved segments whose memory can be given back
    cdef public bint asleep             # its segments' physical memory is given back (sleep)
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
    cdef Block* add_segment(self, cydriver.CUdeviceptr ptr, size_t size, uintptr_t stream, bint small) noexcept
    cdef Block* find_free(self, size_t rsize, uintptr_t stream, bint small) noexcept
    cdef void split(self, Block* b, size_t rsize) noexcept
    cdef void insert_free(self, Block* b) noexcept
    cdef vector[Block*] take_free_segments(self) noexcept
    cdef void count_split_free(self, long long* blocks, long long* nbytes) noexcept
    cdef void segment_bytes(self, size_t* small, size_t* large) noexcept
    cdef list snapshot(self, int device)
    cdef int check(self, list problems, size_t* reserved, size_t* allocated) except -1


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
