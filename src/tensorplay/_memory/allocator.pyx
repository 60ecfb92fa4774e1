# SPDX-License-Identifier: Apache-2.0
"""Caching device allocator: PyTorch's block policy (size classes, segments,
splitting, best fit by stream and size, merging), stream-ordered reuse with
record_stream events, and private pools for graph capture.

The policy is written once, over a ``Backend`` that hands out segments and
events: ``DriverBackend`` (cuMemAlloc, cuEventRecord, ...) on a GPU, or
``FakeBackend`` (address ranges and events a test completes) anywhere, so the
policy is tested on machines without a GPU.

Capture rules (see DESIGN.md): allocations on a capture's streams come from
its pool; a block freed during the capture goes back to the pool at once,
except a block the capture used on another stream (reusable after the
capture ends) and a block allocated before an open conditional body and freed
inside it (reusable after that body ends: a WHILE body runs again). No event
is queried or recorded while any capture is open: blocks freed with
record_stream then wait until no capture is open.
"""

cimport cython
from cpython.mem cimport PyMem_Malloc, PyMem_Free
from cuda.bindings cimport cydriver
from libc.stdint cimport uintptr_t, SIZE_MAX
from libcpp.map cimport map as cmap
from libcpp.pair cimport pair
from libcpp.vector cimport vector
from cython.operator cimport dereference as deref, preincrement as preinc

from tensorplay._driver.context cimport check, ensure_context, validate_device, MAX_DEVICES
from tensorplay._driver.stream cimport current_stream_handle
from tensorplay._driver.context import OutOfMemoryError, make_error, device_index as _device_index
from tensorplay._memory.units import format_bytes

import itertools
import threading

# PyTorch's constants (c10/cuda/CUDACachingAllocator.cpp)
cdef size_t ROUND = 512                     # every size is a multiple of this
cdef size_t SMALL_SIZE = 1 << 20            # requests up to 1 MiB share small segments
cdef size_t SMALL_SEGMENT = 2 << 20
cdef size_t MIN_LARGE_ALLOC = 10 << 20      # requests under this share 20 MiB segments
cdef size_t LARGE_SEGMENT = 20 << 20
cdef size_t LARGE_ROUND = 2 << 20           # larger requests get a segment rounded to this

# indices of the Stat arrays
cdef enum:
    ALL = 0
    SMALL = 1
    LARGE = 2

# Captures open in the process (all devices): while any is, no event is
# queried or recorded and no memory is freed (either would break a
# global-mode capture).
cdef int g_open_captures = 0
cdef object _capture_serials = itertools.count(1)
cdef object _tls = threading.local()         # .captures: this thread's open captures, innermost last


cdef int open_capture_count() noexcept nogil:
    return g_open_captures


cdef inline size_t round_size(size_t n) noexcept nogil:
    if n < ROUND:
        return ROUND
    return (n + ROUND - 1) // ROUND * ROUND


cdef inline size_t segment_size(size_t rsize) noexcept nogil:
    if rsize <= SMALL_SIZE:
        return SMALL_SEGMENT
    if rsize < MIN_LARGE_ALLOC:
        return LARGE_SEGMENT
    return (rsize + LARGE_ROUND - 1) // LARGE_ROUND * LARGE_ROUND


def segment_bytes(size_t nbytes):
    """The size of the segment a request of ``nbytes`` gets when no cached
    block holds it (PyTorch's rule: 2 MiB up to 1 MiB, 20 MiB under 10 MiB,
    else the request rounded up to 2 MiB)."""
    return segment_size(round_size(nbytes))


cdef inline FreeKey free_key(Block* b) noexcept nogil:
    return FreeKey(b.stream, pair[size_t, uintptr_t](b.size, <uintptr_t>b.ptr))


cdef inline bint _mergeable(Block* n) noexcept:
    return n != NULL and not n.allocated and n.holds == 0


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


cdef inline int kind_of(Block* b) noexcept:
    return SMALL if b.small else LARGE


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
    """Return a new memory pool id, for graphs that share one pool.

    Pass it as ``pool=`` to :meth:`CUDAGraph.capture_begin` or
    :class:`graph`; graphs sharing a pool must replay in capture order.
    """
    return next(_pool_ids)


# ------------------------------------------------------------------ backends

@cython.auto_pickle(False)
cdef class Backend:
    """Segments and events for one device's allocator (abstract)."""

    cdef cydriver.CUresult malloc(self, cydriver.CUdeviceptr* ptr, size_t n) except? cydriver.CUDA_ERROR_UNKNOWN:
        raise NotImplementedError

    cdef int free(self, cydriver.CUdeviceptr ptr) except -1:
        raise NotImplementedError

    cdef uintptr_t create_event(self) except? 0:
        raise NotImplementedError

    cdef int record_event(self, uintptr_t event, uintptr_t stream) except -1:
        raise NotImplementedError

    cdef bint event_done(self, uintptr_t event, bint wait) noexcept:
        return True

    cdef void destroy_event(self, uintptr_t event) noexcept:
        pass

    cdef int synchronize(self) except -1:
        raise NotImplementedError

    cdef unsigned long long capture_id(self, uintptr_t stream) except? 0:
        return 0

    cdef tuple mem_info(self):
        return (0, 0)


@cython.final
cdef class DriverBackend(Backend):
    """The CUDA driver: cuMemAlloc/cuMemFree segments, cuEvent* events."""

    def __cinit__(self, int device):
        self.device = device

    cdef cydriver.CUresult malloc(self, cydriver.CUdeviceptr* ptr, size_t n) except? cydriver.CUDA_ERROR_UNKNOWN:
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

    cdef int free(self, cydriver.CUdeviceptr ptr) except -1:
        with nogil:
            ensure_context(self.device)
            check(cydriver.cuMemFree(ptr))
        return 0

    cdef uintptr_t create_event(self) except? 0:
        cdef cydriver.CUevent ev = NULL
        with nogil:
            ensure_context(self.device)
            check(cydriver.cuEventCreate(&ev, cydriver.CU_EVENT_DISABLE_TIMING))
        return <uintptr_t>ev

    cdef int record_event(self, uintptr_t event, uintptr_t stream) except -1:
        with nogil:
            ensure_context(self.device)
            check(cydriver.cuEventRecord(<cydriver.CUevent>event, <cydriver.CUstream>stream))
        return 0

    cdef bint event_done(self, uintptr_t event, bint wait) noexcept:
        # an error (a dead context) counts as done: nothing runs there any more
        cdef cydriver.CUresult r
        if wait:
            with nogil:
                r = cydriver.cuEventSynchronize(<cydriver.CUevent>event)
        else:
            r = cydriver.cuEventQuery(<cydriver.CUevent>event)
        return r != cydriver.CUDA_ERROR_NOT_READY

    cdef void destroy_event(self, uintptr_t event) noexcept:
        cydriver.cuEventDestroy(<cydriver.CUevent>event)

    cdef int synchronize(self) except -1:
        with nogil:
            ensure_context(self.device)
            check(cydriver.cuCtxSynchronize())
        return 0

    cdef unsigned long long capture_id(self, uintptr_t stream) except? 0:
        cdef cydriver.CUstreamCaptureStatus status
        cdef cydriver.cuuint64_t cid = 0
        with nogil:
            ensure_context(self.device)
            check(cydriver.cuStreamGetCaptureInfo(<cydriver.CUstream>stream, &status, &cid,
                                                  NULL, NULL, NULL, NULL))
        return cid if status == cydriver.CU_STREAM_CAPTURE_STATUS_ACTIVE else 0

    cdef tuple mem_info(self):
        cdef size_t f = 0, t = 0
        try:
            ensure_context(self.device)
            if cydriver.cuMemGetInfo(&f, &t) != cydriver.CUDA_SUCCESS:
                return (0, 0)
        except Exception:
            return (0, 0)
        return (f, t)


@cython.final
cdef class FakeBackend(Backend):
    """Address ranges and events without a GPU, for testing the block policy.

    Segments come from a counter (never reused) up to ``capacity`` bytes.
    An event is done once the test calls ``complete(stream)`` or
    ``complete_all()``, or the allocator waits for it. ``set_capturing``
    makes a stream report a capture id. Every event query, record and free
    made while a capture is open is counted, so tests can assert there are none.
    """
    cdef readonly size_t capacity, used
    cdef uintptr_t next_addr
    cdef long long next_event
    cdef readonly dict segments          # address -> size
    cdef readonly dict events            # event -> [stream, recorded, done]
    cdef dict capturing                  # stream -> capture id
    cdef readonly long long calls_during_capture
    cdef readonly long long mallocs, frees
    cdef public object on_record         # called once inside the next record_event (races)

    def __cinit__(self, size_t capacity=(80 << 30), int device=0):
        self.device = device
        self.capacity = capacity
        self.used = 0
        self.next_addr = 1 << 32
        self.next_event = 1
        self.segments = {}
        self.events = {}
        self.capturing = {}
        self.calls_during_capture = 0
        self.mallocs = 0
        self.frees = 0

    cdef void _note_call(self) noexcept:
        if g_open_captures > 0 or self.capturing:
            self.calls_during_capture += 1

    cdef cydriver.CUresult malloc(self, cydriver.CUdeviceptr* ptr, size_t n) except? cydriver.CUDA_ERROR_UNKNOWN:
        if self.used + n > self.capacity:
            return cydriver.CUDA_ERROR_OUT_OF_MEMORY
        ptr[0] = self.next_addr
        self.segments[self.next_addr] = n
        self.next_addr += (n + (2 << 20) - 1) // (2 << 20) * (2 << 20) + (2 << 20)    # gaps catch overruns
        self.used += n
        self.mallocs += 1
        return cydriver.CUDA_SUCCESS

    cdef int free(self, cydriver.CUdeviceptr ptr) except -1:
        self._note_call()
        n = self.segments.pop(ptr, None)
        if n is None:
            raise AssertionError(f"free of {ptr:#x}, which is not a live segment")
        self.used -= n
        self.frees += 1
        return 0

    cdef uintptr_t create_event(self) except? 0:
        ev = self.next_event
        self.next_event += 1
        self.events[ev] = [0, False, True]
        return ev

    cdef int record_event(self, uintptr_t event, uintptr_t stream) except -1:
        self._note_call()
        self.events[event] = [stream, True, False]
        if self.on_record is not None:
            hook, self.on_record = self.on_record, None
            hook()             # what another thread may do while the real call runs without the GIL
        return 0

    cdef bint event_done(self, uintptr_t event, bint wait) noexcept:
        self._note_call()
        e = self.events.get(event)
        if e is None:
            return True
        if wait:
            e[2] = True
        return e[2]

    cdef void destroy_event(self, uintptr_t event) noexcept:
        self.events.pop(event, None)

    cdef int synchronize(self) except -1:
        self.complete_all()
        return 0

    cdef unsigned long long capture_id(self, uintptr_t stream) except? 0:
        return self.capturing.get(stream, 0)

    cdef tuple mem_info(self):
        return (self.capacity - self.used, self.capacity)

    def set_capturing(self, uintptr_t stream, unsigned long long capture_id):
        """Make ``stream`` report ``capture_id`` (0: not capturing)."""
        if capture_id:
            self.capturing[stream] = capture_id
        else:
            self.capturing.pop(stream, None)

    def complete(self, uintptr_t stream):
        """Finish the work recorded on ``stream`` so far."""
        for e in self.events.values():
            if e[0] == stream and e[1]:
                e[2] = True

    def complete_all(self):
        for e in self.events.values():
            e[2] = True

    def recorded_events(self):
        """Events recorded and not yet done."""
        return sum(1 for e in self.events.values() if e[1] and not e[2])


# ------------------------------------------------------------------ pools and captures

cdef class Pool:
    """A set of segments and free blocks; id 0 is a device's default pool."""

    def __cinit__(self, long long id, int device):
        self.id = id
        self.device = device
        self.graph_refs = 0
        self.live_blocks = 0
        self.held_blocks = 0
        self.segments = 0
        self.reserved_bytes = 0
        self.allocated_bytes = 0
        self.capture = None

    cdef cmap[FreeKey, Block*]* free_map(self, bint small) noexcept:
        return &self.small_free if small else &self.large_free

    def __repr__(self):
        return (f"<Pool id={self.id} device={self.device} graph_refs={self.graph_refs} "
                f"live_blocks={self.live_blocks} segments={self.segments} reserved={self.reserved_bytes}>")


@cython.final
cdef class BodyFrame:
    """An open conditional body of a capture: its stream and capture id, and
    the blocks freed inside it that must wait until it ends."""

    def __repr__(self):
        return f"<BodyFrame stream={self.stream:#x} capture_id={self.capture_id}>"


@cython.final
cdef class CaptureState:
    """One capture allocating into a pool: its routes, open bodies, deferred
    blocks and the storages from outside the pool that its work uses."""

    cdef uintptr_t key_stream(self, uintptr_t stream) noexcept:
        """The stream blocks are keyed by: a body's stream counts as the
        capture's root stream (its work is ordered with the root's)."""
        if self.aliases:
            return self.aliases.get(stream, stream)
        return stream

    @property
    def kept(self):
        return len(self.keepalive)

    @property
    def depth(self):
        return len(self.bodies)

    def __repr__(self):
        return (f"<CaptureState pool={self.pool.id} capture_id={self.capture_id} "
                f"stream={self.stream:#x} bodies={len(self.bodies)} ended={self.ended}>")


cdef list _thread_captures():
    stack = getattr(_tls, "captures", None)
    if stack is None:
        stack = []
        _tls.captures = stack
    return stack


cdef int note_capture_use(object storage) except -1:
    """Called wherever a device pointer leaves a tensor while a capture is open:
    the innermost capture of this thread keeps ``storage`` alive if it comes
    from outside its pool, and marks a pool block used on another stream."""
    cdef CaptureState st
    cdef DeviceAllocation da
    cdef list stack = getattr(_tls, "captures", None)
    if not stack:
        return 0
    st = <CaptureState>stack[len(stack) - 1]
    while st.ended:                       # ended from another thread (the collector)
        stack.pop()
        if not stack:
            return 0
        st = <CaptureState>stack[len(stack) - 1]
    if type(storage) is DeviceAllocation:
        da = <DeviceAllocation>storage
        if da.pool is st.pool:
            if da.block != NULL and \
                    st.key_stream(<uintptr_t>current_stream_handle(da.device)) != da.block.stream:
                da.block.cross_capture = st.serial
            return 0
    st.keepalive[id(storage)] = storage
    return 0


def _note_capture_use(storage):
    """Python access to note_capture_use (tests, the fake allocator)."""
    if g_open_captures:
        note_capture_use(storage)


# ------------------------------------------------------------------ the allocator

cdef class DeviceAllocator:
    """The caching allocator of one device, over ``backend`` (default: the driver)."""

    def __cinit__(self, int device, Backend backend=None):
        self.device = device
        self.backend = backend if backend is not None else DriverBackend(device)
        self.default_pool = Pool(0, device)
        self.pools = {0: self.default_pool}
        self.captures = {}
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
            p = Pool(pool_id, self.device)
            self.pools[pool_id] = p
        return p

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
        if p.graph_refs == 0:
            for h in replay_streams:
                if g_open_captures > 0 or self._stream_capturing(h):
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

    cdef void maybe_release(self, Pool pool) noexcept:
        """Give an unused private pool's segments back and forget the pool."""
        if pool.id == 0 or pool.graph_refs > 0 or pool.live_blocks > 0 or pool.held_blocks > 0 \
                or pool.capture is not None:
            return
        if g_open_captures > 0:
            self.freeable.add(pool.id)
            return
        self.freeable.discard(pool.id)
        try:
            self.free_segments(pool)
        except BaseException:
            return            # a driver error: the segments stay accounted for
        if pool.segments == 0 and self.pools.get(pool.id) is pool:
            del self.pools[pool.id]

    cdef int release_freeable(self) except -1:
        cdef Pool p
        for pid in list(self.freeable):
            self.freeable.discard(pid)
            p = self.pools.get(pid)
            if p is not None:
                self.maybe_release(p)
        return 0

    # -------------------------------------------------------------- captures

    def begin_capture(self, long long pool_id, unsigned long long capture_id, uintptr_t stream,
                      bint track=True):
        """Route allocations made on streams of capture ``capture_id`` to pool
        ``pool_id`` and return the capture's state. ``track``: this thread's
        pointer uses register with it (note_capture_use)."""
        global g_open_captures
        cdef Pool pool = self.get_pool(pool_id)
        cdef CaptureState st
        if pool.capture is not None:
            other = pool.capture
            raise RuntimeError(
                f"capture_begin: memory pool {pool_id} is already being captured into (capture "
                f"{other.capture_id} on stream {other.stream:#x}, thread {other.thread}); a pool takes "
                f"one capture at a time: end that capture first, or capture into another pool")
        st = CaptureState.__new__(CaptureState)
        st.pool = pool
        st.capture_id = capture_id
        st.stream = stream
        st.serial = next(_capture_serials)
        st.bodies = []
        st.aliases = {}
        st.keepalive = {}
        st.scratch = {}
        st.thread = threading.get_ident()
        st.ended = False
        pool.capture = st
        self.captures[capture_id] = st
        g_open_captures += 1
        if track:
            _thread_captures().append(st)
        return st

    def begin_body(self, CaptureState st not None, uintptr_t stream, unsigned long long capture_id):
        """A conditional body of ``st`` starts capturing on ``stream``."""
        cdef BodyFrame f = BodyFrame.__new__(BodyFrame)
        f.stream = stream
        f.capture_id = capture_id
        f.open_seq = self.alloc_seq
        st.bodies.append(f)
        st.aliases[stream] = st.stream
        self.captures[capture_id] = st

    def end_body(self, CaptureState st not None):
        """The innermost body of ``st`` ended: its deferred blocks become reusable."""
        if not st.bodies:
            return
        cdef BodyFrame f = <BodyFrame>st.bodies.pop()
        self._close_body(st, f)

    cdef void _close_body(self, CaptureState st, BodyFrame f) noexcept:
        cdef Block* b
        cdef vector[Block*] deferred
        self.captures.pop(f.capture_id, None)
        st.aliases.pop(f.stream, None)
        deferred.swap(f.deferred)
        for b in deferred:
            self.release_hold(b)

    def end_capture(self, CaptureState st not None):
        """End ``st`` (also with bodies still open: an aborted capture): stop
        routing, make its deferred blocks reusable, and return the storages
        from outside its pool that it used."""
        global g_open_captures
        cdef Block* b
        if st.ended:
            return {}
        while st.bodies:
            self._close_body(st, <BodyFrame>st.bodies.pop())
        self.captures.pop(st.capture_id, None)
        st.ended = True
        st.pool.capture = None
        g_open_captures -= 1
        # freed after the end: back to the pool, for later captures sharing it
        st.scratch = {}
        cdef vector[Block*] deferred
        deferred.swap(st.deferred)
        for b in deferred:
            self.release_hold(b)
        stack = getattr(_tls, "captures", None)
        if stack:
            for k in range(len(stack) - 1, -1, -1):
                if stack[k] is st:
                    del stack[k]
                    break
        if g_open_captures == 0:
            for a in [self] + [x for x in _allocators if x is not None and x is not self]:
                (<DeviceAllocator>a).record_stream_frees()
                (<DeviceAllocator>a).release_freeable()
        self.maybe_release(st.pool)
        keep = st.keepalive
        st.keepalive = {}
        return keep

    @property
    def open_captures(self):
        return len({id(s) for s in self.captures.values()})

    def capture_scratch(self, uintptr_t stream, key, size_t nbytes):
        """Memory of ``nbytes`` that the capture ``stream`` captures into keeps
        under ``key`` until it ends (a body's stream shares its root's), from
        the capture's pool; None when ``stream`` captures into none of ours."""
        cdef CaptureState st
        if not self.captures:
            return None
        obj = self.captures.get(self.backend.capture_id(stream))
        if obj is None:
            return None
        st = <CaptureState>obj
        k = (key, st.key_stream(stream), nbytes)
        mem = st.scratch.get(k)
        if mem is None:
            mem = st.scratch[k] = _allocate_from(self, nbytes, stream)
        return mem

    cdef Pool route(self, uintptr_t stream, uintptr_t* key):
        """The pool an allocation on ``stream`` comes from (a capture's pool
        when ``stream`` captures into it), and the stream its block is keyed by."""
        cdef CaptureState st
        cdef unsigned long long cid
        key[0] = stream
        if not self.captures:
            return self.default_pool
        cid = self.backend.capture_id(stream)
        if cid:
            obj = self.captures.get(cid)
            if obj is not None:
                st = <CaptureState>obj
                key[0] = st.key_stream(stream)
                return st.pool
        return self.default_pool

    # -------------------------------------------------------------- events

    cdef int process_events(self, bint wait) except -1:
        """Make blocks whose record_stream events completed reusable (never
        while a capture is open: a query would break it)."""
        cdef vector[PendingEvent] todo
        cdef vector[PendingEvent] still
        cdef PendingEvent e
        if self.pending.empty() or g_open_captures > 0:
            return 0
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
        cdef vector[StreamHold] todo
        cdef StreamHold h
        cdef uintptr_t ev
        if self.stream_holds.empty() or g_open_captures > 0:
            return
        todo.swap(self.stream_holds)
        for h in todo:
            if g_open_captures > 0 or self._stream_capturing(h.stream):
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
        cdef bint small = rsize <= SMALL_SIZE
        cdef Block* b
        if g_open_captures == 0:
            if not self.pending.empty():
                self.process_events(False)
            if not self.stream_holds.empty():
                self.record_stream_frees()
            if self.freeable:
                self.release_freeable()
        b = self.find_free(rsize, stream, pool, small)
        if b == NULL:
            b = self.new_segment(rsize, stream, pool, small)
        self.split(b, rsize, pool)
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

    cdef Block* find_free(self, size_t rsize, uintptr_t stream, Pool pool, bint small) noexcept:
        """The smallest free block of ``pool`` on ``stream`` holding ``rsize``
        (PyTorch's best fit; with no max_split_size, any such block)."""
        cdef cmap[FreeKey, Block*]* m = pool.free_map(small)
        cdef FreeKey key = FreeKey(stream, pair[size_t, uintptr_t](rsize, 0))
        cdef cmap[FreeKey, Block*].iterator it = m.lower_bound(key)
        if it == m.end() or deref(it).first.first != stream:
            return NULL
        cdef Block* b = deref(it).second
        m.erase(it)
        return b

    cdef Block* new_segment(self, size_t rsize, uintptr_t stream, Pool pool, bint small) except NULL:
        cdef size_t seg = segment_size(rsize)
        cdef cydriver.CUdeviceptr ptr = 0
        cdef cydriver.CUresult r = self.backend.malloc(&ptr, seg)
        if r == cydriver.CUDA_ERROR_OUT_OF_MEMORY and g_open_captures == 0:
            # free what the cache holds and try once more (never under a
            # capture: cuMemFree would break it)
            self.n_alloc_retries += 1
            self.release_cached()
            r = self.backend.malloc(&ptr, seg)
        if r == cydriver.CUDA_ERROR_OUT_OF_MEMORY:
            self.n_ooms += 1
            free_b, total_b = self.backend.mem_info()
            why = ("; inside a CUDA graph capture the cache cannot be released (cuMemFree would end "
                   "the capture): call empty_cache() before capturing" if g_open_captures > 0 else "")
            raise OutOfMemoryError(
                description=(f"tried to allocate {format_bytes(rsize)} on cuda:{self.device} "
                             f"({format_bytes(free_b)} free of {format_bytes(total_b)}; "
                             f"{format_bytes(self.st_allocated_bytes[ALL].current)} allocated and "
                             f"{format_bytes(self.st_reserved_bytes[ALL].current)} reserved by tensorplay){why}"))
        check(r)
        cdef Block* b = <Block*>PyMem_Malloc(sizeof(Block))
        if b == NULL:
            self.backend.free(ptr)
            raise MemoryError()
        b.ptr = ptr
        b.size = seg
        b.requested = 0
        b.stream = stream
        b.prev = NULL
        b.next = NULL
        b.pool = <void*>pool
        b.allocated = False
        b.small = small
        b.holds = 0
        b.alloc_seq = 0
        b.cross_capture = 0
        pool.segment_heads[<uintptr_t>ptr] = b
        pool.segments += 1
        pool.reserved_bytes += seg
        stat_add(self.st_segment, kind_of(b), 1)
        stat_add(self.st_reserved_bytes, kind_of(b), seg)
        self.n_device_alloc += 1
        return b

    cdef void split(self, Block* b, size_t rsize, Pool pool) noexcept:
        """Cut ``rsize`` off ``b`` when the rest is worth keeping (PyTorch's
        should_split: 512 B in small segments, over 1 MiB in large ones)."""
        cdef size_t rest = b.size - rsize
        cdef Block* r
        if b.small:
            if rest < ROUND:
                return
        elif rest <= SMALL_SIZE:
            return
        r = <Block*>PyMem_Malloc(sizeof(Block))
        if r == NULL:
            return      # keep the block whole; correct, just less tight
        r.ptr = b.ptr + rsize
        r.size = rest
        r.requested = 0
        r.stream = b.stream
        r.prev = b
        r.next = b.next
        r.pool = b.pool
        r.allocated = False
        r.small = b.small
        r.holds = 0
        r.alloc_seq = 0
        r.cross_capture = 0
        if b.next != NULL:
            b.next.prev = r
        b.next = r
        b.size = rsize
        pool.free_map(r.small).insert(FreeEntry(free_key(r), r))

    cdef void _hold(self, Block* b, Pool pool) noexcept:
        if b.holds == 0:
            pool.held_blocks += 1
        b.holds += 1

    cdef void free_block(self, Block* b, Pool pool, object recorded) noexcept:
        """A live block was freed: reusable now, after events, or after its
        capture or body ends (see the module docstring)."""
        cdef CaptureState st
        cdef BodyFrame f
        cdef uintptr_t ev
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
            for h in recorded:
                if g_open_captures > 0 or self._stream_capturing(<uintptr_t>h):
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
        st = pool.capture
        if st is not None:
            if b.cross_capture == st.serial:
                self._hold(b, pool)
                st.deferred.push_back(b)
                return
            for obj in st.bodies:               # outermost first
                f = <BodyFrame>obj
                if b.alloc_seq <= f.open_seq:
                    self._hold(b, pool)
                    f.deferred.push_back(b)
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
        self.insert_free(b, pool)
        if pool.live_blocks == 0 and pool.held_blocks == 0 and pool.id != 0:
            self.maybe_release(pool)

    cdef void insert_free(self, Block* b, Pool pool) noexcept:
        """Put a free block back, merged with free neighbours of its segment."""
        cdef cmap[FreeKey, Block*]* m = pool.free_map(b.small)
        if _mergeable(b.prev):
            b = _absorb_next(b.prev, m)
        if _mergeable(b.next):
            _absorb_next(b, m)
        # Memory stays cached until empty_cache, as in PyTorch.
        m.insert(FreeEntry(free_key(b), b))

    # -------------------------------------------------------------- releasing memory

    cdef int release_cached(self) except -1:
        """cuMemFree every fully free segment of the default pool and of private
        pools no graph holds. Pools held by a graph keep their memory."""
        cdef Pool p
        if g_open_captures > 0:
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
        leave the pool's maps and counters first, so no other thread can take
        them while the GIL is released around the driver call."""
        cdef vector[Block*] whole
        cdef Block* b
        cdef uintptr_t ev
        cdef cmap[uintptr_t, Block*].iterator it = pool.segment_heads.begin()
        while it != pool.segment_heads.end():
            b = deref(it).second
            if b.prev == NULL and b.next == NULL and not b.allocated and b.holds == 0:
                pool.free_map(b.small).erase(free_key(b))
                whole.push_back(b)
                it = pool.segment_heads.erase(it)
                pool.segments -= 1
                pool.reserved_bytes -= b.size
                stat_add(self.st_segment, kind_of(b), -1)
                stat_add(self.st_reserved_bytes, kind_of(b), -<long long>b.size)
            else:
                preinc(it)
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
                self.backend.free(b.ptr)
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
        cdef Block* b
        cdef long long split_n[3]
        cdef long long split_b[3]
        cdef int i, kind
        split_n[0] = split_n[1] = split_n[2] = 0
        split_b[0] = split_b[1] = split_b[2] = 0
        cdef cmap[FreeKey, Block*]* m
        cdef cmap[FreeKey, Block*].iterator it
        for pool in self.pools.values():
            p = <Pool>pool
            for kind in (SMALL, LARGE):
                m = p.free_map(kind == SMALL)
                it = m.begin()
                while it != m.end():
                    b = deref(it).second
                    if b.prev != NULL or b.next != NULL:      # free piece of a split segment
                        split_n[ALL] += 1
                        split_n[kind] += 1
                        split_b[ALL] += b.size
                        split_b[kind] += b.size
                    preinc(it)
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
        cdef Pool p
        cdef Block* b
        out = []
        for pool in self.pools.values():
            p = <Pool>pool
            for entry in p.segment_heads:
                b = entry.second
                blocks = []
                total = 0
                while b != NULL:
                    blocks.append({"address": <uintptr_t>b.ptr, "size": b.size,
                                   "state": "allocated" if b.allocated else ("held" if b.holds else "free"),
                                   "requested_size": b.requested if b.allocated else 0})
                    total += b.size
                    b = b.next
                out.append({"device": self.device, "address": entry.first, "total_size": total,
                            "segment_pool_id": p.id, "stream": entry.second.stream,
                            "segment_type": "small" if entry.second.small else "large",
                            "blocks": blocks})
        return out

    def check_invariants(self):
        """Raise AssertionError unless the block structures are consistent:
        blocks tile their segments, free blocks are merged with free neighbours
        and sit in the free map (held and allocated ones do not), and the
        counters add up."""
        cdef Pool p
        cdef Block* b
        cdef size_t reserved = 0, allocated = 0, pool_reserved, pool_alloc
        cdef long long live, held, nfree
        problems = []
        for pool in self.pools.values():
            p = <Pool>pool
            pool_reserved = pool_alloc = 0
            live = held = nfree = 0
            for entry in p.segment_heads:
                b = entry.second
                if b.prev != NULL or <uintptr_t>b.ptr != entry.first:
                    problems.append(f"pool {p.id}: segment {entry.first:#x} head is not its first block")
                while b != NULL:
                    if b.pool != <void*>p:
                        problems.append(f"pool {p.id}: block {<uintptr_t>b.ptr:#x} names another pool")
                    if b.stream != entry.second.stream or b.small != entry.second.small:
                        problems.append(f"pool {p.id}: block {<uintptr_t>b.ptr:#x} differs from its segment")
                    if b.next != NULL and (b.next.prev != b or b.next.ptr != b.ptr + b.size):
                        problems.append(f"pool {p.id}: block {<uintptr_t>b.ptr:#x} and its next do not tile")
                    in_map = p.free_map(b.small).count(free_key(b)) == 1
                    if b.allocated:
                        live += 1
                        pool_alloc += b.size
                        if in_map or b.holds:
                            problems.append(f"pool {p.id}: allocated block {<uintptr_t>b.ptr:#x} is free-listed or held")
                    elif b.holds:
                        held += 1
                        if in_map:
                            problems.append(f"pool {p.id}: held block {<uintptr_t>b.ptr:#x} is in the free map")
                    else:
                        nfree += 1
                        if not in_map:
                            problems.append(f"pool {p.id}: free block {<uintptr_t>b.ptr:#x} is not in the free map")
                        if _mergeable(b.next):
                            problems.append(f"pool {p.id}: free blocks {<uintptr_t>b.ptr:#x} and next not merged")
                    pool_reserved += b.size
                    b = b.next
            if <size_t>p.small_free.size() + <size_t>p.large_free.size() != <size_t>nfree:
                problems.append(f"pool {p.id}: {p.small_free.size() + p.large_free.size()} free-map "
                                f"entries for {nfree} free blocks")
            if pool_reserved != p.reserved_bytes or <long long>p.segment_heads.size() != p.segments:
                problems.append(f"pool {p.id}: reserved {p.reserved_bytes} / {p.segments} segments, "
                                f"blocks add up to {pool_reserved} / {p.segment_heads.size()}")
            if live != p.live_blocks or held != p.held_blocks or pool_alloc != p.allocated_bytes:
                problems.append(f"pool {p.id}: counters live={p.live_blocks} held={p.held_blocks} "
                                f"allocated={p.allocated_bytes}, blocks say {live}/{held}/{pool_alloc}")
            reserved += pool_reserved
            allocated += pool_alloc
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


cdef DeviceAllocation allocate(size_t nbytes, int device, cydriver.CUstream stream):
    """Allocate ``nbytes`` on ``device`` for use on ``stream``."""
    return _allocate_from(get_allocator(device), nbytes, <uintptr_t>stream)


def _allocate(size_t nbytes, int device, uintptr_t stream):
    """Python access to allocate() for the pure-Python layers and tests."""
    return _allocate_from(get_allocator(device), nbytes, stream)


def empty_cache(device=None):
    """Release every cached, unused segment back to the device (cuMemFree).

    Memory of a private pool still held by a graph, and memory under live
    tensors, is kept. Not allowed while a graph capture is under way.

    Parameters
    ----------
    device : device, str, int or None, optional
        The device; default every device the allocator has used.
    """
    if g_open_captures > 0:
        raise RuntimeError("empty_cache() cannot run while a CUDA graph capture is under way")
    if device is None:
        for each in _allocators:
            if each is not None:
                (<DeviceAllocator>each).release_cached()
        return
    get_allocator(_device_index(device)).release_cached()


def memory_stats(device=None):
    """Return the caching allocator's counters for ``device`` as a dict.

    The keys are PyTorch's (``allocated_bytes.all.current``,
    ``segment.large_pool.peak``, ``num_alloc_retries``, ...), plus
    ``pool.<id>.reserved_bytes`` and the like per graph pool.

    Parameters
    ----------
    device : device, str, int or None, optional
        Default the current device.
    """
    return get_allocator(_device_index(device)).stats()


def memory_snapshot(device=None):
    """Return every segment of ``device``'s allocator with its blocks, as ``torch.cuda.memory_snapshot``.

    Each segment is a dict (its address, ``total_size``, ``segment_pool_id``
    and its ``blocks``, each with ``size`` and ``state``).

    Parameters
    ----------
    device : device, str, int or None, optional
        Default the current device.
    """
    return get_allocator(_device_index(device)).snapshot()


def memory_allocated(device=None):
    """Return the bytes held by live tensors on ``device`` (rounded to the allocator's granularity).

    Parameters
    ----------
    device : device, str, int or None, optional
        Default the current device.
    """
    return get_allocator(_device_index(device)).allocated


def max_memory_allocated(device=None):
    """Return the peak of :func:`memory_allocated` since the start or :func:`reset_peak_memory_stats`.

    Parameters
    ----------
    device : device, str, int or None, optional
        Default the current device.
    """
    return get_allocator(_device_index(device)).st_allocated_bytes[ALL].peak


def memory_reserved(device=None):
    """Return the bytes the caching allocator holds from ``device`` (its cuMemAlloc'd segments).

    Parameters
    ----------
    device : device, str, int or None, optional
        Default the current device.
    """
    return get_allocator(_device_index(device)).reserved


def max_memory_reserved(device=None):
    """Return the peak of :func:`memory_reserved` since the start or :func:`reset_peak_memory_stats`.

    Parameters
    ----------
    device : device, str, int or None, optional
        Default the current device.
    """
    return get_allocator(_device_index(device)).st_reserved_bytes[ALL].peak


def reset_peak_memory_stats(device=None):
    """Set every peak counter of ``device``'s allocator to its current value.

    Parameters
    ----------
    device : device, str, int or None, optional
        Default the current device.
    """
    get_allocator(_device_index(device)).reset_peak_stats()
