# SPDX-License-Identifier: Apache-2.0
"""A readable report of the caching allocator's state (``memory_summary``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tensorplay._driver.context import is_available, live_counts
from tensorplay._driver.stream import cached_stream_count
from tensorplay._memory.api import memory_snapshot, memory_stats
from tensorplay._memory.units import format_bytes

if TYPE_CHECKING:
    from tensorplay._device import DeviceLike

_ROWS = (
    ("Allocated memory", "allocated_bytes", True),
    ("Active memory", "active_bytes", True),
    ("Requested memory", "requested_bytes", True),
    ("GPU reserved memory", "reserved_bytes", True),
    ("Allocations", "allocation", False),
    ("Active allocs", "active", False),
    ("GPU reserved segments", "segment", False),
)


def memory_summary(device: DeviceLike = None) -> str:
    """Return a table describing the caching allocator of ``device``, as ``torch.cuda.memory_summary``.

    Current, peak, total allocated and total freed of each counter (from
    large and small segments), the memory in free pieces of split segments
    (fragmentation), and each pool's segments. Without CUDA, the table of
    an allocator that never allocated (every count 0), as
    :func:`memory_stats` is then empty.

    Parameters
    ----------
    device : device, str, int or None, optional
        Default the current device.
    """
    return format_summary(memory_stats(device), memory_snapshot(device))


def format_summary(st: dict[str, int], snapshot: list[dict[str, Any]]) -> str:
    """The table of :func:`memory_summary` from a stats dict and a snapshot
    (a counter missing from ``st``, all of them without CUDA, reads 0)."""
    def get(key: str) -> int:
        return st.get(key, 0)
    lines = [f"{'Metric':<34}{'Cur Usage':>14}{'Peak Usage':>14}{'Tot Alloc':>14}{'Tot Freed':>14}"]
    for title, key, is_bytes in _ROWS:
        fmt = format_bytes if is_bytes else str
        for pool, label in (("all", title), ("large_pool", "  from large pool"), ("small_pool", "  from small pool")):
            vals = [get(f"{key}.{pool}.{f}") for f in ("current", "peak", "allocated", "freed")]
            lines.append(f"{label:<34}" + "".join(f"{fmt(v):>14}" for v in vals))
    lines.append(f"{'Non-releasable memory (split free)':<34}{format_bytes(get('inactive_split_bytes.all.current')):>14}")
    lines.append(f"{'Non-releasable allocs (split free)':<34}{get('inactive_split.all.current'):>14}")
    lines.append(f"{'Pending record_stream frees':<34}{get('pending_events'):>14}")
    lines.append(f"device alloc/free calls: {get('num_device_alloc')}/{get('num_device_free')}, "
                 f"OOM retries: {get('num_alloc_retries')}, OOMs: {get('num_ooms')}")
    pools: dict[int, list[dict[str, Any]]] = {}
    for seg in snapshot:
        pools.setdefault(seg["segment_pool_id"], []).append(seg)
    for pid in sorted(pools):
        segs = pools[pid]
        name = "default pool" if pid == 0 else f"graph pool {pid} ({st.get(f'pool.{pid}.graph_refs', 0)} graphs)"
        used = sum(b["size"] for s in segs for b in s["blocks"] if b["state"] == "allocated")
        total = sum(s["total_size"] for s in segs)
        lines.append(f"{name}: {len(segs)} segments, {format_bytes(total)} reserved, {format_bytes(used)} allocated")
    return "\n".join(lines)


def live_driver_objects(device: DeviceLike = None) -> dict[str, int]:
    """Count the driver objects tensorplay created and has not destroyed.

    For leak checks: after ``gc.collect()`` and :func:`empty_cache` the
    counts return to what they were before the work (the stream cache only
    grows to the most streams alive at once).

    Parameters
    ----------
    device : device, str, int or None, optional
        The device whose allocator is asked about pending events; default
        the current device.

    Returns
    -------
    dict of str to int
        ``streams`` held by Stream objects, ``cached_streams`` kept for reuse
        (never destroyed, as in PyTorch), ``events``, ``graphs`` and
        ``execs`` (CUgraph and CUgraphExec handles), ``modules`` (loaded
        CUmodules) and, with a GPU, ``allocator_events``: the allocator's
        pending ``record_stream`` events on ``device``.
    """
    out = live_counts()
    out["cached_streams"] = cached_stream_count()
    if is_available():
        out["allocator_events"] = memory_stats(device)["pending_events"]
    return out
