# SPDX-License-Identifier: Apache-2.0
"""Memory pools: segments cut into blocks, with PyTorch's size classes, best
fit by stream and size, splitting and merging; and the state of the capture
that allocates into a pool.

A Pool keeps the block structure and its own counters. When a freed block
becomes reusable, where segments come from and the statistics are the
allocator's (tensorplay._memory.allocator).
"""

cimport cython
from cpython.mem cimport PyMem_Malloc, PyMem_Free
from cython.operator cimport dereference as deref, preincrement as preinc


def segment_bytes(size_t nbytes):
    """The size of the segment a request of ``nbytes`` gets when no cached
    block holds it (PyTorch's rule: 2 MiB up to 1 MiB, 20 MiB under 10 MiB,
    else the request rounded up to 2 MiB)."""
    return segment_size(round_size(nbytes))


cdef inline FreeKey free_key(Block* b) noexcept nogil:
    return FreeKey(b.stream, pair[size_t, uintptr_t](b.size, <uintptr_t>b.ptr))


cdef inline bint _mergeable(Block* n) noexcept:
    return n != NULL and not n.allocated and n.holds == 0


cdef Block* _new_block(cydriver.CUdeviceptr ptr, size_t size, uintptr_t stream, void* pool, bint small) noexcept:
    """A free block with no neighbours, or NULL when out of host memory."""
    cdef Block* b = <Block*>PyMem_Malloc(sizeof(Block))
    if b == NULL:
        return NULL
    b.ptr = ptr
    b.size = size
    b.requested = 0
    b.stream = stream
    b.prev = NULL
    b.next = NULL
    b.pool = pool
    b.allocated = False
    b.small = small
    b.holds = 0
    b.alloc_seq = 0
    b.cross_capture = 0
    return b


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


cdef class Pool:
    """A set of segments and free blocks; id 0 is a device's default pool."""

    def __cinit__(self, long long id, int device, bint sleepable=False):
        self.id = id
        self.device = device
        self.sleepable = sleepable
        self.asleep = False
        self.graph_refs = 0
        self.live_blocks = 0
        self.held_blocks = 0
        self.segments = 0
        self.reserved_bytes = 0
        self.allocated_bytes = 0
        self.capture = None

    cdef cmap[FreeKey, Block*]* free_map(self, bint small) noexcept:
        return &self.small_free if small else &self.large_free

    cdef Block* add_segment(self, cydriver.CUdeviceptr ptr, size_t size, uintptr_t stream, bint small) noexcept:
        """Take in a new segment as one block, not yet in the free map (NULL
        when out of host memory: the caller gives the segment back)."""
        cdef Block* b = _new_block(ptr, size, stream, <void*>self, small)
        if b == NULL:
            return NULL
        self.segment_heads[<uintptr_t>ptr] = b
        self.segments += 1
        self.reserved_bytes += size
        return b

    cdef Block* find_free(self, size_t rsize, uintptr_t stream, bint small) noexcept:
        """Take the smallest free block on ``stream`` holding ``rsize`` out of
        the free map (PyTorch's best fit; with no max_split_size, any such block)."""
        cdef cmap[FreeKey, Block*]* m = self.free_map(small)
        cdef FreeKey key = FreeKey(stream, pair[size_t, uintptr_t](rsize, 0))
        cdef cmap[FreeKey, Block*].iterator it = m.lower_bound(key)
        if it == m.end() or deref(it).first.first != stream:
            return NULL
        cdef Block* b = deref(it).second
        m.erase(it)
        return b

    cdef void split(self, Block* b, size_t rsize) noexcept:
        """Cut ``rsize`` off ``b`` when the rest is worth keeping (PyTorch's
        should_split: 512 B in small segments, over 1 MiB in large ones)."""
        cdef size_t rest = b.size - rsize
        cdef Block* r
        if b.small:
            if rest < <size_t>ROUND:
                return
        elif rest <= <size_t>SMALL_SIZE:
            return
        r = _new_block(b.ptr + rsize, rest, b.stream, b.pool, b.small)
        if r == NULL:
            return      # keep the block whole; correct, just less tight
        r.prev = b
        r.next = b.next
        if b.next != NULL:
            b.next.prev = r
        b.next = r
        b.size = rsize
        self.free_map(r.small).insert(FreeEntry(free_key(r), r))

    cdef void insert_free(self, Block* b) noexcept:
        """Put a free block back, merged with free neighbours of its segment."""
        cdef cmap[FreeKey, Block*]* m = self.free_map(b.small)
        if _mergeable(b.prev):
            b = _absorb_next(b.prev, m)
        if _mergeable(b.next):
            _absorb_next(b, m)
        # Memory stays cached until empty_cache, as in PyTorch.
        m.insert(FreeEntry(free_key(b), b))

    cdef vector[Block*] take_free_segments(self) noexcept:
        """Take every segment that is one free block out of the maps and the
        counters and return them: no other thread can take them while the
        caller frees them with the GIL released."""
        cdef vector[Block*] whole
        cdef Block* b
        cdef cmap[uintptr_t, Block*].iterator it = self.segment_heads.begin()
        while it != self.segment_heads.end():
            b = deref(it).second
            if b.prev == NULL and b.next == NULL and not b.allocated and b.holds == 0:
                self.free_map(b.small).erase(free_key(b))
                whole.push_back(b)
                it = self.segment_heads.erase(it)
                self.segments -= 1
                self.reserved_bytes -= b.size
            else:
                preinc(it)
        return whole

    cdef void count_split_free(self, long long* blocks, long long* nbytes) noexcept:
        """Add the free pieces of split segments (fragmentation) to ``blocks``
        and ``nbytes``, indexed ALL, SMALL, LARGE."""
        cdef Block* b
        cdef int kind
        cdef cmap[FreeKey, Block*]* m
        cdef cmap[FreeKey, Block*].iterator it
        for kind in (SMALL, LARGE):
            m = self.free_map(kind == SMALL)
            it = m.begin()
            while it != m.end():
                b = deref(it).second
                if b.prev != NULL or b.next != NULL:      # free piece of a split segment
                    blocks[ALL] += 1
                    blocks[kind] += 1
                    nbytes[ALL] += b.size
                    nbytes[kind] += b.size
                preinc(it)

    cdef void segment_bytes(self, size_t* small, size_t* large) noexcept:
        """The bytes of this pool's segments, small and large."""
        cdef Block* b
        for entry in self.segment_heads:
            b = entry.second
            while b != NULL:
                if b.small:
                    small[0] += b.size
                else:
                    large[0] += b.size
                b = b.next

    cdef list snapshot(self, int device):
        """Each segment as a dict, with its blocks (see DeviceAllocator.snapshot)."""
        cdef Block* b
        out = []
        for entry in self.segment_heads:
            b = entry.second
            blocks = []
            total = 0
            while b != NULL:
                blocks.append({"address": <uintptr_t>b.ptr, "size": b.size,
                               "state": "allocated" if b.allocated else ("held" if b.holds else "free"),
                               "requested_size": b.requested if b.allocated else 0})
                total += b.size
                b = b.next
            out.append({"device": device, "address": entry.first, "total_size": total,
                        "segment_pool_id": self.id, "asleep": bool(self.asleep), "stream": entry.second.stream,
                        "segment_type": "small" if entry.second.small else "large",
                        "blocks": blocks})
        return out

    cdef int check(self, list problems, size_t* reserved, size_t* allocated) except -1:
        """Append to ``problems`` what is inconsistent in this pool (see
        DeviceAllocator.check_invariants); add its blocks' bytes to ``reserved``
        and its allocated blocks' to ``allocated``."""
        cdef Block* b
        cdef size_t pool_reserved = 0, pool_alloc = 0
        cdef long long live = 0, held = 0, nfree = 0
        for entry in self.segment_heads:
            b = entry.second
            if b.prev != NULL or <uintptr_t>b.ptr != entry.first:
                problems.append(f"pool {self.id}: segment {entry.first:#x} head is not its first block")
            while b != NULL:
                if b.pool != <void*>self:
                    problems.append(f"pool {self.id}: block {<uintptr_t>b.ptr:#x} names another pool")
                if b.stream != entry.second.stream or b.small != entry.second.small:
                    problems.append(f"pool {self.id}: block {<uintptr_t>b.ptr:#x} differs from its segment")
                if b.next != NULL and (b.next.prev != b or b.next.ptr != b.ptr + b.size):
                    problems.append(f"pool {self.id}: block {<uintptr_t>b.ptr:#x} and its next do not tile")
                in_map = self.free_map(b.small).count(free_key(b)) == 1
                if b.allocated:
                    live += 1
                    pool_alloc += b.size
                    if in_map or b.holds:
                        problems.append(f"pool {self.id}: allocated block {<uintptr_t>b.ptr:#x} is free-listed or held")
                elif b.holds:
                    held += 1
                    if in_map:
                        problems.append(f"pool {self.id}: held block {<uintptr_t>b.ptr:#x} is in the free map")
                else:
                    nfree += 1
                    if not in_map:
                        problems.append(f"pool {self.id}: free block {<uintptr_t>b.ptr:#x} is not in the free map")
                    if _mergeable(b.next):
                        problems.append(f"pool {self.id}: free blocks {<uintptr_t>b.ptr:#x} and next not merged")
                pool_reserved += b.size
                b = b.next
        if <size_t>self.small_free.size() + <size_t>self.large_free.size() != <size_t>nfree:
            problems.append(f"pool {self.id}: {self.small_free.size() + self.large_free.size()} free-map "
                            f"entries for {nfree} free blocks")
        if pool_reserved != self.reserved_bytes or <long long>self.segment_heads.size() != self.segments:
            problems.append(f"pool {self.id}: reserved {self.reserved_bytes} / {self.segments} segments, "
                            f"blocks add up to {pool_reserved} / {self.segment_heads.size()}")
        if live != self.live_blocks or held != self.held_blocks or pool_alloc != self.allocated_bytes:
            problems.append(f"pool {self.id}: counters live={self.live_blocks} held={self.held_blocks} "
                            f"allocated={self.allocated_bytes}, blocks say {live}/{held}/{pool_alloc}")
        if not self.asleep:         # a sleeping pool's segments hold no device memory
            reserved[0] += pool_reserved
        allocated[0] += pool_alloc
        return 0

    def __repr__(self):
        return (f"<Pool id={self.id} device={self.device} graph_refs={self.graph_refs} "
                f"{'asleep ' if self.asleep else ''}"
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
