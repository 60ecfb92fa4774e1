# SPDX-License-Identifier: Apache-2.0
"""Caching device allocator: size classes, block splitting, stream-ordered
reuse, private pools for graph capture."""

cimport cython
from cpython.mem cimport PyMem_Malloc, PyMem_Free
from cuda.bindings cimport cydriver
from libc.stdint cimport uintptr_t
from libcpp.map cimport map as cmap
from libcpp.pair cimport pair
from cython.operator cimport dereference as deref, preincrement as preinc

from tensorplay._cuda cimport check, ensure_context, validate_device, MAX_DEVICES
from tensorplay._cuda import OutOfMemoryError, make_error, device_index as _device_index

import itertools

cdef size_t ROUND = 512                     # every size is a multiple of this
cdef size_t SMALL_SIZE = 1 << 20            # requests up to 1 MiB share small segments
cdef size_t SMALL_SEGMENT = 2 << 20
cdef size_t MIN_LARGE_ALLOC = 10 << 20      # requests under this share 20 MiB segments
cdef size_t LARGE_SEGMENT = 20 << 20
cdef size_t LARGE_ROUND = 2 << 20
cdef size_t MIN_LARGE_SPLIT_REMAINDER = SMALL_SIZE


cdef inline size_t round_size(size_t n) noexcept nogil:
    if n < ROUND:
        return ROUND
    return (n + ROUND - 1) // ROUND * ROUND


cdef inline FreeKey free_key(Block* b) noexcept nogil:
    return FreeKey(<uintptr_t>b.stream, pair[size_t, uintptr_t](b.size, <uintptr_t>b.ptr))


cdef inline bint _mergeable(Block* n) noexcept:
    return n != NULL and not n.allocated and n.pending_events == 0


cdef Block* _absorb_next(Block* b, cmap[FreeKey, Block*]* m) noexcept:
    """Merge b.next into b (b may sit in the free map; it is taken out, as the
    caller reinserts the merged block). Returns b."""
    cdef Block* n = b.next
    if not b.allocated:
        m.erase(free_key(b))
    if not n.allocated:
        m.erase(free_key(n))
    b.size += n.size
    b.next = n.next
    if n.next != NULL:
        n.next.prev = b
    PyMem_Free(n)
    return b


cdef object _pool_ids = itertools.count(1)


def graph_pool_handle():
    """Return a new private pool id, for graphs that share one memory pool."""
    return next(_pool_ids)


cdef class Pool:
    """A set of segments and free blocks; id 0 is a device's default pool."""

    def __cinit__(self, long long id, int device):
        self.id = id
        self.device = device
        self.graph_refs = 0
        self.live_blocks = 0
        self.segments = 0
        self.reserved_bytes = 0

    cdef cmap[FreeKey, Block*]* free_map(self, bint small) noexcept:
        return &self.small_free if small else &self.large_free

    def __repr__(self):
        return (f"<Pool id={self.id} device={self.device} graph_refs={self.graph_refs} "
                f"live_blocks={self.live_blocks} reserved={self.reserved_bytes}>")


cdef class DeviceAllocator:
    """The caching allocator of one device."""

    def __cinit__(self, int device):
        self.device = device
        self.default_pool = Pool(0, device)
        self.pools = {0: self.default_pool}
        self.routes = []
        self.pending = []

    # -------------------------------------------------------------- pools

    def get_pool(self, long long pool_id, bint create=True):
        p = self.pools.get(pool_id)
        if p is None and create:
            p = Pool(pool_id, self.device)
            self.pools[pool_id] = p
        return p

    cdef Pool route(self, cydriver.CUstream stream):
        """The pool an allocation on ``stream`` goes to (a capture's private pool
        when ``stream`` is capturing into a routed capture)."""
        cdef cydriver.CUstreamCaptureStatus status
        cdef cydriver.cuuint64_t cid = 0
        if not self.routes:
            return self.default_pool
        with nogil:
            check(cydriver.cuStreamGetCaptureInfo(stream, &status, &cid, NULL, NULL, NULL, NULL))
        if status == cydriver.CU_STREAM_CAPTURE_STATUS_ACTIVE:
            for capture_id, pool in self.routes:
                if capture_id == cid:
                    return pool
        return self.default_pool

    def begin_allocate_to_pool(self, long long pool_id, unsigned long long capture_id):
        """Route allocations made on streams of capture ``capture_id`` to ``pool_id``."""
        pool = self.get_pool(pool_id)
        self.routes.append((capture_id, pool))
        return pool

    def end_allocate_to_pool(self, unsigned long long capture_id):
        self.routes = [r for r in self.routes if r[0] != capture_id]

    def retain_pool(self, long long pool_id):
        cdef Pool p = self.get_pool(pool_id)
        p.graph_refs += 1
        return p

    def release_pool(self, long long pool_id):
        """Drop a graph's hold on a pool; its memory returns to the device at the
        next empty_cache once no tensor from it is alive."""
        cdef Pool p = self.pools.get(pool_id)
        if p is None:
            return
        if p.graph_refs > 0:
            p.graph_refs -= 1
        self._maybe_forget(p)

    cdef void _maybe_forget(self, Pool p) noexcept:
        if p.id != 0 and p.graph_refs == 0 and p.live_blocks == 0 and p.segments == 0:
            self.pools.pop(p.id, None)

    # -------------------------------------------------------------- events

    cdef int process_events(self, bint wait) except -1:
        """Return blocks whose record_stream events completed to their free lists."""
        cdef cydriver.CUevent ev
        cdef cydriver.CUresult r
        cdef Block* b
        if not self.pending:
            return 0
        still = []
        for ev_int, block_int, pool in self.pending:
            ev = <cydriver.CUevent><uintptr_t>ev_int
            if wait:
                with nogil:
                    r = cydriver.cuEventSynchronize(ev)
            else:
                r = cydriver.cuEventQuery(ev)
            if r == cydriver.CUDA_ERROR_NOT_READY:
                still.append((ev_int, block_int, pool))
                continue
            cydriver.cuEventDestroy(ev)
            b = <Block*><uintptr_t>block_int
            b.pending_events -= 1
            if b.pending_events == 0:
                self.insert_free(b, <Pool>pool)
        self.pending = still
        return 0

    # -------------------------------------------------------------- malloc/free

    cdef Block* malloc_block(self, size_t size, cydriver.CUstream stream, Pool pool) except NULL:
        cdef size_t rsize = round_size(size)
        cdef bint small = rsize <= SMALL_SIZE
        cdef Block* b = self.find_free(rsize, stream, pool, small)
        if b == NULL and self.pending:
            self.process_events(False)
            b = self.find_free(rsize, stream, pool, small)
        if b == NULL:
            b = self.new_segment(rsize, stream, pool, small)
        self.split(b, rsize, pool)
        b.allocated = True
        pool.live_blocks += 1
        self.allocated += b.size
        if self.allocated > self.peak_allocated:
            self.peak_allocated = self.allocated
        self.n_allocs += 1
        self.n_active += 1
        return b

    cdef Block* find_free(self, size_t rsize, cydriver.CUstream stream, Pool pool, bint small) noexcept:
        cdef cmap[FreeKey, Block*]* m = pool.free_map(small)
        cdef FreeKey key = FreeKey(<uintptr_t>stream, pair[size_t, uintptr_t](rsize, 0))
        cdef cmap[FreeKey, Block*].iterator it = m.lower_bound(key)
        if it == m.end():
            return NULL
        if deref(it).first.first != <uintptr_t>stream:
            return NULL
        cdef Block* b = deref(it).second
        if not small and b.size >= MIN_LARGE_ALLOC and rsize < MIN_LARGE_ALLOC:
            # keep huge segments for huge requests instead of carving them up
            return NULL
        m.erase(it)
        return b

    cdef Block* new_segment(self, size_t rsize, cydriver.CUstream stream, Pool pool, bint small) except NULL:
        cdef size_t seg
        if small:
            seg = SMALL_SEGMENT
        elif rsize < MIN_LARGE_ALLOC:
            seg = LARGE_SEGMENT
        else:
            seg = (rsize + LARGE_ROUND - 1) // LARGE_ROUND * LARGE_ROUND
        cdef cydriver.CUdeviceptr ptr = 0
        cdef cydriver.CUresult r = self.raw_alloc(&ptr, seg)
        if r == cydriver.CUDA_ERROR_OUT_OF_MEMORY and not self.routes:
            # free what the cache holds and try once more (never under a
            # capture: cuMemFree would invalidate it)
            self.release_cached()
            r = self.raw_alloc(&ptr, seg)
        if r == cydriver.CUDA_ERROR_OUT_OF_MEMORY:
            self.n_ooms += 1
            free_b, total_b = _mem_info(self.device)
            raise OutOfMemoryError(
                description=(f"tried to allocate {_fmt(rsize)} on cuda:{self.device} "
                             f"({_fmt(free_b)} free of {_fmt(total_b)}; "
                             f"{_fmt(self.allocated)} allocated and {_fmt(self.reserved)} "
                             f"reserved by tensorplay)"))
        check(r)
        cdef Block* b = <Block*>PyMem_Malloc(sizeof(Block))
        if b == NULL:
            cydriver.cuMemFree(ptr)
            raise MemoryError()
        b.ptr = ptr
        b.size = seg
        b.stream = stream
        b.prev = NULL
        b.next = NULL
        b.allocated = False
        b.small = small
        b.pending_events = 0
        pool.segments += 1
        pool.reserved_bytes += seg
        self.reserved += seg
        if self.reserved > self.peak_reserved:
            self.peak_reserved = self.reserved
        self.n_segment_allocs += 1
        return b

    cdef cydriver.CUresult raw_alloc(self, cydriver.CUdeviceptr* ptr, size_t n) except? cydriver.CUDA_ERROR_UNKNOWN:
        cdef cydriver.CUresult r
        cdef cydriver.CUstreamCaptureMode mode = cydriver.CU_STREAM_CAPTURE_MODE_RELAXED
        with nogil:
            ensure_context(self.device)
            # cuMemAlloc is not allowed under a global capture; relax this thread
            # for the call, as PyTorch's allocator does.
            check(cydriver.cuThreadExchangeStreamCaptureMode(&mode))
            r = cydriver.cuMemAlloc(ptr, n)
            check(cydriver.cuThreadExchangeStreamCaptureMode(&mode))
        return r

    cdef void split(self, Block* b, size_t rsize, Pool pool) noexcept:
        cdef size_t rest = b.size - rsize
        cdef Block* r
        if b.small:
            if rest < ROUND:
                return
        elif rest <= MIN_LARGE_SPLIT_REMAINDER:
            return
        r = <Block*>PyMem_Malloc(sizeof(Block))
        if r == NULL:
            return      # keep the block whole; correct, just less tight
        r.ptr = b.ptr + rsize
        r.size = rest
        r.stream = b.stream
        r.prev = b
        r.next = b.next
        r.allocated = False
        r.small = b.small
        r.pending_events = 0
        if b.next != NULL:
            b.next.prev = r
        b.next = r
        b.size = rsize
        pool.free_map(r.small).insert(FreeEntry(free_key(r), r))

    cdef void free_block(self, Block* b, Pool pool, object recorded) noexcept:
        cdef cydriver.CUevent ev
        cdef cydriver.CUstream s
        b.allocated = False
        pool.live_blocks -= 1
        self.allocated -= b.size
        self.n_frees += 1
        self.n_active -= 1
        if recorded:
            # reuse only after the other streams' work done so far has finished
            for sh in recorded:
                s = <cydriver.CUstream><uintptr_t>sh
                ev = NULL
                try:
                    ensure_context(self.device)
                    if cydriver.cuEventCreate(&ev, cydriver.CU_EVENT_DISABLE_TIMING) != cydriver.CUDA_SUCCESS:
                        continue
                    if cydriver.cuEventRecord(ev, s) != cydriver.CUDA_SUCCESS:
                        cydriver.cuEventDestroy(ev)
                        continue
                except BaseException:
                    continue
                b.pending_events += 1
                self.pending.append((<uintptr_t>ev, <uintptr_t>b, pool))
            if b.pending_events > 0:
                return
        self.insert_free(b, pool)

    cdef void insert_free(self, Block* b, Pool pool) noexcept:
        """Put a free block back, merged with free neighbours of its segment."""
        cdef cmap[FreeKey, Block*]* m = pool.free_map(b.small)
        if _mergeable(b.prev):
            b = _absorb_next(b.prev, m)
        if _mergeable(b.next):
            _absorb_next(b, m)
        # Memory stays cached until empty_cache, as in PyTorch.
        m.insert(FreeEntry(free_key(b), b))

    cdef int release_cached(self) except -1:
        """cuMemFree every fully free segment of the default pool and of private
        pools no graph holds. Pools held by a graph keep their memory."""
        cdef Pool p
        self.process_events(True)
        for pool in list(self.pools.values()):
            p = <Pool>pool
            if p.id != 0 and p.graph_refs > 0:
                continue
            self._release_pool_segments(p, &p.small_free)
            self._release_pool_segments(p, &p.large_free)
            self._maybe_forget(p)
        return 0

    cdef int _release_pool_segments(self, Pool pool, cmap[FreeKey, Block*]* m) except -1:
        cdef Block* b
        cdef cydriver.CUresult r
        cdef cmap[FreeKey, Block*].iterator it = m.begin()
        while it != m.end():
            b = deref(it).second
            if b.prev == NULL and b.next == NULL:
                with nogil:
                    ensure_context(self.device)
                    r = cydriver.cuMemFree(b.ptr)
                check(r)
                pool.segments -= 1
                pool.reserved_bytes -= b.size
                self.reserved -= b.size
                self.n_segment_frees += 1
                PyMem_Free(b)
                it = m.erase(it)
            else:
                preinc(it)
        return 0

    # -------------------------------------------------------------- stats

    def stats(self):
        return {
            "allocated_bytes.all.current": self.allocated,
            "allocated_bytes.all.peak": self.peak_allocated,
            "reserved_bytes.all.current": self.reserved,
            "reserved_bytes.all.peak": self.peak_reserved,
            "active.all.current": self.n_active,
            "allocation.all.allocated": self.n_allocs,
            "allocation.all.freed": self.n_frees,
            "segment.all.allocated": self.n_segment_allocs,
            "segment.all.freed": self.n_segment_frees,
            "segment.all.current": self.n_segment_allocs - self.n_segment_frees,
            "num_ooms": self.n_ooms,
            "num_pools": len(self.pools),
            "pending_events": len(self.pending),
        }


def _fmt(n):
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.2f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024


def _mem_info(int device):
    cdef size_t f = 0, t = 0
    try:
        ensure_context(device)
        if cydriver.cuMemGetInfo(&f, &t) != cydriver.CUDA_SUCCESS:
            return 0, 0
    except Exception:
        return 0, 0
    return f, t


cdef list _allocators = [None] * MAX_DEVICES


cdef DeviceAllocator get_allocator(int device):
    a = _allocators[device]
    if a is None:
        validate_device(device)
        a = DeviceAllocator(device)
        _allocators[device] = a
    return <DeviceAllocator>a


def allocator(device=None):
    """The DeviceAllocator of ``device`` (default: current)."""
    return get_allocator(_device_index(device))


# no_gc_clear: __dealloc__ needs its allocator and pool; the collector must
# never set them to None when the allocation is garbage inside a cycle.
@cython.no_gc_clear
@cython.freelist(32)
cdef class DeviceAllocation:
    """Memory from the caching allocator; returned to its pool when this dies."""

    def __dealloc__(self):
        if self.block != NULL and self.allocator is not None and self.pool is not None:
            self.allocator.free_block(self.block, self.pool, self.recorded_streams)
            self.block = NULL
            self.allocator._maybe_forget(self.pool)

    def record_stream(self, stream_handle):
        """Mark the memory as used on another stream: it is reused only after the
        work queued on that stream by the time it is freed has finished."""
        if self.block == NULL:
            return
        h = int(stream_handle)
        if h == self.stream:
            return
        if self.recorded_streams is None:
            self.recorded_streams = set()
        self.recorded_streams.add(h)

    @property
    def pool_id(self):
        return self.pool.id if self.pool is not None else None

    def __repr__(self):
        return f"<DeviceAllocation ptr={self.ptr:#x} size={self.size} device={self.device}>"


cdef DeviceAllocation allocate(size_t nbytes, int device, cydriver.CUstream stream):
    """Allocate ``nbytes`` on ``device`` for use on ``stream``."""
    cdef DeviceAllocator a = get_allocator(device)
    cdef DeviceAllocation out = DeviceAllocation.__new__(DeviceAllocation)
    out.device = device
    out.size = nbytes
    out.stream = <uintptr_t>stream
    out.allocator = a
    if nbytes == 0:
        return out
    cdef Pool pool = a.route(stream)
    out.block = a.malloc_block(nbytes, stream, pool)
    out.pool = pool
    out.ptr = <uintptr_t>out.block.ptr
    return out


def _allocate(size_t nbytes, int device, uintptr_t stream):
    """Python access to allocate() for the pure-Python layers and tests."""
    return allocate(nbytes, device, <cydriver.CUstream>stream)


def empty_cache(device=None):
    """Release every cached, unused segment back to the device (cuMemFree).

    Memory of a private pool still held by a graph, and memory under live
    tensors, is kept. Not allowed while a graph capture is under way."""
    for each in _allocators:
        if each is not None and (<DeviceAllocator>each).routes:
            raise RuntimeError("empty_cache() cannot run while a CUDA graph capture is under way")
    if device is None:
        for each in _allocators:
            if each is not None:
                (<DeviceAllocator>each).release_cached()
        return
    get_allocator(_device_index(device)).release_cached()


def memory_stats(device=None):
    """Return the allocator's counters for ``device`` as a dict (PyTorch's key names)."""
    return get_allocator(_device_index(device)).stats()


def memory_allocated(device=None):
    """Bytes held by live allocations (rounded to the allocator's granularity)."""
    return get_allocator(_device_index(device)).allocated


def max_memory_allocated(device=None):
    return get_allocator(_device_index(device)).peak_allocated


def memory_reserved(device=None):
    """Bytes the allocator holds from the device (cuMemAlloc'd segments)."""
    return get_allocator(_device_index(device)).reserved


def max_memory_reserved(device=None):
    return get_allocator(_device_index(device)).peak_reserved


def reset_peak_memory_stats(device=None):
    cdef DeviceAllocator a = get_allocator(_device_index(device))
    a.peak_allocated = a.allocated
    a.peak_reserved = a.reserved
