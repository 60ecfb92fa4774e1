# SPDX-License-Identifier: Apache-2.0
"""CUDA ops against the CPU backend (NumPy): property-based over shapes
(0-size and broadcast included), dtypes and layouts."""

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import tensorplay as tp
from helpers import ALL_DTYPES, random_array, spin, warm
from tensorplay._ops import elementwise as _elementwise

pytestmark = pytest.mark.cuda
SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))

BINARY = [op for op in _elementwise.OPS if _elementwise.OPS[op][1].__code__.co_argcount == 3]
UNARY = [op for op in _elementwise.OPS if _elementwise.OPS[op][1].__code__.co_argcount == 2]
TRANSCENDENTAL = {"exp", "log", "log1p", "expm1", "sqrt", "rsqrt", "sin", "cos", "tanh", "sigmoid", "pow"}


def _layout(t, kind):
    """The same values as ``t`` in another memory layout."""
    if kind == "contiguous" or t.ndim == 0:
        return t
    if kind == "transposed":
        return t.T.contiguous().T if t.ndim >= 2 else t
    big = tp.empty(*(2 * s for s in t.shape), dtype=t.dtype, device=t.device)
    v = big[tuple(slice(None, None, 2) for _ in t.shape)]
    v.copy_(t)
    return v


def _assert_close(gpu, ref, op, dtype):
    g, r = gpu.numpy(), ref.numpy()
    assert gpu.dtype is ref.dtype and gpu.shape == ref.shape, (op, gpu.dtype, ref.dtype, gpu.shape, ref.shape)
    if dtype.kind != "f":
        assert np.array_equal(g, r), op
        return
    g64, r64 = g.astype(np.float64), r.astype(np.float64)
    rtol = {tp.float16: 2e-3, tp.bfloat16: 1.6e-2, tp.float32: 2e-6, tp.float64: 1e-12}[dtype]
    if op in TRANSCENDENTAL:
        rtol *= 8
    np.testing.assert_allclose(g64, r64, rtol=rtol, atol=rtol, equal_nan=True, err_msg=op)


shapes = st.lists(st.integers(0, 5), min_size=0, max_size=3).map(tuple)


@SETTINGS
@given(op=st.sampled_from(BINARY), da=st.sampled_from(ALL_DTYPES), db=st.sampled_from(ALL_DTYPES),
       shape=shapes, bcast=st.integers(0, 3), layout=st.sampled_from(["contiguous", "transposed", "strided"]),
       scalar=st.sampled_from([None, 3, 2.5, True]), seed=st.integers(0, 2**16))
def test_binary_ops_match_cpu(op, da, db, shape, bcast, layout, scalar, seed):
    rng = np.random.default_rng(seed)
    shape_b = tuple(1 if (bcast >> k) & 1 else s for k, s in enumerate(shape))[-max(len(shape) - 1, 0):] \
        if bcast and shape else shape
    a = random_array(shape, da, rng, 1, 20)
    b = random_array(shape_b, db, rng, 1, 20) if scalar is None else scalar
    if op == "pow":
        a = np.abs(a) % 5 if da.kind != "b" else a
        if scalar is None:
            b = (np.abs(b) % 4).astype(b.dtype)
    ca = tp.tensor(a)
    cb = tp.tensor(b) if scalar is None else scalar
    try:
        ref = _elementwise.apply(op, ca, cb)
    except TypeError:
        with pytest.raises(TypeError):
            _elementwise.apply(op, ca.cuda(), cb.cuda() if scalar is None else cb)
        return
    ga = _layout(ca.cuda(), layout)
    gb = _layout(cb.cuda(), layout) if scalar is None else scalar
    _assert_close(_elementwise.apply(op, ga, gb), ref, op, ref.dtype)


@SETTINGS
@given(op=st.sampled_from(UNARY), d=st.sampled_from(ALL_DTYPES), shape=shapes,
       layout=st.sampled_from(["contiguous", "transposed", "strided"]), seed=st.integers(0, 2**16))
def test_unary_ops_match_cpu(op, d, shape, layout, seed):
    rng = np.random.default_rng(seed)
    a = random_array(shape, d, rng, -5, 5)
    if op in ("log", "sqrt", "rsqrt", "log1p") and d.kind == "f":
        a = np.abs(a).astype(a.dtype)
    ca = tp.tensor(a)
    try:
        ref = _elementwise.apply(op, ca)
    except TypeError:
        with pytest.raises(TypeError):
            _elementwise.apply(op, ca.cuda())
        return
    _assert_close(_elementwise.apply(op, _layout(ca.cuda(), layout)), ref, op, ref.dtype)


def test_special_values_match_numpy():
    x = np.array([0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, np.nan, 2.5, -2.5, 0.5, 1.5], np.float32)
    g, c = tp.tensor(x, device="cuda"), tp.tensor(x)
    for op in ("isnan", "isinf", "isfinite", "sign", "round", "floor", "ceil", "abs", "relu", "neg"):
        assert np.array_equal(_elementwise.apply(op, g).numpy(), _elementwise.apply(op, c).numpy(),
                              equal_nan=True), op
    y = np.array([2.0, -2.0, 0.0, np.inf, -3.0, 0.5, np.nan, 1.0, -1.0, 3.0, -0.0], np.float32)
    for op in ("floor_divide", "remainder", "maximum", "minimum", "div", "eq", "lt"):
        r = _elementwise.apply(op, g, tp.tensor(y, device="cuda")).numpy()
        e = _elementwise.apply(op, c, tp.tensor(y)).numpy()
        assert np.array_equal(r, e, equal_nan=True), op


def test_where_clamp_and_inplace_on_cuda(rng):
    a = rng.standard_normal((6, 7)).astype(np.float32)
    g = tp.tensor(a, device="cuda")
    assert np.array_equal(tp.where(g > 0, g, 0.0).numpy(), np.where(a > 0, a, 0))
    assert np.array_equal(tp.where(g > 0, 1, g.to(tp.float16)).numpy(),
                          np.where(a > 0, 1, a.astype(np.float16)))
    assert np.array_equal(tp.clamp(g, -0.5, 0.5).numpy(), np.clip(a, -0.5, 0.5))
    h = g.clone()
    h.mul_(2).add_(1).clamp_(max=1.0)
    assert np.array_equal(h.numpy(), np.minimum(a * 2 + 1, 1.0))
    h.exp_()
    assert np.allclose(h.numpy(), np.exp(np.minimum(a * 2 + 1, 1.0)), rtol=1e-6)
    i = tp.ones(4, dtype=tp.int32, device="cuda")
    with pytest.raises(TypeError, match="can't be cast"):
        i.mul_(1.5)
    assert i.tolist() == [1] * 4
    out = tp.empty(6, 7, dtype=tp.float64, device="cuda")
    tp.mul(g, 2, out=out)
    assert np.array_equal(out.numpy(), (a * 2).astype(np.float64))
    with pytest.raises(ValueError, match="device"):
        g + tp.ones(6, 7)
    assert (g + tp.tensor(1.0)).is_cuda              # a 0-d CPU tensor acts as a scalar


def _reduce_ref(op, a, dims, keepdim):
    t = tp.tensor(a)
    fn = getattr(tp, op)
    return fn(t, dims, keepdim) if op not in ("argmax", "argmin") else fn(t, dims, keepdim)


@SETTINGS
@given(op=st.sampled_from(["sum", "prod", "amax", "amin", "all", "any", "mean", "argmax", "argmin"]),
       d=st.sampled_from(ALL_DTYPES), shape=st.lists(st.integers(0, 6), min_size=1, max_size=3).map(tuple),
       data=st.data(), keepdim=st.booleans(), transposed=st.booleans(), seed=st.integers(0, 2**16))
def test_reductions_match_cpu(op, d, shape, data, keepdim, transposed, seed):
    rng = np.random.default_rng(seed)
    a = random_array(shape, d, rng, -3, 3)
    if op == "prod" and d.kind == "f":
        a = (a / 3).astype(a.dtype)
    if op in ("argmax", "argmin"):
        dims = data.draw(st.sampled_from([None] + list(range(len(shape)))))
    else:
        dims = data.draw(st.sampled_from([None] + [tuple(sorted(set(x))) for x in
                                                   [[0], [len(shape) - 1], list(range(len(shape)))]]))
    if op == "mean" and d.kind != "f":
        with pytest.raises(TypeError):
            tp.mean(tp.tensor(a, device="cuda"))
        return
    ct = tp.tensor(a)
    empty_dim = any(shape[k] == 0 for k in (range(len(shape)) if dims is None else
                                            ([dims] if isinstance(dims, int) else dims)))
    if empty_dim and op in ("amax", "amin", "argmax", "argmin"):
        with pytest.raises(IndexError):
            getattr(tp, op)(tp.tensor(a, device="cuda"), dims, keepdim)
        return
    ref = getattr(tp, op)(ct, dims, keepdim)
    g = tp.tensor(a, device="cuda")
    if transposed and g.ndim >= 2:
        g = g.T.contiguous().T
    res = getattr(tp, op)(g, dims, keepdim)
    _assert_close(res, ref, op, ref.dtype if op not in ("sum", "mean", "prod") else ref.dtype)


def test_large_reductions_use_two_passes_and_stay_accurate(rng):
    n = 10_000_019
    a = rng.standard_normal(n).astype(np.float32)
    g = tp.tensor(a, device="cuda")
    exact = a.astype(np.float64).sum()
    got = g.sum().item()
    # error bound: n * eps32 * sum|x| is the sequential worst case; a tree does far better
    assert abs(got - exact) <= 1e-6 * np.abs(a).sum()
    assert g.argmax().item() == int(np.argmax(a))
    a[123_456] = 100.0
    a[9_000_000] = 100.0
    g = tp.tensor(a, device="cuda")
    assert g.argmax().item() == 123_456            # the first of equal maxima
    a[5] = np.nan
    g = tp.tensor(a, device="cuda")
    assert math.isnan(g.amax().item()) and g.argmax().item() == 5
    h = tp.tensor(a[:1_000_000], device="cuda").to(tp.float16)
    s = h[6:].sum().item()                          # float16 input accumulates in float32
    assert abs(s - a[6:1_000_000].astype(np.float16).astype(np.float64).sum()) < 1.0
    m = tp.tensor(rng.standard_normal((3, 2_000_000)).astype(np.float32), device="cuda")
    ref = m.numpy().astype(np.float64)
    assert np.allclose(m.mean(1).numpy(), ref.mean(1), atol=1e-5)
    assert np.allclose(m.var(1).numpy(), ref.var(1, ddof=1), rtol=1e-4)
    assert np.allclose(m.std(1, correction=0).numpy(), ref.std(1), rtol=1e-4)


def test_norm_and_dot(rng):
    a = rng.standard_normal((5, 8)).astype(np.float32)
    g = tp.tensor(a, device="cuda")
    assert np.allclose(g.norm().item(), np.linalg.norm(a), rtol=1e-5)
    assert np.allclose(g.norm(float("inf"), 1).numpy(), np.abs(a).max(1))
    assert np.allclose(g.norm(1, 0).numpy(), np.abs(a).sum(0), rtol=1e-5)
    assert np.allclose(g.norm(3).item(), (np.abs(a.astype(np.float64)) ** 3).sum() ** (1 / 3), rtol=1e-4)
    v = rng.standard_normal(1000).astype(np.float16)
    d = tp.dot(tp.tensor(v, device="cuda"), tp.tensor(v, device="cuda"))
    assert d.dtype is tp.float16
    assert abs(d.item() - float((v.astype(np.float64) ** 2).sum())) < 0.5
    with pytest.raises(TypeError):
        tp.dot(g[0], g[0].to(tp.float64))


@pytest.mark.parametrize("d", [tp.float16, tp.bfloat16, tp.float32, tp.float64])
@pytest.mark.parametrize("shapes", [((7, 13), (13, 5)), ((33, 64), (64, 17)), ((3, 20, 9), (3, 9, 4)),
                                    ((20, 9), (2, 9, 4)), ((9,), (9, 4)), ((4, 9), (9,)), ((9,), (9,)),
                                    ((0, 3), (3, 2)), ((2, 0), (0, 3))])
def test_matmul_matches_numpy(d, shapes, rng):
    sa, sb = shapes
    a = rng.standard_normal(sa).astype(np.float32)
    b = rng.standard_normal(sb).astype(np.float32)
    ga, gb = tp.tensor(a, device="cuda").to(d), tp.tensor(b, device="cuda").to(d)
    ref = np.matmul(ga.cpu().to(tp.float64).numpy(), gb.cpu().to(tp.float64).numpy())
    got = (ga @ gb)
    assert got.shape == ref.shape and got.dtype is d
    tol = {tp.float16: 1e-2, tp.bfloat16: 5e-2, tp.float32: 1e-5, tp.float64: 1e-12}[d]
    np.testing.assert_allclose(got.to(tp.float64).numpy(), ref, rtol=tol, atol=tol * 10)
    if ga.ndim == 2 and gb.ndim == 2:
        gt = (gb.T.contiguous().T, ga.T.contiguous().T)        # non-contiguous operands
        np.testing.assert_allclose((ga.T.contiguous().T @ gb.T.contiguous().T).to(tp.float64).numpy(),
                                   ref, rtol=tol, atol=tol * 10)


def test_mv_and_large_matmul(rng):
    a = rng.standard_normal((300, 200)).astype(np.float32)
    b = rng.standard_normal((200, 150)).astype(np.float32)
    v = rng.standard_normal(200).astype(np.float32)
    ga, gb, gv = (tp.tensor(x, device="cuda") for x in (a, b, v))
    np.testing.assert_allclose((ga @ gb).numpy(), a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(tp.mv(ga, gv).numpy(), a.astype(np.float64) @ v, rtol=1e-4, atol=1e-4)


def test_indexing_on_cuda_matches_numpy(rng):
    a = rng.standard_normal((6, 7, 3)).astype(np.float32)
    g = tp.tensor(a, device="cuda")
    idx = np.array([5, 0, -1, 2, 2])
    assert np.array_equal(g[tp.tensor(idx, device="cuda")].numpy(), a[idx])
    assert np.array_equal(g[:, idx[:3]].numpy(), a[:, idx[:3]])
    assert np.array_equal(g[1:, ::2][tp.tensor([0, 1], device="cuda")].numpy(), a[1:, ::2][[0, 1]])
    assert np.array_equal(g[::-1, 1, tp.tensor([[2, 0]], device="cuda")].numpy(), a[::-1, 1, [[2, 0]]])
    mask = a > 0.3
    assert np.array_equal(g[tp.tensor(mask, device="cuda")].numpy(), a[mask])
    assert np.array_equal(g[tp.tensor(mask[:, 0, 0], device="cuda")].numpy(), a[mask[:, 0, 0]])
    h = g.clone()
    h[tp.tensor(mask, device="cuda")] = 0.0          # a masked fill, no host round trip
    ref = a.copy()
    ref[mask] = 0
    assert np.array_equal(h.numpy(), ref)
    h[tp.tensor([0, 3], device="cuda")] = tp.tensor(np.ones((2, 7, 3), np.float32), device="cuda") * 5
    ref[[0, 3]] = 5
    assert np.array_equal(h.numpy(), ref)
    h[:, [1]] = -2.0
    ref[:, [1]] = -2
    assert np.array_equal(h.numpy(), ref)


def test_device_side_index_errors_are_reported_without_touching_memory():
    src = tp.arange(10, dtype=tp.float32, device="cuda")
    guard = tp.full((1 << 16,), 7.0, device="cuda")
    bad = tp.tensor([1, 10_000_000, 2], device="cuda")        # out of range, on the device
    out = src[bad]                                             # no host sync: no error yet
    with pytest.raises(IndexError, match="out-of-range"):
        out.numpy()
    assert tp.all(guard == 7.0).item()
    src2 = src.clone()
    src2[tp.tensor([-11], device="cuda")] = 5.0
    with pytest.raises(IndexError):
        tp.cuda.synchronize()
    assert src2.tolist() == src.tolist()
    assert src[tp.tensor([3], device="cuda")].item() == 3.0   # the flag was reset
    with pytest.raises(IndexError, match="out of bounds"):
        src[tp.tensor([10])]                                   # host-known: at once


def test_creation_helpers_on_cuda():
    for steps in (0, 1, 2, 7, 1000):
        assert np.allclose(tp.linspace(-3, 5, steps, device="cuda").numpy(),
                           np.linspace(-3, 5, steps, dtype=np.float32), atol=1e-6)
    assert np.allclose(tp.linspace(0, 1, 11, dtype=tp.float64, device="cuda").numpy(), np.linspace(0, 1, 11))
    assert np.array_equal(tp.eye(4, 6, device="cuda").numpy(), np.eye(4, 6, dtype=np.float32))
    assert np.array_equal(tp.eye(3, dtype=tp.int32, device="cuda").numpy(), np.eye(3, dtype=np.int32))
    x = tp.arange(6, device="cuda").view(2, 3)
    y = tp.arange(6, 12, device="cuda").view(2, 3).to(tp.float32)
    assert np.array_equal(tp.cat([x, y], 1).numpy(), np.concatenate([x.numpy(), y.numpy()], 1))
    assert tp.cat([x, y]).dtype is tp.float32
    assert np.array_equal(tp.stack([x, x.T.contiguous().T], 2).numpy(), np.stack([x.numpy()] * 2, 2))


def test_ops_are_asynchronous_and_follow_the_current_stream():
    s = tp.cuda.Stream()
    x = tp.ones(1 << 20, device="cuda")

    def work():
        y = (x * 3 + 1).exp().sum(0, keepdim=True)
        z = x[tp.tensor([0, 5], device="cuda")] @ tp.ones(2, device="cuda")
        return tp.cat([y, z.unsqueeze(0)])

    # the first use of a kernel in a process loads its module, which may wait
    # for the device: load them all before the stream is kept busy
    with tp.cuda.stream(s):
        warm(work)
    with tp.cuda.stream(s):
        spin(s, 300_000_000)
        w = work()
        assert s.query() is False              # every op above queued without waiting
        assert tp.cuda.default_stream().query() is True
        assert np.allclose(w.numpy(), [np.exp(4.0) * (1 << 20), 2.0], rtol=1e-5)


def test_raw_kernel(rng):
    src = r'''
    extern "C" __global__ void saxpy(float a, const float* x, float* y, int n) {
      int i = blockIdx.x * blockDim.x + threadIdx.x;
      if (i < n) y[i] = a * x[i] + y[i];
    }'''
    k = tp.cuda.RawKernel(src, "saxpy")
    x = rng.standard_normal(1000).astype(np.float32)
    y = rng.standard_normal(1000).astype(np.float32)
    gx, gy = tp.tensor(x, device="cuda"), tp.tensor(y, device="cuda")
    k((4,), (256,), (2.0, gx, gy, 1000))
    assert np.allclose(gy.numpy(), 2 * x + y, rtol=1e-6)
    s = tp.cuda.Stream()
    k(4, 256, (np.float32(1.0), gx, gy, np.int32(1000)), stream=s)
    s.synchronize()
    assert np.allclose(gy.numpy(), (2 * x + y) + x, rtol=1e-5, atol=1e-6)
    assert k.attributes["num_regs"] > 0
    with pytest.raises(TypeError, match="takes 4 arguments"):
        k(1, 1, (gx, gy))
    with pytest.raises(TypeError, match="CPU tensor"):
        k(1, 1, (1.0, tp.zeros(3), gy, 3))
    with pytest.raises(tp.NVRTCError):
        tp.cuda.RawKernel("not cuda", "k").compile()


def test_elementwise_kernel(rng):
    k = tp.cuda.ElementwiseKernel("T x, T y, float32 a", "T z", "z = a * x + y", "axpy")
    for d in (tp.float32, tp.float16, tp.float64):
        x = tp.tensor(rng.standard_normal((4, 5)), device="cuda").to(d)
        y = tp.tensor(rng.standard_normal(5), device="cuda").to(d)
        z = k(x, y, 3.0)
        assert z.dtype is d and z.shape == (4, 5)
        ref = (3.0 * x.cpu().to(tp.float64).numpy() + y.cpu().to(tp.float64).numpy())
        np.testing.assert_allclose(z.to(tp.float64).numpy(), ref, rtol=2e-3, atol=2e-3)
    two = tp.cuda.ElementwiseKernel("float32 x", "float32 s, int64 idx", "s = x * x; idx = i", "sq_idx")
    s, idx = two(tp.arange(5, dtype=tp.float32, device="cuda"))
    assert s.tolist() == [0, 1, 4, 9, 16] and idx.tolist() == [0, 1, 2, 3, 4]
    out = tp.zeros(5, device="cuda")
    k2 = tp.cuda.ElementwiseKernel("float32 x", "float32 z", "z = x + 1", "inc")
    k2(tp.arange(5, dtype=tp.float32, device="cuda"), out)
    assert out.tolist() == [1, 2, 3, 4, 5]
