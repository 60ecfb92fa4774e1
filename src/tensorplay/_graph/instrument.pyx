# SPDX-License-Identifier: Apache-2.0
"""The instrumented copy a node profile replays (CUDAGraph.profile_nodes).

A clone of the captured graph (cuGraphClone) in which every node, at every
depth (child graphs, conditional bodies), sits between two timestamp kernels
that read the GPU's global timer (%globaltimer, ns): a start stamp the node
depends on, an end stamp that depends on the node and adds the elapsed time
to the node's record. Each scope (the graph, each body) also gets a span:
a stamp before its first nodes and one after its last, so a WHILE body's
span is one iteration. Each edge of the graph gets a companion from the end
stamp of one node to the start stamp of the next, which that node waits for,
so the copy keeps the graph's order and parallel branches, and a node after
a programmatic (PDL) edge starts only once the one before it has finished.
The user's graph and executable are never touched.

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
    """The instrumented clone, its executable and what each record measures."""
    cdef cydriver.CUgraph graph
    cdef cydriver.CUgraphExec exec_handle
    cdef readonly int device
    cdef readonly list slots            # record index -> (scope path, node id; -1 for the scope's span)
    cdef readonly int programmatic_edges    # PDL edges made full in the copy
    cdef readonly list uninstrumented   # (scope path, node id) of nodes whose bodies are timed as a whole
    cdef readonly list notes            # why, for each
    cdef set skip                       # (scope path, node id) whose bodies are left as they are
    cdef bint skip_bodies               # leave every body as it is
    cdef tuple current_body             # the node whose body is being stamped (None: the top graph)
    cdef Function start_fn, end_fn
    cdef uintptr_t records
    cdef unsigned int cap
    cdef cydriver.CUgraph top_clone
    cdef str stage                      # what was being done, for an error's note

    def __cinit__(self):
        self.graph = NULL
        self.exec_handle = NULL

    def __dealloc__(self):
        # never raises: a failing destroy leaks the copy rather than the process
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

    cdef list find_clones(self, cydriver.CUgraph original, cydriver.CUgraph copy,
                          vector[cydriver.CUgraphNode]& onodes):
        """The copy's node for each of ``original``'s (in cuGraphGetNodes order,
        the ids describe() gives): cuGraphNodeFindInClone, else the same
        position in the copy's node list when the kinds agree."""
        cdef vector[cydriver.CUgraphNode] cnodes = graph_nodes(copy)
        cdef cydriver.CUgraphNode c = NULL
        cdef size_t i
        out = []
        for i in range(onodes.size()):
            if cydriver.cuGraphNodeFindInClone(&c, onodes[i], self.top_clone) == cydriver.CUDA_SUCCESS:
                out.append(<uintptr_t>c)
            elif i < cnodes.size() and cnodes.size() == onodes.size() and \
                    node_type(cnodes[i]) == node_type(onodes[i]):
                out.append(<uintptr_t>cnodes[i])
            else:
                raise RuntimeError("profile_nodes: a node of the graph has no counterpart in its clone")
        return out

    cdef list body_graphs(self, cydriver.CUgraphNode copy_node, list original_bodies):
        """The bodies of a conditional node of the copy, in branch order, or
        None: from its parameters (cuGraphNodeGetParams), else through a
        node of each original body found in the copy."""
        cdef cydriver.CUgraphNodeParams params
        cdef cydriver.CUgraph body = NULL
        cdef cydriver.CUgraphNode c = NULL
        cdef vector[cydriver.CUgraphNode] onodes
        cdef unsigned int i
        memset(&params, 0, sizeof(params))
        if cydriver.cuGraphNodeGetParams(copy_node, &params) == cydriver.CUDA_SUCCESS and \
                params.type == cydriver.CU_GRAPH_NODE_TYPE_CONDITIONAL and \
                params.conditional.phGraph_out != NULL and params.conditional.size == len(original_bodies):
            return [<uintptr_t>params.conditional.phGraph_out[i] for i in range(params.conditional.size)]
        out = []
        for ob in original_bodies:
            onodes = graph_nodes(<cydriver.CUgraph><uintptr_t>ob)
            if onodes.size() == 0:
                out.append(0)        # nothing to time in an empty body
                continue
            if cydriver.cuGraphNodeFindInClone(&c, onodes[0], self.top_clone) != cydriver.CUDA_SUCCESS or \
                    cydriver.cuGraphNodeGetContainingGraph(c, &body) != cydriver.CUDA_SUCCESS:
                return None
            out.append(<uintptr_t>body)
        return out

    cdef int instrument(self, cydriver.CUgraph original, cydriver.CUgraph copy, tuple scope,
                        dict conditionals) except -1:
        cdef vector[cydriver.CUgraphNode] onodes = graph_nodes(original)
        cdef vector[cydriver.CUgraphNode] froms, tos, starts, ends, leaves
        cdef vector[cydriver.CUgraphEdgeData] edata
        cdef cydriver.CUgraphNode c, span_start, node
        cdef cydriver.CUgraph ochild = NULL, cchild = NULL
        cdef size_t ne = 0, i, n = onodes.size()
        cdef int slot
        if n == 0:
            return 0
        self.stage = f"instrumenting scope {scope} ({n} nodes)"
        copies = self.find_clones(original, copy, onodes)
        index = {copies[i]: i for i in range(n)}
        check(cydriver.cuGraphGetEdges(copy, NULL, NULL, NULL, &ne))
        froms.resize(ne)
        tos.resize(ne)
        edata.resize(ne)
        if ne:
            check(cydriver.cuGraphGetEdges(copy, froms.data(), tos.data(), edata.data(), &ne))
        # the edges stay (removing one is refused in some graphs): the edge
        # from a node's end stamp to the next node's start stamp, which the
        # next node waits for, orders the stamps
        has_in = [False] * n
        has_out = [False] * n
        for i in range(ne):
            has_out[index[<uintptr_t>froms[i]]] = True
            has_in[index[<uintptr_t>tos[i]]] = True
            if edata[i].type == cydriver.CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC:
                self.programmatic_edges += 1
        self.stage = f"stamping the {n} nodes of scope {scope}"
        span_slot = self.new_slot(scope, -1)
        span_start = self.stamp(copy, False, span_slot, NULL, 0)
        starts.resize(n)
        ends.resize(n)
        for i in range(n):
            c = <cydriver.CUgraphNode><uintptr_t>copies[i]
            self.stage = f"stamping node {i} of scope {scope}"
            slot = self.new_slot(scope, <int>i)
            starts[i] = self.stamp(copy, False, slot, &span_start if not has_in[i] else NULL,
                                   0 if has_in[i] else 1)
            check(cydriver.cuGraphAddDependencies(copy, &starts[i], &c, NULL, 1))
            ends[i] = self.stamp(copy, True, slot, &c, 1)
            if not has_out[i]:
                leaves.push_back(ends[i])
        self.stage = f"joining the stamps of scope {scope} along its {ne} edges"
        for i in range(ne):
            check(cydriver.cuGraphAddDependencies(copy, &ends[index[<uintptr_t>froms[i]]],
                                                  &starts[index[<uintptr_t>tos[i]]], NULL, 1))
        self.stamp(copy, True, span_slot, leaves.data(), leaves.size())
        # what runs inside: child graphs and conditional bodies, each its own scope
        for i in range(n):
            c = <cydriver.CUgraphNode><uintptr_t>copies[i]
            t = node_type(onodes[i])
            if t != cydriver.CU_GRAPH_NODE_TYPE_GRAPH and t != cydriver.CU_GRAPH_NODE_TYPE_CONDITIONAL:
                continue
            key = (scope, <int>i)
            if self.skip_bodies or key in self.skip:
                continue
            if t == cydriver.CU_GRAPH_NODE_TYPE_GRAPH:
                check(cydriver.cuGraphChildGraphNodeGetGraph(onodes[i], &ochild))
                check(cydriver.cuGraphChildGraphNodeGetGraph(c, &cchild))
                originals, bodies = [<uintptr_t>ochild], [<uintptr_t>cchild]
            else:
                info = conditionals.get(<uintptr_t>onodes[i])
                originals = list(info[1]) if info is not None else []
                bodies = self.body_graphs(c, originals) if info is not None else None
                if bodies is None:
                    self.uninstrumented.append(key)
                    self.notes.append(f"node {i} of scope {scope}: its bodies were not found in the clone")
                    continue
            outer = self.current_body
            self.current_body = key
            for b, (ob, cb) in enumerate(zip(originals, bodies)):
                if cb:
                    self.instrument(<cydriver.CUgraph><uintptr_t>ob, <cydriver.CUgraph><uintptr_t>cb,
                                    scope + (<int>i, b), conditionals)
            self.current_body = outer
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
    ic.skip = set()
    ic.skip_bodies = False
    ic.current_body = None
    ic.programmatic_edges = 0
    ic.start_fn = start_fn
    ic.end_fn = end_fn
    ic.records = records
    ic.cap = cap
    ensure_context(device)
    return ic


def build_instrumented_copy(uintptr_t graph, dict conditionals, int device, Function start_fn,
                            Function end_fn, uintptr_t records, unsigned int cap, size_t max_slots):
    """Clone ``graph`` (with ``conditionals``: node -> (kind, bodies, handle)),
    stamp every node writing records of ``cap`` samples from ``records``
    (room for ``max_slots``) and instantiate it. Where the driver refuses
    the stamps inside a body, a fresh clone leaves that body as it is (its
    node is timed as a whole, listed in ``uninstrumented`` with a note);
    where it refuses to instantiate the copy, one with no body stamped."""
    cdef InstrumentedCopy ic
    skip = set()
    skip_bodies = False
    notes = []
    while True:
        ic = new_copy(device, start_fn, end_fn, records, cap)
        ic.skip = skip
        ic.skip_bodies = skip_bodies
        ic.stage = "cloning the graph"
        try:
            check(cydriver.cuGraphClone(&ic.graph, <cydriver.CUgraph>graph))
            ic.top_clone = ic.graph
            ic.instrument(<cydriver.CUgraph>graph, ic.graph, (), conditionals)
            if len(ic.slots) > max_slots:
                raise RuntimeError(f"profile_nodes: {len(ic.slots)} records needed, {max_slots} allocated")
            ic.stage = f"instantiating the instrumented copy ({len(ic.slots)} records)"
            check(cydriver.cuGraphInstantiate(&ic.exec_handle, ic.graph, 0))
        except CudaError as e:
            if ic.current_body is not None and ic.current_body not in skip:
                notes.append(f"node {ic.current_body[1]} of scope {ic.current_body[0]}: timed as a whole, "
                             f"the driver refused stamps in its body ({e.name} while {ic.stage})")
                skip.add(ic.current_body)
                continue
            if ic.stage.startswith("instantiating") and not skip_bodies and any(sc for sc, _ in ic.slots):
                notes.append(f"every body timed as a whole: the driver refused to instantiate the copy with "
                             f"stamps in them ({e.name})")
                skip_bodies = True
                continue
            e.add_note(f"profile_nodes: while {ic.stage}")
            raise
        ic.notes = notes + ic.notes
        ic.uninstrumented += sorted(skip)
        if skip_bodies:
            ic.uninstrumented += [key for key in _body_holders(graph, conditionals, ())
                                  if key not in ic.uninstrumented]
        return ic


def _body_holders(uintptr_t graph, dict conditionals, tuple scope):
    """(scope, id) of the top graph's child graph and conditional nodes."""
    cdef vector[cydriver.CUgraphNode] nodes = graph_nodes(<cydriver.CUgraph>graph)
    cdef size_t i
    out = []
    for i in range(nodes.size()):
        t = node_type(nodes[i])
        if t == cydriver.CU_GRAPH_NODE_TYPE_GRAPH or t == cydriver.CU_GRAPH_NODE_TYPE_CONDITIONAL:
            out.append((scope, <int>i))
    return out


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
