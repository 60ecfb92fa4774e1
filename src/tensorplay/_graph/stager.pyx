# SPDX-License-Identifier: Apache-2.0
"""stage_and_launch's machinery: copy fresh inputs onto a graph's static
inputs and replay the graph, in one driver launch where the graph allows.

A Stager is built once per graph and list of static inputs. It holds a
second executable of the graph: a clone of the captured graph with one
multi-tensor copy kernel node in front of every root. Each call writes the
table of (src, dst, nbytes) triples into that node's parameters
(cuGraphExecKernelNodeSetParams) and launches the clone's executable, both
in one ``nogil`` block. The captured graph itself is never changed, so
``describe()`` shows only what was captured and ``replay()`` never copies.
"""

cimport cython
from cuda.bindings cimport cydriver
from libc.stdint cimport int64_t, uintptr_t
from libc.string cimport memcmp, memcpy, memset
from libcpp.vector cimport vector

from tensorplay._driver.context cimport LIVE_EXECS, LIVE_GRAPHS, check, count_live, ensure_context
from tensorplay._driver.launch cimport Function, fill_launch_extra
from tensorplay._driver.teardown cimport destroy_graph_objects
from tensorplay._graph.copytable cimport (COPY_BLOCK, MAX_COPY_ENTRIES, copy_capacity, copy_grid_x,
                                          copy_table_bytes, is_tensor_list, set_copy_entry, static_tensor)
from tensorplay._tensor.base cimport DEVICE_CUDA, MAX_NDIM, TensorBase

import numpy

from tensorplay._graph.foreign import graph_tensor

cdef Py_ssize_t g_builds = 0


def staged_builds():
    """How many staged executables were built in this process (tests check
    that staging does not rebuild)."""
    return g_builds


cdef int check_stage_arguments(object static_inputs, object inputs) except -1:
    """The checks of stage_and_launch's two sequences, made once per call
    before anything else: lists or tuples, of one length."""
    if not is_tensor_list(static_inputs) or not is_tensor_list(inputs):
        raise TypeError("stage_and_launch(static_inputs, inputs) takes two lists or tuples of tensors")
    if len(inputs) != len(static_inputs):
        raise ValueError(f"stage_and_launch: {len(static_inputs)} static inputs but {len(inputs)} inputs")
    return 0


cdef int _check_broadcast(tuple src, TensorBase dst, Py_ssize_t k) except -1:
    """ValueError unless ``src`` broadcasts to ``dst``'s shape."""
    cdef int i, nd = dst._ndim, ns = len(src)
    if ns > nd:
        raise ValueError(f"stage_and_launch: inputs[{k}] of shape {src} does not fit static_inputs[{k}] "
                         f"of shape {dst.shape}")
    for i in range(ns):
        s = src[ns - 1 - i]
        if s != 1 and s != dst._shape[nd - 1 - i]:
            raise ValueError(f"stage_and_launch: inputs[{k}] of shape {src} cannot broadcast to "
                             f"static_inputs[{k}] of shape {dst.shape}")
    return 0


cdef tuple _shape_of(object obj):
    shp = getattr(obj, "shape", None)
    if shp is not None:
        return tuple(shp)
    if isinstance(obj, (int, float)):
        return ()
    return tuple(numpy.shape(obj))


cdef int _check_source(object obj, TensorBase static, Py_ssize_t k) except -1:
    """The checks of a pair the copy kernel cannot take (copy_ does it)."""
    if isinstance(obj, TensorBase):
        _check_broadcast((<TensorBase>obj).shape, static, k)
        return 0
    if obj is None or isinstance(obj, (str, bytes)) or not (
            hasattr(obj, "shape") or hasattr(obj, "__len__") or isinstance(obj, (int, float))):
        raise TypeError(f"stage_and_launch: inputs[{k}] is a {type(obj).__name__}, not a tensor")
    _check_broadcast(_shape_of(obj), static, k)
    return 0


@cython.final
cdef class Stager:
    """Stages inputs onto one list of static inputs of one graph (see the module)."""

    def __cinit__(self):
        self._clone = NULL
        self._exec = NULL
        self._node = NULL
        self._main = NULL
        self._cap = 0
        self._node_table_entries = -1
        memset(&self._params, 0, sizeof(self._params))

    cdef bint holds(self, object static_inputs) noexcept:
        """True when ``static_inputs`` (a list or tuple) are the very tensors
        this stager was built for."""
        cdef Py_ssize_t k
        cdef tuple mine = self._given_statics
        if len(static_inputs) != self._n:
            return False
        for k in range(self._n):
            if static_inputs[k] is not mine[k]:
                return False
        return True

    cdef int launch(self, object inputs, cydriver.CUstream stream) except -1:
        """Check every input against its static input, copy the pairs the
        copy kernel cannot take through ``copy``, then copy the rest and
        replay: one launch of the staged executable when there is one.
        ``inputs`` passed check_stage_arguments."""
        cdef Py_ssize_t k, n = self._n, nfast = 0
        cdef TensorBase src
        cdef int i
        cdef bint fast
        cdef unsigned long long maxbytes = 0
        cdef list slow = None
        for k in range(n):
            obj = inputs[k]
            fast = False
            if not isinstance(obj, TensorBase):
                obj = graph_tensor(obj)          # a PyTorch or CuPy tensor: a view of its memory
            if self._contiguous[k] and isinstance(obj, TensorBase):
                src = <TensorBase>obj
                fast = (src._device_type == DEVICE_CUDA and src._device_index == self._device and
                        src._dtype_code == self._dtype[k] and src._ndim == self._ndim[k] and
                        src.c_is_contiguous())
                if fast:
                    for i in range(src._ndim):
                        if src._shape[i] != self._shapes[k * MAX_NDIM + i]:
                            fast = False
                            break
            if fast:
                if self._nbytes[k] and nfast < MAX_COPY_ENTRIES:
                    set_copy_entry(self._table, nfast, src._ptr, self._dst[k], self._nbytes[k])
                    if self._nbytes[k] > maxbytes:
                        maxbytes = self._nbytes[k]
                    nfast += 1
                elif self._nbytes[k]:
                    fast = False          # beyond one table: the generic path copies it
            if not fast:
                _check_source(obj, <TensorBase>self._statics[k], k)
                if slow is None:
                    slow = []
                slow.append(k)
        if slow is not None:
            for k in slow:
                self._copy(self._statics[k], inputs[k])
        self._table[0] = nfast
        self._params.gridDimX = copy_grid_x(maxbytes)
        self._params.gridDimY = <unsigned int>(nfast if nfast else 1)
        with nogil:
            ensure_context(self._device)
            if nfast == 0:
                check(cydriver.cuGraphLaunch(self._main, stream))
            elif self._exec != NULL:
                # the node keeps its table between launches: set it only when it changed
                if not self._table_unchanged(nfast):
                    check(cydriver.cuGraphExecKernelNodeSetParams(self._exec, self._node, &self._params))
                    self._node_table_entries = nfast
                    self._node_grid_x = self._params.gridDimX
                    memcpy(self._node_table, self._table, copy_table_bytes(nfast))
                check(cydriver.cuGraphLaunch(self._exec, stream))
            else:
                self._fn.c_launch(self._params.gridDimX, self._params.gridDimY, 1, COPY_BLOCK, 1, 1, 0,
                                  stream, <const void*>self._table, self._table_size)
                check(cydriver.cuGraphLaunch(self._main, stream))
        return 0

    cdef bint _table_unchanged(self, Py_ssize_t nfast) noexcept nogil:
        return (nfast == self._node_table_entries and self._params.gridDimX == self._node_grid_x and
                memcmp(self._node_table, self._table, copy_table_bytes(nfast)) == 0)

    cdef void release(self) noexcept:
        """Destroy the staged executable and the clone, now or once no capture
        is open (never raises)."""
        destroy_graph_objects(self._device, self._exec, self._clone)
        self._exec = NULL
        self._clone = NULL
        self._node = NULL

    def __dealloc__(self):
        self.release()

    @property
    def one_launch(self):
        """True when staging is one launch of the staged executable."""
        return self._exec != NULL


cdef Stager make_stager(cydriver.CUgraph graph, cydriver.CUgraphExec main, int device, object static_inputs,
                        bint can_clone, object multi_copy, object copy, cydriver.CUstream stream):
    """Build the Stager of ``static_inputs`` for the graph ``graph`` (whose
    executable is ``main``). ``multi_copy(capacity, device)`` gives the copy
    kernel, ``copy(static, source)`` copies what it cannot. Without
    ``can_clone`` (the driver clones no graph with conditional nodes)
    staging is the copy kernel's launch, then the graph's. ``static_inputs``
    passed check_stage_arguments."""
    cdef Stager s = Stager.__new__(Stager)
    cdef Py_ssize_t k, n, nfast = 0
    cdef TensorBase st
    cdef int i
    n = len(static_inputs)
    s._device = device
    s._main = main
    s._n = n
    s._given_statics = tuple(static_inputs)
    s._statics = tuple(graph_tensor(x) for x in s._given_statics)     # foreign ones as views
    s._copy = copy
    s._dst.resize(n)
    s._nbytes.resize(n)
    s._dtype.resize(n)
    s._ndim.resize(n)
    s._contiguous.resize(n)
    s._shapes.resize(n * MAX_NDIM)
    for k in range(n):
        st = static_tensor(s._statics[k], device, "stage_and_launch", f"static_inputs[{k}]")
        s._dst[k] = st._ptr
        s._nbytes[k] = <unsigned long long>(st.c_numel() * st._itemsize)
        s._dtype[k] = st._dtype_code
        s._ndim[k] = st._ndim
        s._contiguous[k] = st.c_is_contiguous()
        for i in range(st._ndim):
            s._shapes[k * MAX_NDIM + i] = st._shape[i]
        if s._contiguous[k]:
            nfast += 1
    if nfast == 0:
        return s                         # every pair goes through copy: no kernel needed
    s._cap = copy_capacity(nfast)
    s._fn = multi_copy(s._cap, device)
    s._table_size = copy_table_bytes(s._cap)
    fill_launch_extra(s._extra, s._table, &s._table_size)
    s._params.func = s._fn._handle
    s._params.gridDimX = 1
    s._params.gridDimY = 1
    s._params.gridDimZ = 1
    s._params.blockDimX = COPY_BLOCK
    s._params.blockDimY = 1
    s._params.blockDimZ = 1
    s._params.extra = s._extra
    s._table[0] = 0
    if can_clone:
        _build_staged(s, graph, stream)
    return s


cdef int _build_staged(Stager s, cydriver.CUgraph graph, cydriver.CUstream stream) except -1:
    """Clone ``graph``, put the copy node in front of every root of the
    clone and instantiate and upload the clone."""
    cdef size_t nroots = 0
    cdef vector[cydriver.CUgraphNode] roots
    cdef vector[cydriver.CUgraphNode] froms
    global g_builds
    g_builds += 1
    try:
        with nogil:
            ensure_context(s._device)
            check(cydriver.cuGraphClone(&s._clone, graph))
        count_live(LIVE_GRAPHS, 1)
        with nogil:
            check(cydriver.cuGraphGetRootNodes(s._clone, NULL, &nroots))
        if nroots:                       # an empty capture has no roots: the copy node is the graph
            roots.resize(nroots)
            with nogil:
                check(cydriver.cuGraphGetRootNodes(s._clone, roots.data(), &nroots))
        with nogil:
            check(cydriver.cuGraphAddKernelNode(&s._node, s._clone, NULL, 0, &s._params))
        if nroots:
            froms.assign(nroots, s._node)
            with nogil:
                check(cydriver.cuGraphAddDependencies(s._clone, froms.data(), roots.data(), NULL, nroots))
        with nogil:
            check(cydriver.cuGraphInstantiate(&s._exec, s._clone, 0))
        count_live(LIVE_EXECS, 1)
        with nogil:
            check(cydriver.cuGraphUpload(s._exec, stream))
    except BaseException:
        s.release()
        raise
    return 0
