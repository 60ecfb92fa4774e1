# SPDX-License-Identifier: Apache-2.0
"""Node introspection: a captured CUgraph as plain data, for
CUDAGraph.describe() and debug_dump()."""

from cuda.bindings cimport cydriver
from libc.stdint cimport uintptr_t
from libc.string cimport memset
from libcpp.vector cimport vector

from tensorplay._driver.context cimport check
from tensorplay._graph.conditionals cimport body_label, kind_name


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
    check(cydriver.cuGraphGetNodes(g, NULL, &n))
    nodes.resize(n if n else 1)
    if n:
        check(cydriver.cuGraphGetNodes(g, nodes.data(), &n))
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
    check(cydriver.cuGraphGetEdges(g, NULL, NULL, NULL, &ne))
    edges = []
    programmatic = []
    if ne:
        froms.resize(ne)
        tos.resize(ne)
        edata.resize(ne)
        check(cydriver.cuGraphGetEdges(g, froms.data(), tos.data(), edata.data(), &ne))
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
