# SPDX-License-Identifier: Apache-2.0
"""Host memory inside CUDA graph captures (GPU), as PyTorch has it.

A CPU tensor in pinned memory copied to the GPU inside a capture becomes a
copy node that reads the host memory at every replay: the host changes the
pinned tensor between replays and each replay must see the new values
(compared with NumPy), whatever the size, dtype, layout or broadcast, inside
a WHILE body too, and after the user dropped the tensor (the graph keeps its
memory). A CPU tensor or NumPy array in pageable memory is refused inside a
capture (the capture goes on); literals are copied into the graph
(tests/graph/test_capture_creation.py). The same rule without a GPU, on a
fake device: tests/tensor/test_host_data.py.
"""

import gc
import weakref

import numpy as np
import pytest

import tensorplay as tp
from helpers import warm
from tensorplay import _testing
from tensorplay.cuda import CUDAGraph

pytestmark = pytest.mark.cuda


def _pinned_buffers():
    gc.collect()
    tp.cuda.synchronize()
    _testing.free_pending_pinned(wait=True)
    return _testing.pinned_memory_stats()["buffers"]


def _replay(g):
    g.replay()
    tp.cuda.synchronize()


@pytest.mark.parametrize("non_blocking", [False, True])
@pytest.mark.parametrize("n", [4, 1 << 18, 1 << 24], ids=["16B", "1MiB", "64MiB"])
def test_a_pinned_copy_reads_the_host_memory_at_every_replay(n, non_blocking, rng):
    h = tp.zeros(n, pin_memory=True)
    static = tp.zeros(n, device="cuda")
    warm(lambda: static.copy_(h, non_blocking=non_blocking) * 2.0)
    g = CUDAGraph()
    g.enable_debug_mode()
    with tp.cuda.graph(g):
        static.copy_(h, non_blocking=non_blocking)
        out = static * 2.0
    copies = [nd for nd in g.describe()["nodes"] if nd["kind"] == "memcpy"]
    assert len(copies) == 1 and copies[0]["attrs"]["bytes"] == 4 * n
    assert copies[0]["attrs"]["direction"] in ("host->device", "unified->device")
    for _ in range(3):
        vals = rng.standard_normal(n).astype(np.float32)
        h.numpy()[:] = vals                      # the host changes the pinned tensor between replays
        static.fill_(-1.0)
        _replay(g)
        assert np.array_equal(static.numpy(), vals)
        assert np.array_equal(out.numpy(), vals * np.float32(2.0))


def test_pinned_sources_of_other_dtypes_layouts_and_shapes_are_cast_at_every_replay(rng):
    h32 = tp.zeros(9, dtype=tp.int32, pin_memory=True)
    row = tp.zeros(5, pin_memory=True)
    grid = tp.zeros(6, 4, dtype=tp.float64, pin_memory=True)
    idx = tp.zeros(3, dtype=tp.int64, pin_memory=True)
    x = tp.arange(10, dtype=tp.float32, device="cuda")
    a = tp.zeros(9, device="cuda")
    b = tp.zeros(3, 5, device="cuda")
    c = tp.zeros(4, 6, dtype=tp.float32, device="cuda")
    e = tp.zeros(3, device="cuda")

    def fn():
        a.copy_(h32)                             # int32 -> float32
        b.copy_(row)                             # broadcast (5,) -> (3, 5)
        c.copy_(grid.T)                          # transposed float64 view -> float32
        e.copy_(h32[1::3])                       # a strided view: elements 1, 4, 7
        return (tp.tensor(h32.numpy(), dtype=tp.float16, device="cuda"),   # an array over pinned memory
                h32.to("cuda", tp.float64), x + row.numpy()[:1], x[idx])

    warm(fn)
    g = CUDAGraph()
    with tp.cuda.graph(g):
        outs = fn()
    for _ in range(3):
        hv = rng.integers(-1000, 1000, 9).astype(np.int32)
        rv = rng.standard_normal(5).astype(np.float32)
        gv = rng.standard_normal((6, 4))
        iv = rng.integers(0, 10, 3)
        h32.numpy()[:] = hv
        row.numpy()[:] = rv
        grid.numpy()[:] = gv
        idx.numpy()[:] = iv
        _replay(g)
        assert np.array_equal(a.numpy(), hv.astype(np.float32))
        assert np.array_equal(b.numpy(), np.broadcast_to(rv, (3, 5)))
        assert np.array_equal(c.numpy(), gv.T.astype(np.float32))
        assert np.array_equal(e.numpy(), hv[1::3].astype(np.float32))
        xs = np.arange(10, dtype=np.float32)
        want = [hv.astype(np.float16), hv.astype(np.float64), xs + rv[:1], xs[iv]]
        for got, w in zip(outs, want):
            assert got.numpy().dtype == w.dtype and np.array_equal(got.numpy(), w)


def test_the_graph_keeps_the_pinned_memory_after_the_tensor_is_dropped():
    n = 1 << 20
    start = _pinned_buffers()
    h = tp.full((n,), 3.0, pin_memory=True)
    mem = weakref.ref(_testing.pinned_memory_of(h.numpy()))
    static = tp.zeros(n, device="cuda")
    warm(lambda: static.copy_(h))
    g = CUDAGraph()
    with tp.cuda.graph(g):
        static.copy_(h)
    del h
    gc.collect()
    assert mem() is not None                     # the graph holds it
    for _ in range(3):
        static.zero_()
        _replay(g)
        assert np.array_equal(static.numpy(), np.full(n, 3.0, np.float32))
    g.replay()
    del g                                        # freed after the replay queued
    assert _pinned_buffers() == start and mem() is None


def test_reset_and_recapture_give_the_pinned_memory_back():
    start = _pinned_buffers()
    static = tp.zeros(1024, device="cuda")
    g = CUDAGraph()
    for k in range(5):
        h = tp.full((1024,), float(k), pin_memory=True)
        warm(lambda: static.copy_(h))
        with tp.cuda.graph(g):                   # a re-capture: the previous pinned memory goes
            static.copy_(h)
        del h
        _replay(g)
        assert static.numpy()[[0, -1]].tolist() == [float(k)] * 2
    g.reset()
    assert _pinned_buffers() == start


def test_pageable_host_memory_inside_a_capture_is_refused_and_the_capture_goes_on():
    x = tp.ones(4, device="cuda")
    static = tp.zeros(4, device="cuda")
    cpu = tp.tensor([1.0, 2.0, 3.0, 4.0])
    arr = np.arange(4, dtype=np.float32)
    warm(lambda: (x + 1) * 2)
    calls = [lambda: static.copy_(cpu), lambda: static.copy_(arr), lambda: cpu.cuda(),
             lambda: cpu.to("cuda", non_blocking=True), lambda: tp.tensor(arr, device="cuda"),
             lambda: x + arr, lambda: x[np.array([0, 1])], lambda: x[tp.tensor([True, False, True, True])]]
    g = CUDAGraph()
    with tp.cuda.graph(g):
        y = x + 1
        for call in calls:
            with pytest.raises(tp.cuda.CudaError) as info:
                call()
            assert info.value.name == "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED"
            assert "pin_memory()" in str(info.value) or "boolean mask" in str(info.value)
            assert tp.cuda.is_current_stream_capturing()
        z = y * 2
    assert not tp.cuda.is_current_stream_capturing()
    for _ in range(2):
        z.zero_()
        _replay(g)
        assert z.numpy().tolist() == [4.0] * 4
    assert static.numpy().tolist() == [0.0] * 4  # the refused copies did nothing
    static.copy_(cpu)                            # outside a capture the same calls work
    assert static.numpy().tolist() == [1.0, 2.0, 3.0, 4.0]


def test_literals_are_still_copied_into_the_graph():
    static = tp.zeros(4, device="cuda")
    values = [1.0, 2.0, 3.0, 4.0]
    warm(lambda: static.copy_(values))
    g = CUDAGraph()
    with tp.cuda.graph(g):
        static.copy_(values)
        y = static + tp.tensor((10.0, 20.0, 30.0, 40.0), device="cuda") + np.float32(0.5)
    values[0] = 100.0                            # a list cannot change what the graph holds
    for _ in range(2):
        static.zero_()
        _replay(g)
        assert static.numpy().tolist() == [1.0, 2.0, 3.0, 4.0]
        assert y.numpy().tolist() == [11.5, 22.5, 33.5, 44.5]


def test_a_pinned_copy_inside_a_while_body_reads_the_host_at_every_iteration(rng):
    n = 1 << 16
    h = tp.zeros(n, pin_memory=True)
    static = tp.zeros(n, device="cuda")
    acc = tp.zeros(n, device="cuda")
    c = tp.zeros(1, dtype=tp.int32, device="cuda")
    limit = tp.full((1,), 3, dtype=tp.int32, device="cuda")
    pred = tp.zeros(1, dtype=tp.bool, device="cuda")

    def body():
        static.copy_(h)
        acc.add_(static)
        c.add_(1)
        tp.lt(c, limit, out=pred)
    warm(body)
    g = CUDAGraph()
    with tp.cuda.graph(g):
        c.zero_()
        acc.zero_()
        tp.lt(c, limit, out=pred)
        g.begin_capture_to_while_node(pred)
        body()
        g.end_capture_to_conditional_node()
    for k in range(4):
        vals = rng.integers(-50, 50, n).astype(np.float32)     # integers: the sums are exact
        h.numpy()[:] = vals
        limit.fill_(k + 1)
        _replay(g)
        assert c.item() == k + 1
        assert np.array_equal(acc.numpy(), vals * (k + 1))


def test_stage_and_launch_and_rebind_with_pinned_memory(rng):
    n = 4096
    h = tp.zeros(n, pin_memory=True)
    x = tp.zeros(n, device="cuda")
    b = tp.zeros(n, device="cuda")
    y = tp.zeros(n, device="cuda")

    def fn():
        b.copy_(h)                               # a host-to-device copy node
        tp.add(x * 2.0, b, out=y)
    warm(fn)
    g = CUDAGraph()
    with tp.cuda.graph(g):
        fn()
    assert g.rebindable([x], [y]) == [True, True]    # the copy node touches b only
    for _ in range(2):
        hv = rng.standard_normal(n).astype(np.float32)
        xv = rng.standard_normal(n).astype(np.float32)
        h.numpy()[:] = hv
        xin = tp.from_numpy(xv).pin_memory()
        g.stage_and_launch([x], [xin])           # a pinned input staged through copy_
        tp.cuda.synchronize()
        np.testing.assert_allclose(y.numpy(), xv * 2 + hv, rtol=1e-6)
        x2, y2 = tp.tensor(-xv, device="cuda"), tp.empty(n, device="cuda")
        g.rebind_and_launch([x], [x2], [y], [y2])
        tp.cuda.synchronize()
        np.testing.assert_allclose(y2.numpy(), -xv * 2 + hv, rtol=1e-6)


def test_cudagraphify_reads_pinned_memory_it_closes_over(rng):
    n = 2048
    h = tp.zeros(n, pin_memory=True)

    @tp.cuda.cudagraphify
    def f(x):
        return x + h.cuda(non_blocking=True)

    x = tp.ones(n, device="cuda")
    for _ in range(4):
        vals = rng.standard_normal(n).astype(np.float32)
        h.numpy()[:] = vals
        out = f(x)
        np.testing.assert_allclose(out.numpy(), vals + 1, rtol=1e-6)
