# SPDX-License-Identifier: Apache-2.0
"""The instrumented copy a node profile replays (CUDAGraph.profile_nodes).

The stamps go into a copy of the captured graph, never into the graph
itself: a copy built node by node, in the graph's order, whose conditional
nodes get handles of their own (tensorplay's set-conditional kernels are
given the copy's handles), since the driver neither clones a graph with
conditional nodes nor instantiates one twice. A graph without conditional
nodes that holds a node kind the copy does not make is cloned by the driver
(cuGraphClone) instead.
Every node, at every depth (child graphs, conditional bodies), sits
between two timestamp kernels that read the GPU's global timer
(%globaltimer, ns): a start stamp the node depends on, an end stamp that
depends on the node and adds the elapsed time to the node's record. Each
scope (the graph, each body) also gets a span: a stamp before its first
nodes and one after its last, so a WHILE body's span is one iteration. Each
edge of the graph gets a companion from the end stamp of one node to the
start stamp of the next, which that node waits for, so the stamps keep the
graph's order and parallel branches, and a node after a programmatic (PDL)
edge starts only once the one before it has finished.

A record is ``3 + cap`` 64-bit words: the last start time, the sum of the
durations, the number of executions, then the first ``cap`` durations.
"""

from cuda.bindings cimport cydriver
from libc.stdint cimport uintptr_t
from libc.string cimport memcpy, memset
from libcpp.vector cimport vector

from tensorplay._driver.context cimport check, ensure_context, primary_context
from tensorplay._driver.context import CudaError
from tensorplay._driver.launch cimport Function
from tensorplay._graph.describe cimport graph_edges, graph_nodes
from tensorplay._graph.rebind cimport ARGS_UNREADABLE, read_kernel_args

cdef unsigned int HEAD = 3      # start, sum, count: then the durations
RECORD_HEAD = HEAD


cdef cydriver.CUgraphNodeType node_type(cydriver.CUgraphNode node) except *:
    cdef cydriver.CUgraphNodeType t
    check(cydriver.cuGraphNodeGetType(node, &t))
    return t


cdef class InstrumentedCopy:
    """The instrumented executable and what each record measures."""
    cdef cydriver.CUgraph graph         # the stamped copy (or the calibration graph), destroyed with it
    cdef cydriver.CUgraphExec exec_handle
    cdef readonly int device
    cdef readonly list slots            # record index -> (scope path, node id; -1 for the scope's span)
    cdef readonly int programmatic_edges    # PDL edges whose next kernel waits for the whole one before
    cdef readonly list uninstrumented   # (scope path, node id) of nodes whose bodies are timed as a whole
    cdef readonly list notes            # why, for each
    cdef Function start_fn, end_fn
    cdef uintptr_t records
    cdef unsigned int cap
    cdef str stage                      # what was being done, for an error's note

    def __cinit__(self):
        self.graph = NULL
        self.exec_handle = NULL

    def __dealloc__(self):
        # never raises: a failing destroy leaks the executable rather than the process
        if self.exec_handle != NULL:
            cydriver.cuGraphExecDestroy(self.exec_handle)
            self.exec_handle = NULL
        if self.graph != NULL:
            cydriver.cuGraphDestroy(self.graph)
            self.graph = NULL

    cdef cydriver.CUgraphNode stamp(self, cydriver.CUgraph g, bint end, int slot,
                                    cydriver.CUgraphNode* deps, size_t ndeps) except *:
        """Add a start or end stamp of record ``slot`` to ``g`` after ``deps``."""
        cdef cydriver.CUDA_KERNEL_NODE_PARAMS kp
        cdef cydriver.CUgraphNode node = NULL
        cdef unsigned long long rec = self.records + <unsigned long long>slot * (HEAD + self.cap) * 8
        cdef unsigned int cap = self.cap
        cdef void* args[2]
        args[0] = &rec
        args[1] = &cap
        memset(&kp, 0, sizeof(kp))
        kp.func = (self.end_fn if end else self.start_fn)._handle
        kp.gridDimX = kp.gridDimY = kp.gridDimZ = 1
        kp.blockDimX = kp.blockDimY = kp.blockDimZ = 1
        kp.kernelParams = args
        check(cydriver.cuGraphAddKernelNode(&node, g, deps, ndeps, &kp))
        return node

    cdef int new_slot(self, tuple scope, int node_id):
        self.slots.append((scope, node_id))
        return len(self.slots) - 1

    cdef int instrument(self, cydriver.CUgraph g, tuple scope, dict conditionals) except -1:
        """Stamp the nodes of ``g`` (ids in cuGraphGetNodes order, read
        before any stamp is added: describe()'s ids), then the graphs inside
        its child graph and conditional nodes, each its own scope."""
        cdef vector[cydriver.CUgraphNode] nodes = graph_nodes(g)
        cdef vector[cydriver.CUgraphNode] froms, tos, starts, ends, leaves
        cdef vector[cydriver.CUgraphEdgeData] edata
        cdef cydriver.CUgraphNode c, span_start
        cdef cydriver.CUgraph child = NULL
        cdef size_t ne = 0, i, n = nodes.size()
        cdef int slot
        if n == 0:
            return 0
        index = {<uintptr_t>nodes[i]: i for i in range(n)}
        self.stage = f"reading the edges of scope {scope} ({n} nodes)"
        graph_edges(g, froms, tos, edata)
        ne = froms.size()
        has_in = [False] * n
        has_out = [False] * n
        pairs = set()
        for i in range(ne):
            a = index[<uintptr_t>froms[i]]
            b = index[<uintptr_t>tos[i]]
            has_out[a] = True
            has_in[b] = True
            pairs.add((a, b))           # two edges between one pair (other ports) need one companion
            if edata[i].type == cydriver.CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC:
                self.programmatic_edges += 1
        span_slot = self.new_slot(scope, -1)
        span_start = self.stamp(g, False, span_slot, NULL, 0)
        starts.resize(n)
        ends.resize(n)
        for i in range(n):
            c = nodes[i]
            self.stage = f"stamping node {i} of scope {scope}"
            slot = self.new_slot(scope, <int>i)
            starts[i] = self.stamp(g, False, slot, &span_start if not has_in[i] else NULL, 0 if has_in[i] else 1)
            check(cydriver.cuGraphAddDependencies(g, &starts[i], &c, NULL, 1))
            ends[i] = self.stamp(g, True, slot, &c, 1)
            if not has_out[i]:
                leaves.push_back(ends[i])
        # the graph's edges stay; the edge from a node's end stamp to the
        # next node's start stamp, which that node waits for, orders the stamps
        self.stage = f"joining the stamps of scope {scope} along its {len(pairs)} edges"
        for a, b in sorted(pairs):
            check(cydriver.cuGraphAddDependencies(g, &ends[<size_t>a], &starts[<size_t>b], NULL, 1))
        self.stamp(g, True, span_slot, leaves.data(), leaves.size())
        for i in range(n):
            t = node_type(nodes[i])
            if t == cydriver.CU_GRAPH_NODE_TYPE_GRAPH:
                check(cydriver.cuGraphChildGraphNodeGetGraph(nodes[i], &child))
                self.instrument(child, scope + (<int>i, 0), conditionals)
            elif t == cydriver.CU_GRAPH_NODE_TYPE_CONDITIONAL:
                info = conditionals.get(<uintptr_t>nodes[i])
                if info is None:
                    self.uninstrumented.append((scope, <int>i))
                    self.notes.append(f"node {i} of scope {scope}: a conditional node tensorplay did not "
                                      f"capture (its bodies are unknown), timed as a whole")
                    continue
                for b, body in enumerate(info[1]):
                    self.instrument(<cydriver.CUgraph><uintptr_t>body, scope + (<int>i, b), conditionals)
        return 0

    def launch(self, uintptr_t stream):
        """Launch the instrumented executable on ``stream``."""
        cdef cydriver.CUstream s = <cydriver.CUstream>stream
        with nogil:
            ensure_context(self.device)
            check(cydriver.cuGraphLaunch(self.exec_handle, s))


cdef InstrumentedCopy new_copy(int device, Function start_fn, Function end_fn, uintptr_t records, unsigned int cap):
    """An empty InstrumentedCopy whose stamps write records of ``cap`` samples from ``records``."""
    cdef InstrumentedCopy ic = InstrumentedCopy.__new__(InstrumentedCopy)
    ic.device = device
    ic.slots = []
    ic.uninstrumented = []
    ic.notes = []
    ic.programmatic_edges = 0
    ic.start_fn = start_fn
    ic.end_fn = end_fn
    ic.records = records
    ic.cap = cap
    ic.stage = "reading the graph"
    ensure_context(device)
    return ic


def build_instrumented_copy(uintptr_t graph, dict conditionals, int device, Function start_fn,
                            Function end_fn, uintptr_t records, unsigned int cap, size_t max_slots):
    """A copy of ``graph`` (with ``conditionals``: node -> (kind, bodies,
    handle)) with every node stamped, writing records of ``cap`` samples
    from ``records`` (room for ``max_slots``), and its executable."""
    cdef InstrumentedCopy ic = new_copy(device, start_fn, end_fn, records, cap)
    cdef dict copied_conditionals = {}
    if has_memory_nodes(<cydriver.CUgraph>graph, conditionals):
        # the driver clones no such graph and allows it one executable
        raise RuntimeError("profile_nodes: the graph holds memory allocation or free nodes (stream-ordered "
                           "allocations captured, e.g. PyTorch's cudaMallocAsync backend); the driver lets such "
                           "a graph have one executable and copies none, so it cannot be profiled")
    try:
        if not only_copyable_nodes(<cydriver.CUgraph>graph) and not has_conditional_nodes(<cydriver.CUgraph>graph):
            ic.stage = "cloning the graph"          # a node kind the copy lacks: the driver's clone has it
            check(cydriver.cuGraphClone(&ic.graph, <cydriver.CUgraph>graph))
            check_clone_order(<cydriver.CUgraph>graph, ic.graph)
        else:
            ic.stage = "copying the graph node by node"
            ic.graph = copy_graph(<cydriver.CUgraph>graph, conditionals, copied_conditionals, device)
        ic.instrument(ic.graph, (), copied_conditionals)
        if len(ic.slots) > max_slots:
            raise RuntimeError(f"profile_nodes: {len(ic.slots)} records needed, {max_slots} allocated")
        ic.stage = f"instantiating the instrumented copy ({len(ic.slots)} records)"
        check(cydriver.cuGraphInstantiate(&ic.exec_handle, ic.graph, 0))
    except CudaError as e:
        e.add_note(f"profile_nodes: while {ic.stage}")
        raise
    return ic


cdef int check_clone_order(cydriver.CUgraph g, cydriver.CUgraph clone) except -1:
    """Raise unless the clone lists its nodes in the graph's order (records
    are matched to describe()'s ids by it)."""
    cdef vector[cydriver.CUgraphNode] nodes = graph_nodes(g)
    cdef vector[cydriver.CUgraphNode] listed = graph_nodes(clone)
    cdef cydriver.CUgraphNode found = NULL
    cdef size_t i
    for i in range(nodes.size()):
        check(cydriver.cuGraphNodeFindInClone(&found, nodes[i], clone))
        if i >= listed.size() or found != listed[i]:
            raise RuntimeError("profile_nodes: the driver's clone lists its nodes in another order than the "
                               "graph; its records could not be matched to the graph's nodes")
    return 0


cdef bint has_conditional_nodes(cydriver.CUgraph g) except -1:
    """Whether ``g`` holds a conditional node (child graphs hold none: the
    driver embeds no graph with one)."""
    cdef vector[cydriver.CUgraphNode] nodes = graph_nodes(g)
    cdef size_t i
    for i in range(nodes.size()):
        if node_type(nodes[i]) == cydriver.CU_GRAPH_NODE_TYPE_CONDITIONAL:
            return True
    return False


cdef set _COPIED_KINDS = {<int>cydriver.CU_GRAPH_NODE_TYPE_KERNEL, <int>cydriver.CU_GRAPH_NODE_TYPE_MEMCPY,
                          <int>cydriver.CU_GRAPH_NODE_TYPE_MEMSET, <int>cydriver.CU_GRAPH_NODE_TYPE_EMPTY,
                          <int>cydriver.CU_GRAPH_NODE_TYPE_HOST, <int>cydriver.CU_GRAPH_NODE_TYPE_EVENT_RECORD,
                          <int>cydriver.CU_GRAPH_NODE_TYPE_WAIT_EVENT, <int>cydriver.CU_GRAPH_NODE_TYPE_GRAPH,
                          <int>cydriver.CU_GRAPH_NODE_TYPE_CONDITIONAL}


cdef bint only_copyable_nodes(cydriver.CUgraph g) except -1:
    """Whether every node of ``g`` and of its child graphs is of a kind
    copy_graph makes (conditional bodies hold only such kinds)."""
    cdef vector[cydriver.CUgraphNode] nodes = graph_nodes(g)
    cdef cydriver.CUgraph child = NULL
    cdef size_t i
    for i in range(nodes.size()):
        t = <int>node_type(nodes[i])
        if t not in _COPIED_KINDS:
            return False
        if t == cydriver.CU_GRAPH_NODE_TYPE_GRAPH:
            check(cydriver.cuGraphChildGraphNodeGetGraph(nodes[i], &child))
            if not only_copyable_nodes(child):
                return False
    return True


cdef cydriver.CUgraph copy_graph(cydriver.CUgraph g, dict conditionals, dict copied, int device) except NULL:
    """A new graph with a node for each node of ``g`` (RuntimeError for a
    kind it does not make), in the same order (so describe()'s ids hold),
    and the same edges; ``copied`` gets the copy's conditional nodes
    (node -> (kind, bodies, handle))."""
    cdef cydriver.CUgraph out = NULL
    check(cydriver.cuGraphCreate(&out, 0))
    try:
        _copy_scope(g, out, conditionals, copied, {}, primary_context(device), ())
    except BaseException:
        cydriver.cuGraphDestroy(out)
        raise
    return out


cdef int _copy_scope(cydriver.CUgraph src, cydriver.CUgraph dst, dict conditionals, dict copied, dict handles,
                     cydriver.CUcontext ctx, tuple scope) except -1:
    """Copy the nodes and edges of ``src`` into the empty graph ``dst``;
    ``handles`` maps the graph's conditional handles to the copy's."""
    cdef vector[cydriver.CUgraphNode] nodes = graph_nodes(src)
    cdef vector[cydriver.CUgraphNode] made, froms, tos, listed
    cdef vector[cydriver.CUgraphEdgeData] edata
    cdef cydriver.CUgraphConditionalHandle h = 0
    cdef size_t i, n = nodes.size(), ne = 0
    # a node's handle first: the set-conditional kernel before the node gets it
    for i in range(n):
        if node_type(nodes[i]) == cydriver.CU_GRAPH_NODE_TYPE_CONDITIONAL:
            info = conditionals.get(<uintptr_t>nodes[i])
            if info is None:
                raise RuntimeError(f"profile_nodes: node {i} of scope {scope} is a conditional node tensorplay "
                                   f"did not capture; the driver copies no graph with one, and its bodies are "
                                   f"unknown here, so this graph cannot be profiled")
            if <unsigned long long>info[2] in handles:
                # a set-conditional kernel names its node by the handle's value alone
                raise RuntimeError(f"profile_nodes: conditional node {i} of scope {scope} has the handle value "
                                   f"of another conditional node of this graph, so the copy could not tell "
                                   f"which node its set-conditional kernels set")
            check(cydriver.cuGraphConditionalHandleCreate(&h, dst, ctx, 0, 0))
            handles[<unsigned long long>info[2]] = <unsigned long long>h
    made.resize(n)
    for i in range(n):
        made[i] = _copy_node(nodes[i], dst, conditionals, copied, handles, ctx, scope, i)
    index = {<uintptr_t>nodes[i]: i for i in range(n)}
    graph_edges(src, froms, tos, edata)
    ne = froms.size()
    if ne:
        for i in range(ne):
            froms[i] = made[<size_t>index[<uintptr_t>froms[i]]]
            tos[i] = made[<size_t>index[<uintptr_t>tos[i]]]
        check(cydriver.cuGraphAddDependencies(dst, froms.data(), tos.data(), edata.data(), ne))
    listed = graph_nodes(dst)
    for i in range(n):
        if listed[i] != made[i]:
            raise RuntimeError(f"profile_nodes: the copy of scope {scope} lists its nodes in another order "
                               f"than the graph; its records could not be matched to the graph's nodes")
    return 0


cdef cydriver.CUgraphNode _copy_node(cydriver.CUgraphNode node, cydriver.CUgraph dst, dict conditionals,
                                     dict copied, dict handles, cydriver.CUcontext ctx, tuple scope,
                                     size_t i) except NULL:
    """Add to ``dst``, without dependencies, a node that does what ``node`` does."""
    cdef cydriver.CUgraphNode out = NULL
    cdef cydriver.CUgraphNodeType t = node_type(node)
    cdef cydriver.CUDA_KERNEL_NODE_PARAMS kp
    cdef cydriver.CUDA_MEMCPY3D cp
    cdef cydriver.CUDA_MEMSET_NODE_PARAMS mp
    cdef cydriver.CUDA_HOST_NODE_PARAMS hp
    cdef cydriver.CUgraphNodeParams cond
    cdef cydriver.CUevent ev = NULL
    cdef cydriver.CUgraph child = NULL, inner = NULL
    cdef vector[char] buf
    cdef vector[size_t] offsets, sizes
    cdef size_t nbytes = 0
    cdef void* extra[5]
    cdef unsigned long long old = 0, new = 0
    cdef unsigned int k
    if t == cydriver.CU_GRAPH_NODE_TYPE_KERNEL:
        memset(&kp, 0, sizeof(kp))
        check(cydriver.cuGraphKernelNodeGetParams(node, &kp))
        if _sets_a_conditional(&kp):
            # its first argument is the handle of the node it sets: the copy's
            k = 0
            if read_kernel_args(&kp, buf, offsets, sizes) != ARGS_UNREADABLE:
                k = <unsigned int>(offsets[0] if offsets.size() else 0)
            if buf.size() < k + 8:
                raise RuntimeError(f"profile_nodes: the arguments of set-conditional kernel {i} of scope "
                                   f"{scope} could not be read")
            memcpy(&old, buf.data() + k, 8)
            if old not in handles:
                raise RuntimeError(f"profile_nodes: set-conditional kernel {i} of scope {scope} sets a handle "
                                   f"of no conditional node of this graph")
            new = handles[old]
            memcpy(buf.data() + k, &new, 8)
            nbytes = buf.size()
            extra[0] = <void*>cydriver.CU_LAUNCH_PARAM_BUFFER_POINTER
            extra[1] = <void*>buf.data()
            extra[2] = <void*>cydriver.CU_LAUNCH_PARAM_BUFFER_SIZE
            extra[3] = <void*>&nbytes
            extra[4] = <void*>cydriver.CU_LAUNCH_PARAM_END
            kp.kernelParams = NULL
            kp.extra = extra
        check(cydriver.cuGraphAddKernelNode(&out, dst, NULL, 0, &kp))
        check(cydriver.cuGraphKernelNodeCopyAttributes(out, node))
    elif t == cydriver.CU_GRAPH_NODE_TYPE_MEMCPY:
        check(cydriver.cuGraphMemcpyNodeGetParams(node, &cp))
        check(cydriver.cuGraphAddMemcpyNode(&out, dst, NULL, 0, &cp, ctx))
    elif t == cydriver.CU_GRAPH_NODE_TYPE_MEMSET:
        check(cydriver.cuGraphMemsetNodeGetParams(node, &mp))
        check(cydriver.cuGraphAddMemsetNode(&out, dst, NULL, 0, &mp, ctx))
    elif t == cydriver.CU_GRAPH_NODE_TYPE_EMPTY:
        check(cydriver.cuGraphAddEmptyNode(&out, dst, NULL, 0))
    elif t == cydriver.CU_GRAPH_NODE_TYPE_HOST:
        check(cydriver.cuGraphHostNodeGetParams(node, &hp))
        check(cydriver.cuGraphAddHostNode(&out, dst, NULL, 0, &hp))
    elif t == cydriver.CU_GRAPH_NODE_TYPE_EVENT_RECORD:
        check(cydriver.cuGraphEventRecordNodeGetEvent(node, &ev))
        check(cydriver.cuGraphAddEventRecordNode(&out, dst, NULL, 0, ev))
    elif t == cydriver.CU_GRAPH_NODE_TYPE_WAIT_EVENT:
        check(cydriver.cuGraphEventWaitNodeGetEvent(node, &ev))
        check(cydriver.cuGraphAddEventWaitNode(&out, dst, NULL, 0, ev))
    elif t == cydriver.CU_GRAPH_NODE_TYPE_GRAPH:
        # copied too, and moved into its node: the driver refused to clone
        # the child into the copy (CUDA_ERROR_NOT_SUPPORTED, H100, driver 580)
        check(cydriver.cuGraphChildGraphNodeGetGraph(node, &child))
        check(cydriver.cuGraphCreate(&inner, 0))
        try:
            _copy_scope(child, inner, conditionals, copied, handles, ctx, scope + (<int>i, 0))
            memset(&cond, 0, sizeof(cond))
            cond.type = cydriver.CU_GRAPH_NODE_TYPE_GRAPH
            cond.graph.graph = inner
            cond.graph.ownership = cydriver.CU_GRAPH_CHILD_GRAPH_OWNERSHIP_MOVE
            check(cydriver.cuGraphAddNode(&out, dst, NULL, NULL, 0, &cond))
        except BaseException:
            cydriver.cuGraphDestroy(inner)
            raise
    elif t == cydriver.CU_GRAPH_NODE_TYPE_CONDITIONAL:
        kind, bodies, handle = conditionals[<uintptr_t>node]
        memset(&cond, 0, sizeof(cond))
        cond.type = cydriver.CU_GRAPH_NODE_TYPE_CONDITIONAL
        cond.conditional.handle = <cydriver.CUgraphConditionalHandle><unsigned long long>handles[handle]
        cond.conditional.type = <cydriver.CUgraphConditionalNodeType><int>kind
        cond.conditional.size = <unsigned int>len(bodies)
        cond.conditional.ctx = ctx
        check(cydriver.cuGraphAddNode(&out, dst, NULL, NULL, 0, &cond))
        new_bodies = [<uintptr_t>cond.conditional.phGraph_out[k] for k in range(cond.conditional.size)]
        copied[<uintptr_t>out] = (kind, new_bodies, handles[handle])
        for k in range(cond.conditional.size):
            _copy_scope(<cydriver.CUgraph><uintptr_t>bodies[k], cond.conditional.phGraph_out[k], conditionals,
                        copied, handles, ctx, scope + (<int>i, <int>k))
    else:
        raise RuntimeError(f"profile_nodes: node {i} of scope {scope} is of a kind (CUgraphNodeType {<int>t}) "
                           f"that a graph with conditional nodes, which the driver does not clone, cannot be "
                           f"copied with here, so it cannot be profiled")
    return out


cdef bint _sets_a_conditional(cydriver.CUDA_KERNEL_NODE_PARAMS* kp) except -1:
    """Whether the kernel is one of tensorplay's set-conditional kernels
    (tensorplay/_graph/kernels.py), whose first argument is a handle."""
    cdef const char* cname = NULL
    if kp.func == NULL or cydriver.cuFuncGetName(&cname, kp.func) != cydriver.CUDA_SUCCESS or cname == NULL:
        return False
    name = cname.decode(errors="replace")
    return name == "tp_set_conditional" or name.startswith("tp_set_switch_")


cdef bint has_memory_nodes(cydriver.CUgraph g, dict conditionals) except -1:
    """Whether ``g``, at any depth, holds a memory allocation or free node."""
    cdef vector[cydriver.CUgraphNode] nodes = graph_nodes(g)
    cdef cydriver.CUgraph child = NULL
    cdef size_t i
    for i in range(nodes.size()):
        t = node_type(nodes[i])
        if t == cydriver.CU_GRAPH_NODE_TYPE_MEM_ALLOC or t == cydriver.CU_GRAPH_NODE_TYPE_MEM_FREE:
            return True
        if t == cydriver.CU_GRAPH_NODE_TYPE_GRAPH:
            check(cydriver.cuGraphChildGraphNodeGetGraph(nodes[i], &child))
            if has_memory_nodes(child, conditionals):
                return True
        elif t == cydriver.CU_GRAPH_NODE_TYPE_CONDITIONAL:
            info = conditionals.get(<uintptr_t>nodes[i])
            for body in (info[1] if info is not None else ()):
                if has_memory_nodes(<cydriver.CUgraph><uintptr_t>body, conditionals):
                    return True
    return False


def count_nodes(uintptr_t graph, dict conditionals):
    """Nodes of ``graph`` at every depth (child graphs, conditional bodies)
    plus one per scope: the records a profile needs."""
    cdef vector[cydriver.CUgraphNode] nodes = graph_nodes(<cydriver.CUgraph>graph)
    cdef cydriver.CUgraph child = NULL
    cdef size_t i
    total = <Py_ssize_t>nodes.size() + 1
    for i in range(nodes.size()):
        t = node_type(nodes[i])
        if t == cydriver.CU_GRAPH_NODE_TYPE_GRAPH:
            check(cydriver.cuGraphChildGraphNodeGetGraph(nodes[i], &child))
            total += count_nodes(<uintptr_t>child, conditionals)
        elif t == cydriver.CU_GRAPH_NODE_TYPE_CONDITIONAL:
            info = conditionals.get(<uintptr_t>nodes[i])
            if info is not None:
                for body in info[1]:
                    total += count_nodes(body, conditionals)
    return total


def build_calibration(int device, Function start_fn, Function end_fn, Function empty_fn,
                      uintptr_t records, unsigned int cap, unsigned int pairs):
    """A chain of ``pairs`` stamp pairs with nothing between them (record 0:
    what a node's stamps add to it, the floor) then ``pairs`` around one
    empty kernel (record 1: what a pair of stamps costs a graph in time,
    taken off the nodes that hold instrumented bodies)."""
    cdef InstrumentedCopy ic = new_copy(device, start_fn, end_fn, records, cap)
    cdef cydriver.CUgraphNode prev = NULL, node = NULL
    cdef cydriver.CUDA_KERNEL_NODE_PARAMS kp
    cdef unsigned int i
    ic.slots = [((), -1), ((), -2)]
    ic.stage = "building the calibration graph"
    check(cydriver.cuGraphCreate(&ic.graph, 0))
    memset(&kp, 0, sizeof(kp))
    kp.func = empty_fn._handle
    kp.gridDimX = kp.gridDimY = kp.gridDimZ = 1
    kp.blockDimX = kp.blockDimY = kp.blockDimZ = 1
    for i in range(2 * pairs):
        prev = ic.stamp(ic.graph, False, i // pairs, &prev if prev != NULL else NULL, 1 if prev != NULL else 0)
        if i >= pairs:
            check(cydriver.cuGraphAddKernelNode(&node, ic.graph, &prev, 1, &kp))
            prev = node
        prev = ic.stamp(ic.graph, True, i // pairs, &prev, 1)
    check(cydriver.cuGraphInstantiate(&ic.exec_handle, ic.graph, 0))
    return ic
