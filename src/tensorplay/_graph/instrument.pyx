# SPDX-License-Identifier: Apache-2.0
"""The instrumented executable a node profile replays (CUDAGraph.profile_nodes).

The driver clones no graph with conditional nodes, so the stamps go into the
captured graph itself, for as long as it takes to instantiate a second
executable from it, and are removed again (cuGraphDestroyNode): the graph's
own nodes, their handles and edges, and its executable are left as they
were. Every node, at every depth (child graphs, conditional bodies), sits
between two timestamp kernels that read the GPU's global timer
(%globaltimer, ns): a start stamp the node depends on, an end stamp that
depends on the node and adds the elapsed time to the node's record. Each scope (the graph, each body) also gets a span:
a stamp before its first nodes and one after its last, so a WHILE body's
span is one iteration. Each edge of the graph gets a companion from the end
stamp of one node to the start stamp of the next, which that node waits for,
so the stamps keep the graph's order and parallel branches, and a node after
a programmatic (PDL) edge starts only once the one before it has finished.

A record is ``3 + cap`` 64-bit words: the last start time, the sum of the
durations, the number of executions, then the first ``cap`` durations.
"""

from cuda.bindings cimport cydriver
from libc.stdint cimport uintptr_t
from libc.string cimport memset
from libcpp.vector cimport vector

from tensorplay._driver.context cimport check, ensure_context
from tensorplay._driver.context import CudaError
from tensorplay._driver.launch cimport Function

cdef unsigned int HEAD = 3      # start, sum, count: then the durations
RECORD_HEAD = HEAD


cdef vector[cydriver.CUgraphNode] graph_nodes(cydriver.CUgraph g) except *:
    cdef size_t n = 0
    cdef vector[cydriver.CUgraphNode] nodes
    check(cydriver.cuGraphGetNodes(g, NULL, &n))
    nodes.resize(n)
    if n:
        check(cydriver.cuGraphGetNodes(g, nodes.data(), &n))
    return nodes


cdef cydriver.CUgraphNodeType node_type(cydriver.CUgraphNode node) except *:
    cdef cydriver.CUgraphNodeType t
    check(cydriver.cuGraphNodeGetType(node, &t))
    return t


cdef class InstrumentedCopy:
    """The instrumented executable and what each record measures."""
    cdef cydriver.CUgraph graph         # a graph of its own (the calibration's), or NULL
    cdef cydriver.CUgraphExec exec_handle
    cdef readonly int device
    cdef readonly list slots            # record index -> (scope path, node id; -1 for the scope's span)
    cdef readonly int programmatic_edges    # PDL edges whose next kernel waits for the whole one before
    cdef readonly list uninstrumented   # (scope path, node id) of nodes whose bodies are timed as a whole
    cdef readonly list notes            # why, for each
    cdef list added                     # the stamp nodes added to the captured graph, removed after instantiation
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
        self.added.append(<uintptr_t>node)
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
        check(cydriver.cuGraphGetEdges(g, NULL, NULL, NULL, &ne))
        froms.resize(ne)
        tos.resize(ne)
        edata.resize(ne)
        if ne:
            check(cydriver.cuGraphGetEdges(g, froms.data(), tos.data(), edata.data(), &ne))
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

    cdef int remove_stamps(self) noexcept:
        """Destroy every stamp added to the captured graph (with its edges),
        last first; returns how many could not be destroyed (never raises)."""
        cdef Py_ssize_t k
        cdef int failed = 0
        try:
            for k in range(len(self.added) - 1, -1, -1):
                if cydriver.cuGraphDestroyNode(<cydriver.CUgraphNode><uintptr_t>self.added[k]) != \
                        cydriver.CUDA_SUCCESS:
                    failed += 1
            self.added = []
        except BaseException:
            failed = max(failed, 1)
        return failed

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
    ic.added = []
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
    """Stamp every node of ``graph`` (with ``conditionals``: node -> (kind,
    bodies, handle)) writing records of ``cap`` samples from ``records``
    (room for ``max_slots``), instantiate an executable of it, and remove
    the stamps again, whatever happened."""
    cdef InstrumentedCopy ic = new_copy(device, start_fn, end_fn, records, cap)
    cdef int failed
    if has_memory_nodes(<cydriver.CUgraph>graph, conditionals):
        # the driver allows such a graph one executable, and destroys none of its nodes
        raise RuntimeError("profile_nodes: the graph holds memory allocation or free nodes (stream-ordered "
                           "allocations captured, e.g. PyTorch's cudaMallocAsync backend); the driver lets such "
                           "a graph have one executable and no node removed, so it cannot be profiled")
    try:
        ic.instrument(<cydriver.CUgraph>graph, (), conditionals)
        if len(ic.slots) > max_slots:
            raise RuntimeError(f"profile_nodes: {len(ic.slots)} records needed, {max_slots} allocated")
        ic.stage = f"instantiating the instrumented graph ({len(ic.slots)} records)"
        check(cydriver.cuGraphInstantiate(&ic.exec_handle, <cydriver.CUgraph>graph, 0))
    except BaseException as e:
        failed = ic.remove_stamps()
        if isinstance(e, CudaError):
            e.add_note(f"profile_nodes: while {ic.stage}")
        if failed:
            e.add_note(f"profile_nodes: {failed} stamp node(s) could not be removed from the captured graph")
        raise
    failed = ic.remove_stamps()
    if failed:
        raise RuntimeError(f"profile_nodes: {failed} stamp node(s) could not be removed from the captured graph; "
                           f"describe() shows them")
    return ic


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
