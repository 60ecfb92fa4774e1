# SPDX-License-Identifier: Apache-2.0
"""The bandwidth paths at real sizes on the GPU, against NumPy: flat vector
kernels (aligned, misaligned through slicing, odd tails), one-pass and
split reductions over inner and outer dimensions, tiled transposes."""

import numpy as np
import pytest

import tensorplay as tp

pytestmark = pytest.mark.cuda

MI = 1 << 20


def cuda(a):
    return tp.tensor(a, device="cuda")


def rng(seed=0):
    return np.random.default_rng(seed)


# ------------------------------------------------------------------ flat elementwise

@pytest.mark.parametrize("n", [1, 3, 4095, 4096, 4097, MI + 5, 16 * MI + 3, 64 * MI])
def test_add_out_matches_numpy_at_every_size_and_tail(n):
    a = rng(n).standard_normal(n, dtype=np.float32)
    b = rng(n + 1).standard_normal(n, dtype=np.float32)
    x, y = cuda(a), cuda(b)
    out = tp.empty(n, dtype=tp.float32, device="cuda")
    tp.add(x, y, out=out)
    np.testing.assert_array_equal(out.numpy(), a + b)


@pytest.mark.parametrize("offsets", [(1, 0, 0), (0, 1, 0), (0, 0, 1), (1, 1, 1), (2, 0, 3)])
def test_misaligned_operands_from_slicing_take_the_scalar_path_correctly(offsets):
    n = 4 * MI + 7
    a = rng(1).standard_normal(n + 4, dtype=np.float32)
    b = rng(2).standard_normal(n + 4, dtype=np.float32)
    x, y = cuda(a), cuda(b)
    store = tp.zeros(n + 4, dtype=tp.float32, device="cuda")
    oa, ob, oo = offsets
    tp.add(x[oa:oa + n], y[ob:ob + n], out=store[oo:oo + n])
    got = store.numpy()
    np.testing.assert_array_equal(got[oo:oo + n], a[oa:oa + n] + b[ob:ob + n])
    assert not got[:oo].any() and not got[oo + n:].any()       # nothing written outside


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float64", "int8", "int64", "bool", "uint8"])
def test_flat_kernels_for_every_item_size(dtype):
    n = 3 * MI + 11
    d = tp._dtypes.as_dtype(dtype)
    r = rng(4)
    a = (r.standard_normal(n) * 10).astype(d.numpy_dtype) if d.kind == "f" else \
        r.integers(0, 2 if d.kind == "b" else 100, n).astype(d.numpy_dtype)
    x = cuda(a)
    for view in (slice(None), slice(1, None)):
        got = (x[view] + x[view]) if d.kind != "b" else (x[view] | x[view])
        ref = (a[view].astype(np.float32) * 2).astype(d.numpy_dtype) if d in (tp.float16, tp.bfloat16) else \
            (a[view] + a[view] if d.kind != "b" else a[view] | a[view])
        np.testing.assert_array_equal(got.numpy(), ref)


def test_mixed_item_sizes_scalars_unary_and_in_place_ops():
    n = 8 * MI + 1
    a = rng(5).standard_normal(n, dtype=np.float32)
    x = cuda(a)
    np.testing.assert_array_equal((x > 0).numpy(), a > 0)                       # bool out of float32
    np.testing.assert_array_equal((x * 2.5).numpy(), a * np.float32(2.5))
    np.testing.assert_array_equal(tp.relu(x).numpy(), np.maximum(a, 0))
    h = x.to(tp.bfloat16)                                                      # cast copy
    np.testing.assert_array_equal(h.numpy(), a.astype(tp.bfloat16.numpy_dtype))
    y = x[3:]
    y.mul_(2)
    ref = a.copy()
    ref[3:] *= 2
    np.testing.assert_array_equal(x.numpy(), ref)
    z = tp.empty(n - 1, dtype=tp.float32, device="cuda")[1:]
    z.fill_(1.5)
    assert (z.numpy() == 1.5).all()


# ------------------------------------------------------------------ reductions

def _close(got, ref, rtol=1e-5, atol=1e-3):
    np.testing.assert_allclose(np.asarray(got, dtype=np.float64), ref, rtol=rtol, atol=atol)


@pytest.mark.parametrize("n", [1, 31, 512, 513, 4096, 16385, MI + 3, 64 * MI])
def test_full_sum_mean_amax_argmax_match_numpy(n):
    a = rng(n).standard_normal(n, dtype=np.float32)
    x = cuda(a)
    ref = a.astype(np.float64)
    _close(tp.sum(x).item(), ref.sum(), rtol=1e-5, atol=1e-2 * max(1, np.sqrt(n) / 100))
    _close(tp.mean(x).item(), ref.mean(), rtol=1e-4, atol=1e-5)
    assert tp.amax(x).item() == a.max() and tp.amin(x).item() == a.min()
    assert tp.argmax(x).item() == int(np.argmax(a)) and tp.argmin(x).item() == int(np.argmin(a))


def test_full_reductions_of_misaligned_views_and_integers():
    n = 8 * MI + 5
    a = rng(7).integers(-1000, 1000, n + 1).astype(np.int32)
    x = cuda(a)
    assert tp.sum(x[1:]).item() == int(a[1:].astype(np.int64).sum())
    f = rng(8).standard_normal(n + 1, dtype=np.float32)
    y = cuda(f)[1:]
    _close(tp.sum(y).item(), f[1:].astype(np.float64).sum(), atol=1e-1)
    assert tp.argmax(y).item() == int(np.argmax(f[1:]))
    b = np.zeros(n, dtype=np.bool_)
    assert not tp.any(cuda(b)).item() and not tp.all(cuda(b)).item()
    b[n - 2] = True
    assert tp.any(cuda(b)).item()


def test_argmax_takes_the_first_of_ties_and_nan_wins_in_every_path():
    for shape, dim in [((64 * MI,), None), ((8192, 8192), 0), ((8192, 8192), 1), ((1000, 300), 1)]:
        a = np.zeros(shape, dtype=np.float32)
        if dim is None:
            a[[5, 40 * MI, 60 * MI]] = 2.0
            assert tp.argmax(cuda(a)).item() == 5
            a[50 * MI] = np.nan
            assert tp.argmax(cuda(a)).item() == 50 * MI
            assert np.isnan(tp.amax(cuda(a)).item())
            continue
        a[3, 7] = a[900, 7] = a[7, 3] = a[7, 200] = 2.0
        a[500, 9] = a[9, 250] = np.nan
        got = tp.argmax(cuda(a), dim).numpy()
        np.testing.assert_array_equal(got, np.argmax(a, axis=dim))       # NumPy: first max, NaN first
        np.testing.assert_array_equal(tp.amax(cuda(a), dim).numpy(), np.max(a, axis=dim))


@pytest.mark.parametrize("shape, dims", [
    ((8192, 8192), 1), ((8192, 8192), 0), ((1000, 1001), 0), ((1000, 1001), 1), ((3, 100_003, 17), 1),
    ((4, 50, 64), 1), ((2, 8192, 1000), 1), ((100_000, 33), 0), ((33, 100_000), 0), ((1 << 20, 16), 0),
    ((64, 64, 64), (0, 1)), ((64, 64, 64), (0, 2)), ((16, 1 << 16), 1), ((5, 1 << 22), 1), ((1 << 16, 7), 1),
])
def test_sums_over_inner_outer_and_middle_dims_match_numpy(shape, dims):
    a = rng(len(shape)).standard_normal(shape, dtype=np.float32)
    x = cuda(a)
    ref = a.astype(np.float64).sum(axis=dims)
    n = a.size // ref.size
    _close(tp.sum(x, dims).numpy(), ref, rtol=1e-4, atol=1e-4 * np.sqrt(n))
    _close(tp.mean(x, dims, keepdim=True).numpy(), a.astype(np.float64).mean(axis=dims, keepdims=True),
           rtol=1e-4, atol=1e-5 * np.sqrt(n))
    np.testing.assert_array_equal(tp.amax(x, dims).numpy(), a.max(axis=dims))
    if not isinstance(dims, tuple):
        np.testing.assert_array_equal(tp.argmin(x, dims).numpy(), a.argmin(axis=dims))


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float64", "int8", "int64", "bool"])
def test_dim_reductions_for_every_item_size(dtype):
    d = tp._dtypes.as_dtype(dtype)
    r = rng(9)
    shape = (1027, 2051)
    a = r.standard_normal(shape).astype(d.numpy_dtype) if d.kind == "f" else \
        r.integers(0, 2 if d.kind == "b" else 100, shape).astype(d.numpy_dtype)
    x = cuda(a)
    wide = a.astype(np.float64)
    for dim in (0, 1, None):
        got = tp.sum(x, dim).numpy().astype(np.float64)
        tol = 1e-2 * np.sqrt(a.size) if d in (tp.float16, tp.bfloat16) else 1e-6 * np.sqrt(a.size)
        np.testing.assert_allclose(got, wide.sum(axis=dim), rtol=1e-2 if d.kind == "f" and d.itemsize == 2
                                   else 1e-6, atol=tol)
        if d.kind != "b":
            np.testing.assert_array_equal(tp.amax(x, dim).numpy().astype(np.float64), wide.max(axis=dim))
    if d.kind == "b":
        np.testing.assert_array_equal(tp.any(x, 0).numpy(), a.any(axis=0))
        np.testing.assert_array_equal(tp.all(x, 1).numpy(), a.all(axis=1))


def test_reductions_are_deterministic_run_to_run():
    a = rng(11).standard_normal((4096, 4096), dtype=np.float32)
    x = cuda(a)
    for dim in (None, 0, 1):
        first = tp.sum(x, dim).numpy()
        for _ in range(3):
            np.testing.assert_array_equal(tp.sum(x, dim).numpy(), first)


# ------------------------------------------------------------------ copies

@pytest.mark.parametrize("shape", [(8192, 8192), (1000, 1001), (33, 4097), (16, 16), (17, 100_003)])
def test_transpose_copies_match_numpy(shape):
    a = rng(12).standard_normal(shape, dtype=np.float32)
    x = cuda(a)
    np.testing.assert_array_equal(x.T.contiguous().numpy(), a.T)
    out = tp.empty(shape[::-1], dtype=tp.float32, device="cuda")
    out.copy_(x.T)
    np.testing.assert_array_equal(out.numpy(), a.T)
    h = tp.empty(shape[::-1], dtype=tp.bfloat16, device="cuda")
    h.copy_(x.T)                                                       # cast while transposing
    np.testing.assert_array_equal(h.numpy(), a.T.astype(tp.bfloat16.numpy_dtype))


def test_batched_permutes_views_and_broadcasts_through_tiles():
    a = rng(13).standard_normal((6, 130, 70), dtype=np.float32)
    x = cuda(a)
    np.testing.assert_array_equal(x.permute(0, 2, 1).contiguous().numpy(), a.transpose(0, 2, 1))
    np.testing.assert_array_equal(x.permute(2, 1, 0).contiguous().numpy(), a.transpose(2, 1, 0))
    np.testing.assert_array_equal(x[1:, 3:, 5:].transpose(1, 2).contiguous().numpy(),
                                  a[1:, 3:, 5:].transpose(0, 2, 1))
    big = tp.zeros(80, 140, dtype=tp.float32, device="cuda")
    big[5:75, 3:133].copy_(x[2].T)                                     # into a strided destination
    ref = np.zeros((80, 140), dtype=np.float32)
    ref[5:75, 3:133] = a[2].T
    np.testing.assert_array_equal(big.numpy(), ref)
    col = cuda(a[0, :, :1].copy())                                       # (130, 1) broadcast to (130, 70)
    dst = tp.empty(70, 130, dtype=tp.float32, device="cuda").T
    dst.copy_(col)
    np.testing.assert_array_equal(dst.numpy(), np.broadcast_to(a[0, :, :1], (130, 70)))
    for d in ("float64", "int8", "bool", "float16"):
        dd = tp._dtypes.as_dtype(d)
        v = (a[0] > 0).astype(dd.numpy_dtype) if d in ("bool", "int8") else a[0].astype(dd.numpy_dtype)
        np.testing.assert_array_equal(cuda(v).T.contiguous().numpy(), v.T)


def test_strided_slice_contiguous_matches_numpy():
    a = rng(14).standard_normal((4096, 4096), dtype=np.float32)
    x = cuda(a)
    np.testing.assert_array_equal(x[:, ::2].contiguous().numpy(), a[:, ::2])
    np.testing.assert_array_equal(x[1::3, 5:].contiguous().numpy(), a[1::3, 5:])
