# SPDX-License-Identifier: Apache-2.0
"""Node introspection: a captured CUgraph as plain data, for
CUDAGraph.describe() and debug_dump(); the 64-bit words its kernels were
given as arguments, for CUDAGraph.kernel_buffers()."""

from cuda.bindings cimport cydriver
from libc.stdint cimport uintptr_t
from libc.string cimport memcpy, memset
from libcpp.vector cimport vector

from tensorplay._driver.context cimport check
from tensorplay._graph.conditionals cimport body_label, kind_name
from tensorplay._graph.rebind cimport ARGS_LAID_OUT, ARGS_RAW, read_kernel_args


_KINDS = {
    cydriver.CU_GRAPH_NODE_TYPE_KERNEL: "kernel", cydriver.CU_GRAPH_NODE_TYPE_MEMCPY: "memcpy",
    cydriver.CU_GRAPH_NODE_TYPE_MEMSET: "memset", cydriver.CU_GRAPH_NODE_TYPE_HOST: "host",
    cydriver.CU_GRAPH_NODE_TYPE_GRAPH: "graph", cydriver.CU_GRAPH_NODE_TYPE_EMPTY: "empty",
    cydriver.CU_GRAPH_NODE_TYPE_WAIT_EVENT: "wait_event",
    cydriver.CU_GRAPH_NODE_TYPE_EVENT_RECORD: "event_record",
    cydriver.CU_GRAPH_NODE_TYPE_MEM_ALLOC: "mem_alloc", cydriver.CU_GRAPH_NODE_TYPE_MEM_FREE: "mem_free",
    cydriver.CU_GRAPH_NODE_TYPE_BATCH_MEM_OP: "batch_mem_op",
    cydriver.CU_GRAPH_NODE_TYPE_CONDITIONAL: "conditional",
}
_MEMTYPES = {cydriver.CU_MEMORYTYPE_HOST: "host", cydriver.CU_MEMORYTYPE_DEVICE: "device",
             cydriver.CU_MEMORYTYPE_ARRAY: "array", cydriver.CU_MEMORYTYPE_UNIFIED: "unified"}


cdef vector[cydriver.CUgraphNode] graph_nodes(cydriver.CUgraph g) except *:
    """The nodes of ``g`` in the driver's order (cuGraphGetNodes): the ids describe() gives them."""
    cdef size_t n = 0
    cdef vector[cydriver.CUgraphNode] nodes
    check(cydriver.cuGraphGetNodes(g, NULL, &n))
    nodes.resize(n)
    if n:
        check(cydriver.cuGraphGetNodes(g, nodes.data(), &n))
    return nodes


cdef int graph_edges(cydriver.CUgraph g, vector[cydriver.CUgraphNode]& froms, vector[cydriver.CUgraphNode]& tos,
                     vector[cydriver.CUgraphEdgeData]& edata) except -1:
    """The edges of ``g`` (cuGraphGetEdges), each a from node, a to node and its data."""
    cdef size_t ne = 0
    check(cydriver.cuGraphGetEdges(g, NULL, NULL, NULL, &ne))
    froms.resize(ne)
    tos.resize(ne)
    edata.resize(ne)
    if ne:
        check(cydriver.cuGraphGetEdges(g, froms.data(), tos.data(), edata.data(), &ne))
    return 0


cdef dict describe_graph(cydriver.CUgraph g, bint detailed, dict conditionals):
    """Nodes (kind, kernel name, attributes, conditional bodies) and edges of
    ``g``, read with cuGraphGetNodes / cuGraphNodeGetType / cuGraphGetEdges and
    the node-params getters; ``programmatic_edges`` are the edges among them
    of programmatic type (programmatic dependent launch). ``conditionals`` maps each conditional node
    (as an int) to (its kind, IF_NODE, WHILE_NODE or SWITCH_NODE, its body
    CUgraphs as ints in branch order, its handle): the driver cannot be asked for a
    conditional node's bodies. Each body's description carries its
    ``label``: "then" and "else" (IF), "body" (WHILE), "case k" (SWITCH)."""
    cdef size_t n = 0, ne = 0, i, p, off, sz
    cdef vector[cydriver.CUgraphNode] nodes, froms, tos
    cdef vector[cydriver.CUgraphEdgeData] edata
    cdef cydriver.CUgraphNodeType t
    cdef cydriver.CUDA_KERNEL_NODE_PARAMS kp
    cdef cydriver.CUDA_MEMSET_NODE_PARAMS mp
    cdef cydriver.CUDA_MEMCPY3D cp
    cdef cydriver.CUDA_MEM_ALLOC_NODE_PARAMS ap
    cdef cydriver.CUevent ev
    cdef cydriver.CUgraph child = NULL
    cdef const char* cname = NULL
    nodes = graph_nodes(g)
    n = nodes.size()
    index = {}
    out = []
    for i in range(n):
        node = nodes[i]
        index[<uintptr_t>node] = i
        check(cydriver.cuGraphNodeGetType(node, &t))
        d = {"id": i, "kind": _KINDS.get(t, f"type_{<int>t}"), "attrs": {}}
        attrs = d["attrs"]
        if t == cydriver.CU_GRAPH_NODE_TYPE_KERNEL:
            memset(&kp, 0, sizeof(kp))
            check(cydriver.cuGraphKernelNodeGetParams(node, &kp))
            if kp.func != NULL and cydriver.cuFuncGetName(&cname, kp.func) == cydriver.CUDA_SUCCESS \
                    and cname != NULL:
                d["name"] = cname.decode(errors="replace")
            else:
                d["name"] = "?"
            if detailed:
                attrs["grid"] = (kp.gridDimX, kp.gridDimY, kp.gridDimZ)
                attrs["block"] = (kp.blockDimX, kp.blockDimY, kp.blockDimZ)
                attrs["shared_mem"] = kp.sharedMemBytes
                p = 0
                while p < 4096 and kp.func != NULL and \
                        cydriver.cuFuncGetParamInfo(kp.func, p, &off, &sz) == cydriver.CUDA_SUCCESS:
                    p += 1
                attrs["num_params"] = p
        elif t == cydriver.CU_GRAPH_NODE_TYPE_MEMSET:
            check(cydriver.cuGraphMemsetNodeGetParams(node, &mp))
            attrs["bytes"] = mp.elementSize * mp.width * mp.height
            if detailed:
                attrs["value"] = mp.value
                attrs["element_size"] = mp.elementSize
                attrs["dst"] = hex(mp.dst)
        elif t == cydriver.CU_GRAPH_NODE_TYPE_MEMCPY:
            check(cydriver.cuGraphMemcpyNodeGetParams(node, &cp))
            attrs["bytes"] = cp.WidthInBytes * max(cp.Height, 1) * max(cp.Depth, 1)
            if detailed:
                attrs["direction"] = (f"{_MEMTYPES.get(cp.srcMemoryType, '?')}->"
                                      f"{_MEMTYPES.get(cp.dstMemoryType, '?')}")
        elif t == cydriver.CU_GRAPH_NODE_TYPE_EVENT_RECORD and detailed:
            if cydriver.cuGraphEventRecordNodeGetEvent(node, &ev) == cydriver.CUDA_SUCCESS:
                attrs["event"] = hex(<uintptr_t>ev)
        elif t == cydriver.CU_GRAPH_NODE_TYPE_MEM_ALLOC and detailed:
            if cydriver.cuGraphMemAllocNodeGetParams(node, &ap) == cydriver.CUDA_SUCCESS:
                attrs["bytes"] = ap.bytesize
        elif t == cydriver.CU_GRAPH_NODE_TYPE_GRAPH:
            # an embedded graph (a replay inside the capture): its own description
            check(cydriver.cuGraphChildGraphNodeGetGraph(node, &child))
            desc = describe_graph(child, detailed, conditionals)
            desc["label"] = "child graph"
            d["bodies"] = [desc]
        elif t == cydriver.CU_GRAPH_NODE_TYPE_CONDITIONAL:
            info = conditionals.get(<uintptr_t>node)
            if info is not None:
                kind, bodies, handle = info
                d["type"] = kind_name(kind)
                if detailed:
                    attrs["handle"] = handle
                    attrs["conditional_type"] = d["type"]
                d["bodies"] = []
                for b, body in enumerate(bodies):
                    desc = describe_graph(<cydriver.CUgraph><uintptr_t>body, detailed, conditionals)
                    desc["label"] = body_label(kind, b)
                    d["bodies"].append(desc)
            else:
                d["type"] = "conditional"
                d["bodies"] = []
        out.append(d)
    graph_edges(g, froms, tos, edata)
    ne = froms.size()
    edges = []
    programmatic = []
    if ne:
        for i in range(ne):
            a = index.get(<uintptr_t>froms[i])
            b = index.get(<uintptr_t>tos[i])
            if a is not None and b is not None:
                edges.append([a, b])
                # programmatic dependent launch: the kernel after may start
                # before the one before it completes, and waits in its code
                if edata[i].type == cydriver.CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC:
                    programmatic.append([a, b])
    return {"nodes": out, "edges": edges, "programmatic_edges": programmatic}


cdef int kernel_argument_words(cydriver.CUgraph g, dict conditionals, set out) except -1:
    """Add to ``out`` every aligned 64-bit word of the arguments of ``g``'s
    kernel nodes (child graphs and the conditional bodies in
    ``conditionals`` too): each argument of 8 bytes or more word by word
    where the driver gives the layout, the whole buffer otherwise. Returns
    the kernel nodes whose arguments could not be read."""
    cdef size_t n = 0, i, j, w
    cdef vector[cydriver.CUgraphNode] nodes
    cdef cydriver.CUgraphNodeType t
    cdef cydriver.CUDA_KERNEL_NODE_PARAMS kp
    cdef cydriver.CUgraph child = NULL
    cdef vector[char] buf
    cdef vector[size_t] offsets, sizes
    cdef unsigned long long value
    cdef int how, unreadable = 0
    nodes = graph_nodes(g)
    n = nodes.size()
    for i in range(n):
        check(cydriver.cuGraphNodeGetType(nodes[i], &t))
        if t == cydriver.CU_GRAPH_NODE_TYPE_KERNEL:
            memset(&kp, 0, sizeof(kp))
            check(cydriver.cuGraphKernelNodeGetParams(nodes[i], &kp))
            how = read_kernel_args(&kp, buf, offsets, sizes)
            if how == ARGS_LAID_OUT:
                for j in range(offsets.size()):
                    w = 0
                    while w + 8 <= sizes[j]:
                        memcpy(&value, buf.data() + offsets[j] + w, 8)
                        out.add(value)
                        w += 8
            elif how == ARGS_RAW:
                w = 0
                while w + 8 <= buf.size():
                    memcpy(&value, buf.data() + w, 8)
                    out.add(value)
                    w += 8
            else:
                unreadable += 1
        elif t == cydriver.CU_GRAPH_NODE_TYPE_GRAPH:
            check(cydriver.cuGraphChildGraphNodeGetGraph(nodes[i], &child))
            unreadable += kernel_argument_words(child, conditionals, out)
        elif t == cydriver.CU_GRAPH_NODE_TYPE_CONDITIONAL:
            info = conditionals.get(<uintptr_t>nodes[i])
            if info is not None:
                for body in info[1]:
                    unreadable += kernel_argument_words(<cydriver.CUgraph><uintptr_t>body, conditionals, out)
    return unreadable
