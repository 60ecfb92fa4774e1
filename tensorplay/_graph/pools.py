# SPDX-License-Identifier: Apache-2.0
"""``GraphPool``: a memory pool for graphs that share memory, whose physical
memory can be given back to the device while its graphs stay instantiated
(``sleep``) and mapped again at the same addresses (``wake``), so the next
replay needs no capture.

A sleepable pool is built from address-reserved segments (the driver's
virtual memory management; tensorplay._memory.vmm). PyTorch work captured
into it allocates through the same segments (tensorplay._graph.foreign
gives PyTorch's MemPool tensorplay's allocator), so sleep covers it too.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from tensorplay._memory import vmm
from tensorplay._memory.sharing import PoolExport, export_pool_handles
from tensorplay._memory.api import allocator as _allocator
from tensorplay._memory.api import graph_pool_handle, pool_asleep, sleep_pool, wake_pool
from tensorplay._memory.allocator import PoolAsleepError
from tensorplay._driver.context import device_count
from tensorplay._tensor.tensor import Tensor
from tensorplay._tensor.transfer import synchronize
from tensorplay._graph.foreign import graph_tensor, is_foreign_tensor
from tensorplay._graph.collectives import check_sleep

__all__ = ["GraphPool", "PoolAsleepError"]


class GraphPool:
    """A memory pool that graphs capture into and share, and that can sleep.

    Pass it as ``pool=`` wherever a pool is taken (``CUDAGraph.capture_begin``,
    ``graph``, ``make_graphed_callables``, ``cudagraphify``, ``GraphSet``).
    Graphs sharing a pool must replay in the order they were captured.

    ``sleep()`` gives the pool's physical memory back to the device; its
    graphs stay instantiated and their replays raise :class:`PoolAsleepError`
    until ``wake()`` maps new memory at the same addresses. What the pool
    held is lost, except the tensors named in ``sleep(keep=...)``, which are
    copied to pinned host memory and back. Tensors allocated from the pool
    (a graph's outputs) must not be read while it sleeps: their memory is
    gone, and a kernel touching it faults.

    Parameters
    ----------
    sleepable : bool, optional
        Build the pool from address-reserved segments (default True). A pool
        made with False is an ordinary shared pool: ``sleep()`` raises
        ValueError.
    """

    def __init__(self, *, sleepable: bool = True) -> None:
        self.id: int = graph_pool_handle(sleepable=sleepable)
        self.sleepable = bool(sleepable)
        self._kept: list[tuple[Any, Any]] = []

    @property
    def asleep(self) -> bool:
        """Whether the pool's memory is given back (on any device)."""
        return pool_asleep(self.id)

    def memory(self, device: int | None = None) -> dict[str, int]:
        """The pool's device memory: ``reserved`` (tensorplay's segments, as
        in ``memory_stats()``), ``mapped`` and ``asleep`` (bytes of sleepable
        segments, tensorplay's and PyTorch's, with and without physical
        memory now), summed over devices or for ``device``."""
        out = {"reserved": 0, "mapped": 0, "asleep": 0}
        devices = range(device_count()) if device is None else [int(device)]
        for d in devices:
            p = _allocator(d).get_pool(self.id, False)
            if p is not None and not p.asleep:
                out["reserved"] += p.reserved_bytes
            if self.sleepable:
                mapped, unmapped = vmm.pool_bytes(self.id, d)
                out["mapped"] += mapped
                out["asleep"] += unmapped
        return out

    def sleep(self, keep: Iterable[Any] = (), *, allow_collectives: bool = False) -> int:
        """Give the pool's physical memory back; return the bytes given back.

        Waits for the device's queued work (replays in flight) first.
        Refused while a capture is under way. Sleeping a sleeping pool does
        nothing.

        Refused with :class:`~tensorplay.cuda.CollectiveError` while a graph
        of the pool holds captured NCCL collectives (kernels named
        ``ncclDevKernel*`` or ``ncclKernel*``) and the environment does not
        set ``NCCL_GRAPH_REGISTER=0``: NCCL registers a captured
        collective's buffers for the graph's life, and new physical pages at
        the same addresses leave that registration stale (a replay hangs).

        Parameters
        ----------
        keep : iterable of tensors, optional
            Tensors (tensorplay, PyTorch, CuPy) whose values ``wake()``
            restores; copied to pinned host memory now.
        allow_collectives : bool, optional
            Sleep even though graphs hold NCCL collectives (you know NCCL
            registered none of their buffers).
        """
        if not self.sleepable:
            raise ValueError(f"GraphPool {self.id} was made with sleepable=False; it cannot sleep")
        if self.asleep:
            return 0
        check_sleep(self.id, allow_collectives)
        saved = [self._save(t, i) for i, t in enumerate(keep)]
        n = sleep_pool(self.id)
        self._kept.extend(saved)
        return n

    def wake(self) -> int:
        """Map new physical memory at the pool's addresses and restore the
        kept tensors; return the bytes mapped. Out of memory raises
        OutOfMemoryError and leaves the pool asleep."""
        n = wake_pool(self.id)
        kept, self._kept = self._kept, []
        for view, host in kept:
            view.copy_(host)
        if kept:
            synchronize()        # the host copies may go once the transfers are done
        return n

    def export_handles(self, device: int | str | None = None, handle_type: str = "auto") -> PoolExport:
        """Export the pool's segments on ``device`` so that other processes can map them.

        Returns a :class:`~tensorplay.cuda.PoolExport`: its ``segments``
        (picklable :class:`~tensorplay.cuda.ExportedSegment` records: the
        segment's address here, size, handle, live blocks) and its ``fds``
        (a POSIX file descriptor per segment of a sleepable pool, to send
        over a Unix socket with ``socket.send_fds``; close the export once
        sent). The peer maps them with :func:`tensorplay.cuda.import_segments`.
        A pool made with ``sleepable=False`` exports CUDA IPC handles.
        Refused while the pool sleeps (:class:`PoolAsleepError`). See
        :func:`tensorplay.cuda.export_pool_handles`.
        """
        return export_pool_handles(self.id, device, handle_type)

    @staticmethod
    def _save(t: Any, i: int) -> tuple[Any, Any]:
        if not (isinstance(t, Tensor) or is_foreign_tensor(t)):
            raise TypeError(f"sleep(keep=...): item {i} is a {type(t).__name__}, not a tensor")
        view = graph_tensor(t)
        if view.device.type != "cuda":
            raise ValueError(f"sleep(keep=...): item {i} is on {view.device}; only device tensors need keeping")
        return view, view.to("cpu").pin_memory()

    @property
    def pool_id(self) -> int:
        """The pool's id (what ``graph_pool_handle()`` returns)."""
        return self.id

    def __repr__(self) -> str:
        state = "asleep" if self.asleep else "awake"
        return f"<GraphPool id={self.id} {'sleepable, ' + state if self.sleepable else 'not sleepable'}>"
