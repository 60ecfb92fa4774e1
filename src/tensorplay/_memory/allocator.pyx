# SPDX-License-Identifier: Apache-2.0
"""Caching device allocator: PyTorch's block policy (size classes, segments,
splitting, best fit by stream and size, merging: tensorplay._memory.pool),
stream-ordered reuse with record_stream events, private pools for graph
capture and the routing of a capture's allocations to its pool, and the
statistics.

The policy is written once, over a ``Backend`` that hands out segments and
events (tensorplay._memory.backend): ``DriverBackend`` (cuMemAlloc,
cuEventRecord, ...) on a GPU, or ``FakeBackend`` (tensorplay._memory.testing:
address ranges and events a test completes) anywhere, so the policy is tested
on machines without a GPU. The public memory functions are
tensorplay._memory.api.

Capture rules (see docs/design.md): allocations on a capture's streams come from
its pool; a block freed during the capture goes back to the pool at once,
except a block the capture used on another stream (reusable after the
capture ends) and a block allocated before an open conditional body and freed
inside it (reusable after that body ends: a WHILE body runs again). No event
is queried or recorded while any capture is open: blocks freed with
record_stream then wait until no capture is open.
"""

cimport cython
from cpython.mem cimport PyMem_Free
from cuda.bindings cimport cydriver
from libc.stdint cimport uintptr_t
from libcpp.vector cimport vector

from tensorplay._driver.context cimport MAX_DEVICES, check, count_open_capture, open_capture_count, validate_device
from tensorplay._driver.stream cimport current_stream_handle
from tensorplay._driver.teardown cimport destroy_must_wait, run_deferred
from tensorplay._memory.pool cimport ALL, LARGE, SMALL, SMALL_SIZE, kind_of, round_size, segment_size, stat_add
from tensorplay._memory.routing cimport CaptureRoutes, deferral_of, innermost_capture

from tensorplay._driver.context import OutOfMemoryError
from tensorplay._memory.backend import DriverBackend
from tensorplay._memory.units import format_bytes

cdef set _sleepable_ids = set()              # pool ids whose segments can sleep (every device)


class PoolAsleepError(RuntimeError):
    """A graph or a capture needs a memory pool whose memory was given back
    by ``sleep()``; ``wake()`` it first."""


# The public module path: tracebacks and reprs show tensorplay.cuda.PoolAsleepError.
PoolAsleepError.__module__ = "tensorplay.cuda"


def make_sleepable(long long pool_id):
    """Give pool ``pool_id`` sleepable segments on every device (before it
    allocates: graph_pool_handle(sleepable=True))."""
    _sleepable_ids.add(pool_id)


def is_sleepable(long long pool_id):
    return pool_id in _sleepable_ids


cdef int c_note_capture_use(object storage) except -1:
    """Called wherever a device pointer leaves a tensor while a capture is open:
    the innermost capture of this thread keeps ``storage`` alive if it comes
    from outside its pool, and marks a pool block used on another stream."""
    cdef DeviceAllocation da
    cdef CaptureState st = innermost_capture()
    if st is None:
        return 0
    if type(storage) is DeviceAllocation:
        da = <DeviceAllocation>storage
        if da.pool is st.pool:
            if da.block != NULL and \
                    st.key_stream(<uintptr_t>current_stream_handle(da.device)) != da.block.stream:
                da.block.cross_capture = st.serial
            return 0
    st.keepalive[id(storage)] = storage
    return 0


def note_capture_use(storage):
    """Python access to c_note_capture_use (the random generators, tests)."""
    if open_capture_count():
        c_note_capture_use(storage)


# ------------------------------------------------------------------ the allocator

cdef class DeviceAllocator:
    """The caching allocator of one device, over ``backend`` (default: the driver)."""

    def __cinit__(self, int device, Backend backend=None):
        self.device = device
        self.backend = backend if backend is not None else DriverBackend(device)
        self.default_pool = Pool(0, device)
        self.pools = {0: self.default_pool}
        self.routes = CaptureRoutes()
        self.freeable = set()
        self.alloc_seq = 0

    def __dealloc__(self):
        # only fake allocators die (a device's allocator lives for the process)
        for e in self.pending:
            self.backend.destroy_event(e.event)
        for ev in self.event_cache:
            self.backend.destroy_event(ev)

    # -------------------------------------------------------------- pools

    def get_pool(self, long long pool_id, bint create=True):
        p = self.pools.get(pool_id)
        if p is None and create:
            sleepable = pool_id in _sleepable_ids
            if sleepable and not self.backend.supports_sleep():
                raise RuntimeError(f"memory pool {pool_id} is sleepable, but cuda:{self.device} does not support "
                                   f"virtual memory management (CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_"
                                   f"SUPPORTED); use a pool made with sleepable=False")
            p = Pool(pool_id, self.device, sleepable)
            self.pools[pool_id] = p
        return p

    def sleep_pool(self, long long pool_id):
        """Give the physical memory of pool ``pool_id`` back to the device,
        keeping its addresses (graphs over it stay instantiated); return the
        bytes given back. Waits for the device's queued work first. Contents
        are lost. Refused while a capture is under way."""
        cdef Pool p = self.get_pool(pool_id)
        cdef size_t n = 0, small = 0, large = 0
        if not p.sleepable:
            raise ValueError(f"memory pool {pool_id} cannot sleep: it was made without sleepable segments "
                             f"(use tensorplay.cuda.GraphPool(sleepable=True) or graph_pool_handle(sleepable=True))")
        if p.asleep:
            return 0
        if open_capture_count() > 0:
            raise RuntimeError(f"sleep: a CUDA graph capture is under way; memory pool {pool_id} can sleep once "
                               f"it ends (unmapping memory would invalidate the capture)")
        if p.capture is not None:
            raise RuntimeError(f"sleep: memory pool {pool_id} is being captured into")
        self.backend.synchronize()          # replays still queued may use the memory
        p.segment_bytes(&small, &large)
        p.asleep = True                      # also when the driver fails part-way: replays stay refused
        stat_add(self.st_reserved_bytes, SMALL, -<long long>small)
        stat_add(self.st_reserved_bytes, LARGE, -<long long>large)
        self.backend.sleep_segments(pool_id, &n)
        return n

    def wake_pool(self, long long pool_id):
        """Map new physical memory under pool ``pool_id``'s addresses; return
        the bytes mapped. On failure (out of memory) nothing stays mapped and
        the pool stays asleep."""
        cdef Pool p = self.pools.get(pool_id)
        cdef size_t n = 0, small = 0, large = 0
        cdef cydriver.CUresult r
        if p is None or not p.asleep:
            return 0
        r = self.backend.wake_segments(pool_id, &n)
        if r == cydriver.CUDA_ERROR_OUT_OF_MEMORY:
            self.n_ooms += 1
            free_b, total_b = self.backend.mem_info()
            raise OutOfMemoryError(
                description=(f"wake: memory pool {pool_id} needs its memory back on cuda:{self.device} "
                             f"({format_bytes(free_b)} free of {format_bytes(total_b)}); it stays asleep"))
        check(r)
        p.asleep = False
        p.segment_bytes(&small, &large)
        stat_add(self.st_reserved_bytes, SMALL, <long long>small)
        stat_add(self.st_reserved_bytes, LARGE, <long long>large)
        return n

    def retain_pool(self, long long pool_id):
        cdef Pool p = self.get_pool(pool_id)
        p.graph_refs += 1
        return p

    def release_pool(self, long long pool_id, replay_streams=()):
        """Drop a graph's hold on a pool. Once no graph holds it and no tensor
        uses it, its segments go back to the device (after the replays on
        ``replay_streams`` finish; at once, or when no capture is open)."""
        cdef Pool p = self.pools.get(pool_id)
        if p is None:
            return
        if p.graph_refs > 0:
            p.graph_refs -= 1
        if p.graph_refs == 0 and replay_streams and not destroy_must_wait():
            for h in replay_streams:
                if self._stream_capturing(h):
                    continue               # cuMemFree's implicit synchronization still holds
                try:
                    ev = self._event_on(h)
                except BaseException:
                    continue
                p.release_events.push_back(ev)
        self.maybe_release(p)

    cdef uintptr_t _event_on(self, uintptr_t stream) except? 0:
        """A cached or new event recorded on ``stream``. Callers first make
        sure no capture is open and ``stream`` is not capturing."""
        cdef uintptr_t ev
        if self.event_cache.empty():
            ev = self.backend.create_event()
        else:
            ev = self.event_cache.back()
            self.event_cache.pop_back()
        try:
            self.backend.record_event(ev, stream)
        except BaseException:
            self.backend.destroy_event(ev)
            raise
        return ev

    cdef void maybe_release(self, Pool pool, bint may_tear_down=False) noexcept:
        """Give an unused private pool's segments back and forget the pool
        (``may_tear_down``: the caller already asked destroy_must_wait())."""
        if pool.id == 0 or pool.graph_refs > 0 or pool.live_blocks > 0 or pool.held_blocks > 0 \
                or pool.capture is not None:
            return
        if not may_tear_down and destroy_must_wait():   # cuMemFree would break a capture
            self.freeable.add(pool.id)
            return
        self.freeable.discard(pool.id)
        try:
            self.free_segments(pool)
        except BaseException:
            return            # a driver error: the segments stay accounted for
        if pool.segments == 0 and self.pools.get(pool.id) is pool:
            del self.pools[pool.id]

    cdef int release_freeable(self, bint may_tear_down=False) except -1:
        cdef Pool p
        if not self.freeable or (not may_tear_down and destroy_must_wait()):
            return 0
        for pid in list(self.freeable):
            self.freeable.discard(pid)
            p = self.pools.get(pid)
            if p is not None:
                self.maybe_release(p, True)
        return 0

    # -------------------------------------------------------------- captures

    def begin_capture(self, long long pool_id, unsigned long long capture_id, uintptr_t stream,
                      bint track=True):
        """Route allocations made on streams of capture ``capture_id`` to pool
        ``pool_id`` and return the capture's state. ``track``: this thread's
        pointer uses register with it (note_capture_use)."""
        cdef Pool pool = self.get_pool(pool_id)
        if pool.asleep:
            raise PoolAsleepError(f"capture_begin: memory pool {pool_id} is asleep (its memory was given back "
                                  f"by sleep()); wake() it before capturing into it")
        if pool.capture is not None:
            other = pool.capture
            raise RuntimeError(
                f"capture_begin: memory pool {pool_id} is already being captured into (capture "
                f"{other.capture_id} on stream {other.stream:#x}, thread {other.thread}); a pool takes "
                f"one capture at a time: end that capture first, or capture into another pool")
        run_deferred()                       # what died since the last capture, while none is open
        st = self.routes.begin(pool, capture_id, stream, track)
        if pool.sleepable:
            self.backend.route_capture(capture_id, pool_id)    # other libraries' segments join the pool
        count_open_capture(1)
        return st

    def begin_body(self, CaptureState st not None, uintptr_t stream, unsigned long long capture_id):
        """A conditional body of ``st`` starts capturing on ``stream``."""
        self.routes.begin_body(st, stream, capture_id, self.alloc_seq)
        if st.pool.sleepable:
            self.backend.route_capture(capture_id, st.pool.id)

    def end_body(self, CaptureState st not None):
        """The innermost body of ``st`` ended: its deferred blocks become reusable."""
        if st.bodies:
            self._close_body(st, <BodyFrame>st.bodies.pop())

    cdef void _close_body(self, CaptureState st, BodyFrame f) noexcept:
        cdef Block* b
        cdef vector[Block*] deferred
        self.routes.end_body(st, f)
        self.backend.unroute_capture(f.capture_id)
        deferred.swap(f.deferred)
        for b in deferred:
            self.release_hold(b)

    def end_capture(self, CaptureState st not None):
        """End ``st`` (also with bodies still open: an aborted capture): stop
        routing, make its deferred blocks reusable, and return the storages
        from outside its pool that it used. The last capture to end runs what
        waited for no capture (record_stream events, pools to free, teardown)."""
        cdef Block* b
        cdef vector[Block*] deferred
        if st.ended:
            return {}
        while st.bodies:
            self._close_body(st, <BodyFrame>st.bodies.pop())
        self.routes.end(st)
        self.backend.unroute_capture(st.capture_id)
        count_open_capture(-1)
        deferred.swap(st.deferred)          # freed after the end: back to the pool, for later captures
        for b in deferred:
            self.release_hold(b)
        if open_capture_count() == 0:
            run_deferred()
            for a in [self] + [x for x in device_allocators() if x is not self]:
                (<DeviceAllocator>a).record_stream_frees()
                (<DeviceAllocator>a).release_freeable()
        self.maybe_release(st.pool)
        keep = st.keepalive
        st.keepalive = {}
        return keep

    @property
    def open_captures(self):
        return len(self.routes)

    def capture_scratch(self, uintptr_t stream, key, size_t nbytes):
        """Memory of ``nbytes`` that the capture ``stream`` captures into keeps
        under ``key`` until it ends (a body's stream shares its root's), from
        the capture's pool; None when ``stream`` captures into none of ours."""
        if not self.routes.captures:
            return None
        st = self.routes.state_of(self.backend.capture_id(stream))
        if st is None:
            return None
        k = (key, st.key_stream(stream), nbytes)
        mem = st.scratch.get(k)
        if mem is None:
            mem = st.scratch[k] = _allocate_from(self, nbytes, stream)
        return mem

    cdef Pool route(self, uintptr_t stream, uintptr_t* key):
        """The pool an allocation on ``stream`` comes from (a capture's pool
        when ``stream`` captures into it), and the stream its block is keyed by."""
        cdef CaptureState st
        key[0] = stream
        if not self.routes.captures:
            return self.default_pool
        st = self.routes.state_of(self.backend.capture_id(stream))
        if st is None:
            return self.default_pool
        key[0] = st.key_stream(stream)
        return st.pool

    # -------------------------------------------------------------- events

    cdef int process_events(self, bint wait) except -1:
        """Make blocks whose record_stream events completed reusable (never
        while a capture is open: a query would break it)."""
        if self.pending.empty() or destroy_must_wait():
            return 0
        return self._process_events_now(wait)

    cdef int _process_events_now(self, bint wait) except -1:
        """process_events once the caller knows no capture forbids the queries."""
        cdef vector[PendingEvent] todo
        cdef vector[PendingEvent] still
        cdef PendingEvent e
        todo.swap(self.pending)
        for e in todo:
            if self.backend.event_done(e.event, wait):
                self.event_cache.push_back(e.event)
                self.release_hold(e.block)
            else:
                still.push_back(e)
        for e in still:                  # others may have queued events meanwhile
            self.pending.push_back(e)
        return 0

    cdef void record_stream_frees(self) noexcept:
        """Record the end-of-use events of blocks freed with record_stream
        during a capture, now that none is open."""
        if self.stream_holds.empty() or destroy_must_wait():
            return
        self._record_stream_frees_now()

    cdef void _record_stream_frees_now(self) noexcept:
        """record_stream_frees once the caller knows teardown may run."""
        cdef vector[StreamHold] todo
        cdef StreamHold h
        cdef uintptr_t ev
        todo.swap(self.stream_holds)
        for h in todo:
            if open_capture_count() > 0 or self._stream_capturing(h.stream):
                self.stream_holds.push_back(h)     # the stream captures now: wait longer
                continue
            try:
                ev = self._event_on(h.stream)
            except BaseException:
                ev = 0
            if ev:
                self.pending.push_back(PendingEvent(ev, h.block))   # the hold passes to the event
            elif self._synchronize_quietly():
                self.release_hold(h.block)
            # else the block stays held: never reused unsafely

    cdef bint _stream_capturing(self, uintptr_t stream) noexcept:
        try:
            return self.backend.capture_id(stream) != 0
        except BaseException:
            return False

    cdef bint _synchronize_quietly(self) noexcept:
        try:
            self.backend.synchronize()
            return True
        except BaseException:
            return False

    # -------------------------------------------------------------- malloc/free

    cdef Block* malloc_block(self, size_t size, uintptr_t stream, Pool pool) except NULL:
        cdef size_t rsize = round_size(size)
        cdef bint small = rsize <= <size_t>SMALL_SIZE
        cdef Block* b
        if (not self.pending.empty() or not self.stream_holds.empty() or self.freeable) \
                and not destroy_must_wait():           # asked once: the probe of other libraries costs
            if not self.pending.empty():
                self._process_events_now(False)
            if not self.stream_holds.empty():
                self._record_stream_frees_now()
            self.release_freeable(True)
        b = pool.find_free(rsize, stream, small)
        if b == NULL:
            b = self.new_segment(rsize, stream, pool, small)
        pool.split(b, rsize)
        b.allocated = True
        b.requested = size
        self.alloc_seq += 1
        b.alloc_seq = self.alloc_seq
        b.cross_capture = 0
        pool.live_blocks += 1
        pool.allocated_bytes += b.size
        stat_add(self.st_allocation, kind_of(b), 1)
        stat_add(self.st_active, kind_of(b), 1)
        stat_add(self.st_allocated_bytes, kind_of(b), b.size)
        stat_add(self.st_active_bytes, kind_of(b), b.size)
        stat_add(self.st_requested_bytes, kind_of(b), size)
        return b

    cdef Block* new_segment(self, size_t rsize, uintptr_t stream, Pool pool, bint small) except NULL:
        cdef size_t seg = segment_size(rsize)
        cdef size_t g
        cdef cydriver.CUdeviceptr ptr = 0
        cdef cydriver.CUresult r
        if pool.sleepable:
            g = self.backend.granularity()
            seg = (seg + g - 1) // g * g
        r = self._reserve(&ptr, seg, pool)
        if r == cydriver.CUDA_ERROR_OUT_OF_MEMORY and not destroy_must_wait():
            # free what the cache holds and try once more (never under a
            # capture: cuMemFree would break it)
            self.n_alloc_retries += 1
            self.release_cached()
            r = self._reserve(&ptr, seg, pool)
        if r == cydriver.CUDA_ERROR_OUT_OF_MEMORY:
            self.n_ooms += 1
            free_b, total_b = self.backend.mem_info()
            why = ("; inside a CUDA graph capture the cache cannot be released (cuMemFree would end "
                   "the capture): call empty_cache() before capturing" if open_capture_count() > 0 else "")
            raise OutOfMemoryError(
                description=(f"tried to allocate {format_bytes(rsize)} on cuda:{self.device} "
                             f"({format_bytes(free_b)} free of {format_bytes(total_b)}; "
                             f"{format_bytes(self.st_allocated_bytes[ALL].current)} allocated and "
                             f"{format_bytes(self.st_reserved_bytes[ALL].current)} reserved by tensorplay){why}"))
        check(r)
        cdef Block* b = pool.add_segment(ptr, seg, stream, small)
        if b == NULL:
            self._give_back(ptr, pool)
            raise MemoryError()
        stat_add(self.st_segment, kind_of(b), 1)
        stat_add(self.st_reserved_bytes, kind_of(b), seg)
        self.n_device_alloc += 1
        return b

    cdef cydriver.CUresult _reserve(self, cydriver.CUdeviceptr* ptr, size_t size, Pool pool) except? cydriver.CUDA_ERROR_UNKNOWN:
        """A new segment of ``pool``: sleepable (mapped under a reserved
        range, tensorplay._memory.vmm) or plain (cuMemAlloc)."""
        if pool.sleepable:
            return self.backend.map_segment(ptr, size, pool.id)
        return self.backend.malloc(ptr, size)

    cdef int _give_back(self, cydriver.CUdeviceptr ptr, Pool pool) except -1:
        """Return a segment of ``pool`` to the device (the pair of _reserve)."""
        if pool.sleepable:
            self.backend.free_mapped(ptr)
        else:
            self.backend.free(ptr)
        return 0

    cdef void _hold(self, Block* b, Pool pool) noexcept:
        if b.holds == 0:
            pool.held_blocks += 1
        b.holds += 1

    cdef void free_block(self, Block* b, Pool pool, object recorded) noexcept:
        """A live block was freed: reusable now, after events, or after its
        capture or body ends (see the module docstring)."""
        cdef vector[Block*]* wait
        cdef uintptr_t ev
        cdef bint must_wait
        b.allocated = False
        pool.live_blocks -= 1
        pool.allocated_bytes -= b.size
        stat_add(self.st_allocation, kind_of(b), -1)
        stat_add(self.st_allocated_bytes, kind_of(b), -<long long>b.size)
        stat_add(self.st_requested_bytes, kind_of(b), -<long long>b.requested)
        if recorded:
            # reuse only after the other streams' work queued so far has finished.
            # A guard hold first: the driver calls below release the GIL, and a
            # neighbour freed by another thread meanwhile must not absorb b.
            self._hold(b, pool)
            must_wait = destroy_must_wait()
            for h in recorded:
                if must_wait or self._stream_capturing(<uintptr_t>h):
                    self._hold(b, pool)          # recorded once no capture is open
                    self.stream_holds.push_back(StreamHold(b, <uintptr_t>h))
                    continue
                try:
                    ev = self._event_on(<uintptr_t>h)
                except BaseException:
                    ev = 0
                if ev:
                    self._hold(b, pool)
                    self.pending.push_back(PendingEvent(ev, b))
                elif not self._synchronize_quietly():
                    self._hold(b, pool)          # nothing can tell when it is safe: never reused
            b.holds -= 1                          # the guard
            if b.holds > 0:
                return
            pool.held_blocks -= 1
        if pool.capture is not None:
            wait = deferral_of(pool.capture, b)
            if wait != NULL:                    # reusable when the capture or a body ends
                self._hold(b, pool)
                wait.push_back(b)
                return
        self._make_reusable(b, pool)

    cdef void release_hold(self, Block* b) noexcept:
        cdef Pool pool = <Pool>b.pool
        b.holds -= 1
        if b.holds > 0:
            return
        pool.held_blocks -= 1
        self._make_reusable(b, pool)

    cdef void _make_reusable(self, Block* b, Pool pool) noexcept:
        stat_add(self.st_active, kind_of(b), -1)
        stat_add(self.st_active_bytes, kind_of(b), -<long long>b.size)
        pool.insert_free(b)
        if pool.live_blocks == 0 and pool.held_blocks == 0 and pool.id != 0:
            self.maybe_release(pool)

    # -------------------------------------------------------------- releasing memory

    cdef int release_cached(self) except -1:
        """cuMemFree every fully free segment of the default pool and of private
        pools no graph holds. Pools held by a graph keep their memory."""
        cdef Pool p
        if open_capture_count() > 0:
            raise RuntimeError("empty_cache() cannot run while a CUDA graph capture is under way")
        self.process_events(True)
        self.record_stream_frees()
        self.process_events(True)
        first_error = None
        for pool in list(self.pools.values()):
            p = <Pool>pool
            if p.id != 0 and (p.graph_refs > 0 or p.capture is not None):
                continue
            try:
                self.free_segments(p)
            except BaseException as exc:
                first_error = first_error or exc
            if p.id != 0 and p.segments == 0 and p.live_blocks == 0 and p.held_blocks == 0 \
                    and p.graph_refs == 0 and self.pools.get(p.id) is p:
                del self.pools[p.id]
        if first_error is not None:
            raise first_error
        return 0

    cdef int free_segments(self, Pool pool) except -1:
        """cuMemFree the segments of ``pool`` that are one free block. They
        leave the pool's maps and counters first (Pool.take_free_segments), so
        no other thread can take them while the GIL is released around the
        driver call."""
        cdef vector[Block*] whole = pool.take_free_segments()
        cdef Block* b
        cdef uintptr_t ev
        for b in whole:
            stat_add(self.st_segment, kind_of(b), -1)
            if not pool.asleep:                 # asleep: already out of reserved_bytes
                stat_add(self.st_reserved_bytes, kind_of(b), -<long long>b.size)
        if whole.empty():
            return 0
        # replays of graphs that released this pool may still be running
        # (swapped out first: the wait releases the GIL)
        cdef vector[uintptr_t] events
        events.swap(pool.release_events)
        for ev in events:
            self.backend.event_done(ev, True)
            self.event_cache.push_back(ev)
        first_error = None
        for b in whole:
            try:
                self._give_back(b.ptr, pool)
                self.n_device_free += 1
            except BaseException as exc:
                first_error = first_error or exc
            PyMem_Free(b)
        if first_error is not None:
            raise first_error
        return 0

    def empty_cache(self):
        """Release the cached segments (see release_cached)."""
        self.release_cached()

    # -------------------------------------------------------------- for tests and users

    def allocate(self, size_t nbytes, uintptr_t stream=0):
        """A DeviceAllocation of ``nbytes`` for use on ``stream``."""
        return _allocate_from(self, nbytes, stream)

    def stats(self):
        """The counters, under PyTorch's memory_stats() key names."""
        cdef Pool p
        cdef long long split_n[3]
        cdef long long split_b[3]
        cdef int i
        split_n[0] = split_n[1] = split_n[2] = 0
        split_b[0] = split_b[1] = split_b[2] = 0
        for pool in self.pools.values():
            (<Pool>pool).count_split_free(split_n, split_b)
        out = {}
        _put_stat(out, "allocation", self.st_allocation)
        _put_stat(out, "segment", self.st_segment)
        _put_stat(out, "active", self.st_active)
        _put_stat(out, "allocated_bytes", self.st_allocated_bytes)
        _put_stat(out, "reserved_bytes", self.st_reserved_bytes)
        _put_stat(out, "active_bytes", self.st_active_bytes)
        _put_stat(out, "requested_bytes", self.st_requested_bytes)
        for i in range(3):
            out[f"inactive_split.{_POOL_NAMES[i]}.current"] = split_n[i]
            out[f"inactive_split_bytes.{_POOL_NAMES[i]}.current"] = split_b[i]
        out["num_alloc_retries"] = self.n_alloc_retries
        out["num_ooms"] = self.n_ooms
        out["num_device_alloc"] = self.n_device_alloc
        out["num_device_free"] = self.n_device_free
        out["num_pools"] = len(self.pools)
        out["pending_events"] = self.pending.size() + self.stream_holds.size()
        held = 0
        for pool in self.pools.values():
            p = <Pool>pool
            held += p.held_blocks
            pre = f"pool.{p.id}."
            out[pre + "held_blocks"] = p.held_blocks
            out[pre + "segments"] = p.segments
            out[pre + "reserved_bytes"] = p.reserved_bytes
            out[pre + "allocated_bytes"] = p.allocated_bytes
            out[pre + "live_blocks"] = p.live_blocks
            out[pre + "graph_refs"] = p.graph_refs
            if p.sleepable:
                out[pre + "asleep"] = int(p.asleep)
        # freed blocks not yet reusable (record_stream events, capture rules):
        # active = allocated - freed + held
        out["held_blocks"] = held
        return out

    def reset_peak_stats(self):
        cdef int i
        for i in range(3):
            self.st_allocation[i].peak = self.st_allocation[i].current
            self.st_segment[i].peak = self.st_segment[i].current
            self.st_active[i].peak = self.st_active[i].current
            self.st_allocated_bytes[i].peak = self.st_allocated_bytes[i].current
            self.st_reserved_bytes[i].peak = self.st_reserved_bytes[i].current
            self.st_active_bytes[i].peak = self.st_active_bytes[i].current
            self.st_requested_bytes[i].peak = self.st_requested_bytes[i].current

    def snapshot(self):
        """Every segment as a dict (address, size, pool id, stream, kind and
        its blocks: address, size, state 'allocated' / 'free' / 'held')."""
        out = []
        for pool in self.pools.values():
            out.extend((<Pool>pool).snapshot(self.device))
        return out

    def check_invariants(self):
        """Raise AssertionError unless the block structures are consistent:
        blocks tile their segments, free blocks are merged with free neighbours
        and sit in the free map (held and allocated ones do not), and the
        counters add up."""
        cdef size_t reserved = 0, allocated = 0
        problems = []
        for pool in self.pools.values():
            (<Pool>pool).check(problems, &reserved, &allocated)
        if reserved != <size_t>self.st_reserved_bytes[ALL].current:
            problems.append(f"reserved_bytes {self.st_reserved_bytes[ALL].current} != segments {reserved}")
        if allocated != <size_t>self.st_allocated_bytes[ALL].current:
            problems.append(f"allocated_bytes {self.st_allocated_bytes[ALL].current} != blocks {allocated}")
        if problems:
            raise AssertionError("; ".join(problems[:10]))

    @property
    def reserved(self):
        return self.st_reserved_bytes[ALL].current

    @property
    def allocated(self):
        return self.st_allocated_bytes[ALL].current


_POOL_NAMES = ("all", "small_pool", "large_pool")


cdef int _put_stat(dict out, str name, Stat* s) except -1:
    cdef int i
    for i in range(3):
        pre = f"{name}.{_POOL_NAMES[i]}."
        out[pre + "current"] = s[i].current
        out[pre + "peak"] = s[i].peak
        out[pre + "allocated"] = s[i].allocated
        out[pre + "freed"] = s[i].freed
    return 0


cdef list _allocators = [None] * MAX_DEVICES


cdef DeviceAllocator get_allocator(int device):
    """The allocator of ``device``, made on first use (a device's allocator
    lives for the process)."""
    a = _allocators[device]
    if a is None:
        validate_device(device)
        a = DeviceAllocator(device)
        _allocators[device] = a
    return <DeviceAllocator>a


cdef list device_allocators():
    """The allocators made so far, one per device used."""
    return [a for a in _allocators if a is not None]


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


cdef DeviceAllocation _allocate_from(DeviceAllocator a, size_t nbytes, uintptr_t stream):
    cdef DeviceAllocation out = DeviceAllocation.__new__(DeviceAllocation)
    cdef uintptr_t key = stream
    cdef Pool pool
    out.device = a.device
    out.size = nbytes
    out.stream = stream
    out.allocator = a
    if nbytes == 0:
        return out
    pool = a.route(stream, &key)
    out.block = a.malloc_block(nbytes, key, pool)
    out.pool = pool
    out.stream = key
    out.ptr = <uintptr_t>out.block.ptr
    return out


def allocate(size_t nbytes, int device, uintptr_t stream):
    """Allocate ``nbytes`` on ``device`` for use on ``stream`` (the tensors'
    and generators' memory)."""
    return _allocate_from(get_allocator(device), nbytes, stream)

