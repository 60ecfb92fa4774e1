# SPDX-License-Identifier: Apache-2.0
"""CUDAGraphBase: owns the captured graph and its executable; capture
begin/end with allocator routing; replay with the GIL released."""

cimport cython
from cuda.bindings cimport cydriver
from libc.stdint cimport uintptr_t
from libc.string cimport memcpy, memset

from tensorplay._cuda cimport check, ensure_context, get_current_device, primary_context, validate_device
from tensorplay._kernel cimport Function, fill_launch_extra
from tensorplay._tensor_base cimport TensorBase, DEVICE_CUDA
from libcpp.vector cimport vector
from tensorplay._stream cimport (Stream, as_stream, current_stream_handle, set_current_stream_handle,
                                 stream_wait_stream)

import os
import threading

from tensorplay._alloc import allocator as _allocator, graph_pool_handle
from tensorplay._stream import (capture_side_stream, current_stream, release_capture_side_stream,
                               set_stream)

_live = {"graphs": 0, "execs": 0}

cdef uintptr_t NO_STREAM = <uintptr_t>-1     # no replay yet (0 is the legacy default stream)

# Checking that a stream is not capturing and beginning capture on it is one
# step, so two threads beginning captures on one stream get a clear error, not
# the driver's. (Default side streams are already reserved per capture.)
_begin_lock = threading.Lock()


cdef int _keep_storage(dict keep, object t) except -1:
    if isinstance(t, TensorBase):
        st = (<TensorBase>t)._storage
        if st is not None:
            keep[id(st)] = st
    return 0


def live_graph_objects():
    """Counts of live CUgraph and CUgraphExec handles (leak checks in tests)."""
    return dict(_live)


cdef int CAPTURE_GLOBAL = cydriver.CU_STREAM_CAPTURE_MODE_GLOBAL
cdef int CAPTURE_THREAD_LOCAL = cydriver.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
cdef int CAPTURE_RELAXED = cydriver.CU_STREAM_CAPTURE_MODE_RELAXED
CAPTURE_MODES = {"global": CAPTURE_GLOBAL, "thread_local": CAPTURE_THREAD_LOCAL,
                 "relaxed": CAPTURE_RELAXED}


# no_gc_clear: __dealloc__ ends an open capture and restores the stream it
# replaced, so the collector must not set those fields to None first.
@cython.no_gc_clear
cdef class CUDAGraphBase:
    """The compiled half of tensorplay.cuda.graphs.CUDAGraph (see there)."""

    cdef cydriver.CUgraph _graph
    cdef cydriver.CUgraphExec _exec
    cdef cydriver.CUstream _capture_stream
    cdef readonly int _device
    cdef long long _pool_id
    cdef bint _has_pool
    cdef bint _capturing
    cdef unsigned long long _capture_id
    cdef object _capture_stream_obj
    cdef object _reserved_side       # the side stream capture_begin reserved, until it succeeds
    cdef object _prev_stream
    cdef object _capture_thread
    cdef int _pid
    cdef readonly size_t num_nodes
    """The number of nodes of the captured graph, cuGraphGetNodes (0 before a capture ends)."""
    cdef list _cond_stack           # [(handle, kind, child Stream, pred ptr, parent Stream, capture id)]
    cdef object _set_cond_fn        # the set-conditional kernel, given by the Python layer
    cdef list _stage_fns            # multi-tensor copy kernels by table capacity, from the Python layer
    cdef dict _cond_nodes           # conditional node -> (kind, body graph, handle), for describe()
    cdef dict _keepalive_storages   # id -> storage from outside the pool that the captured work uses
    cdef object _capture_state      # the allocator's CaptureState while capturing
    cdef uintptr_t _last_replay_stream
    cdef set _replay_streams        # streams replayed on: kept memory is reused only after them
    cdef int _mode
    # stage_and_launch's one-launch path: a second executable of the graph with
    # the multi-tensor copy kernel node in front of every root; each call sets
    # that node's parameters (the table) and launches once
    cdef cydriver.CUgraphExec _staged_exec
    cdef cydriver.CUgraphNode _staged_node
    cdef Py_ssize_t _staged_cap      # table capacity of the staged kernel (0: none)
    cdef bint _staged_unavailable    # building it failed once: two launches from then on
    cdef object __weakref__

    def __cinit__(self, *args, **kwargs):
        self._graph = NULL
        self._exec = NULL
        self._capture_stream = NULL
        self._device = -1
        self._has_pool = False
        self._capturing = False
        self._cond_stack = []
        self._cond_nodes = {}
        self._keepalive_storages = {}
        self._last_replay_stream = NO_STREAM
        self._staged_exec = NULL
        self._staged_node = NULL
        self._staged_cap = 0
        self._staged_unavailable = False

    # ------------------------------------------------------------ capture

    def _capture_begin(self, long long pool_id, int mode, stream):
        """Begin capturing on ``stream`` (None: a side stream of the current
        device) into pool ``pool_id``, cuStreamBeginCapture."""
        if self._capturing:
            raise RuntimeError("capture_begin: this graph is already capturing")
        if self._exec != NULL or self._graph != NULL:
            raise RuntimeError("capture_begin: this graph holds a captured graph; call reset() first")
        with _begin_lock:
            self._begin_locked(pool_id, mode, stream)

    cdef int _begin_locked(self, long long pool_id, int mode, stream) except -1:
        try:
            self._begin_on(pool_id, mode, stream)
        except BaseException:
            if not self._capturing:
                release_capture_side_stream(self._reserved_side)
            self._reserved_side = None
            raise
        self._reserved_side = None
        return 0

    cdef int _begin_on(self, long long pool_id, int mode, stream) except -1:
        cdef Stream s
        cdef int dev
        cdef cydriver.CUstream prev
        cdef cydriver.CUstreamCaptureStatus status
        cdef cydriver.cuuint64_t cid = 0
        if stream is None:
            dev = get_current_device()
            validate_device(dev)
            s = capture_side_stream(dev)
            self._reserved_side = s
        else:
            s = as_stream(stream)
            dev = s._device
            validate_device(dev)
            if <uintptr_t>s._handle <= 2:
                raise ValueError("capture_begin: the legacy or per-thread default stream cannot be "
                                 "captured; pass a tensorplay.cuda.Stream()")
        with nogil:
            ensure_context(dev)
            check(cydriver.cuStreamIsCapturing(s._handle, &status))
        if status != cydriver.CU_STREAM_CAPTURE_STATUS_NONE:
            raise RuntimeError("capture_begin: the stream is already capturing")
        prev_obj = current_stream(dev)
        prev = current_stream_handle(dev)
        if prev != s._handle:
            stream_wait_stream(s._handle, prev, dev)     # the capture sees work queued before it
        with nogil:
            check(cydriver.cuStreamBeginCapture(s._handle, <cydriver.CUstreamCaptureMode>mode))
        try:
            with nogil:
                check(cydriver.cuStreamGetCaptureInfo(s._handle, &status, &cid, NULL, NULL, NULL, NULL))
            alloc = _allocator(dev)
            alloc.retain_pool(pool_id)
            try:
                self._capture_state = alloc.begin_capture(pool_id, cid, <uintptr_t>s._handle)
            except BaseException:
                alloc.release_pool(pool_id)
                raise
        except BaseException:
            self._discard_capture(s._handle)
            raise
        self._device = dev
        self._pool_id = pool_id
        self._has_pool = True
        self._capture_stream = s._handle
        self._capture_stream_obj = s
        self._capture_id = cid
        self._prev_stream = prev_obj
        self._capture_thread = threading.get_ident()
        self._pid = os.getpid()
        self._capturing = True
        self._mode = mode
        set_stream(s)
        return 0

    cdef void _discard_capture(self, cydriver.CUstream stream, bint owns_graph=True) noexcept:
        """End the capture on ``stream`` and drop what it made; a conditional
        body's graph belongs to its node (owns_graph False) and dies with the
        parent graph."""
        cdef cydriver.CUgraph g = NULL
        try:
            if cydriver.cuStreamEndCapture(stream, &g) == cydriver.CUDA_SUCCESS and g != NULL \
                    and owns_graph:
                cydriver.cuGraphDestroy(g)
        except BaseException:
            pass

    cdef int _end_routing(self, bint release_stream=True) except -1:
        """Stop routing allocations; keep the storages from outside the pool
        that the capture used; restore the current stream; give a reserved
        side stream back unless the caller still queues work on it
        (capture_end uploads there first)."""
        state = self._capture_state
        self._capture_state = None
        if state is not None:
            self._keepalive_storages.update(_allocator(self._device).end_capture(state))
        if self._prev_stream is not None:
            set_stream(self._prev_stream)
        self._prev_stream = None
        self._capturing = False
        if release_stream:
            release_capture_side_stream(self._capture_stream_obj)
        return 0

    def _capture_end(self):
        """End the capture (cuStreamEndCapture), then instantiate and upload the
        executable (cuGraphInstantiate, cuGraphUpload)."""
        cdef cydriver.CUgraph g = NULL
        cdef cydriver.CUresult r
        cdef size_t n = 0
        if not self._capturing:
            raise RuntimeError("capture_end: no capture is open on this graph")
        if threading.get_ident() != self._capture_thread:
            raise RuntimeError("capture_end must be called on the thread that called capture_begin")
        if self._cond_stack:
            n_open = len(self._cond_stack)
            self._abort_capture()
            raise RuntimeError(f"capture_end: {n_open} conditional body(ies) still open; call "
                               "end_capture_to_conditional_node() for each (the capture was discarded)")
        if current_stream_handle(self._device) != self._capture_stream:
            raise RuntimeError("capture_end: the current stream is not the capture stream "
                               "(a stream set inside the capture was not restored)")
        with nogil:
            r = cydriver.cuStreamEndCapture(self._capture_stream, &g)
        self._end_routing(False)
        try:
            if r != cydriver.CUDA_SUCCESS:
                if g != NULL:
                    cydriver.cuGraphDestroy(g)
                self._release()
                check(r)
            self._graph = g
            _live["graphs"] += 1
            try:
                with nogil:
                    check(cydriver.cuGraphGetNodes(g, NULL, &n))
                    check(cydriver.cuGraphInstantiate(&self._exec, g, 0))
                _live["execs"] += 1
                with nogil:
                    check(cydriver.cuGraphUpload(self._exec, self._capture_stream))
            except BaseException:
                self._release()
                raise
        finally:
            # only now may another capture take the stream: the upload was queued on it
            release_capture_side_stream(self._capture_stream_obj)
        self.num_nodes = n

    def _abort_capture(self):
        """End an open capture whatever state the driver left it in, and reset."""
        cdef Stream child
        while self._cond_stack:           # the allocator ends their routes with the capture's
            handle, kind, child, pred, parent, cid = self._cond_stack.pop()
            self._discard_capture(child._handle, False)
            release_capture_side_stream(child)
        if self._capturing:
            self._discard_capture(self._capture_stream)
            self._end_routing()
        self._release()

    # ------------------------------------------------------------ conditional nodes

    def _set_conditional_kernel(self, Function fn):
        self._set_cond_fn = fn

    cdef int _launch_set_conditional(self, cydriver.CUgraphConditionalHandle handle, uintptr_t pred,
                                     cydriver.CUstream stream) except -1:
        cdef Function fn = self._set_cond_fn
        cdef unsigned long long args[2]
        args[0] = handle
        args[1] = pred
        with nogil:
            fn.c_launch(1, 1, 1, 1, 1, 1, 0, stream, <const void*>args, sizeof(args))
        return 0

    cdef Stream _current_capture_stream(self):
        if self._cond_stack:
            return <Stream>self._cond_stack[len(self._cond_stack) - 1][2]
        return <Stream>self._capture_stream_obj

    def _begin_conditional(self, int kind, uintptr_t pred, object pred_owner):
        """Add an IF (kind 0) or WHILE (kind 1) node gated on the bool at
        ``pred`` and capture its body on a child stream (see DESIGN.md)."""
        cdef Stream cur, child
        cdef cydriver.CUstreamCaptureStatus status
        cdef cydriver.cuuint64_t cid = 0, child_cid = 0
        cdef cydriver.CUgraph graph = NULL
        cdef const cydriver.CUgraphNode* deps = NULL
        cdef const cydriver.CUgraphEdgeData* edges = NULL
        cdef size_t ndeps = 0
        cdef cydriver.CUgraphConditionalHandle handle = 0
        cdef cydriver.CUgraphNodeParams params
        cdef cydriver.CUgraphNode node = NULL
        cdef cydriver.CUgraph body = NULL
        cdef cydriver.CUcontext ctx
        if not self._capturing:
            raise RuntimeError("conditional nodes can only be added inside an open capture "
                               "(call capture_begin first)")
        if threading.get_ident() != self._capture_thread:
            raise RuntimeError("conditional nodes must be added on the thread that began the capture")
        if self._set_cond_fn is None:
            raise RuntimeError("internal: the set-conditional kernel was not provided")
        cur = self._current_capture_stream()
        if current_stream_handle(self._device) != cur._handle:
            raise RuntimeError("the current stream is not the capture stream of the innermost body")
        ctx = primary_context(self._device)
        with nogil:
            check(cydriver.cuStreamGetCaptureInfo(cur._handle, &status, &cid, &graph, NULL, NULL, NULL))
        if status != cydriver.CU_STREAM_CAPTURE_STATUS_ACTIVE:
            raise RuntimeError("the capture was invalidated by an earlier error; end it and capture again")
        with nogil:
            check(cydriver.cuGraphConditionalHandleCreate(&handle, graph, ctx, 0, 0))
        self._launch_set_conditional(handle, pred, cur._handle)
        with nogil:
            check(cydriver.cuStreamGetCaptureInfo(cur._handle, &status, &cid, &graph, &deps, &edges, &ndeps))
        memset(&params, 0, sizeof(params))
        params.type = cydriver.CU_GRAPH_NODE_TYPE_CONDITIONAL
        params.conditional.handle = handle
        params.conditional.type = (cydriver.CU_GRAPH_COND_TYPE_IF if kind == 0
                                   else cydriver.CU_GRAPH_COND_TYPE_WHILE)
        params.conditional.size = 1
        params.conditional.ctx = ctx
        with nogil:
            check(cydriver.cuGraphAddNode(&node, graph, deps, edges, ndeps, &params))
            check(cydriver.cuStreamUpdateCaptureDependencies(
                cur._handle, &node, NULL, 1, cydriver.CU_STREAM_SET_CAPTURE_DEPENDENCIES))
        body = params.conditional.phGraph_out[0]
        self._cond_nodes[<uintptr_t>node] = (kind, <uintptr_t>body, handle)
        child = capture_side_stream(self._device)
        try:
            with nogil:
                check(cydriver.cuStreamBeginCaptureToGraph(child._handle, body, NULL, NULL, 0,
                                                           <cydriver.CUstreamCaptureMode>self._mode))
            with nogil:
                check(cydriver.cuStreamGetCaptureInfo(child._handle, &status, &child_cid, NULL, NULL, NULL, NULL))
            _allocator(self._device).begin_body(self._capture_state, <uintptr_t>child._handle, child_cid)
        except BaseException:
            self._discard_capture(child._handle, False)
            release_capture_side_stream(child)
            raise
        self._cond_stack.append((handle, kind, child, pred, cur, child_cid))
        _keep_storage(self._keepalive_storages, pred_owner)   # replays read the predicate
        set_stream(child)

    def _end_conditional(self):
        """Close the innermost body; a WHILE body first re-samples its predicate."""
        cdef Stream child, parent
        cdef cydriver.CUgraph g = NULL
        cdef cydriver.CUresult r
        if not self._cond_stack:
            raise RuntimeError("end_capture_to_conditional_node: no conditional body is open")
        handle, kind, child, pred, parent, cid = self._cond_stack[len(self._cond_stack) - 1]
        if current_stream_handle(self._device) != child._handle:
            raise RuntimeError("end_capture_to_conditional_node: the current stream is not the body's stream")
        if kind == 1:
            self._launch_set_conditional(<cydriver.CUgraphConditionalHandle>handle, <uintptr_t>pred,
                                         child._handle)
        self._cond_stack.pop()
        with nogil:
            r = cydriver.cuStreamEndCapture(child._handle, &g)     # g is the node's body: not ours
        _allocator(self._device).end_body(self._capture_state)
        release_capture_side_stream(child)
        set_stream(parent)
        check(r)

    def _set_conditional(self, uintptr_t pred, object pred_owner):
        """Sample ``pred`` into the innermost node's handle now and make it the
        node's predicate."""
        cdef Stream child
        if not self._cond_stack:
            raise RuntimeError("set_conditional_handle_for_current_node: no conditional body is open")
        handle, kind, child, old, parent, cid = self._cond_stack[len(self._cond_stack) - 1]
        self._launch_set_conditional(<cydriver.CUgraphConditionalHandle>handle, pred,
                                     current_stream_handle(self._device))
        self._cond_stack[len(self._cond_stack) - 1] = (handle, kind, child, pred, parent, cid)
        _keep_storage(self._keepalive_storages, pred_owner)

    @property
    def conditional_depth(self):
        """How many conditional bodies are open in the capture (0 outside them)."""
        return len(self._cond_stack)

    # ------------------------------------------------------------ staging

    def _set_stage_kernels(self, fns):
        """[(capacity, Function)] of the multi-tensor copy kernel, smallest first."""
        self._stage_fns = list(fns)

    def stage_and_launch(self, static_inputs, inputs):
        """Copy each of ``inputs`` onto the matching static buffer, then replay.

        Contiguous pairs of one dtype, device and shape are staged by one
        multi-tensor copy kernel launch (a table of (src, dst, nbytes) in its
        parameters); any other pair goes through ``static.copy_(input)`` (casts,
        strides, broadcasting, host data). Everything is validated before
        anything is copied; copies and the launch are ordered on the current
        stream, the driver work runs without the GIL (cuGraphExecKernelNodeSetParams
        and one cuGraphLaunch when the staging kernel fits in front of the graph).

        Parameters
        ----------
        static_inputs : sequence of Tensor
            The tensors the capture read (its inputs).
        inputs : sequence of Tensor, array-like or number
            The new values, one per static input; each must broadcast to its
            static input's shape.
        """
        cdef Py_ssize_t n, k, nfast = 0, cap, pos, m
        cdef TensorBase st, src
        cdef int i
        cdef bint fast
        cdef cydriver.CUstream stream
        cdef Function fn
        cdef unsigned long long table[1 + 3 * 128]
        cdef vector[unsigned long long] fast_pairs     # (src, dst, nbytes) per fast pair
        cdef unsigned long long nbytes
        cdef unsigned int gx
        cdef list statics, sources
        if self._exec == NULL:
            self._replay_error()
        if self._stage_fns is None:
            self._set_stage_kernels(self._stage_kernels())     # compiled once, by the Python layer
        if not isinstance(static_inputs, (list, tuple)) or not isinstance(inputs, (list, tuple)):
            raise TypeError("stage_and_launch(static_inputs, inputs) takes two lists or tuples of tensors")
        n = len(static_inputs)
        if len(inputs) != n:
            raise ValueError(f"stage_and_launch: {n} static inputs but {len(inputs)} inputs")
        statics = static_inputs if type(static_inputs) is list else list(static_inputs)
        sources = inputs if type(inputs) is list else list(inputs)
        slow = None
        fast_pairs.reserve(3 * n)
        for k in range(n):
            s_obj = statics[k]
            i_obj = sources[k]
            if not isinstance(s_obj, TensorBase):
                raise TypeError(f"stage_and_launch: static_inputs[{k}] is a {type(s_obj).__name__}, not a tensor")
            st = <TensorBase>s_obj
            if st._device_type != DEVICE_CUDA or st._device_index != self._device:
                raise ValueError(f"stage_and_launch: static_inputs[{k}] must live on cuda:{self._device}")
            fast = False
            if isinstance(i_obj, TensorBase):
                src = <TensorBase>i_obj
                fast = (src._device_type == DEVICE_CUDA and src._device_index == self._device and
                        src._dtype_code == st._dtype_code and src._ndim == st._ndim and
                        st.c_is_contiguous() and src.c_is_contiguous())
                if fast:
                    for i in range(st._ndim):
                        if st._shape[i] != src._shape[i]:
                            fast = False
                            break
                if not fast:
                    _check_broadcast(src.shape, st, k)
            else:
                if i_obj is None or isinstance(i_obj, (str, bytes)) or not (
                        hasattr(i_obj, "shape") or hasattr(i_obj, "__len__") or isinstance(i_obj, (int, float))):
                    raise TypeError(f"stage_and_launch: inputs[{k}] is a {type(i_obj).__name__}, not a tensor")
                _check_broadcast(_shape_of(i_obj), st, k)
            if fast:
                nbytes = st.c_numel() * st._itemsize
                if nbytes:
                    fast_pairs.push_back(src._ptr)
                    fast_pairs.push_back(st._ptr)
                    fast_pairs.push_back(nbytes)
            else:
                if slow is None:
                    slow = []
                slow.append(k)
        if slow is not None:
            for k in slow:
                statics[k].copy_(sources[k])
        stream = current_stream_handle(self._device)
        if <uintptr_t>stream != self._last_replay_stream:
            self._note_replay_stream(<uintptr_t>stream)
        nfast = <Py_ssize_t>(fast_pairs.size() // 3)
        if 0 < nfast <= 128 and not self._staged_unavailable:
            fn, cap = self._stage_fn_for(nfast)
            gx = _fill_table(table, fast_pairs.data(), nfast, cap)
            if self._launch_staged(fn, cap, gx, <unsigned int>nfast, table, stream):
                return
        pos = 0
        while pos < nfast:             # more than 128 pairs, or no staged executable
            m = min(128, nfast - pos)
            fn, cap = self._stage_fn_for(m)
            gx = _fill_table(table, fast_pairs.data() + 3 * pos, m, cap)
            with nogil:
                fn.c_launch(gx, <unsigned int>m, 1, 256, 1, 1, 0, stream,
                            <const void*>table, sizeof(unsigned long long) * (1 + 3 * cap))
            pos += m
        with nogil:
            ensure_context(self._device)
            check(cydriver.cuGraphLaunch(self._exec, stream))

    cdef tuple _stage_fn_for(self, Py_ssize_t n):
        for cap_obj, f_obj in self._stage_fns:
            if cap_obj >= n:
                return f_obj, cap_obj
        raise RuntimeError("internal: no multi-copy kernel holds the table")

    cdef bint _launch_staged(self, Function fn, Py_ssize_t cap, unsigned int gx, unsigned int gy,
                             unsigned long long* table, cydriver.CUstream stream) except -1:
        """Set the staged copy node's table and launch the staged executable:
        one driver launch. False when this graph cannot have one (then the
        caller launches the copy and the graph separately)."""
        cdef cydriver.CUDA_KERNEL_NODE_PARAMS kp
        cdef size_t size = sizeof(unsigned long long) * (1 + 3 * cap)
        cdef void* extra[5]
        fill_launch_extra(extra, table, &size)
        memset(&kp, 0, sizeof(kp))
        kp.func = fn._handle
        kp.gridDimX = gx
        kp.gridDimY = gy
        kp.gridDimZ = 1
        kp.blockDimX = 256
        kp.blockDimY = 1
        kp.blockDimZ = 1
        kp.extra = extra
        if self._staged_cap != cap:
            if not self._build_staged(&kp, cap, stream):
                return False
        else:
            with nogil:
                ensure_context(self._device)
                check(cydriver.cuGraphExecKernelNodeSetParams(self._staged_exec, self._staged_node, &kp))
        with nogil:
            check(cydriver.cuGraphLaunch(self._staged_exec, stream))
        return True

    cdef bint _build_staged(self, cydriver.CUDA_KERNEL_NODE_PARAMS* kp, Py_ssize_t cap,
                            cydriver.CUstream stream) except -1:
        """Add the copy node in front of every root of the captured graph and
        instantiate that (the main executable stays as captured)."""
        cdef cydriver.CUgraphNode node = NULL
        cdef size_t nroots = 0
        cdef vector[cydriver.CUgraphNode] roots
        cdef vector[cydriver.CUgraphNode] froms
        cdef cydriver.CUresult r
        self._drop_staged()
        ensure_context(self._device)
        r = cydriver.cuGraphGetRootNodes(self._graph, NULL, &nroots)
        if r == cydriver.CUDA_SUCCESS:
            roots.resize(nroots if nroots else 1)
            r = cydriver.cuGraphGetRootNodes(self._graph, roots.data(), &nroots)
        if r == cydriver.CUDA_SUCCESS:
            r = cydriver.cuGraphAddKernelNode(&node, self._graph, NULL, 0, kp)
        if r == cydriver.CUDA_SUCCESS and nroots:
            froms.assign(nroots, node)
            r = cydriver.cuGraphAddDependencies(self._graph, froms.data(), roots.data(), NULL, nroots)
        if r == cydriver.CUDA_SUCCESS:
            self._staged_node = node
            r = cydriver.cuGraphInstantiate(&self._staged_exec, self._graph, 0)
        if r == cydriver.CUDA_SUCCESS:
            _live["execs"] += 1
            r = cydriver.cuGraphUpload(self._staged_exec, stream)
        if r != cydriver.CUDA_SUCCESS:
            # e.g. a graph kind the driver cannot extend: stage with two launches
            if node != NULL and self._staged_node == NULL:
                cydriver.cuGraphDestroyNode(node)
            self._drop_staged()
            self._staged_unavailable = True
            return False
        self._staged_cap = cap
        return True

    cdef void _drop_staged(self) noexcept:
        if self._staged_exec == NULL and self._staged_node == NULL:
            return
        try:
            ensure_context(self._device)
        except BaseException:          # no usable context (forked child): nothing to destroy with
            return
        if self._staged_exec != NULL:
            if cydriver.cuGraphExecDestroy(self._staged_exec) == cydriver.CUDA_SUCCESS:
                _live["execs"] -= 1
            self._staged_exec = NULL
        if self._staged_node != NULL:
            if self._graph != NULL:
                cydriver.cuGraphDestroyNode(self._staged_node)
            self._staged_node = NULL
        self._staged_cap = 0

    # ------------------------------------------------------------ introspection

    def _describe(self, bint detailed):
        """The captured graph as plain data (see CUDAGraph.describe)."""
        if self._graph == NULL:
            raise RuntimeError("describe: nothing captured (capture first; a reset graph has no nodes)")
        ensure_context(self._device)
        return _describe_graph(self._graph, detailed, self._cond_nodes, <uintptr_t>self._staged_node)

    # ------------------------------------------------------------ replay

    def replay(self, stream=None):
        """Launch the captured graph on the current stream, or on ``stream``, cuGraphLaunch.

        The GIL is released around the launch; the call does not wait for the
        graph to run. Graphs sharing a memory pool must replay in the order
        they were captured.

        Parameters
        ----------
        stream : Stream or stream-like, optional
            A stream of the graph's device; default the current stream.
        """
        cdef cydriver.CUstream s
        cdef Stream so
        if self._exec == NULL:
            self._replay_error()
        if stream is None:
            s = current_stream_handle(self._device)
        else:
            so = as_stream(stream, self._device)
            if so._device != self._device:
                raise ValueError(f"replay: the graph belongs to cuda:{self._device}, "
                                 f"the stream to cuda:{so._device}")
            s = so._handle
        if <uintptr_t>s != self._last_replay_stream:
            self._note_replay_stream(<uintptr_t>s)
        with nogil:
            ensure_context(self._device)
            check(cydriver.cuGraphLaunch(self._exec, s))

    cdef int _note_replay_stream(self, uintptr_t stream) except -1:
        if self._replay_streams is None:
            self._replay_streams = set()
        self._replay_streams.add(stream)
        self._last_replay_stream = stream
        return 0

    cdef int _replay_error(self) except -1:
        if self._capturing:
            raise RuntimeError("replay: the graph's capture is still open; call capture_end() first")
        if self._pid and self._pid != os.getpid():
            raise RuntimeError("replay: a CUDA graph cannot be replayed in a forked child process")
        raise RuntimeError("replay: nothing to replay; capture a graph first (or it was reset)")

    # ------------------------------------------------------------ lifetime

    cdef void _release(self) noexcept:
        self._drop_staged()
        self._staged_unavailable = False
        if self._exec != NULL:
            try:
                ensure_context(self._device)
                if cydriver.cuGraphExecDestroy(self._exec) == cydriver.CUDA_SUCCESS:
                    _live["execs"] -= 1
            except BaseException:
                pass
            self._exec = NULL
        if self._graph != NULL:
            try:
                if cydriver.cuGraphDestroy(self._graph) == cydriver.CUDA_SUCCESS:
                    _live["graphs"] -= 1
            except BaseException:
                pass
            self._graph = NULL
        # what replays may still be using is reused only after them
        streams = tuple(self._replay_streams) if self._replay_streams else ()
        self._replay_streams = None
        self._last_replay_stream = NO_STREAM
        if streams:
            for storage in self._keepalive_storages.values():
                for h in streams:
                    try:
                        storage.record_stream(h)
                    except BaseException:
                        pass
        if self._has_pool:
            try:
                _allocator(self._device).release_pool(self._pool_id, streams)
            except BaseException:
                pass
            self._has_pool = False
        self._keepalive_storages = {}
        self._cond_nodes = {}
        self.num_nodes = 0

    def _reset(self):
        self._abort_capture()

    def __dealloc__(self):
        if self._capturing:           # conditional bodies are open only inside a capture
            try:
                self._abort_capture()      # conditional bodies, the capture, routing, stream
            except BaseException:
                pass
        self._release()

    # ------------------------------------------------------------ state

    @property
    def _pool_id_(self):
        return self._pool_id if (self._has_pool or self._graph != NULL) else None

    @property
    def is_capturing(self):
        """True between ``capture_begin`` and ``capture_end``."""
        return self._capturing

    @property
    def exec_handle(self):
        """The CUgraphExec as an int (0 before capture_end); for interop and benchmarks."""
        return <uintptr_t>self._exec

    @property
    def is_instantiated(self):
        """True once the executable is built (after ``capture_end``, until ``reset``)."""
        return self._exec != NULL

    @property
    def capture_stream(self):
        """The stream of the open or the last capture (None before the first capture)."""
        return self._capture_stream_obj

    @property
    def device_index(self):
        """The index of the CUDA device the graph was captured on (-1 before a capture)."""
        return self._device

    @property
    def kept_storages(self):
        """Number of storages this graph keeps alive for its captured work."""
        return len(self._keepalive_storages)


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


cdef unsigned int _fill_table(unsigned long long* table, const unsigned long long* pairs,
                              Py_ssize_t n, Py_ssize_t cap) noexcept:
    """The multi-copy kernel's parameters: the count, then n (src, dst, nbytes)
    triples, zeros up to ``cap``; returns the grid's x size."""
    cdef Py_ssize_t k
    cdef unsigned long long maxbytes = 0
    table[0] = n
    memcpy(table + 1, pairs, sizeof(unsigned long long) * 3 * n)
    memset(table + 1 + 3 * n, 0, sizeof(unsigned long long) * 3 * (cap - n))
    for k in range(n):
        if pairs[3 * k + 2] > maxbytes:
            maxbytes = pairs[3 * k + 2]
    return <unsigned int>min(1024, max(1, (maxbytes + 4095) // 4096))


cdef dict _describe_graph(cydriver.CUgraph g, bint detailed, dict cond, uintptr_t hidden=0):
    """Nodes (kind, kernel name, attributes, conditional bodies) and edges of
    ``g``, read with cuGraphGetNodes / cuGraphNodeGetType / cuGraphGetEdges and
    the node-params getters."""
    cdef size_t n = 0, ne = 0, i, p, off, sz
    cdef vector[cydriver.CUgraphNode] nodes, froms, tos
    cdef vector[cydriver.CUgraphEdgeData] edata
    cdef cydriver.CUgraphNodeType t
    cdef cydriver.CUDA_KERNEL_NODE_PARAMS kp
    cdef cydriver.CUDA_MEMSET_NODE_PARAMS mp
    cdef cydriver.CUDA_MEMCPY3D cp
    cdef cydriver.CUDA_MEM_ALLOC_NODE_PARAMS ap
    cdef cydriver.CUevent ev
    cdef const char* cname = NULL
    check(cydriver.cuGraphGetNodes(g, NULL, &n))
    nodes.resize(n if n else 1)
    if n:
        check(cydriver.cuGraphGetNodes(g, nodes.data(), &n))
    for i in range(n):
        if hidden and <uintptr_t>nodes[i] == hidden:    # stage_and_launch's node is not captured work
            nodes.erase(nodes.begin() + i)
            n -= 1
            break
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
        elif t == cydriver.CU_GRAPH_NODE_TYPE_CONDITIONAL:
            info = cond.get(<uintptr_t>node)
            if info is not None:
                kind, body, handle = info
                d["type"] = "if" if kind == 0 else "while"
                if detailed:
                    attrs["handle"] = handle
                    attrs["conditional_type"] = d["type"]
                d["bodies"] = [_describe_graph(<cydriver.CUgraph><uintptr_t>body, detailed, cond)]
            else:
                d["type"] = "conditional"
                d["bodies"] = []
        out.append(d)
    check(cydriver.cuGraphGetEdges(g, NULL, NULL, NULL, &ne))
    edges = []
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
    return {"nodes": out, "edges": edges}


cdef tuple _shape_of(object obj):
    shp = getattr(obj, "shape", None)
    if shp is not None:
        return tuple(shp)
    if isinstance(obj, (int, float)):
        return ()
    import numpy
    return tuple(numpy.shape(obj))


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


def is_stream_capturing(uintptr_t stream, int device):
    """True while ``stream`` is capturing, cuStreamIsCapturing."""
    cdef cydriver.CUstreamCaptureStatus status
    with nogil:
        ensure_context(device)
        check(cydriver.cuStreamIsCapturing(<cydriver.CUstream>stream, &status))
    return status == cydriver.CU_STREAM_CAPTURE_STATUS_ACTIVE
