# SPDX-License-Identifier: Apache-2.0
"""CUDAGraphBase: owns the captured graph and its executable; capture
begin/end with allocator routing, conditional nodes, replay with the GIL
released. Staging lives in _stager, node introspection in _graph_nodes."""

cimport cython
from cuda.bindings cimport cydriver
from libc.stdint cimport uintptr_t
from libc.string cimport memset

from tensorplay._driver.context cimport (LIVE_EXECS, LIVE_GRAPHS, check, count_live, ensure_context,
                               get_current_device, primary_context, validate_device)
from tensorplay._graph.describe cimport describe_graph
from tensorplay._driver.launch cimport Function
from tensorplay._graph.rebind cimport Rebinder, make_rebinder
from tensorplay._graph.stager cimport Stager, make_stager
from tensorplay._driver.stream cimport Stream, as_stream, current_stream_handle, stream_wait_stream
from tensorplay._tensor.base cimport TensorBase

import os
import sys
import threading
import warnings

from tensorplay._memory.allocator import allocator as _allocator
from tensorplay._driver.context import set_open_capture_describer
from tensorplay._driver.stream import (capture_side_stream, current_stream, release_capture_side_stream,
                               set_stream)

cdef uintptr_t NO_STREAM = <uintptr_t>-1     # no replay yet (0 is the legacy default stream)

cdef int CAPTURE_GLOBAL = cydriver.CU_STREAM_CAPTURE_MODE_GLOBAL
cdef int CAPTURE_THREAD_LOCAL = cydriver.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
cdef int CAPTURE_RELAXED = cydriver.CU_STREAM_CAPTURE_MODE_RELAXED
CAPTURE_MODES = {"global": CAPTURE_GLOBAL, "thread_local": CAPTURE_THREAD_LOCAL,
                 "relaxed": CAPTURE_RELAXED}
cdef dict _MODE_NAMES = {v: k for k, v in CAPTURE_MODES.items()}
cdef int IF_NODE = 0               # one body (then) or two (then, else)
cdef int WHILE_NODE = 1
cdef int SWITCH_NODE = 2           # num_cases bodies, one per case
# The driver documents no upper bound for a SWITCH's size; this is ours (see
# CUDAGraph.begin_capture_to_switch_node), checked before any driver call.
MAX_SWITCH_CASES = 1024
CONDITIONAL_KINDS = {"if": IF_NODE, "while": WHILE_NODE, "switch": SWITCH_NODE}
cdef tuple _KIND_NAMES = ("IF", "WHILE", "SWITCH")

cdef dict _UPDATE_FAILURES = {
    cydriver.CU_GRAPH_EXEC_UPDATE_ERROR: "error",
    cydriver.CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED: "topology_changed",
    cydriver.CU_GRAPH_EXEC_UPDATE_ERROR_NODE_TYPE_CHANGED: "node_type_changed",
    cydriver.CU_GRAPH_EXEC_UPDATE_ERROR_FUNCTION_CHANGED: "function_changed",
    cydriver.CU_GRAPH_EXEC_UPDATE_ERROR_PARAMETERS_CHANGED: "parameters_changed",
    cydriver.CU_GRAPH_EXEC_UPDATE_ERROR_NOT_SUPPORTED: "not_supported",
    cydriver.CU_GRAPH_EXEC_UPDATE_ERROR_UNSUPPORTED_FUNCTION_CHANGE: "unsupported_function_change",
    cydriver.CU_GRAPH_EXEC_UPDATE_ERROR_ATTRIBUTES_CHANGED: "attributes_changed",
}

# Checking that no capture forbids this one and beginning it are one step, so
# two threads beginning captures get a clear error, not the driver's.
_begin_lock = threading.Lock()


# ---------------------------------------------------------------- open captures

@cython.final
cdef class OpenCapture:
    """What an error needs to say about an open capture. It refers to no
    graph: a graph dropped mid-capture dies, and its __dealloc__ ends the
    capture."""
    cdef readonly str graph
    cdef readonly int device
    cdef readonly uintptr_t stream
    cdef readonly int mode
    cdef readonly str thread
    cdef readonly unsigned long thread_id
    cdef readonly str site

    def sentence(self):
        return (f"{self.graph} is capturing in '{_MODE_NAMES.get(self.mode, self.mode)}' mode on stream "
                f"{self.stream:#x} of cuda:{self.device} in thread {self.thread!r}, since capture_begin at "
                f"{self.site}; end it with capture_end() (or reset()) on that thread, or use "
                f"capture_error_mode='thread_local' for captures that overlap")


cdef dict _open_captures = {}        # id(graph) -> OpenCapture


def _describe_open_captures():
    return " ".join(c.sentence() for c in list(_open_captures.values()))


set_open_capture_describer(_describe_open_captures)


def open_captures():
    """The open captures of this process (OpenCapture records)."""
    return list(_open_captures.values())


cdef str _call_site():
    """file:line (function) of the nearest caller outside tensorplay."""
    f = sys._getframe(1)
    while f is not None and f.f_globals.get("__name__", "").partition(".")[0] == "tensorplay":
        f = f.f_back
    if f is None:
        return "an unknown place"
    return f"{f.f_code.co_filename}:{f.f_lineno} ({f.f_code.co_name})"


cdef OpenCapture _forbidding():
    """An open capture that forbids beginning another: one in global mode
    (any other thread's unsafe call would invalidate it)."""
    for c in _open_captures.values():
        if (<OpenCapture>c).mode == CAPTURE_GLOBAL:
            return <OpenCapture>c
    return None


# ---------------------------------------------------------------- conditional bodies

@cython.final
cdef class ConditionalFrame:
    """An open conditional node: its handle and kind, its body graphs, the
    stream the open body is captured on (None between the branches of an
    IF/ELSE or the cases of a SWITCH), which branch is open and the lowest
    that may be begun next, the predicate (or index) it samples, and the
    stream to return to."""
    cdef cydriver.CUgraphConditionalHandle handle
    cdef int kind
    cdef uintptr_t node
    cdef list bodies                # the node's body CUgraphs as ints, in branch order
    cdef Stream body
    cdef Stream parent
    cdef uintptr_t pred
    cdef str index_dtype            # a SWITCH's index dtype (None: a bool predicate)
    cdef int branch                 # the open branch (-1: none)
    cdef int next_branch            # branches below this one were begun already


cdef int _keep_storage(dict keep, object t) except -1:
    if isinstance(t, TensorBase):
        st = (<TensorBase>t)._storage
        if st is not None:
            keep[id(st)] = st
    return 0


# no_gc_clear: __dealloc__ ends an open capture and restores the stream it
# replaced, so the collector must not set those fields to None first.
@cython.no_gc_clear
cdef class CUDAGraphBase:
    """The compiled half of tensorplay._graph.graphs.CUDAGraph (see there).

    ``kernels`` gives what this layer launches or calls but does not own:
    ``set_conditional(device)`` and ``multi_copy(capacity, device)`` return
    loaded kernels, ``copy(static, source)`` copies one input onto a static
    input (casts, strides, host data)."""

    cdef cydriver.CUgraph _graph
    cdef cydriver.CUgraphExec _exec
    cdef cydriver.CUstream _capture_stream
    cdef readonly int _device
    cdef long long _pool_id
    cdef bint _has_pool
    cdef bint _capturing
    cdef object _capture_stream_obj
    cdef object _reserved_side       # the side stream capture_begin reserved, until it succeeds
    cdef object _prev_stream
    cdef unsigned long _capture_thread
    cdef int _pid
    cdef readonly size_t num_nodes
    """The number of nodes of the captured graph, cuGraphGetNodes (0 before a capture ends)."""
    cdef object _kernels
    cdef list _cond_stack           # [ConditionalFrame], innermost last
    cdef Function _set_cond_fn
    cdef dict _set_switch_fns       # index dtype -> the set-switch kernel
    cdef dict _cond_nodes           # conditional node -> (kind, [body graphs], handle), for describe()
    cdef dict _keepalive_storages   # id -> storage from outside the pool that the captured work uses
    cdef object _capture_state      # the allocator's CaptureState while capturing
    cdef uintptr_t _last_replay_stream
    cdef set _replay_streams        # streams replayed on: kept memory is reused only after them
    cdef int _mode
    cdef Stager _stager             # stage_and_launch's, for the last static inputs
    cdef Rebinder _rebinder         # rebind_and_launch's, for the last static tensors
    # A re-capture's predecessor, held until capture_end has a new executable:
    # its CUgraph, executable (the one cuGraphExecUpdate updates), kept
    # storages and pool hold.
    cdef cydriver.CUgraph _old_graph
    cdef cydriver.CUgraphExec _old_exec
    cdef cydriver.CUgraph _old_exec_graph
    # The graph the executable was instantiated from when an in-place update
    # has since replaced _graph (NULL: _graph): its nodes stay the ones that
    # cuGraphExec*SetParams knows the executable's nodes by.
    cdef cydriver.CUgraph _exec_graph
    cdef dict _old_keepalive
    cdef long long _old_pool_id
    cdef bint _old_has_pool
    cdef object _update_result      # None, "success" or why cuGraphExecUpdate failed
    cdef object __weakref__

    def __cinit__(self, *args, **kwargs):
        self._graph = NULL
        self._exec = NULL
        self._old_graph = NULL
        self._old_exec = NULL
        self._old_exec_graph = NULL
        self._exec_graph = NULL
        self._old_has_pool = False
        self._capture_stream = NULL
        self._device = -1
        self._has_pool = False
        self._capturing = False
        self._cond_stack = []
        self._cond_nodes = {}
        self._set_switch_fns = {}
        self._keepalive_storages = {}
        self._last_replay_stream = NO_STREAM

    def __init__(self, kernels):
        self._kernels = kernels

    # ------------------------------------------------------------ capture

    def _capture_begin(self, long long pool_id, int mode, stream):
        """Begin capturing on ``stream`` (None: a side stream of the current
        device) into pool ``pool_id``, cuStreamBeginCapture."""
        cdef OpenCapture other
        if self._capturing:
            raise RuntimeError("capture_begin: this graph is already capturing")
        if self._kernels is None:
            raise RuntimeError("capture_begin: the graph was not initialised (a subclass of CUDAGraph "
                               "must call super().__init__())")
        site = _call_site()
        with _begin_lock:
            other = _forbidding()
            if other is not None:
                raise RuntimeError(f"capture_begin: another capture forbids a new one: {other.sentence()}")
            self._begin_locked(pool_id, mode, stream)
            self._register_open(site)

    cdef int _register_open(self, str site) except -1:
        cdef OpenCapture c = OpenCapture.__new__(OpenCapture)
        c.graph = f"CUDAGraph at {id(self):#x}"
        c.device = self._device
        c.stream = <uintptr_t>self._capture_stream
        c.mode = self._mode
        c.thread = threading.current_thread().name
        c.thread_id = self._capture_thread
        c.site = site
        _open_captures[id(self)] = c
        return 0

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
        cdef cydriver.CUstream prev, replayed
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
        if (self._exec != NULL or self._graph != NULL) and dev != self._device:
            raise ValueError(f"capture_begin: this graph holds a graph of cuda:{self._device}; a re-capture "
                             f"must be on the same device (or call reset() first), not cuda:{dev}")
        if self._replay_streams and (self._exec != NULL or self._graph != NULL):
            # a re-capture reuses the previous capture's pool: its replays queued
            # on other streams must be done before the new work may take that memory
            for h in self._replay_streams:
                replayed = <cydriver.CUstream><uintptr_t>h
                with nogil:
                    check(cydriver.cuStreamSynchronize(replayed))
        if self._exec != NULL or self._graph != NULL:
            # destroying the stager's executable inside a global capture would
            # invalidate it (an unsafe call): drop it before the capture opens;
            # the rebinder's nodes are the old graph's (the update resets them)
            self._drop_stager()
            self._drop_rebinder()
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
            _discard_capture(s._handle)
            raise
        if self._exec != NULL or self._graph != NULL:
            self._hold_previous()
        self._device = dev
        self._pool_id = pool_id
        self._has_pool = True
        self._capture_stream = s._handle
        self._capture_stream_obj = s
        self._prev_stream = prev_obj
        self._capture_thread = threading.get_ident()
        self._pid = os.getpid()
        self._capturing = True
        self._mode = mode
        set_stream(s)
        return 0

    cdef int _end_routing(self, bint release_stream=True) except -1:
        """Stop routing allocations; keep the storages from outside the pool
        that the capture used; restore the current stream (on the capture's
        thread: another thread's current stream is not ours to set); give a
        reserved side stream back unless the caller still queues work on it
        (capture_end uploads there first)."""
        state = self._capture_state
        self._capture_state = None
        _open_captures.pop(id(self), None)
        if state is not None:
            self._keepalive_storages.update(_allocator(self._device).end_capture(state))
        if self._prev_stream is not None and threading.get_ident() == self._capture_thread:
            set_stream(self._prev_stream)
        self._prev_stream = None
        self._capturing = False
        if release_stream:
            release_capture_side_stream(self._capture_stream_obj)
        return 0

    def _capture_end(self):
        """End the capture (cuStreamEndCapture), then update the previous
        executable with the new graph (cuGraphExecUpdate) or, with none or when
        the update fails, instantiate one (cuGraphInstantiate); upload it
        (cuGraphUpload)."""
        cdef cydriver.CUgraph g = NULL
        cdef cydriver.CUresult r
        cdef size_t n = 0
        if not self._capturing:
            raise RuntimeError("capture_end: no capture is open on this graph")
        if threading.get_ident() != self._capture_thread:
            raise RuntimeError(f"capture_end must be called on the thread that called capture_begin "
                               f"({_open_captures[id(self)].thread!r})")
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
            count_live(LIVE_GRAPHS, 1)
            try:
                with nogil:
                    check(cydriver.cuGraphGetNodes(g, NULL, &n))
                if self._old_exec != NULL and self._update_previous(g):
                    self._exec = self._old_exec          # updated in place: the same handle
                    self._old_exec = NULL
                    if self._old_exec_graph != NULL:     # the graph it was instantiated from stays
                        self._exec_graph = self._old_exec_graph
                        self._old_exec_graph = NULL
                    else:
                        self._exec_graph = self._old_graph
                        self._old_graph = NULL
                else:
                    if self._old_exec == NULL:
                        self._update_result = None
                    # instantiated before the old one is destroyed, so a fallback
                    # never hands out the old handle again
                    with nogil:
                        check(cydriver.cuGraphInstantiate(&self._exec, g, 0))
                    count_live(LIVE_EXECS, 1)
                with nogil:
                    check(cydriver.cuGraphUpload(self._exec, self._capture_stream))
                self._retire_previous()
            except BaseException:
                self._release()
                raise
        finally:
            # only now may another capture take the stream: the upload was queued on it
            release_capture_side_stream(self._capture_stream_obj)
        self.num_nodes = n

    cdef int _hold_previous(self) except -1:
        """Set the captured graph aside while a re-capture is open: its
        executable may still be updated; its stager (built on a clone of the
        old graph) was dropped before the capture opened; node records are dropped."""
        self._old_graph = self._graph
        self._old_exec = self._exec
        self._old_keepalive = self._keepalive_storages
        self._old_pool_id = self._pool_id
        self._old_has_pool = self._has_pool
        self._old_exec_graph = self._exec_graph
        self._graph = NULL
        self._exec = NULL
        self._exec_graph = NULL
        self._keepalive_storages = {}
        self._has_pool = False
        self._cond_nodes = {}
        self.num_nodes = 0
        return 0

    cdef int _update_previous(self, cydriver.CUgraph g) except -1:
        """cuGraphExecUpdate the previous executable to ``g``; False (with the
        reason in update_result) when the driver refuses, and the caller
        instantiates instead."""
        cdef cydriver.CUgraphExecUpdateResultInfo info
        cdef cydriver.CUresult r
        memset(&info, 0, sizeof(info))
        with nogil:
            r = cydriver.cuGraphExecUpdate(self._old_exec, g, &info)
        if r == cydriver.CUDA_SUCCESS and info.result == cydriver.CU_GRAPH_EXEC_UPDATE_SUCCESS:
            self._update_result = "success"
            return 1
        # any refusal (CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE, or an older driver's
        # NOT_SUPPORTED for a node kind) means: instantiate; a broken context
        # fails there, checked
        self._update_result = _UPDATE_FAILURES.get(<int>info.result, "error")
        return 0

    cdef void _retire_previous(self) noexcept:
        """Destroy what a re-capture set aside (its executable too unless it
        was updated in place); its kept storages and pool memory are reused
        only after the replays already queued."""
        if self._old_exec != NULL:
            try:
                ensure_context(self._device)
                if cydriver.cuGraphExecDestroy(self._old_exec) == cydriver.CUDA_SUCCESS:
                    count_live(LIVE_EXECS, -1)
            except BaseException:
                pass
            self._old_exec = NULL
        _destroy_graph(&self._old_graph)
        _destroy_graph(&self._old_exec_graph)
        streams = tuple(self._replay_streams) if self._replay_streams else ()
        if self._old_keepalive and streams:
            for storage in self._old_keepalive.values():
                for h in streams:
                    try:
                        storage.record_stream(h)
                    except BaseException:
                        pass
        self._old_keepalive = None
        if self._old_has_pool:
            try:
                _allocator(self._device).release_pool(self._old_pool_id, streams)
            except BaseException:
                pass
            self._old_has_pool = False

    def _abort_capture(self):
        """End an open capture whatever state the driver left it in, and reset."""
        cdef ConditionalFrame frame
        while self._cond_stack:           # the allocator ends their routes with the capture's
            frame = self._cond_stack.pop()
            if frame.body is not None:
                _discard_capture(frame.body._handle, False)
                release_capture_side_stream(frame.body)
                frame.body = None
        if self._capturing:
            _discard_capture(self._capture_stream)
            self._end_routing()
        self._release()

    # ------------------------------------------------------------ conditional nodes

    cdef int _launch_set_conditional(self, ConditionalFrame frame, uintptr_t pred,
                                     cydriver.CUstream stream) except -1:
        """Queue the one-thread kernel that copies ``*pred`` into the node's
        handle: a bool for IF and WHILE, an integer index (out of range mapped
        to num_cases, no body) for SWITCH."""
        cdef unsigned long long args[3]
        cdef Function fn = self._set_kernel_for(frame.kind, frame.index_dtype)
        cdef size_t nargs = 2
        if frame.kind == SWITCH_NODE:
            args[2] = len(frame.bodies)
            nargs = 3
        args[0] = frame.handle
        args[1] = pred
        with nogil:
            fn.c_launch(1, 1, 1, 1, 1, 1, 0, stream, <const void*>args, nargs * sizeof(unsigned long long))
        return 0

    cdef Stream _current_capture_stream(self):
        if self._cond_stack:
            return (<ConditionalFrame>self._cond_stack[len(self._cond_stack) - 1]).body
        return <Stream>self._capture_stream_obj

    cdef int _check_capture_thread(self, str what) except -1:
        if not self._capturing:
            raise RuntimeError(f"{what}: no capture is open on this graph (call capture_begin first)")
        if threading.get_ident() != self._capture_thread:
            raise RuntimeError(f"{what} must be called on the thread that began the capture")
        return 0

    cdef ConditionalFrame _innermost(self):
        if self._cond_stack:
            return <ConditionalFrame>self._cond_stack[len(self._cond_stack) - 1]
        return None

    cdef int _check_between_branches(self, ConditionalFrame frame, str what) except -1:
        """Refuse work on a node none of whose branches is open."""
        if frame is not None and frame.body is None:
            first = ("begin_capture_to_switch_case(k)" if frame.kind == SWITCH_NODE
                     else "begin_capture_to_else_branch()")
            raise RuntimeError(f"{what}: no branch of the innermost {_KIND_NAMES[frame.kind]} node is open; "
                               f"begin one with {first} first")
        return 0

    def _begin_conditional(self, int kind, uintptr_t pred, object pred_owner, unsigned int num_bodies=1,
                           bint open_first=True, str index_dtype=None):
        """Add an IF (kind 0, one or two bodies), WHILE (kind 1) or SWITCH
        (kind 2, ``num_bodies`` cases) node gated on the value at ``pred``
        (a bool, or for a SWITCH an integer of ``index_dtype``); capture its
        first body on a child stream when ``open_first`` (see DESIGN.md)."""
        cdef Stream cur
        cdef cydriver.CUstreamCaptureStatus status
        cdef cydriver.cuuint64_t cid = 0
        cdef cydriver.CUgraph graph = NULL
        cdef cydriver.CUgraphConditionalHandle handle = 0
        cdef cydriver.CUcontext ctx
        what = {IF_NODE: "begin_capture_to_if_node", WHILE_NODE: "begin_capture_to_while_node",
                SWITCH_NODE: "begin_capture_to_switch_node"}.get(kind)
        if what is None:
            raise ValueError(f"unknown conditional node kind {kind}")
        self._check_capture_thread(what)
        if not (kind == SWITCH_NODE and 1 <= num_bodies <= MAX_SWITCH_CASES
                or kind == IF_NODE and 1 <= num_bodies <= 2 or kind == WHILE_NODE and num_bodies == 1):
            raise ValueError(f"{what}: a {_KIND_NAMES[kind]} node cannot have {num_bodies} bodies")
        if (kind == SWITCH_NODE) != (index_dtype is not None):
            raise TypeError(f"{what}: a SWITCH samples an integer index, IF and WHILE a bool")
        self._check_between_branches(self._innermost(), what)
        cur = self._current_capture_stream()
        if current_stream_handle(self._device) != cur._handle:
            raise RuntimeError("the current stream is not the capture stream of the innermost body")
        ctx = primary_context(self._device)
        with nogil:
            check(cydriver.cuStreamGetCaptureInfo(cur._handle, &status, &cid, &graph, NULL, NULL, NULL))
        if status != cydriver.CU_STREAM_CAPTURE_STATUS_ACTIVE:
            raise RuntimeError("the capture was invalidated by an earlier error; end it and capture again")
        self._set_kernel_for(kind, index_dtype)       # loaded first: a failure here leaves no trace
        with nogil:
            check(cydriver.cuGraphConditionalHandleCreate(&handle, graph, ctx, 0, 0))
        try:
            self._add_conditional_node(handle, kind, pred, pred_owner, num_bodies, open_first, index_dtype,
                                       cur, ctx)
        except BaseException:
            # a handle, and maybe a node, the capture cannot lose again: it is discarded
            self._abort_capture()
            raise

    cdef int _add_conditional_node(self, cydriver.CUgraphConditionalHandle handle, int kind, uintptr_t pred,
                                   object pred_owner, unsigned int num_bodies, bint open_first,
                                   str index_dtype, Stream cur, cydriver.CUcontext ctx) except -1:
        cdef cydriver.CUstreamCaptureStatus status
        cdef cydriver.cuuint64_t cid = 0
        cdef cydriver.CUgraph graph = NULL
        cdef const cydriver.CUgraphNode* deps = NULL
        cdef const cydriver.CUgraphEdgeData* edges = NULL
        cdef size_t ndeps = 0
        cdef cydriver.CUgraphNodeParams params
        cdef cydriver.CUgraphNode node = NULL
        cdef ConditionalFrame frame
        cdef unsigned int k
        frame = ConditionalFrame.__new__(ConditionalFrame)
        frame.handle = handle
        frame.kind = kind
        frame.bodies = [0] * num_bodies       # read from the node below; sizes the SWITCH kernel's bound
        frame.parent = cur
        frame.pred = pred
        frame.index_dtype = index_dtype
        frame.branch = -1
        frame.next_branch = 0
        self._launch_set_conditional(frame, pred, cur._handle)
        with nogil:
            check(cydriver.cuStreamGetCaptureInfo(cur._handle, &status, &cid, &graph, &deps, &edges, &ndeps))
        memset(&params, 0, sizeof(params))
        params.type = cydriver.CU_GRAPH_NODE_TYPE_CONDITIONAL
        params.conditional.handle = handle
        params.conditional.type = (cydriver.CU_GRAPH_COND_TYPE_IF if kind == IF_NODE
                                   else cydriver.CU_GRAPH_COND_TYPE_WHILE if kind == WHILE_NODE
                                   else cydriver.CU_GRAPH_COND_TYPE_SWITCH)
        params.conditional.size = num_bodies
        params.conditional.ctx = ctx
        with nogil:
            check(cydriver.cuGraphAddNode(&node, graph, deps, edges, ndeps, &params))
            check(cydriver.cuStreamUpdateCaptureDependencies(
                cur._handle, &node, NULL, 1, cydriver.CU_STREAM_SET_CAPTURE_DEPENDENCIES))
        for k in range(num_bodies):
            frame.bodies[k] = <uintptr_t>params.conditional.phGraph_out[k]
        frame.node = <uintptr_t>node
        self._cond_nodes[<uintptr_t>node] = (kind, list(frame.bodies), handle)
        _keep_storage(self._keepalive_storages, pred_owner)   # replays read the predicate
        if open_first:
            self._open_branch(frame, 0)
        self._cond_stack.append(frame)
        return 0

    cdef Function _set_kernel_for(self, int kind, str index_dtype):
        """The set-conditional kernel of a node kind (loaded once per graph)."""
        cdef Function fn
        if kind == SWITCH_NODE:
            fn = self._set_switch_fns.get(index_dtype)
            if fn is None:
                fn = self._kernels.set_switch(index_dtype, self._device)
                self._set_switch_fns[index_dtype] = fn
            return fn
        if self._set_cond_fn is None:
            self._set_cond_fn = self._kernels.set_conditional(self._device)
        return self._set_cond_fn

    cdef int _open_branch(self, ConditionalFrame frame, int k) except -1:
        """Capture body ``k`` of ``frame``'s node on a child stream, which
        becomes the current stream; the allocator treats it as a body of its
        own (blocks from before it, freed inside it, wait until it ends)."""
        cdef Stream child
        cdef cydriver.CUstreamCaptureStatus status
        cdef cydriver.cuuint64_t child_cid = 0
        cdef cydriver.CUgraph body = <cydriver.CUgraph><uintptr_t>frame.bodies[k]
        child = capture_side_stream(self._device)
        try:
            with nogil:
                check(cydriver.cuStreamBeginCaptureToGraph(child._handle, body, NULL, NULL, 0,
                                                           <cydriver.CUstreamCaptureMode>self._mode))
            with nogil:
                check(cydriver.cuStreamGetCaptureInfo(child._handle, &status, &child_cid, NULL, NULL, NULL, NULL))
            _allocator(self._device).begin_body(self._capture_state, <uintptr_t>child._handle, child_cid)
        except BaseException:
            _discard_capture(child._handle, False)
            release_capture_side_stream(child)
            raise
        frame.body = child
        frame.branch = k
        frame.next_branch = k + 1
        set_stream(child)
        return 0

    cdef int _close_branch(self, ConditionalFrame frame) except -1:
        """End the capture of ``frame``'s open body; its parent's stream is
        current again. A WHILE body first re-samples its predicate."""
        cdef cydriver.CUgraph g = NULL
        cdef cydriver.CUresult r
        cdef Stream body = frame.body
        if frame.kind == WHILE_NODE:
            self._launch_set_conditional(frame, frame.pred, body._handle)
        with nogil:
            r = cydriver.cuStreamEndCapture(body._handle, &g)     # g is the node's body: not ours
        frame.body = None
        frame.branch = -1
        _allocator(self._device).end_body(self._capture_state)
        release_capture_side_stream(body)
        set_stream(frame.parent)
        if r != cydriver.CUDA_SUCCESS:
            self._abort_capture()        # the body lacks work the caller queued: nothing to mend
            check(r)
        return 0

    cdef int _check_parent_untouched(self, ConditionalFrame frame, str what) except -1:
        """Between branches the parent's stream is current, but work queued
        there would land after the node, in no branch: refuse it (and discard
        the capture, which cannot be mended)."""
        cdef cydriver.CUstreamCaptureStatus status
        cdef cydriver.cuuint64_t cid = 0
        cdef const cydriver.CUgraphNode* deps = NULL
        cdef const cydriver.CUgraphEdgeData* edges = NULL
        cdef size_t ndeps = 0
        cdef cydriver.CUresult r
        with nogil:
            r = cydriver.cuStreamGetCaptureInfo(frame.parent._handle, &status, &cid, NULL, &deps, &edges, &ndeps)
        if r == cydriver.CUDA_SUCCESS and status == cydriver.CU_STREAM_CAPTURE_STATUS_ACTIVE and ndeps == 1 \
                and <uintptr_t>deps[0] == frame.node:
            return 0
        self._abort_capture()
        check(r)
        if status != cydriver.CU_STREAM_CAPTURE_STATUS_ACTIVE:
            raise RuntimeError(f"{what}: the capture was invalidated by an earlier error (it was discarded); "
                               f"capture again")
        raise RuntimeError(f"{what}: work was queued between the branches of a {_KIND_NAMES[frame.kind]} node "
                           f"(after one ended, before the next began), so it would run after the node in no "
                           f"branch; the capture was discarded")

    def _begin_branch(self, int kind, int k, str what):
        """End the open branch of the innermost IF/ELSE or SWITCH node, if
        any, and begin capturing its branch ``k`` (IF/ELSE: 0 then, 1 else;
        SWITCH: the case). Branches begin in increasing order, each once."""
        cdef ConditionalFrame frame = self._innermost()
        if frame is None:
            self._check_capture_thread(what)
            raise RuntimeError(f"{what}: no conditional node is open")
        self._check_capture_thread(what)
        if frame.kind != kind or len(frame.bodies) < 2 and kind == IF_NODE:
            if kind == IF_NODE:
                has = ("an IF node without an else body (open it with begin_capture_to_if_node(pred, "
                       "with_else=True))" if frame.kind == IF_NODE else f"a {_KIND_NAMES[frame.kind]} node")
                raise RuntimeError(f"{what}: the innermost open conditional node is {has}, not an IF/ELSE")
            raise RuntimeError(f"{what}: the innermost open conditional node is "
                               f"{'an' if frame.kind == IF_NODE else 'a'} {_KIND_NAMES[frame.kind]} node, "
                               f"not a SWITCH")
        n = len(frame.bodies)
        if k < 0 or k >= n:
            raise ValueError(f"{what}: case {k} is out of range for a SWITCH of {n} cases" if kind == SWITCH_NODE
                             else f"{what}: an IF/ELSE has branches 0 (then) and 1 (else), not {k}")
        if k < frame.next_branch:
            if kind == IF_NODE:
                raise RuntimeError(f"{what}: the {'else' if k == 1 else 'then'} branch of this IF/ELSE was "
                                   f"already begun" + (" (else comes after then, once)" if k == 0 else ""))
            raise RuntimeError(f"{what}: case {k} cannot begin: cases begin in increasing order, each once, "
                               f"and case {frame.next_branch - 1} was begun already")
        expected = frame.body if frame.body is not None else frame.parent
        if current_stream_handle(self._device) != expected._handle:
            raise RuntimeError(f"{what}: the current stream is not the capture stream of the innermost body "
                               f"(a stream set inside it was not restored)")
        if frame.body is not None:
            self._close_branch(frame)
        else:
            self._check_parent_untouched(frame, what)
        self._open_branch(frame, k)

    def _end_branch(self):
        """End the open branch of the innermost IF/ELSE or SWITCH node, keeping
        the node open (the structured form's branch exit)."""
        cdef ConditionalFrame frame = self._innermost()
        self._check_capture_thread("end of a branch")
        if frame is None or frame.body is None or len(frame.bodies) < 2 and frame.kind != SWITCH_NODE:
            raise RuntimeError("end of a branch: no branch of an IF/ELSE or SWITCH node is open")
        if current_stream_handle(self._device) != frame.body._handle:
            raise RuntimeError("end of a branch: the current stream is not the branch's stream "
                               "(a stream set inside it was not restored)")
        self._close_branch(frame)

    def _end_conditional(self):
        """Close the innermost node: its open body (a WHILE body first
        re-samples its predicate); branches never begun stay empty."""
        cdef ConditionalFrame frame = self._innermost()
        if frame is None:
            raise RuntimeError("end_capture_to_conditional_node: no conditional body is open")
        self._check_capture_thread("end_capture_to_conditional_node")
        if frame.body is not None:
            if current_stream_handle(self._device) != frame.body._handle:
                raise RuntimeError("end_capture_to_conditional_node: the current stream is not the body's stream")
            self._close_branch(frame)     # a failure keeps the frame (body None) for the abort
            self._cond_stack.pop()
            return
        if current_stream_handle(self._device) != frame.parent._handle:
            raise RuntimeError("end_capture_to_conditional_node: the current stream is not the capture stream "
                               "of the node's parent (a stream set inside it was not restored)")
        self._check_parent_untouched(frame, "end_capture_to_conditional_node")
        self._cond_stack.pop()

    def _set_conditional(self, uintptr_t pred, object pred_owner, str index_dtype=None):
        """Sample ``pred`` into the innermost node's handle now and make it the
        node's predicate (a SWITCH's: an integer index of ``index_dtype``)."""
        cdef ConditionalFrame frame = self._innermost()
        if frame is None:
            raise RuntimeError("set_conditional_handle_for_current_node: no conditional body is open")
        self._check_capture_thread("set_conditional_handle_for_current_node")
        self._check_between_branches(frame, "set_conditional_handle_for_current_node")
        if (frame.kind == SWITCH_NODE) != (index_dtype is not None):
            raise TypeError("set_conditional_handle_for_current_node: the innermost node is "
                            + ("a SWITCH: pass a one-element CUDA integer tensor" if frame.kind == SWITCH_NODE
                               else f"{'an' if frame.kind == IF_NODE else 'a'} {_KIND_NAMES[frame.kind]} node: "
                                    "pass a one-element CUDA bool tensor"))
        if current_stream_handle(self._device) != frame.body._handle:
            raise RuntimeError("set_conditional_handle_for_current_node: the current stream is not the body's "
                               "stream")
        if index_dtype is not None and index_dtype != frame.index_dtype:
            frame.index_dtype = index_dtype
        self._launch_set_conditional(frame, pred, frame.body._handle)
        frame.pred = pred
        _keep_storage(self._keepalive_storages, pred_owner)

    @property
    def _innermost_conditional(self):
        """(kind name, number of bodies, open branch or -1, node as an int) of
        the innermost open conditional node, or None."""
        cdef ConditionalFrame frame = self._innermost()
        if frame is None:
            return None
        return (("if", "while", "switch")[frame.kind], len(frame.bodies), frame.branch, frame.node)

    @property
    def conditional_depth(self):
        """How many conditional bodies are open in the capture (0 outside them)."""
        return len(self._cond_stack)

    # ------------------------------------------------------------ replay and staging

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
        if self._rebinder is not None and self._rebinder.rebound:
            self._rebinder.restore()        # replay() reads the static tensors
        with nogil:
            ensure_context(self._device)
            check(cydriver.cuGraphLaunch(self._exec, s))

    def stage_and_launch(self, static_inputs, inputs):
        """Copy each of ``inputs`` onto the matching static buffer, then replay.

        Contiguous pairs of one dtype, device and shape are staged by one
        multi-tensor copy kernel (a table of (src, dst, nbytes) in its
        parameters, up to 128 pairs) that runs as the first node of a
        second executable of the graph; any other pair goes through
        ``static.copy_(input)`` (casts, strides, broadcasting, host data).
        Everything is validated before anything is copied; copies and the
        launch are ordered on the current stream. The per-call driver work
        (cuGraphExecKernelNodeSetParams and one cuGraphLaunch) runs without
        the GIL. The staged executable is built at the first call for a list
        of static inputs and kept while the same tensors are passed.
        A graph with conditional nodes (which the driver cannot clone)
        launches the copy kernel and then the graph.

        Parameters
        ----------
        static_inputs : sequence of Tensor
            The tensors the capture read (its inputs).
        inputs : sequence of Tensor, array-like or number
            The new values, one per static input; each must broadcast to its
            static input's shape.
        """
        cdef cydriver.CUstream stream
        cdef Stager stager = self._stager
        if self._exec == NULL:
            self._replay_error()
        stream = current_stream_handle(self._device)
        if stager is None or not stager.holds(static_inputs):
            if not isinstance(static_inputs, (list, tuple)) or not isinstance(inputs, (list, tuple)):
                raise TypeError("stage_and_launch(static_inputs, inputs) takes two lists or tuples of tensors")
            if len(inputs) != len(static_inputs):
                raise ValueError(f"stage_and_launch: {len(static_inputs)} static inputs but "
                                 f"{len(inputs)} inputs")
            self._drop_stager()
            stager = make_stager(self._graph, self._exec, self._device, static_inputs, not self._cond_nodes,
                                 self._kernels.multi_copy, self._kernels.copy, stream)
            self._stager = stager
        if <uintptr_t>stream != self._last_replay_stream:
            self._note_replay_stream(<uintptr_t>stream)
        if self._rebinder is not None and self._rebinder.rebound:
            self._rebinder.restore()
        stager.launch(inputs, stream)

    def rebind_and_launch(self, static_inputs, inputs, static_outputs=(), outputs=()):
        """Replay with the captured kernels reading ``inputs`` in place of
        ``static_inputs`` and writing ``outputs`` in place of ``static_outputs``,
        without copying them.

        Each kernel argument of ours that points into a static tensor is
        patched to the same offset in its replacement
        (cuGraphExecKernelNodeSetParams, only for nodes whose arguments
        change, in one ``nogil`` block with the launch). A static tensor that
        something we cannot patch also uses (a foreign kernel such as
        cuBLAS's, a memcpy or memset node) is copied instead: its input onto
        it before the launch, its output from it after; so is a static
        tensor that is a view of a larger one, and, for one call, a
        replacement less aligned than its static tensor. :meth:`rebindable`
        says which are which; replacements that overlap raise ValueError.
        The rebound tensors are kept alive until the next rebinding or
        :meth:`reset`; :meth:`replay` and :meth:`stage_and_launch` point the
        graph back at the static tensors.
        The analysis is built at the first call for a list of static tensors
        and kept while the same tensors are passed.

        Parameters
        ----------
        static_inputs, static_outputs : sequence of Tensor
            Tensors the capture read, and tensors it wrote; distinct memory.
        inputs, outputs : sequence of Tensor
            Their replacements: same shape, strides, dtype and device.
        """
        cdef cydriver.CUstream stream
        cdef Rebinder r
        if self._exec == NULL:
            self._replay_error()
        stream = current_stream_handle(self._device)
        r = self._rebinder_for(static_inputs, static_outputs)
        if <uintptr_t>stream != self._last_replay_stream:
            self._note_replay_stream(<uintptr_t>stream)
        r.launch(inputs, outputs, stream)

    def rebindable(self, static_inputs, static_outputs=()):
        """For each of these static tensors (inputs, then outputs): True when
        :meth:`rebind_and_launch` rebinds it without a copy, False when it
        copies it (something the graph runs that cannot be patched uses it)."""
        if self._exec == NULL:
            self._replay_error()
        return self._rebinder_for(static_inputs, static_outputs).rebindable()

    cdef Rebinder _rebinder_for(self, object static_inputs, object static_outputs):
        cdef Rebinder r = self._rebinder
        if r is not None and r.holds(static_inputs, static_outputs):
            return r
        if r is not None:
            r.restore()                # the executable back on the old statics (raises: r stays)
            self._drop_rebinder()
        r = make_rebinder(self._graph, self._exec_graph, self._exec, self._device, static_inputs, static_outputs,
                          self._cond_nodes, self._kernels.multi_copy, self._kernels.copy)
        self._rebinder = r
        return r

    cdef void _drop_rebinder(self) noexcept:
        """Forget the rebinder; callers point the executable back first, or
        replace it (a re-capture's update or instantiate, a reset)."""
        if self._rebinder is None:
            return
        self._rebinder.release()
        self._rebinder = None

    @property
    def _rebind_patch_calls(self):
        """cuGraphExecKernelNodeSetParams calls the current rebinder made (tests)."""
        return 0 if self._rebinder is None else self._rebinder.patch_calls

    @property
    def _stages_in_one_launch(self):
        """Whether the current stager launches copies and graph as one executable (tests)."""
        return self._stager is not None and self._stager.one_launch

    cdef void _drop_stager(self) noexcept:
        if self._stager is not None:
            self._stager.release()
            self._stager = None

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

    # ------------------------------------------------------------ introspection

    def _describe(self, bint detailed):
        """The captured graph as plain data (see CUDAGraph.describe)."""
        if self._graph == NULL:
            raise RuntimeError("describe: nothing captured (capture first; a reset graph has no nodes)")
        ensure_context(self._device)
        return describe_graph(self._graph, detailed, self._cond_nodes)

    # ------------------------------------------------------------ lifetime

    cdef void _release(self) noexcept:
        self._drop_stager()
        self._drop_rebinder()               # the executable goes: nothing to point back
        self._retire_previous()          # a failed re-capture discards its predecessor too
        if self._exec != NULL:
            try:
                ensure_context(self._device)
                if cydriver.cuGraphExecDestroy(self._exec) == cydriver.CUDA_SUCCESS:
                    count_live(LIVE_EXECS, -1)
            except BaseException:
                pass
            self._exec = NULL
        _destroy_graph(&self._graph)
        _destroy_graph(&self._exec_graph)
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
        self._set_switch_fns = {}
        self._set_cond_fn = None          # a later capture may be on another device
        self.num_nodes = 0
        self._update_result = None

    def _reset(self):
        self._abort_capture()

    def __dealloc__(self):
        if self._capturing:           # conditional bodies are open only inside a capture
            try:
                site = _open_captures[id(self)].site if id(self) in _open_captures else "?"
                self._abort_capture()      # conditional bodies, the capture, routing, stream
                warnings.warn(f"a CUDAGraph was destroyed while capturing (capture_begin at {site}): "
                              f"its capture was ended and discarded; call capture_end() or reset(), "
                              f"or use 'with tensorplay.cuda.graph(g):'", ResourceWarning)
            except BaseException:
                pass
        self._release()

    # ------------------------------------------------------------ state

    @property
    def pool_id(self):
        """The allocator pool this graph captured into (None before a capture)."""
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
    def update_result(self):
        """How the last ``capture_end`` of a re-capture got its executable:
        ``"success"`` (the previous executable was updated in place,
        cuGraphExecUpdate, and keeps its handle), or why the update was
        refused and a new one was instantiated (``"topology_changed"``,
        ``"node_type_changed"``, ``"function_changed"``,
        ``"parameters_changed"``, ``"not_supported"``,
        ``"unsupported_function_change"``, ``"attributes_changed"``,
        ``"error"``). None after a first capture, and after ``reset``."""
        return self._update_result

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


cdef void _discard_capture(cydriver.CUstream stream, bint owns_graph=True) noexcept:
    """End the capture on ``stream`` and drop what it made; a conditional
    body's graph belongs to its node (owns_graph False) and dies with the
    parent graph."""
    cdef cydriver.CUgraph g = NULL
    if cydriver.cuStreamEndCapture(stream, &g) == cydriver.CUDA_SUCCESS and g != NULL and owns_graph:
        cydriver.cuGraphDestroy(g)


def is_stream_capturing(uintptr_t stream, int device):
    """True while ``stream`` is capturing, cuStreamIsCapturing."""
    cdef cydriver.CUstreamCaptureStatus status
    with nogil:
        ensure_context(device)
        check(cydriver.cuStreamIsCapturing(<cydriver.CUstream>stream, &status))
    return status == cydriver.CU_STREAM_CAPTURE_STATUS_ACTIVE


cdef void _destroy_graph(cydriver.CUgraph* g) noexcept:
    """Destroy ``*g`` if set (counted out of the live graphs) and clear it."""
    if g[0] == NULL:
        return
    if cydriver.cuGraphDestroy(g[0]) == cydriver.CUDA_SUCCESS:
        count_live(LIVE_GRAPHS, -1)
    g[0] = NULL
