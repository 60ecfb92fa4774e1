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
from typing import Any, overload

from .._tensor_api import Tensor
from ..cuda.graphs import capture_callable, graph_pool_handle

__all__ = ["cudagraphify", "CUDAGraphified"]


class CUDAGraphified:
    """A function backed by one CUDA graph per input signature (shapes,
    dtypes, devices, strides of tensor arguments; values of other arguments).
    Graphs of one wrapper share a memory pool."""

    def __init__(self, fn: Callable[..., Any], *, warmup: int = 2, pool: Any = None,
                 capture_error_mode: str = "thread_local", clone_outputs: bool = False) -> None:
        if not callable(fn):
            raise TypeError(f"cudagraphify expects a callable, got {type(fn).__name__}")
        if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
            raise ValueError(f"warmup must be a non-negative int, got {warmup!r}")
        self.fn = fn
        self.warmup = warmup
        self.capture_error_mode = capture_error_mode
        self.clone_outputs = clone_outputs
        self._pool = pool
        self._entries: dict[tuple[Any, ...], tuple[Any, list[Tensor], Any]] = {}
        self.num_captures = 0
        functools.update_wrapper(self, fn)

    def _signature(self, flat: list[Any], names: list[str]) -> tuple[Any, ...]:
        key: list[Any] = []
        for a in flat:
            if isinstance(a, Tensor):
                if not a.is_cuda:
                    raise TypeError("cudagraphify: tensor arguments must be CUDA tensors")
                key.append(("T", a.shape, a.dtype.code, a._device_index_, a.strides))
            else:
                try:
                    hash(a)
                except TypeError:
                    raise TypeError(f"cudagraphify: non-tensor argument of type {type(a).__name__} "
                                    "is not hashable, so it cannot select a graph") from None
                key.append(("V", type(a), a))
        return tuple(key) + (tuple(names),)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
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
            return outputs.clone() if isinstance(outputs, Tensor) else type(outputs)(o.clone() for o in outputs)
        return outputs

    def _capture(self, flat: list[Any], n_positional: int, names: list[str]) -> tuple[Any, list[Tensor], Any]:
        if self._pool is None:
            self._pool = graph_pool_handle()
        static_flat = [a.clone() if isinstance(a, Tensor) else a for a in flat]
        static_args = static_flat[:n_positional]
        static_kwargs = dict(zip(names, static_flat[n_positional:]))

        def run(*_: Any) -> Any:
            return self.fn(*static_args, **static_kwargs)
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
def cudagraphify(fn: Callable[..., Any], *, warmup: int = 2, pool: Any = None,
                 capture_error_mode: str = "thread_local", clone_outputs: bool = False) -> CUDAGraphified: ...
@overload
def cudagraphify(fn: None = None, *, warmup: int = 2, pool: Any = None,
                 capture_error_mode: str = "thread_local",
                 clone_outputs: bool = False) -> Callable[[Callable[..., Any]], CUDAGraphified]: ...


def cudagraphify(fn: Callable[..., Any] | None = None, *, warmup: int = 2, pool: Any = None,
                 capture_error_mode: str = "thread_local",
                 clone_outputs: bool = False) -> CUDAGraphified | Callable[[Callable[..., Any]], CUDAGraphified]:
    """Make ``fn`` graph-backed; usable as ``cudagraphify(fn)`` or as a decorator
    (``@cudagraphify`` or ``@cudagraphify(warmup=3)``)."""
    def wrap(f: Callable[..., Any]) -> CUDAGraphified:
        return CUDAGraphified(f, warmup=warmup, pool=pool, capture_error_mode=capture_error_mode,
                              clone_outputs=clone_outputs)
    return wrap if fn is None else wrap(fn)
