# SPDX-License-Identifier: Apache-2.0
"""matmul, mv, addmm and linear on CUDA (cuBLASLt) against NumPy in float64:
shapes at the edges (1, odd, prime, empty, K = 0), batch broadcasting,
transposed, sliced and offset views, out= layouts, every float dtype, fused
epilogues, products in captured graphs replayed with new inputs, and the
workspace in the allocator's accounts."""

import threading

import numpy as np
import pytest

import tensorplay as tp
from helpers import activation_reference
from tensorplay._kernels import cublaslt as _cublaslt
from tensorplay._ops import blas as _blas

pytestmark = pytest.mark.cuda

TOL = {tp.float16: 2e-3, tp.bfloat16: 1.6e-2, tp.float32: 2e-6, tp.float64: 1e-13}
FLOATS = [tp.float16, tp.bfloat16, tp.float32, tp.float64]


def _cuda(rng, shape, d):
    """A CUDA tensor of dtype ``d`` and its values in float64 (after rounding to ``d``)."""
    t = tp.tensor(rng.standard_normal(shape).astype(np.float32), device="cuda").to(d)
    return t, t.cpu().to(tp.float64).numpy()


def _check(got, ref, d, k):
    """Within the error of a K-long dot product of standard normal values in
    ``d``: rounding of the inputs and the result, ~ eps * (|ref| + sqrt(K))."""
    assert got.shape == ref.shape, (got.shape, ref.shape)
    g = got.cpu().to(tp.float64).numpy()
    # plus float32 (float64) accumulation over K terms, whose partial sums grow as sqrt(K)
    acc_eps = 1.1e-16 if d is tp.float64 else 6e-8
    bound = TOL[d] * (np.abs(ref) + 2 * np.sqrt(max(k, 1))) + 5 * acc_eps * k
    bad = np.abs(g - ref) > bound
    assert not bad.any(), f"{bad.sum()} of {bad.size} off; worst {np.abs(g - ref).max()}"


SHAPES = [((1, 1), (1, 1)), ((1, 97), (97, 1)), ((7, 13), (13, 5)), ((127, 131), (131, 137)),
          ((1, 1024), (1024, 1024)), ((1000, 1), (1, 999)), ((33,), (33, 17)), ((17, 33), (33,)),
          ((33,), (33,)), ((3, 20, 9), (3, 9, 4)), ((20, 9), (2, 9, 4)), ((2, 1, 5, 9), (3, 9, 4)),
          ((4, 1, 8, 16), (1, 6, 16, 8)), ((0, 3), (3, 2)), ((2, 0), (0, 3)), ((5, 0, 7), (7, 3))]


@pytest.mark.parametrize("d", FLOATS)
@pytest.mark.parametrize("shapes", SHAPES, ids=lambda s: f"{s[0]}@{s[1]}")
def test_matmul_matches_numpy(rng, d, shapes):
    a, an = _cuda(rng, shapes[0], d)
    b, bn = _cuda(rng, shapes[1], d)
    got = a @ b
    assert got.dtype is d and got.is_cuda
    _check(got, np.matmul(an, bn), d, an.shape[-1])
    again = tp.matmul(a, b)            # the cached recipe gives the same product
    np.testing.assert_array_equal(again.cpu().to(tp.float64).numpy(), got.cpu().to(tp.float64).numpy())


@pytest.mark.parametrize("d", [tp.bfloat16, tp.float32])
@pytest.mark.parametrize("n", [1024, 2048])
def test_large_square_products(rng, d, n):
    a, an = _cuda(rng, (n, n), d)
    b, bn = _cuda(rng, (n, n), d)
    _check(a @ b, an @ bn, d, n)


def test_recipes_follow_new_data_and_alignment(rng):
    base, bn_ = _cuda(rng, (65, 64), tp.float32)
    w, wn = _cuda(rng, (64, 48), tp.float32)
    for _ in range(2):
        for lo in (0, 1):        # rows at an offset of 64 floats, then of 1 float (4-byte aligned)
            a = base[lo:lo + 64] if lo == 0 else base.flatten()[1:1 + 64 * 64].view(64, 64)
            an = a.cpu().to(tp.float64).numpy()
            _check(a @ w, an @ wn, tp.float32, 64)
        base.copy_(tp.tensor(rng.standard_normal((65, 64)).astype(np.float32)))


@pytest.mark.parametrize("d", [tp.float16, tp.float32, tp.float64])
def test_transposed_sliced_and_strided_operands(rng, d):
    a, an = _cuda(rng, (40, 30), d)
    b, bn = _cuda(rng, (50, 40), d)
    # transposed views pass as layouts (no copy): a.T (30, 40) @ b.T (40, 50)
    _check(a.T @ b.T, an.T @ bn.T, d, 40)
    # a column slice keeps a unit stride with a padded leading dimension
    _check(a[:, 3:23] @ b[:20, 5:9], an[:, 3:23] @ bn[:20, 5:9], d, 20)
    # no unit stride: copied first
    _check(a[:, ::2] @ b[:15, ::3], an[:, ::2] @ bn[:15, ::3], d, 15)
    # batched transposes
    x, xn = _cuda(rng, (6, 16, 12), d)
    y, yn = _cuda(rng, (6, 16, 10), d)
    _check(x.transpose(1, 2) @ y, np.swapaxes(xn, 1, 2) @ yn, d, 16)
    # a batch taken from a permuted tensor (batch stride not the largest)
    z, zn = _cuda(rng, (12, 6, 16), d)
    _check(z.permute(1, 0, 2) @ y, np.transpose(zn, (1, 0, 2)) @ yn, d, 16)
    # broadcast by expand (stride 0 batch)
    _check(a.unsqueeze(0).expand(3, 40, 30) @ b.T[:30].unsqueeze(0),
           np.broadcast_to(an, (3, 40, 30)) @ bn.T[:30][None], d, 30)


@pytest.mark.parametrize("layout", ["contiguous", "transposed", "strided"])
def test_out_in_any_layout(rng, layout):
    a, an = _cuda(rng, (24, 16), tp.float32)
    b, bn = _cuda(rng, (16, 20), tp.float32)
    if layout == "contiguous":
        out = tp.empty((24, 20), device="cuda")
    elif layout == "transposed":
        out = tp.empty((20, 24), device="cuda").T          # column-major: written in place
    else:
        out = tp.empty((24, 40), device="cuda")[:, ::2]     # no unit stride: through a temporary
    r = tp.matmul(a, b, out=out)
    assert r is out
    _check(out, an @ bn, tp.float32, 16)
    bout = tp.empty((3, 24, 20), device="cuda")
    tp.matmul(a.unsqueeze(0).expand(3, 24, 16), b, out=bout)
    _check(bout, np.broadcast_to(an @ bn, (3, 24, 20)), tp.float32, 16)


def test_k_zero_and_empty_results():
    a = tp.empty((4, 0), device="cuda")
    b = tp.empty((0, 3), device="cuda")
    assert (a @ b).tolist() == [[0.0] * 3] * 4
    out = tp.full((4, 3), 7.0, device="cuda")
    tp.matmul(a, b, out=out)
    assert out.tolist() == [[0.0] * 3] * 4
    assert (tp.empty((0, 5), device="cuda") @ tp.empty((5, 2), device="cuda")).shape == (0, 2)
    bias = tp.ones(3, device="cuda")
    np.testing.assert_array_equal(tp.addmm(bias, a, b, beta=2.0).numpy(), np.full((4, 3), 2.0))


def test_mv(rng):
    a, an = _cuda(rng, (300, 200), tp.float32)
    v, vn = _cuda(rng, (200,), tp.float32)
    _check(tp.mv(a, v), an @ vn, tp.float32, 200)
    _check(tp.mv(a.T, a[:, 0]), an.T @ an[:, 0], tp.float32, 300)     # strided vector


@pytest.mark.parametrize("d", FLOATS)
@pytest.mark.parametrize("activation", [None, "relu", "gelu"])
@pytest.mark.parametrize("bias_shape", [(37,), (1, 37), (29, 1), (29, 37), ()])
def test_addmm_matches_numpy(rng, d, activation, bias_shape):
    a, an = _cuda(rng, (29, 64), d)
    b, bn = _cuda(rng, (64, 37), d)
    bias, biasn = _cuda(rng, bias_shape, d)
    for beta, alpha in ((1, 1), (1, 0.5), (0.5, 2.0), (0, 1)):
        got = tp.addmm(bias, a, b, beta=beta, alpha=alpha, activation=activation)
        ref = activation_reference((beta * biasn if beta else 0) + alpha * (an @ bn), activation)
        _check(got, ref, d, 64)


@pytest.mark.parametrize("d", [tp.bfloat16, tp.float32])
@pytest.mark.parametrize("activation", [None, "relu", "gelu"])
def test_linear_matches_numpy(rng, d, activation):
    x, xn = _cuda(rng, (2, 33, 256), d)
    w, wn = _cuda(rng, (384, 256), d)
    bias, biasn = _cuda(rng, (384,), d)
    got = tp.linear(x, w, bias, activation=activation)
    assert got.shape == (2, 33, 384)
    _check(got, activation_reference(xn @ wn.T + biasn, activation), d, 256)
    _check(tp.linear(x, w, activation=activation), activation_reference(xn @ wn.T, activation), d, 256)
    _check(tp.linear(x[0, 0], w, bias), xn[0, 0] @ wn.T + biasn, d, 256)
    # a sliced input (batch of rows with a padded pitch) still reads in place
    _check(tp.linear(x[:, :, :128], w[:, :128]), xn[:, :, :128] @ wn[:, :128].T, d, 128)


def test_unaligned_bias_takes_the_unfused_path(rng):
    a, an = _cuda(rng, (16, 32), tp.float32)
    b, bn = _cuda(rng, (32, 8), tp.float32)
    bias, biasn = _cuda(rng, (9,), tp.float32)
    _check(tp.addmm(bias[1:], a, b, activation="relu"), np.maximum(an @ bn + biasn[1:], 0), tp.float32, 32)


def test_tf32_is_opt_in(rng):
    a, an = _cuda(rng, (512, 512), tp.float32)
    b, bn = _cuda(rng, (512, 512), tp.float32)
    ref = an @ bn
    full = np.abs((a @ b).numpy() - ref).max()
    try:
        tp.backends.cuda.matmul.allow_tf32 = True
        tf32 = np.abs((a @ b).numpy() - ref).max()
    finally:
        tp.backends.cuda.matmul.allow_tf32 = False
    # TF32 keeps 10 mantissa bits: errors near 1e-3 of the magnitude, full float32 near 1e-6
    assert full < 1e-3 < tf32 < 0.5, (full, tf32)
    assert np.abs((a @ b).numpy() - ref).max() < 1e-3           # switching back is honoured


def test_products_inside_a_graph_replay_with_new_inputs(rng):
    x, _ = _cuda(rng, (8, 256), tp.bfloat16)
    w1, w1n = _cuda(rng, (1024, 256), tp.bfloat16)
    b1, b1n = _cuda(rng, (1024,), tp.bfloat16)
    w2, w2n = _cuda(rng, (256, 1024), tp.bfloat16)

    def step():
        h = tp.linear(x, w1, b1, activation="relu")
        return (h @ w2.T) + x

    step()                          # warm up: handle, plans, kernels
    _cublaslt.clear_workspaces()    # the graph must not depend on the eager workspace
    g = tp.cuda.CUDAGraph()
    with tp.cuda.graph(g):
        y = step()
    nodes = g.num_nodes
    assert nodes <= 4, nodes        # linear with bias and ReLU: one node
    for _ in range(3):
        new = rng.standard_normal((8, 256)).astype(np.float32)
        x.copy_(tp.tensor(new, device="cuda").to(tp.bfloat16))
        xn = x.cpu().to(tp.float64).numpy()
        g.replay()
        h = np.maximum(xn @ w1n.T + b1n, 0)
        ref = h @ w2n.T + xn
        got = y.cpu().to(tp.float64).numpy()
        np.testing.assert_allclose(got, ref, atol=0.05 * np.abs(ref).max())


def test_many_graphs_share_one_workspace_in_a_pool(rng):
    w, wn = _cuda(rng, (2048, 2048), tp.float32)
    xs = [_cuda(rng, (n, 2048), tp.float32) for n in (512, 256, 64, 8)]
    for x, _ in xs:
        x @ w
    pool = tp.cuda.graph_pool_handle()
    tp.cuda.synchronize()
    graphs, outs = [], []
    reserved = tp.cuda.memory_reserved()
    for x, _ in xs:
        g = tp.cuda.CUDAGraph()
        with tp.cuda.graph(g, pool=pool):
            outs.append(x @ w)
        graphs.append(g)
    grown = tp.cuda.memory_reserved() - reserved
    ws = _blas.workspace_limit(0)
    # one workspace for all the captures, not one each (the outputs, 6.6 MiB,
    # take one 20 MiB segment and a small one, as in PyTorch's allocator)
    assert grown <= ws + (24 << 20), (grown, ws)
    for g in graphs:
        g.replay()
    for (x, xn), y in zip(xs, outs):
        _check(y, xn @ wn, tp.float32, 2048)


def test_workspace_is_accounted_and_returned(rng):
    a, _ = _cuda(rng, (2048, 2048), tp.float32)
    s = tp.cuda.Stream()
    _cublaslt.clear_workspaces()           # workspaces of earlier tests' streams
    tp.cuda.synchronize()
    before = tp.cuda.memory_allocated()
    with tp.cuda.stream(s):
        c = a @ a
    s.synchronize()
    grown = tp.cuda.memory_allocated() - before
    # the stream's workspace (when the algorithm takes one) is the allocator's memory
    assert _cublaslt.workspace_count() in (0, 1)
    assert grown == c.nbytes + _cublaslt.workspace_count() * _blas.workspace_limit(0), grown
    del c
    _cublaslt.clear_workspaces()
    tp.cuda.synchronize()
    assert tp.cuda.memory_allocated() == before
    assert _cublaslt.workspace_count() == 0


def test_products_from_threads(rng):
    a, an = _cuda(rng, (256, 128), tp.float32)
    b, bn = _cuda(rng, (128, 64), tp.float32)
    ref = an @ bn
    errors = []

    def work():
        try:
            with tp.cuda.stream(tp.cuda.Stream()):
                for _ in range(20):
                    r = tp.linear(a, b.T)
                    tp.cuda.current_stream().synchronize()
                    _check(r, ref, tp.float32, 128)
        except Exception as exc:            # reported below
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]


def test_errors_on_cuda():
    a = tp.ones((3, 4), device="cuda")
    with pytest.raises(TypeError, match="not int64"):
        tp.matmul(tp.ones((2, 2), dtype=tp.int64, device="cuda"), tp.ones((2, 2), dtype=tp.int64, device="cuda"))
    with pytest.raises(ValueError, match="do not align"):
        a @ a
    with pytest.raises(ValueError, match="operands on"):
        a @ tp.ones((4, 2))
    with pytest.raises(TypeError, match="one dtype"):
        tp.linear(a, tp.ones((2, 4), device="cuda", dtype=tp.float16))
    assert (a @ tp.ones((4, 2), device="cuda")).tolist() == [[4.0, 4.0]] * 3   # still usable
