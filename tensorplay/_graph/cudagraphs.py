# SPDX-License-Identifier: Apache-2.0
"""Graph-backed callables: capture once per input signature, then every call
is one ``rebind_and_launch`` (every input rebindable) or one ``stage_and_launch``::

    from tensorplay._graph import cudagraphs

    @cudagraphs.cudagraphify
    def mlp(x): ...

    y = mlp(x)          # first call with this signature: warm up, capture, replay
    y = mlp(x2)         # later calls: the graph reads x2 itself (rebinding), or
                        # x2 is staged into the captured input; then one launch

The returned tensors are the graph's static outputs (never rebound): the next
call with the same signature overwrites them. Pass ``clone_outputs=True`` to
get copies.

A wrapper keeps at most ``max_graphs`` graphs (least recently used evicted
and reset), runs a signature whose capture failed eagerly from then on
(one warning), and counts what it did in ``stats()``.
"""

from __future__ import annotations

import functools
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, Generic, ParamSpec, TypeVar, overload

from tensorplay._frames import warn_user
from tensorplay._driver.context import CudaError, require_cuda
from tensorplay._tensor.args import byte_span
from tensorplay._tensor.tensor import Tensor
from tensorplay._graph.graphs import CUDAGraph, Outputs, capture_callable, graph_pool_handle
from tensorplay._graph.foreign import graph_tensor, is_foreign_tensor
from tensorplay.types import CaptureErrorMode, PoolLike

__all__ = ["cudagraphify", "CUDAGraphified"]

# How many graphs a wrapper keeps by default (one per input signature): a
# handful of batch sizes or shapes, without unbounded pool growth.
DEFAULT_MAX_GRAPHS = 8

P = ParamSpec("P")
R = TypeVar("R")


class CUDAGraphified(Generic[P, R]):
    """A function backed by one CUDA graph per input signature.

    The signature of a call is the shapes, dtypes, devices and strides of
    its tensor arguments and the values of its other arguments (which must
    be hashable). The first call with a signature warms ``fn`` up, captures
    it and replays it; later calls launch it on their own tensors. Where
    the graph can read every captured input from another tensor (its
    kernels patched, ``CUDAGraph.rebindable``), a call rebinds: one
    ``rebind_and_launch`` with the call's tensors in place of the captured
    inputs, no copy. Otherwise, and for a call passing a tensor the graphs
    may write (a static output of this wrapper's graphs or anything else
    from their memory pool), it stages: one
    :meth:`~tensorplay.cuda.CUDAGraph.stage_and_launch` copying the tensors
    into the captured inputs. The outputs are the graph's static outputs
    either way; a signature whose outputs include a view of an input always
    stages (a rebound replay would not write the captured input). With
    rebinding the kernels read the caller's tensors when the launch runs,
    on the current stream, and an in-place op of ``fn`` on an argument
    writes the caller's tensor (as ``fn`` run eagerly would; staging writes
    the private copy); the graph keeps the last call's tensors alive until
    its next call or reset. Graphs of one wrapper share a memory pool.
    Make one with :func:`cudagraphify`.

    At most ``max_graphs`` graphs are kept: capturing one more evicts the
    least recently used, which is reset (its static outputs stay valid
    while referenced; its pool memory is reused by later captures). When
    a capture fails (``fn`` reads a tensor on the host, ``item()``, or
    makes a call a capture forbids: a ``RuntimeError`` raised by the
    capture), the wrapper warns once (``RuntimeWarning``), remembers the
    signature and runs ``fn`` eagerly for it, on this call and every later
    one, without trying again. An exception in a warm-up run (before the
    capture) is ``fn``'s own and propagates, as do errors other than
    ``RuntimeError``. :meth:`stats` counts captures, replays (and of
    those, rebinds), evictions and eager fallbacks. Wrapping needs no GPU;
    without CUDA a call raises
    :class:`~tensorplay.cuda.CudaUnavailableError`, which says why.

    Parameters
    ----------
    fn : callable
        The function: CUDA tensors (and hashable values) in, a tensor or a
        tuple/list of tensors out.
    warmup : int, optional
        Runs before each capture; default 2.
    pool : None, int or CUDAGraph, optional
        The memory pool of the graphs; default a new shared pool.
    capture_error_mode : {'global', 'thread_local', 'relaxed'}, optional
        Default ``'thread_local'``: other threads may make unsafe calls while
        a capture is open.
    clone_outputs : bool, optional
        Return copies of the static outputs instead of the outputs themselves
        (which the next call with the same signature overwrites).
    max_graphs : int or None, optional
        How many graphs to keep, default 8 (``DEFAULT_MAX_GRAPHS``);
        None keeps every one.
    """

    #: How many graphs have been captured (one per input signature seen).
    num_captures: int

    def __init__(self, fn: Callable[P, R], *, warmup: int = 2, pool: PoolLike = None,
                 capture_error_mode: CaptureErrorMode = "thread_local", clone_outputs: bool = False,
                 max_graphs: int | None = DEFAULT_MAX_GRAPHS) -> None:
        if not callable(fn):
            raise TypeError(f"cudagraphify expects a callable, got {type(fn).__name__}")
        if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
            raise ValueError(f"warmup must be a non-negative int, got {warmup!r}")
        if max_graphs is not None and (isinstance(max_graphs, bool) or not isinstance(max_graphs, int)):
            raise TypeError(f"max_graphs must be a positive int or None, got {type(max_graphs).__name__}")
        if max_graphs is not None and max_graphs < 1:
            raise ValueError(f"max_graphs must be a positive int or None, got {max_graphs}")
        self.fn = fn
        self.warmup = warmup
        self.capture_error_mode: CaptureErrorMode = capture_error_mode
        self.clone_outputs = clone_outputs
        self.max_graphs = max_graphs
        self._pool = pool
        # least recently used first
        self._entries: OrderedDict[tuple[Any, ...], tuple[CUDAGraph, list[Tensor], Outputs]] = OrderedDict()
        self._eager: set[tuple[Any, ...]] = set()      # signatures whose capture failed
        # signatures whose graph rebinds -> (its rebind_and_launch, pool id, ids of the static outputs' storages)
        self._rebind: dict[tuple[Any, ...], tuple[Callable[..., None], Any, frozenset[int]]] = {}
        # one caller at a time: eviction resets a graph another thread may be launching
        self._lock = threading.RLock()
        self.num_captures = 0
        self._replays = 0
        self._rebinds = 0
        self._evictions = 0
        self._fallbacks = 0
        functools.update_wrapper(self, fn)

    def _signature(self, views: list[Any], flat: list[Any], names: list[str]) -> tuple[Any, ...]:
        """The call's key, from ``views`` (its arguments, other libraries'
        tensors as tensorplay views of them; ``flat`` as given)."""
        key: list[Any] = []
        for a, given in zip(views, flat):
            if a is not given:
                key.append("F")              # a PyTorch or CuPy tensor: its view has its layout
            if isinstance(a, Tensor):
                if not a.is_cuda:
                    what = "cudagraphify: tensor arguments must be CUDA tensors"
                    require_cuda(what)        # on a machine without CUDA, that is the news
                    raise TypeError(what)
                key.append(("T", a.shape, a.dtype.code, a._device_index, a.strides))
            else:
                try:
                    hash(a)
                except TypeError:
                    raise TypeError(f"cudagraphify: non-tensor argument of type {type(a).__name__} "
                                    "is not hashable, so it cannot select a graph") from None
                key.append(("V", type(a), a))
        return tuple(key) + (tuple(names),)

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        """Call the function through its graph: capture on a new signature, then stage and replay."""
        names = sorted(kwargs)
        flat = list(args) + [kwargs[k] for k in names]      # positional, then keywords by name
        views = [graph_tensor(a) for a in flat]             # converted once per call
        key = self._signature(views, flat, names)
        if key in self._eager:
            self._fallbacks += 1
            return self.fn(*args, **kwargs)
        with self._lock:
            return self._through_graph(key, flat, views, names, args, kwargs)

    def _through_graph(self, key: tuple[Any, ...], flat: list[Any], views: list[Any], names: list[str],
                       args: Any, kwargs: Any) -> Any:
        entry = self._entries.get(key)
        tensors = [a for a in views if isinstance(a, Tensor)]     # staged or rebound as views
        if entry is None:
            self._make_room()          # first, so that the capture can reuse the evicted graph's memory
            try:
                entry = self._capture(flat, len(args), names)
            except _CaptureFailed as failed:
                self._eager.add(key)
                warn_user(f"cudagraphify: {getattr(self.fn, '__name__', 'the function')} could not be "
                          f"captured for this signature ({failed.__cause__}); calls with it run eagerly "
                          f"from now on", RuntimeWarning)
                self._fallbacks += 1
                return self.fn(*args, **kwargs)
            self._entries[key] = entry
            if _can_rebind(*entry):
                self._rebind[key] = (entry[0].rebind_and_launch, entry[0].pool_id,
                                     _storage_ids(entry[2]))
        else:
            self._entries.move_to_end(key)
        g, static, outputs = entry
        rebind = self._rebind.get(key)
        # a foreign tensor's memory cannot be told apart from the graphs' pool: staged
        if rebind is not None and "F" not in key and _rebind_safe(tensors, rebind[1], rebind[2]):
            rebind[0](static, tensors)               # rebind_and_launch: the graph reads the call's tensors
            self._rebinds += 1
        else:
            g.stage_and_launch(static, tensors)
        self._replays += 1
        if self.clone_outputs:
            if isinstance(outputs, (list, tuple)):
                return type(outputs)(o.clone() for o in outputs)   # type: ignore[return-value]
            return outputs.clone()                   # type: ignore[return-value]  # what fn returned
        return outputs                               # type: ignore[return-value]

    def _capture(self, flat: list[Any], n_positional: int,
                 names: list[str]) -> tuple[CUDAGraph, list[Tensor], Outputs]:
        if self._pool is None:
            self._pool = graph_pool_handle()
        static_flat = [a.clone() if isinstance(a, Tensor) or is_foreign_tensor(a) else a for a in flat]
        static_args = static_flat[:n_positional]
        static_kwargs = dict(zip(names, static_flat[n_positional:]))

        fn: Callable[..., Any] = self.fn          # called with the static copies of the arguments
        runs = [0]

        def run(*_: Any) -> Any:
            runs[0] += 1
            return fn(*static_args, **static_kwargs)
        try:
            g, outputs = capture_callable(run, (), warmup=self.warmup, pool=self._pool,
                                          capture_error_mode=self.capture_error_mode,
                                          where=getattr(self.fn, "__name__", "the function"))
        except RuntimeError as exc:
            # a failure in a warm-up run (eager) is fn's own error; other types
            # (a TypeError for what fn returns) are not the capture's either;
            # capture_callable turns a capture's own failure into a plain RuntimeError
            if runs[0] <= self.warmup or isinstance(exc, CudaError):
                raise           # a driver error (out of memory, say) is not this signature's for good
            raise _CaptureFailed() from exc
        self.num_captures += 1
        return g, [a for a in static_flat if isinstance(a, Tensor) or is_foreign_tensor(a)], outputs

    def _make_room(self) -> None:
        """Evict (reset) least recently used graphs until one more fits."""
        while self.max_graphs is not None and len(self._entries) >= self.max_graphs:
            key, (g, _, _) = self._entries.popitem(last=False)
            self._rebind.pop(key, None)
            g.reset()
            self._evictions += 1

    def stats(self) -> dict[str, int]:
        """What the wrapper did: ``captures`` (graphs captured), ``replays``
        (calls served by a graph), ``rebinds`` (those of the replays that
        rebound the graph's inputs instead of staging them), ``evictions``
        (graphs reset to make room),
        ``fallbacks`` (calls run eagerly because their signature's capture
        failed), ``graphs`` (graphs kept now) and ``eager_signatures``
        (signatures that run eagerly)."""
        return {"captures": self.num_captures, "replays": self._replays, "rebinds": self._rebinds,
                "evictions": self._evictions,
                "fallbacks": self._fallbacks, "graphs": len(self._entries),
                "eager_signatures": len(self._eager)}

    def reset(self) -> None:
        """Free every captured graph (their pool memory returns once outputs
        die) and forget the signatures that ran eagerly; counts are kept."""
        for g, _, _ in self._entries.values():
            g.reset()
        self._entries.clear()
        self._rebind.clear()
        self._eager.clear()


class _CaptureFailed(Exception):
    """The capture (not a warm-up run) failed; the cause is chained."""


def _shares_memory(a: Any, b: Any) -> bool:
    a, b = graph_tensor(a), graph_tensor(b)
    if a._device_index != b._device_index or a.numel() == 0 or b.numel() == 0:
        return False
    (a0, a1), (b0, b1) = byte_span(a), byte_span(b)
    return a0 < b1 and b0 < a1


def _outputs_of(outputs: Outputs) -> list[Tensor]:
    return list(outputs) if isinstance(outputs, (list, tuple)) else [outputs]


def _can_rebind(g: CUDAGraph, static: list[Tensor], outputs: Outputs) -> bool:
    """Whether calls may rebind ``g``'s inputs: the graph can rebind (a
    CUDAGraph with ``rebind_and_launch``), every static input without a
    copy, and no output is (a view of) a static input: with rebinding the
    captured input is not written, so such an output would keep the
    captured values."""
    rebindable = getattr(g, "rebindable", None)
    if not static or rebindable is None or not hasattr(g, "rebind_and_launch"):
        return False
    if not all(rebindable(static)):
        return False
    return not any(_shares_memory(o, s) for o in _outputs_of(outputs) for s in static)


def _storage_ids(outputs: Outputs) -> frozenset[int]:
    return frozenset(id(o._storage) for o in _outputs_of(outputs)
                     if isinstance(o, Tensor) and o._storage is not None)


def _rebind_safe(tensors: list[Tensor], pool_id: Any, outputs: frozenset[int]) -> bool:
    """Whether this call's tensors may be rebound: none is memory the graph
    may write while reading it (a static output, or anything from the pool
    the graphs allocate from: a later capture sharing the pool may have
    placed its outputs where this graph keeps temporaries)."""
    for t in tensors:
        st = t._storage
        if st is not None and (id(st) in outputs or getattr(st, "pool_id", None) == pool_id):
            return False
    return True


@overload
def cudagraphify(fn: Callable[P, R], *, warmup: int = 2, pool: PoolLike = None,
                 capture_error_mode: CaptureErrorMode = "thread_local",
                 clone_outputs: bool = False,
                 max_graphs: int | None = DEFAULT_MAX_GRAPHS) -> CUDAGraphified[P, R]: ...
@overload
def cudagraphify(fn: None = None, *, warmup: int = 2, pool: PoolLike = None,
                 capture_error_mode: CaptureErrorMode = "thread_local",
                 clone_outputs: bool = False,
                 max_graphs: int | None = DEFAULT_MAX_GRAPHS) -> Callable[[Callable[P, R]], CUDAGraphified[P, R]]: ...


def cudagraphify(fn: Callable[P, R] | None = None, *, warmup: int = 2, pool: PoolLike = None,
                 capture_error_mode: CaptureErrorMode = "thread_local",
                 clone_outputs: bool = False, max_graphs: int | None = DEFAULT_MAX_GRAPHS,
                 ) -> CUDAGraphified[P, R] | Callable[[Callable[P, R]], CUDAGraphified[P, R]]:
    """Make ``fn`` graph-backed: one CUDA graph per input signature, replayed on every call.

    Usable as ``cudagraphify(fn)`` or as a decorator, ``@cudagraphify`` or
    ``@cudagraphify(warmup=3)``. The wrapper keeps ``fn``'s signature for
    type checkers (``ParamSpec``) and its name and docstring
    (:func:`functools.update_wrapper`).

    Parameters
    ----------
    fn : callable, optional
        The function; omit it to get a decorator with these options.
    warmup : int, optional
        Runs before each capture; default 2.
    pool : None, int or CUDAGraph, optional
        The memory pool; default a new pool shared by the wrapper's graphs.
    capture_error_mode : {'global', 'thread_local', 'relaxed'}, optional
        Default ``'thread_local'``.
    clone_outputs : bool, optional
        Return copies of the static outputs.
    max_graphs : int or None, optional
        Graphs kept per wrapper, least recently used evicted; default
        ``DEFAULT_MAX_GRAPHS`` (8), None for no bound. A failing capture
        makes its signature run eagerly, with one warning (see
        :class:`CUDAGraphified`).

    Returns
    -------
    CUDAGraphified or callable
        The graph-backed function, or a decorator making one.
    """
    def wrap(f: Callable[P, R]) -> CUDAGraphified[P, R]:
        return CUDAGraphified(f, warmup=warmup, pool=pool, capture_error_mode=capture_error_mode,
                              clone_outputs=clone_outputs, max_graphs=max_graphs)
    return wrap if fn is None else wrap(fn)
