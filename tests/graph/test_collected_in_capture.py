# SPDX-License-Identifier: Apache-2.0
"""Objects of earlier work dying while a later capture is open, or on the
driver's thread: graphs with children, host nodes and staging executables,
modules, PyTorch pools. Each used to break the capture or the process
(a capture invalidated by a module unload, a segfault at capture end, an
abort in PyTorch's allocator); their teardown now waits for the capture to
end (tensorplay._driver.teardown)."""

import gc
import textwrap
import weakref

import numpy as np
import pytest

import tensorplay as tp
from helpers import graph_objects, run_python, warm
from tensorplay._driver.launch import Module
from tensorplay._kernels import nvrtc as _nvrtc
from tensorplay._kernels.cache import device_arch
from tensorplay._testing import deferred_teardown_count, run_deferred_teardown
from tensorplay.cuda import CUDAGraph

pytestmark = pytest.mark.cuda

N = 1 << 20          # 4 MiB of float32


class Cycle:
    """Keeps what it holds alive until the collector finds the cycle."""

    def __init__(self, *things):
        self.things = things
        self.me = self


def _garbage_graphs(x):
    """Graphs of every kind that teardown destroys, in reference cycles:
    a parent with a child graph node, a graph with a host node, a graph
    with a staging executable."""
    warm(lambda: x.add_(1.0))
    child = CUDAGraph()
    with tp.cuda.graph(child):
        x.add_(1.0)
    parent = CUDAGraph()
    with tp.cuda.graph(parent):
        child.replay()
    seen = []
    host = CUDAGraph()
    with tp.cuda.graph(host):
        x.add_(1.0)
        tp.cuda.launch_host_func(lambda: seen.append(1))
    staged = CUDAGraph()
    static = tp.zeros(N, device="cuda")
    with tp.cuda.graph(staged):
        x.add_(static)
    staged.stage_and_launch([static], [tp.ones(N, device="cuda")])
    tp.cuda.synchronize()
    return Cycle(child, parent, host, staged, static)


def _capture_across_a_collection(x):
    """A capture with a kernel before and after a full collection; replayed."""
    warm(lambda: x.mul_(2.0))
    g = CUDAGraph()
    with tp.cuda.graph(g):
        x.mul_(2.0)
        gc.collect()                       # earlier graphs and modules die here
        x.add_(3.0)                        # the capture is still valid
    x.fill_(1.0)
    g.replay()
    assert np.unique(x.numpy()).tolist() == [5.0]
    return g


def test_graphs_collected_inside_a_capture_are_destroyed_after_it():
    x = tp.zeros(N, device="cuda")
    gc.collect()                    # an earlier test's garbage in this worker must not count as ours
    before = graph_objects()
    ref = weakref.ref(_garbage_graphs(x))
    assert graph_objects() > before
    g = _capture_across_a_collection(x)
    assert ref() is None
    assert deferred_teardown_count() == 0           # the capture's end ran what waited
    del g
    gc.collect()
    assert graph_objects() == before


def test_a_module_collected_inside_a_capture_is_unloaded_after_it():
    """cuModuleUnload synchronizes: inside a global-mode capture it would
    invalidate the capture (the first kernel after it failed)."""
    source = 'extern "C" __global__ void tp_unload_probe(float* x) { x[0] = 1.0f; }'
    modules = tp.cuda.live_driver_objects()["modules"]
    holder = Cycle(Module(_nvrtc.compile_cubin(source, "probe.cu", (), device_arch(0)), 0))
    assert tp.cuda.live_driver_objects()["modules"] == modules + 1
    del holder
    x = tp.zeros(N, device="cuda")
    _capture_across_a_collection(x)
    assert tp.cuda.live_driver_objects()["modules"] == modules


def test_a_graph_destroyed_inside_a_capture_waits_for_it_to_end():
    x = tp.zeros(N, device="cuda")
    holder = [_garbage_graphs(x)]
    before = graph_objects()
    warm(lambda: x.add_(1.0))
    g = CUDAGraph()
    with tp.cuda.graph(g):
        x.add_(1.0)
        holder.clear()
        gc.collect()
        assert deferred_teardown_count() > 0         # queued, not destroyed under the capture
        assert graph_objects() == before
        x.add_(1.0)
    assert deferred_teardown_count() == 0
    assert graph_objects()[1] < before[1]           # the executables went once it ended
    x.zero_()
    g.replay()
    assert np.unique(x.numpy()).tolist() == [2.0]


def test_what_a_host_node_keeps_is_dropped_on_the_main_thread():
    """A graph's host node keeps its function through a user object that the
    driver releases on a thread of its own when the executable goes; what
    the function holds (here a graph, which must not be destroyed from the
    driver's thread) is dropped on the main thread."""
    x = tp.zeros(N, device="cuda")
    kept = _garbage_graphs(x)
    ref = weakref.ref(kept)
    g = CUDAGraph()
    with tp.cuda.graph(g):
        x.add_(1.0)
        tp.cuda.launch_host_func(lambda kept=kept: kept)
    del kept
    g.replay()
    g.reset()                                        # the user object goes, perhaps on the driver's thread
    del g
    tp.cuda.synchronize()
    for _ in range(100):
        run_deferred_teardown()
        gc.collect()
        if ref() is None:
            break
    assert ref() is None


def test_an_eager_host_function_that_drops_the_last_reference_to_a_graph():
    """The function runs on the driver's thread: the graph it drops is
    destroyed later, on the main thread, not there (CUDA calls are not
    allowed on the driver's thread)."""
    x = tp.zeros(N, device="cuda")
    holder = [_garbage_graphs(x).things]           # no cycle: freed where the last reference goes
    gc.collect()
    before = graph_objects()
    tp.cuda.launch_host_func(holder.clear)
    tp.cuda.synchronize()                            # runs what the host function left
    gc.collect()
    run_deferred_teardown()
    assert holder == [] and graph_objects()[1] < before[1]
    assert deferred_teardown_count() == 0
    x.zero_()
    x.add_(1.0)                                      # the device is fine
    assert np.unique(x.numpy()).tolist() == [1.0]


def test_inside_pytorchs_capture_nothing_of_ours_is_torn_down():
    """Replaying a tensorplay graph on a stream PyTorch captures adds it to
    that capture as a child graph (PyTorch's capture stays valid, and its
    replay runs ours), and a tensorplay graph holding a PyTorch pool that
    dies inside that capture waits for it to end: letting the pool go there
    tripped PyTorch's allocator (an abort)."""
    pytest.importorskip("torch")
    code = textwrap.dedent("""
        import gc
        import torch
        import tensorplay as tp
        x = torch.zeros(1 << 20, device="cuda")
        x.add_(1)
        g = tp.cuda.CUDAGraph()
        with tp.cuda.graph(g):              # PyTorch's kernel and temporary, in PyTorch's pool for g
            y = x * 2
            x.copy_(y)
        del y
        s = torch.cuda.Stream()
        theirs = tp.cuda.ExternalStream(s.cuda_stream)
        tx = torch.zeros(4, device="cuda")
        tg = torch.cuda.CUDAGraph()
        with torch.cuda.graph(tg, stream=s):
            tx.add_(1)
            try:
                g.replay(theirs)
            except tp.cuda.CudaError as exc:
                print("refused", exc.name)
            cycle = [g]
            cycle.append(cycle)            # only the collector frees it
            del g, cycle
            gc.collect()
            tx.add_(1)
        tg.replay()
        torch.cuda.synchronize()
        print("values", tx.tolist())
        print("x", x[0].item())
        tp.cuda.synchronize()
        gc.collect()
        tp.cuda.synchronize()
        print("done")
    """)
    r = run_python(code)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "refused" not in r.stdout
    assert "values [2.0, 2.0, 2.0, 2.0]" in r.stdout and "done" in r.stdout
    assert "x 2.0" in r.stdout                  # PyTorch's replay ran our graph: x = x * 2 once
