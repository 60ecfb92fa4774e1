# SPDX-License-Identifier: Apache-2.0
"""Sleepable pools (sleep/wake of a pool's memory, addresses kept), driven by
a fake backend (no GPU): what the allocator does with its segments, counters
and captures. The GPU behaviour is tests/memory/test_sleep.py's."""
import pytest

from tensorplay._testing import DeviceAllocator, FakeBackend, make_sleepable
from tensorplay.cuda import OutOfMemoryError, PoolAsleepError

MiB = 1 << 20
GiB = 1 << 30
S0, CHILD = 0x1000, 0x4000
# pool ids far from graph_pool_handle()'s, so a GPU run in the same process never shares them
SLEEPY, SLEEPY2, PLAIN = (1 << 40) + 1, (1 << 40) + 2, (1 << 40) + 3
make_sleepable(SLEEPY)
make_sleepable(SLEEPY2)


def make(capacity=80 * GiB):
    fb = FakeBackend(capacity)
    return DeviceAllocator(0, fb), fb


def reserved(a):
    return a.stats()["reserved_bytes.all.current"]


def capture_into(a, fb, pool, cid, sizes, keep=True):
    """A fake capture into ``pool`` allocating ``sizes``; returns the
    allocations still alive (all when ``keep``, none otherwise)."""
    a.retain_pool(pool)
    st = a.begin_capture(pool, cid, S0)
    fb.set_capturing(S0, cid)
    out = [a.allocate(n, S0) for n in sizes]
    fb.set_capturing(S0, 0)
    if not keep:
        out = []
    a.end_capture(st)
    return out


def test_sleep_gives_every_segment_back_and_wake_maps_the_same_addresses():
    a, fb = make()
    live = capture_into(a, fb, SLEEPY, 11, [4 * MiB, 100, 64 * MiB])
    before = sorted(s["address"] for s in a.snapshot())
    pool_bytes = reserved(a)
    assert fb.used == pool_bytes == 2 * MiB + 20 * MiB + 64 * MiB
    assert a.sleep_pool(SLEEPY) == pool_bytes
    assert fb.used == 0 and reserved(a) == 0
    assert not any(fb.mapped(addr) for addr in before)
    assert a.stats()[f"pool.{SLEEPY}.asleep"] == 1
    a.check_invariants()
    assert a.wake_pool(SLEEPY) == pool_bytes
    assert fb.used == reserved(a) == pool_bytes
    assert sorted(s["address"] for s in a.snapshot()) == before       # graphs over them stay valid
    assert all(fb.mapped(addr) for addr in before)
    assert live[2].ptr in before
    a.check_invariants()


def test_sleeping_twice_or_waking_an_awake_pool_does_nothing():
    a, fb = make()
    capture_into(a, fb, SLEEPY, 12, [4 * MiB], keep=False)
    n = a.sleep_pool(SLEEPY)
    assert n == 20 * MiB
    assert a.sleep_pool(SLEEPY) == 0
    assert a.wake_pool(SLEEPY) == n
    assert a.wake_pool(SLEEPY) == 0
    assert fb.used == reserved(a) == n


def test_a_pool_without_sleepable_segments_refuses_to_sleep():
    a, fb = make()
    capture_into(a, fb, PLAIN, 13, [4 * MiB])
    with pytest.raises(ValueError, match="cannot sleep.*sleepable"):
        a.sleep_pool(PLAIN)
    assert fb.used == reserved(a) == 20 * MiB
    assert not fb.regions                  # plain pools take cuMemAlloc segments


def test_sleep_during_any_capture_is_refused_and_changes_nothing():
    a, fb = make()
    capture_into(a, fb, SLEEPY, 14, [4 * MiB])
    a.retain_pool(PLAIN)
    st = a.begin_capture(PLAIN, 15, S0)
    try:
        with pytest.raises(RuntimeError, match="capture is under way"):
            a.sleep_pool(SLEEPY)
    finally:
        a.end_capture(st)
    assert fb.used == reserved(a) == 20 * MiB
    assert a.sleep_pool(SLEEPY) == 20 * MiB         # fine once the capture ended


def test_a_capture_into_a_sleeping_pool_is_refused_before_it_opens():
    a, fb = make()
    capture_into(a, fb, SLEEPY, 16, [4 * MiB])
    a.sleep_pool(SLEEPY)
    with pytest.raises(PoolAsleepError, match="asleep.*wake"):
        a.begin_capture(SLEEPY, 17, S0)
    assert a.open_captures == 0
    a.wake_pool(SLEEPY)
    capture_into(a, fb, SLEEPY, 18, [4 * MiB])
    assert reserved(a) == fb.used


def test_wake_out_of_memory_raises_and_leaves_the_pool_asleep():
    a, fb = make(capacity=1 * GiB)
    capture_into(a, fb, SLEEPY, 19, [512 * MiB])
    a.sleep_pool(SLEEPY)
    hog = a.allocate(600 * MiB)                       # the device filled up while the pool slept
    with pytest.raises(OutOfMemoryError, match="wake.*stays asleep"):
        a.wake_pool(SLEEPY)
    assert a.stats()[f"pool.{SLEEPY}.asleep"] == 1
    assert fb.used == reserved(a)
    del hog
    a.empty_cache()
    assert a.wake_pool(SLEEPY) == 512 * MiB
    assert fb.used == reserved(a) == 512 * MiB
    a.check_invariants()


def test_a_sleeping_pool_released_by_its_graphs_frees_its_addresses_once():
    a, fb = make()
    capture_into(a, fb, SLEEPY, 20, [4 * MiB, 64 * MiB], keep=False)
    a.sleep_pool(SLEEPY)
    assert len(fb.regions) == 2
    a.release_pool(SLEEPY)                            # the graph is reset while its pool sleeps
    assert not fb.regions and not fb.segments
    assert reserved(a) == 0 == fb.used
    assert a.stats()["num_pools"] == 1
    a.check_invariants()


def test_live_blocks_of_a_sleeping_pool_can_be_freed():
    a, fb = make()
    live = capture_into(a, fb, SLEEPY, 21, [4 * MiB, 8 * MiB])
    a.sleep_pool(SLEEPY)
    live.clear()                                       # outputs dropped while asleep
    a.check_invariants()
    a.release_pool(SLEEPY)
    assert not fb.regions and reserved(a) == 0 == fb.used


def test_captures_into_a_sleepable_pool_name_it_to_the_backend_while_they_run():
    a, fb = make()
    a.retain_pool(SLEEPY)
    st = a.begin_capture(SLEEPY, 22, S0)
    assert fb.routes == {22: SLEEPY}                  # other libraries' segments join this pool
    a.begin_body(st, CHILD, 23)
    assert fb.routes == {22: SLEEPY, 23: SLEEPY}
    a.end_body(st)
    assert fb.routes == {22: SLEEPY}
    a.end_capture(st)
    assert fb.routes == {}
    a.retain_pool(PLAIN)
    st = a.begin_capture(PLAIN, 24, S0)
    assert fb.routes == {}
    a.end_capture(st)


def test_two_sleepable_pools_sleep_apart():
    a, fb = make()
    capture_into(a, fb, SLEEPY, 25, [4 * MiB])
    capture_into(a, fb, SLEEPY2, 26, [64 * MiB])
    assert a.sleep_pool(SLEEPY2) == 64 * MiB
    assert fb.used == reserved(a) == 20 * MiB
    assert a.sleep_pool(SLEEPY) == 20 * MiB
    assert a.wake_pool(SLEEPY2) == 64 * MiB
    assert fb.used == reserved(a) == 64 * MiB


def test_a_device_without_virtual_memory_management_refuses_sleepable_pools():
    fb = FakeBackend(80 * GiB, vmm=False)
    a = DeviceAllocator(0, fb)
    with pytest.raises(RuntimeError, match="virtual memory management"):
        a.begin_capture(SLEEPY, 27, S0)
    assert a.open_captures == 0


def test_sleep_and_wake_cycles_keep_the_counters_exact():
    a, fb = make()
    capture_into(a, fb, SLEEPY, 28, [4 * MiB, 300, 100 * MiB])
    n = reserved(a)
    for _ in range(100):
        assert a.sleep_pool(SLEEPY) == n and fb.used == 0 == reserved(a)
        assert a.wake_pool(SLEEPY) == n and fb.used == n == reserved(a)
    a.check_invariants()
    assert a.stats()["reserved_bytes.all.peak"] == n
