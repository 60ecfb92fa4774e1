# SPDX-License-Identifier: Apache-2.0
"""CuPy followed in tensorplay captures (tensorplay._graph.foreign): its
current stream is the capture's, its allocations come from tensorplay's
caching allocator on that stream, so from the capture's pool."""

from __future__ import annotations

import sys
from typing import Any

from tensorplay._driver.stream import Stream, current_stream_handle_of
from tensorplay._memory.allocator import allocate
from tensorplay._graph.foreign_library import Library

__all__ = ["CupyLibrary"]


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

    def __init__(self) -> None:
        self._streams: dict[tuple[int, int], Any] = {}      # CuPy's wrappers of our streams

    def _stream(self, cupy: Any, stream: Stream, device: int) -> Any:
        """CuPy's wrapper of ``stream`` (kept: captures reuse their streams;
        made inside ``device``'s context)."""
        key = (device, stream.handle)
        wrapper = self._streams.get(key)
        if wrapper is None:
            if len(self._streams) >= 64:         # streams the user passed and dropped
                self._streams.clear()
            wrapper = self._streams[key] = _cupy_stream(cupy, stream, device)
        return wrapper

    def begin(self, device: int, stream: Stream, pool_id: int) -> Any:
        cupy = sys.modules["cupy"]

        def allocate_in_capture(nbytes: int) -> Any:
            allocation = allocate(nbytes, device, current_stream_handle_of(device))
            memory = cupy.cuda.UnownedMemory(allocation.ptr, nbytes, _CupyBlock(allocation), device)
            return cupy.cuda.MemoryPointer(memory, 0)

        with cupy.cuda.Device(device):
            prev_stream = cupy.cuda.get_current_stream()
            routing = _CupyRouting(cupy, allocate_in_capture)
            try:
                self._stream(cupy, stream, device).use()
            except BaseException:
                routing.end()
                raise
        return [device, prev_stream, routing]

    def follow(self, state: Any, stream: Stream) -> None:
        cupy = sys.modules["cupy"]
        with cupy.cuda.Device(state[0]):
            self._stream(cupy, stream, state[0]).use()

    def pause(self, state: Any) -> None:
        state[2].end()                # CuPy's allocator is what it was before the capture

    def resume(self, state: Any) -> None:
        state[2].begin()

    def end(self, state: Any, on_capture_thread: bool) -> dict[int, Any]:
        cupy = sys.modules["cupy"]
        device, prev_stream, routing = state
        if not on_capture_thread:
            return {}          # CuPy's stream and allocator are the capture thread's: not ours to set here
        try:
            with cupy.cuda.Device(device):
                prev_stream.use()
        finally:
            routing.end()
        return {}


class _CupyRouting:
    """CuPy's allocator on this thread set to ``allocate`` (begin, at
    construction) and back (end): through cupy.cuda.memory's thread-local
    allocator calls, which ``using_allocator`` wraps in a generator that costs
    a capture a few us, or through ``using_allocator`` where they are missing."""

    __slots__ = ("cupy", "allocate", "previous", "block", "routed")

    def __init__(self, cupy: Any, allocate: Any) -> None:
        self.cupy = cupy
        self.allocate = allocate
        self.routed = False
        self.begin()

    def begin(self) -> None:
        memory = getattr(self.cupy.cuda, "memory", None)
        get = getattr(memory, "_get_thread_local_allocator", None)
        put = getattr(memory, "_set_thread_local_allocator", None)
        if get is not None and put is not None:
            self.previous, self.block = get(), None
            put(self.allocate)
        else:
            self.block = self.cupy.cuda.using_allocator(self.allocate)    # a generator's: entered once
            self.block.__enter__()
        self.routed = True

    def end(self) -> None:
        if not self.routed:
            return
        self.routed = False
        block, self.block = self.block, None
        if block is not None:
            block.__exit__(None, None, None)
        else:
            previous, self.previous = self.previous, None
            self.cupy.cuda.memory._set_thread_local_allocator(previous)
