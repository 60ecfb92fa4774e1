# SPDX-License-Identifier: Apache-2.0
"""The launch half of a CUDA graph. Executable: a captured graph, its
executable and what keeps them valid, with the one teardown of them all.
ReplayBase, the base of CUDAGraphBase (tensorplay._graph.capture, which
captures): replay, stage_and_launch, rebind_and_launch and rebindable with
the GIL released around the driver calls, describe, and the executable's
state and teardown. Staging lives in the stager, rebinding in the rebinder,
node introspection in describe."""

cimport cython
from cuda.bindings cimport cydriver
from libc.stdint cimport uintptr_t
from libc.string cimport memset

from tensorplay._driver.context cimport check, ensure_context
from tensorplay._driver.stream cimport Stream, as_stream, current_stream_handle
from tensorplay._driver.teardown cimport defer, destroy_graph_objects, destroy_must_wait
from tensorplay._graph.children cimport embed_if_capturing
from tensorplay._graph.describe cimport describe_graph, kernel_argument_words
from tensorplay._graph.registry cimport captures_open
from tensorplay._graph.rebind cimport Rebinder, make_rebinder
from tensorplay._graph.stager cimport Stager, check_stage_arguments, make_stager

import os

from tensorplay._driver.context import make_error
from tensorplay._memory.allocator import PoolAsleepError
from tensorplay._memory.api import allocator as _allocator

cdef uintptr_t NO_STREAM = <uintptr_t>-1     # no replay yet (0 is the legacy default stream)

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


cdef int refuse_capturing_stream(cydriver.CUresult r, cydriver.CUstreamCaptureStatus status, str what) except -1:
    """Raise for a launch not made because its stream captures (``status``)
    or cannot say (``r``: the legacy stream while another stream captures)."""
    if r != cydriver.CUDA_SUCCESS:
        raise make_error(r, f"{what} on the legacy default stream while another stream of the device is capturing "
                            f"(the driver refuses it there); launch on another stream")
    if status == cydriver.CU_STREAM_CAPTURE_STATUS_ACTIVE:
        raise make_error(cydriver.CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
                         f"{what} on a stream that is capturing for another library (PyTorch, CuPy, cuda.core, "
                         f"the driver API), or a launch that cannot join a capture: the driver cannot capture a "
                         f"graph launch, so nothing was launched and that capture is left intact. A tensorplay "
                         f"graph joins a capture by replay() or tp.cuda.embed() (as a child graph node)")
    raise make_error(cydriver.CUDA_ERROR_STREAM_CAPTURE_INVALIDATED,
                     f"{what} on a stream whose capture was invalidated; end that capture first")


cdef int refuse_if_capturing(cydriver.CUstream stream, str what) except -1:
    """Raise before any work when ``stream`` is capturing: staging's and
    rebinding's launches cannot be captured (embed with replay() instead)."""
    cdef cydriver.CUstreamCaptureStatus status = cydriver.CU_STREAM_CAPTURE_STATUS_NONE
    cdef cydriver.CUresult r
    with nogil:
        r = cydriver.cuStreamIsCapturing(stream, &status)
    if r != cydriver.CUDA_SUCCESS or status != cydriver.CU_STREAM_CAPTURE_STATUS_NONE:
        refuse_capturing_stream(r, status, what)
    return 0


def _destroy_later(Executable moved, int device, tuple streams):
    moved.destroy(device, streams)


# no_gc_clear: its owner's __dealloc__ calls destroy(), which reads these
# fields; the collector must not set them to None first.
@cython.final
@cython.no_gc_clear
cdef class Executable:
    """A captured graph and what keeps it runnable: its executable, the graph
    that executable was instantiated from, the storages from outside its pool
    that its work uses, its conditional nodes' records and its hold on the
    pool. A graph holds one, and a re-capture's predecessor a second."""

    def __cinit__(self):
        self.graph = NULL
        self.handle = NULL
        self.exec_graph = NULL
        self.kept = {}
        self.foreign_holds = {}
        self.conditionals = {}
        self.pool_id = 0
        self.has_pool = False

    cdef object update(self, cydriver.CUgraph g):
        """cuGraphExecUpdate the executable to ``g``: "success", or why the
        driver refused (the caller then instantiates)."""
        cdef cydriver.CUgraphExecUpdateResultInfo info
        cdef cydriver.CUresult r
        memset(&info, 0, sizeof(info))
        with nogil:
            r = cydriver.cuGraphExecUpdate(self.handle, g, &info)
        if r == cydriver.CUDA_SUCCESS and info.result == cydriver.CU_GRAPH_EXEC_UPDATE_SUCCESS:
            return "success"
        # any refusal (CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE, or an older driver's
        # NOT_SUPPORTED for a node kind) means: instantiate; a broken context
        # fails there, checked
        return _UPDATE_FAILURES.get(<int>info.result, "error")

    cdef void take_updated(self, Executable previous) noexcept:
        """Take ``previous``'s executable, updated in place to this graph,
        with the graph it was instantiated from (its nodes stay the ones the
        executable knows)."""
        self.handle = previous.handle
        previous.handle = NULL
        if previous.exec_graph != NULL:
            self.exec_graph = previous.exec_graph
            previous.exec_graph = NULL
        else:
            self.exec_graph = previous.graph
            previous.graph = NULL

    cdef void move_to(self, Executable other) noexcept:
        """Hand everything this executable holds to the empty ``other``."""
        other.handle, other.graph, other.exec_graph = self.handle, self.graph, self.exec_graph
        other.kept, other.foreign_holds, other.conditionals = self.kept, self.foreign_holds, self.conditionals
        other.pool, other.pool_id, other.has_pool = self.pool, self.pool_id, self.has_pool
        self.handle = self.exec_graph = NULL
        self.graph = NULL
        self.kept, self.foreign_holds, self.conditionals = {}, {}, {}
        self.pool, self.has_pool = None, False

    cdef void destroy(self, int device, tuple streams) noexcept:
        """Destroy the executable and the graphs, and give up the kept
        storages and the pool: their memory is reused only after the replays
        queued on ``streams`` (never raises). While teardown must wait (a
        capture is open, or this is the driver's thread: tensorplay._driver.teardown)
        all of it moves to a new Executable destroyed once it may run."""
        cdef Executable moved
        if self.handle == NULL and self.graph == NULL and self.exec_graph == NULL and not self.has_pool \
                and not self.kept and not self.foreign_holds:
            return
        if destroy_must_wait():
            try:
                moved = Executable.__new__(Executable)
                defer(_destroy_later, (moved, device, streams))
            except BaseException:
                pass                     # no memory for the queue: destroyed now, as before
            else:
                self.move_to(moved)
                return
        destroy_graph_objects(device, self.handle, self.graph)
        destroy_graph_objects(device, NULL, self.exec_graph)
        self.handle = self.exec_graph = NULL
        self.graph = NULL
        if streams and self.kept:
            for storage in self.kept.values():
                for h in streams:
                    try:
                        storage.record_stream(h)
                    except BaseException:
                        pass
        self.kept = {}
        self.conditionals = {}
        if self.has_pool:
            try:
                _allocator(device).release_pool(self.pool_id, streams)
            except BaseException:
                pass
            self.has_pool = False
        self.pool = None
        self.foreign_holds = {}         # last: letting PyTorch's pool go may free memory


# no_gc_clear: __dealloc__ destroys the executable with what these fields
# hold, so the collector must not set them to None first.
@cython.no_gc_clear
cdef class ReplayBase:
    """The launch half of CUDAGraphBase (tensorplay._graph.capture), which
    captures into ``_cur``; see tensorplay._graph.graphs.CUDAGraph."""

    def __cinit__(self):
        self._cur = Executable.__new__(Executable)
        self._device = -1
        self._last_replay_stream = NO_STREAM

    # ------------------------------------------------------------ replay and staging

    def replay(self, stream=None):
        """Launch the captured graph on the current stream, or on ``stream``, cuGraphLaunch.

        The GIL is released around the launch; the call does not wait for the
        graph to run. Graphs sharing a memory pool must replay in the order
        they were captured.

        Called while ``stream`` (default: the current stream) is capturing
        into another CUDAGraph, conditional bodies included, the graph is
        not launched but embedded there as a child graph node: the outer
        graph runs it at each of its replays, and keeps its memory (pool and
        the tensors it uses) alive, whatever becomes of this graph. A graph
        with conditional nodes cannot be embedded (the driver's rule), nor
        one captured into the pool the outer capture allocates from. The
        same holds inside another library's capture (``torch.cuda.graph``,
        CuPy's, cuda.core's): pass its capture stream
        (``replay(torch.cuda.current_stream())``) or use
        :func:`tensorplay.cuda.embed`, which finds it; that graph keeps this
        one's memory through a CUDA user object until it and its
        executables are destroyed.

        Parameters
        ----------
        stream : Stream or stream-like, optional
            A stream of the graph's device; default the current stream.
        """
        cdef cydriver.CUstream s
        cdef Stream so
        cdef cydriver.CUgraphExec handle = self._cur.handle
        cdef cydriver.CUresult r
        cdef cydriver.CUstreamCaptureStatus status = cydriver.CU_STREAM_CAPTURE_STATUS_NONE
        cdef bint launched = True
        if handle == NULL:
            self._replay_error("replay")
        if self._cur.pool is not None and self._cur.pool.asleep:
            self._asleep_error("replay")
        if stream is None:
            s = current_stream_handle(self._device)
        else:
            so = as_stream(stream, self._device)
            if so._device != self._device:
                raise ValueError(f"replay: the graph belongs to cuda:{self._device}, "
                                 f"the stream to cuda:{so._device}")
            s = so._handle
        if captures_open() and self._embed(s):
            return
        if self._rebinder is not None and self._rebinder.rebound:
            if self._embed(s):              # another library's capture: the graph, not the executable
                return
            self._rebinder.restore()        # replay() reads the static tensors
        with nogil:
            ensure_context(self._device)
            # asked first: a launch into another library's capture would
            # invalidate it (the ask costs far less than the launch)
            r = cydriver.cuStreamIsCapturing(s, &status)
            if r == cydriver.CUDA_SUCCESS and status == cydriver.CU_STREAM_CAPTURE_STATUS_NONE:
                r = cydriver.cuGraphLaunch(handle, s)
            else:
                launched = False
        if not launched:
            if r == cydriver.CUDA_SUCCESS and status == cydriver.CU_STREAM_CAPTURE_STATUS_ACTIVE and self._embed(s):
                return                      # another library's capture (PyTorch's, CuPy's, cuda.core's)
            refuse_capturing_stream(r, status, "replay")
        check(r)
        # only streams that ran a replay: the graph's memory waits for them
        # when it is freed (a stream the launch failed on may be gone by then)
        if <uintptr_t>s != self._last_replay_stream:
            self._note_replay_stream(<uintptr_t>s)

    cdef bint _embed(self, cydriver.CUstream s) except -1:
        """Embed the graph in the capture open on ``s`` (see replay); False when none is."""
        return embed_if_capturing(self._device, s, self._cur.graph, self._cur.pool_id, self._cur.kept,
                                  self._cur.foreign_holds, len(self._cur.conditionals) != 0)

    def upload(self, stream=None):
        """Upload the executable to the device now, cuGraphUpload, on the
        current stream or on ``stream``, so that the first replay costs what
        the later ones cost.

        ``capture_end`` instantiates but does not upload (as PyTorch's
        capture does not): the first replay uploads, which costs about a
        microsecond a node once. Call this ahead of time where a first replay
        must be fast (a server's first request).
        """
        cdef cydriver.CUstream s
        cdef Stream so
        cdef cydriver.CUgraphExec handle = self._cur.handle
        if handle == NULL:
            self._replay_error("upload")
        if self._cur.pool is not None and self._cur.pool.asleep:
            self._asleep_error("upload")
        if stream is None:
            s = current_stream_handle(self._device)
        else:
            so = as_stream(stream, self._device)
            if so._device != self._device:
                raise ValueError(f"upload: the graph belongs to cuda:{self._device}, "
                                 f"the stream to cuda:{so._device}")
            s = so._handle
        refuse_if_capturing(s, "upload")
        with nogil:
            ensure_context(self._device)
            check(cydriver.cuGraphUpload(handle, s))
        if <uintptr_t>s != self._last_replay_stream:
            self._note_replay_stream(<uintptr_t>s)

    def stage_and_launch(self, static_inputs, inputs):
        """Copy each of ``inputs`` onto the matching static buffer, then replay.

        Contiguous pairs of one dtype, device and shape are staged by one
        multi-tensor copy kernel (a table of (src, dst, nbytes) in its
        parameters; pairs beyond one table go through ``copy_``) that runs
        as the first node of a second executable of the graph; any other
        pair goes through ``static.copy_(input)`` (casts, strides,
        broadcasting, host data). Everything is validated before anything
        is copied; copies and the launch are ordered on the current stream.
        The per-call driver work (cuGraphExecKernelNodeSetParams and one
        cuGraphLaunch) runs without the GIL. The staged executable is built
        at the first call for a list of static inputs and kept while the
        same tensors are passed. A graph with conditional nodes (which the
        driver cannot clone) launches the copy kernel and then the graph.

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
        cdef Executable cur = self._cur
        if cur.handle == NULL:
            self._replay_error("stage_and_launch")
        if cur.pool is not None and cur.pool.asleep:
            self._asleep_error("stage_and_launch")
        check_stage_arguments(static_inputs, inputs)
        stream = current_stream_handle(self._device)
        refuse_if_capturing(stream, "stage_and_launch")
        if stager is None or not stager.holds(static_inputs):
            self._drop_stager()
            stager = make_stager(cur.graph, cur.handle, self._device, static_inputs, not cur.conditionals,
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
        if self._cur.handle == NULL:
            self._replay_error("rebind_and_launch")
        if self._cur.pool is not None and self._cur.pool.asleep:
            self._asleep_error("rebind_and_launch")
        stream = current_stream_handle(self._device)
        refuse_if_capturing(stream, "rebind_and_launch")
        r = self._rebinder_for(static_inputs, static_outputs, "rebind_and_launch")
        if <uintptr_t>stream != self._last_replay_stream:
            self._note_replay_stream(<uintptr_t>stream)
        r.launch(inputs, outputs, stream)

    def rebindable(self, static_inputs, static_outputs=()):
        """For each of these static tensors (inputs, then outputs): True when
        :meth:`rebind_and_launch` rebinds it without a copy, False when it
        copies it (something the graph runs that cannot be patched uses it)."""
        if self._cur.handle == NULL:
            self._replay_error("rebindable")
        return self._rebinder_for(static_inputs, static_outputs, "rebindable").rebindable()

    cdef Rebinder _rebinder_for(self, object static_inputs, object static_outputs, str what):
        cdef Rebinder r = self._rebinder
        cdef Executable cur = self._cur
        if r is not None and r.holds(static_inputs, static_outputs):
            return r
        if r is not None:
            r.restore()                # the executable back on the old statics (raises: r stays)
            self._drop_rebinder()
        r = make_rebinder(cur.graph, cur.exec_graph, cur.handle, self._device, static_inputs, static_outputs,
                          cur.conditionals, self._kernels.multi_copy, self._kernels.copy, what)
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

    cdef int _asleep_error(self, str what) except -1:
        raise PoolAsleepError(f"{what}: the graph's memory pool {self._cur.pool_id} is asleep (sleep() gave its "
                              f"memory back); call wake() on it first")

    cdef int _replay_error(self, str what) except -1:
        """Say why ``what`` (the public method called) finds no executable."""
        if self._capturing:
            raise RuntimeError(f"{what}: the graph's capture is still open; call capture_end() first")
        if self._pid and self._pid != os.getpid():
            raise RuntimeError(f"{what}: a CUDA graph cannot be replayed in a forked child process")
        if what == "rebindable":
            raise RuntimeError(f"{what}: nothing captured; capture a graph first (or it was reset)")
        raise RuntimeError(f"{what}: nothing to replay; capture a graph first (or it was reset)")

    # ------------------------------------------------------------ introspection

    def _describe(self, bint detailed, str what="describe"):
        """The captured graph as plain data (see CUDAGraph.describe); ``what``
        is the public method that asked, for the error."""
        if self._cur.graph == NULL:
            raise RuntimeError(f"{what}: nothing captured (capture first; a reset graph has no nodes)")
        ensure_context(self._device)
        return describe_graph(self._cur.graph, detailed, self._cur.conditionals)

    def _kernel_argument_words(self, str what="kernel_buffers"):
        """The 64-bit words the captured graph's kernels were given as
        arguments, and how many kernel nodes could not be read (see
        CUDAGraph.kernel_buffers)."""
        cdef set words = set()
        if self._cur.graph == NULL:
            raise RuntimeError(f"{what}: nothing captured (capture first; a reset graph has no nodes)")
        ensure_context(self._device)
        unreadable = kernel_argument_words(self._cur.graph, self._cur.conditionals, words)
        return words, unreadable

    def _profile_source(self, str what="profile_nodes"):
        """The captured graph (as an int) and its conditional nodes' bodies,
        for the node profile's instrumented executable; refused as replay() is."""
        if self._cur.handle == NULL:
            self._replay_error(what)
        if self._cur.pool is not None and self._cur.pool.asleep:
            self._asleep_error(what)
        return <uintptr_t>self._cur.graph, self._cur.conditionals

    # ------------------------------------------------------------ lifetime

    cdef void retire_previous(self) noexcept:
        """Destroy what a re-capture set aside (its executable too unless it
        was updated in place); its kept storages and pool memory are reused
        only after the replays already queued."""
        if self._previous is None:
            return
        streams = tuple(self._replay_streams) if self._replay_streams else ()
        self._previous.destroy(self._device, streams)
        self._previous = None

    cdef void release_executables(self) noexcept:
        """Destroy the executable and its graph, a re-capture's predecessor
        too, and forget the replay streams (never raises)."""
        self._drop_stager()
        self._drop_rebinder()               # the executable goes: nothing to point back
        self.retire_previous()              # a failed re-capture discards its predecessor too
        # what replays may still be using is reused only after them
        streams = tuple(self._replay_streams) if self._replay_streams else ()
        self._replay_streams = None
        self._last_replay_stream = NO_STREAM
        self._cur.destroy(self._device, streams)
        self._num_nodes = 0
        self._update_result = None

    def __dealloc__(self):
        self.release_executables()

    # ------------------------------------------------------------ state

    @property
    def num_nodes(self):
        """The number of nodes of the captured graph, cuGraphGetNodes (0 before a capture ends)."""
        return self._num_nodes

    @property
    def pool_id(self):
        """The allocator pool this graph captured into (None before a capture)."""
        return self._cur.pool_id if (self._cur.has_pool or self._cur.graph != NULL) else None

    @property
    def exec_handle(self):
        """The CUgraphExec as an int (0 before capture_end); for interop and benchmarks."""
        return <uintptr_t>self._cur.handle

    @property
    def graph_handle(self):
        """The CUgraph the last capture produced, as an int (0 before
        capture_end); owned by this graph, valid until ``reset``. For interop
        and benchmarks: instantiate or inspect it with the driver, never destroy it."""
        return <uintptr_t>self._cur.graph

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
        return self._cur.handle != NULL

    @property
    def kept_storages(self):
        """Number of storages this graph keeps alive for its captured work."""
        return len(self._cur.kept)
