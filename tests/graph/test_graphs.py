# SPDX-License-Identifier: Apache-2.0
"""CUDAGraph core: PyTorch's classic graph scenarios, on tensorplay."""

import gc
import threading
import traceback

import numpy as np
import pytest

import tensorplay as tp
from tensorplay.cuda import CUDAGraph
from helpers import graph_objects, spin, warm

pytestmark = pytest.mark.cuda
MiB = 1 << 20


def test_capture_many_ops_and_replay_with_changing_inputs(rng):
    x = tp.zeros(1000, device="cuda")
    w = tp.tensor(rng.standard_normal((1000, 8)).astype(np.float32), device="cuda")

    def step(x):
        h = (x * 2.0 + 1.0).relu()
        y = (h.unsqueeze(0) @ w).squeeze(0)
        return y.tanh() + h.sum() / 1000.0

    warm(step, x)
    g = CUDAGraph()
    assert g.pool_id is None
    g.capture_begin()
    assert tp.cuda.is_current_stream_capturing()
    y = step(x)
    g.capture_end()
    assert not tp.cuda.is_current_stream_capturing()
    assert tp.cuda.current_stream().handle == 0           # the current stream was restored
    assert g.num_nodes >= 5 and g.pool_id is not None
    wn = w.numpy().astype(np.float64)
    for k in range(5):
        a = rng.standard_normal(1000).astype(np.float32)
        x.copy_(a)
        g.replay()
        h = np.maximum(a.astype(np.float64) * 2 + 1, 0)
        ref = np.tanh(h @ wn) + h.sum() / 1000
        np.testing.assert_allclose(y.numpy(), ref, rtol=1e-4, atol=1e-4)


def test_instantiate_is_a_no_op_and_double_begin_raises():
    x = tp.ones(8, device="cuda")
    warm(lambda: x + 1)
    g = CUDAGraph()
    g.capture_begin()
    with pytest.raises(RuntimeError, match="already capturing"):
        g.capture_begin()
    with pytest.raises(RuntimeError, match="still open"):
        g.replay()
    y = x + 1
    g.capture_end()
    g.instantiate()
    with pytest.raises(RuntimeError, match="no capture is open"):
        g.capture_end()
    g.replay()
    assert y.tolist() == [2.0] * 8


def test_reset_and_recapture():
    x = tp.ones(4, device="cuda")
    warm(lambda: x * 3)
    g = CUDAGraph()
    with tp.cuda.graph(g):
        y = x * 3
    g.replay()
    assert y.tolist() == [3.0] * 4
    g.reset()
    with pytest.raises(RuntimeError, match="nothing to replay"):
        g.replay()
    with tp.cuda.graph(g):
        z = x * 5
    x.fill_(2)
    g.replay()
    assert z.tolist() == [10.0] * 4


def test_upload_ahead_of_the_first_replay_and_the_raw_graph():
    from cuda.bindings import driver
    x = tp.zeros(1 << 20, device="cuda")         # 4 MiB
    warm(lambda: x.add_(1).sub_(0.5))
    g = CUDAGraph()
    s = tp.cuda.Stream()
    with tp.cuda.graph(g):
        for _ in range(50):
            x.add_(1).sub_(0.5)
    assert g.num_nodes == 100 and g.graph_handle != 0
    err, _, count = driver.cuGraphGetNodes(driver.CUgraph(g.graph_handle), 0)
    assert err == driver.CUresult.CUDA_SUCCESS and count == g.num_nodes
    with tp.cuda.graph(CUDAGraph()):              # a capture is open: upload refuses, the capture goes on
        with pytest.raises(tp.cuda.CudaError, match="CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED"):
            g.upload()
        x.add_(0)
    g.upload(s)
    g.upload()                                   # again: harmless
    x.fill_(0)
    s.wait_stream(tp.cuda.current_stream())
    g.replay(s)
    s.synchronize()
    assert np.all(x.numpy() == 25.0)
    g.reset()
    assert g.graph_handle == 0
    with pytest.raises(RuntimeError, match="^upload: nothing to replay"):
        g.upload()


def test_capture_on_the_legacy_stream_raises():
    g = CUDAGraph()
    with pytest.raises(ValueError, match="default stream"):
        g.capture_begin(stream=tp.cuda.default_stream())
    with pytest.raises(ValueError, match="capture_error_mode"):
        g.capture_begin(capture_error_mode="strict")
    with pytest.raises(TypeError, match="pool"):
        g.capture_begin(pool="abc")
    assert not g.is_capturing


def test_empty_capture_warns():
    g = CUDAGraph()
    with pytest.warns(UserWarning, match="empty"):
        with tp.cuda.graph(g):
            pass
    g.replay()          # an empty graph still replays


def _attributed_here(caught, match):
    """The one warning caught, checked to name this file as its place (not a module of tensorplay)."""
    [w] = [w for w in caught if match in str(w.message)]
    assert w.filename == __file__, (w.filename, w.lineno)
    return w


def test_empty_capture_warning_points_at_the_users_line():
    """graph()'s __exit__, make_graphed_callables and capture_end itself reach
    the warning at different depths in tensorplay: each time it names the
    line of this file that led there."""
    g = CUDAGraph()
    with pytest.warns(UserWarning, match="empty") as caught:
        with tp.cuda.graph(g):
            pass
    _attributed_here(caught, "empty")
    g2 = CUDAGraph()
    g2.capture_begin()
    with pytest.warns(UserWarning, match="empty") as caught:
        g2.capture_end()
    _attributed_here(caught, "empty")
    x = tp.ones(8, device="cuda")
    with pytest.warns(UserWarning, match="empty") as caught:
        f = tp.cuda.make_graphed_callables(lambda t: t, (x,))
    _attributed_here(caught, "empty")
    assert f(tp.full((8,), 2.0, device="cuda")).tolist() == [2.0] * 8    # the staged copy is the graph's work


def test_debug_dump_without_dot_warns_at_the_users_line(tmp_path, monkeypatch):
    import shutil
    monkeypatch.setattr(shutil, "which", lambda name: None)
    x = tp.ones(8, device="cuda")
    warm(lambda: x + 1)
    g = CUDAGraph()
    with tp.cuda.graph(g):
        y = x + 1
    with pytest.warns(UserWarning, match="Graphviz 'dot' not found") as caught:
        written = g.debug_dump(tmp_path / "g.svg")
    _attributed_here(caught, "Graphviz")
    assert written == str(tmp_path / "g.dot")
    g.replay()
    assert y.tolist() == [2.0] * 8


def test_item_inside_capture_raises_and_process_stays_usable(memory_baseline):
    x = tp.ones(16, device="cuda")
    warm(lambda: x + 1)
    g = CUDAGraph()
    with pytest.raises(tp.cuda.CudaError) as info:
        with tp.cuda.graph(g):
            y = x + 1
            y.sum().item()
    assert "CAPTURE" in info.value.name
    traceback.clear_frames(info.value.__traceback__)   # its frames hold the capture's temporaries
    del info
    assert not g.is_capturing and not tp.cuda.is_current_stream_capturing()
    assert tp.cuda.current_stream().handle == 0
    del y
    with tp.cuda.graph(g):          # the same graph captures again
        z = x + 2
    g.replay()
    assert z.tolist() == [3.0] * 16
    del x, z
    g.reset()
    memory_baseline()


def test_relaxed_mode_captures():
    x = tp.ones(4, device="cuda")
    g = CUDAGraph()
    with tp.cuda.graph(g, capture_error_mode="relaxed"):
        y = x * 6
    g.replay()
    assert y.tolist() == [6.0] * 4


@pytest.mark.parametrize("mode", ["global", "thread_local"])
def test_synchronize_inside_capture_fails_the_capture_cleanly(mode):
    x = tp.ones(4, device="cuda")
    warm(lambda: x * 2)
    g = CUDAGraph()
    with pytest.raises(tp.cuda.CudaError):
        with tp.cuda.graph(g, capture_error_mode=mode):
            x * 2
            tp.cuda.synchronize()
    assert not tp.cuda.is_current_stream_capturing()
    with tp.cuda.graph(g, capture_error_mode=mode):
        y = x * 4
    g.replay()
    assert y.tolist() == [4.0] * 4


@pytest.mark.parametrize("n", [4, 2048], ids=["16B", "8KiB"])
def test_pageable_host_copy_inside_capture_raises(n):
    """A NumPy array (pageable memory) would be read once, at capture: at any
    size the copy is refused, with the fix in the message, and the graph
    object captures again."""
    x = tp.zeros(n, device="cuda")
    g = CUDAGraph()
    with pytest.raises(tp.cuda.CudaError, match="in pageable memory cannot be copied") as info:
        with tp.cuda.graph(g):
            x.copy_(np.ones(n, np.float32))
    assert info.value.name == "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED"
    assert "pin_memory()" in str(info.value)
    with tp.cuda.graph(g):
        x.fill_(1)
    g.replay()
    assert x.tolist() == [1.0] * n


def test_small_literal_copy_inside_capture_is_replayed():
    x = tp.zeros(4, device="cuda")
    x.copy_(np.full(4, 9, np.float32))
    tp.cuda.synchronize()
    g = CUDAGraph()
    with tp.cuda.graph(g):
        x.copy_([0.0, 1.0, 2.0, 3.0])            # a literal: 16 bytes inside the copy kernel's parameters
    x.fill_(-1)
    g.replay()
    assert x.tolist() == [0.0, 1.0, 2.0, 3.0]


def test_exception_in_body_propagates_and_graph_is_reusable():
    g = CUDAGraph()
    with pytest.raises(KeyError, match="boom"):
        with tp.cuda.graph(g):
            tp.ones(3, device="cuda")
            raise KeyError("boom")
    assert not g.is_capturing and not g.is_instantiated
    x = tp.ones(3, device="cuda")
    with tp.cuda.graph(g):
        x.add_(1)
    g.replay()
    g.replay()
    assert x.tolist() == [3.0] * 3


def test_oom_during_capture_raises_cleanly(memory_baseline):
    free, total = tp.cuda.mem_get_info()
    g = CUDAGraph()
    with pytest.raises(tp.cuda.OutOfMemoryError):
        with tp.cuda.graph(g):
            tp.empty(2 * total, dtype=tp.uint8, device="cuda")
    gc.collect()
    assert not tp.cuda.is_current_stream_capturing()
    x = tp.ones(8, device="cuda")
    with tp.cuda.graph(g):
        y = x * 7
    g.replay()
    assert y.tolist() == [7.0] * 8
    del x, y
    g.reset()
    memory_baseline()


def test_capture_replay_reset_cycles_leak_nothing():
    x = tp.ones(1 << 16, device="cuda")
    warm(lambda: (x * 2).sum())
    gc.collect()
    tp.cuda.synchronize()
    tp.cuda.empty_cache()
    base_reserved = tp.cuda.memory_reserved()
    base_alloc = tp.cuda.memory_allocated()
    base_live = graph_objects()
    g = CUDAGraph()
    for k in range(100):
        with tp.cuda.graph(g):
            y = (x * 2).sum()
            z = tp.empty(1 << 18, device="cuda")
            del z
        g.replay()
        assert y.item() == 2.0 * (1 << 16)
        del y
        g.reset()
    gc.collect()
    tp.cuda.empty_cache()
    assert tp.cuda.memory_allocated() == base_alloc
    assert tp.cuda.memory_reserved() == base_reserved
    assert graph_objects() == base_live


def test_memory_of_a_reset_graph_stays_valid_under_live_tensors():
    x = tp.ones(1 << 10, device="cuda")
    g = CUDAGraph()
    with tp.cuda.graph(g):
        y = x + 41
    g.replay()
    g.reset()
    tp.cuda.empty_cache()
    assert y.tolist() == [42.0] * (1 << 10)       # y's segment was not freed
    before = tp.cuda.memory_reserved()
    del y
    gc.collect()
    tp.cuda.empty_cache()
    assert tp.cuda.memory_reserved() < before


@pytest.mark.serial  # a GPU time
def test_timing_events_inside_a_graph():
    s = tp.cuda.Stream()
    start = tp.cuda.Event(enable_timing=True, external=True)
    end = tp.cuda.Event(enable_timing=True, external=True)
    g = CUDAGraph()
    with tp.cuda.graph(g, stream=s):
        start.record()
        spin(tp.cuda.current_stream(), 50_000_000)
        end.record()
    g.replay()
    end.synchronize()
    assert start.elapsed_time(end) > 1.0


@pytest.mark.parametrize("n_graphs", [2, 3])
def test_graphs_sharing_a_pool_replay_in_order_and_reserve_less(n_graphs):
    size = 8 * MiB // 4

    def capture(pool):
        graphs, outs = [], []
        x = tp.ones(size, device="cuda")
        warm(lambda: (x * 2.0)[:16] + 1.0)
        for k in range(n_graphs):
            g = CUDAGraph()
            with tp.cuda.graph(g, pool=pool if pool != "each" else None):
                tmp = x * float(k + 2)          # large, freed inside: later graphs reuse it
                out = tmp[:16] + 1.0
                del tmp
            graphs.append(g)
            outs.append(out)
        return x, graphs, outs

    tp.cuda.empty_cache()
    r0 = tp.cuda.memory_reserved()
    x, graphs, outs = capture(tp.cuda.graph_pool_handle())
    shared = tp.cuda.memory_reserved() - r0
    assert len({g.pool_id for g in graphs}) == 1
    for g in graphs:
        g.replay()
    for k, out in enumerate(outs):
        assert out[:3].tolist() == [k + 3.0] * 3
    del x, graphs, outs
    gc.collect()
    tp.cuda.empty_cache()
    r1 = tp.cuda.memory_reserved()
    x2, graphs2, outs2 = capture("each")
    private = tp.cuda.memory_reserved() - r1
    assert len({g.pool_id for g in graphs2}) == n_graphs
    assert shared < private
    # sharing by passing the graph itself
    g_a, g_b = CUDAGraph(), CUDAGraph()
    with tp.cuda.graph(g_a):
        a = x2 + 1
    with tp.cuda.graph(g_b, pool=g_a):
        b = a + 1
    assert g_a.pool_id == g_b.pool_id
    g_a.replay()
    g_b.replay()
    assert b[:2].tolist() == [3.0, 3.0]


def test_side_stream_work_and_allocations_land_in_the_pool():
    x = tp.ones(1 << 12, device="cuda")
    warm(lambda: (x * 3, x + 4))
    side = tp.cuda.Stream()
    g = CUDAGraph()
    with tp.cuda.graph(g):
        main = tp.cuda.current_stream()
        side.wait_stream(main)
        with tp.cuda.stream(side):
            a = x * 3                              # allocated on a joined stream
        b = x + 4
        main.wait_stream(side)
        c = a + b
    from tensorplay._memory.api import allocator
    assert a._storage.pool_id == g.pool_id == c._storage.pool_id
    x.fill_(2)
    g.replay()
    assert c[:4].tolist() == [12.0] * 4


def test_unjoined_side_stream_work_is_a_clear_error():
    x = tp.ones(8, device="cuda")
    warm(lambda: x * 3)
    side = tp.cuda.Stream()
    g = CUDAGraph()
    with pytest.raises(tp.cuda.CudaError, match="UNJOINED"):
        with tp.cuda.graph(g):
            side.wait_stream(tp.cuda.current_stream())
            with tp.cuda.stream(side):
                x * 3
    assert not tp.cuda.is_current_stream_capturing()
    with tp.cuda.graph(g):
        y = x * 3
    g.replay()
    assert y.tolist() == [3.0] * 8


def test_capture_end_on_another_thread_raises():
    g = CUDAGraph()
    x = tp.ones(2, device="cuda")
    g.capture_begin()
    x.add_(1)
    err = {}

    def other():
        try:
            g.capture_end()
        except RuntimeError as e:
            err["e"] = e
    t = threading.Thread(target=other)
    t.start()
    t.join()
    assert "thread" in str(err["e"])
    g.capture_end()
    g.replay()
    assert x.tolist() == [2.0, 2.0]         # eager add_ never ran; replay ran once


def test_replay_on_an_explicit_stream_and_concurrently_from_threads():
    n = 4
    xs = [tp.zeros(1 << 16, device="cuda") for _ in range(n)]
    warm(lambda: xs[0].add_(0))
    graphs = []
    for k in range(n):
        g = CUDAGraph()
        with tp.cuda.graph(g):
            xs[k].add_(1)
        graphs.append(g)
    streams = [tp.cuda.Stream() for _ in range(n)]

    def run(k):
        for _ in range(250):
            graphs[k].replay(streams[k])

    threads = [threading.Thread(target=run, args=(k,)) for k in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for s in streams:
        s.synchronize()
    for x in xs:
        assert x[:3].tolist() == [250.0] * 3
    with pytest.raises(TypeError):
        graphs[0].replay("stream")


def test_thread_local_captures_on_two_threads_do_not_interfere():
    xs = [tp.ones(1 << 10, device="cuda") for _ in range(2)]
    warm(lambda: xs[0] * 2)
    results, errors = {}, []
    barrier = threading.Barrier(2)

    def capture(k):
        try:
            g = CUDAGraph()
            g.capture_begin(capture_error_mode="thread_local")
            barrier.wait()                      # both captures are open at once
            y = xs[k] * (k + 2)
            barrier.wait()
            g.capture_end()
            g.replay()
            results[k] = (g, y.tolist()[:2])
        except BaseException as e:
            errors.append(e)
            barrier.abort()

    threads = [threading.Thread(target=capture, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert results[0][1] == [2.0, 2.0] and results[1][1] == [3.0, 3.0]
    assert results[0][0].pool_id != results[1][0].pool_id


def test_graph_keeps_the_storage_of_deleted_inputs_and_outputs_alive():
    """Delete every Python reference to the tensors a capture used, allocate
    aggressively, replay: the results are right and nothing else is overwritten."""
    w = tp.full((1 << 16,), 2.0, device="cuda")
    x = tp.full((1 << 16,), 3.0, device="cuda")
    warm(lambda: (x * w).sum())
    g = CUDAGraph()
    with tp.cuda.graph(g):
        y = x * w
        total = y.sum()
    assert g.kept_storages == 2          # w and x; y and total live in the graph's own pool
    total_ptr = total.data_ptr()
    del w, x, y
    gc.collect()
    fillers = [tp.full((1 << 16,), -1.0, device="cuda") for _ in range(64)]   # would reuse freed blocks
    g.replay()
    assert total.item() == 6.0 * (1 << 16)
    assert all(f[:4].tolist() == [-1.0] * 4 and f[-1].item() == -1.0 for f in fillers)
    assert total.data_ptr() == total_ptr
    del total, fillers
    g.reset()
    assert g.kept_storages == 0


def _replay_fails(g, match, exc=RuntimeError, stream=None):
    with pytest.raises(exc, match=match):
        g.replay() if stream is None else g.replay(stream)


def test_replay_after_reset_and_during_its_own_capture_raises():
    x = warm(lambda: tp.ones(4, device="cuda") + 0)
    g = CUDAGraph()
    with tp.cuda.graph(g):
        x.add_(1)
        _replay_fails(g, "still open")                # and the capture goes on
        with pytest.raises(RuntimeError, match="still open"):
            g.stage_and_launch([x], [x])
        x.mul_(2)
    g.replay()
    assert x.tolist() == [4.0] * 4
    g.reset()
    _replay_fails(g, "reset")
    with pytest.raises(RuntimeError, match="reset"):
        g.stage_and_launch([x], [x])
    assert x.tolist() == [4.0] * 4


def test_replay_in_a_forked_child_raises_and_the_parent_goes_on():
    import os
    x = warm(lambda: tp.zeros(4, device="cuda") + 0)
    g = CUDAGraph()
    with tp.cuda.graph(g):
        x.add_(1)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:                                        # child: report and leave without cleanup
        try:
            g.replay()
            msg = "replayed"
        except tp.cuda.CudaUnavailableError as exc:
            msg = "ok " + str(exc)
        except BaseException as exc:                    # noqa: BLE001 - any other outcome is the failure
            msg = f"{type(exc).__name__}: {exc}"
        os.write(write, msg.encode()[:4000])
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as f:
        msg = f.read()
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
    assert msg.startswith("ok ") and "forked" in msg, msg
    g.replay()
    assert x.tolist() == [1.0] * 4


@pytest.mark.multigpu
def test_replay_on_a_stream_of_another_device_raises():
    x = warm(lambda: tp.zeros(4, device="cuda:0") + 0)
    g = CUDAGraph()
    with tp.cuda.graph(g):
        x.add_(1)
    other = tp.cuda.Stream(device=1)
    _replay_fails(g, "cuda:0.*cuda:1", ValueError, stream=other)
    g.replay()
    assert x.tolist() == [1.0] * 4


@pytest.mark.parametrize("mode", ["global", "thread_local", "relaxed"])
def test_first_use_of_a_kernel_inside_a_capture_loads_it(mode):
    """Compiling and loading a kernel nobody used before happens inside the
    capture (the module load relaxes the thread's capture mode)."""
    import time
    k = tp.cuda.ElementwiseKernel("float32 x", "float32 y", f"y = x * 3 + {time.time_ns() % 1000}",
                                  f"first_use_{mode}")
    x = tp.arange(8, dtype=tp.float32, device="cuda")
    g = CUDAGraph()
    with tp.cuda.graph(g, capture_error_mode=mode):
        y = k(x)
    g.replay()
    want = k(x).cpu().numpy()                   # the same kernel, eagerly
    np.testing.assert_array_equal(y.cpu().numpy(), want)
    assert want[1] == 3 + want[0]


def test_concurrent_thread_local_captures_on_default_capture_streams():
    """Threads capturing at once each get their own side stream, and one
    capture's upload never lands in another's capture."""
    errors = []
    start = threading.Barrier(3)

    def capturer(k):
        try:
            s = tp.cuda.Stream()
            with tp.cuda.stream(s):
                a = tp.full((64,), float(k), device="cuda")
                (a * 2 + 1)[0].item()
                start.wait()
                for i in range(100):
                    g = CUDAGraph()
                    with tp.cuda.graph(g, capture_error_mode="thread_local"):
                        b = a * 2 + i
                    g.replay()
                    if b[0].item() != 2 * k + i:
                        errors.append((k, i, b[0].item()))
                    g.reset()
        except BaseException as exc:          # noqa: BLE001 - reported below
            errors.append((k, repr(exc)))

    threads = [threading.Thread(target=capturer, args=(k,)) for k in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[:5]
