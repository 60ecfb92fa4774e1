# SPDX-License-Identifier: Apache-2.0
"""Re-capture into a graph that holds an executable: cuGraphExecUpdate when
the topology matches, a transparent new instantiation when it does not."""

import gc

import numpy as np
import pytest

import tensorplay as tp
from helpers import graph_objects, warm
from tensorplay.cuda import CUDAGraph

cuda = pytest.mark.cuda


class _PoolRecorder(CUDAGraph):
    """A graph whose compiled begin only records the pool it is given, and
    which claims to hold an executable in pool 7: the Python pool rule alone."""

    is_instantiated = True
    is_capturing = False
    pool_id = 7

    def _capture_begin(self, pool_id, mode, stream, foreign=None):
        self.begun_with = pool_id


@pytest.fixture
def pool_ids(monkeypatch):
    """Pool ids without a GPU (graph_pool_handle() needs CUDA: a pool is device memory)."""
    from tensorplay._graph import graphs
    ids = iter(range(1000, 2000))
    monkeypatch.setattr(graphs, "graph_pool_handle", lambda: next(ids))


def test_recapture_keeps_the_previous_pool_unless_told_otherwise(pool_ids):
    g = _PoolRecorder()
    g.capture_begin()
    assert g.begun_with == 7
    g.capture_begin(pool=42)
    assert g.begun_with == 42
    g.capture_begin(pool=99)
    assert g.begun_with == 99


def test_first_capture_without_pool_gets_a_fresh_pool(pool_ids):
    class Fresh(_PoolRecorder):
        is_instantiated = False
        pool_id = None
    g = Fresh()
    g.capture_begin()
    h = Fresh()
    h.capture_begin()
    assert g.begun_with > 0 and h.begun_with > 0 and g.begun_with != h.begun_with


def test_update_result_is_none_before_any_capture():
    assert CUDAGraph().update_result is None


# ---------------------------------------------------------------- GPU

def _step(x):
    return (x * 2.0 + 1.0).relu().sum()


def _kernels_of_the_tests():
    """Compile the kernels of the tests (warm() runs it before the captures)."""
    x = tp.ones(256, device="cuda")
    _step(x)
    (x * 3.0).exp()


@cuda
def test_recapture_with_the_same_kernels_updates_the_executable_in_place(rng):
    warm(_kernels_of_the_tests)
    a_np = rng.standard_normal(256).astype(np.float32)
    b_np = rng.standard_normal(256).astype(np.float32)
    a = tp.tensor(a_np, device="cuda")
    b = tp.tensor(b_np, device="cuda")
    g = CUDAGraph()
    with tp.cuda.graph(g):
        ya = _step(a)
    handle, nodes, pool = g.exec_handle, g.num_nodes, g.pool_id
    g.replay()
    expected_a = np.maximum(a_np * 2 + 1, 0).sum()
    assert ya.item() == pytest.approx(expected_a, rel=1e-5)
    with tp.cuda.graph(g):                 # the same kernels on other tensors: only pointers change
        yb = _step(b)
    assert g.update_result == "success"
    assert g.exec_handle == handle
    assert g.is_instantiated and g.num_nodes == nodes and g.pool_id == pool
    g.replay()
    assert yb.item() == pytest.approx(np.maximum(b_np * 2 + 1, 0).sum(), rel=1e-5)
    b.fill_(1.0)
    g.replay()
    assert yb.item() == pytest.approx(3.0 * 256)


@cuda
def test_recapture_with_another_topology_instantiates_a_new_executable(rng):
    warm(_kernels_of_the_tests)
    x_np = rng.standard_normal(256).astype(np.float32)
    x = tp.tensor(x_np, device="cuda")
    g = CUDAGraph()
    with tp.cuda.graph(g):
        y = _step(x)
    handle, nodes = g.exec_handle, g.num_nodes
    with tp.cuda.graph(g):                 # more nodes: the update must be refused
        y = _step(x)
        z = (x * 3.0).exp()
    assert g.update_result not in (None, "success")
    assert g.exec_handle not in (0, handle)
    assert g.is_instantiated and g.num_nodes > nodes
    g.replay()
    assert y.item() == pytest.approx(np.maximum(x_np * 2 + 1, 0).sum(), rel=1e-5)
    np.testing.assert_allclose(z.numpy(), np.exp(x_np * 3), rtol=1e-5)


@cuda
def test_recaptures_hold_one_graph_and_one_executable_and_reset_frees_them():
    warm(_kernels_of_the_tests)
    x = tp.ones(256, device="cuda")
    gc.collect()
    tp.cuda.synchronize()
    tp.cuda.empty_cache()
    base_live, base_alloc = graph_objects(), tp.cuda.memory_allocated()
    g = CUDAGraph()
    results = []
    for k in range(6):
        extra = (k // 2) % 2               # topologies 0 0 1 1 0 0: updates and fallbacks both
        with tp.cuda.graph(g):
            y = _step(x)
            if extra:
                y = y + 1.0
        results.append(g.update_result)
        g.replay()
        assert y.item() == 3.0 * 256 + extra
        # an executable updated in place keeps the graph it was instantiated
        # from (its nodes name the executable's for SetParams): one graph more
        updated = g.update_result == "success"
        assert graph_objects() == (base_live[0] + 1 + updated, base_live[1] + 1)
        del y
    assert results[0] is None and results[1] == results[3] == results[5] == "success"
    assert all(r not in (None, "success") for r in (results[2], results[4]))
    g.reset()
    assert not g.is_instantiated and g.exec_handle == 0 and g.num_nodes == 0 and g.update_result is None
    gc.collect()
    tp.cuda.empty_cache()
    assert graph_objects() == base_live
    assert tp.cuda.memory_allocated() == base_alloc


@cuda
def test_recapture_drops_the_stager_of_the_previous_graph():
    warm(_kernels_of_the_tests)
    static = tp.zeros(256, device="cuda")
    g = CUDAGraph()
    with tp.cuda.graph(g):
        y = _step(static)
    g.stage_and_launch([static], [tp.ones(256, device="cuda")])
    assert y.item() == 3.0 * 256
    with tp.cuda.graph(g):                 # same static input, other work
        y2 = (static * 3.0).exp().sum()
    g.stage_and_launch([static], [tp.full((256,), 0.5, device="cuda")])
    assert y2.item() == pytest.approx(256 * np.exp(1.5), rel=1e-5)


@cuda
def test_recapture_into_another_pool_when_asked():
    warm(_kernels_of_the_tests)
    x = tp.ones(256, device="cuda")
    g = CUDAGraph()
    with tp.cuda.graph(g):
        _step(x)
    first = g.pool_id
    with tp.cuda.graph(g):
        _step(x)
    assert g.pool_id == first
    other = tp.cuda.graph_pool_handle()
    with tp.cuda.graph(g, pool=other):
        y = _step(x)
    assert g.pool_id == other
    g.replay()
    assert y.item() == 3.0 * 256


@cuda
def test_a_failed_recapture_resets_the_graph():
    warm(_kernels_of_the_tests)
    base = graph_objects()
    x = tp.ones(256, device="cuda")
    g = CUDAGraph()
    with tp.cuda.graph(g):
        _step(x)
    with pytest.raises(ZeroDivisionError):
        with tp.cuda.graph(g):
            _step(x)
            1 / 0
    assert not g.is_instantiated and not g.is_capturing
    assert graph_objects() == base
    with tp.cuda.graph(g):                 # and it captures again
        y = _step(x)
    g.replay()
    assert y.item() == 3.0 * 256


@cuda
@pytest.mark.multigpu
def test_recapture_on_another_device_is_refused_before_capturing():
    x = tp.ones(4, device="cuda:0")
    g = CUDAGraph()
    with tp.cuda.graph(g):
        x.add_(1)
    with tp.cuda.device(1):
        with pytest.raises(ValueError, match="same device"):
            g.capture_begin()
    assert g.is_instantiated and not g.is_capturing


def _counting(g, limit, c, pred, extra=False):
    with tp.cuda.graph(g):
        c.zero_()
        tp.lt(c, limit, out=pred)
        g.begin_capture_to_while_node(pred)
        c.add_(1)
        if extra:
            c.add_(0)
        tp.lt(c, limit, out=pred)
        g.end_capture_to_conditional_node()


@cuda
def test_recapture_of_a_while_graph_counts_right_updated_or_not():
    c = tp.zeros(1, dtype=tp.int32, device="cuda")
    pred = tp.zeros(1, dtype=tp.bool, device="cuda")
    c.add_(1)
    tp.lt(c, c, out=pred)
    tp.cuda.synchronize()
    lim5 = tp.full((1,), 5, dtype=tp.int32, device="cuda")
    lim9 = tp.full((1,), 9, dtype=tp.int32, device="cuda")
    g = CUDAGraph()
    _counting(g, lim5, c, pred)
    g.replay()
    assert c.item() == 5
    _counting(g, lim9, c, pred)           # same topology, another limit tensor
    assert g.update_result is not None    # "success", or the driver's reason for instantiating
    g.replay()
    assert c.item() == 9
    handle = g.exec_handle
    _counting(g, lim5, c, pred, extra=True)   # the body changed: a new executable
    assert g.update_result not in (None, "success") and g.exec_handle != handle
    g.replay()
    assert c.item() == 5
    assert len(g.describe()["nodes"]) == g.num_nodes


@cuda
def test_recapture_from_plain_to_conditional_and_back():
    c = tp.zeros(1, dtype=tp.int32, device="cuda")
    pred = tp.zeros(1, dtype=tp.bool, device="cuda")
    lim = tp.full((1,), 4, dtype=tp.int32, device="cuda")
    c.add_(1)
    tp.lt(c, lim, out=pred)
    tp.cuda.synchronize()
    g = CUDAGraph()
    with tp.cuda.graph(g):
        c.add_(1)
    _counting(g, lim, c, pred)
    g.replay()
    assert c.item() == 4
    assert [n["kind"] for n in g.describe()["nodes"]].count("conditional") == 1
    with tp.cuda.graph(g):
        c.add_(1)
    g.replay()
    assert c.item() == 5
    assert "conditional" not in [n["kind"] for n in g.describe()["nodes"]]
