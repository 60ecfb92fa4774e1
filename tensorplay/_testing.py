# SPDX-License-Identifier: Apache-2.0
"""What tensorplay's own tests read or swap inside the package, in one place.

Not public API (it may change with any release), but documented
(docs/design.md, "Testing"): the test suite imports these names from here,
not from the modules that define them, so the inside of the package can
move without the tests reaching into it.

- ``DeviceAllocator`` with ``FakeBackend``: the allocator's block policy on a
  fake device (``DeviceAllocator(0, FakeBackend())``), without a GPU;
  ``note_capture_use`` marks a storage used by the open capture;
  ``make_sleepable(pool_id)`` gives a pool id sleepable segments.
- ``bound_device()``: the device whose context this thread made current.
- ``staged_builds()``: how many one-launch staging graphs were built.
- ``rebind_patch_calls(graph)``, ``stages_in_one_launch(graph)``: a graph's
  kernel-node patches by ``rebind_and_launch``, and whether
  ``stage_and_launch`` runs in one launch.
- ``PinnedMemory``, ``pinned_memory_of(array)``, ``pinned_memory_stats()``,
  ``free_pending_pinned(wait)``: pinned host buffers, the one under an
  array, how many are alive or wait for their GPU work, and freeing those
  whose work has run.
- ``teardown_waits()``, ``defer_call(fn, *args)``, ``run_deferred_teardown()``,
  ``deferred_teardown_count()``, ``drop_later(obj)``,
  ``call_as_driver_thread(fn, *args)``, ``set_foreign_capture_probe(fn)``: teardown that waits while a capture
  is open or on the driver's thread (tensorplay._driver.teardown), and ways
  to act as that thread does.
- ``warn_user(message, category)``, ``call_site()``: a warning attributed to
  the nearest frame outside tensorplay, and that frame as ``file:line
  (function)`` (tensorplay._frames).
- ``CapturePlan``: a ``GraphSet``'s bookkeeping of which sizes it captured,
  its memory budget and estimates, its per-size report and capture lock,
  driven by any capture function (tensorplay._graph.graphset_plan).
"""

from tensorplay._frames import call_site, warn_user
from tensorplay._driver.context import bound_device
from tensorplay._driver.pinned import PinnedMemory, free_pending_pinned, pinned_memory_of, pinned_memory_stats
from tensorplay._driver.teardown import (call_as_driver_thread, defer_call, deferred_teardown_count, drop_later,
                                         run_deferred_teardown, set_foreign_capture_probe, teardown_waits)
from tensorplay._graph.graphset_plan import CapturePlan
from tensorplay._graph.stager import staged_builds
from tensorplay._memory.allocator import DeviceAllocator, make_sleepable, note_capture_use
from tensorplay._memory.testing import FakeBackend
from tensorplay.cuda import CUDAGraph

__all__ = ["CapturePlan", "DeviceAllocator", "FakeBackend", "PinnedMemory", "bound_device", "call_as_driver_thread", "call_site",
           "defer_call",
           "deferred_teardown_count", "drop_later", "free_pending_pinned", "make_sleepable", "note_capture_use",
           "pinned_memory_of", "pinned_memory_stats", "rebind_patch_calls", "run_deferred_teardown",
           "set_foreign_capture_probe", "stages_in_one_launch", "staged_builds", "teardown_waits", "warn_user"]


def rebind_patch_calls(graph: CUDAGraph) -> int:
    """Return how many kernel nodes ``graph.rebind_and_launch`` has patched (cuGraphExecKernelNodeSetParams)."""
    return int(graph._rebind_patch_calls)


def stages_in_one_launch(graph: CUDAGraph) -> bool:
    """Return True when ``graph.stage_and_launch`` copies and replays in one launch (a staging graph)."""
    return bool(graph._stages_in_one_launch)
