# SPDX-License-Identifier: Apache-2.0
"""CUDA graphs: capture GPU work once, replay it for the cost of one launch.

``CUDAGraph`` validates arguments here and inherits capture, replay and
lifetime handling from the compiled ``tensorplay._graph.capture.CUDAGraphBase``
(replay, staging and rebinding from its base, ``tensorplay._graph.replay``);
``replay`` is a compiled method, so a replay is one call into C with the GIL
released around ``cuGraphLaunch``.
"""

from __future__ import annotations

import numbers
import os
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from types import TracebackType
from typing import TYPE_CHECKING, Any, Generic, ParamSpec, TypeVar, Union, overload

from tensorplay._frames import warn_user
from tensorplay._memory.api import graph_pool_handle
from tensorplay._memory.sharing import pool_ranges
from tensorplay._driver.context import CudaError, current_device, driver_version, is_available, require_cuda
from tensorplay._graph.capture import CUDAGraphBase
from tensorplay._graph.conditionals import IF_NODE, MAX_SWITCH_CASES, SWITCH_NODE, WHILE_NODE
from tensorplay._driver.launch import Function
from tensorplay._graph import kernels as graph_kernels
from tensorplay._driver.stream import current_stream, stream as use_stream
from tensorplay._graph.streams import CAPTURE_MODES, is_stream_capturing, warmup_stream
from tensorplay._tensor.tensor import Tensor as _Tensor
from tensorplay.types import CaptureErrorMode, PoolLike, StreamLike, TensorLike
from tensorplay._graph import dot as _dot
from tensorplay._graph import structured as _structured
from tensorplay._graph import node_profile as _node_profile
from tensorplay._graph.foreign import (ForeignRandomError, OutsidePoolBlock, explain_capture_error, graph_tensor,
                                      is_foreign_tensor)
from tensorplay._graph.pools import GraphPool
from tensorplay._graph.collectives import note_capture

if TYPE_CHECKING:
    from tensorplay._tensor.tensor import Tensor

Outputs = Union["Tensor", "tuple[Tensor, ...]", "list[Tensor]"]
P = ParamSpec("P")
R = TypeVar("R")
P1 = ParamSpec("P1")
R1 = TypeVar("R1")
P2 = ParamSpec("P2")
R2 = TypeVar("R2")
P3 = ParamSpec("P3")
R3 = TypeVar("R3")

__all__ = ["CUDAGraph", "ForeignRandomError", "graph", "graph_pool_handle", "is_current_stream_capturing",
           "make_graphed_callables"]


def pool_id_of(pool: PoolLike) -> int:
    if pool is None:
        return graph_pool_handle()
    if isinstance(pool, GraphPool):
        return pool.id
    if isinstance(pool, CUDAGraph):
        pid = pool.pool_id
        if pid is None:
            raise ValueError("pool: that graph has not captured anything, so it has no pool to share")
        return pid
    if isinstance(pool, bool) or not isinstance(pool, numbers.Integral):
        raise TypeError(f"pool must be None, a GraphPool, an id from graph_pool_handle(), a graph's pool_id "
                        f"or a CUDAGraph, got {type(pool).__name__}")
    if pool <= 0:
        raise ValueError(f"pool ids are positive (from graph_pool_handle()), got {pool}")
    return int(pool)


def _mode_of(capture_error_mode: str) -> int:
    try:
        return CAPTURE_MODES[capture_error_mode]
    except (KeyError, TypeError):
        raise ValueError(f"capture_error_mode must be one of {', '.join(map(repr, CAPTURE_MODES))}, "
                         f"got {capture_error_mode!r}") from None


class _GraphKernels:
    """What the compiled graph layer launches or calls but does not own."""
    @staticmethod
    def set_conditional(device: int) -> Function:
        return graph_kernels.set_conditional_function(device)

    @staticmethod
    def set_switch(dtype: str, device: int) -> Function:
        return graph_kernels.set_switch_function(dtype, device)

    @staticmethod
    def multi_copy(capacity: int, device: int) -> Function:
        return graph_kernels.multi_copy_function(capacity, device)

    @staticmethod
    def copy(static: Tensor, source: Any) -> Any:
        """A staging pair the copy kernel cannot take: casts, strides, broadcasting, host data."""
        return static.copy_(source)


_GRAPH_KERNELS = _GraphKernels()


class CUDAGraph(CUDAGraphBase):
    """A CUDA graph: work captured from a stream, replayed as one launch.

    Capture with :meth:`capture_begin` / :meth:`capture_end` (or the
    :class:`graph` context manager), then :meth:`replay`. Tensors allocated
    during the capture live in the graph's memory pool; their addresses are
    what every replay reads and writes, so feed new inputs by copying into
    the tensors used at capture time.

    A graph dropped while its capture is open ends and discards that
    capture when it is collected, with a ``ResourceWarning``.
    """

    def __init__(self) -> None:
        super().__init__(_GRAPH_KERNELS)

    def capture_begin(self, pool: PoolLike = None, capture_error_mode: CaptureErrorMode = "global",
                      stream: StreamLike | None = None, foreign: bool | None = None) -> None:
        """Begin capturing work queued on the current thread's streams.

        Parameters
        ----------
        pool : None, int or CUDAGraph
            None: a fresh private memory pool, or for a re-capture the pool
            of this graph's previous capture. An id from
            :func:`graph_pool_handle`, another graph's ``pool_id`` or another
            ``CUDAGraph``: share that pool (graphs sharing a pool must replay
            in the order they were captured).
        capture_error_mode : {'global', 'thread_local', 'relaxed'}
            ``'global'``: any unsafe CUDA call in the process (a synchronize,
            a cuMemAlloc) fails the capture; ``'thread_local'``: only calls
            from this thread; ``'relaxed'``: no guard
            (CU_STREAM_CAPTURE_MODE_*).
        stream : Stream or stream-like, optional
            The capture stream; default a dedicated side stream of the current
            device. It first waits for the work queued on the current stream
            and is the current stream until :meth:`capture_end`.
        foreign : bool, optional
            Whether other libraries' work is captured too: while the capture
            (and each conditional body) is open, the current streams of
            PyTorch and CuPy on this thread, when they are imported, are the
            stream being captured, and their allocations go to memory that
            lives as long as this graph's pool (see the foreign-kernels guide).
            None (default): the process setting,
            :func:`tensorplay.cuda.set_foreign_capture`, on unless the
            environment sets ``TENSORPLAY_FOREIGN_CAPTURE=0``.

        Raises
        ------
        ValueError
            For an unknown ``capture_error_mode`` or pool, or the legacy
            default stream as ``stream``.
        RuntimeError
            If this graph is already capturing.

        Notes
        -----
        Wraps cuStreamBeginCapture; from here the caching allocator serves
        allocations on the capture stream from the graph's pool.

        A graph that holds an executable can capture again (a re-capture,
        on the same device): the previous executable keeps its place until
        :meth:`capture_end`, which updates it in place with the new graph
        (cuGraphExecUpdate; :attr:`exec_handle` stays the same) when the
        driver accepts the new graph as the same topology, and otherwise
        instantiates a new executable and destroys the old one
        (:attr:`update_result` says which). The previous capture's stager,
        node records and kept storages are dropped once the new executable
        is in place. A re-capture that fails resets the graph (its previous
        executable too); :meth:`reset` starts afresh.
        """
        # a re-capture stays in its pool unless told otherwise
        if foreign is not None and not isinstance(foreign, bool):
            raise TypeError(f"capture_begin: foreign must be None, True or False, got {type(foreign).__name__}")
        previous = self.pool_id if pool is None and self.is_instantiated and not self.is_capturing else None
        pool_id = previous if previous is not None else pool_id_of(pool)
        mode = _mode_of(capture_error_mode)
        self._capture_begin(pool_id, mode, stream, foreign)

    def capture_end(self) -> None:
        """End the capture and build the executable now (cuGraphInstantiate);
        for a re-capture, first try updating the previous executable
        (cuGraphExecUpdate, see :meth:`capture_begin`). The executable is not
        uploaded (PyTorch's capture does not upload either): the first replay
        does it, or :meth:`upload` ahead of time.

        Raises if no capture is open, on another thread than the one that
        began it, or when the driver rejects the capture (for example work
        forked to another stream and never joined back); the graph is then
        reset and can capture again.
        """
        self._capture_end()
        note_capture(self)          # sleep looks for NCCL's kernels in a pool's graphs
        if self.num_nodes == 0:
            warn_user("the captured CUDA graph is empty: no GPU work was queued on the capture stream",
                      UserWarning)

    def instantiate(self) -> None:
        """Build the executable; a no-op once built (capture_end already does it)."""
        if self.is_instantiated:
            return
        if self.is_capturing:
            raise RuntimeError("instantiate: the capture is still open; call capture_end()")
        raise RuntimeError("instantiate: nothing captured (or the graph was reset)")

    # ------------------------------------------------------------ introspection

    def enable_debug_mode(self) -> None:
        """Keep full node attributes for :meth:`debug_dump` (call before capturing)."""
        self._debug_mode = True

    def describe(self, static_inputs: Sequence[Any] | None = None,
                 static_outputs: Sequence[Any] = (), *,
                 profile: _node_profile.GraphProfile | None = None) -> dict[str, Any]:
        """Return the captured graph as plain data (nodes, edges, conditional bodies).

        The description is read back from the driver (cuGraphGetNodes,
        cuGraphGetEdges and the node attribute getters)::

            {"nodes": [{"id": int, "kind": "kernel" | "memcpy" | "memset" | "event_record" |
                        "wait_event" | "mem_alloc" | "mem_free" | "empty" | "conditional" | ...,
                        "name": kernel name (kernels),
                        "type": "if" | "while" | "switch" (conditional nodes),
                        "bodies": [description, ...] (conditional nodes, in branch
                                  order, each with a "label": "then" / "else" (IF),
                                  "body" (WHILE), "case 0" ... "case n-1" (SWITCH)),
                        "attrs": {grid, block, shared_mem, num_params, bytes, value, direction,
                                  event, handle, ...}},
                       ...],
             "edges": [[from_id, to_id], ...],
             "programmatic_edges": [[from_id, to_id], ...]}

        ``programmatic_edges`` are the edges (of ``edges``) between two
        kernels launched with programmatic dependent launch: the kernel after
        may start while the one before drains and waits in its code for its
        results (see :data:`tensorplay.backends.cuda.pdl`). Attributes beyond
        sizes are present when debug mode was enabled.

        With ``static_inputs`` (and ``static_outputs``) given, the description
        also says, for each, whether :meth:`rebind_and_launch` rebinds it
        without a copy (see :meth:`rebindable`)::

            "rebindable": {"inputs": [bool, ...], "outputs": [bool, ...]}

        With ``profile`` (:meth:`profile_nodes`) each node also has its ``"time"``.
        """
        description = self._describe(getattr(self, "_debug_mode", False), "describe")
        if profile is not None:
            description = profile.annotate(description)
        if static_inputs is not None:
            flags = self.rebindable(static_inputs, static_outputs)
            n_in = len(static_inputs)
            description["rebindable"] = {"inputs": flags[:n_in], "outputs": flags[n_in:]}
        return description

    def debug_dump(self, path: str | os.PathLike[str], *,
                   profile: _node_profile.GraphProfile | None = None) -> str:
        """Write a picture of the captured graph to ``path`` and return the path written.

        The picture is Graphviz DOT (nodes, edges, conditional bodies as
        clusters; the branches of an IF/ELSE and the cases of a SWITCH
        labelled). With a ``.svg`` or ``.png`` name and Graphviz's ``dot``
        installed it is rendered; without ``dot`` the DOT file is written next
        to it and a warning says how to render it.

        Parameters
        ----------
        path : str or os.PathLike
            Where to write: ``.dot``, ``.svg`` or ``.png``.
        profile : GraphProfile, optional
            From :meth:`profile_nodes`: nodes coloured by their share of the replay.

        Returns
        -------
        str
            The file written.
        """
        import shutil
        import subprocess
        path = os.fspath(path)
        desc = self._describe(getattr(self, "_debug_mode", False), "debug_dump")
        if profile is not None:
            desc = profile.annotate(desc)
        dot = _dot.to_dot(desc, detailed=getattr(self, "_debug_mode", False),
                          title=f"CUDA graph on cuda:{self.device_index} ({self.num_nodes} nodes)")
        root, ext = os.path.splitext(path)
        image_format = ext[1:].lower() if ext.lower() in (".svg", ".png") else None
        dot_path = root + ".dot" if image_format else path
        with open(dot_path, "w") as f:
            f.write(dot)
        if image_format is None:
            return path
        tool = shutil.which("dot")
        if tool is None:
            warn_user(f"Graphviz 'dot' not found: wrote {dot_path}; render it with "
                      f"'dot -T{image_format} {dot_path} -o {path}'", UserWarning)
            return dot_path
        res = subprocess.run([tool, f"-T{image_format}", dot_path, "-o", path],
                             capture_output=True, text=True)
        if res.returncode != 0:
            raise OSError(f"dot failed to render {path}: {res.stderr.strip()}")
        return path

    def profile_nodes(self, replays: int = 20, *, warmup: int = 2, samples: int = 256,
                      stream: StreamLike | None = None) -> _node_profile.GraphProfile:
        """The GPU time of each node of the graph's replays, as a :class:`GraphProfile`.

        Replays ``warmup + replays`` times, on ``stream``, an executable of the
        graph with a timestamp kernel around every node (bodies, child graphs
        too); the graph's own replays only to be timed whole. ``samples``: the
        executions kept per node and replay (a WHILE body's first ones).
        """
        return _node_profile.profile_graph(self, replays, warmup, samples, stream)

    # ------------------------------------------------------------ other allocators

    def outside_pool(self) -> AbstractContextManager[CUDAGraph]:
        """``with g.outside_pool():`` inside a capture: PyTorch's and CuPy's
        allocations in the block are not routed into the graph's pool, so
        they come from the allocator you choose inside it, such as
        ``with torch.cuda.use_mem_pool(other_pool):`` (a ``torch.cuda.MemPool``
        over NCCL's ``ncclMemAlloc``, for NCCL's symmetric windows, as vLLM
        does). The capture goes on: work queued in the block is captured,
        on the same stream. At the block's end the routing into the graph's
        pool resumes.

        Memory allocated in the block belongs to that allocator, not to the
        graph: keep the tensors alive as long as the graph may replay. The
        chosen allocator must be safe to call during a capture (PyTorch's
        own ``cudaMalloc`` is; an allocator that maps memory itself may need
        ``capture_error_mode='relaxed'``, or its segments made in the eager
        warm-up). Without a chosen allocator, PyTorch allocates from its
        default pool on a capturing stream, which fails the capture.
        tensorplay's own allocations stay in the graph's pool. A capture
        that follows no library (``foreign=False``) has nothing to pause:
        the block changes nothing.

        Raises RuntimeError outside a capture of this graph, on another
        thread than the capture's, or when already inside such a block.
        """
        return OutsidePoolBlock(self)

    def kernel_buffers(self) -> list[int]:
        """Return the device pointers the captured kernels were given that point into the graph's pool.

        Every 64-bit kernel argument of the captured graph (child graphs and
        conditional bodies included) whose value falls inside a segment of
        this graph's memory pool on its device, distinct and sorted: the
        buffers a custom all-reduce registers after a capture (what vLLM's
        ``register_graph_buffers`` collects), which a peer reaches through
        :meth:`MappedPeerMemory.translate <tensorplay.cuda.MappedPeerMemory.translate>`
        once the pool is exported. Pointers the kernels find in memory
        (inside a struct in device memory) and the operands of memcpy and
        memset nodes are not seen; an integer argument that happens to
        equal an address in the pool would be. Kernel nodes whose arguments
        the driver does not lay out are skipped with a RuntimeWarning.
        """
        words, unreadable = self._kernel_argument_words("kernel_buffers")
        if unreadable:
            warn_user(f"kernel_buffers: the arguments of {unreadable} kernel node(s) could not be read "
                      f"(no layout from the driver); their buffers are not listed", RuntimeWarning)
        pool_id = self.pool_id
        if pool_id is None:            # nothing captured: no pool, no buffers
            return []
        ranges = pool_ranges(pool_id, self.device_index)
        return sorted(w for w in words if any(a <= w < a + n for a, n in ranges))

    # ------------------------------------------------------------ conditional nodes

    def _check_capture_device(self, t: Tensor, name: str, what: str, need: tuple[int, int], feature: str) -> None:
        if not self.is_capturing:
            raise RuntimeError(f"{what}: no capture is open on this graph (call capture_begin first)")
        if t.device.index != self.device_index:
            raise ValueError(f"{what}: {name} is on {t.device}, the capture on cuda:{self.device_index}")
        if driver_version() < need:
            raise RuntimeError(f"{what}: {feature} need a CUDA {need[0]}.{need[1]} or newer driver, "
                               f"this one is {'.'.join(map(str, driver_version()))}")

    def _check_pred(self, scalar_pred, what, with_else=False):
        scalar_pred = graph_tensor(scalar_pred)       # a PyTorch or CuPy tensor: a view of its memory
        if not isinstance(scalar_pred, _Tensor):
            raise TypeError(f"{what}: scalar_pred must be a CUDA bool tensor, got {type(scalar_pred).__name__}")
        if not scalar_pred.is_cuda:
            raise ValueError(f"{what}: scalar_pred must be a CUDA tensor, got a CPU tensor")
        if scalar_pred.dtype.name != "bool":
            raise TypeError(f"{what}: scalar_pred must have dtype bool, got {scalar_pred.dtype.name}")
        if scalar_pred.numel() != 1:
            raise ValueError(f"{what}: scalar_pred must have exactly one element, got shape {scalar_pred.shape}")
        if with_else:
            self._check_capture_device(scalar_pred, "scalar_pred", what, (12, 8), "IF nodes with an else body")
        else:
            self._check_capture_device(scalar_pred, "scalar_pred", what, (12, 4), "conditional graph nodes")
        return scalar_pred

    def _check_index(self, index, what):
        index = graph_tensor(index)
        if not isinstance(index, _Tensor):
            raise TypeError(f"{what}: index must be a one-element CUDA integer tensor, got {type(index).__name__}")
        if index.dtype.name not in graph_kernels.SWITCH_INDEX_TYPES:
            raise TypeError(f"{what}: index must have an integer dtype, got {index.dtype.name}")
        if not index.is_cuda:
            raise ValueError(f"{what}: index must be a CUDA tensor, got a CPU tensor")
        if index.numel() != 1:
            raise ValueError(f"{what}: index must have exactly one element, got shape {index.shape}")
        self._check_capture_device(index, "index", what, (12, 8), "SWITCH nodes")
        return index

    @staticmethod
    def _check_num_cases(num_cases, what):
        if isinstance(num_cases, bool) or not isinstance(num_cases, numbers.Integral):
            raise TypeError(f"{what}: num_cases must be an int, got {type(num_cases).__name__}")
        if not 1 <= num_cases <= MAX_SWITCH_CASES:
            raise ValueError(f"{what}: num_cases must be in [1, {MAX_SWITCH_CASES}], got {num_cases}")
        return int(num_cases)

    def begin_capture_to_if_node(self, scalar_pred: TensorLike, with_else: bool = False) -> None:
        """Capture the following work into the body of an IF node: at replay
        the body runs only when ``scalar_pred`` (a one-element CUDA bool
        tensor, read on the device when the node is reached) is true. Close
        the body with :meth:`end_capture_to_conditional_node`.

        With ``with_else=True`` the node has a second body, run when
        ``scalar_pred`` is false: :meth:`begin_capture_to_else_branch` ends
        the then body and captures the else body (one node and one
        set-conditional kernel, where two IF nodes on ``pred`` and
        ``logical_not(pred)`` take two of each). An else body never begun
        stays empty. Needs a CUDA 12.8 or newer driver.
        """
        if not isinstance(with_else, bool):
            raise TypeError(f"begin_capture_to_if_node: with_else must be a bool, got {type(with_else).__name__}")
        p = self._check_pred(scalar_pred, "begin_capture_to_if_node", with_else)
        self._begin_conditional(IF_NODE, p.data_ptr(), p, 2 if with_else else 1)

    def begin_capture_to_else_branch(self) -> None:
        """End the then body of the innermost open IF node (opened with
        ``with_else=True``) and capture the following work into its else
        body, which runs when the predicate is false. Once per node; close
        the node with :meth:`end_capture_to_conditional_node`.

        Raises RuntimeError, before any driver call and leaving the capture
        as it was, outside an IF node with an else body or for a second else.
        """
        self._begin_branch(IF_NODE, 1, "begin_capture_to_else_branch")

    def begin_capture_to_while_node(self, scalar_pred: TensorLike) -> None:
        """Capture the following work into the body of a WHILE node: at replay
        the body runs while ``scalar_pred`` is true, sampled before the first
        iteration and again at the end of every iteration (so a body that
        updates the predicate ends the loop)."""
        p = self._check_pred(scalar_pred, "begin_capture_to_while_node")
        self._begin_conditional(WHILE_NODE, p.data_ptr(), p)

    def begin_capture_to_switch_node(self, index: TensorLike, num_cases: int) -> None:
        """Add a SWITCH node of ``num_cases`` bodies: at replay, body ``k``
        runs when ``index`` (a one-element CUDA integer tensor of any integer
        dtype, read on the device when the node is reached) equals ``k``; an
        index outside ``[0, num_cases)``, negative ones included, runs no
        body (negative values are mapped past the last case).

        No case is open after this call: capture each with
        :meth:`begin_capture_to_switch_case`, in increasing order, then close
        the node with :meth:`end_capture_to_conditional_node`. Cases never
        begun stay empty (that index runs nothing). Work queued after this
        call and before the first case (or between cases) would land in no
        case: it is refused and the capture discarded.

        ``num_cases`` is at most 1024 (``tensorplay._graph.graphs.MAX_SWITCH_CASES``):
        the driver documents no bound, this is tensorplay's. Needs a CUDA 12.8 or newer
        driver.
        """
        n = self._check_num_cases(num_cases, "begin_capture_to_switch_node")
        i = self._check_index(index, "begin_capture_to_switch_node")
        self._begin_conditional(SWITCH_NODE, i.data_ptr(), i, n, False, i.dtype.name)

    def begin_capture_to_switch_case(self, case: int) -> None:
        """Capture the following work into case ``case`` of the innermost
        open SWITCH node, ending the case open before it. Cases begin in
        increasing order, each at most once (skipped ones stay empty).

        Raises TypeError or ValueError for a case that is not an int in
        ``[0, num_cases)``, RuntimeError outside a SWITCH or for a case
        begun already or out of order: before any driver call, the capture
        left as it was.
        """
        if isinstance(case, bool) or not isinstance(case, numbers.Integral):
            raise TypeError(f"begin_capture_to_switch_case: case must be an int, got {type(case).__name__}")
        self._begin_branch(SWITCH_NODE, int(case), "begin_capture_to_switch_case")

    def end_capture_to_conditional_node(self) -> None:
        """Close the innermost open conditional node (its open body or case,
        and the node itself); capture returns to its parent."""
        self._end_conditional()

    def set_conditional_handle_for_current_node(self, scalar_pred: TensorLike) -> None:
        """Sample ``scalar_pred`` into the innermost open node's condition now
        and make it that node's predicate.

        For a WHILE node this decides whether the loop goes on (the body
        samples the predicate again at the end of each iteration). An IF,
        IF/ELSE or SWITCH node has chosen its body when that body runs, so
        there the call only writes the handle. Inside a SWITCH case it takes
        a one-element CUDA integer tensor (the index, any integer dtype, out
        of range selecting no case); elsewhere a bool tensor. Between the
        branches of a node (none open) it raises RuntimeError.
        """
        what = "set_conditional_handle_for_current_node"
        inner = self._innermost_conditional
        if inner is not None and inner[0] == "switch":
            i = self._check_index(scalar_pred, what)
            self._set_conditional(i.data_ptr(), i, i.dtype.name)
            return
        p = self._check_pred(scalar_pred, what)
        self._set_conditional(p.data_ptr(), p)

    def _begin_node(self, kind: int, pred: TensorLike, num_bodies: int) -> None:
        """Open an IF/ELSE (two bodies) or SWITCH node with no branch open:
        the structured form's outer block."""
        if kind == SWITCH_NODE:
            n = self._check_num_cases(num_bodies, "switch")
            i = self._check_index(pred, "switch")
            self._begin_conditional(SWITCH_NODE, i.data_ptr(), i, n, False, i.dtype.name)
        else:
            p = self._check_pred(pred, "if_else", True)
            self._begin_conditional(IF_NODE, p.data_ptr(), p, 2, False)

    # ------------------------------------------------------------ structured conditional nodes

    def if_(self, scalar_pred: TensorLike) -> _structured.Body:
        """``with g.if_(pred): ...``: the block is the body of an IF node
        (:meth:`begin_capture_to_if_node` on entry,
        :meth:`end_capture_to_conditional_node` on exit). An exception in the
        block discards the whole capture and leaves the graph reset."""
        return _structured.Body(self, IF_NODE, scalar_pred)

    def while_(self, scalar_pred: TensorLike) -> _structured.Body:
        """``with g.while_(pred): ...``: the block is the body of a WHILE node
        (see :meth:`begin_capture_to_while_node`)."""
        return _structured.Body(self, WHILE_NODE, scalar_pred)

    def if_else(self, scalar_pred: TensorLike) -> _structured.IfElse:
        """``with g.if_else(pred) as (then, otherwise):`` one IF node with an
        else body; inside, ``with then: ...`` captures the body run when
        ``pred`` is true and ``with otherwise: ...`` the one run when it is
        false, in that order, each at most once (one left out stays empty).
        The outer block closes the node, so the pair cannot be left
        unbalanced. Work inside the outer block but outside both branch
        blocks is refused (it would run in neither branch)."""
        return _structured.IfElse(self, scalar_pred)

    def switch(self, index: TensorLike, num_cases: int) -> _structured.Switch:
        """``with g.switch(index, n) as cases:`` one SWITCH node; inside,
        ``with cases[k]: ...`` captures case ``k``, in increasing order, each
        at most once (cases left out stay empty). An index outside ``[0, n)``
        runs no case. See :meth:`begin_capture_to_switch_node`."""
        return _structured.Switch(self, index, num_cases)

    def __repr__(self):
        state = "capturing" if self.is_capturing else ("ready" if self.is_instantiated else "empty")
        if self.device_index < 0:           # never captured: no device yet
            return f"<CUDAGraph {state}>"
        return f"<CUDAGraph {state} device=cuda:{self.device_index} nodes={self.num_nodes} pool={self.pool_id}>"


def is_current_stream_capturing() -> bool:
    """Return True while the current stream of the current device is capturing.

    Wraps cuStreamIsCapturing on this thread's current stream. Without CUDA
    nothing can capture: False, as PyTorch's.
    """
    if not is_available():
        return False
    dev = current_device()
    return is_stream_capturing(current_stream(dev).handle, dev)


class graph:
    """Capture the body of a ``with`` block into ``cuda_graph``.

    ``with tensorplay.cuda.graph(g): y = f(x)`` calls
    :meth:`CUDAGraph.capture_begin` on entry and
    :meth:`CUDAGraph.capture_end` on exit, and gives the graph to ``as``. If
    the body raises, the capture is ended and discarded, the graph left
    reset and reusable, and the exception propagates.

    Parameters
    ----------
    cuda_graph : CUDAGraph
        The graph to capture into.
    pool : None, int or CUDAGraph, optional
        The memory pool; see :meth:`CUDAGraph.capture_begin`.
    stream : Stream or stream-like, optional
        The capture stream; default a side stream of the current device.
    capture_error_mode : {'global', 'thread_local', 'relaxed'}, optional
        How strictly unsafe CUDA calls fail the capture; default ``'global'``.
    foreign : bool, optional
        Whether PyTorch's and CuPy's work in the block is captured too (their
        current stream is the capture's); default the process setting (on),
        see :meth:`CUDAGraph.capture_begin`.

    Notes
    -----
    A PyTorch random op in the block raises
    :class:`~tensorplay.cuda.ForeignRandomError`, which says how to draw
    the numbers with tensorplay's graph-safe generators instead.
    """

    def __init__(self, cuda_graph: CUDAGraph, pool: PoolLike = None, stream: StreamLike | None = None,
                 capture_error_mode: CaptureErrorMode = "global", foreign: bool | None = None) -> None:
        if not isinstance(cuda_graph, CUDAGraph):
            raise TypeError(f"graph() expects a CUDAGraph, got {type(cuda_graph).__name__}")
        self.cuda_graph = cuda_graph
        self.pool = pool
        self.stream = stream
        self.capture_error_mode: CaptureErrorMode = capture_error_mode
        self.foreign = foreign

    def __enter__(self) -> CUDAGraph:
        self.cuda_graph.capture_begin(pool=self.pool, capture_error_mode=self.capture_error_mode,
                                      stream=self.stream, foreign=self.foreign)
        return self.cuda_graph

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if exc_type is not None:
            self.cuda_graph.reset()
            better = explain_capture_error(exc) if exc is not None else None
            if better is not None:
                raise better from exc
            return
        try:
            self.cuda_graph.capture_end()
        except BaseException as failed:
            self.cuda_graph.reset()
            better = explain_capture_error(failed)
            if better is not None:
                raise better from failed
            raise


# ---------------------------------------------------------------- graphed callables

def _is_tensor(obj: object) -> bool:
    return isinstance(obj, _Tensor) or is_foreign_tensor(obj)


def _flatten_outputs(out: object, where: str) -> Outputs:
    if _is_tensor(out):
        return out                                   # type: ignore[return-value]  # a tensor, ours or not
    if isinstance(out, (tuple, list)) and all(_is_tensor(o) for o in out):
        return type(out)(out)
    raise TypeError(f"{where} must return a tensor or a tuple/list of tensors to be graphed, "
                    f"got {type(out).__name__}")


def capture_callable(fn: Callable[..., Any], static_args: Sequence[Any], *, warmup: int = 2,
                     pool: PoolLike = None, capture_error_mode: CaptureErrorMode = "global",
                     where: str = "fn") -> tuple[CUDAGraph, Outputs]:
    """Warm ``fn`` up on a side stream, then capture ``fn(*static_args)``.

    Returns (graph, static outputs). A host read inside ``fn`` (item(),
    tolist(), bool(tensor), numpy()) fails the capture with a RuntimeError
    naming the cause; the graph is left reset.
    """
    cur = current_stream()
    side = warmup_stream(cur.device_index)
    side.wait_stream(cur)
    with use_stream(side):
        for _ in range(warmup):
            fn(*static_args)
    cur.wait_stream(side)
    g = CUDAGraph()
    try:
        with graph(g, pool=pool, capture_error_mode=capture_error_mode):
            out = fn(*static_args)
    except CudaError as exc:
        if "CAPTURE" in exc.name:
            raise RuntimeError(
                f"{where} could not be captured: it makes a call that cannot run inside a CUDA graph "
                f"({exc.name}), typically a data-dependent host read such as item(), tolist(), "
                f"numpy() or bool(tensor), or a synchronize") from exc
        raise
    return g, _flatten_outputs(out, where)


@overload
def make_graphed_callables(callables: Callable[P, R], sample_args: Sequence[Tensor],
                           num_warmup_iters: int = 3, pool: PoolLike = None) -> Callable[P, R]: ...
@overload
def make_graphed_callables(callables: tuple[Callable[P1, R1]], sample_args: Sequence[Sequence[Tensor]],
                           num_warmup_iters: int = 3, pool: PoolLike = None) -> tuple[Callable[P1, R1]]: ...
@overload
def make_graphed_callables(callables: tuple[Callable[P1, R1], Callable[P2, R2]],
                           sample_args: Sequence[Sequence[Tensor]],
                           num_warmup_iters: int = 3, pool: PoolLike = None) -> tuple[Callable[P1, R1], Callable[P2, R2]]: ...
@overload
def make_graphed_callables(callables: tuple[Callable[P1, R1], Callable[P2, R2], Callable[P3, R3]],
                           sample_args: Sequence[Sequence[Tensor]], num_warmup_iters: int = 3,
                           pool: PoolLike = None,
                           ) -> tuple[Callable[P1, R1], Callable[P2, R2], Callable[P3, R3]]: ...
@overload
def make_graphed_callables(callables: Sequence[Callable[..., Any]], sample_args: Sequence[Sequence[Tensor]],
                           num_warmup_iters: int = 3, pool: PoolLike = None) -> tuple[Callable[..., Any], ...]: ...


def make_graphed_callables(callables: Callable[..., Any] | Sequence[Callable[..., Any]],
                           sample_args: Sequence[Any], num_warmup_iters: int = 3, pool: PoolLike = None) -> Any:
    """Graph callables for inference: each call then stages its arguments and replays.

    Each callable is warmed up and captured with its sample arguments, in
    order, into one shared memory pool (so the graphs must run in that
    order when their outputs feed one another): ``pool``, or a new one. Calling a returned callable
    copies its tensor arguments into the captured inputs and replays the
    graph (:meth:`CUDAGraph.stage_and_launch`). tensorplay has no autograd:
    this is ``torch.cuda.make_graphed_callables`` for inference.

    Parameters
    ----------
    callables : callable or tuple of callables
        What to graph; each must take CUDA tensors positionally and return a
        tensor or a tuple/list of tensors.
    sample_args : tuple of Tensor, or tuple of tuples of Tensor
        The sample arguments (CUDA tensors): one tuple for a single callable,
        one tuple per callable otherwise.
    num_warmup_iters : int, optional
        Runs before each capture (default 3), so that kernels compile and load.
    pool : None, int or CUDAGraph, optional
        The memory pool to capture into, as in ``torch.cuda.make_graphed_callables``:
        an id from :func:`graph_pool_handle`, a graph's ``pool_id`` or a
        ``CUDAGraph`` to share its pool; default a new pool.

    Returns
    -------
    callable or tuple of callables
        The graphed callables, of the same signature; a single callable for
        a single callable given. Their outputs are the graphs' static
        outputs, overwritten by the next call.

    Raises
    ------
    TypeError
        If a sample argument is not a CUDA tensor, a callable is not
        callable, or ``pool`` is not a pool.
    ValueError
        For a pool id that is not positive, or a ``CUDAGraph`` with no pool.
    RuntimeError
        If a callable cannot be captured (a host read such as ``item()``).
    CudaUnavailableError
        Without CUDA (a :class:`RuntimeError` that says why CUDA is not
        available), also for sample arguments that are CPU tensors.
    """
    if callable(callables):
        fns: Sequence[Callable[..., Any]] = (callables,)
        arg_tuples: Sequence[Any] = (sample_args,)
        single = True
    else:
        fns, arg_tuples, single = callables, sample_args, False
    if len(fns) != len(arg_tuples):
        raise ValueError("make_graphed_callables: one tuple of sample args per callable")
    arg_lists = [_sample_args(args) for args in arg_tuples]
    for fn, args in zip(fns, arg_lists):          # every argument checked before any capture
        if not callable(fn):
            raise TypeError(f"make_graphed_callables: {fn!r} is not callable")
        if not all(_is_tensor(a) and getattr(graph_tensor(a), "is_cuda", False) for a in args):
            what = "make_graphed_callables: sample args must be CUDA tensors"
            require_cuda(what)                # on a machine without CUDA, that is the news
            raise TypeError(what)
    pool_id = pool_id_of(pool)
    graphed = []
    for fn, args in zip(fns, arg_lists):
        static = [a.clone() for a in args]
        g, out = capture_callable(fn, static, warmup=num_warmup_iters, pool=pool_id,
                                  where=getattr(fn, "__name__", "callable"))
        graphed.append(_Graphed(g, static, out))
    return graphed[0] if single else tuple(graphed)


def _sample_args(args: Any) -> tuple[Any, ...]:
    try:
        return tuple(args)
    except TypeError:
        raise TypeError(f"make_graphed_callables: sample args must be a tuple of CUDA tensors (one tuple per "
                        f"callable), got {type(args).__name__}") from None


class _Graphed:
    """A captured callable: each call stages its arguments and replays."""

    def __init__(self, g: CUDAGraph, static_inputs: list[Tensor], outputs: Outputs) -> None:
        self.graph = g
        self.static_inputs = static_inputs
        self.outputs = outputs

    def __call__(self, *args: Tensor) -> Outputs:
        self.graph.stage_and_launch(self.static_inputs, args)
        return self.outputs
