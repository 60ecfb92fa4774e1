# SPDX-License-Identifier: Apache-2.0
"""Sleepable graph pools on the GPU: sleep gives the pool's physical memory
back (measured with cuMemGetInfo), replays while asleep are refused, wake
maps new memory at the same addresses and the next replay is right without
a capture; kept tensors survive; sleep is refused during a capture; a soak
of captures, replays, sleeps and wakes in one shared sleepable pool."""
import gc
import random

import numpy as np
import pytest

import tensorplay as tp
from tensorplay._memory import vmm
from tensorplay._memory.api import sleep_pool
from tensorplay.cuda import CUDAGraph, GraphPool, PoolAsleepError

pytestmark = pytest.mark.cuda
MiB = 1 << 20


def device_free():
    tp.cuda.synchronize()
    return tp.cuda.mem_get_info()[0]


def capture_chain(pool, x):
    """A graph of three 1-in-1-out ops over ``x`` with temporaries in ``pool``."""
    g = CUDAGraph()
    with tp.cuda.graph(g, pool=pool):
        y = x * 2.0
        z = y + 1.0
        out = z * z
    return g, out


def expected(x_host):
    return (x_host * 2.0 + 1.0) ** 2


@pytest.fixture
def x64():
    """64 MiB of float32 in the default pool, with known values."""
    host = np.random.default_rng(0).standard_normal(16 * MiB, dtype=np.float32)
    return tp.tensor(host, device="cuda"), host


@pytest.mark.serial  # device-wide free memory (cuMemGetInfo)
def test_sleep_gives_the_memory_back_and_wake_replays_right(x64):
    x, host = x64
    pool = GraphPool()
    g, out = capture_chain(pool, x)
    g.replay()
    mapped = pool.memory()["mapped"]
    assert mapped >= 3 * 64 * MiB
    before = device_free()
    assert pool.sleep() == mapped
    freed = device_free() - before
    assert freed >= 0.95 * mapped, f"{freed} of {mapped} bytes came back to the device"
    assert pool.asleep and pool.memory() == {"reserved": 0, "mapped": 0, "asleep": mapped}
    for call in (g.replay, lambda: g.stage_and_launch([x], [x]), lambda: g.rebind_and_launch([x], [x])):
        with pytest.raises(PoolAsleepError, match="asleep.*wake"):
            call()
    assert pool.wake() == mapped
    assert not pool.asleep and pool.memory()["mapped"] == mapped
    g.replay()
    np.testing.assert_allclose(out.cpu().numpy(), expected(host), rtol=1e-6)


@pytest.mark.serial  # device-wide free memory (cuMemGetInfo)
def test_a_hundred_sleep_wake_cycles_give_memory_back_each_time(x64):
    x, host = x64
    pool = GraphPool()
    g, out = capture_chain(pool, x)
    mapped = pool.memory()["mapped"]
    rng = np.random.default_rng(1)
    for cycle in range(100):
        before = device_free()
        pool.sleep()
        assert device_free() - before >= 0.95 * mapped, f"cycle {cycle}"
        pool.wake()
        offset = np.float32(rng.standard_normal())
        x.copy_(tp.tensor(host + offset, device="cuda"))
        g.replay()
        idx = rng.integers(0, host.size, 1000)
        np.testing.assert_allclose(out.cpu().numpy()[idx], expected(host + offset)[idx], rtol=1e-5,
                                   err_msg=f"cycle {cycle}")


def test_kept_tensors_get_their_values_back(x64):
    x, host = x64
    pool = GraphPool()
    g, out = capture_chain(pool, x)
    g.replay()
    want = out.cpu().numpy()
    pool.sleep(keep=[out])
    pool.wake()
    np.testing.assert_array_equal(out.cpu().numpy(), want)      # no replay: the kept copy came back


def test_keep_takes_tensors_only():
    pool = GraphPool()
    with pytest.raises(TypeError, match="item 0 is a list"):
        pool.sleep(keep=[[1, 2]])
    assert not pool.asleep


def test_sleep_during_a_capture_is_refused_and_the_capture_goes_on(x64):
    x, host = x64
    sleepy = GraphPool()
    g1, out1 = capture_chain(sleepy, x)
    g2 = CUDAGraph()
    with tp.cuda.graph(g2):
        y = x + 3.0
        with pytest.raises(RuntimeError, match="capture is under way"):
            sleepy.sleep()
    g2.replay()
    g1.replay()
    np.testing.assert_allclose(y.cpu().numpy(), host + 3.0, rtol=1e-6)
    np.testing.assert_allclose(out1.cpu().numpy(), expected(host), rtol=1e-6)
    assert not sleepy.asleep


def test_a_capture_into_a_sleeping_pool_is_refused_and_leaves_the_process_usable(x64):
    x, host = x64
    pool = GraphPool()
    held = capture_chain(pool, x)          # a graph holds the pool: it has memory to sleep
    pool.sleep()
    assert pool.asleep
    g = CUDAGraph()
    with pytest.raises(PoolAsleepError, match="wake"):
        with tp.cuda.graph(g, pool=pool):
            x * 2.0
    assert not tp.cuda.is_current_stream_capturing()
    np.testing.assert_allclose((x + 1.0).cpu().numpy(), host + 1.0, rtol=1e-6)
    pool.wake()
    g, out = capture_chain(pool, x)
    g.replay()
    np.testing.assert_allclose(out.cpu().numpy(), expected(host), rtol=1e-6)


def test_a_pool_made_not_sleepable_refuses_to_sleep(x64):
    x, _ = x64
    pool = GraphPool(sleepable=False)
    g, out = capture_chain(pool, x)
    with pytest.raises(ValueError, match="sleepable=False"):
        pool.sleep()
    with pytest.raises(ValueError, match="cannot sleep"):
        sleep_pool(pool.id)
    g.replay()


def test_a_graph_reset_while_its_pool_sleeps_gives_its_addresses_back(x64):
    x, _ = x64
    pool = GraphPool()
    g, out = capture_chain(pool, x)
    pool.sleep()
    assert vmm.regions(pool.id)
    del out
    g.reset()
    gc.collect()
    assert vmm.regions(pool.id) == []
    assert tp.cuda.memory_stats().get(f"pool.{pool.id}.segments", 0) == 0


def test_soak_of_captures_replays_sleeps_and_wakes_in_one_shared_pool():
    """200 steps over one sleepable pool shared by a changing set of graphs
    of 1-64 MiB tensors: capture, replay (checked), reset, sleep, wake. At
    the end every address range is given back."""
    rng = random.Random(7)
    pool = GraphPool()
    base_reserved = tp.cuda.memory_reserved()
    graphs = []                                  # (graph, x, x_host, out)
    for step in range(200):
        r = rng.random()
        if pool.asleep:
            if graphs and r < 0.2:
                with pytest.raises(PoolAsleepError):
                    graphs[rng.randrange(len(graphs))][0].replay()
            pool.wake()
            continue
        if r < 0.35 or not graphs:
            n = rng.choice([1, 4, 16, 64]) * MiB // 4
            host = np.full(n, np.float32(rng.uniform(-2, 2)))
            x = tp.tensor(host, device="cuda")
            g, out = capture_chain(pool, x)
            graphs.append((g, x, host, out))
        elif r < 0.7:
            for g, x, host, out in graphs:          # sharing a pool: replay in capture order
                g.replay()
            g, x, host, out = graphs[-1]
            got = out[:4].cpu().numpy()
            np.testing.assert_allclose(got, expected(host[:4]), rtol=1e-5, err_msg=f"step {step}")
        elif r < 0.8:
            g, x, host, out = graphs.pop(0)
            del out
            g.reset()
        else:
            pool.sleep()
    if pool.asleep:
        pool.wake()
    for entry in graphs:                         # (not "g, *_": _ would keep the last output)
        entry[0].reset()
    graphs.clear()
    g = x = out = entry = None                  # the loop's last ones
    gc.collect()
    tp.cuda.empty_cache()
    left = vmm.regions(pool.id)
    ours = [seg for seg in tp.cuda.memory_snapshot() if seg["segment_pool_id"] == pool.id]
    stats = {k: v for k, v in tp.cuda.memory_stats().items() if k.startswith(f"pool.{pool.id}.")}
    assert left == [], f"regions left {left}; tensorplay's segments of the pool {ours}; its stats {stats}"
    assert tp.cuda.memory_reserved() <= base_reserved
