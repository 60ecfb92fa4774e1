# SPDX-License-Identifier: Apache-2.0
"""CUDAGraph.stage_and_launch on the GPU: fast and fallback pairs against
copy_ then replay, validation before any copy, the current stream, the staged
executable kept apart from the captured graph (built once per list of static
inputs), conditional nodes and an empty graph."""

import numpy as np
import pytest

import tensorplay as tp
from helpers import graph_objects
from tensorplay._testing import stages_in_one_launch
from tensorplay.cuda import CUDAGraph

pytestmark = pytest.mark.cuda


def _graph_sum(statics):
    """A graph computing out = sum of statics (each of shape (n,))."""
    out = tp.zeros(statics[0].shape, device="cuda")
    acc = out + 0.0
    tp.cuda.synchronize()
    g = CUDAGraph()
    with tp.cuda.graph(g):
        out.zero_()
        for s in statics:
            out.add_(s.to(tp.float32))
    return g, out


@pytest.mark.parametrize("n_inputs", [1, 8, 32, 129])
def test_fast_pairs_match_copy_and_replay(n_inputs, rng):
    statics = [tp.zeros(1024, device="cuda") for _ in range(n_inputs)]
    g, out = _graph_sum(statics)
    for _ in range(3):
        data = [rng.standard_normal(1024).astype(np.float32) for _ in range(n_inputs)]
        inputs = [tp.tensor(d, device="cuda") for d in data]
        g.stage_and_launch(statics, inputs)
        staged = out.numpy().copy()
        for s, i in zip(statics, inputs):
            s.copy_(i)
        g.replay()
        assert np.array_equal(staged, out.numpy())
        np.testing.assert_allclose(staged, np.sum(data, axis=0), rtol=1e-5, atol=1e-5)
        for s, d in zip(statics, data):
            assert np.array_equal(s.numpy(), d)


def test_fallback_pairs_match_copy_semantics(rng):
    shapes = (6, 5)
    statics = [tp.zeros(*shapes, device="cuda") for _ in range(6)]
    g, out = _graph_sum(statics)
    base = rng.standard_normal(shapes).astype(np.float32)
    inputs = [
        tp.tensor(base, device="cuda").to(tp.float16),            # other dtype
        tp.tensor(base.T.copy(), device="cuda").T,                # non-contiguous
        tp.tensor(base),                                          # CPU tensor
        base * 2,                                                 # NumPy array
        tp.tensor(base[0], device="cuda"),                        # broadcast row
        tp.tensor(base, device="cuda"),                           # a fast pair among them
    ]
    g.stage_and_launch(statics, inputs)
    expected = [base.astype(np.float16).astype(np.float32), base, base, base * 2,
                np.broadcast_to(base[0], shapes), base]
    for s, e in zip(statics, expected):
        assert np.array_equal(s.numpy(), e)
    np.testing.assert_allclose(out.numpy(), np.sum(expected, axis=0), rtol=1e-5, atol=1e-5)


def test_validation_errors_leave_static_buffers_untouched():
    statics = [tp.full((4,), 7.0, device="cuda") for _ in range(2)]
    g, out = _graph_sum(statics)
    good = tp.ones(4, device="cuda")
    with pytest.raises(ValueError, match="2 static inputs but 1"):
        g.stage_and_launch(statics, [good])
    with pytest.raises(TypeError, match="not a tensor"):
        g.stage_and_launch(statics, [good, "x"])
    with pytest.raises(ValueError, match="broadcast"):
        g.stage_and_launch(statics, [good, tp.ones(3, device="cuda")])
    with pytest.raises(TypeError, match="static_inputs\\[0\\]"):
        g.stage_and_launch([3, statics[1]], [good, good])
    with pytest.raises(TypeError, match="lists or tuples"):
        g.stage_and_launch(statics[0], good)
    for s in statics:
        assert s.tolist() == [7.0] * 4
    g.reset()
    with pytest.raises(RuntimeError, match="nothing to replay"):
        g.stage_and_launch(statics, [good, good])


def test_stage_and_launch_follows_the_current_stream():
    statics = [tp.zeros(256, device="cuda")]
    g, out = _graph_sum(statics)
    s = tp.cuda.Stream()
    with tp.cuda.stream(s):
        x = tp.full((256,), 3.0, device="cuda")
        g.stage_and_launch(statics, [x])
    s.synchronize()
    assert out[:2].tolist() == [3.0, 3.0]


def test_one_launch_staging_keeps_replay_and_describe_as_captured(rng):
    """The staged executable (copy node + graph) is separate: replay() never
    copies, describe() shows only captured work, table sizes can change, and
    reset() destroys what staging built."""
    base = graph_objects()
    statics = [tp.zeros(256, device="cuda") for _ in range(20)]
    g, out = _graph_sum(statics)
    nodes = len(g.describe()["nodes"])
    for n in (1, 20, 3, 20):                  # other lists of static inputs: a stager each
        data = [rng.standard_normal(256).astype(np.float32) for _ in range(n)]
        g.stage_and_launch(statics[:n], [tp.tensor(d, device="cuda") for d in data])
        assert stages_in_one_launch(g)
        want = np.sum(data, axis=0) + sum(s.numpy() for s in statics[n:])
        np.testing.assert_allclose(out.numpy(), want, rtol=1e-5, atol=1e-5)
    before = [s.numpy().copy() for s in statics]
    g.replay()                                 # the captured graph alone: no copies
    assert all(np.array_equal(s.numpy(), b) for s, b in zip(statics, before))
    assert len(g.describe()["nodes"]) == nodes
    g.reset()
    assert graph_objects() == base


def test_staging_builds_once_per_list_of_static_inputs(rng):
    """Alternating 9 and 8 pairs the copy kernel takes (one input made
    non-contiguous) reuses one staged executable; values stay right."""
    from tensorplay._testing import staged_builds
    statics = [tp.zeros(512, device="cuda") for _ in range(9)]
    g, out = _graph_sum(statics)
    data = [rng.standard_normal(512).astype(np.float32) for _ in range(9)]
    dense = [tp.tensor(d, device="cuda") for d in data]
    strided = tp.tensor(np.repeat(data[4], 2), device="cuda")[::2]   # same values, stride 2
    assert not strided.is_contiguous()
    g.stage_and_launch(statics, dense)
    builds = staged_builds()
    for k in range(10):
        inputs = list(dense)
        if k % 2:
            inputs[4] = strided               # 8 fast pairs and one copy_
        scale = float(k + 1)
        inputs[0] = dense[0] * scale
        g.stage_and_launch(statics, inputs)
        want = np.sum(data, axis=0) + (scale - 1.0) * data[0]
        np.testing.assert_allclose(out.numpy(), want, rtol=1e-5, atol=1e-5)
    assert staged_builds() == builds
    assert stages_in_one_launch(g)
    for k in range(3):                        # the same tensors again: new values are still copied
        g.stage_and_launch(statics, dense)
        np.testing.assert_allclose(out.numpy(), np.sum(data, axis=0) * 2.0 ** k, rtol=1e-5, atol=1e-5)
        for t in dense:
            t.mul_(2.0)


def test_staging_a_graph_with_conditional_nodes(rng):
    """The driver clones no graph with conditional nodes: staging launches
    the copy kernel, then the graph, with the same results."""
    x = tp.zeros(1024, device="cuda")
    flag = tp.tensor([True], device="cuda")
    out = tp.zeros(1024, device="cuda")
    (x * 2.0).add_(1.0)
    tp.cuda.synchronize()
    g = CUDAGraph()
    with tp.cuda.graph(g):
        out.copy_(x)
        g.begin_capture_to_if_node(flag)
        out.mul_(2.0)
        g.end_capture_to_conditional_node()
    for value in (True, False, True):
        d = rng.standard_normal(1024).astype(np.float32)
        g.stage_and_launch([x, flag], [tp.tensor(d, device="cuda"), tp.tensor([value], device="cuda")])
        np.testing.assert_allclose(out.numpy(), d * 2.0 if value else d, rtol=1e-6)
    assert not stages_in_one_launch(g)


def test_staging_an_empty_graph():
    """An empty capture has no root nodes: the staged executable is the copy alone."""
    static = tp.zeros(1024, device="cuda")
    g = CUDAGraph()
    with pytest.warns(UserWarning, match="empty"):
        with tp.cuda.graph(g):
            pass
    g.stage_and_launch([static], [tp.ones(1024, device="cuda")])
    assert stages_in_one_launch(g)
    assert static.tolist() == [1.0] * 1024


