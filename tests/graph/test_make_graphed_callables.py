# SPDX-License-Identifier: Apache-2.0
"""make_graphed_callables on the GPU: callables graphed together share one
memory pool, a given pool (a handle or another graph) is used, results match
eager."""

import numpy as np
import pytest

import tensorplay as tp

pytestmark = pytest.mark.cuda


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


def test_make_graphed_callables_captures_into_the_given_pool(rng):
    x = tp.tensor(rng.standard_normal((4, 16)).astype(np.float32), device="cuda")
    pool = tp.cuda.graph_pool_handle()
    f = lambda t: (t * 3.0).relu()
    graphed = tp.cuda.make_graphed_callables(f, (x,), pool=pool)
    assert graphed.graph.pool_id == pool
    np.testing.assert_allclose(graphed(x).numpy(), np.maximum(x.numpy() * 3, 0), rtol=1e-6)
    other = tp.cuda.make_graphed_callables(f, (x,), pool=graphed.graph)
    assert other.graph.pool_id == pool
