# SPDX-License-Identifier: Apache-2.0
"""Composition on the GPU: a captured graph replayed inside another capture
becomes a child graph node (in WHILE bodies, in two parents, nested), keeps
its memory alive after the user drops it, and refuses what the driver would;
host functions, eagerly and as host nodes; event nodes ordering two graphs
on two streams."""

import gc
import time

import numpy as np
import pytest

import tensorplay as tp
from helpers import counted_loop, slow_writer, warm
from tensorplay._testing import run_deferred_teardown
from tensorplay.cuda import CUDAGraph

pytestmark = pytest.mark.cuda

N = 1 << 20          # 4 MiB of float32


def _step_graph(x, scale=2.0):
    """A graph of ``x = x * scale + 1`` through a temporary of its own pool."""
    warm(lambda: x.copy_(x * scale + 1.0))
    g = CUDAGraph()
    with tp.cuda.graph(g):
        x.copy_(x * scale + 1.0)
    return g


def _expected(start, steps, scale=2.0):
    v = np.float32(start)
    for _ in range(steps):
        v = v * np.float32(scale) + np.float32(1.0)
    return v


def test_a_child_in_a_while_body_runs_each_iteration():
    x = tp.zeros(N, device="cuda")
    child = _step_graph(x)
    parent, c, _ = counted_loop(child.replay, 5)
    x.zero_()
    parent.replay()
    assert np.unique(x.numpy()).tolist() == [_expected(0, 5)]
    assert c.item() == 5
    parent.replay()
    assert np.unique(x.numpy()).tolist() == [_expected(_expected(0, 5), 5)]


def test_the_same_child_in_two_parents_and_a_child_of_a_child():
    x = tp.zeros(N, device="cuda")
    child = _step_graph(x)
    p1, _, _ = counted_loop(child.replay, 3)
    p2 = CUDAGraph()
    with tp.cuda.graph(p2):
        child.replay()
        x.add_(10.0)
        child.replay()
    grand = CUDAGraph()
    with tp.cuda.graph(grand):
        p2.replay()
        p2.replay()
    x.zero_()
    p1.replay()
    assert np.unique(x.numpy()).tolist() == [_expected(0, 3)]
    x.zero_()
    p2.replay()
    want = _expected(_expected(0, 1) + 10.0, 1)
    assert np.unique(x.numpy()).tolist() == [want]
    x.zero_()
    grand.replay()
    assert np.unique(x.numpy()).tolist() == [_expected(_expected(want, 1) + 10.0, 1)]
    desc = grand.describe()
    graphs = [n for n in desc["nodes"] if n["kind"] == "graph"]
    assert len(graphs) == 2 and graphs[0]["bodies"][0]["label"] == "child graph"
    inner = graphs[0]["bodies"][0]
    assert [n["kind"] for n in inner["nodes"]].count("graph") == 2
    dot = tp.cuda.to_dot(desc)
    assert dot.count('label="child graph"') == 6      # 2 children, each with 2 of their own


def test_the_parent_keeps_the_childs_memory_after_the_child_is_dropped():
    x = tp.zeros(N, device="cuda")
    child = _step_graph(x)
    pool = child.pool_id
    parent, _, _ = counted_loop(child.replay, 2)
    del child
    gc.collect()
    before = tp.cuda.memory_allocated()
    for _ in range(3):
        x.zero_()
        parent.replay()
        assert np.unique(x.numpy()).tolist() == [_expected(0, 2)]
    assert tp.cuda.memory_allocated() == before
    tp.cuda.synchronize()
    tp.cuda.empty_cache()                                # only the pools' segments stay reserved
    reserved = tp.cuda.memory_reserved()
    stats = {k: v for k, v in tp.cuda.memory_stats().items() if k.startswith(f"pool.{pool}.")}
    assert stats[f"pool.{pool}.graph_refs"] == 1        # the parent's hold, the child graph gone
    parent.reset()
    gc.collect()
    tp.cuda.synchronize()
    tp.cuda.empty_cache()
    # the child's pool (its 4 MiB temporary) went with the parent
    left = {k: v for k, v in tp.cuda.memory_stats().items() if k.startswith(f"pool.{pool}.")}
    assert left == {}, (stats, left)
    assert reserved - tp.cuda.memory_reserved() >= N * 4


def test_refusals_leave_the_capture_usable():
    x = tp.zeros(N, device="cuda")
    looped, _, _ = counted_loop(_step_graph(x).replay, 2)
    shared_pool = tp.cuda.graph_pool_handle()
    same_pool = CUDAGraph()
    warm(lambda: x.add_(1.0))
    with tp.cuda.graph(same_pool, pool=shared_pool):
        x.add_(1.0)
    g = CUDAGraph()
    with tp.cuda.graph(g, pool=shared_pool):
        with pytest.raises(RuntimeError, match="conditional nodes"):
            looped.replay()
        with pytest.raises(RuntimeError, match="memory pool"):
            same_pool.replay()
        x.add_(2.0)                          # the capture goes on
    x.zero_()
    g.replay()
    assert np.unique(x.numpy()).tolist() == [2.0]


def test_replay_inside_another_librarys_capture_embeds_the_graph():
    """Inside a capture that is not tensorplay's (here the driver API's),
    replay() adds the graph as a child graph node held by a user object of
    that graph, which keeps its pool after the graph object is dropped;
    staging and rebinding, which cannot be captured, refuse before
    launching and leave that capture intact."""
    from cuda.bindings import driver
    ok = driver.CUresult.CUDA_SUCCESS
    x = tp.zeros(N, device="cuda")
    child = _step_graph(x)
    pool = child.pool_id
    err, s = driver.cuStreamCreate(1)
    assert err == ok
    try:
        theirs = tp.cuda.ExternalStream(int(s))  # before the capture: asking a capturing stream its device fails
        assert driver.cuStreamBeginCapture(
            s, driver.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)[0] == ok
        with tp.cuda.stream(theirs):
            for call in (lambda: child.stage_and_launch([x], [x]), lambda: child.rebind_and_launch([x], [x])):
                with pytest.raises(tp.cuda.CudaError, match="left intact") as info:
                    call()
                assert info.value.name == "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED"
        child.replay(theirs)
        child.replay(int(s))                      # a raw handle: the device is the graph's
        err, status = driver.cuStreamIsCapturing(s)
        assert status == driver.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_ACTIVE
        err, graph = driver.cuStreamEndCapture(s)
        assert err == ok
        err, _, n = driver.cuGraphGetNodes(graph, 0)
        assert err == ok and n == 2
        err, exe = driver.cuGraphInstantiate(graph, 0)
        assert err == ok
        del child
        gc.collect()
        assert _pool_refs(pool) == 2                         # the two embeddings' holds
        x.zero_()
        tp.cuda.synchronize()
        assert driver.cuGraphLaunch(exe, s)[0] == ok
        assert driver.cuStreamSynchronize(s)[0] == ok
        assert np.unique(x.numpy()).tolist() == [_expected(0, 2)]
        driver.cuGraphExecDestroy(exe)
        driver.cuGraphDestroy(graph)
    finally:
        driver.cuStreamDestroy(s)
    deadline = time.monotonic() + 10
    while _pool_refs(pool) and time.monotonic() < deadline:    # destructors run on a driver thread
        time.sleep(0.01)
        run_deferred_teardown()
    assert _pool_refs(pool) == 0


def _pool_refs(pool):
    gc.collect()
    tp.cuda.synchronize()
    tp.cuda.empty_cache()
    return tp.cuda.memory_stats().get(f"pool.{pool}.graph_refs", 0)


def test_rebind_and_stage_reach_into_a_child():
    static = tp.zeros(N, device="cuda")
    out = tp.zeros(N, device="cuda")
    warm(lambda: tp.add(static, 1.0, out=out))
    child = CUDAGraph()
    with tp.cuda.graph(child):
        tp.add(static, 1.0, out=out)
    parent = CUDAGraph()
    with tp.cuda.graph(parent):
        child.replay()
    looped, _, _ = counted_loop(child.replay, 2)                   # the child inside a WHILE body
    for g in (parent, looped):
        assert g.rebindable([static], [out]) == [True, True]       # patched inside the child
        for v in (3.0, 4.0):
            inp = tp.full((N,), v, device="cuda")
            result = tp.zeros(N, device="cuda")
            g.rebind_and_launch([static], [inp], [out], [result])
            assert np.unique(result.numpy()).tolist() == [v + 1.0]
            assert g._rebind_patch_calls > 0
            g.stage_and_launch([static], [inp + 1.0])
            assert np.unique(out.numpy()).tolist() == [v + 2.0]
        static.fill_(7.0)
        child.replay()                           # the child's own executable still reads its statics
        assert np.unique(out.numpy()).tolist() == [8.0]


def test_host_functions_run_once_per_call_and_per_replay_in_order():
    seen = []
    x = tp.zeros(4, device="cuda")
    for k in range(3):
        x.add_(1.0)
        tp.cuda.launch_host_func(lambda k=k: seen.append(("eager", k)))
    tp.cuda.synchronize()
    assert seen == [("eager", 0), ("eager", 1), ("eager", 2)]
    seen.clear()
    g = CUDAGraph()
    warm(lambda: x.add_(1.0))
    with tp.cuda.graph(g):
        x.add_(1.0)
        tp.cuda.launch_host_func(lambda: seen.append("a"))
        x.add_(1.0)
        tp.cuda.launch_host_func(lambda: seen.append("b"))
    assert seen == []                          # capturing runs nothing
    for _ in range(3):
        g.replay()
    tp.cuda.synchronize()
    assert seen == ["a", "b"] * 3
    assert g.describe()["nodes"][1]["kind"] == "host"


def test_a_host_function_reads_a_while_loops_progress_from_pinned_memory():
    """The use case: a WHILE loop counts its iterations on the device; a copy
    to pinned memory and a host function after the loop report it."""
    progress = tp.zeros(1, dtype=tp.int32).pin_memory()
    reports = []

    def report(counter):
        progress.copy_(counter)                # device to pinned memory, in stream order
        tp.cuda.launch_host_func(lambda: reports.append(int(progress.numpy()[0])))
    g, _, lim = counted_loop(lambda: None, 0, after=report)
    for n in (3, 7, 1):
        lim.fill_(n)
        g.replay()
    tp.cuda.synchronize()
    assert reports == [3, 7, 1]


def test_host_function_exceptions_surface_at_the_next_synchronize():
    def boom():
        raise ValueError("from the host function")
    tp.cuda.launch_host_func(boom)
    with pytest.raises(tp.cuda.HostFunctionError, match="ValueError: from the host function") as info:
        tp.cuda.synchronize()
    assert isinstance(info.value.__cause__, ValueError)
    tp.cuda.synchronize()                      # raised once
    s = tp.cuda.Stream()
    g = CUDAGraph()
    with tp.cuda.graph(g):
        tp.cuda.launch_host_func(boom)
    g.replay(s)
    g.replay(s)
    with pytest.raises(tp.cuda.HostFunctionError, match="1 more raised after it"):
        s.synchronize()


def test_host_functions_and_event_nodes_are_refused_in_conditional_bodies():
    x = tp.zeros(4, device="cuda")
    yes = tp.ones(1, dtype=tp.bool, device="cuda")
    ev = tp.cuda.Event(external=True)
    warm(lambda: x.add_(1.0))
    g = CUDAGraph()
    with tp.cuda.graph(g):
        with g.if_(yes):
            with pytest.raises(RuntimeError, match="the then branch of an IF node"):
                tp.cuda.launch_host_func(lambda: None)
            with pytest.raises(RuntimeError, match="conditional bodies"):
                ev.record()
            with pytest.raises(RuntimeError, match="conditional bodies"):
                tp.cuda.current_stream().wait_event(ev)
            x.add_(1.0)                        # the capture goes on
    x.zero_()
    g.replay()
    assert x.numpy().tolist() == [1.0] * 4


def test_event_nodes_order_two_graphs_on_two_streams():
    slow_write = slow_writer()
    y = tp.zeros(N, device="cuda")
    z = tp.zeros(N, device="cuda")
    ev = tp.cuda.Event(external=True)
    warm(lambda: (slow_write(y, 1.0), tp.add(y, 1.0, out=z)))
    producer, consumer = CUDAGraph(), CUDAGraph()
    with tp.cuda.graph(producer):
        y.fill_(-5.0)
        slow_write(y, 3.0)
        ev.record()
    with tp.cuda.graph(consumer):
        tp.cuda.current_stream().wait_event(ev)
        tp.add(y, 1.0, out=z)
    kinds = [n["kind"] for n in producer.describe()["nodes"]] + [n["kind"] for n in consumer.describe()["nodes"]]
    assert "event_record" in kinds and "wait_event" in kinds
    s1, s2 = tp.cuda.Stream(), tp.cuda.Stream()
    for _ in range(3):
        z.zero_()
        tp.cuda.synchronize()
        producer.replay(s1)
        consumer.replay(s2)
        tp.cuda.synchronize()
        assert np.unique(z.numpy()).tolist() == [4.0]


def test_a_nested_graph_computes_what_the_same_work_flat_does():
    x = tp.zeros(N, device="cuda")
    child = _step_graph(x)
    nested = CUDAGraph()
    with tp.cuda.graph(nested):
        for _ in range(4):
            child.replay()
    flat = CUDAGraph()
    with tp.cuda.graph(flat):
        for _ in range(4):
            x.copy_(x * 2.0 + 1.0)
    x.zero_()
    nested.replay()
    a = x.numpy().copy()
    x.zero_()
    flat.replay()
    assert np.array_equal(a, x.numpy())
