# SPDX-License-Identifier: Apache-2.0
"""``GraphSet``: one graph per batch size of a callable, captured into one
shared memory pool, with each call padded to the next captured size.

What every model server writes by hand over PyTorch's graph API, as a
library type: capture largest first so the smaller graphs reuse the larger
ones' blocks; give each graph's outputs back to the pool after its capture
so the next capture reuses them too (the outputs of different sizes share
memory: a call's results are valid until the next call); stage a request
into the rows of one set of static inputs shared by every size; run eagerly
beyond the largest size. The pool is sleepable by default, so the whole set
can give its memory back (``sleep``) and take it again (``wake``) without a
capture. Sizes can also be captured on their first call (``capture=``), and
a memory budget can stop the set capturing more (``graphset_plan``).
"""

from __future__ import annotations

import bisect
import gc
import importlib
import logging
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Generic, TypeVar

from tensorplay._frames import warn_user
from tensorplay._driver.context import current_device
from tensorplay._memory import vmm
from tensorplay._memory.allocator import PoolAsleepError
from tensorplay._memory.api import allocator
from tensorplay._tensor.creation import empty
from tensorplay._tensor.base import ForeignStorage
from tensorplay._tensor.tensor import Tensor, new_cuda
from tensorplay._graph.foreign import (foreign_capture_on_this_thread, graph_tensor, is_foreign_tensor,
                                      release_foreign_memory)
from tensorplay._graph.graphs import CUDAGraph, pool_id_of, capture_callable
from tensorplay._graph.graphset_plan import CaptureMode, CapturePlan, check_capture_mode, check_memory_budget
from tensorplay._graph.pools import GraphPool
from tensorplay._graph.registry import open_captures
from tensorplay.types import CaptureErrorMode, PoolLike

__all__ = ["GraphSet"]

R = TypeVar("R")
_log = logging.getLogger("tensorplay.graphset")


def _library_of(t: Any) -> str:
    if isinstance(t, Tensor):
        return "tensorplay"
    return type(t).__module__.split(".")[0]


def _empty_rows(sample: Any, rows: int) -> Any:
    """An uninitialised tensor of the sample's library, dtype and device, with
    ``rows`` rows and the sample's other dimensions."""
    shape = (rows,) + tuple(sample.shape[1:])
    lib = _library_of(sample)
    if lib == "tensorplay":
        return empty(shape, dtype=sample.dtype, device=sample.device)
    if lib == "torch":
        return sample.new_empty(shape)
    if lib == "cupy":
        cupy = sys.modules["cupy"]
        with sample.device:
            return cupy.empty(shape, dtype=sample.dtype)
    raise TypeError(f"GraphSet: sample arguments must be tensorplay, PyTorch or CuPy tensors, got "
                    f"{type(sample).__name__}")


class _UnownedMemory:
    """The CUDA Array Interface of memory this object does not own, as
    unsigned integers of the element's size (the interface has no type string
    for bfloat16): what PyTorch wraps without taking ownership."""

    __slots__ = ("__cuda_array_interface__",)

    def __init__(self, ptr: int, shape: tuple[int, ...], strides: tuple[int, ...], itemsize: int) -> None:
        self.__cuda_array_interface__ = {"shape": shape, "typestr": f"<u{itemsize}", "data": (ptr, False),
                                         "strides": strides, "version": 3}


def _borrowed(t: Any) -> Any:
    """A tensor of ``t``'s library over ``t``'s memory that does not own it:
    once ``t`` is dropped its memory goes back to the pool while this view
    stays (the output sharing of the set)."""
    lib = _library_of(t)
    if lib == "torch" and t.element_size() in (1, 2, 4, 8):
        torch = sys.modules["torch"]
        n = t.element_size()
        raw = _UnownedMemory(t.data_ptr(), tuple(t.shape), tuple(st * n for st in t.stride()), n)
        return torch.as_tensor(raw, device=t.device).view(t.dtype)
    v = graph_tensor(t)
    span = 0 if v.numel() == 0 else (1 + sum((n - 1) * st for n, st in zip(v.shape, v.stride()))) * v.itemsize
    b = new_cuda(ForeignStorage(None, v.data_ptr(), span, v.device.index), v.data_ptr(), tuple(v.shape),
                 tuple(v.stride()), v.dtype, v.device.index)
    if lib == "tensorplay":
        return b
    return sys.modules[lib].from_dlpack(b)


def _progress(total: int, enabled: bool | None) -> Any:
    """A tqdm bar when tqdm is installed and stderr is a terminal, else None."""
    if enabled is False or not sys.stderr.isatty():
        return None
    try:
        tqdm = importlib.import_module("tqdm")       # optional, untyped
    except ImportError:
        return None
    return tqdm.tqdm(total=total, desc="capturing graphs", unit="graph")


class _Entry:
    """The graph of one size and its outputs."""

    __slots__ = ("size", "graph", "outputs", "batched", "memory", "seconds", "nodes")

    def __init__(self, size: int, graph: CUDAGraph, outputs: Any, memory: int, seconds: float) -> None:
        self.size = size
        self.graph = graph
        self.outputs = outputs
        self.memory = memory
        self.seconds = seconds
        self.nodes: int | None = None            # counted when a report first asks (describe() costs)
        flat = outputs if isinstance(outputs, (tuple, list)) else (outputs,)
        # which outputs carry the batch: cut to the request's rows on return
        self.batched = tuple(len(o.shape) > 0 and o.shape[0] == size for o in flat)


class GraphSet(Generic[R]):
    """One CUDA graph of ``fn`` per batch size, in one shared memory pool.

    ``fn`` takes tensors whose first dimension is the batch and returns a
    tensor or a tuple/list of tensors (tensorplay, PyTorch or CuPy; its
    kernels may be any library's that launches on the current stream).
    The set keeps one static input per argument, with as many rows as the
    largest size, and captures ``fn`` on its first ``s`` rows for each size
    ``s``, largest first, into one pool. A call with ``n`` rows copies the
    arguments into the first ``n`` rows, replays the graph of the smallest
    captured size ``s >= n`` and returns the outputs cut to ``n`` rows
    (views of the graph's outputs). Rows ``n..s`` keep what an earlier call
    left there (``pad_value`` fills them instead): ``fn`` must treat rows
    independently, as a batched model step does. More rows than the largest
    size, or none, run ``fn`` eagerly (a RuntimeWarning says so once).

    With ``share_outputs`` (the default) each graph gives its outputs back
    to the pool once captured, so the next capture reuses that memory, as
    vLLM does with weak references: the outputs of one call are valid until
    the next call on the set (or on any set or graph sharing its pool).

    Capture shows a tqdm bar when tqdm is installed and stderr is a
    terminal, and logs a line per size to the ``tensorplay.graphset`` logger;
    the garbage collector does not run during the captures.
    ``memory_added``, ``capture_seconds`` and :meth:`memory_report` say what
    each size cost.

    **Capturing when needed.** ``capture="largest"`` captures only the
    largest size at construction and each other size on its first call
    (staged first, then captured, then replayed), into the same pool, so
    each later, smaller capture reuses the blocks the largest one freed, as
    the largest-first order does. ``capture="on_demand"`` captures nothing
    up front: a size captured after smaller ones cannot fit its larger
    blocks into the memory they freed, so each new largest size can grow
    the pool by its own needs, where largest first pays the largest one's
    alone (``benchmarks/first_call_time.py`` measures both).
    :meth:`capture_all` captures the sizes still waiting, largest first.
    Captures made after construction use ``capture_error_mode="thread_local"``
    (other threads may allocate and synchronize meanwhile) and run one at a
    time under a lock; replays of captured sizes do not take it. A size
    first called while a capture is open on the calling thread raises
    RuntimeError (capture it before). A capture on a call runs ``fn`` on the
    call's own rows; where it warms up (the set's first capture, or a retry
    after a failed one) ``fn`` runs once more eagerly on that same input.

    **Memory budget.** With ``memory_budget`` (bytes), a size is captured
    only while the pool growth of the set's captures, plus that size's
    estimate, stays within it. The estimate extrapolates from the sizes
    captured: below a captured size, the most such a capture has added so
    far; above them all, the growth per row between the last two sizes that
    were each the largest when captured (none with only one: the size is
    captured while the set is under its budget). A size turned away runs
    the graph of the next larger captured size (padded), or eagerly where
    there is none; a RuntimeWarning says so the first time. The budget
    counts what captures measured: an estimate that was too low can pass it
    by that one capture.

    Parameters
    ----------
    fn : callable
        The batched step, e.g. one decode step of a model.
    sample_args : sequence of tensors
        One per positional argument of ``fn``: the dtype, device and
        trailing dimensions of the static inputs, and their initial rows
        (repeated to fill the largest size), which the warm-up and the
        captures run on: they must be valid input (e.g. token ids in range).
    sizes : iterable of int
        The batch sizes to capture, e.g. ``[1, 2, 4, 8, 16, ..., 512]``.
    pool : GraphPool, int, CUDAGraph or None, optional
        The pool to capture into; default a new sleepable :class:`GraphPool`
        (a plain pool where the device lacks virtual memory management).
        Sets sharing one pool must be called one at a time.
    warmup : int, optional
        Eager runs of ``fn`` before the set's first capture (default 1),
        so libraries initialise (cuBLAS handles, compiled kernels). A later
        size whose capture fails is warmed up once and captured again.
    pad_value : number, optional
        Fill the padding rows with this value on each call (default: leave
        them; they hold earlier, valid input).
    share_outputs : bool, optional
        Give each graph's outputs back to the pool after its capture
        (default True; False keeps every size's outputs apart).
    progress : bool, optional
        False hides the progress bar.
    capture : {"all", "largest", "on_demand"}, optional
        Which sizes are captured at construction: all of them (default),
        only the largest, or none; the others on their first call.
    memory_budget : int, optional
        Bytes the set's captures may add to the pool; None (default): no limit.
    """

    def __init__(self, fn: Callable[..., R], sample_args: Sequence[Any], sizes: Iterable[int], *,
                 pool: GraphPool | PoolLike = None, warmup: int = 1, pad_value: float | int | None = None,
                 share_outputs: bool = True, progress: bool | None = None, capture: CaptureMode = "all",
                 memory_budget: int | None = None) -> None:
        if not callable(fn):
            raise TypeError(f"GraphSet: {fn!r} is not callable")
        self._fn = fn
        self._capture_mode = check_capture_mode(capture)
        self._budget = check_memory_budget(memory_budget)
        self.sizes: tuple[int, ...] = self._check_sizes(sizes)
        self._samples = self._check_samples(sample_args)
        if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
            raise ValueError(f"GraphSet: warmup must be a non-negative int, got {warmup!r}")
        if pad_value is not None and (isinstance(pad_value, bool) or not isinstance(pad_value, (int, float))):
            raise TypeError(f"GraphSet: pad_value must be a number or None, got {type(pad_value).__name__}")
        self._pad_value = pad_value
        self._share = bool(share_outputs)
        self.max_size = self.sizes[-1]
        device = graph_tensor(self._samples[0]).device.index
        self.pool: GraphPool | None
        if pool is None:
            self.pool = GraphPool(sleepable=vmm.supported(device))
        elif isinstance(pool, GraphPool):
            self.pool = pool
        else:
            self.pool = None                      # an id or a graph's pool: shared, not sleepable here
        self._pool_id = self.pool.id if self.pool is not None else pool_id_of(pool)
        self._device = device
        self._statics = [self._static_for(s) for s in self._samples]
        self._entries: dict[int, _Entry] = {}
        self._plan = CapturePlan(self.sizes, self._budget)
        self._warmup = warmup
        self._progress = progress
        # global at construction; thread_local once the set is in use (other threads may then
        # allocate or synchronize while a size is captured on a call)
        self._mode: CaptureErrorMode = "global"
        self._eager_warned = False
        self._closed = False
        self._seconds = 0.0
        # a request of n rows runs the graph of sizes[bisect_left(sizes, n)]
        self._size_list = list(self.sizes)
        up_front = {"all": self.sizes, "largest": self.sizes[-1:], "on_demand": ()}[self._capture_mode]
        try:
            self._capture_sizes(sorted(up_front, reverse=True))
        except BaseException:
            self.reset()
            raise
        self._mode = "thread_local"

    # ------------------------------------------------------------ construction

    @staticmethod
    def _check_samples(sample_args: Sequence[Any]) -> list[Any]:
        try:
            samples = list(sample_args)
        except TypeError:
            raise TypeError(f"GraphSet: sample_args must be a sequence of tensors, got "
                            f"{type(sample_args).__name__}") from None
        if not samples:
            raise ValueError("GraphSet: sample_args is empty; fn needs at least one batched tensor argument")
        for i, s in enumerate(samples):
            if not (isinstance(s, Tensor) or is_foreign_tensor(s)):
                raise TypeError(f"GraphSet: sample_args[{i}] is a {type(s).__name__}, not a tensor")
            v = graph_tensor(s)
            if not v.is_cuda:
                raise ValueError(f"GraphSet: sample_args[{i}] is on {v.device}; the set's inputs are CUDA tensors")
            if v.ndim == 0 or v.shape[0] == 0:
                raise ValueError(f"GraphSet: sample_args[{i}] has shape {tuple(v.shape)}; its first dimension "
                                 f"is the batch and needs at least one row")
            if v.device != graph_tensor(samples[0]).device:
                raise ValueError(f"GraphSet: sample_args[{i}] is on {v.device}, sample_args[0] on "
                                 f"{graph_tensor(samples[0]).device}; one set lives on one device")
        return samples

    @staticmethod
    def _check_sizes(sizes: Iterable[int]) -> tuple[int, ...]:
        try:
            values = list(sizes)
        except TypeError:
            raise TypeError(f"GraphSet: sizes must be an iterable of ints, got {type(sizes).__name__}") from None
        if not values:
            raise ValueError("GraphSet: sizes is empty")
        for s in values:
            if isinstance(s, bool) or not isinstance(s, int):
                raise TypeError(f"GraphSet: sizes must be ints, got {s!r}")
            if s <= 0:
                raise ValueError(f"GraphSet: sizes must be positive, got {s}")
        return tuple(sorted(set(values)))

    def _static_for(self, sample: Any) -> Any:
        """The static input of one argument: the largest size's rows, filled
        with the sample's rows over and over."""
        static = _empty_rows(sample, self.max_size)
        rows = sample.shape[0]
        start = 0
        while start < self.max_size:
            k = min(rows, self.max_size - start)
            static[start:start + k] = sample[:k]
            start += k
        return static

    def _footprint(self) -> int:
        """The pool's device memory now (the set's and other libraries' segments)."""
        if self.pool is not None and self.pool.sleepable:
            return vmm.pool_bytes(self._pool_id, self._device)[0]
        p = allocator(self._device).get_pool(self._pool_id, False)
        total = p.reserved_bytes if p is not None else 0
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_initialized():
            total += torch.cuda.memory_reserved(self._device)
        return total

    def _capture_sizes(self, order: Sequence[int]) -> list[int]:
        """Capture ``order``'s sizes in that order, each unless the budget turns
        it away; returns those captured now."""
        done: list[int] = []
        if not order:
            return done
        bar = _progress(len(order), self._progress)
        gc_was_enabled = gc.isenabled()
        # no collection during the captures (torch.cuda.graph runs one per capture,
        # which is what made servers' captures slow), nor a full one before them
        gc.disable()
        try:
            for i, size in enumerate(order):
                was = size in self._entries
                _, warning = self._plan.ensure(size, self._capture_one)
                if warning is not None:
                    warn_user(warning, RuntimeWarning)
                if not was and size in self._entries:
                    done.append(size)
                    e = self._entries[size]
                    _log.info("GraphSet: captured size %d (%d of %d) in %.1f ms, +%d bytes", size, i + 1,
                              len(order), e.seconds * 1e3, e.memory)
                if bar is not None:
                    bar.update(1)
        finally:
            if bar is not None:
                bar.close()
            if gc_was_enabled:
                gc.enable()
        return done

    def _capture_one(self, size: int) -> tuple[int, float]:
        """Capture ``size`` (the plan holds the lock): (bytes the pool grew, seconds)."""
        if self._mode != "global":                # a call or capture_all(), not the constructor
            self._check_can_capture(size)
        warmup = self._warmup if not self._entries else 0   # the set's first capture warms up
        args = [st[:size] for st in self._statics]
        name = getattr(self._fn, "__name__", "fn")
        before = self._footprint()
        t0 = time.perf_counter()
        try:
            g, out = capture_callable(self._fn, args, warmup=warmup, pool=self._pool_id, where=name,
                                      capture_error_mode=self._mode)
        except RuntimeError as exc:
            if warmup or isinstance(exc, PoolAsleepError):
                raise
            # something initialises lazily for this shape (a compiled kernel, a
            # workspace): warm this size up once and capture again
            g, out = capture_callable(self._fn, args, warmup=1, pool=self._pool_id, where=name,
                                      capture_error_mode=self._mode)
        seconds = time.perf_counter() - t0
        memory = self._footprint() - before
        if self._share:
            out = type(out)(_borrowed(o) for o in out) if isinstance(out, (tuple, list)) else _borrowed(out)
        self._entries[size] = _Entry(size, g, out, memory, seconds)
        self._seconds += seconds
        return memory, seconds

    def _check_can_capture(self, size: int) -> None:
        if self.asleep:
            raise PoolAsleepError(f"GraphSet: size {size} is not captured yet and the set's pool is asleep; "
                                  f"wake() it first")
        me = threading.get_ident()
        here = [c.sentence() for c in open_captures() if c.thread_id == me]
        if here or foreign_capture_on_this_thread():
            what = "; ".join(here) + "." if here else "a PyTorch or CuPy capture is open on this thread."
            raise RuntimeError(f"GraphSet: size {size} is not captured yet, and a capture cannot begin inside "
                               f"another one on this thread: {what} Capture the size before (call it once, or "
                               f"capture_all()) and replay it inside.")

    # ------------------------------------------------------------ calls

    def __call__(self, *args: Any) -> R:
        """Run ``fn(*args)`` through the graph of the next captured size."""
        if self._closed:
            raise RuntimeError("GraphSet: the set was reset; make a new one")
        statics = self._statics
        if len(args) != len(statics):
            raise TypeError(f"GraphSet: fn takes {len(statics)} tensor argument(s), got {len(args)}")
        rows = self._rows(args)
        if rows == 0 or rows > self.max_size:
            return self._eager(args, rows)
        size = self._size_list[bisect.bisect_left(self._size_list, rows)]
        entry = self._entries.get(size)
        if entry is None:
            return self._call_uncaptured(args, rows, size)
        for static, a in zip(statics, args):
            static[:rows] = a
            if self._pad_value is not None and rows < size:
                static[rows:size] = self._pad_value
        entry.graph.replay()
        return self._cut(entry, rows)

    def _call_uncaptured(self, args: Sequence[Any], rows: int, size: int) -> R:
        """A call whose size has no graph: capture it (budget permitting) and
        replay, or replay the next larger captured size, or run eagerly."""
        if self.asleep and size not in self._plan.refused:
            self._check_can_capture(size)            # raises PoolAsleepError
        # staged before the capture, so that a warm-up runs fn on this call's rows
        for static, a in zip(self._statics, args):
            static[:rows] = a
        gc_was_enabled = gc.isenabled()
        gc.disable()
        try:
            run, warning = self._plan.ensure(size, self._capture_one)
        finally:
            if gc_was_enabled:
                gc.enable()
        if warning is not None:
            warn_user(warning, RuntimeWarning)
        if run is None:
            return self._fn(*args)
        entry = self._entries[run]
        if self._pad_value is not None and rows < run:
            for static in self._statics:
                static[rows:run] = self._pad_value
        entry.graph.replay()
        return self._cut(entry, rows)

    def _rows(self, args: Sequence[Any]) -> int:
        rows = -1
        for i, (a, static) in enumerate(zip(args, self._statics)):
            shape = getattr(a, "shape", None)
            if shape is None or len(shape) == 0:
                raise TypeError(f"GraphSet: argument {i} must be a tensor with a batch dimension, got "
                                f"{type(a).__name__}")
            if tuple(shape[1:]) != tuple(static.shape[1:]):
                raise ValueError(f"GraphSet: argument {i} has shape {tuple(shape)}; the set was captured for "
                                 f"(batch, {', '.join(map(str, static.shape[1:]))})")
            if rows == -1:
                rows = shape[0]
            elif shape[0] != rows:
                raise ValueError(f"GraphSet: argument {i} has {shape[0]} rows, argument 0 has {rows}")
        return rows

    def _eager(self, args: Sequence[Any], rows: int) -> R:
        if rows > self.max_size and not self._eager_warned:
            self._eager_warned = True
            warn_user(f"GraphSet: a batch of {rows} rows is larger than the largest captured size "
                      f"{self.max_size}; such calls run eagerly", RuntimeWarning)
        return self._fn(*args)

    @staticmethod
    def _cut(entry: _Entry, rows: int) -> Any:
        out = entry.outputs
        if rows == entry.size:
            return out
        if isinstance(out, (tuple, list)):
            return type(out)(o[:rows] if b else o for o, b in zip(out, entry.batched))
        return out[:rows] if entry.batched[0] else out

    def size_for(self, rows: int) -> int | None:
        """The size whose graph a call with ``rows`` rows replays (None:
        eagerly). A size not captured yet counts as its own when its first
        call would capture it, else the next larger captured size."""
        if rows <= 0 or rows > self.max_size:
            return None
        size = self._size_list[bisect.bisect_left(self._size_list, rows)]
        return size if size in self._entries else self._plan.runs(size)

    def capture_all(self) -> list[int]:
        """Capture every size not captured yet, largest first, into the pool
        (sizes the budget turns away stay uncaptured); returns the sizes
        captured now, largest first. Replays of captured sizes may run in
        other threads meanwhile."""
        if self._closed:
            raise RuntimeError("GraphSet: the set was reset; make a new one")
        return self._capture_sizes(self._plan.pending())

    def memory_report(self) -> list[dict[str, Any]]:
        """One row per size, smallest first::

            {"size": int,
             "state": "captured" | "pending" (waits for its first call) | "over budget",
             "bytes": bytes the pool grew while capturing it (None: not captured),
             "estimate": bytes estimated before its capture, or now for a pending size
                         (None: nothing to extrapolate from),
             "nodes": top-level nodes of its graph, "capture_ms": its warm-up and capture,
             "order": 0 for the set's first capture, 1 for the next...,
             "runs": the size whose graph its calls replay now (None: eagerly)}

        The rows' ``bytes`` add up to the pool growth the memory budget counts."""
        def nodes_of(size: int) -> int:
            e = self._entries[size]
            if e.nodes is None:
                e.nodes = len(e.graph.describe()["nodes"])
            return e.nodes
        return self._plan.report(nodes_of)

    # ------------------------------------------------------------ memory and state

    @property
    def graphs(self) -> dict[int, CUDAGraph]:
        """The graph of each size."""
        return {s: e.graph for s, e in sorted(self._entries.items())}

    @property
    def memory_added(self) -> dict[int, int]:
        """Device memory (bytes) the pool grew by at each size's capture."""
        return {s: e.memory for s, e in sorted(self._entries.items())}

    @property
    def capture_seconds(self) -> dict[int, float]:
        """Seconds each size's warm-up and capture took."""
        return {s: e.seconds for s, e in sorted(self._entries.items())}

    @property
    def capture_mode(self) -> CaptureMode:
        """``"all"``, ``"largest"`` or ``"on_demand"``: what the constructor captured."""
        return self._capture_mode

    @property
    def memory_budget(self) -> int | None:
        """Bytes the set's captures may add to the pool (None: no limit)."""
        return self._budget

    @property
    def capture_seconds_total(self) -> float:
        """Seconds all captures so far took (warm-ups included)."""
        return self._seconds

    @property
    def static_inputs(self) -> list[Any]:
        """The static inputs, one per argument, with the largest size's rows."""
        return list(self._statics)

    @property
    def asleep(self) -> bool:
        return self.pool is not None and self.pool.asleep

    def sleep(self, keep: Iterable[Any] = (), *, allow_collectives: bool = False) -> int:
        """Give the set's pool memory back to the device (see
        :meth:`GraphPool.sleep`, which refuses while the graphs hold NCCL
        collectives unless ``allow_collectives``); its graphs stay
        instantiated. Calls raise PoolAsleepError until :meth:`wake`.
        Returns the bytes given back."""
        if self.pool is None:
            raise ValueError("GraphSet.sleep: the set was given a pool id, not a GraphPool; pass "
                             "pool=tp.cuda.GraphPool() to make it sleepable")
        return self.pool.sleep(keep, allow_collectives=allow_collectives)

    def wake(self) -> int:
        """Map the pool's memory again; the next call replays without a capture."""
        if self.pool is None:
            return 0
        return self.pool.wake()

    def reset(self) -> None:
        """Drop every graph and output; the pool's memory goes back once no
        graph holds it and no tensor lives in it (PyTorch's cached cuBLAS
        workspaces from the captures are dropped). The set cannot be called
        afterwards."""
        entries, self._entries = self._entries, {}
        self._plan.clear()
        for e in entries.values():
            e.outputs = None
            e.graph.reset()
        del entries
        self._closed = True
        release_foreign_memory()

    def __repr__(self) -> str:
        sizes = self.sizes if len(self.sizes) <= 6 else (*self.sizes[:3], "...", *self.sizes[-2:])
        captured = "" if len(self._entries) == len(self.sizes) else f" captured={len(self._entries)}"
        return (f"<GraphSet of {getattr(self._fn, '__name__', 'fn')} sizes={sizes}{captured} pool={self._pool_id}"
                f"{' asleep' if self.asleep else ''}>")
