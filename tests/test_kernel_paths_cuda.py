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
