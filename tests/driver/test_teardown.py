# SPDX-License-Identifier: Apache-2.0
"""Teardown that waits (tensorplay._driver.teardown), without a GPU: work
queued while a capture is open or on the driver's thread runs once neither
holds; references the driver's thread drops reach the main thread; the
probe of other libraries' captures; and the allocator keeping a private
pool's memory while teardown must wait."""
import gc
import weakref

import pytest

from tensorplay._graph.foreign import foreign_capture_on_this_thread
from tensorplay._testing import (DeviceAllocator, FakeBackend, call_as_driver_thread, defer_call,
                                 deferred_teardown_count, drop_later, run_deferred_teardown,
                                 set_foreign_capture_probe, teardown_waits)

MiB = 1 << 20
S0 = 0x1000


@pytest.fixture(autouse=True)
def _nothing_queued():
    run_deferred_teardown()
    assert deferred_teardown_count() == 0
    yield
    set_foreign_capture_probe(foreign_capture_on_this_thread)    # what tensorplay's top level sets
    run_deferred_teardown()
    assert deferred_teardown_count() == 0


class Thing:
    pass


def test_deferred_call_runs_at_once_when_nothing_waits():
    ran = []
    assert not teardown_waits()
    defer_call(ran.append, 1)
    assert ran == [1] and deferred_teardown_count() == 0


def test_on_the_driver_thread_teardown_waits_for_the_main_thread():
    ran = []

    def on_driver_thread():
        assert teardown_waits()
        defer_call(ran.append, "destroyed")
        assert run_deferred_teardown() == 1          # nothing runs on the driver's thread
    call_as_driver_thread(on_driver_thread)
    assert ran == [] and deferred_teardown_count() == 1
    assert run_deferred_teardown() == 0
    assert ran == ["destroyed"]


def test_an_open_capture_defers_teardown_until_it_ends():
    a = DeviceAllocator(0, FakeBackend())
    ran = []
    st = a.begin_capture(3, 11, S0)
    assert teardown_waits()
    defer_call(ran.append, "unloaded")
    assert run_deferred_teardown() == 1 and ran == []   # the capture is still open
    a.end_capture(st)                                    # the last capture's end runs the queue
    assert ran == ["unloaded"] and not teardown_waits()


def test_a_failing_deferred_call_does_not_stop_the_others():
    ran = []

    def broken():
        raise RuntimeError("driver error")
    call_as_driver_thread(lambda: (defer_call(broken), defer_call(ran.append, 2)))
    run_deferred_teardown()
    assert ran == [2] and deferred_teardown_count() == 0


def test_teardown_queued_by_teardown_runs_in_the_same_round():
    ran = []

    def first():
        call_as_driver_thread(defer_call, ran.append, "second")
        ran.append("first")
    call_as_driver_thread(defer_call, first)
    run_deferred_teardown()
    assert ran == ["first", "second"]


def test_a_reference_the_driver_thread_drops_is_dropped_on_the_main_thread():
    obj = Thing()
    ref = weakref.ref(obj)
    drop_later(obj)                  # a new reference, handed over as the driver's thread does
    del obj
    for _ in range(1000):            # the interpreter runs the pending call between bytecodes
        if ref() is None:
            break
    run_deferred_teardown()          # or the next synchronize does
    gc.collect()
    assert ref() is None and deferred_teardown_count() == 0


def test_the_probe_of_other_libraries_captures():
    capturing = [True]
    set_foreign_capture_probe(lambda: capturing[0])
    assert teardown_waits()
    ran = []
    defer_call(ran.append, 1)
    assert ran == [] and run_deferred_teardown() == 1   # PyTorch still captures on this thread
    capturing[0] = False
    assert run_deferred_teardown() == 0 and ran == [1]

    def broken():
        raise RuntimeError("no CUDA")
    set_foreign_capture_probe(broken)                   # a broken probe never blocks teardown
    assert not teardown_waits()
    with pytest.raises(TypeError, match="callable"):
        set_foreign_capture_probe(42)


def test_the_allocator_keeps_a_private_pool_while_teardown_must_wait():
    """A private pool no graph holds any more and whose last tensor dies on
    the driver's thread (a host function dropped it) keeps its segments
    until teardown may run: no cuMemFree from the driver's thread."""
    fb = FakeBackend()
    a = DeviceAllocator(0, fb)
    a.retain_pool(9)
    st = a.begin_capture(9, 21, S0)
    fb.set_capturing(S0, 21)
    m = a.allocate(4 * MiB, S0)
    fb.set_capturing(S0, 0)
    a.end_capture(st)
    a.release_pool(9)
    assert a.stats()["pool.9.segments"] == 1
    frees = fb.frees
    holder = [m]
    del m
    call_as_driver_thread(holder.clear)                 # the last tensor of the pool dies there
    assert fb.frees == frees and a.stats()["pool.9.segments"] == 1
    a.allocate(512, S0)                                 # the next allocation frees it, on this thread
    assert fb.frees == frees + 1 and "pool.9.segments" not in a.stats()
