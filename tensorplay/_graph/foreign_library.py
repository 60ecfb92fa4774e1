# SPDX-License-Identifier: Apache-2.0
"""The protocol of a library that tensorplay captures follow
(tensorplay._graph.foreign says how a capture uses it)."""

from __future__ import annotations

import sys
from typing import Any

from tensorplay._driver.stream import Stream

__all__ = ["Library"]


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
