# SPDX-License-Identifier: Apache-2.0
"""The testing surface of the caching allocator: ``FakeBackend``, a Backend
without a GPU, so that the block policy (size classes, splitting, merging,
stream-ordered reuse, capture rules) is tested on any machine::

    from tensorplay._memory.allocator import DeviceAllocator
    from tensorplay._memory.testing import FakeBackend

    fb = FakeBackend(capacity=1 << 30)
    a = DeviceAllocator(0, fb)           # the allocator the GPU uses, over the fake
    x = a.allocate(4 << 20, stream=0x1000)
    a.check_invariants()

Stream handles are plain ints. Nothing here touches the driver.
"""

cimport cython
from cuda.bindings cimport cydriver
from libc.stdint cimport uintptr_t

from tensorplay._driver.context cimport open_capture_count
from tensorplay._memory.backend cimport Backend


@cython.final
cdef class FakeBackend(Backend):
    """Address ranges and events without a GPU, for testing the block policy.

    Segments come from a counter (never reused) up to ``capacity`` bytes;
    sleepable ones (``vmm``) can give their bytes back and take them again.
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
    cdef readonly dict regions           # sleepable segments: address -> [size, pool, mapped]
    cdef readonly dict routes            # capture id -> sleepable pool
    cdef readonly bint vmm

    def __cinit__(self, size_t capacity=(80 << 30), int device=0, bint vmm=True):
        self.device = device
        self.vmm = vmm
        self.regions = {}
        self.routes = {}
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
        if open_capture_count() > 0 or self.capturing:
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

    cdef bint supports_sleep(self) except -1:
        return self.vmm

    cdef size_t granularity(self) except 0:
        return 2 << 20

    cdef cydriver.CUresult map_segment(self, cydriver.CUdeviceptr* ptr, size_t n, long long pool) except? cydriver.CUDA_ERROR_UNKNOWN:
        cdef cydriver.CUresult r = self.malloc(ptr, n)
        if r == cydriver.CUDA_SUCCESS:
            self.regions[ptr[0]] = [n, pool, True]
        return r

    cdef int free_mapped(self, cydriver.CUdeviceptr ptr) except -1:
        self._note_call()
        reg = self.regions.pop(ptr, None)
        n = self.segments.pop(ptr, None)
        if reg is None or n is None:
            raise AssertionError(f"free_mapped of {ptr:#x}, which is not a live sleepable segment")
        if reg[2]:
            self.used -= n
        self.frees += 1
        return 0

    cdef int sleep_segments(self, long long pool, size_t* nbytes) except -1:
        self._note_call()
        nbytes[0] = 0
        for reg in self.regions.values():
            if reg[1] == pool and reg[2]:
                reg[2] = False
                self.used -= reg[0]
                nbytes[0] += reg[0]
        return 0

    cdef cydriver.CUresult wake_segments(self, long long pool, size_t* nbytes) except? cydriver.CUDA_ERROR_UNKNOWN:
        need = sum(reg[0] for reg in self.regions.values() if reg[1] == pool and not reg[2])
        nbytes[0] = 0
        if self.used + need > self.capacity:
            return cydriver.CUDA_ERROR_OUT_OF_MEMORY     # nothing mapped, as the driver backend rolls back
        for reg in self.regions.values():
            if reg[1] == pool and not reg[2]:
                reg[2] = True
        self.used += need
        nbytes[0] = need
        return cydriver.CUDA_SUCCESS

    cdef void route_capture(self, unsigned long long capture_id, long long pool) noexcept:
        self.routes[capture_id] = pool

    cdef void unroute_capture(self, unsigned long long capture_id) noexcept:
        self.routes.pop(capture_id, None)

    def mapped(self, uintptr_t address):
        """Whether the sleepable segment at ``address`` has physical memory."""
        return self.regions[address][2]

    def set_capacity(self, size_t capacity):
        """Change how many bytes the fake device holds (out-of-memory tests)."""
        self.capacity = capacity

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
        """Finish the work recorded on every stream."""
        for e in self.events.values():
            e[2] = True

    def recorded_events(self):
        """Events recorded and not yet done."""
        return sum(1 for e in self.events.values() if e[1] and not e[2])
