# SPDX-License-Identifier: Apache-2.0
"""GraphSet and GraphPool arguments checked before anything touches a GPU,
and a set's capture bookkeeping (CapturePlan: which sizes are captured, the
memory budget and its estimates, the per-size report, one capture at a time)
driven by a stand-in capture."""
import threading
import time

import numpy as np
import pytest

import tensorplay as tp
from tensorplay._testing import CapturePlan
from tensorplay.cuda import GraphSet


def step(x):
    return x


@pytest.mark.parametrize("sizes, error, match", [
    ([], ValueError, "sizes is empty"),
    ([0, 4], ValueError, "positive, got 0"),
    ([2, 2.5], TypeError, "ints, got 2.5"),
    ([True], TypeError, "ints, got True"),
    (5, TypeError, "iterable of ints, got int"),
])
def test_bad_sizes(sizes, error, match):
    with pytest.raises(error, match=match):
        GraphSet(step, [tp.ones((2, 3))], sizes)


def test_samples_must_be_batched_cuda_tensors():
    with pytest.raises(TypeError, match="not callable"):
        GraphSet(3, [tp.ones((2, 3))], [1])
    with pytest.raises(ValueError, match="sample_args is empty"):
        GraphSet(step, [], [1])
    with pytest.raises(TypeError, match=r"sample_args\[0\] is a ndarray"):
        GraphSet(step, [np.ones((2, 3))], [1])
    with pytest.raises(ValueError, match=r"sample_args\[0\] is on cpu.*CUDA tensors"):
        GraphSet(step, [tp.ones((2, 3))], [1])
    with pytest.raises(TypeError, match="sequence of tensors"):
        GraphSet(step, 3, [1])


def test_a_pool_needs_cuda():
    if tp.cuda.is_available():
        pytest.skip("CUDA is available here")
    with pytest.raises(tp.cuda.CudaUnavailableError):
        tp.cuda.GraphPool()


@pytest.mark.parametrize("kwargs, error, match", [
    ({"capture": "lazy"}, ValueError, "capture must be one of 'all', 'largest', 'on_demand', got 'lazy'"),
    ({"capture": True}, ValueError, "capture must be one of"),
    ({"memory_budget": 0}, ValueError, "memory_budget must be positive"),
    ({"memory_budget": -1}, ValueError, "memory_budget must be positive"),
    ({"memory_budget": 1.5e9}, TypeError, "memory_budget must be an int"),
    ({"memory_budget": True}, TypeError, "memory_budget must be an int"),
])
def test_bad_capture_mode_and_budget(kwargs, error, match):
    # checked before the samples, which would need a GPU
    with pytest.raises(error, match=match):
        GraphSet(step, [tp.ones((2, 3))], [1, 2], **kwargs)


MiB = 1 << 20


class StubCapture:
    """A capture that costs what ``costs[size]`` says and records the order."""

    def __init__(self, costs, seconds=0.001, delay=0.0):
        self.costs, self.seconds, self.delay = costs, seconds, delay
        self.calls = []
        self.lock = threading.Lock()

    def __call__(self, size):
        with self.lock:
            self.calls.append(size)
        time.sleep(self.delay)
        return self.costs[size], self.seconds


def test_without_a_budget_every_size_is_captured_once_and_reported():
    plan = CapturePlan((1, 2, 4, 8), None)
    cap = StubCapture({1: 0, 2: 0, 4: MiB, 8: 10 * MiB})
    for s in plan.pending():                       # largest first, as the constructor and capture_all go
        assert plan.ensure(s, cap) == (s, None)
    assert cap.calls == [8, 4, 2, 1]
    assert plan.ensure(4, cap) == (4, None) and cap.calls == [8, 4, 2, 1]   # captured once
    assert plan.added() == 11 * MiB and plan.pending() == []
    rows = plan.report(lambda s: 10 * s)
    assert [r["size"] for r in rows] == [1, 2, 4, 8]
    assert [r["state"] for r in rows] == ["captured"] * 4
    assert [r["bytes"] for r in rows] == [0, 0, MiB, 10 * MiB]
    assert [r["order"] for r in rows] == [3, 2, 1, 0]
    assert [r["nodes"] for r in rows] == [10, 20, 40, 80]
    assert [r["runs"] for r in rows] == [1, 2, 4, 8]
    assert all(r["capture_ms"] == pytest.approx(1.0) for r in rows)
    # the largest had nothing to extrapolate from; below it, the most a smaller capture had added
    # before (size 4's 1 MiB by the time 2 and 1 came)
    assert [r["estimate"] for r in rows] == [MiB, MiB, 0, None]
    assert set(rows[0]) == {"size", "state", "bytes", "estimate", "nodes", "capture_ms", "order", "runs"}


def test_estimate_above_the_largest_is_the_growth_per_row_between_the_last_two_tops():
    plan = CapturePlan((1, 2, 4, 8, 16, 32), None)
    cap = StubCapture({1: 5 * MiB, 2: MiB, 4: 2 * MiB, 8: 4 * MiB, 16: 8 * MiB, 32: 0})
    plan.ensure(1, cap)
    assert plan.estimate(2) is None                  # one top: its 5 MiB holds fixed costs, no slope
    plan.ensure(2, cap)
    assert plan.estimate(4) == 2 * MiB               # (6 - 5) MiB over 1 row, times 2 rows beyond 2
    plan.ensure(4, cap)
    plan.ensure(8, cap)
    assert plan.estimate(16) == 8 * MiB              # (12 - 8) MiB over 4 rows, times 8
    assert plan.estimate(3) == 0                     # below a captured size: no capture there yet


def test_the_budget_stops_capturing_and_falls_back_to_the_next_larger_size():
    plan = CapturePlan((1, 2, 4, 8, 16), 12 * MiB)
    cap = StubCapture({16: 10 * MiB, 8: MiB, 4: 2 * MiB, 2: MiB, 1: MiB})
    assert plan.ensure(16, cap) == (16, None)        # no estimate, the sum (0) is under the budget
    assert plan.ensure(8, cap) == (8, None)          # estimate 0: 10 + 0 <= 12
    assert plan.ensure(4, cap) == (4, None)          # estimate 1 MiB (size 8's): 11 + 1 <= 12
    run, warning = plan.ensure(2, cap)               # estimate 2 MiB (size 4's): 13 + 2 > 12
    assert run == 4 and "size 2 is not captured" in warning and "run the graph of size 4 (padded)" in warning
    assert "memory_budget of 12.00 MiB" in warning and "from 13.00 MiB" in warning
    assert plan.ensure(2, cap) == (4, None)          # said once, not tried again
    assert plan.ensure(1, cap) == (4, None)          # turned away too (estimate 2 MiB), not warned about
    assert cap.calls == [16, 8, 4]
    rows = {r["size"]: r for r in plan.report(lambda s: 1)}
    assert rows[2]["state"] == rows[1]["state"] == "over budget"
    assert rows[2]["runs"] == rows[1]["runs"] == 4 and rows[2]["estimate"] == 2 * MiB
    assert rows[2]["bytes"] is None and rows[2]["nodes"] is None and rows[2]["order"] is None
    assert plan.pending() == []


def test_with_nothing_larger_captured_a_turned_away_size_runs_eagerly():
    plan = CapturePlan((1, 2, 4, 8), 3 * MiB)
    cap = StubCapture({1: 2 * MiB, 2: MiB, 4: 0, 8: 0})
    assert plan.ensure(1, cap) == (1, None)          # on demand, smallest first
    assert plan.ensure(2, cap) == (2, None)          # one top: no slope, the sum (2) is under 3
    assert plan.estimate(8) == 6 * MiB               # 1 MiB a row (sizes 1 and 2), 6 rows beyond 2
    assert plan.runs(8) is None                      # 3 + 6 > 3: a call would run eagerly
    run, warning = plan.ensure(8, cap)
    assert run is None and "calls of up to 8 rows run eagerly" in warning
    assert plan.runs(8) is None
    assert plan.ensure(4, cap) == (None, None)       # the sum has reached the budget
    assert cap.calls == [1, 2]


def test_runs_says_what_a_call_would_do_without_capturing():
    plan = CapturePlan((2, 4, 8), 5 * MiB)
    cap = StubCapture({8: 6 * MiB, 4: 0, 2: 0})
    assert [plan.runs(s) for s in (2, 4, 8)] == [2, 4, 8]     # nothing captured: each its own
    plan.ensure(8, cap)                                        # 6 MiB: past the budget
    assert [plan.runs(s) for s in (2, 4, 8)] == [8, 8, 8]
    assert cap.calls == [8]
    assert [r["state"] for r in plan.report(lambda s: 1)] == ["pending", "pending", "captured"]


def test_a_failed_capture_leaves_the_size_pending():
    plan = CapturePlan((1, 2), None)

    def failing(size):
        raise RuntimeError("capture failed")
    with pytest.raises(RuntimeError, match="capture failed"):
        plan.ensure(2, failing)
    assert plan.pending() == [2, 1] and not plan.lock.locked()
    assert plan.ensure(2, StubCapture({2: 0})) == (2, None)


def test_threads_calling_one_new_size_capture_it_once():
    plan = CapturePlan((1, 2, 4, 8), None)
    cap = StubCapture({1: 0, 2: 0, 4: 0, 8: MiB}, delay=0.05)
    barrier = threading.Barrier(8)
    results = []

    def call(size):
        barrier.wait()
        results.append(plan.ensure(size, cap))
    threads = [threading.Thread(target=call, args=(4 if i % 2 else 8,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(cap.calls) == [4, 8]               # each size captured once, never two at a time
    assert sorted(results) == [(4, None)] * 4 + [(8, None)] * 4


def test_captures_run_one_at_a_time():
    plan = CapturePlan((1, 2, 4, 8), None)
    inside, most = [0], [0]
    lock = threading.Lock()

    def capture(size):
        with lock:
            inside[0] += 1
            most[0] = max(most[0], inside[0])
        time.sleep(0.02)
        with lock:
            inside[0] -= 1
        return 0, 0.0
    threads = [threading.Thread(target=plan.ensure, args=(s, capture)) for s in (1, 2, 4, 8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert most[0] == 1 and sorted(plan.records) == [1, 2, 4, 8]
