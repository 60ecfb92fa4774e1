# SPDX-License-Identifier: Apache-2.0
"""stage_and_launch, tensorplay._stax.cudagraphs and make_graphed_callables."""

import gc
import warnings

import numpy as np
import pytest

import tensorplay as tp
from tensorplay._graph import cudagraphs
from tensorplay.cuda import CUDAGraph

pytestmark = pytest.mark.cuda


def _graph_objects():
    live = tp.cuda.live_driver_objects()
    return live["graphs"], live["execs"]


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


def _mlp_weights(rng, sizes):
    return [(tp.tensor((rng.standard_normal((a, b)) / np.sqrt(a)).astype(np.float32), device="cuda"),
             tp.tensor(rng.standard_normal(b).astype(np.float32) * 0.1, device="cuda"))
            for a, b in zip(sizes[:-1], sizes[1:])]


def test_cudagraphify_matches_eager_and_captures_once_per_signature(rng):
    weights = _mlp_weights(rng, [32, 64, 64, 10])

    def mlp(x, scale=1.0):
        h = x
        for k, (w, b) in enumerate(weights):
            h = h @ w + b
            if k < len(weights) - 1:
                h = h.relu()
        return h * scale

    graphed = cudagraphs.cudagraphify(mlp)
    for step in range(20):
        x = tp.tensor(rng.standard_normal((8, 32)).astype(np.float32), device="cuda")
        y = graphed(x)
        np.testing.assert_allclose(y.numpy(), mlp(x).numpy(), rtol=1e-5, atol=1e-5)
    assert graphed.num_captures == 1
    x16 = tp.tensor(rng.standard_normal((16, 32)).astype(np.float32), device="cuda")
    np.testing.assert_allclose(graphed(x16).numpy(), mlp(x16).numpy(), rtol=1e-5, atol=1e-5)
    assert graphed.num_captures == 2                 # a new shape: one new capture
    graphed(x16, 2.0)
    assert graphed.num_captures == 3                 # a new non-tensor value: one more
    np.testing.assert_allclose(graphed(x16, 2.0).numpy(), mlp(x16, 2.0).numpy(), rtol=1e-5, atol=1e-5)
    assert graphed.num_captures == 3
    pools = {g.pool_id for g, _, _ in graphed._entries.values()}
    assert len(pools) == 1
    a = graphed(x16)
    b = graphed(x16 * 0)
    assert a is b                                     # static outputs: overwritten by the next call
    c = cudagraphs.cudagraphify(mlp, clone_outputs=True)
    assert c(x16) is not c(x16)
    graphed.reset()
    assert not graphed._entries


def test_cudagraphify_rejects_bad_functions():
    x = tp.ones(4, device="cuda")
    with pytest.raises(TypeError, match="tensor or a tuple"):
        cudagraphs.cudagraphify(lambda t: 3)(x)
    with pytest.raises(TypeError, match="CUDA tensors"):
        cudagraphs.cudagraphify(lambda t: t)(tp.ones(2))
    with pytest.raises(TypeError, match="not hashable"):
        cudagraphs.cudagraphify(lambda t, opt: t)(x, [1])


def test_make_graphed_callables_share_a_pool(rng):
    w1, w2 = (tp.tensor(rng.standard_normal((16, 16)).astype(np.float32), device="cuda") for _ in range(2))
    f1 = lambda x: (x @ w1).tanh()
    f2 = lambda x: (x @ w2).relu()
    x = tp.tensor(rng.standard_normal((4, 16)).astype(np.float32), device="cuda")
    g1, g2 = tp.cuda.make_graphed_callables((f1, f2), ((x,), (x,)))
    assert g1.graph.pool_id == g2.graph.pool_id
    for _ in range(3):
        x = tp.tensor(rng.standard_normal((4, 16)).astype(np.float32), device="cuda")
        h = g1(x)
        np.testing.assert_allclose(h.numpy(), f1(x).numpy(), rtol=1e-5, atol=1e-5)
        y = g2(h)
        np.testing.assert_allclose(y.numpy(), f2(f1(x)).numpy(), rtol=1e-5, atol=1e-5)
    single = tp.cuda.make_graphed_callables(f1, (x,))
    np.testing.assert_allclose(single(x).numpy(), f1(x).numpy(), rtol=1e-5, atol=1e-5)


def test_one_launch_staging_keeps_replay_and_describe_as_captured(rng):
    """The staged executable (copy node + graph) is separate: replay() never
    copies, describe() shows only captured work, table sizes can change, and
    reset() destroys what staging built."""
    base = _graph_objects()
    statics = [tp.zeros(256, device="cuda") for _ in range(20)]
    g, out = _graph_sum(statics)
    nodes = len(g.describe()["nodes"])
    for n in (1, 20, 3, 20):                  # other lists of static inputs: a stager each
        data = [rng.standard_normal(256).astype(np.float32) for _ in range(n)]
        g.stage_and_launch(statics[:n], [tp.tensor(d, device="cuda") for d in data])
        assert g._stages_in_one_launch
        want = np.sum(data, axis=0) + sum(s.numpy() for s in statics[n:])
        np.testing.assert_allclose(out.numpy(), want, rtol=1e-5, atol=1e-5)
    before = [s.numpy().copy() for s in statics]
    g.replay()                                 # the captured graph alone: no copies
    assert all(np.array_equal(s.numpy(), b) for s, b in zip(statics, before))
    assert len(g.describe()["nodes"]) == nodes
    g.reset()
    assert _graph_objects() == base


def test_staging_builds_once_per_list_of_static_inputs(rng):
    """Alternating 9 and 8 pairs the copy kernel takes (one input made
    non-contiguous) reuses one staged executable; values stay right."""
    from tensorplay._graph.stager import staged_builds
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
    assert g._stages_in_one_launch
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
    assert not g._stages_in_one_launch


def test_staging_an_empty_graph():
    """An empty capture has no root nodes: the staged executable is the copy alone."""
    static = tp.zeros(1024, device="cuda")
    g = CUDAGraph()
    with pytest.warns(UserWarning, match="empty"):
        with tp.cuda.graph(g):
            pass
    g.stage_and_launch([static], [tp.ones(1024, device="cuda")])
    assert g._stages_in_one_launch
    assert static.tolist() == [1.0] * 1024


def _live_graphs():
    gc.collect()
    return _graph_objects()


def test_cudagraphify_evicts_and_resets_the_least_recently_used_graph(rng):
    x = tp.ones((2, 8), device="cuda")
    (x * 2.0).tanh()
    inputs = {n: tp.tensor(rng.standard_normal((n, 8)).astype(np.float32), device="cuda") for n in (1, 2, 3)}
    tp.cuda.synchronize()
    tp.cuda.empty_cache()
    base_live, base_alloc = _live_graphs(), tp.cuda.memory_allocated()

    def f(t):
        return (t * 2.0).tanh()
    graphed = cudagraphs.cudagraphify(f, max_graphs=2)
    graphed(inputs[1])
    # what one kept graph holds: its graph and executable, and its stager's clone of both
    per_graph = [now - base for now, base in zip(_live_graphs(), base_live)]
    assert per_graph[0] >= 1 and per_graph[1] >= 1
    for n in (1, 2, 1, 3):                 # 3 evicts 2, the least recently used
        np.testing.assert_allclose(graphed(inputs[n]).numpy(), np.tanh(inputs[n].numpy() * 2), rtol=1e-5)
    graphs = {key[0][1][0]: g for key, (g, _, _) in graphed._entries.items()}
    assert sorted(graphs) == [1, 3]
    assert _live_graphs() == (base_live[0] + 2 * per_graph[0], base_live[1] + 2 * per_graph[1])
    rebinds = 5 if hasattr(CUDAGraph, "rebind_and_launch") else 0     # an elementwise graph rebinds
    assert graphed.stats() == {"captures": 3, "replays": 5, "rebinds": rebinds, "evictions": 1, "fallbacks": 0,
                               "graphs": 2, "eager_signatures": 0}
    np.testing.assert_allclose(graphed(inputs[2]).numpy(), np.tanh(inputs[2].numpy() * 2), rtol=1e-5)
    assert not graphs[1].is_instantiated and graphs[3].is_instantiated       # 1 was least recent now
    assert graphed.stats()["evictions"] == 2
    graphed.reset()
    assert _live_graphs() == base_live
    tp.cuda.empty_cache()
    assert tp.cuda.memory_allocated() == base_alloc


def test_cudagraphify_runs_a_signature_eagerly_after_its_capture_fails():
    x = tp.ones(4, device="cuda")
    base_live = _live_graphs()

    def host_read(t):
        return t * t.sum().item()
    graphed = cudagraphs.cudagraphify(host_read)
    with pytest.warns(RuntimeWarning, match="could not be captured") as caught:
        y = graphed(x)
    assert len(caught) == 1
    assert y.tolist() == [4.0] * 4
    with warnings.catch_warnings():
        warnings.simplefilter("error")     # no second warning, no second capture attempt
        for k in range(3):
            z = tp.full((4,), float(k + 1), device="cuda")
            assert graphed(z).tolist() == [4.0 * (k + 1) ** 2] * 4
    assert graphed.stats() == {"captures": 0, "replays": 0, "rebinds": 0, "evictions": 0, "fallbacks": 4,
                               "graphs": 0, "eager_signatures": 1}
    assert _live_graphs() == base_live    # the failed capture left nothing behind
    y2 = graphed(tp.ones(6, device="cuda"))        # another signature: tried (and failing) again
    assert y2.tolist() == [6.0] * 6 and graphed.stats()["eager_signatures"] == 2


def test_make_graphed_callables_captures_into_the_given_pool(rng):
    x = tp.tensor(rng.standard_normal((4, 16)).astype(np.float32), device="cuda")
    pool = tp.cuda.graph_pool_handle()
    f = lambda t: (t * 3.0).relu()
    graphed = tp.cuda.make_graphed_callables(f, (x,), pool=pool)
    assert graphed.graph.pool_id == pool
    np.testing.assert_allclose(graphed(x).numpy(), np.maximum(x.numpy() * 3, 0), rtol=1e-6)
    other = tp.cuda.make_graphed_callables(f, (x,), pool=graphed.graph)
    assert other.graph.pool_id == pool
