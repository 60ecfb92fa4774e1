# SPDX-License-Identifier: Apache-2.0
"""Other libraries' work inside tensorplay captures.

While a capture is open on a thread, the libraries this module follows
(PyTorch and CuPy, when already imported) use the stream being captured as
their current stream on that thread, so their kernels are captured into the
tensorplay graph; inside a conditional body, the body's stream. Their
allocations during the capture are made safe: PyTorch's go to a
``torch.cuda.MemPool`` that lives as long as the tensorplay pool's graphs
(one per pool and device, so graphs sharing a pool share it), CuPy's go
through tensorplay's caching allocator, into the capture's own pool. When
the capture ends, or fails, each library's current stream and allocator
are what they were.

A capture keeps one :class:`ForeignSession` from ``capture_begin`` to its
end. The session asks each followed :class:`Library` for the streams to
join (before the capture begins, so the capture sees their queued work),
then to ``begin`` (route memory, make the capture stream current), to
``follow`` each stream a body makes current, and to ``end`` (restore),
which returns what the graph must keep alive (PyTorch's pool).

Libraries with no current stream of their own (Numba, cuda.core) launch on
the stream they are given: ``tensorplay.cuda.current_stream()`` speaks
``__cuda_stream__`` and its ``handle`` is the raw stream.
"""

from __future__ import annotations

import gc
import os
import sys
import threading
import weakref
from collections.abc import Sequence
from types import TracebackType
from typing import Any

import numpy

from tensorplay._driver.stream import Stream, current_stream_handle_of
from tensorplay._driver.teardown import teardown_waits
from tensorplay._memory import vmm
from tensorplay._memory.allocator import allocate, is_sleepable
from tensorplay._tensor.base import TensorBase
from tensorplay._tensor.transfer import foreign_converter
from tensorplay._graph.registry import open_captures
from tensorplay._graph.collectives import explain_collective_error
from tensorplay._graph.compiled import explain_compile_error, watch_compiles

__all__ = ["ForeignRandomError", "ForeignSession", "Library", "OutsidePoolBlock", "TorchLibrary", "CupyLibrary",
           "begin_session", "explain_capture_error", "foreign_capture_libraries", "foreign_capture_stream",
           "graph_tensor",
           "is_foreign_tensor", "register_library", "set_foreign_capture", "unregister_library"]


# Held while a capture begins (tensorplay._graph.capture) and while parked
# PyTorch pools are let go, which frees memory: never inside a capture.
capture_begin_lock = threading.RLock()
_routed = [0]       # sessions begun and not yet ended, all threads (under the lock to begin)


class ForeignRandomError(RuntimeError):
    """A PyTorch random op ran inside a tensorplay capture, where PyTorch's
    generator is not graph-safe (its state is not advanced per replay)."""


ForeignRandomError.__module__ = "tensorplay.cuda"     # its public path, in tracebacks and reprs


# ------------------------------------------------------------------ libraries

class Library:
    """What a followed library does at a capture's steps. Subclass it for a
    library with a current stream of its own; ``register_library`` it."""

    #: the name in ``foreign_capture_libraries()`` and errors
    name = "library"
    #: the module that must already be imported for the library to be followed
    module = ""

    def is_loaded(self) -> bool:
        """True when the library is imported and can run on the GPU."""
        return self.module in sys.modules

    def current_stream_handle(self, device: int) -> int | None:
        """The raw handle of the library's current stream on ``device`` (this
        thread), which the capture stream waits for; None to skip."""
        return None

    def prepare(self, device: int) -> None:
        """Before the capture begins: what cannot be done inside it."""

    def is_capturing(self) -> bool:
        """True while the library's current stream on this thread is being
        captured (by the library itself, or into a tensorplay graph):
        tensorplay's teardown then waits (tensorplay._driver.teardown)."""
        return False

    def begin(self, device: int, stream: Stream, pool_id: int) -> Any:
        """The capture began on ``stream`` into pool ``pool_id``: route
        allocations, make ``stream`` current; return the state to restore."""
        raise NotImplementedError

    def follow(self, state: Any, stream: Stream) -> None:
        """Make ``stream`` (a conditional body's, or the parent's again) current."""
        raise NotImplementedError

    def end(self, state: Any, on_capture_thread: bool) -> dict[int, Any]:
        """Restore what ``begin`` changed; return objects the graph keeps.
        Off the capture's thread (a graph reset or collected elsewhere)
        only what is not per-thread is restored."""
        raise NotImplementedError

    def pause(self, state: Any) -> None:
        """Stop routing this thread's allocations into the capture's memory
        (``CUDAGraph.outside_pool``); the stream stays the capture's."""

    def resume(self, state: Any) -> None:
        """Route allocations into the capture's memory again, after ``pause``."""


class _PoolHold:
    """A graph's hold on PyTorch's pool for one tensorplay pool. When a hold
    goes, the pool is parked until no tensor of PyTorch's lives in it and no
    capture is open; only then is it let go, and PyTorch frees its memory
    (a tensor alive at reset would otherwise pin it until a global
    ``torch.cuda.empty_cache()``, and freeing inside a global-mode capture
    would invalidate that capture)."""

    parked: list[tuple[int, Any]] = []
    _lock = threading.Lock()

    def __init__(self, device: int, pool: Any) -> None:
        self.device = device
        self.pool = pool

    def __del__(self) -> None:
        try:
            with _PoolHold._lock:
                _PoolHold.parked.append((self.device, self.pool))
            self.pool = None
            # from the collector only parked: it runs anywhere, PyTorch's own
            # capture included, where letting a pool go trips its allocator
            if not _collecting[0]:
                release_parked_pools()
        except BaseException:
            pass


_collecting = [False]     # the cyclic collector is running (its callback below)


def _note_collection(phase: str, info: dict[str, Any]) -> None:
    _collecting[0] = phase == "start"


gc.callbacks.append(_note_collection)


def _torch_pool_in_use(torch: Any, device: int, pool: Any) -> bool:
    """Whether a tensor of PyTorch's still lives in ``pool``. Letting go of a
    pool is safe either way (PyTorch never frees memory under a tensor); a
    pool let go too early only stays reserved until PyTorch empties its cache."""
    check = getattr(torch._C, "_cuda_checkPoolLiveAllocations", None)
    if check is not None:
        try:
            return not check(device, pool.id, set())
        except Exception:
            return False            # PyTorch made no pool for it: nothing was allocated there
    try:
        return any(seg.get("allocated_size", 0) for seg in pool.snapshot(include_traces=False))
    except Exception:
        return True


_CHECKS_PER_CALL = 4


def release_parked_pools() -> None:
    """Let go of the parked PyTorch pools that no tensor uses any more,
    when no capture is open (called at capture boundaries, resets and
    synchronize; never from the driver's thread nor inside another
    library's capture on this thread)."""
    if not _PoolHold.parked or teardown_waits():
        return
    with capture_begin_lock:         # no capture may begin while PyTorch frees memory
        # nor may one be routed: PyTorch refuses to free while any is
        if not open_captures() and not _routed[0]:
            _release_parked()


def release_foreign_memory() -> None:
    """Drop what other libraries keep from finished captures, so graph pools
    let go of their memory: PyTorch's cached cuBLAS workspaces (a capture's
    matmuls take theirs from the capture's pool, and PyTorch keeps it per
    stream; its next capture drops them too), then the parked pools that no
    tensor uses any more. Nothing while a capture is open."""
    torch = sys.modules.get("torch")
    if torch is not None and not open_captures():
        clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
        if clear is not None:
            clear()
    release_parked_pools()


def _release_parked() -> None:
    torch = sys.modules.get("torch")
    with _PoolHold._lock:
        # the oldest few per call: a pool a live output pins stays parked, and
        # checking every one at every capture would cost each capture more
        checked = _PoolHold.parked[:_CHECKS_PER_CALL]
        del _PoolHold.parked[:_CHECKS_PER_CALL]
    keep = [(d, p) for d, p in checked if torch is not None and _torch_pool_in_use(torch, d, p)]
    del checked
    with _PoolHold._lock:
        _PoolHold.parked.extend(keep)     # to the back: the others get their turn


class TorchLibrary(Library):
    """PyTorch: ``torch.cuda.set_stream`` of an ``ExternalStream`` over the
    capture's stream; allocations to a ``torch.cuda.MemPool`` through
    ``torch.cuda.use_mem_pool`` (this thread's, for the capture's length)."""

    name = "torch"
    module = "torch"

    def __init__(self) -> None:
        self._pools: weakref.WeakValueDictionary[tuple[int, int], Any] = weakref.WeakValueDictionary()
        self._lock = threading.Lock()
        self._streams: dict[tuple[int, int], Any] = {}   # PyTorch's wrappers of our streams
        self._allocator: Any = None                        # for sleepable pools' MemPools
        self._available: Any = None                        # the torch module whose CUDA was available
        self._tls = threading.local()                      # .blas: devices whose cuBLAS handle exists here
        self._raw_of: tuple[Any, Any] | None = None        # (torch, its torch._C or None), see _raw
        self._cuda_up: tuple[Any, int] | None = None       # (torch, pid) once its CUDA is initialised

    def _external(self, device: int, stream: Stream) -> Any:
        """PyTorch's ExternalStream over ``stream`` (kept: captures reuse their streams)."""
        key = (device, stream.handle)
        ext = self._streams.get(key)
        if ext is None:
            torch = sys.modules["torch"]
            if len(self._streams) >= 256:        # streams the user passed and dropped
                self._streams.clear()
            ext = self._streams[key] = torch.cuda.ExternalStream(stream.handle, device=device)
        return ext

    def is_loaded(self) -> bool:
        torch = sys.modules.get("torch")
        if torch is None:
            return False
        if self._available is torch:      # asked once per module: it costs a few us a capture
            return True
        try:
            available = bool(torch.cuda.is_available())
        except Exception:                 # a broken or CPU-only build: not followed
            return False
        if available:
            self._available = torch
        return available

    def is_capturing(self) -> bool:
        torch = sys.modules["torch"]
        # no CUDA state in PyTorch yet: nothing of its can be capturing. Once up
        # it stays up in this process (a forked child asks again): asked once,
        # as teardown asks this several times a capture
        up = self._cuda_up
        if up is None or up[0] is not torch or up[1] != os.getpid():
            if not torch.cuda.is_initialized():
                return False
            self._cuda_up = (torch, os.getpid())
        return bool(torch._C._cuda_isCurrentStreamCapturing())

    def current_stream_handle(self, device: int) -> int | None:
        torch = sys.modules["torch"]
        raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        if raw is not None:
            return int(raw(device))
        return int(torch.cuda.current_stream(device).cuda_stream)

    def prepare(self, device: int) -> None:
        torch = sys.modules["torch"]
        watch_compiles()                 # torch.compile starting inside a capture: a clear error
        made = getattr(self._tls, "blas", None)
        if made is None:
            made = self._tls.blas = set()
        if device not in made:
            # cuBLAS's handle is made at a thread's first matmul, and cublasCreate
            # cannot run inside a capture: make it before (once a thread and device)
            with torch.cuda.device(device):
                torch.cuda.current_blas_handle()
            made.add(device)
        # as PyTorch's own capture does: drop the cached cuBLAS workspaces, so
        # this capture's matmuls get one from its own pool rather than share
        # one an earlier graph captured on the same stream uses (not while
        # another capture may be using its workspace)
        clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
        if clear is not None and not open_captures():
            clear()

    def mem_pool(self, device: int, pool_id: int, current_device: int | None = None) -> Any:
        """PyTorch's pool for tensorplay pool ``pool_id`` on ``device``; a
        sleepable pool's takes its segments from tensorplay's sleepable
        segments, registered under ``pool_id`` (so they sleep with it).
        ``current_device``: PyTorch's current device where the caller knows
        it (a pool is made on its device; no switch when that is current)."""
        torch = sys.modules["torch"]
        with self._lock:
            pool = self._pools.get((device, pool_id))
            if pool is None:
                if current_device == device:
                    pool = self._new_mem_pool(torch, pool_id)
                else:
                    with torch.cuda.device(device):
                        pool = self._new_mem_pool(torch, pool_id)
                self._pools[(device, pool_id)] = pool
            return pool

    def _new_mem_pool(self, torch: Any, pool_id: int) -> Any:
        if is_sleepable(pool_id):
            return torch.cuda.MemPool(self._sleepable_allocator())
        return torch.cuda.MemPool()

    def _sleepable_allocator(self) -> Any:
        """PyTorch's allocator object over tensorplay's exported segment
        functions (tensorplay._memory.vmm), made once."""
        if self._allocator is None:
            memory = sys.modules["torch"].cuda.memory
            self._allocator = memory.CUDAPluggableAllocator(vmm.library_path(), vmm.TORCH_MALLOC,
                                                            vmm.TORCH_FREE).allocator()
        return self._allocator

    _RAW_CALLS = ("_cuda_beginAllocateCurrentThreadToPool", "_cuda_endAllocateToPool", "_cuda_releasePool",
                  "_cuda_getCurrentStream", "_cuda_setStream", "_cuda_getDevice", "_cuda_setDevice")

    def _raw(self, torch: Any) -> Any:
        """PyTorch's own calls under torch.cuda.use_mem_pool and set_stream
        (a capture's fixed cost is a few us less without their Python
        wrappers), or None where this PyTorch lacks one of them (asked once
        per torch module)."""
        cached = self._raw_of
        if cached is None or cached[0] is not torch:
            c = torch._C
            cached = self._raw_of = (torch, c if all(hasattr(c, n) for n in self._RAW_CALLS) else None)
        return cached[1]

    def begin(self, device: int, stream: Stream, pool_id: int) -> Any:
        torch = sys.modules["torch"]
        raw = self._raw(torch)
        prev_device = torch.cuda.current_device() if raw is None else raw._cuda_getDevice()
        pool = self.mem_pool(device, pool_id, prev_device)
        ext = self._external(device, stream)
        if raw is None:
            prev_stream: Any = torch.cuda.current_stream(device)
            routing: Any = torch.cuda.use_mem_pool(pool, device)
            routing.__enter__()
            torch_pool_id = None
        else:
            prev_stream = raw._cuda_getCurrentStream(device)       # (id, device index, device type)
            torch_pool_id = pool.id          # a property that calls into PyTorch: read once a capture
            raw._cuda_beginAllocateCurrentThreadToPool(device, torch_pool_id)
            routing = None
        try:
            self._set_stream(torch, raw, ext)
        except BaseException:
            self._end_routing(raw, routing, device, torch_pool_id)
            raise
        # a list: pause() and resume() replace the routing (index 5)
        return [device, prev_device, prev_stream, pool, torch_pool_id, routing]

    @staticmethod
    def _set_stream(torch: Any, raw: Any, stream: Any) -> None:
        """Make ``stream`` (a PyTorch stream, or with ``raw`` also the tuple
        _cuda_getCurrentStream gives) PyTorch's current stream."""
        if raw is None:
            torch.cuda.set_stream(stream)
            return
        sid, index, kind = stream if isinstance(stream, tuple) else \
            (stream.stream_id, stream.device_index, stream.device_type)
        raw._cuda_setStream(stream_id=sid, device_index=index, device_type=kind)

    @staticmethod
    def _end_routing(raw: Any, routing: Any, device: int, torch_pool_id: Any) -> None:
        if routing is not None:
            routing.__exit__(None, None, None)
        else:
            try:
                raw._cuda_endAllocateToPool(device, torch_pool_id)
            finally:
                raw._cuda_releasePool(device, torch_pool_id)

    def follow(self, state: Any, stream: Stream) -> None:
        sys.modules["torch"].cuda.set_stream(self._external(state[0], stream))

    def pause(self, state: Any) -> None:
        torch = sys.modules["torch"]
        device, torch_pool_id, routing = state[0], state[4], state[5]
        raw = self._raw(torch) if routing is None else None
        self._end_routing(raw, routing, device, torch_pool_id)      # the MemPool object keeps the pool alive

    def resume(self, state: Any) -> None:
        torch = sys.modules["torch"]
        device, pool, torch_pool_id, routing = state[0], state[3], state[4], state[5]
        if routing is None:
            self._raw(torch)._cuda_beginAllocateCurrentThreadToPool(device, torch_pool_id)
        else:
            routing = torch.cuda.use_mem_pool(pool, device)
            routing.__enter__()
            state[5] = routing

    def end(self, state: Any, on_capture_thread: bool) -> dict[int, Any]:
        torch = sys.modules["torch"]
        device, prev_device, prev_stream, pool, torch_pool_id, routing = state
        raw = self._raw(torch) if routing is None else None
        try:
            if on_capture_thread:
                self._set_stream(torch, raw, prev_stream)
                if raw is None:
                    torch.cuda.set_device(prev_device)
                elif raw._cuda_getDevice() != prev_device:
                    raw._cuda_setDevice(prev_device)
        finally:
            self._end_routing(raw, routing, device, torch_pool_id)    # ends the pool's routing, whichever thread
        hold = _PoolHold(device, pool)
        return {id(hold): hold}


class _CupyBlock:
    """Keeps tensorplay memory alive for a CuPy array (the owner CuPy holds)."""

    __slots__ = ("allocation",)

    def __init__(self, allocation: Any) -> None:
        self.allocation = allocation


def _cupy_stream(cupy: Any, stream: Stream, device: int) -> Any:
    """CuPy's stream over ``stream`` on ``device`` (the current CuPy device):
    ``Stream.from_external`` through the CUDA stream protocol where CuPy has
    it (14 and later, which deprecate ExternalStream; the wrapper keeps our
    stream alive and never destroys it), else ExternalStream."""
    from_external = getattr(getattr(cupy.cuda, "Stream", None), "from_external", None)
    if from_external is not None:
        return from_external(stream)
    return cupy.cuda.ExternalStream(stream.handle, device)


class CupyLibrary(Library):
    """CuPy: ``ExternalStream(...).use()`` over the capture's stream;
    allocations through ``cupy.cuda.using_allocator`` into tensorplay's
    caching allocator on the current (capture or body) stream, so they come
    from the capture's pool and are reused only by it and graphs sharing it."""

    name = "cupy"
    module = "cupy"

    def is_capturing(self) -> bool:
        stream = sys.modules["cupy"].cuda.get_current_stream()
        # the legacy stream never captures, and asking it while another stream
        # captures is an error: not asked
        return bool(stream.ptr) and bool(stream.is_capturing())

    def current_stream_handle(self, device: int) -> int | None:
        cupy = sys.modules["cupy"]
        with cupy.cuda.Device(device):
            return int(cupy.cuda.get_current_stream().ptr)

    def begin(self, device: int, stream: Stream, pool_id: int) -> Any:
        cupy = sys.modules["cupy"]

        def allocate_in_capture(nbytes: int) -> Any:
            allocation = allocate(nbytes, device, current_stream_handle_of(device))
            memory = cupy.cuda.UnownedMemory(allocation.ptr, nbytes, _CupyBlock(allocation), device)
            return cupy.cuda.MemoryPointer(memory, 0)

        with cupy.cuda.Device(device):
            prev_stream = cupy.cuda.get_current_stream()
            routing = cupy.cuda.using_allocator(allocate_in_capture)
            routing.__enter__()
            try:
                _cupy_stream(cupy, stream, device).use()
            except BaseException:
                routing.__exit__(None, None, None)
                raise
        return [device, prev_stream, routing, allocate_in_capture]

    def follow(self, state: Any, stream: Stream) -> None:
        cupy = sys.modules["cupy"]
        with cupy.cuda.Device(state[0]):
            _cupy_stream(cupy, stream, state[0]).use()

    def pause(self, state: Any) -> None:
        state[2].__exit__(None, None, None)      # CuPy's allocator is what it was before the capture

    def resume(self, state: Any) -> None:
        routing = sys.modules["cupy"].cuda.using_allocator(state[3])     # a generator's: entered once
        routing.__enter__()
        state[2] = routing

    def end(self, state: Any, on_capture_thread: bool) -> dict[int, Any]:
        cupy = sys.modules["cupy"]
        device, prev_stream, routing = state[:3]
        if not on_capture_thread:
            return {}          # CuPy's stream and allocator are the capture thread's: not ours to set here
        try:
            with cupy.cuda.Device(device):
                prev_stream.use()
        finally:
            routing.__exit__(None, None, None)
        return {}


_libraries: list[Library] = [TorchLibrary(), CupyLibrary()]
_enabled = [os.environ.get("TENSORPLAY_FOREIGN_CAPTURE", "1").strip().lower() not in ("0", "false", "no", "off")]


def register_library(library: Library) -> None:
    """Follow ``library`` in captures begun from now on (once, however often registered)."""
    if not isinstance(library, Library):
        raise TypeError(f"register_library expects a Library, got {type(library).__name__}")
    if library not in _libraries:
        _libraries.append(library)


def unregister_library(library: Library) -> None:
    """Stop following ``library`` in captures begun from now on."""
    if library in _libraries:
        _libraries.remove(library)


def set_foreign_capture(enabled: bool) -> None:
    """Follow other libraries in captures (the default, unless the
    environment sets ``TENSORPLAY_FOREIGN_CAPTURE=0``) or not; a capture's
    own ``foreign=`` argument overrides this."""
    if not isinstance(enabled, bool):
        raise TypeError(f"set_foreign_capture expects a bool, got {type(enabled).__name__}")
    _enabled[0] = enabled


def foreign_capture_libraries(foreign: bool | None = None) -> tuple[str, ...]:
    """The names of the libraries a capture begun now would follow
    (imported, usable and not switched off)."""
    if not (_enabled[0] if foreign is None else foreign):
        return ()
    return tuple(lib.name for lib in _followed(True))


def foreign_capture_on_this_thread() -> bool:
    """True while an imported library's current stream on this thread is
    capturing (the probe of tensorplay._driver.teardown: teardown waits)."""
    for lib in _libraries:
        if lib.module in sys.modules:
            try:
                if lib.is_capturing():
                    return True
            except Exception:
                pass
    return False


def foreign_capture_stream(device: int) -> int | None:
    """The raw handle of an imported library's current stream on ``device``
    (this thread) while it is capturing, or None: where ``tensorplay.cuda.embed``
    adds a graph inside another library's capture."""
    for lib in _libraries:
        if lib.module in sys.modules:
            try:
                if lib.is_capturing():
                    return lib.current_stream_handle(device)
            except Exception:
                pass
    return None


def _followed(enabled: bool) -> list[Library]:
    return [lib for lib in _libraries if enabled and lib.is_loaded()]


# ------------------------------------------------------------------ one capture's session

class ForeignSession:
    """The followed libraries of one open capture (see the module)."""

    def __init__(self, libraries: Sequence[Library], device: int) -> None:
        self.libraries = list(libraries)
        self.device = device
        self.states: list[tuple[Library, Any]] = []
        self.routed = False

    def streams_to_join(self) -> list[int]:
        """The libraries' current streams on this thread, to be joined into
        the capture before it begins."""
        handles = []
        for lib in self.libraries:
            lib.prepare(self.device)
        release_parked_pools()          # before the capture: freeing memory may synchronize
        for lib in self.libraries:
            h = lib.current_stream_handle(self.device)
            if h is not None and h not in handles:
                handles.append(h)
        return handles

    def begin(self, stream: Stream, pool_id: int) -> None:
        """Route and switch every library; on failure, undo the ones done and raise."""
        with capture_begin_lock:
            _routed[0] += 1
            self.routed = True
        for lib in self.libraries:
            try:
                self.states.append((lib, lib.begin(self.device, stream, pool_id)))
            except BaseException:
                self.end()
                raise

    def follow(self, stream: Stream) -> None:
        for lib, state in self.states:
            lib.follow(state, stream)

    def pause(self) -> None:
        """Stop routing the libraries' allocations into the capture's memory
        (on the capture's thread); on failure, resume the ones paused and raise."""
        done: list[tuple[Library, Any]] = []
        for lib, state in self.states:
            try:
                lib.pause(state)
            except BaseException:
                for lib2, state2 in reversed(done):
                    lib2.resume(state2)
                raise
            done.append((lib, state))

    def resume(self) -> None:
        """Route the libraries' allocations into the capture's memory again."""
        first: BaseException | None = None
        for lib, state in self.states:
            try:
                lib.resume(state)
            except BaseException as exc:
                first = first or exc
        if first is not None:
            raise first

    def end(self, on_capture_thread: bool = True) -> dict[int, Any]:
        """Restore every library (last begun first); the objects the graph
        keeps. Raises the first library's error after restoring the others."""
        keep: dict[int, Any] = {}
        first: BaseException | None = None
        while self.states:
            lib, state = self.states.pop()
            try:
                keep.update(lib.end(state, on_capture_thread))
            except BaseException as exc:
                first = first or exc
        if self.routed:
            self.routed = False
            with capture_begin_lock:
                _routed[0] -= 1
        release_parked_pools()
        if first is not None:
            raise first
        return keep

    def names(self) -> tuple[str, ...]:
        return tuple(lib.name for lib in self.libraries)


class OutsidePoolBlock:
    """The block of ``CUDAGraph.outside_pool()``: the graph's session stops
    routing other libraries' allocations into its pool, then resumes."""

    def __init__(self, graph: Any) -> None:
        self._graph = graph
        self._session: Any = None

    def __enter__(self) -> Any:
        g = self._graph
        if not g.is_capturing:
            raise RuntimeError("outside_pool: no capture is open on this graph (use it inside the capture)")
        if g._capture_thread_ident != threading.get_ident():
            raise RuntimeError("outside_pool must be used on the thread that began the capture")
        if getattr(g, "_outside_pool_open", False):
            raise RuntimeError("outside_pool: this capture is already inside an outside_pool() block")
        session = g._foreign_session
        if session is not None:
            session.pause()
            self._session = session
        g._outside_pool_open = True
        return g

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._graph._outside_pool_open = False
        session, self._session = self._session, None
        if session is not None:
            session.resume()      # before the capture's own exit ends (or discards) the routing


def begin_session(device: int, foreign: bool | None) -> ForeignSession | None:
    """The session of a capture about to begin on ``device``: None when no
    library is followed (``foreign``: the capture's choice, None for the
    process default)."""
    libs = _followed(_enabled[0] if foreign is None else bool(foreign))
    return ForeignSession(libs, device) if libs else None


# ------------------------------------------------------------------ errors

_TORCH_RNG = "generator not in capture mode"


def explain_capture_error(exc: BaseException, in_body: bool = False) -> BaseException | None:
    """A clearer error for a capture that another library's work failed
    (``in_body``: inside a conditional body), or None to let ``exc``
    propagate as it is."""
    collective = explain_collective_error(exc, in_body)
    if collective is not None:
        return collective
    compiled = explain_compile_error(exc)          # torch.compile inside the capture
    if compiled is not None:
        return compiled
    if isinstance(exc, RuntimeError) and not isinstance(exc, ForeignRandomError) and _TORCH_RNG in str(exc):
        return ForeignRandomError(
            "a PyTorch random op (torch.rand, randn, randint, dropout, multinomial, normal_, ...) ran inside a "
            "tensorplay capture: PyTorch's generator is graph-safe only under torch.cuda.graph, so its "
            "numbers would repeat at every replay. Draw them with tensorplay's generators, which are "
            "graph-safe (fresh numbers per replay) and write into PyTorch tensors without a copy: "
            "tp.from_dlpack(t).uniform_() / .normal_() / .bernoulli_(p), or tp.rand(..., device='cuda') "
            "then torch.from_dlpack(...); seed them with tp.manual_seed()")
    return None


# ------------------------------------------------------------------ tensors at the graph boundary

def is_foreign_tensor(obj: object) -> bool:
    """True for another library's array (DLPack or the CUDA Array Interface);
    not for NumPy arrays, which are host data where the graph API takes them
    (staging copies them, rebinding refuses them)."""
    return not isinstance(obj, (TensorBase, numpy.ndarray)) and (
        hasattr(obj, "__dlpack__") or hasattr(obj, "__cuda_array_interface__"))


def graph_tensor(obj: Any) -> Any:
    """``obj`` as a tensorplay tensor sharing its memory when it is another
    library's array, else ``obj`` itself."""
    if isinstance(obj, TensorBase) or not is_foreign_tensor(obj):
        return obj
    convert = foreign_converter()
    if convert is None:
        raise TypeError(f"a {type(obj).__name__} cannot be used here before tensorplay is imported whole")
    return convert(obj)
