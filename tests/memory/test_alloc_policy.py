# SPDX-License-Identifier: Apache-2.0
"""The caching allocator's block policy, driven by a fake backend (no GPU).

The allocator under test is the one the GPU uses (tensorplay._memory.allocator
DeviceAllocator); only its Backend differs: FakeBackend (tensorplay._memory.testing)
hands out address ranges and events that the test completes. Stream handles
are plain ints.
"""
import random

import pytest

from tensorplay._memory.pool import segment_bytes
from tensorplay._testing import DeviceAllocator, FakeBackend, make_sleepable, note_capture_use
from tensorplay.cuda import OutOfMemoryError, PoolAsleepError

KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30
S0, S1, S2 = 0x1000, 0x2000, 0x3000          # streams
CHILD, CHILD2 = 0x4000, 0x5000                # conditional bodies' streams


def make(capacity=80 * GiB):
    fb = FakeBackend(capacity)
    return DeviceAllocator(0, fb), fb


def reserved(a):
    return a.stats()["reserved_bytes.all.current"]


def segments(a, kind="all"):
    return a.stats()[f"segment.{kind}.current"]


class Capture:
    """A fake capture: the allocator's begin/end around the fake stream status."""

    def __init__(self, a, fb, pool, cid, stream=S0):
        self.a, self.fb, self.pool, self.cid, self.stream = a, fb, pool, cid, stream
        self.bodies = []

    def __enter__(self):
        self.a.retain_pool(self.pool)
        self.state = self.a.begin_capture(self.pool, self.cid, self.stream)
        self.fb.set_capturing(self.stream, self.cid)
        return self

    def body(self, stream, cid):
        self.a.begin_body(self.state, stream, cid)
        self.fb.set_capturing(stream, cid)
        self.bodies.append(stream)

    def end_body(self):
        self.fb.set_capturing(self.bodies.pop(), 0)
        self.a.end_body(self.state)

    def __exit__(self, *exc):
        for s in self.bodies:
            self.fb.set_capturing(s, 0)
        self.fb.set_capturing(self.stream, 0)
        self.kept = self.a.end_capture(self.state)
        return False

    def release(self):
        self.a.release_pool(self.pool)


# ---------------------------------------------------------------- sizes and segments

@pytest.mark.parametrize("size, segment", [
    (1, 2 * MiB), (512, 2 * MiB), (1 * MiB, 2 * MiB),             # small pool: 2 MiB segments
    (1 * MiB + 1, 20 * MiB), (9 * MiB, 20 * MiB),                 # 1-10 MiB: shared 20 MiB segments
    (10 * MiB, 10 * MiB), (13 * MiB, 14 * MiB), (64 * MiB, 64 * MiB),   # own segment, 2 MiB rounding
])
def test_segment_sizes_follow_pytorch(size, segment):
    assert segment_bytes(size) == segment
    a, fb = make()
    x = a.allocate(size, S0)
    assert reserved(a) == segment
    assert x.ptr in fb.segments
    kind = "small_pool" if size <= MiB else "large_pool"
    assert segments(a, kind) == 1
    a.check_invariants()


def test_requests_of_1_to_10_mib_share_20_mib_segments():
    a, _ = make()
    xs = [a.allocate(4 * MiB, S0) for _ in range(5)]
    assert segments(a) == 1 and reserved(a) == 20 * MiB
    xs.append(a.allocate(4 * MiB, S0))
    assert segments(a) == 2
    a.check_invariants()


def test_small_requests_share_2_mib_segments_at_512_byte_granularity():
    a, _ = make()
    xs = [a.allocate(1000, S0) for _ in range(2048)]       # 1024 B each after rounding
    assert segments(a) == 1
    assert len({x.ptr for x in xs}) == 2048
    assert a.stats()["allocated_bytes.all.current"] == 2048 * 1024
    a.check_invariants()


@pytest.mark.parametrize("size", [64 * KiB, 1 * MiB, 2 * MiB, 4 * MiB, 8 * MiB, 16 * MiB, 64 * MiB])
def test_an_eager_loop_reuses_one_block(size):
    """y = x * 2; del y, 200 times: reserved memory stays what the first step made."""
    a, fb = make()
    x = a.allocate(size, S0)
    y = a.allocate(size, S0)
    del y
    after_first = reserved(a)
    for _ in range(200):
        y = a.allocate(size, S0)
        del y
    assert reserved(a) == after_first
    assert fb.mallocs <= 2
    del x
    a.check_invariants()


def test_best_fit_picks_the_smallest_free_block_that_fits():
    a, _ = make()
    big = [a.allocate(s, S0) for s in (12 * MiB, 16 * MiB, 14 * MiB)]   # three own segments
    ptrs = [b.ptr for b in big]
    del big
    x = a.allocate(13 * MiB, S0)
    assert x.ptr == ptrs[2]                 # the 14 MiB block, not the 16 MiB one
    a.check_invariants()


def test_freed_neighbours_merge_and_a_whole_segment_is_released():
    a, fb = make()
    xs = [a.allocate(4 * MiB, S0) for _ in range(5)]
    for k in (1, 3, 0, 4, 2):               # free out of order: merges on both sides
        xs[k] = None
        a.check_invariants()
    assert a.stats()["inactive_split.all.current"] == 0
    a.empty_cache()
    assert reserved(a) == 0 and not fb.segments


def test_fragmentation_is_reported_as_inactive_split_blocks():
    a, _ = make()
    xs = [a.allocate(4 * MiB, S0) for _ in range(5)]
    xs[1] = xs[3] = None
    st = a.stats()
    assert st["inactive_split.large_pool.current"] == 2
    assert st["inactive_split_bytes.all.current"] == 8 * MiB
    a.empty_cache()                          # a split segment stays: it still holds live blocks
    assert reserved(a) == 20 * MiB


def test_blocks_are_reused_only_on_their_stream():
    a, _ = make()
    x = a.allocate(4 * MiB, S0)
    p = x.ptr
    del x
    y = a.allocate(4 * MiB, S1)
    assert y.ptr != p and segments(a) == 2
    z = a.allocate(4 * MiB, S0)
    assert z.ptr == p


# ---------------------------------------------------------------- record_stream

def test_a_record_stream_block_waits_for_the_other_streams_work():
    a, fb = make()
    x = a.allocate(4 * MiB, S0)
    p = x.ptr
    x.record_stream(S1)
    del x
    assert a.stats()["pending_events"] == 1
    y = a.allocate(4 * MiB, S0)
    assert y.ptr != p                        # S1 has not finished
    fb.complete(S1)
    del y
    z = a.allocate(4 * MiB, S0)              # the allocation processes the event
    assert a.stats()["pending_events"] == 0
    w = a.allocate(4 * MiB, S0)
    assert p in (z.ptr, w.ptr)
    a.check_invariants()


def test_a_neighbour_freed_while_the_event_is_recorded_does_not_absorb_the_block():
    """free_block records record_stream events through driver calls that
    release the GIL; another thread freeing the block's free neighbour then
    must not merge the block into it (it is held until its event completes)."""
    a, fb = make()
    x = a.allocate(4 * MiB, S0)              # x and y: neighbours in one 20 MiB segment
    y = a.allocate(4 * MiB, S0)
    px = x.ptr
    assert y.ptr == px + 4 * MiB
    x.record_stream(S1)
    keep = [y]
    del y
    fb.on_record = lambda: keep.clear()      # "another thread" frees y mid-record
    del x
    st = a.stats()
    assert not keep and st["pending_events"] == 1 and st["held_blocks"] == 1
    assert st["allocation.all.allocated"] - st["allocation.all.freed"] + st["held_blocks"] == \
        st["active.all.current"]
    a.check_invariants()
    z = a.allocate(8 * MiB, S0)               # y's block alone cannot hold 8 MiB at px
    assert z.ptr != px, "x's block was merged into its neighbour before its event completed"
    fb.complete(S1)
    del z
    a.empty_cache()
    assert reserved(a) == 0 and not fb.segments
    a.check_invariants()


def test_record_stream_on_its_own_stream_needs_no_event():
    a, fb = make()
    x = a.allocate(4 * MiB, S0)
    x.record_stream(S0)
    del x
    assert a.stats()["pending_events"] == 0 and fb.recorded_events() == 0


def test_empty_cache_waits_for_pending_events_and_releases_everything():
    a, fb = make()
    x = a.allocate(30 * MiB, S0)
    x.record_stream(S1)
    del x
    a.empty_cache()
    assert reserved(a) == 0 and not fb.segments and a.stats()["pending_events"] == 0


# ---------------------------------------------------------------- capture

def test_blocks_freed_in_a_capture_are_reused_within_it():
    """Four chained 4 MiB ops (x = x * a + 1): three live blocks at most, one segment."""
    a, fb = make()
    x0 = a.allocate(4 * MiB, S1)             # the input, eager (default pool)
    with Capture(a, fb, pool=7, cid=100) as cap:
        x = x0
        for _ in range(4):
            t = a.allocate(4 * MiB, S0)
            x_new = a.allocate(4 * MiB, S0)
            del t
            x = x_new
            del x_new
        assert x.pool_id == 7
    assert a.stats()["pool.7.segments"] == 1 and a.stats()["pool.7.reserved_bytes"] == 20 * MiB
    a.check_invariants()
    del x
    cap.release()


def test_a_shared_pool_reuses_what_earlier_captures_freed():
    def run(shared):
        a, fb = make()
        outs = []
        for k in range(4):
            with Capture(a, fb, pool=5 if shared else 10 + k, cid=200 + k):
                tmp = a.allocate(8 * MiB, S0)
                outs.append(a.allocate(1000, S0))
                del tmp
        return reserved(a)
    assert run(shared=True) == 20 * MiB + 2 * MiB
    assert run(shared=False) == 4 * (20 * MiB + 2 * MiB)


def test_a_block_used_on_another_stream_in_a_capture_waits_for_capture_end():
    a, fb = make()
    with Capture(a, fb, pool=3, cid=300, stream=S0) as cap:
        b = a.allocate(4 * MiB, S0)
        p = b.ptr
        note_capture_use(b)                  # the current stream (0) is not S0: a cross-stream use
        del b
        c = a.allocate(4 * MiB, S0)
        assert c.ptr != p
    with Capture(a, fb, pool=3, cid=302, stream=S0) as cap2:   # after the capture: reusable
        d = a.allocate(4 * MiB, S0)
        e = a.allocate(4 * MiB, S0)
        assert p in (d.ptr, e.ptr)
    a.check_invariants()
    del c, d, e
    cap.release()
    cap2.release()
    assert reserved(a) == 0


def test_a_block_used_on_its_own_stream_returns_at_once():
    a, fb = make()
    with Capture(a, fb, pool=3, cid=301, stream=0):      # current stream 0 captures
        b = a.allocate(4 * MiB, 0)
        p = b.ptr
        note_capture_use(b)
        del b
        c = a.allocate(4 * MiB, 0)
        assert c.ptr == p


def test_a_capture_keeps_only_storages_from_outside_its_pool():
    a, fb = make()
    outside = a.allocate(4 * MiB, S1)
    other_pool = None
    with Capture(a, fb, pool=9, cid=401):
        other_pool = a.allocate(MiB, S0)
    with Capture(a, fb, pool=8, cid=400, stream=0) as cap:
        inside = a.allocate(4 * MiB, 0)
        for t in (outside, inside, other_pool):
            note_capture_use(t)
    assert set(map(id, cap.kept.values())) == {id(outside), id(other_pool)}
    del inside


def test_a_block_from_before_a_body_freed_inside_it_waits_for_the_body():
    a, fb = make()
    with Capture(a, fb, pool=4, cid=500) as cap:
        h = a.allocate(4 * MiB, S0)          # before the WHILE body
        p = h.ptr
        cap.body(CHILD, 501)
        h = a.allocate(4 * MiB, CHILD)       # h = h + 1 inside the body frees the outer h
        inner = a.allocate(4 * MiB, CHILD)
        assert inner.ptr != p                # the body runs again and reads the outer h
        tmp = a.allocate(4 * MiB, CHILD)
        tp_ = tmp.ptr
        del tmp
        again = a.allocate(4 * MiB, CHILD)   # allocated and freed inside: reused inside
        assert again.ptr == tp_
        cap.end_body()
        after = a.allocate(4 * MiB, S0)      # after the body: the outer h is free again
        assert after.ptr == p
    a.check_invariants()


def test_body_allocations_are_keyed_by_the_root_stream():
    a, fb = make()
    with Capture(a, fb, pool=4, cid=510) as cap:
        x = a.allocate(4 * MiB, S0)
        p = x.ptr
        del x
        cap.body(CHILD, 511)
        y = a.allocate(4 * MiB, CHILD)        # the body's work is ordered after the root's
        assert y.ptr == p and y.stream == S0
        cap.end_body()


def test_nested_bodies_defer_to_the_outermost_body_opened_after_the_allocation():
    a, fb = make()
    with Capture(a, fb, pool=4, cid=520) as cap:
        cap.body(CHILD, 521)
        outer = a.allocate(4 * MiB, CHILD)   # allocated in the outer body
        p = outer.ptr
        cap.body(CHILD2, 522)
        del outer                             # freed in the inner body
        x = a.allocate(4 * MiB, CHILD2)
        assert x.ptr != p
        cap.end_body()
        y = a.allocate(4 * MiB, CHILD)        # back in the outer body: reusable
        assert y.ptr == p
        cap.end_body()
    a.check_invariants()


def test_an_aborted_capture_with_open_bodies_returns_every_block():
    a, fb = make()
    with Capture(a, fb, pool=6, cid=530) as cap:
        h = a.allocate(4 * MiB, S0)
        cap.body(CHILD, 531)
        del h
    assert a.stats()["pool.6.live_blocks"] == 0
    a.check_invariants()
    cap.release()
    assert "pool.6.segments" not in a.stats()      # released at once


def test_two_captures_into_one_pool_are_refused():
    a, fb = make()
    with Capture(a, fb, pool=11, cid=600):
        with pytest.raises(RuntimeError, match="already being captured"):
            a.begin_capture(11, 601, S1, False)
        with Capture(a, fb, pool=12, cid=602, stream=S1):    # another pool is fine
            pass


def test_no_event_is_queried_or_recorded_during_a_capture():
    """Port of PyTorch's test_graph_record_stream, with the fake counting calls."""
    a, fb = make()
    problem = a.allocate(4 * MiB, 0)
    problem.record_stream(S0)
    del problem                              # an event on S0 is pending
    assert a.stats()["pending_events"] == 1
    with Capture(a, fb, pool=13, cid=700, stream=S1):
        b = a.allocate(4 * MiB, S1)          # must not query the pending event
        b.record_stream(S2)
        del b                                # must not record an event now
        a.allocate(4 * MiB, S1)
        assert fb.calls_during_capture == 0
    assert fb.calls_during_capture == 0
    assert fb.recorded_events() == 2         # both recorded once the capture ended
    fb.complete_all()
    c = a.allocate(4 * MiB, 0)               # processes the events
    assert a.stats()["pending_events"] == 0
    del c
    a.check_invariants()


# ---------------------------------------------------------------- releasing memory

def test_an_unused_private_pool_gives_its_segments_back_at_once():
    a, fb = make()
    with Capture(a, fb, pool=20, cid=800) as cap:
        y = a.allocate(4 * MiB, S0)
    cap.release()
    assert a.stats()["pool.20.segments"] == 1        # y is alive: memory stays
    del y
    assert "pool.20.segments" not in a.stats() and not fb.segments


def test_a_pool_freed_during_another_capture_is_released_after_it():
    a, fb = make()
    with Capture(a, fb, pool=21, cid=810) as cap:
        y = a.allocate(4 * MiB, S0)
    cap.release()
    with Capture(a, fb, pool=22, cid=811, stream=S1) as cap2:
        del y                                 # cuMemFree now would end the capture
        assert a.stats()["pool.21.segments"] == 1
        assert fb.calls_during_capture == 0
    assert "pool.21.segments" not in a.stats()
    cap2.release()
    assert reserved(a) == 0


def test_capture_and_reset_cycles_do_not_grow_reserved_memory():
    a, fb = make()
    x = a.allocate(MiB, S1)
    levels = []
    for k in range(100):
        with Capture(a, fb, pool=1000 + k, cid=900 + k) as cap:
            tmp = a.allocate(4 * MiB, S0)
            y = a.allocate(512, S0)
            del tmp
        cap.release()
        del y
        levels.append(reserved(a))
    assert levels[-1] == levels[0] == 2 * MiB       # x's small segment only
    assert a.stats()["num_pools"] == 1 and x.pool_id == 0


def test_oom_releases_the_cache_and_retries():
    a, fb = make(capacity=1 * GiB)
    cached = [a.allocate(200 * MiB, S0) for _ in range(4)]
    del cached                                       # 800 MiB cached, 224 MiB free
    x = a.allocate(600 * MiB, S1)                    # another stream: nothing reusable
    assert a.stats()["num_alloc_retries"] == 1
    assert reserved(a) == 600 * MiB
    a.check_invariants()
    del x


def test_oom_inside_a_capture_raises_without_releasing_the_cache():
    a, fb = make(capacity=1 * GiB)
    cached = a.allocate(800 * MiB, S1)
    del cached
    with Capture(a, fb, pool=30, cid=1000) as cap:
        with pytest.raises(OutOfMemoryError, match="inside a CUDA graph capture"):
            a.allocate(600 * MiB, S0)
        assert fb.calls_during_capture == 0
    assert a.stats()["num_ooms"] == 1
    cap.release()
    a.check_invariants()
    y = a.allocate(600 * MiB, S0)                    # outside: released and retried
    del y


def test_stats_use_pytorch_names():
    a, _ = make()
    xs = [a.allocate(100, S0), a.allocate(5 * MiB, S0)]
    st = a.stats()
    for name in ("allocated_bytes", "reserved_bytes", "active_bytes", "requested_bytes", "allocation",
                 "segment", "active"):
        for pool in ("all", "small_pool", "large_pool"):
            for field in ("current", "peak", "allocated", "freed"):
                assert f"{name}.{pool}.{field}" in st
    assert st["allocation.all.current"] == 2
    assert st["requested_bytes.all.current"] == 5 * MiB + 100
    assert st["allocated_bytes.small_pool.current"] == 512
    del xs
    st = a.stats()
    assert st["allocation.all.freed"] == 2 and st["allocated_bytes.all.peak"] == 512 + 5 * MiB
    a.reset_peak_stats()
    assert a.stats()["allocated_bytes.all.peak"] == 0
    snap = a.snapshot()
    assert [s["segment_type"] for s in snap] in (["small", "large"], ["large", "small"])
    assert all(b["state"] == "free" for s in snap for b in s["blocks"])


# ---------------------------------------------------------------- long random workloads

@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_workloads_keep_the_invariants(seed):
    """Allocations and frees of 512 B to 64 MiB on three streams, record_stream,
    events completing at random, captures with nested bodies (one pool of
    sleepable, address-reserved segments that sleeps and wakes at random),
    empty_cache and memory pressure. After every step: live blocks never overlap, and no block
    is handed out while a stream that used it may still run; every 50 steps the
    block structures are checked whole."""
    rng = random.Random(seed)
    a, fb = make(capacity=1 * GiB)          # small enough for OOM retries and failures
    streams = [S0, S1, S2]
    live = {}                       # id -> (allocation, lo, hi)
    waiting = []                    # (lo, hi, stream, completions of that stream when freed)
    completions = {s: 0 for s in streams}
    capture = None
    next_cid = [5000]
    sleepy = (1 << 40) + 100 + seed
    make_sleepable(sleepy)

    def asleep():
        return a.stats().get(f"pool.{sleepy}.asleep", 0) == 1

    def size():
        return int(2 ** rng.uniform(9, 26))

    def check_new(t):
        lo, hi = t.ptr, t.ptr + t.size
        for _, (_, l2, h2) in live.items():
            assert hi <= l2 or h2 <= lo, "two live allocations overlap"
        for (l2, h2, s, done) in waiting:
            if completions[s] == done:      # that stream has not completed since the free
                assert hi <= l2 or h2 <= lo, "a block was reused before its record_stream work ended"

    for step in range(3000):
        r = rng.random()
        stream = rng.choice(streams) if capture is None else capture.stream
        if capture is not None and capture.bodies and rng.random() < 0.5:
            stream = capture.bodies[-1]
        if r < 0.45:
            retries = a.stats()["num_alloc_retries"]
            try:
                t = a.allocate(size(), stream)
            except OutOfMemoryError:      # memory pressure: the cache was released first
                continue
            finally:
                if a.stats()["num_alloc_retries"] != retries:
                    for s in streams:     # releasing the cache waited for every pending event
                        completions[s] += 1
            check_new(t)
            live[id(t)] = (t, t.ptr, t.ptr + t.size)
        elif r < 0.85 and live:
            key = rng.choice(list(live))
            t, lo, hi = live.pop(key)
            if rng.random() < 0.3:
                other = rng.choice(streams)
                t.record_stream(other)
                if other != t.stream:
                    waiting.append((lo, hi, other, completions[other]))
            del t
        elif r < 0.9:
            s = rng.choice(streams)
            fb.complete(s)
            completions[s] += 1
        elif r < 0.95:
            if capture is None:
                next_cid[0] += 1
                pool = rng.choice([1, 2, 3, sleepy])
                if pool == sleepy and asleep():
                    with pytest.raises(PoolAsleepError):
                        a.begin_capture(pool, next_cid[0], rng.choice(streams))
                    continue
                capture = Capture(a, fb, pool=pool, cid=next_cid[0],
                                  stream=rng.choice(streams)).__enter__()
            elif len(capture.bodies) < 2 and rng.random() < 0.5:
                next_cid[0] += 1
                capture.body([CHILD, CHILD2][len(capture.bodies)], next_cid[0])
            elif capture.bodies:
                capture.end_body()
            else:
                capture.__exit__(None, None, None)
                capture.release()
                capture = None
        elif capture is None and r < 0.975:
            a.empty_cache()
            for s in streams:       # empty_cache waits for every pending event
                fb.complete(s)
                completions[s] += 1
        elif capture is None:
            if asleep():
                try:
                    a.wake_pool(sleepy)
                except OutOfMemoryError:      # the others took the memory meanwhile
                    pass
            elif a.get_pool(sleepy, False) is not None:
                a.sleep_pool(sleepy)
                for s in streams:   # sleep synchronizes the device
                    completions[s] += 1
        if step % 50 == 0:
            a.check_invariants()
        assert fb.used == reserved(a)
        if capture is not None:
            assert fb.calls_during_capture == 0
    if capture is not None:
        capture.__exit__(None, None, None)
        capture.release()
    live.clear()
    t = None
    a.check_invariants()
    fb.complete_all()
    a.empty_cache()
    assert reserved(a) == 0 and not fb.segments
    assert a.stats()["allocated_bytes.all.current"] == 0
    assert a.stats()["num_pools"] == 1


def test_the_summary_reports_counters_pools_and_fragmentation():
    from tensorplay._memory.summary import format_summary
    a, fb = make()
    xs = [a.allocate(4 * MiB, S0) for _ in range(5)]
    with Capture(a, fb, pool=40, cid=1100) as cap:
        y = a.allocate(MiB, S0)
    xs[2] = None
    text = format_summary(a.stats(), a.snapshot())
    assert "GPU reserved memory" in text and "22.00 MiB" in text
    assert "from large pool" in text and "from small pool" in text
    assert "Non-releasable memory (split free)" in text and "4.00 MiB" in text
    assert "default pool: 1 segments, 20.00 MiB reserved, 16.00 MiB allocated" in text
    assert "graph pool 40 (1 graphs): 1 segments, 2.00 MiB reserved, 1.00 MiB allocated" in text
    del y
    cap.release()
