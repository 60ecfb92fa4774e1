# SPDX-License-Identifier: Apache-2.0
"""cudagraphify on the GPU with CUDAGraph.rebind_and_launch: a graph whose
every input is rebindable reads the caller's tensors (no staging copy), any
other graph stages; the outputs are the graph's static outputs either way."""

import numpy as np
import pytest

import tensorplay as tp
from tensorplay._graph import cudagraphs

pytestmark = pytest.mark.cuda


def _cuda(a):
    return tp.tensor(np.asarray(a, dtype=np.float32), device="cuda")


def test_an_elementwise_function_rebinds_and_matches_numpy(rng):
    def f(x, y):
        return x * 2.0 + 1.0, x * y

    graphed = cudagraphs.cudagraphify(f)
    first = None
    for step in range(5):
        a, b = rng.standard_normal(1000).astype(np.float32), rng.standard_normal(1000).astype(np.float32)
        out = graphed(_cuda(a), _cuda(b))
        first = first or out
        assert out is first                                  # the static outputs, overwritten each call
        np.testing.assert_allclose(out[0].numpy(), a * 2 + 1, rtol=1e-6)
        np.testing.assert_allclose(out[1].numpy(), a * b, rtol=1e-6)
    st = graphed.stats()
    assert st["captures"] == 1 and st["replays"] == st["rebinds"] == 5
    (g, static, _), = graphed._entries.values()
    assert g.rebindable(static) == [True, True]


def test_the_same_tensors_and_two_alternating_sets(rng):
    graphed = cudagraphs.cudagraphify(lambda x: x * 3.0)
    sets = [_cuda(rng.standard_normal(256)) for _ in range(2)]
    for k in range(6):
        x = sets[k % 2] if k >= 2 else sets[0]
        np.testing.assert_allclose(graphed(x).numpy(), x.numpy() * 3, rtol=1e-6)
    assert graphed.stats()["rebinds"] == 6


def test_a_matmul_input_stages(rng):
    w = _cuda(rng.standard_normal((16, 8)))
    graphed = cudagraphs.cudagraphify(lambda x: (x @ w).relu())
    for _ in range(3):
        a = rng.standard_normal((4, 16)).astype(np.float32)
        np.testing.assert_allclose(graphed(_cuda(a)).numpy(), np.maximum(a @ w.numpy(), 0), rtol=1e-5, atol=1e-5)
    st = graphed.stats()
    assert st["replays"] == 3 and st["rebinds"] == 0      # cuBLASLt reads x: not rebindable


def test_feeding_an_output_back_stages_that_call(rng):
    graphed = cudagraphs.cudagraphify(lambda x: x * 0.5 + x.sum())
    a = rng.standard_normal(64).astype(np.float32)
    y = graphed(_cuda(a))
    want = a * 0.5 + a.sum()
    for _ in range(3):
        y = graphed(y)                                      # the graph's own static output as input
        want = want * 0.5 + want.sum()
        np.testing.assert_allclose(y.numpy(), want, rtol=1e-4, atol=1e-4)
    assert graphed.stats()["rebinds"] == 1 and graphed.stats()["replays"] == 4
    graphed(_cuda(a))
    assert graphed.stats()["rebinds"] == 2


def test_an_output_of_another_signature_stages(rng):
    graphed = cudagraphs.cudagraphify(lambda x, k: x * float(k))
    a = rng.standard_normal(32).astype(np.float32)
    y2 = graphed(_cuda(a), 2)                               # captured first
    y3 = graphed(_cuda(a), 3)                               # same pool, captured later
    np.testing.assert_allclose(graphed(y3, 2).numpy(), a * 6, rtol=1e-6)    # from the pool: staged
    np.testing.assert_allclose(y2.numpy(), a * 6, rtol=1e-6)
    assert graphed.stats()["rebinds"] == 2 and graphed.stats()["replays"] == 3


def test_an_output_aliasing_an_input_stages(rng):
    graphed = cudagraphs.cudagraphify(lambda x: (x, x * 2.0))
    for _ in range(3):
        a = rng.standard_normal(16).astype(np.float32)
        same, doubled = graphed(_cuda(a))
        np.testing.assert_array_equal(same.numpy(), a)     # the captured input, staged
        np.testing.assert_allclose(doubled.numpy(), a * 2, rtol=1e-6)
    assert graphed.stats()["rebinds"] == 0


def test_clone_outputs_with_rebinding(rng):
    graphed = cudagraphs.cudagraphify(lambda x: x + 1.0, clone_outputs=True)
    a, b = rng.standard_normal(8).astype(np.float32), rng.standard_normal(8).astype(np.float32)
    ya, yb = graphed(_cuda(a)), graphed(_cuda(b))
    np.testing.assert_allclose(ya.numpy(), a + 1, rtol=1e-6)
    np.testing.assert_allclose(yb.numpy(), b + 1, rtol=1e-6)
    assert graphed.stats()["rebinds"] == 2


def test_an_in_place_op_writes_the_callers_tensor_when_rebinding(rng):
    """Documented: with rebinding the kernels write the caller's tensor, as fn run eagerly does."""
    def f(x):
        x.mul_(2.0)
        return x + 1.0

    graphed = cudagraphs.cudagraphify(f, warmup=1)
    a = rng.standard_normal(8).astype(np.float32)
    x = _cuda(a)
    graphed(x)                       # first call: the warm-up and the capture's run write the static copy
    x2 = _cuda(a)
    y = graphed(x2)
    np.testing.assert_allclose(y.numpy(), a * 2 + 1, rtol=1e-6)
    np.testing.assert_allclose(x2.numpy(), a * 2, rtol=1e-6)
    assert graphed.stats()["rebinds"] == 2
