# SPDX-License-Identifier: Apache-2.0
"""Graph-backed callables: capture once per input signature, then every call
is one ``stage_and_launch``.

    from tensorplay._stax import cudagraphs

    @cudagraphs.cudagraphify
    def mlp(x): ...

    y = mlp(x)          # first call with this signature: warm up, capture, replay
    y = mlp(x2)         # later calls: stage x2 into the captured input, replay

The returned tensors are the graph's static outputs: the next call with the
same signature overwrites them. Pass ``clone_outputs=True`` to get copies.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Generic, ParamSpec, TypeVar, overload

from ..cuda.graphs import CUDAGraph, Outputs, capture_callable, graph_pool_handle
from ..types import CaptureErrorMode, PoolLike

if TYPE_CHECKING:
    from .. import Tensor
else:
    from .._tensor import Tensor

__all__ = ["cudagraphify", "CUDAGraphified"]

P = ParamSpec("P")
R = TypeVar("R")


class CUDAGraphified(Generic[P, R]):
    """A function backed by one CUDA graph per input signature.

    The signature of a call is the shapes, dtypes, devices and strides of
    its tensor arguments and the values of its other arguments (which must
    be hashable). The first call with a signature warms ``fn`` up, captures
    it and replays it; later calls copy their tensors into the captured
    inputs and replay (one :meth:`~tensorplay.cuda.CUDAGraph.stage_and_launch`).
    Graphs of one wrapper share a memory pool. Make one with
    :func:`cudagraphify`.

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
    """

    #: How many graphs have been captured (one per input signature seen).
    num_captures: int

    def __init__(self, fn: Callable[P, R], *, warmup: int = 2, pool: PoolLike = None,
                 capture_error_mode: CaptureErrorMode = "thread_local", clone_outputs: bool = False) -> None:
        if not callable(fn):
            raise TypeError(f"cudagraphify expects a callable, got {type(fn).__name__}")
        if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
            raise ValueError(f"warmup must be a non-negative int, got {warmup!r}")
        self.fn = fn
        self.warmup = warmup
        self.capture_error_mode: CaptureErrorMode = capture_error_mode
        self.clone_outputs = clone_outputs
        self._pool = pool
        self._entries: dict[tuple[Any, ...], tuple[CUDAGraph, list[Tensor], Outputs]] = {}
        self.num_captures = 0
        functools.update_wrapper(self, fn)

    def _signature(self, flat: list[Any], names: list[str]) -> tuple[Any, ...]:
        key: list[Any] = []
        for a in flat:
            if isinstance(a, Tensor):
                if not a.is_cuda:
                    raise TypeError("cudagraphify: tensor arguments must be CUDA tensors")
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
        key = self._signature(flat, names)
        entry = self._entries.get(key)
        tensors = [a for a in flat if isinstance(a, Tensor)]
        if entry is None:
            entry = self._capture(flat, len(args), names)
            self._entries[key] = entry
        g, static, outputs = entry
        g.stage_and_launch(static, tensors)
        if self.clone_outputs:
            if isinstance(outputs, Tensor):
                return outputs.clone()               # type: ignore[return-value]  # what fn returned
            return type(outputs)(o.clone() for o in outputs)   # type: ignore[return-value]
        return outputs                               # type: ignore[return-value]

    def _capture(self, flat: list[Any], n_positional: int,
                 names: list[str]) -> tuple[CUDAGraph, list[Tensor], Outputs]:
        if self._pool is None:
            self._pool = graph_pool_handle()
        static_flat = [a.clone() if isinstance(a, Tensor) else a for a in flat]
        static_args = static_flat[:n_positional]
        static_kwargs = dict(zip(names, static_flat[n_positional:]))

        fn: Callable[..., Any] = self.fn          # called with the static copies of the arguments

        def run(*_: Any) -> Any:
            return fn(*static_args, **static_kwargs)
        g, outputs = capture_callable(run, (), warmup=self.warmup, pool=self._pool,
                                      capture_error_mode=self.capture_error_mode,
                                      where=getattr(self.fn, "__name__", "the function"))
        self.num_captures += 1
        return g, [a for a in static_flat if isinstance(a, Tensor)], outputs

    def reset(self) -> None:
        """Free every captured graph (their pool memory returns once outputs die)."""
        for g, _, _ in self._entries.values():
            g.reset()
        self._entries.clear()


@overload
def cudagraphify(fn: Callable[P, R], *, warmup: int = 2, pool: PoolLike = None,
                 capture_error_mode: CaptureErrorMode = "thread_local",
                 clone_outputs: bool = False) -> CUDAGraphified[P, R]: ...
@overload
def cudagraphify(fn: None = None, *, warmup: int = 2, pool: PoolLike = None,
                 capture_error_mode: CaptureErrorMode = "thread_local",
                 clone_outputs: bool = False) -> Callable[[Callable[P, R]], CUDAGraphified[P, R]]: ...


def cudagraphify(fn: Callable[P, R] | None = None, *, warmup: int = 2, pool: PoolLike = None,
                 capture_error_mode: CaptureErrorMode = "thread_local",
                 clone_outputs: bool = False) -> CUDAGraphified[P, R] | Callable[[Callable[P, R]],
                                                                                 CUDAGraphified[P, R]]:
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

    Returns
    -------
    CUDAGraphified or callable
        The graph-backed function, or a decorator making one.
    """
    def wrap(f: Callable[P, R]) -> CUDAGraphified[P, R]:
        return CUDAGraphified(f, warmup=warmup, pool=pool, capture_error_mode=capture_error_mode,
                              clone_outputs=clone_outputs)
    return wrap if fn is None else wrap(fn)
