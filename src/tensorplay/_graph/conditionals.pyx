# SPDX-License-Identifier: Apache-2.0
"""Conditional nodes (IF, IF/ELSE, WHILE, SWITCH) added to a graph while it
is captured: the node kinds, and Conditionals, which owns one graph's stack
of open nodes, their handles and bodies, and the set-conditional kernels.

A node is added to the capture with cuGraphAddNode after a one-thread kernel
that samples the predicate (or index) into its handle; each body is captured
on a side stream of its own (cuStreamBeginCaptureToGraph), which is the
current stream while it is open. See docs/design.md."""

cimport cython
from cuda.bindings cimport cydriver
from libc.stdint cimport uintptr_t
from libc.string cimport memset

from tensorplay._driver.context cimport check, primary_context
from tensorplay._driver.launch cimport Function
from tensorplay._driver.stream cimport Stream, current_stream_handle
from tensorplay._graph.streams cimport (add_to_capture, capture_side_stream, discard_capture,
                                        release_capture_side_stream)
from tensorplay._tensor.base cimport TensorBase

import threading

from tensorplay._memory.api import allocator as _allocator
from tensorplay._driver.stream import set_conditional_body_test, set_stream

KIND_NAMES = ("if", "while", "switch")     # by kind; messages write them in capitals
# The driver documents no upper bound for a SWITCH's size; this is ours (see
# CUDAGraph.begin_capture_to_switch_node), checked before any driver call.
MAX_SWITCH_CASES = 1024
cdef dict _BEGIN_CALLS = {IF_NODE: "begin_capture_to_if_node", WHILE_NODE: "begin_capture_to_while_node",
                          SWITCH_NODE: "begin_capture_to_switch_node"}


cdef str kind_name(int kind):
    """The name of a kind of node, as describe() gives it ("if", "while", "switch")."""
    return KIND_NAMES[kind]


cdef str body_label(int kind, Py_ssize_t b):
    """The label of body ``b`` of a conditional node of ``kind`` (describe)."""
    if kind == IF_NODE:
        return "then" if b == 0 else "else"
    if kind == WHILE_NODE:
        return "body"
    return f"case {b}"


# The side streams capturing a conditional body now, by handle: which body
# (the driver floor asks, to refuse host functions and event nodes there).
cdef dict _body_streams = {}


def _body_of(uintptr_t stream):
    """Which conditional body ``stream`` captures ("the body of a WHILE node"), or None."""
    return _body_streams.get(stream)


set_conditional_body_test(_body_of)


cdef str _upper(int kind):
    return kind_name(kind).upper()


cdef int _keep_storage(dict keep, object t) except -1:
    if isinstance(t, TensorBase):
        st = (<TensorBase>t)._storage
        if st is not None:
            keep[id(st)] = st
    return 0


@cython.final
cdef class ConditionalFrame:
    """An open conditional node: its handle and kind, its body graphs, the
    stream the open body is captured on (None between the branches of an
    IF/ELSE or the cases of a SWITCH), which branch is open and the lowest
    that may be begun next, the predicate (or index) it samples, and the
    stream to return to."""


@cython.final
cdef class Conditionals:
    """The conditional nodes of one graph's captures: the open ones
    (innermost last), the set-conditional kernels (loaded once per graph),
    and the capture they are added to, from ``open`` to ``close``.

    A failure that leaves the capture beyond repair (a handle without its
    node, a body that lost work) discards the whole capture with
    ``graph.reset()`` before it raises."""

    def __cinit__(self):
        self._stack = []
        self._set_switch_fns = {}
        self._device = -1

    cdef int open(self, object kernels, int device, int mode, unsigned long thread, Stream root, object state,
                  dict nodes, dict keep) except -1:
        """A capture began on ``root`` (allocator state ``state``); its
        conditional nodes are recorded in ``nodes``, the storages their
        predicates live in kept in ``keep``."""
        self._kernels = kernels
        self._device = device
        self._mode = mode
        self._thread = thread
        self._root = root
        self._state = state
        self._nodes = nodes
        self._keep = keep
        return 0

    cdef void close(self) noexcept:
        """The capture ended (its open bodies were closed or discarded first)."""
        self._root = None
        self._state = None
        self._nodes = None
        self._keep = None
        self.foreign = None

    cdef void discard(self) noexcept:
        """End the capture of every open body, innermost first, dropping what
        they captured (never raises); the allocator ends their routes with
        the capture's."""
        cdef ConditionalFrame frame
        while self._stack:
            frame = self._stack.pop()
            if frame.body is not None:
                _body_streams.pop(<uintptr_t>frame.body._handle, None)
                discard_capture(frame.body._handle, False)
                release_capture_side_stream(frame.body)
                frame.body = None

    cdef void forget_kernels(self) noexcept:
        """Drop the set kernels: a later capture may be on another device."""
        self._set_cond_fn = None
        self._set_switch_fns = {}

    cdef Py_ssize_t depth(self) noexcept:
        return len(self._stack)

    cdef ConditionalFrame _innermost(self):
        if self._stack:
            return <ConditionalFrame>self._stack[len(self._stack) - 1]
        return None

    cdef tuple innermost(self):
        """(kind name, number of bodies, open branch or -1, node as an int) of
        the innermost open node, or None."""
        cdef ConditionalFrame frame = self._innermost()
        if frame is None:
            return None
        return (kind_name(frame.kind), len(frame.bodies), frame.branch, frame.node)

    cdef Stream _current_stream(self):
        """The stream of the innermost open body, or the capture's."""
        if self._stack:
            return (<ConditionalFrame>self._stack[len(self._stack) - 1]).body
        return self._root

    cdef int _check_capture_thread(self, str what) except -1:
        if self._root is None:
            raise RuntimeError(f"{what}: no capture is open on this graph (call capture_begin first)")
        if threading.get_ident() != self._thread:
            raise RuntimeError(f"{what} must be called on the thread that began the capture")
        return 0

    cdef int _check_between_branches(self, ConditionalFrame frame, str what) except -1:
        """Refuse work on a node none of whose branches is open."""
        if frame is not None and frame.body is None:
            first = ("begin_capture_to_switch_case(k)" if frame.kind == SWITCH_NODE
                     else "begin_capture_to_else_branch()")
            raise RuntimeError(f"{what}: no branch of the innermost {_upper(frame.kind)} node is open; "
                               f"begin one with {first} first")
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

    # ------------------------------------------------------------ nodes

    cdef int begin(self, object graph, int kind, uintptr_t pred, object pred_owner, unsigned int num_bodies,
                   bint open_first, str index_dtype) except -1:
        """Add an IF (one or two bodies), WHILE or SWITCH (``num_bodies``
        cases) node gated on the value at ``pred`` (a bool, or for a SWITCH an
        integer of ``index_dtype``); capture its first body when
        ``open_first``."""
        cdef Stream cur
        cdef cydriver.CUstreamCaptureStatus status
        cdef cydriver.cuuint64_t cid = 0
        cdef cydriver.CUgraph g = NULL
        cdef cydriver.CUgraphConditionalHandle handle = 0
        cdef cydriver.CUcontext ctx
        what = _BEGIN_CALLS.get(kind)
        if what is None:
            raise ValueError(f"unknown conditional node kind {kind}")
        self._check_capture_thread(what)
        if not (kind == SWITCH_NODE and 1 <= num_bodies <= MAX_SWITCH_CASES
                or kind == IF_NODE and 1 <= num_bodies <= 2 or kind == WHILE_NODE and num_bodies == 1):
            raise ValueError(f"{what}: a {_upper(kind)} node cannot have {num_bodies} bodies")
        if (kind == SWITCH_NODE) != (index_dtype is not None):
            raise TypeError(f"{what}: a SWITCH samples an integer index, IF and WHILE a bool")
        self._check_between_branches(self._innermost(), what)
        cur = self._current_stream()
        if current_stream_handle(self._device) != cur._handle:
            raise RuntimeError(f"{what}: the current stream is not the capture stream of the innermost body "
                               f"(a stream set inside it was not restored)")
        ctx = primary_context(self._device)
        with nogil:
            check(cydriver.cuStreamGetCaptureInfo(cur._handle, &status, &cid, &g, NULL, NULL, NULL))
        if status != cydriver.CU_STREAM_CAPTURE_STATUS_ACTIVE:
            raise RuntimeError(f"{what}: the capture was invalidated by an earlier error; end it and capture again")
        self._set_kernel_for(kind, index_dtype)       # loaded first: a failure here leaves no trace
        with nogil:
            check(cydriver.cuGraphConditionalHandleCreate(&handle, g, ctx, 0, 0))
        try:
            self._add_node(handle, kind, pred, pred_owner, num_bodies, open_first, index_dtype, cur, ctx)
        except BaseException:
            # a handle, and maybe a node, the capture cannot lose again: it is discarded
            graph.reset()
            raise
        return 0

    cdef int _add_node(self, cydriver.CUgraphConditionalHandle handle, int kind, uintptr_t pred, object pred_owner,
                       unsigned int num_bodies, bint open_first, str index_dtype, Stream cur,
                       cydriver.CUcontext ctx) except -1:
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
        memset(&params, 0, sizeof(params))
        params.type = cydriver.CU_GRAPH_NODE_TYPE_CONDITIONAL
        params.conditional.handle = handle
        params.conditional.type = (cydriver.CU_GRAPH_COND_TYPE_IF if kind == IF_NODE
                                   else cydriver.CU_GRAPH_COND_TYPE_WHILE if kind == WHILE_NODE
                                   else cydriver.CU_GRAPH_COND_TYPE_SWITCH)
        params.conditional.size = num_bodies
        params.conditional.ctx = ctx
        node = add_to_capture(cur._handle, &params)
        for k in range(num_bodies):
            frame.bodies[k] = <uintptr_t>params.conditional.phGraph_out[k]
        frame.node = <uintptr_t>node
        self._nodes[<uintptr_t>node] = (kind, list(frame.bodies), handle)
        _keep_storage(self._keep, pred_owner)   # replays read the predicate
        if open_first:
            self._open_branch(frame, 0)
        self._stack.append(frame)
        return 0

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
            _allocator(self._device).begin_body(self._state, <uintptr_t>child._handle, child_cid)
        except BaseException:
            discard_capture(child._handle, False)
            release_capture_side_stream(child)
            raise
        frame.body = child
        frame.branch = k
        frame.next_branch = k + 1
        _body_streams[<uintptr_t>child._handle] = (
            f"the {body_label(frame.kind, k)}{' branch' if frame.kind == IF_NODE else ''} of "
            f"{'an' if frame.kind == IF_NODE else 'a'} {_upper(frame.kind)} node")
        set_stream(child)
        if self.foreign is not None:
            self.foreign.follow(child)      # other libraries' work goes into the body too
        return 0

    cdef int _close_branch(self, object graph, ConditionalFrame frame) except -1:
        """End the capture of ``frame``'s open body; its parent's stream is
        current again. A WHILE body first re-samples its predicate."""
        cdef cydriver.CUgraph g = NULL
        cdef cydriver.CUresult r
        cdef Stream body = frame.body
        if frame.kind == WHILE_NODE:
            self._launch_set_conditional(frame, frame.pred, body._handle)
        with nogil:
            r = cydriver.cuStreamEndCapture(body._handle, &g)     # g is the node's body: not ours
        _body_streams.pop(<uintptr_t>body._handle, None)
        frame.body = None
        frame.branch = -1
        _allocator(self._device).end_body(self._state)
        release_capture_side_stream(body)
        set_stream(frame.parent)
        if self.foreign is not None:
            self.foreign.follow(frame.parent)
        if r != cydriver.CUDA_SUCCESS:
            graph.reset()        # the body lacks work the caller queued: nothing to mend
            check(r)
        return 0

    cdef int _check_parent_untouched(self, object graph, ConditionalFrame frame, str what) except -1:
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
        graph.reset()
        check(r)
        if status != cydriver.CU_STREAM_CAPTURE_STATUS_ACTIVE:
            raise RuntimeError(f"{what}: the capture was invalidated by an earlier error (it was discarded); "
                               f"capture again")
        raise RuntimeError(f"{what}: work was queued between the branches of a {_upper(frame.kind)} node "
                           f"(after one ended, before the next began), so it would run after the node in no "
                           f"branch; the capture was discarded")

    cdef int begin_branch(self, object graph, int kind, int k, str what) except -1:
        """End the open branch of the innermost IF/ELSE or SWITCH node, if
        any, and begin capturing its branch ``k`` (IF/ELSE: 0 then, 1 else;
        SWITCH: the case). Branches begin in increasing order, each once."""
        cdef ConditionalFrame frame = self._innermost()
        self._check_capture_thread(what)
        if frame is None:
            raise RuntimeError(f"{what}: no conditional node is open")
        if frame.kind != kind or len(frame.bodies) < 2 and kind == IF_NODE:
            if kind == IF_NODE:
                has = ("an IF node without an else body (open it with begin_capture_to_if_node(pred, "
                       "with_else=True))" if frame.kind == IF_NODE else f"a {_upper(frame.kind)} node")
                raise RuntimeError(f"{what}: the innermost open conditional node is {has}, not an IF/ELSE")
            raise RuntimeError(f"{what}: the innermost open conditional node is "
                               f"{'an' if frame.kind == IF_NODE else 'a'} {_upper(frame.kind)} node, "
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
        if current_stream_handle(self._device) != (<Stream>expected)._handle:
            raise RuntimeError(f"{what}: the current stream is not the capture stream of the innermost body "
                               f"(a stream set inside it was not restored)")
        if frame.body is not None:
            self._close_branch(graph, frame)
        else:
            self._check_parent_untouched(graph, frame, what)
        self._open_branch(frame, k)
        return 0

    cdef int end_branch(self, object graph) except -1:
        """End the open branch of the innermost IF/ELSE or SWITCH node, keeping
        the node open (the structured form's branch exit)."""
        cdef ConditionalFrame frame = self._innermost()
        self._check_capture_thread("end of a branch")
        if frame is None or frame.body is None or len(frame.bodies) < 2 and frame.kind != SWITCH_NODE:
            raise RuntimeError("end of a branch: no branch of an IF/ELSE or SWITCH node is open")
        if current_stream_handle(self._device) != frame.body._handle:
            raise RuntimeError("end of a branch: the current stream is not the branch's stream "
                               "(a stream set inside it was not restored)")
        self._close_branch(graph, frame)
        return 0

    cdef int end(self, object graph) except -1:
        """Close the innermost node: its open body (a WHILE body first
        re-samples its predicate); branches never begun stay empty."""
        cdef ConditionalFrame frame = self._innermost()
        if frame is None:
            raise RuntimeError("end_capture_to_conditional_node: no conditional body is open")
        self._check_capture_thread("end_capture_to_conditional_node")
        if frame.body is not None:
            if current_stream_handle(self._device) != frame.body._handle:
                raise RuntimeError("end_capture_to_conditional_node: the current stream is not the body's stream")
            self._close_branch(graph, frame)     # a failure keeps the frame (body None) for the reset
            self._stack.pop()
            return 0
        if current_stream_handle(self._device) != frame.parent._handle:
            raise RuntimeError("end_capture_to_conditional_node: the current stream is not the capture stream "
                               "of the node's parent (a stream set inside it was not restored)")
        self._check_parent_untouched(graph, frame, "end_capture_to_conditional_node")
        self._stack.pop()
        return 0

    cdef int set(self, uintptr_t pred, object pred_owner, str index_dtype) except -1:
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
                               else f"{'an' if frame.kind == IF_NODE else 'a'} {_upper(frame.kind)} node: "
                                    "pass a one-element CUDA bool tensor"))
        if current_stream_handle(self._device) != frame.body._handle:
            raise RuntimeError("set_conditional_handle_for_current_node: the current stream is not the body's "
                               "stream")
        if index_dtype is not None and index_dtype != frame.index_dtype:
            frame.index_dtype = index_dtype
        self._launch_set_conditional(frame, pred, frame.body._handle)
        frame.pred = pred
        _keep_storage(self._keep, pred_owner)
        return 0
