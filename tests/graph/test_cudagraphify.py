# SPDX-License-Identifier: Apache-2.0
"""cudagraphify on the GPU: the same results as eager, one capture per
signature, static outputs, argument errors, the least recently used graph
evicted and reset, and the eager fallback after a failed capture.
(test_cudagraphify_cpu.py covers the bookkeeping without a GPU,
test_cudagraphify_rebind.py the rebinding of inputs.)"""

import gc
import warnings

import numpy as np
import pytest

import tensorplay as tp
from helpers import graph_objects
from tensorplay._graph import cudagraphs

pytestmark = pytest.mark.cuda


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


def _live_graphs():
    gc.collect()
    return graph_objects()


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
    # an elementwise graph rebinds: every replay is a rebind
    assert graphed.stats() == {"captures": 3, "replays": 5, "rebinds": 5, "evictions": 1, "fallbacks": 0,
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
    # one warning of ours (another library followed in the capture may add a DeprecationWarning)
    assert len([w for w in caught if issubclass(w.category, RuntimeWarning)]) == 1
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
