# SPDX-License-Identifier: Apache-2.0
"""A captured graph run inside another capture: a child graph node (the
driver clones the graph into the parent) and ChildHold, what keeps the
child's memory valid for as long as the parent lives, whatever becomes of
the child graph object."""

cimport cython
from cuda.bindings cimport cydriver
from libc.stdint cimport uintptr_t
from libc.string cimport memset

from tensorplay._driver.context cimport check, ensure_context
from tensorplay._driver.teardown cimport defer, destroy_must_wait
from tensorplay._graph.streams cimport add_to_capture
from tensorplay._memory.allocator cimport DeviceAllocator, get_allocator
from tensorplay._memory.pool cimport CaptureState


@cython.final
cdef class ChildHold:
    """Kept by the capture a graph is embedded in (with the storages it
    keeps): the child's kept storages (embedded graphs' holds among them),
    other libraries' holds, and a hold on the child's pool, given up after
    the parent's replays when the parent's executable is destroyed."""
    cdef int device
    cdef long long pool_id
    cdef dict storages
    cdef dict foreign
    cdef list streams

    def record_stream(self, stream_handle):
        """The parent's executable is destroyed: its replays on
        ``stream_handle`` must finish before the child's memory is reused."""
        self.streams.append(stream_handle)
        for storage in self.storages.values():
            storage.record_stream(stream_handle)

    def __dealloc__(self):
        if self.pool_id:
            try:
                if destroy_must_wait():      # releasing may record events: not inside a capture
                    defer(_release_pool, (self.device, self.pool_id, tuple(self.streams)))
                else:
                    _release_pool(self.device, self.pool_id, tuple(self.streams))
            except BaseException:
                pass


def _release_pool(int device, long long pool_id, tuple streams):
    get_allocator(device).release_pool(pool_id, streams)


cdef bint embed_if_capturing(int device, cydriver.CUstream stream, cydriver.CUgraph child, long long pool_id,
                             dict kept, dict foreign_holds, bint has_conditionals) except -1:
    """If ``stream`` is capturing into a tensorplay graph, add the captured
    graph ``child`` (captured into pool ``pool_id``; ``kept`` and
    ``foreign_holds`` what its executable keeps) to that capture as a child
    graph node and return True; False when the stream is not capturing (the
    caller launches)."""
    cdef cydriver.CUstreamCaptureStatus status = cydriver.CU_STREAM_CAPTURE_STATUS_NONE
    cdef cydriver.cuuint64_t cid = 0
    cdef cydriver.CUgraphNodeParams params
    cdef DeviceAllocator alloc
    cdef CaptureState st
    cdef ChildHold hold
    with nogil:
        ensure_context(device)
        check(cydriver.cuStreamGetCaptureInfo(stream, &status, &cid, NULL, NULL, NULL, NULL))
    if status != cydriver.CU_STREAM_CAPTURE_STATUS_ACTIVE:
        return False
    alloc = get_allocator(device)
    st = alloc.routes.state_of(cid)
    if st is None:
        raise RuntimeError("replay: the stream is capturing, but not into a tensorplay CUDAGraph; a graph "
                           "replays inside tensorplay's captures only (as a child graph node)")
    if has_conditionals:
        raise RuntimeError("replay inside a capture: this graph has conditional nodes, and the driver embeds "
                           "no graph with conditional nodes as a child; capture its step (the body) into the "
                           "outer graph's own conditional node instead, or embed a graph of the body")
    if st.pool.id == pool_id:
        raise RuntimeError(f"replay inside a capture: this graph was captured into memory pool {pool_id}, "
                           f"the pool the capture it would join allocates from; its temporaries are free blocks "
                           f"there that the outer capture could reuse while the embedded graph writes them. "
                           f"Capture graphs meant to be embedded into a pool of their own (the default)")
    hold = ChildHold.__new__(ChildHold)
    hold.device = device
    hold.storages = dict(kept)
    hold.foreign = dict(foreign_holds)
    hold.streams = []
    alloc.retain_pool(pool_id)
    hold.pool_id = pool_id
    memset(&params, 0, sizeof(params))
    params.type = cydriver.CU_GRAPH_NODE_TYPE_GRAPH
    params.graph.graph = child
    params.graph.ownership = cydriver.CU_GRAPH_CHILD_GRAPH_OWNERSHIP_CLONE
    add_to_capture(stream, &params)
    st.keepalive[id(hold)] = hold
    return True
