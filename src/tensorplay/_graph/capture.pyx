# SPDX-License-Identifier: Apache-2.0
"""CUDAGraphBase: capture into a graph and build its executable. Capture
begin and end with allocator routing and the open-capture registry,
re-capture (the previous executable updated in place, cuGraphExecUpdate, or a
new one instantiated), abort, and the entry points of conditional nodes,
which tensorplay._graph.conditionals adds. Replay, staging, rebinding and
the executable's teardown are its base's, tensorplay._graph.replay."""

cimport cython
from cuda.bindings cimport cydriver
from libc.stdint cimport uintptr_t

from tensorplay._driver.context cimport (LIVE_EXECS, LIVE_GRAPHS, check, count_live, ensure_context,
                                         get_current_device, validate_device)
from tensorplay._driver.stream cimport Stream, as_stream, current_stream_handle, stream_wait_stream
from tensorplay._graph.conditionals cimport Conditionals
from tensorplay._graph.registry cimport OpenCapture, call_site, forbidding, forget_open, opened_by, register_open
from tensorplay._graph.replay cimport Executable, ReplayBase
from tensorplay._graph.streams cimport capture_side_stream, discard_capture, release_capture_side_stream

import os
import threading

from tensorplay._frames import warn_user
from tensorplay._memory.api import allocator as _allocator
from tensorplay._driver.stream import current_stream, set_stream
from tensorplay._graph.foreign import begin_session, capture_begin_lock

# Checking that no capture forbids this one and beginning it are one step, so
# two threads beginning captures get a clear error, not the driver's.
_begin_lock = capture_begin_lock


# no_gc_clear: __dealloc__ ends an open capture and restores the stream it
# replaced, so the collector must not set those fields to None first.
@cython.no_gc_clear
cdef class CUDAGraphBase(ReplayBase):
    """The compiled half of tensorplay._graph.graphs.CUDAGraph (see there).

    ``kernels`` gives what this layer launches or calls but does not own:
    ``set_conditional(device)``, ``set_switch(dtype, device)`` and
    ``multi_copy(capacity, device)`` return loaded kernels, ``copy(static,
    source)`` copies one input onto a static input (casts, strides, host
    data)."""

    cdef cydriver.CUstream _capture_stream
    cdef object _capture_stream_obj
    cdef object _reserved_side       # the side stream capture_begin reserved, until it succeeds
    cdef object _prev_stream
    cdef unsigned long _capture_thread
    cdef object _capture_state      # the allocator's CaptureState while capturing
    cdef object _foreign            # the capture's ForeignSession (other libraries followed) or None
    cdef object _foreign_error      # a library's failure to restore, raised after our teardown
    cdef int _mode
    cdef Conditionals _conds        # the open conditional nodes and their kernels
    cdef object __weakref__

    def __cinit__(self, *args, **kwargs):
        self._capture_stream = NULL
        self._capturing = False
        self._conds = Conditionals.__new__(Conditionals)

    def __init__(self, kernels):
        self._kernels = kernels

    # ------------------------------------------------------------ capture

    def _capture_begin(self, long long pool_id, int mode, stream, foreign=None):
        """Begin capturing on ``stream`` (None: a side stream of the current
        device) into pool ``pool_id``, cuStreamBeginCapture; other libraries'
        current streams follow the capture's unless ``foreign`` is False
        (None: the process default, tensorplay._graph.foreign)."""
        cdef OpenCapture other
        if self._capturing:
            raise RuntimeError("capture_begin: this graph is already capturing")
        if self._kernels is None:
            raise RuntimeError("capture_begin: the graph was not initialised (a subclass of CUDAGraph "
                               "must call super().__init__())")
        site = call_site()
        with _begin_lock:
            other = forbidding()
            if other is not None:
                raise RuntimeError(f"capture_begin: another capture forbids a new one: {other.sentence()}")
            self._begin_locked(pool_id, mode, stream, foreign)
            register_open(self, self._device, <uintptr_t>self._capture_stream, self._mode, self._capture_thread,
                          site)
            session = self._foreign
            if session is not None:
                # under the lock: a pool is let go only while no session is routed
                try:
                    session.begin(self._capture_stream_obj, pool_id)
                    self._conds.foreign = session
                except BaseException:
                    self._abort()
                    raise

    cdef int _begin_locked(self, long long pool_id, int mode, stream, foreign) except -1:
        try:
            self._begin_on(pool_id, mode, stream, foreign)
        except BaseException:
            if not self._capturing:
                release_capture_side_stream(self._reserved_side)
            self._reserved_side = None
            raise
        self._reserved_side = None
        return 0

    cdef int _begin_on(self, long long pool_id, int mode, stream, foreign) except -1:
        cdef Stream s
        cdef int dev
        cdef cydriver.CUstream prev, replayed
        cdef cydriver.CUstreamCaptureStatus status
        cdef cydriver.cuuint64_t cid = 0
        cdef Executable cur = self._cur
        cdef bint recapture = cur.handle != NULL or cur.graph != NULL
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
        if recapture and dev != self._device:
            raise ValueError(f"capture_begin: this graph holds a graph of cuda:{self._device}; a re-capture "
                             f"must be on the same device (or call reset() first), not cuda:{dev}")
        if self._replay_streams and recapture:
            # a re-capture reuses the previous capture's pool: its replays queued
            # on other streams must be done before the new work may take that memory
            for h in self._replay_streams:
                replayed = <cydriver.CUstream><uintptr_t>h
                with nogil:
                    check(cydriver.cuStreamSynchronize(replayed))
        if recapture:
            # destroying the stager's executable inside a global capture would
            # invalidate it (an unsafe call): drop it before the capture opens;
            # the rebinder's nodes are the old graph's (the update resets them)
            self._drop_stager()
            self._drop_rebinder()
        prev_obj = current_stream(dev)
        prev = current_stream_handle(dev)
        if prev != s._handle:
            stream_wait_stream(s._handle, prev, dev)     # the capture sees work queued before it
        session = begin_session(dev, foreign)
        if session is not None:
            for h in session.streams_to_join():          # and other libraries' queued work
                if <uintptr_t>h != <uintptr_t>s._handle and <uintptr_t>h != <uintptr_t>prev:
                    stream_wait_stream(s._handle, <cydriver.CUstream><uintptr_t>h, dev)
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
            discard_capture(s._handle)
            raise
        if recapture:
            self._hold_previous()
        cur = self._cur
        self._device = dev
        cur.pool_id = pool_id
        cur.has_pool = True
        cur.pool = self._capture_state.pool
        self._capture_stream = s._handle
        self._capture_stream_obj = s
        self._prev_stream = prev_obj
        self._capture_thread = threading.get_ident()
        self._pid = os.getpid()
        self._capturing = True
        self._mode = mode
        self._foreign = session
        self._conds.open(self._kernels, dev, mode, self._capture_thread, s, self._capture_state, cur.conditionals,
                         cur.kept)
        set_stream(s)
        return 0

    cdef int _hold_previous(self) except -1:
        """Set the captured graph aside while a re-capture is open: its
        executable may still be updated; its stager (built on a clone of the
        old graph) was dropped before the capture opened; the new capture
        gets its own node records and kept storages."""
        self._previous = self._cur
        self._cur = Executable.__new__(Executable)
        self._num_nodes = 0
        return 0

    cdef int _end_routing(self) except -1:
        """Stop routing allocations; keep the storages from outside the pool
        that the capture used; restore the current stream (on the capture's
        thread: another thread's current stream is not ours to set); give a
        reserved side stream back."""
        state = self._capture_state
        session = self._foreign
        self._capture_state = None
        self._foreign = None
        on_thread = threading.get_ident() == self._capture_thread
        forget_open(self)
        if state is not None:
            self._cur.kept.update(_allocator(self._device).end_capture(state))
        if self._prev_stream is not None and on_thread:
            set_stream(self._prev_stream)
        self._prev_stream = None
        self._capturing = False
        self._conds.close()
        release_capture_side_stream(self._capture_stream_obj)
        if session is not None:
            # last, and its error kept for the caller to raise once its own
            # teardown is done: a library must not leave ours half restored
            try:
                self._cur.foreign_holds.update(session.end(on_thread))
            except BaseException as exc:
                self._foreign_error = exc
        return 0

    cdef int _raise_foreign_error(self) except -1:
        exc = self._foreign_error
        if exc is not None:
            self._foreign_error = None
            raise exc
        return 0

    def _capture_end(self):
        """End the capture (cuStreamEndCapture), then update the previous
        executable with the new graph (cuGraphExecUpdate) or, with none or when
        the update fails, instantiate one (cuGraphInstantiate)."""
        cdef cydriver.CUgraph g = NULL
        cdef cydriver.CUresult r
        cdef size_t n = 0
        cdef Executable cur, previous
        if not self._capturing:
            raise RuntimeError("capture_end: no capture is open on this graph")
        if threading.get_ident() != self._capture_thread:
            raise RuntimeError(f"capture_end must be called on the thread that called capture_begin "
                               f"({opened_by(self).thread!r})")
        if self._conds.depth():
            n_open = self._conds.depth()
            self._abort()
            raise RuntimeError(f"capture_end: {n_open} conditional body(ies) still open; call "
                               "end_capture_to_conditional_node() for each (the capture was discarded)")
        if current_stream_handle(self._device) != self._capture_stream:
            raise RuntimeError("capture_end: the current stream is not the capture stream "
                               "(a stream set inside the capture was not restored)")
        with nogil:
            r = cydriver.cuStreamEndCapture(self._capture_stream, &g)
        self._end_routing()
        cur = self._cur
        previous = self._previous
        if r != cydriver.CUDA_SUCCESS:
            if g != NULL:
                cydriver.cuGraphDestroy(g)
            self._release()
            check(r)
        cur.graph = g
        count_live(LIVE_GRAPHS, 1)
        try:
            with nogil:
                check(cydriver.cuGraphGetNodes(g, NULL, &n))
            self._update_result = (previous.update(g) if previous is not None and previous.handle != NULL
                                   else None)
            if self._update_result == "success":
                cur.take_updated(previous)           # updated in place: the same handle
            else:
                # instantiated before the old one is destroyed, so a fallback
                # never hands out the old handle again
                with nogil:
                    check(cydriver.cuGraphInstantiate(&cur.handle, g, 0))
                count_live(LIVE_EXECS, 1)
            # not uploaded (PyTorch's capture does not either): the first
            # replay uploads, or upload() ahead of it
            self.retire_previous()
        except BaseException:
            self._release()
            raise
        self._num_nodes = n
        self._raise_foreign_error()

    # ------------------------------------------------------------ conditional nodes

    def _begin_conditional(self, int kind, uintptr_t pred, object pred_owner, unsigned int num_bodies=1,
                           bint open_first=True, str index_dtype=None):
        """Add an IF (one or two bodies), WHILE or SWITCH (``num_bodies``
        cases) node (``kind``: tensorplay._graph.conditionals.IF_NODE, WHILE_NODE
        or SWITCH_NODE) gated on the value at ``pred``
        (a bool, or for a SWITCH an integer of ``index_dtype``); capture its
        first body on a child stream when ``open_first`` (see docs/design.md)."""
        self._conds.begin(self, kind, pred, pred_owner, num_bodies, open_first, index_dtype)

    def _begin_branch(self, int kind, int k, str what):
        """End the open branch of the innermost IF/ELSE or SWITCH node, if
        any, and begin capturing its branch ``k`` (IF/ELSE: 0 then, 1 else;
        SWITCH: the case). Branches begin in increasing order, each once."""
        self._conds.begin_branch(self, kind, k, what)

    def _end_branch(self):
        """End the open branch of the innermost IF/ELSE or SWITCH node, keeping
        the node open (the structured form's branch exit)."""
        self._conds.end_branch(self)

    def _end_conditional(self):
        """Close the innermost node: its open body (a WHILE body first
        re-samples its predicate); branches never begun stay empty."""
        self._conds.end(self)

    def _set_conditional(self, uintptr_t pred, object pred_owner, str index_dtype=None):
        """Sample ``pred`` into the innermost node's handle now and make it the
        node's predicate (a SWITCH's: an integer index of ``index_dtype``)."""
        self._conds.set(pred, pred_owner, index_dtype)

    @property
    def _innermost_conditional(self):
        """(kind name, number of bodies, open branch or -1, node as an int) of
        the innermost open conditional node, or None."""
        return self._conds.innermost()

    @property
    def conditional_depth(self):
        """How many conditional bodies are open in the capture (0 outside them)."""
        return self._conds.depth()

    # ------------------------------------------------------------ lifetime

    def reset(self):
        """Destroy the executable and release the graph's hold on its memory pool.

        An open capture is ended and discarded first. Tensors allocated
        during the capture should be released first; those still alive keep
        their memory valid (it is never freed under a live tensor) and it
        returns to the device once they die and
        :func:`tensorplay.cuda.empty_cache` runs. The graph can capture again.
        """
        self._abort()

    cdef int _abort(self) except -1:
        """End an open capture whatever state the driver left it in, and
        reset the graph."""
        self._conds.discard()           # conditional bodies, then the capture, routing, stream
        if self._capturing:
            discard_capture(self._capture_stream)
            self._end_routing()
        self._release()
        self._raise_foreign_error()
        return 0

    cdef void _release(self) noexcept:
        self.release_executables()
        self._conds.forget_kernels()    # a later capture may be on another device

    def __dealloc__(self):
        cdef OpenCapture c
        if self._capturing:           # conditional bodies are open only inside a capture
            try:
                c = opened_by(self)
                site = c.site if c is not None else "?"
                self._abort()
                warn_user(f"a CUDAGraph was destroyed while capturing (capture_begin at {site}): "
                          f"its capture was ended and discarded; call capture_end() or reset(), "
                          f"or use 'with tensorplay.cuda.graph(g):'", ResourceWarning)
            except BaseException:
                pass
        self._release()

    # ------------------------------------------------------------ state

    @property
    def is_capturing(self):
        """True between ``capture_begin`` and ``capture_end``."""
        return self._capturing

    @property
    def _foreign_session(self):
        """The open capture's ForeignSession (the other libraries it follows), or None."""
        return self._foreign

    @property
    def _capture_thread_ident(self):
        """The thread that began the open capture (threading.get_ident()), or None."""
        return self._capture_thread if self._capturing else None

    @property
    def capture_stream(self):
        """The stream of the open or the last capture (None before the first capture)."""
        return self._capture_stream_obj

    @property
    def device_index(self):
        """The index of the CUDA device the graph was captured on (-1 before a capture)."""
        return self._device
