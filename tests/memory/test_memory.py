# SPDX-License-Identifier: Apache-2.0
"""The caching allocator at realistic sizes (1-64 MiB and more): PyTorch's block
policy, graph pools (private, shared, conditional bodies), record_stream during
capture, OOM retry, threads, and capture/reset cycles.

Bounds are absolute and derived from the work, at MiB granularity, with the
policy of PyTorch's allocator: sizes round to 512 B; requests <= 1 MiB come
from 2 MiB "small" segments; requests of 1-10 MiB from 20 MiB segments shared
by several such requests; requests >= 10 MiB get their own segment rounded up
to 2 MiB; freed blocks merge with free neighbours and are reused (best fit,
same stream). Reserved growth is measured from a baseline taken after
``empty_cache()``, with every tensor the test needs outside the measured work
allocated before it.
"""

import gc
import threading
import time
import traceback

import numpy as np
import pytest

import tensorplay as tp
from tensorplay._memory.pool import segment_bytes
from tensorplay.cuda import CUDAGraph
from helpers import hold, spin, warm

pytestmark = pytest.mark.cuda
MiB = 1 << 20
GiB = 1 << 30
SMALL_SLACK = 2 * MiB       # one small (2 MiB) segment, e.g. for a reduction's scratch


# ---------------------------------------------------------------- helpers

def _settle():
    """Collect garbage, wait for the device, release the cache; return reserved bytes."""
    gc.collect()
    tp.cuda.synchronize()
    tp.cuda.empty_cache()
    return tp.cuda.memory_reserved()




def _step(box):
    """One chained op ``x = x * 1.0001 + 1`` on ``box[0]``: the product is a
    temporary freed at once, and replacing ``box[0]`` frees the old value (when
    nothing else holds it). Peak: old value, product, new value."""
    box[0] = box[0] * 1.0001 + 1.0


def _chain(x, k):
    box = [x]
    for _ in range(k):
        _step(box)
    return box[0]


def _chain_ref(a, k):
    """NumPy float32 reference of ``_chain``."""
    r = a.astype(np.float32)
    for _ in range(k):
        r = r * np.float32(1.0001) + np.float32(1.0)
    return r


# ---------------------------------------------------------------- eager policy

@pytest.mark.parametrize("mib", [1, 4, 8, 16, 64])
def test_eager_loop_reserves_nothing_after_the_first_iteration(mib):
    n = mib * MiB // 4
    x = tp.ones(n, dtype=tp.float32, device="cuda")
    warm(lambda: x * 2.0)
    base = _settle()
    y = x * 2.0
    del y
    first = tp.cuda.memory_reserved()
    # the first y needs at most one segment of its size class (x's own segment
    # may already have room: 1 MiB x's 2 MiB small segment, 4/8 MiB x's 20 MiB one)
    assert first - base <= segment_bytes(mib * MiB)
    for _ in range(199):
        y = x * 2.0
        del y
    # every later y reuses the block the previous one freed (same size, same stream)
    assert tp.cuda.memory_reserved() == first


def test_mid_size_requests_share_one_20_mib_segment():
    # A fresh stream: blocks are reused per stream, so nothing cached by earlier
    # work (on the legacy stream) can serve these requests.
    s = tp.cuda.Stream()
    _settle()
    st0 = tp.cuda.memory_stats()
    with tp.cuda.stream(s):
        xs = [tp.empty(MiB, dtype=tp.float32, device="cuda") for _ in range(5)]   # 4 MiB each
    st1 = tp.cuda.memory_stats()
    # 5 x 4 MiB = 20 MiB: exactly one 20 MiB segment, split five ways
    assert st1["segment.large_pool.current"] - st0["segment.large_pool.current"] == 1
    assert st1["segment.all.current"] - st0["segment.all.current"] == 1
    assert st1["reserved_bytes.all.current"] - st0["reserved_bytes.all.current"] == 20 * MiB
    ptrs = sorted(x._storage.ptr for x in xs)
    assert ptrs[-1] - ptrs[0] == 16 * MiB           # the five tile one 20 MiB range
    with tp.cuda.stream(s):
        xs.append(tp.empty(MiB, dtype=tp.float32, device="cuda"))   # the sixth needs a second one
    st2 = tp.cuda.memory_stats()
    assert st2["segment.large_pool.current"] - st0["segment.large_pool.current"] == 2
    assert st2["reserved_bytes.all.current"] - st0["reserved_bytes.all.current"] == 40 * MiB
    del xs
    gc.collect()
    st3 = tp.cuda.memory_stats()
    assert st3["segment.large_pool.current"] == st2["segment.large_pool.current"]   # cached
    tp.cuda.synchronize()
    tp.cuda.empty_cache()
    st4 = tp.cuda.memory_stats()
    assert st4["segment.large_pool.current"] == st0["segment.large_pool.current"]
    assert st4["reserved_bytes.all.current"] == st0["reserved_bytes.all.current"]


# ---------------------------------------------------------------- one graph

@pytest.mark.parametrize("mib,bound", [
    # 4 MiB: at most 3 blocks live at once (old x, product, new x), 12 MiB, all in
    # one 20 MiB segment, reused by every later step; + up to 2 small segments.
    (4, 20 * MiB + 2 * SMALL_SLACK),
    # 16 MiB: each block its own 16 MiB segment; 3 live at once -> 3 segments,
    # reused by every later step; + one small segment.
    (16, 3 * 16 * MiB + SMALL_SLACK),
], ids=["4MiB", "16MiB"])
def test_sixteen_chained_ops_in_one_graph_reserve_three_blocks(mib, bound, rng):
    n = mib * MiB // 4
    x0 = tp.zeros(n, dtype=tp.float32, device="cuda")     # the static input, before the baseline
    warm(lambda: _chain(x0, 1))
    base = _settle()
    g = CUDAGraph()
    with tp.cuda.graph(g):
        y = _chain(x0, 16)
    grown = tp.cuda.memory_reserved() - base
    assert grown <= bound, f"16 chained {mib} MiB ops reserved {grown / MiB:.1f} MiB"
    assert y._storage.pool_id == g.pool_id
    for _ in range(3):
        a = rng.uniform(0, 1, n).astype(np.float32)
        x0.copy_(a)
        g.replay()
        np.testing.assert_allclose(y.numpy(), _chain_ref(a, 16), rtol=1e-5, atol=1e-6)
    del y
    g.reset()


# ---------------------------------------------------------------- pools across graphs

@pytest.mark.parametrize("mib", [4, 16])
@pytest.mark.parametrize("n_graphs", [2, 4])
def test_graph_chains_in_a_shared_pool_reserve_less(n_graphs, mib, rng):
    n = mib * MiB // 4
    x0 = tp.zeros(n, dtype=tp.float32, device="cuda")
    warm(lambda: _chain(x0, 1))

    def capture(pool):
        """n_graphs graphs of 4 chained ops; graph k+1 reads graph k's output.
        Only the box holds the running output, so graph k's output dies during
        graph k+1's capture (in a shared pool its block is free for later
        graphs: they replay after graph k+1 has read it)."""
        graphs = []
        box = [x0]
        for _ in range(n_graphs):
            g = CUDAGraph()
            with tp.cuda.graph(g, pool=pool):
                for _ in range(4):
                    _step(box)
            graphs.append(g)
        return graphs, box[0]

    def check(graphs, out):
        for _ in range(2):
            a = rng.uniform(0, 1, n).astype(np.float32)
            x0.copy_(a)
            for g in graphs:                 # in capture order
                g.replay()
            np.testing.assert_allclose(out.numpy(), _chain_ref(a, 4 * n_graphs), rtol=1e-5, atol=1e-6)

    base = _settle()
    graphs, out = capture(tp.cuda.graph_pool_handle())
    shared = tp.cuda.memory_reserved() - base
    assert len({g.pool_id for g in graphs}) == 1
    check(graphs, out)
    for g in graphs:
        g.reset()
    del graphs, out

    base = _settle()
    graphs, out = capture(None)
    separate = tp.cuda.memory_reserved() - base
    assert len({g.pool_id for g in graphs}) == n_graphs
    check(graphs, out)
    for g in graphs:
        g.reset()
    del graphs, out

    assert shared < separate, (shared, separate)
    if mib == 4:
        # at most 3 live 4 MiB blocks at any time in the shared pool: one 20 MiB segment
        assert shared <= 20 * MiB + SMALL_SLACK, shared / MiB
    else:
        # at most 3 live 16 MiB blocks at any time: three 16 MiB segments
        assert shared <= 3 * 16 * MiB + SMALL_SLACK, shared / MiB


def test_eager_allocations_never_alias_a_graphs_pool():
    n = MiB // 4                                        # 1 MiB tensors
    x = tp.full((n,), 2.0, device="cuda")
    warm(lambda: (x * 3.0 + 1.0) * 0.5 - 1.0)
    g = CUDAGraph()
    with tp.cuda.graph(g):
        a = x * 3.0
        b = a + 1.0
        kept = b * 0.5                                   # the output kept alive
        c = kept - 1.0
    assert kept._storage.pool_id == g.pool_id
    freed_ptrs = {t._storage.ptr for t in (a, b, c)}
    del a, b, c                                           # their blocks are free in the graph's pool
    gc.collect()
    fillers = [tp.full((n,), -1.0, device="cuda") for _ in range(64)]
    assert all(f._storage.pool_id == 0 for f in fillers)
    assert not any(f._storage.pool_id == g.pool_id for f in fillers)
    assert not freed_ptrs & {f._storage.ptr for f in fillers}
    for v in (2.0, 5.0, -3.0):
        x.fill_(v)
        g.replay()
        np.testing.assert_array_equal(kept.numpy(), np.full(n, (v * 3 + 1) * 0.5, np.float32))
    for f in fillers:
        assert (f.numpy() == -1.0).all()
    del kept, fillers
    g.reset()


@pytest.mark.parametrize("keep_h", [True, False])
def test_shared_pool_chain_replays_in_order_with_fresh_inputs(keep_h, rng):
    n = MiB                                              # 4 MiB tensors
    x = tp.zeros(n, dtype=tp.float32, device="cuda")

    def f1(x):
        return (x * 2.0 + 1.0) * 0.5                     # a temporary, freed inside

    def f2(h):
        return h * h - 1.0

    warm(lambda: f2(f1(x)))
    pool = tp.cuda.graph_pool_handle()
    g1, g2 = CUDAGraph(), CUDAGraph()
    with tp.cuda.graph(g1, pool=pool):
        h = f1(x)
    with tp.cuda.graph(g2, pool=g1):                     # the same pool, given as the graph
        y = f2(h)
    assert g1.pool_id == g2.pool_id == pool
    fillers = []
    if not keep_h:
        # h lives in the pool and g2 (same pool) does not hold it: its block is
        # free in the pool; eager allocations must not take it.
        del h
        gc.collect()
        fillers = [tp.full((n,), -1.0, device="cuda") for _ in range(8)]
    for _ in range(4):
        a = rng.uniform(-2, 2, n).astype(np.float32)
        x.copy_(a)
        g1.replay()
        g2.replay()
        hr = (a * np.float32(2) + np.float32(1)) * np.float32(0.5)
        np.testing.assert_allclose(y.numpy(), hr * hr - np.float32(1), rtol=1e-5, atol=1e-6)
    for f in fillers:
        assert (f.numpy() == -1.0).all()


# ---------------------------------------------------------------- conditional bodies

@pytest.mark.parametrize("n", [1024, MiB], ids=["4KiB", "4MiB"])
def test_while_body_does_not_reuse_a_tensor_allocated_before_it(n, rng):
    x = tp.zeros(n, dtype=tp.float32, device="cuda")
    acc = tp.zeros(n, dtype=tp.float32, device="cuda")
    c = tp.zeros(1, dtype=tp.int32, device="cuda")
    limit = tp.full((1,), 3, dtype=tp.int32, device="cuda")
    pred = tp.zeros(1, dtype=tp.bool, device="cuda")

    def step_once():
        h = x * 1.0
        acc.add_((h + 1.0) * 2.0)
        c.add_(1)
        tp.lt(c, limit, out=pred)
        c.zero_()
        acc.zero_()
    warm(step_once)
    g = CUDAGraph()
    with tp.cuda.graph(g):
        acc.zero_()
        c.zero_()
        h = x * 1.0                    # allocated in the pool before the body opens
        outer_ptr = h._storage.ptr
        tp.lt(c, limit, out=pred)
        g.begin_capture_to_while_node(pred)
        h = h + 1.0                    # reads the outer h, whose last reference dies here
        t = h * 2.0                    # allocated after that free: must not take the outer h's block
        t_ptr = t._storage.ptr
        acc.add_(t)
        del t
        c.add_(1)
        tp.lt(c, limit, out=pred)
        g.end_capture_to_conditional_node()
        del h
    # Had t taken the outer h's block, the second iteration's h + 1 would read t.
    assert t_ptr != outer_ptr
    for k in (0, 1, 3, 7):
        a = rng.uniform(-1, 1, n).astype(np.float32)
        x.copy_(a)
        limit.fill_(k)
        g.replay()
        # The body is captured once: every iteration runs the same kernels on
        # the same addresses, so each reads the outer h (never written in the
        # body), computes h0 + 1 into the inner h, and adds 2 * (h0 + 1).
        # The eager equivalent re-reads the original h each iteration.
        h0 = a * np.float32(1.0)
        ref = np.zeros(n, np.float32)
        for _ in range(k):
            ref = ref + (h0 + np.float32(1.0)) * np.float32(2.0)
        assert c.item() == k
        np.testing.assert_allclose(acc.numpy(), ref, rtol=1e-5, atol=1e-6)
    g.reset()


# ---------------------------------------------------------------- record_stream and capture

def test_record_stream_during_capture_queries_no_event_and_defers_reuse():
    """PyTorch's test_graph_record_stream, with addresses checked."""
    n = MiB                                              # 4 MiB tensors
    s0, s2 = tp.cuda.Stream(), tp.cuda.Stream()
    a = tp.zeros(n, dtype=tp.float32, device="cuda")
    warm(lambda: a.clone().fill_(1.0))
    spin(s0, 1000)
    tp.cuda.synchronize()
    tp.cuda.empty_cache()

    potential_problem = tp.zeros(n, dtype=tp.float32, device="cuda")
    p_ptr = potential_problem._storage.ptr
    tp.cuda.synchronize()
    with tp.cuda.stream(s0):
        potential_problem.record_stream(s0)
        release = hold(s0)                               # busy through the capture below, until released
        potential_problem.fill_(1.0)
    del potential_problem          # its block waits for an event on s0 that stays pending

    g = CUDAGraph()
    # global mode: an event query or record by the allocator here fails the capture
    with tp.cuda.graph(g):
        cur = tp.cuda.current_stream()
        b = a.clone()                                    # an allocation while s0's event is pending
        s2.wait_stream(cur)
        with tp.cuda.stream(s2):
            b.fill_(1.0)
            b.record_stream(s2)                          # freed with record_stream inside the capture
            del b
        cur.wait_stream(s2)
    assert g.is_instantiated and not tp.cuda.is_current_stream_capturing()

    c = tp.empty(n, dtype=tp.float32, device="cuda")     # eager: processes events, s0's is not done
    assert not s0.query(), "the hold on s0 timed out before the check"
    assert c._storage.ptr != p_ptr
    release()
    tp.cuda.synchronize()
    held = [c]
    for _ in range(8):                                   # an allocation processes completed events
        held.append(tp.empty(n, dtype=tp.float32, device="cuda"))
        if tp.cuda.memory_stats()["pending_events"] == 0:
            break
    assert tp.cuda.memory_stats()["pending_events"] == 0
    g.replay()
    tp.cuda.synchronize()
    del held
    g.reset()


def test_a_graph_reset_during_its_replay_keeps_its_input_until_the_replay_ends():
    n = 16 * MiB // 4            # 16 MiB: its own segment, so no merging blurs the addresses
    s_other = tp.cuda.Stream()
    inp = tp.full((n,), 3.0, device="cuda")
    out = tp.zeros(n, dtype=tp.float32, device="cuda")
    warm(out.copy_, inp)                # no closure: the test deletes inp below
    spin(tp.cuda.current_stream(), 1000)
    tp.cuda.synchronize()
    g = CUDAGraph()
    with tp.cuda.graph(g):
        spin(tp.cuda.current_stream(), 600_000_000)      # ~0.3 s
        out.copy_(inp)                                   # then read the eager input
    inp_ptr = inp._storage.ptr
    tp.cuda.synchronize()
    g.replay(s_other)
    del inp                      # only the graph holds it now ...
    g.reset()                    # ... and not any more, while the replay still runs
    q = tp.empty(n, dtype=tp.float32, device="cuda")     # same size, default stream
    assert not s_other.query(), "the replay ended before the check: make the spin longer"
    assert q._storage.ptr != inp_ptr
    q.fill_(-1.0)                # had q aliased the input, the replay's copy would read -1
    s_other.synchronize()
    tp.cuda.synchronize()
    assert (out.numpy() == 3.0).all()
    assert (q.numpy() == -1.0).all()
    # once the replay is over the block is free again: the next same-size
    # allocations (which process events) reach it
    held, found = [], False
    for _ in range(32):
        t = tp.empty(n, dtype=tp.float32, device="cuda")
        held.append(t)
        if t._storage.ptr == inp_ptr:
            found = True
            break
    assert found
    del held, q


# ---------------------------------------------------------------- OOM

@pytest.mark.serial  # fills 85% of the device's free memory
def test_oom_releases_the_cache_and_retries_and_oom_in_a_capture_is_clean():
    base = _settle()
    retries0 = tp.cuda.memory_stats()["num_alloc_retries"]
    free0, total = tp.cuda.mem_get_info()
    target = int(0.7 * free0)
    k = max(4, -(-target // (8 * GiB)))                  # several ~8 GiB tensors
    chunk = target // k // (2 * MiB) * (2 * MiB)
    big_n = int(0.85 * free0) // (2 * MiB) * (2 * MiB)
    held = {}                    # every tensor of the test, so that a failure still frees them
    g = CUDAGraph()
    try:
        held["cached"] = [tp.empty(chunk, dtype=tp.uint8, device="cuda") for _ in range(k)]
        del held["cached"]                               # freed: they stay cached, reserved
        assert tp.cuda.memory_reserved() - base >= k * chunk
        assert tp.cuda.mem_get_info()[0] < big_n, "the test needs the cache to be in the way"
        held["big"] = tp.empty(big_n, dtype=tp.uint8, device="cuda")   # fits once the cache is released
        assert tp.cuda.memory_stats()["num_alloc_retries"] - retries0 >= 1
        # every cached segment went back; big is its own segment of exactly big_n bytes
        assert tp.cuda.memory_reserved() - base == big_n
        del held["big"]                                  # cached again, and in the way again

        with pytest.raises(tp.cuda.OutOfMemoryError):
            with tp.cuda.graph(g):
                tp.empty(2 * total, dtype=tp.uint8, device="cuda")
        gc.collect()
        assert not tp.cuda.is_current_stream_capturing()
        assert not g.is_capturing
        x = held["x"] = tp.ones(1024, dtype=tp.float32, device="cuda")
        warm(x.mul, 5.0)
        with tp.cuda.graph(g):
            held["z"] = x * 5.0
        del x
        g.replay()
        assert held["z"].tolist() == [5.0] * 1024
    finally:
        held.clear()
        g.reset()
        gc.collect()
        tp.cuda.synchronize()
        tp.cuda.empty_cache()
    assert tp.cuda.memory_reserved() == base


# ---------------------------------------------------------------- threads

def test_threads_allocating_on_their_own_streams_while_the_cache_is_emptied():
    n_threads, iters = 8, 300
    streams = [tp.cuda.Stream() for _ in range(n_threads)]
    warm(lambda: tp.empty(MiB, dtype=tp.float32, device="cuda").fill_(1.0) + 1.0)
    gc.collect()
    tp.cuda.synchronize()
    base_alloc = tp.cuda.memory_allocated()
    errors = []
    empties = [0]
    stop = threading.Event()
    start = threading.Barrier(n_threads + 1, timeout=60)

    def worker(k):
        try:
            r = np.random.default_rng(1000 + k)
            live = []
            start.wait()
            with tp.cuda.stream(streams[k]):
                for i in range(iters):
                    nbytes = int(r.integers(MiB, 16 * MiB + 1))        # 1-16 MiB, any 4-byte size
                    x = tp.empty(nbytes // 4, dtype=tp.float32, device="cuda")
                    x.fill_(float(i))
                    y = x + 1.0
                    del x
                    if i % 3 == 0:
                        y.record_stream(streams[(k + 1) % n_threads])    # another thread's stream
                    if i % 50 == 0:
                        got = (y[0].item(), y[-1].item())
                        if got != (i + 1.0, i + 1.0):
                            errors.append(f"worker {k} step {i}: {got}")
                    live.append(y)
                    del y
                    if len(live) > 4:
                        live.pop(int(r.integers(len(live))))
                live.clear()
        except BaseException:                     # noqa: BLE001 - reported below
            errors.append(f"worker {k}: {traceback.format_exc()}")

    def emptier():
        try:
            start.wait()
            while not stop.is_set():
                tp.cuda.empty_cache()
                empties[0] += 1
                time.sleep(0.001)
        except BaseException:                     # noqa: BLE001 - reported below
            errors.append(f"emptier: {traceback.format_exc()}")

    workers = [threading.Thread(target=worker, args=(k,)) for k in range(n_threads)]
    e = threading.Thread(target=emptier)
    e.start()
    for t in workers:
        t.start()
    for t in workers:
        t.join(180)
    stop.set()
    e.join(60)
    assert not any(t.is_alive() for t in workers + [e]), "a thread hung"
    assert not errors, errors[:5]
    assert empties[0] > 0
    gc.collect()
    tp.cuda.synchronize()
    z = tp.empty(MiB, dtype=tp.float32, device="cuda")  # an allocation processes completed events
    del z
    tp.cuda.empty_cache()
    assert tp.cuda.memory_allocated() == base_alloc
    assert tp.cuda.memory_stats()["pending_events"] == 0


# ---------------------------------------------------------------- capture/reset cycles

def test_capture_reset_cycles_do_not_grow_reserved_memory():
    x = tp.ones(1 << 16, dtype=tp.float32, device="cuda")
    warm(lambda: (x * 2.0).sum() + tp.empty(MiB, dtype=tp.float32, device="cuda").fill_(1.0).sum())
    _settle()
    g = CUDAGraph()

    def cycle():
        with tp.cuda.graph(g):
            tmp = tp.empty(MiB, dtype=tp.float32, device="cuda")   # a 4 MiB temporary ...
            tmp.fill_(1.0)
            y = (x * 2.0).sum() + tmp.sum()
            del tmp                                                # ... freed inside the capture
        g.replay()
        assert y.item() == 2.0 * (1 << 16) + MiB
        del y
        g.reset()

    cycle()
    gc.collect()
    first = tp.cuda.memory_reserved()
    for _ in range(99):
        cycle()
    gc.collect()
    # no empty_cache: a reset pool that no tensor uses must not pile up
    assert tp.cuda.memory_reserved() <= first


def test_an_unheld_unused_pool_goes_back_to_the_device_at_once():
    x = tp.ones(MiB, dtype=tp.float32, device="cuda")     # 4 MiB
    warm(lambda: x * 2.0)
    base = _settle()

    def capture():
        g = CUDAGraph()
        with tp.cuda.graph(g):
            y = x * 2.0                                  # 4 MiB: a 20 MiB segment of the pool
        g.replay()
        assert y[0].item() == 2.0                        # the replay is over
        return g, y

    g, y = capture()
    grown = tp.cuda.memory_reserved() - base
    assert 20 * MiB <= grown <= 20 * MiB + SMALL_SLACK
    del y
    gc.collect()
    assert tp.cuda.memory_reserved() - base == grown     # the graph still holds its pool
    g.reset()
    assert tp.cuda.memory_reserved() == base             # no empty_cache needed

    g, y = capture()
    g.reset()
    assert tp.cuda.memory_reserved() - base == grown     # y still uses the pool: never freed under it
    assert y[0].item() == 2.0
    del y
    gc.collect()
    assert tp.cuda.memory_reserved() == base


# ---------------------------------------------------------------- concurrent captures

def test_two_concurrent_captures_into_one_pool_from_two_threads_raise():
    x = tp.ones(1 << 16, dtype=tp.float32, device="cuda")
    warm(lambda: (x * 3.0) + 1.0)
    pool = tp.cuda.graph_pool_handle()
    g1 = CUDAGraph()
    outcome = []

    def other():
        try:
            s = tp.cuda.Stream()
            g2 = CUDAGraph()
            with tp.cuda.stream(s):
                try:
                    g2.capture_begin(pool=pool, capture_error_mode="thread_local")
                except RuntimeError as exc:
                    outcome.append(("raised", str(exc), g2.is_capturing,
                                    tp.cuda.is_current_stream_capturing()))
                else:
                    g2.reset()
                    outcome.append(("began",))
        except BaseException:                     # noqa: BLE001 - reported below
            outcome.append(("error", traceback.format_exc()))

    # thread_local on both: the other thread's driver calls cannot invalidate g1
    g1.capture_begin(pool=pool, capture_error_mode="thread_local")
    try:
        y = x * 3.0
        t = threading.Thread(target=other)
        t.start()
        t.join(60)
    finally:
        g1.capture_end()
    assert not t.is_alive()
    assert len(outcome) == 1 and outcome[0][0] == "raised", outcome
    _, msg, still_capturing, stream_capturing = outcome[0]
    assert "already" in msg, msg
    assert not still_capturing and not stream_capturing
    g1.replay()
    assert y[:4].tolist() == [3.0] * 4
    g3 = CUDAGraph()
    with tp.cuda.graph(g3, pool=pool):                   # the pool is free for the next capture
        z = y + 1.0
    x.fill_(2.0)
    g1.replay()
    g3.replay()
    assert z[:4].tolist() == [7.0] * 4


# ---------------------------------------------------------------- summary

def test_memory_summary_is_a_report_of_reserved_memory():
    x = tp.ones(MiB, dtype=tp.float32, device="cuda")
    s = tp.cuda.memory_summary()
    assert isinstance(s, str)
    assert "reserved" in s.lower()
    del x
