# SPDX-License-Identifier: Apache-2.0
"""Several GPUs: every piece is per device, concurrent captures on two devices,
peer copies with and without peer access (skipped with fewer than two GPUs)."""

import threading

import numpy as np
import pytest

import tensorplay as tp
from tensorplay.cuda import CUDAGraph

pytestmark = [pytest.mark.cuda, pytest.mark.multigpu]


def test_tensors_streams_and_memory_are_per_device(memory_baseline):
    before = [tp.cuda.memory_allocated(d) for d in (0, 1)]
    x = tp.ones(1 << 20, device="cuda:1")
    assert x.device.index == 1
    assert tp.cuda.memory_allocated(1) > before[1]
    assert tp.cuda.memory_allocated(0) == before[0]
    s1 = tp.cuda.Stream(device=1)
    with tp.cuda.stream(s1):
        assert tp.cuda.current_stream(1).handle == s1.handle
        assert tp.cuda.current_stream(0).handle == 0          # device 0's current stream untouched
        y = x * 2                                              # queued on s1, device 1
    s1.synchronize()
    assert y.device.index == 1 and float(y.sum().item()) == 2.0 * (1 << 20)
    with tp.cuda.device(1):
        assert tp.cuda.current_device() == 1
        z = tp.zeros(4, device="cuda")                         # "cuda" is the current device
    assert z.device.index == 1 and tp.cuda.current_device() == 0
    del x, y, z
    memory_baseline()


def test_the_same_op_runs_on_both_devices():
    """Kernels are compiled per compute capability and loaded per device."""
    a = np.arange(64, dtype=np.float32)
    for d in (0, 1):
        t = tp.tensor(a, device=f"cuda:{d}")
        np.testing.assert_allclose((t.sin() * 3).cpu().numpy(), np.sin(a) * 3, rtol=1e-5, atol=1e-6)


def test_a_graph_belongs_to_its_device():
    with tp.cuda.device(1):
        x = tp.zeros(4, device="cuda")
        x.add_(1)
        g = CUDAGraph()
        with tp.cuda.graph(g):
            x.add_(1)
        assert g.device_index == 1
    g.replay(tp.cuda.Stream(device=1))
    tp.cuda.synchronize(1)
    assert x.tolist() == [2.0] * 4
    with pytest.raises(ValueError, match="cuda:1.*cuda:0"):
        g.replay(tp.cuda.Stream(device=0))
    with pytest.raises(ValueError, match="must live on cuda:1"):
        g.stage_and_launch([tp.zeros(4, device="cuda:0")], [tp.ones(4, device="cuda:0")])


def test_concurrent_captures_on_two_devices_from_two_threads():
    results, errors = {}, []
    barrier = threading.Barrier(2)

    def work(dev):
        try:
            with tp.cuda.device(dev):
                x = tp.full((1024,), float(dev + 1), device="cuda")
                (x * 2 + 1).sum()                              # kernels loaded on this device
                tp.cuda.synchronize()
                barrier.wait()
                g = CUDAGraph()
                with tp.cuda.graph(g, capture_error_mode="thread_local"):
                    y = (x * 2 + 1).sum()
                barrier.wait()                                 # both graphs exist before replaying
                for _ in range(50):
                    g.replay()
                tp.cuda.synchronize()
                results[dev] = (float(y.item()), g.pool_id, tp.cuda.memory_reserved(dev))
        except BaseException as exc:                           # noqa: BLE001 - reported below
            errors.append((dev, repr(exc)))

    threads = [threading.Thread(target=work, args=(d,)) for d in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert results[0][0] == 1024 * 3.0 and results[1][0] == 1024 * 5.0
    assert results[0][1] != results[1][1]                      # one pool each


@pytest.mark.parametrize("peer_access", [False, True])
def test_peer_copies_with_and_without_peer_access(peer_access, rng):
    if peer_access:
        if not tp.cuda.can_device_access_peer(0, 1):
            pytest.skip("these GPUs cannot access each other's memory")
        tp.cuda.enable_peer_access(0, 1)
        tp.cuda.enable_peer_access(1, 0)
        tp.cuda.enable_peer_access(0, 1)                       # twice is fine
    try:
        a = rng.standard_normal((64, 33)).astype(np.float32)
        x0 = tp.tensor(a, device="cuda:0")
        x1 = tp.empty((64, 33), device="cuda:1")
        x1.copy_(x0)
        np.testing.assert_array_equal(x1.cpu().numpy(), a)
        back = tp.zeros((33, 64), dtype=tp.float64, device="cuda:0")
        back.copy_(x1.T)                                       # strided and cast across devices
        np.testing.assert_array_equal(back.cpu().numpy(), a.T.astype(np.float64))
        assert np.array_equal(x0.to("cuda:1").cpu().numpy(), a)

        # stage_and_launch's fallback: an input on the other device
        static = tp.zeros(33, device="cuda:1")
        out = tp.zeros(33, device="cuda:1")
        out.add_(static)
        g = CUDAGraph()
        with tp.cuda.device(1), tp.cuda.graph(g):
            out.copy_(static * 2)
        g.stage_and_launch([static], [x0[5]])
        tp.cuda.synchronize(1)
        np.testing.assert_array_equal(out.cpu().numpy(), a[5] * 2)
    finally:
        if peer_access:
            tp.cuda.disable_peer_access(0, 1)
            tp.cuda.disable_peer_access(1, 0)
            tp.cuda.disable_peer_access(1, 0)                  # not enabled: fine
