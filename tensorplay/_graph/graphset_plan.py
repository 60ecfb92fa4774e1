# SPDX-License-Identifier: Apache-2.0
"""Which sizes a ``GraphSet`` has captured, which wait for their first call
and which its memory budget turned away: the estimate made before each
capture, the size a call falls back to, the per-size report and the lock
that lets one capture run at a time. No GPU here: the capture itself is a
function the set passes in, so the arithmetic is tested without one.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Callable
from typing import Any, Literal, cast

from tensorplay._memory.units import format_bytes

__all__ = ["CAPTURE_MODES", "CaptureMode", "CapturePlan", "SizeRecord", "check_capture_mode", "check_memory_budget"]

#: ``GraphSet(capture=...)``: every size now, the largest now and the rest on
#: their first call, or every size on its first call
CaptureMode = Literal["all", "largest", "on_demand"]
CAPTURE_MODES: tuple[CaptureMode, ...] = ("all", "largest", "on_demand")


def check_capture_mode(capture: Any) -> CaptureMode:
    if not isinstance(capture, str) or capture not in CAPTURE_MODES:
        raise ValueError(f"GraphSet: capture must be one of {', '.join(map(repr, CAPTURE_MODES))}, "
                         f"got {capture!r}")
    return cast(CaptureMode, capture)


def check_memory_budget(budget: Any) -> int | None:
    if budget is None:
        return None
    if isinstance(budget, bool) or not isinstance(budget, int):
        raise TypeError(f"GraphSet: memory_budget must be an int (bytes) or None, got {type(budget).__name__}")
    if budget <= 0:
        raise ValueError(f"GraphSet: memory_budget must be positive (bytes), got {budget}")
    return budget


class SizeRecord:
    """What one size's capture cost, and what was estimated before it."""

    __slots__ = ("size", "nbytes", "seconds", "order", "estimate", "total_after", "top", "below")

    def __init__(self, size: int, nbytes: int, seconds: float, order: int, estimate: int | None,
                 total_after: int, top: bool) -> None:
        self.size = size
        self.nbytes = nbytes
        self.seconds = seconds
        self.order = order              # 0 for the set's first capture
        self.estimate = estimate        # None: nothing to extrapolate from
        self.total_after = total_after  # the set's pool growth right after this capture
        self.top = top                  # larger than every size captured before it
        self.below = not top            # made below a larger captured size: it reused that one's blocks


class CapturePlan:
    """The bookkeeping of a set's captures (see ``GraphSet``'s ``capture``
    and ``memory_budget``).

    The budget bounds the pool growth the set's captures add up to (the sum
    of their ``nbytes``). A size is captured when that sum plus the size's
    estimate stays within it; with no estimate, when the sum is still below
    it. A capture is never undone, so an estimate that was too low lets the
    sum pass the budget by that capture's error, and no size is captured
    after that.

    The estimate (None where nothing can be extrapolated):

    - a size below a captured one: the most any capture made below an
      already captured larger size has added (0 before any; such a capture
      mostly reuses the blocks the larger graph freed);
    - a size above every captured one: the pool growth per row between the
      last two captures that were each the largest captured when made
      (the set's total growth after each, over their difference in rows),
      times the rows beyond the largest captured size. With only one such
      capture there is no slope (its growth holds fixed costs such as a
      library's workspace, which a per-row figure would scale up): None.
    """

    def __init__(self, sizes: tuple[int, ...], budget: int | None) -> None:
        self.sizes = sizes
        self.budget = budget
        self.records: dict[int, SizeRecord] = {}
        self.refused: dict[int, int | None] = {}     # size -> the estimate that turned it away
        self.captured_sizes: list[int] = []          # sorted
        self.lock = threading.Lock()                 # one capture at a time; replays do not take it
        self.warned = False

    # ------------------------------------------------------------ arithmetic

    def _records(self) -> list[SizeRecord]:
        # a snapshot (one C call): a report or size_for may read while another thread records
        return list(self.records.values())

    def added(self) -> int:
        """The pool growth the set's captures add up to (bytes)."""
        return sum(r.nbytes for r in self._records())

    def estimate(self, size: int) -> int | None:
        """Bytes the capture of ``size`` is expected to add (see the class)."""
        records = self._records()
        if not records:
            return None
        if size < max(r.size for r in records):
            return max((r.nbytes for r in records if r.below), default=0)
        tops = sorted((r for r in records if r.top), key=lambda r: r.size)
        if len(tops) < 2:
            return None
        a, b = tops[-2], tops[-1]
        per_row = max(b.total_after - a.total_after, 0) / (b.size - a.size)
        return int(per_row * (size - b.size) + 0.5)

    def admits(self, size: int) -> tuple[bool, int | None]:
        """(whether the budget lets ``size`` be captured, its estimate)."""
        est = self.estimate(size)
        if self.budget is None:
            return True, est
        added = self.added()
        if est is None:
            return added < self.budget, est
        return added + est <= self.budget, est

    def fallback(self, size: int) -> int | None:
        """The smallest captured size holding ``size`` rows; None: none is (eager)."""
        captured = list(self.captured_sizes)         # a snapshot, as in _records
        i = bisect.bisect_left(captured, size)
        return captured[i] if i < len(captured) else None

    def pending(self) -> list[int]:
        """Sizes neither captured nor turned away, largest first."""
        return [s for s in reversed(self.sizes) if s not in self.records and s not in self.refused]

    def runs(self, size: int) -> int | None:
        """The size whose graph a call of ``size`` (one of the sizes) would
        replay now: itself when captured or when its capture would be made,
        else the fallback (None: eagerly)."""
        if size in self.records:
            return size
        if size not in self.refused and self.admits(size)[0]:
            return size
        return self.fallback(size)

    # ------------------------------------------------------------ decisions

    def ensure(self, size: int, capture: Callable[[int], tuple[int, float]]) -> tuple[int | None, str | None]:
        """Capture ``size`` unless it is captured or the budget turns it away
        (``capture(size)`` -> (bytes the pool grew, seconds)), under the lock.
        Returns (the size to replay, None: run eagerly; the warning to give,
        the first time the budget turns a size away)."""
        with self.lock:
            if size in self.records:                 # another thread captured it meanwhile
                return size, None
            if size not in self.refused:
                ok, est = self.admits(size)
                if ok:
                    nbytes, seconds = capture(size)
                    self.record(size, nbytes, seconds, est)
                    return size, None
                self.refused[size] = est
                run = self.fallback(size)
                if not self.warned:
                    self.warned = True
                    return run, self.refusal_message(size, est, run)
            return self.fallback(size), None

    def record(self, size: int, nbytes: int, seconds: float, estimate: int | None) -> None:
        top = not self.captured_sizes or size > self.captured_sizes[-1]
        total = self.added() + nbytes
        self.records[size] = SizeRecord(size, nbytes, seconds, len(self.records), estimate, total, top)
        bisect.insort(self.captured_sizes, size)

    def refusal_message(self, size: int, est: int | None, run: int | None) -> str:
        added = self.added()
        why = (f"its estimated {format_bytes(est)} would take the set's pool growth from {format_bytes(added)} "
               f"past its memory_budget of {format_bytes(self.budget or 0)}" if est is not None else
               f"the set's pool growth of {format_bytes(added)} has reached its memory_budget of "
               f"{format_bytes(self.budget or 0)}")
        then = (f"calls of up to {size} rows run the graph of size {run} (padded)" if run is not None else
                f"calls of up to {size} rows run eagerly")
        return (f"GraphSet: size {size} is not captured: {why}; {then}. Further sizes the budget turns away "
                f"are not warned about: see memory_report()")

    def clear(self) -> None:
        self.records.clear()
        self.refused.clear()
        self.captured_sizes.clear()

    # ------------------------------------------------------------ report

    def report(self, nodes_of: Callable[[int], int]) -> list[dict[str, Any]]:
        """One row per size, smallest first (see ``GraphSet.memory_report``);
        ``nodes_of(size)`` counts a captured size's nodes."""
        rows = []
        for s in self.sizes:
            r = self.records.get(s)
            if r is not None:
                rows.append({"size": s, "state": "captured", "bytes": r.nbytes, "estimate": r.estimate,
                             "nodes": nodes_of(s), "capture_ms": r.seconds * 1e3, "order": r.order, "runs": s})
            else:
                refused = s in self.refused
                rows.append({"size": s, "state": "over budget" if refused else "pending", "bytes": None,
                             "estimate": self.refused[s] if refused else self.estimate(s), "nodes": None,
                             "capture_ms": None, "order": None, "runs": self.runs(s)})
        return rows
