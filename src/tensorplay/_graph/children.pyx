# SPDX-License-Identifier: Apache-2.0
"""A captured graph run inside another capture: a child graph node (the
driver clones the graph into the parent) and ChildHold, what keeps the
child's memory valid for as long as the parent lives, whatever becomes of
the child graph object. The parent is a tensorplay capture (the hold joins
its kept objects) or another library's (PyTorch's, CuPy's, cuda.core's:
the hold is a user object of that graph, tensorplay._driver.hostfn). Other
libraries' graphs (a PyTorch CUDAGraph's raw graph) are embedded the same
way by embed_graph, their owner held as the memory they use."""

cimport cython
from cuda.bindings cimport cydriver
from libc.stdint cimport uintptr_t
from libc.string cimport memset
from libcpp.vector cimport vector

from tensorplay._driver.context cimport check, ensure_context
from tensorplay._driver.context import make_error
from tensorplay._driver.hostfn cimport retain_in_graph
from tensorplay._driver.stream cimport refuse_in_conditional_body
from tensorplay._driver.teardown cimport defer, destroy_must_wait
from tensorplay._graph.describe cimport graph_nodes
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


@cython.final
cdef class GraphHold:
    """Kept by a tensorplay capture another library's graph is embedded in:
    that graph's owner (a PyTorch CUDAGraph, which holds its memory pool),
    dropped when the parent's executable is destroyed. The parent's replays
    need not be waited for: PyTorch gives a graph pool's memory back with
    cudaFree, which waits for the device, and reuses it only for captures
    into that pool."""
    cdef readonly object owner

    def record_stream(self, stream_handle):
        """The parent's executable is destroyed (nothing to record, see the class)."""


# node kinds a conditional body takes (the driver's rule): any other refuses the body
cdef set _BODY_KINDS = {<int>cydriver.CU_GRAPH_NODE_TYPE_KERNEL, <int>cydriver.CU_GRAPH_NODE_TYPE_MEMCPY,
                        <int>cydriver.CU_GRAPH_NODE_TYPE_MEMSET, <int>cydriver.CU_GRAPH_NODE_TYPE_EMPTY,
                        <int>cydriver.CU_GRAPH_NODE_TYPE_GRAPH}


cdef int _node_kinds(cydriver.CUgraph g, set kinds, int depth) except -1:
    """Add the node types of ``g`` and of its child graphs to ``kinds``."""
    cdef vector[cydriver.CUgraphNode] nodes = graph_nodes(g)
    cdef cydriver.CUgraphNodeType t
    cdef cydriver.CUgraph child = NULL
    cdef size_t i
    for i in range(nodes.size()):
        with nogil:
            check(cydriver.cuGraphNodeGetType(nodes[i], &t))
        kinds.add(<int>t)
        if t == cydriver.CU_GRAPH_NODE_TYPE_GRAPH and depth < 64:
            with nogil:
                check(cydriver.cuGraphChildGraphNodeGetGraph(nodes[i], &child))
            _node_kinds(child, kinds, depth + 1)
    return 0


cdef int check_embeddable(cydriver.CUgraph g, cydriver.CUstream stream, str what) except -1:
    """Raise, before anything is added to the capture on ``stream`` (left
    intact), when the driver would refuse ``g`` as a child graph there:
    conditional nodes, memory allocation or free nodes anywhere, and inside
    a tensorplay conditional body any node a body refuses."""
    cdef set kinds = set()
    _node_kinds(g, kinds, 0)
    if <int>cydriver.CU_GRAPH_NODE_TYPE_CONDITIONAL in kinds:
        raise RuntimeError(f"{what}: this graph has conditional nodes (IF, WHILE, SWITCH), and the driver embeds "
                           f"no graph with conditional nodes as a child; capture its step (the body) into the "
                           f"outer graph's own conditional node instead, or embed a graph of the body")
    if <int>cydriver.CU_GRAPH_NODE_TYPE_MEM_ALLOC in kinds or <int>cydriver.CU_GRAPH_NODE_TYPE_MEM_FREE in kinds:
        raise RuntimeError(f"{what}: this graph has memory allocation or free nodes (cudaMallocAsync or "
                           f"cudaFreeAsync captured, as PyTorch does with "
                           f"PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync), and the driver embeds no such "
                           f"graph as a child; capture it with a caching allocator (PyTorch's default)")
    if kinds - _BODY_KINDS:
        refuse_in_conditional_body(stream, f"{what}: this graph has host, event or other nodes that")
    return 0


cdef cydriver.CUgraph capturing_graph(int device, cydriver.CUstream stream, cydriver.cuuint64_t* cid,
                                      str what) except? NULL:
    """The graph ``stream`` captures into (its capture id in ``cid``), or
    NULL when it does not capture."""
    cdef cydriver.CUstreamCaptureStatus status = cydriver.CU_STREAM_CAPTURE_STATUS_NONE
    cdef cydriver.CUgraph g = NULL
    with nogil:
        ensure_context(device)
        check(cydriver.cuStreamGetCaptureInfo(stream, &status, cid, &g, NULL, NULL, NULL))
    if status == cydriver.CU_STREAM_CAPTURE_STATUS_INVALIDATED:
        raise make_error(cydriver.CUDA_ERROR_STREAM_CAPTURE_INVALIDATED,
                         f"{what} on a stream whose capture was invalidated by an earlier error; end that capture")
    return g if status == cydriver.CU_STREAM_CAPTURE_STATUS_ACTIVE else NULL


cdef int _add_child(cydriver.CUstream stream, cydriver.CUgraph child) except -1:
    cdef cydriver.CUgraphNodeParams params
    memset(&params, 0, sizeof(params))
    params.type = cydriver.CU_GRAPH_NODE_TYPE_GRAPH
    params.graph.graph = child
    params.graph.ownership = cydriver.CU_GRAPH_CHILD_GRAPH_OWNERSHIP_CLONE
    add_to_capture(stream, &params)
    return 0


cdef bint embed_if_capturing(int device, cydriver.CUstream stream, cydriver.CUgraph child, long long pool_id,
                             dict kept, dict foreign_holds, bint has_conditionals) except -1:
    """If ``stream`` is capturing, add the captured graph ``child``
    (captured into pool ``pool_id``; ``kept`` and ``foreign_holds`` what its
    executable keeps) to that capture as a child graph node and return
    True; False when the stream is not capturing (the caller launches).
    Into a tensorplay capture the hold joins the capture's kept objects;
    into another library's it is a user object of that graph, released
    once the graph, its executables and their launches are gone."""
    cdef cydriver.cuuint64_t cid = 0
    cdef cydriver.CUgraph outer = capturing_graph(device, stream, &cid, "replay")
    cdef DeviceAllocator alloc
    cdef CaptureState st
    cdef ChildHold hold
    if outer == NULL:
        return False
    alloc = get_allocator(device)
    st = alloc.routes.state_of(cid)
    if has_conditionals:
        raise RuntimeError("replay inside a capture: this graph has conditional nodes, and the driver embeds "
                           "no graph with conditional nodes as a child; capture its step (the body) into the "
                           "outer graph's own conditional node instead, or embed a graph of the body")
    if st is not None and st.pool.id == pool_id:
        raise RuntimeError(f"replay inside a capture: this graph was captured into memory pool {pool_id}, "
                           f"the pool the capture it would join allocates from; its temporaries are free blocks "
                           f"there that the outer capture could reuse while the embedded graph writes them. "
                           f"Capture graphs meant to be embedded into a pool of their own (the default)")
    check_embeddable(child, stream, "replay inside a capture")
    hold = ChildHold.__new__(ChildHold)
    hold.device = device
    hold.storages = dict(kept)
    hold.foreign = dict(foreign_holds)
    hold.streams = []
    alloc.retain_pool(pool_id)
    hold.pool_id = pool_id
    if st is None:
        # another library's graph: held by it (first, so that a failure adds
        # no node whose memory nothing keeps)
        retain_in_graph(outer, hold)
    _add_child(stream, child)
    if st is not None:
        st.keepalive[id(hold)] = hold
    return True


def embed_graph(int device, uintptr_t stream, uintptr_t graph, object owner, str what="embed"):
    """Add CUgraph ``graph`` to the capture open on ``stream`` (of
    ``device``) as a child graph node, cloned by the driver; ``owner``,
    what keeps the memory its work uses valid (None: nothing), is kept
    until the outer graph and its executables are destroyed. Raises
    RuntimeError when the stream is not capturing or the driver would
    refuse the graph there, the capture left intact."""
    cdef cydriver.cuuint64_t cid = 0
    cdef cydriver.CUstream s = <cydriver.CUstream>stream
    cdef cydriver.CUgraph g = <cydriver.CUgraph>graph
    cdef cydriver.CUgraph outer
    cdef CaptureState st
    cdef GraphHold hold
    if g == NULL:
        raise ValueError(f"{what}: the graph handle is 0 (no graph)")
    outer = capturing_graph(device, s, &cid, what)
    if outer == NULL:
        raise RuntimeError(f"{what}: the stream is not capturing; call it inside a capture (with "
                           f"tp.cuda.graph(g): or another library's), where the graph becomes a node")
    check_embeddable(g, s, what)
    st = get_allocator(device).routes.state_of(cid)
    if owner is not None:
        if st is not None:
            hold = GraphHold.__new__(GraphHold)
            hold.owner = owner
            st.keepalive[id(hold)] = hold
        else:
            retain_in_graph(outer, owner)
    _add_child(s, g)
