# SPDX-License-Identifier: Apache-2.0
"""The methods and functions PyTorch users reach for first: dtype
conversions, ``t``/``mT``/``detach``/``view_as``/``type_as``, ``new_*``,
``flip``, ``repeat``, ``masked_fill``, ``gather``, ``cumsum``, ``sort``,
``topk``, ``softmax``/``log_softmax``, ``tril``/``triu``,
``isclose``/``allclose`` and ``get_default_dtype``.

On the CPU against NumPy; without a GPU, their CUDA code paths run over
metadata-only tensors up to the launches and every kernel they ask for
compiles; on a GPU (marked ``cuda``) against the CPU at realistic sizes,
and each capturable op gives the right result after a graph replay."""

import re
import warnings

import numpy as np
import pytest

import tensorplay as tp
from helpers import warm
from tensorplay import _dtypes as dt
from tensorplay._kernels import cache as _kernels
from tensorplay._kernels import nvrtc as _nvrtc
from tensorplay._kernels import scan_kernels
from tensorplay._kernels import sort_kernels
from tensorplay._ops import elementwise as _elementwise
from tensorplay._ops import indexing as _indexing
from tensorplay._ops import reduce as _reduce
from tensorplay._ops import sampling as _sampling
from tensorplay._ops import scan as _scan
from tensorplay._ops import softmax as _softmax
from tensorplay._ops import sorting as _sorting
from tensorplay._tensor import creation as _creation
from tensorplay._tensor import tensor as _tensor_mod
from tensorplay.cuda import CUDAGraph

F = tp.nn.functional


def _h(t):
    """A tensor's values as a NumPy array (bfloat16 widened to float32)."""
    a = t.numpy()
    return a.astype(np.float32) if t.dtype is tp.bfloat16 else a


# ------------------------------------------------------------------ conversions and small methods

@pytest.mark.parametrize("name, d", [("float", tp.float32), ("half", tp.float16), ("double", tp.float64),
                                     ("int", tp.int32), ("long", tp.int64), ("bool", tp.bool),
                                     ("bfloat16", tp.bfloat16)])
def test_dtype_conversion_methods(name, d):
    x = tp.tensor([[-1.5, 0.0, 2.7], [3.0, -0.25, 1.0]])
    y = getattr(x, name)()
    assert y.dtype is d and y.shape == x.shape
    np.testing.assert_array_equal(_h(y), _h(x.to(d)))
    assert getattr(y, name)() is y                       # already that dtype: itself, as PyTorch
    assert getattr(tp.Tensor, name).__doc__


def test_type_as_view_as_detach():
    x = tp.arange(6, dtype=tp.int32)
    f = tp.zeros(2, dtype=tp.float16)
    assert x.type_as(f).dtype is tp.float16 and x.type_as(x) is x
    v = x.view_as(tp.empty(2, 3))
    assert v.shape == (2, 3)
    v[0, 0] = 9
    assert x[0].item() == 9                              # a view
    with pytest.raises(ValueError):
        x[::2].view_as(tp.empty(3, 1, 1, 1, 2))
    d = x.detach()
    assert d is not x and d.shape == x.shape and d.dtype is x.dtype
    d[1] = 7
    assert x[1].item() == 7                              # shares memory


def test_t_and_mT():
    a = np.arange(6).reshape(2, 3)
    x = tp.tensor(a)
    assert np.array_equal(x.t().numpy(), a.T)
    assert np.array_equal(tp.tensor([1, 2]).t().numpy(), [1, 2])
    assert tp.tensor(5).t().item() == 5
    with pytest.raises(ValueError, match="at most 2"):
        tp.zeros(2, 3, 4).t()
    b = np.arange(24).reshape(2, 3, 4)
    assert np.array_equal(tp.tensor(b).mT.numpy(), b.swapaxes(-1, -2))
    assert np.array_equal(x.mT.numpy(), a.T)
    with pytest.raises(ValueError, match="at least 2"):
        tp.zeros(3).mT


def test_new_tensors_take_this_tensors_dtype_and_device():
    x = tp.ones(2, dtype=tp.float16)
    for z in (x.new_zeros(2, 3), x.new_zeros((2, 3)), x.new_zeros([2, 3])):
        assert z.dtype is tp.float16 and z.shape == (2, 3) and z.is_cpu and not z.numpy().any()
    assert (x.new_ones(4).numpy() == 1).all() and x.new_ones(4).dtype is tp.float16
    f = x.new_full((2, 2), 7, dtype=tp.int32)
    assert f.dtype is tp.int32 and (f.numpy() == 7).all()
    assert x.new_empty(3, dtype="float64").dtype is tp.float64
    assert x.new_zeros(()).shape == ()
    with pytest.raises(OverflowError):
        tp.ones(1, dtype=tp.int8).new_full((2,), 300)


def test_flip():
    a = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    x = tp.tensor(a)
    for dims in ((0,), (1, 2), (-1,), (0, 1, 2), ()):
        np.testing.assert_array_equal(x.flip(dims).numpy(), np.flip(a, dims))
    np.testing.assert_array_equal(x.flip(0, -1).numpy(), np.flip(a, (0, 2)))
    y = x.flip(0)
    y[0, 0, 0] = -1
    assert x[1, 0, 0].item() == 12                     # a copy, not a view
    assert y.is_contiguous()
    assert tp.tensor(3.0).flip(0).item() == 3.0
    with pytest.raises(ValueError, match="more than once"):
        x.flip(0, -3)
    with pytest.raises(IndexError):
        x.flip(3)


def test_repeat():
    a = np.arange(6).reshape(2, 3)
    x = tp.tensor(a)
    for sizes in ((1, 1), (2, 3), (3, 1, 2), (0, 2), (2, 0, 1)):
        np.testing.assert_array_equal(x.repeat(*sizes).numpy(), np.tile(a, sizes))
    np.testing.assert_array_equal(x.repeat((2, 2)).numpy(), np.tile(a, (2, 2)))
    assert x.repeat(2, 2).is_contiguous()
    assert tp.tensor(4).repeat(3).tolist() == [4, 4, 4]
    with pytest.raises(ValueError, match="at least"):
        x.repeat(2)
    with pytest.raises(ValueError, match="non-negative"):
        x.repeat(2, -1)


def test_masked_fill():
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    x = tp.tensor(a)
    m = a % 3 == 0
    np.testing.assert_array_equal(x.masked_fill(tp.tensor(m), -1).numpy(), np.where(m, -1, a))
    row = np.array([True, False, False, True])          # broadcast over rows
    np.testing.assert_array_equal(x.masked_fill(tp.tensor(row), 0.5).numpy(), np.where(row, 0.5, a))
    np.testing.assert_array_equal(x.masked_fill(tp.tensor(m), tp.tensor(2.0)).numpy(), np.where(m, 2, a))
    i = tp.tensor([1, 2, 3])
    r = i.masked_fill(tp.tensor([True, False, True]), 2.7)          # cast to the tensor's dtype
    assert r.dtype is tp.int64 and r.tolist() == [2, 2, 2]
    b = tp.tensor([True, False]).masked_fill(tp.tensor([False, True]), 1)
    assert b.dtype is tp.bool and b.tolist() == [True, True]
    u = tp.tensor([1, 2], dtype=tp.uint8).masked_fill(tp.tensor([True, False]), -1)
    assert u.tolist() == [255, 2]
    y = x.clone()
    assert y.masked_fill_(tp.tensor(m), 0) is y
    np.testing.assert_array_equal(y.numpy(), np.where(m, 0, a))
    np.testing.assert_array_equal(x.numpy(), a)          # masked_fill left x alone
    with pytest.raises(TypeError, match="bool"):
        x.masked_fill(tp.tensor(m.astype(np.int64)), 1)
    with pytest.raises(ValueError, match="broadcast"):
        x.masked_fill(tp.tensor([True, False, True]), 1)
    with pytest.raises(ValueError, match="broadcast"):
        tp.ones(4).masked_fill(tp.ones(3, 4, dtype=tp.bool), 1)
    with pytest.raises(OverflowError):
        tp.ones(2, dtype=tp.int8).masked_fill(tp.tensor([True, True]), 1000)
    with pytest.raises(TypeError):
        x.masked_fill(tp.tensor(m), "a")
    with pytest.raises(ValueError, match="0-d"):
        x.masked_fill(tp.tensor(m), tp.ones(1))


# ------------------------------------------------------------------ gather

def test_gather_matches_take_along_axis(rng):
    a = rng.standard_normal((4, 5, 6)).astype(np.float32)
    x = tp.tensor(a)
    for dim in (0, 1, 2, -1, -3):
        idx = rng.integers(0, a.shape[dim], size=(4, 5, 6))
        np.testing.assert_array_equal(tp.gather(x, dim, tp.tensor(idx)).numpy(), np.take_along_axis(a, idx, dim))
        np.testing.assert_array_equal(x.gather(dim, tp.tensor(idx)).numpy(), np.take_along_axis(a, idx, dim))
    idx = rng.integers(0, 5, size=(2, 7, 3))                     # smaller outside dim, longer along it
    np.testing.assert_array_equal(tp.gather(x, 1, tp.tensor(idx)).numpy(),
                                  np.take_along_axis(a[:2, :, :3], idx, 1))
    out = tp.empty(2, 7, 3)
    assert tp.gather(x, 1, tp.tensor(idx), out=out) is out
    assert tp.gather(x, 0, tp.zeros(0, 5, 6, dtype=tp.int64)).shape == (0, 5, 6)
    assert tp.gather(tp.tensor(3.5), 0, tp.tensor(0)).item() == 3.5
    assert tp.gather(tp.tensor([[1, 2], [3, 4]]), 1, tp.tensor([[0, 0], [1, 0]])).tolist() == [[1, 1], [4, 3]]


def test_gather_errors():
    x = tp.zeros(3, 4)
    with pytest.raises(IndexError, match="out of bounds"):
        tp.gather(x, 1, tp.tensor([[0, 4]]))
    with pytest.raises(IndexError, match="out of bounds"):
        tp.gather(x, 1, tp.tensor([[-1]]))                       # not wrapped, as PyTorch
    with pytest.raises(IndexError):
        tp.gather(x, 2, tp.tensor([[0]]))
    with pytest.raises(TypeError, match="int64"):
        tp.gather(x, 1, tp.tensor([[0]], dtype=tp.int32))
    with pytest.raises(ValueError, match="dimensions"):
        tp.gather(x, 1, tp.tensor([0]))
    with pytest.raises(ValueError, match="larger"):
        tp.gather(x, 1, tp.zeros(4, 1, dtype=tp.int64))
    with pytest.raises(TypeError):
        tp.gather(x, 1, [[0]])


# ------------------------------------------------------------------ cumsum

@pytest.mark.parametrize("d", tp.ALL_DTYPES, ids=lambda d: d.name)
def test_cumsum_matches_numpy_and_promotes_integers(d, rng):
    a = rng.integers(-3, 4, size=(5, 7)) if d.kind != "u" else rng.integers(0, 4, size=(5, 7))
    a = (a > 0) if d.kind == "b" else a.astype(d.numpy_dtype)
    x = tp.tensor(a, dtype=d)
    want = tp.int64 if d.kind in "biu" else d
    for dim in (0, 1, -1, -2):
        r = tp.cumsum(x, dim)
        assert r.dtype is want and r.shape == x.shape
        ref = np.cumsum(a.astype(np.float64 if d.kind == "f" else np.int64), axis=dim)
        np.testing.assert_array_equal(_h(r).astype(ref.dtype), ref)
        np.testing.assert_array_equal(_h(x.cumsum(dim)), _h(r))


def test_cumsum_dtype_out_and_edges():
    x = tp.tensor([1.5, 2.5, -1.0])
    assert tp.cumsum(x, 0, dtype=tp.float64).dtype is tp.float64
    np.testing.assert_array_equal(tp.cumsum(x, 0, dtype=tp.int32).numpy(), [1, 3, 2])   # cast first
    i = tp.tensor([1, 2, 3], dtype=tp.int8)
    r = tp.cumsum(i, 0, dtype=tp.float16)
    assert r.dtype is tp.float16 and r.tolist() == [1, 3, 6]
    big = tp.tensor([100, 100, 100], dtype=tp.int8)
    assert tp.cumsum(big, 0).tolist() == [100, 200, 300]            # int64 accumulator, as PyTorch
    assert tp.cumsum(tp.tensor([True, True, False]), 0).tolist() == [1, 2, 2]
    z = tp.cumsum(tp.tensor(4), 0)
    assert z.shape == () and z.item() == 4 and z.dtype is tp.int64
    assert tp.cumsum(tp.tensor(2.5), -1).item() == 2.5
    e = tp.cumsum(tp.zeros(3, 0), 1)
    assert e.shape == (3, 0)
    out = tp.empty(3)
    assert tp.cumsum(x, 0, out=out) is out and out.tolist() == [1.5, 4.0, 3.0]
    with pytest.raises(TypeError, match="dtype"):
        tp.cumsum(x, 0, out=tp.empty(3, dtype=tp.float64))
    with pytest.raises(IndexError):
        tp.cumsum(x, 1)
    with pytest.raises(IndexError):
        tp.cumsum(tp.tensor(1.0), 1)
    with pytest.raises(TypeError):
        tp.cumsum(x, 0.5)
    with pytest.raises(TypeError):
        tp.cumsum([1, 2], 0)


# ------------------------------------------------------------------ sort and topk

def _stable_order(a, axis, descending):
    """The stable sort of ``a`` along ``axis`` as PyTorch orders values (NaN last ascending, first descending)."""
    a = np.moveaxis(np.asarray(a), axis, -1)
    if a.dtype.kind == "f" or a.dtype.name == "bfloat16":
        w = a.astype(np.float64)
        nan = np.isnan(w)
        w = np.where(nan, 0.0, w)
        keys = (-w, ~nan) if descending else (w, nan)
        flat = [np.lexsort((k0, k1)) for k0, k1 in zip(keys[0].reshape(-1, a.shape[-1]),
                                                        keys[1].reshape(-1, a.shape[-1]))]
    else:
        w = a.astype(np.int64).reshape(-1, a.shape[-1])
        flat = [np.argsort(~r if descending else r, kind="stable") for r in w]
    order = np.array(flat, dtype=np.int64).reshape(a.shape)
    return np.moveaxis(order, -1, axis)


def _sort_data(d, shape, rng):
    if d.kind == "b":
        return rng.random(shape) < 0.5
    if d.kind in "iu":
        return rng.integers(0 if d.kind == "u" else -5, 6, size=shape).astype(d.numpy_dtype)   # many ties
    a = rng.integers(-4, 5, size=shape).astype(np.float64) * 0.5
    a.flat[::7] = np.nan
    a.flat[1::11] = -0.0
    a.flat[2::13] = np.inf
    a.flat[3::17] = -np.inf
    return a.astype(d.numpy_dtype)


@pytest.mark.parametrize("d", tp.ALL_DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("descending", [False, True])
def test_sort_is_stable_and_orders_as_pytorch(d, descending, rng):
    a = _sort_data(d, (4, 6, 9), rng)
    x = tp.tensor(a, dtype=d)
    for dim in (0, 1, 2, -1):
        r = tp.sort(x, dim, descending)
        assert isinstance(r, tp.return_types.sort)
        values, indices = r
        order = _stable_order(a, dim, descending)
        assert indices.dtype is tp.int64 and values.dtype is d and values.shape == x.shape
        np.testing.assert_array_equal(indices.numpy(), order)
        np.testing.assert_array_equal(_h(values), np.take_along_axis(_h(x), order, dim))
        m = x.sort(dim=dim, descending=descending, stable=True)
        np.testing.assert_array_equal(m.indices.numpy(), order)


def test_sort_details():
    x = tp.tensor([0.0, -0.0, float("nan"), 1.0, -float("inf"), float("nan"), 0.0])
    v, i = tp.sort(x)
    assert i.tolist() == [4, 0, 1, 6, 3, 2, 5]                 # -0.0 equals 0.0; NaN last, in order
    v, i = tp.sort(x, descending=True)
    assert i.tolist() == [2, 5, 3, 0, 1, 6, 4]
    ext = np.array([np.iinfo(np.int64).max, np.iinfo(np.int64).min, 0, -1, np.iinfo(np.int64).max])
    assert tp.sort(tp.tensor(ext)).indices.tolist() == [1, 3, 2, 0, 4]
    z = tp.sort(tp.tensor(2.0))
    assert z.values.shape == () and z.values.item() == 2.0 and z.indices.item() == 0
    e = tp.sort(tp.zeros(3, 0), dim=1)
    assert e.values.shape == (3, 0) and e.indices.dtype is tp.int64
    out = (tp.empty(7), tp.empty(7, dtype=tp.int64))
    r = tp.sort(x, out=out)
    assert r.values is out[0] and r.indices is out[1]
    assert r.indices.tolist() == [4, 0, 1, 6, 3, 2, 5]
    with pytest.raises(IndexError):
        tp.sort(x, 1)
    with pytest.raises(TypeError):
        tp.sort(x, out=tp.empty(7))
    with pytest.raises(ValueError):
        tp.sort(x, out=(tp.empty(7), tp.empty(7)))


@pytest.mark.parametrize("d", [tp.float32, tp.float16, tp.bfloat16, tp.int32, tp.uint8, tp.bool],
                         ids=lambda d: d.name)
def test_topk_is_the_head_of_the_stable_sort(d, rng):
    a = _sort_data(d, (5, 13), rng)
    x = tp.tensor(a, dtype=d)
    for dim, n in ((1, 13), (0, 5), (-1, 13)):
        for k in (0, 1, 3, n):
            for largest in (True, False):
                r = tp.topk(x, k, dim, largest)
                assert isinstance(r, tp.return_types.topk)
                order = np.take(_stable_order(a, dim, largest), np.arange(k), axis=dim)
                np.testing.assert_array_equal(r.indices.numpy(), order)
                np.testing.assert_array_equal(_h(r.values), np.take_along_axis(_h(x), order, dim))
    np.testing.assert_array_equal(x.topk(2, largest=False, sorted=True).indices.numpy(),
                                  _stable_order(a, 1, False)[:, :2])


def test_topk_details():
    x = tp.tensor([3, 1, 3, 2, 3])
    assert tp.topk(x, 2).indices.tolist() == [0, 2]                 # ties: the lower index first
    assert tp.topk(x, 2, largest=False).indices.tolist() == [1, 3]
    assert tp.topk(tp.tensor([1.0, float("nan"), 5.0]), 1).indices.tolist() == [1]   # NaN is the largest
    assert tp.topk(tp.tensor(7), 1).values.item() == 7
    with pytest.raises(ValueError, match="out of range"):
        tp.topk(x, 6)
    with pytest.raises(ValueError, match="out of range"):
        tp.topk(x, -1)
    with pytest.raises(TypeError):
        tp.topk(x, 1.0)
    with pytest.raises(IndexError):
        tp.topk(x, 1, dim=1)


# ------------------------------------------------------------------ softmax

def _softmax_ref(a, dim, log=False):
    a = a.astype(np.float64)
    z = a - a.max(axis=dim, keepdims=True)
    s = np.exp(z).sum(axis=dim, keepdims=True)
    return z - np.log(s) if log else np.exp(z) / s


@pytest.mark.parametrize("d", [tp.float32, tp.float64, tp.float16, tp.bfloat16], ids=lambda d: d.name)
def test_softmax_and_log_softmax(d, rng):
    a = (rng.standard_normal((3, 4, 5)) * 4).astype(d.numpy_dtype)
    x = tp.tensor(a, dtype=d)
    tol = {tp.float32: 1e-6, tp.float64: 1e-12, tp.float16: 1e-3, tp.bfloat16: 8e-3}[d]
    for dim in (0, 1, 2, -1):
        for log, fn in ((False, tp.softmax), (True, tp.log_softmax)):
            r = fn(x, dim)
            assert r.dtype is d and r.shape == x.shape
            np.testing.assert_allclose(_h(r), _softmax_ref(_h(x), dim, log), rtol=tol, atol=tol)
        np.testing.assert_array_equal(_h(x.softmax(dim)), _h(tp.softmax(x, dim)))
        np.testing.assert_array_equal(_h(x.log_softmax(dim)), _h(tp.log_softmax(x, dim)))
        np.testing.assert_array_equal(_h(F.softmax(x, dim)), _h(tp.softmax(x, dim)))
        np.testing.assert_array_equal(_h(F.log_softmax(x, dim=dim)), _h(tp.log_softmax(x, dim)))


def test_softmax_details():
    x = tp.tensor([[1000.0, 1000.0], [-1000.0, 0.0]])
    np.testing.assert_allclose(tp.softmax(x, 1).numpy(), [[0.5, 0.5], [0.0, 1.0]])     # no overflow
    assert np.isfinite(tp.log_softmax(x, 1).numpy()).all()
    i = tp.tensor([[1, 2], [3, 4]])
    r = tp.softmax(i, 0, dtype=tp.float64)                   # integers need a floating dtype
    assert r.dtype is tp.float64
    np.testing.assert_allclose(r.numpy(), _softmax_ref(np.array([[1, 2], [3, 4]]), 0))
    with pytest.raises(TypeError, match="floating"):
        tp.softmax(i, 0)
    with pytest.raises(TypeError, match="floating"):
        tp.softmax(x, 0, tp.int32)
    h = tp.softmax(x, 1, dtype=tp.float16)
    assert h.dtype is tp.float16
    assert tp.softmax(tp.tensor(3.0), 0).item() == 1.0
    assert tp.log_softmax(tp.tensor(3.0), -1).item() == 0.0
    assert tp.softmax(tp.zeros(0, 3), 1).shape == (0, 3)
    nan = tp.softmax(tp.tensor([[1.0, float("nan")], [float("-inf"), float("-inf")], [float("-inf"), 0.0]]), 1)
    assert np.isnan(nan.numpy()[:2]).all() and nan.numpy()[2].tolist() == [0.0, 1.0]
    with pytest.raises(IndexError):
        tp.softmax(x, 2)
    with pytest.raises(TypeError):
        tp.softmax(np.ones(3), 0)


def test_functional_softmax_without_dim_warns_and_picks_pytorchs_dimension():
    x = tp.tensor(np.arange(24, dtype=np.float32).reshape(2, 3, 4))
    with pytest.warns(UserWarning, match="Implicit dimension") as caught:
        r = F.softmax(x)
    assert caught[0].filename == __file__                 # PyTorch's default _stacklevel: the caller's line
    np.testing.assert_array_equal(r.numpy(), tp.softmax(x, 0).numpy())          # 3-d: dim 0
    m = x[0]
    with pytest.warns(UserWarning):
        np.testing.assert_array_equal(F.log_softmax(m).numpy(), tp.log_softmax(m, 1).numpy())   # 2-d: dim 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        F.softmax(x, 2)


# ------------------------------------------------------------------ tril, triu

@pytest.mark.parametrize("d", [tp.float32, tp.int64, tp.bool, tp.float16], ids=lambda d: d.name)
def test_tril_triu(d, rng):
    a = rng.integers(1, 9, size=(2, 4, 6)).astype(d.numpy_dtype)
    x = tp.tensor(a, dtype=d)
    for k in (-5, -1, 0, 1, 3, 7):
        np.testing.assert_array_equal(tp.tril(x, k).numpy(), np.tril(a, k))
        np.testing.assert_array_equal(tp.triu(x, diagonal=k).numpy(), np.triu(a, k))
        np.testing.assert_array_equal(x[0].tril(k).numpy(), np.tril(a[0], k))
        np.testing.assert_array_equal(x[0].triu(k).numpy(), np.triu(a[0], k))
    assert tp.tril(x).dtype is d
    out = tp.empty(2, 4, 6, dtype=d)
    assert tp.triu(x, out=out) is out
    with pytest.raises(ValueError, match="at least 2"):
        tp.tril(tp.ones(3))
    with pytest.raises(TypeError):
        tp.triu(x, 0.5)
    assert tp.tril(tp.zeros(0, 3)).shape == (0, 3)


# ------------------------------------------------------------------ isclose, allclose, get_default_dtype

def test_isclose_allclose_match_numpy():
    a = np.array([1.0, 1.0 + 1e-6, 1.1, np.inf, -np.inf, np.nan, 0.0, 1e-9, np.inf], dtype=np.float32)
    b = np.array([1.0, 1.0, 1.0, np.inf, -np.inf, np.nan, 1e-9, 0.0, -np.inf], dtype=np.float32)
    x, y = tp.tensor(a), tp.tensor(b)
    for rtol, atol in ((1e-5, 1e-8), (0.0, 0.0), (0.2, 0.0), (0.0, 1e-8)):
        for equal_nan in (False, True):
            r = tp.isclose(x, y, rtol, atol, equal_nan)
            assert r.dtype is tp.bool
            np.testing.assert_array_equal(r.numpy(), np.isclose(a, b, rtol, atol, equal_nan))
            assert tp.allclose(x, y, rtol, atol, equal_nan) is bool(np.allclose(a, b, rtol, atol, equal_nan))
    assert tp.allclose(x[:2], y[:2]) is True and x[:2].allclose(y[:2]) is True
    np.testing.assert_array_equal(x.isclose(y, equal_nan=True).numpy(), np.isclose(a, b, equal_nan=True))
    i, j = tp.tensor([1, 100, 5]), tp.tensor([1, 101, 7])
    np.testing.assert_array_equal(tp.isclose(i, j, rtol=0.01, atol=0).numpy(), [True, True, False])
    assert tp.isclose(tp.tensor([True, False]), tp.tensor([True, True])).tolist() == [True, False]
    assert tp.isclose(tp.ones(2, 1), tp.ones(3)).shape == (2, 3)           # broadcast
    with pytest.raises(TypeError, match="dtype"):
        tp.isclose(x, y.double())
    with pytest.raises(ValueError, match="non-negative"):
        tp.isclose(x, y, rtol=-1)
    with pytest.raises(TypeError):
        tp.allclose(x, 1.0)


def test_get_default_dtype():
    assert tp.get_default_dtype() is tp.float32
    assert tp.tensor(1.5).dtype is tp.get_default_dtype()
    assert tp.get_default_dtype.__module__ == "tensorplay"


def test_the_new_names_are_public():
    for name in ("softmax", "log_softmax", "sort", "topk", "cumsum", "allclose", "isclose", "tril", "triu",
                 "where", "gather", "get_default_dtype"):
        assert name in tp.__all__ and getattr(tp, name).__module__ == "tensorplay", name
    for name in ("float", "half", "double", "int", "long", "bool", "bfloat16", "t", "mT", "detach",
                 "new_zeros", "new_ones", "new_full", "new_empty", "type_as", "view_as", "flip", "repeat",
                 "masked_fill", "masked_fill_", "gather", "cumsum", "sort", "topk", "softmax"):
        assert hasattr(tp.Tensor, name), name
    assert tp.nn.functional.__all__ == ["dropout", "softmax", "log_softmax"]
    assert tp.return_types.sort._fields == tp.return_types.topk._fields == ("values", "indices")


# ------------------------------------------------------------------ the CUDA paths without a GPU

class _Recorder:
    """A loaded kernel's stand-in: records each launch's argument bytes."""

    def __init__(self, name, source, log):
        self.name, self.source, self.log = name, source, log

    def launch(self, grid, block, params, shared=0, stream=None):
        self.log.append((self.name, grid, block, bytes(params)))


def _param_bytes(source, name):
    """The bytes of ``name``'s parameters: 8 a scalar or pointer, a geometry
    struct's long longs."""
    m = re.search(r"\b" + name + r"\((.*?)\)\s*\{", source, re.S)
    assert m, name
    total = 0
    for param in (p.strip() for p in m.group(1).split(",")):
        ctype = param.rsplit(None, 1)[0]
        struct = re.search(r"struct " + re.escape(ctype) + r" \{(.*?)\};", source, re.S)
        if struct:
            for member in struct.group(1).split(";"):
                dims = [int(n) for n in re.findall(r"\[(\d+)\]", member)]
                if dims:
                    total += 8 * int(np.prod(dims))
        else:
            total += 8
    return total


@pytest.fixture
def fake_gpu(monkeypatch):
    """Device 0 as metadata only: allocations are fake addresses, kernels are
    recorded (source and launches), nothing runs."""
    sources, launches = {}, []
    nxt = [1 << 36]

    def fake(shape, d):
        nxt[0] += 1 << 28
        t = tp.Tensor.__new__(tp.Tensor)
        t._set_cuda(None, nxt[0], tuple(shape), tp._tensor.args.contiguous_strides(tuple(shape)), d.code, 0)
        return t

    def cached_function(key, device, make, options=()):
        src, name = make()
        sources[name] = src
        return _Recorder(name, src, launches)
    monkeypatch.setattr(_kernels, "cached_function", cached_function)
    monkeypatch.setitem(_kernels._sm_cache, 0, 132)
    for mod in (_tensor_mod, _scan, _sorting, _softmax, _reduce, _sampling, _elementwise, _creation):
        monkeypatch.setattr(mod, "empty_cuda", lambda shape, d, dev: fake(shape, d), raising=False)
    for mod in (_scan, _sorting, _softmax, _reduce, _elementwise, _indexing):
        monkeypatch.setattr(mod, "empty", lambda shape, dtype=None, device=None: fake(shape, dtype))
    monkeypatch.setattr(_indexing, "_flag", lambda dev: fake((1,), tp.int32))
    monkeypatch.setattr(_indexing, "_pending", set())     # no real flag stays due for a check
    return fake, sources, launches


def test_cuda_paths_launch_kernels_that_compile(fake_gpu):
    """The CUDA branch of each op, up to its launches, over fake device
    tensors: every launch packs exactly its kernel's parameters, and every
    kernel compiles with NVRTC to CUBIN."""
    fake, sources, launches = fake_gpu
    for d in (tp.float32, tp.float16, tp.int32, tp.bool):
        x = fake((8, 3000), d)
        tp.cumsum(x, -1, out=fake((8, 3000), tp.int64 if d.kind in "biu" else d))     # one chunk a row
        tp.cumsum(fake((2, 9000), d), 1, out=fake((2, 9000), tp.int64 if d.kind in "biu" else d))  # two levels
        tp.cumsum(x, 0, out=fake((8, 3000), tp.int64 if d.kind in "biu" else d))      # along a leading dim
        tp.sort(x, -1, True)
        tp.sort(fake((4, 4096), d), 0)
        tp.topk(x, 5, largest=False)
        tp.gather(x, 1, fake((8, 7), tp.int64))
        tp.tril(x, 2, out=fake((8, 3000), d))
        tp.triu(fake((2, 5, 7), d), -1, out=fake((2, 5, 7), d))
        x.masked_fill(fake((1, 3000), tp.bool), 1)
        tp.isclose(x, fake((8, 3000), d))
        if d.kind == "f":
            tp.softmax(x, -1)
            tp.log_softmax(x, 0)
    names = {n for n, *_ in launches}
    for prefix in ("tp_scan_", "tp_scan_add_", "tp_sort_block", "tp_sort_key_", "tp_gather_along_", "tp_tril",
                   "tp_triu", "tp_softmax_exp", "tp_softmax_div", "tp_log_softmax", "tp_reduce_row_amax"):
        assert any(n.startswith(prefix) for n in names), (prefix, sorted(names))
    for name, grid, block, params in launches:
        assert len(params) == _param_bytes(sources[name], name), name
        grid, block = np.atleast_1d(grid), np.atleast_1d(block)
        assert (grid >= 1).all() and 1 <= np.prod(block) <= 1024
    for name, src in sources.items():
        assert _nvrtc.compile_cubin(src, name + ".cu", (), 90)[:4] == b"\x7fELF", name


def test_scan_plan_covers_rows_with_whole_warps():
    for n in (1, 7, 8, 9, 255, 256, 4096, 4097, 1 << 20):
        threads, chunk, chunks = scan_kernels.scan_plan(n)
        assert threads % 32 == 0 and 32 <= threads <= scan_kernels.SCAN_BLOCK
        assert chunk == threads * scan_kernels.ITEMS and (chunks - 1) * chunk < n <= chunks * chunk
    assert scan_kernels.scan_plan(1 << 20) == (512, 4096, 256)


def test_sort_keys_order_values_as_pytorch():
    v = np.array([np.nan, -np.inf, -1.0, -0.0, 0.0, 1e-45, 1.0, np.inf, -np.nan], dtype=np.float32)
    k = sort_kernels.sort_keys(v)
    assert np.argsort(k, kind="stable").tolist() == [1, 2, 3, 4, 5, 6, 7, 0, 8]
    assert k[3] == k[4] and k[0] == k[8]
    assert (sort_kernels.sort_keys(v, True) == ~k).all()
    i = np.array([np.iinfo(np.int64).min, -1, 0, np.iinfo(np.int64).max])
    assert (np.diff(sort_kernels.sort_keys(i).astype(object)) > 0).all()
    assert sort_kernels.key_expr(dt.float64, True).startswith("(long long)(~tp_sort_key_f64")


# ------------------------------------------------------------------ on the GPU

def _cpu_and_cuda(a, d=None):
    x = tp.tensor(a, dtype=d)
    return x, x.cuda()


def _same(g, c, tol=0.0):
    """CUDA result ``g`` equals CPU result ``c`` (within ``tol`` for floats)."""
    assert g.is_cuda and g.dtype is c.dtype and g.shape == c.shape
    if tol and c.dtype.kind == "f":
        np.testing.assert_allclose(_h(g), _h(c), rtol=tol, atol=tol)
    else:
        np.testing.assert_array_equal(_h(g), _h(c))


@pytest.mark.cuda
def test_cuda_small_methods():
    a = np.arange(24, dtype=np.float32).reshape(2, 3, 4) - 10
    x, g = _cpu_and_cuda(a)
    for name in ("float", "half", "double", "int", "long", "bool", "bfloat16"):
        _same(getattr(g, name)(), getattr(x, name)())
    _same(g[0].t(), x[0].t())
    _same(g.mT.contiguous(), x.mT.contiguous())
    _same(g.flip(0, 2), x.flip(0, 2))
    _same(g.repeat(2, 1, 1, 3), x.repeat(2, 1, 1, 3))
    _same(g.new_full((2, 2), 3), x.new_full((2, 2), 3))
    assert g.new_zeros(3).is_cuda and g.new_empty(2, dtype=tp.int8).dtype is tp.int8
    d = g.detach()
    d.fill_(1.0)
    assert (g.cpu().numpy() == 1).all()
    assert g.type_as(tp.zeros(1, dtype=tp.int16)).dtype is tp.int16
    _same(x.cuda().view_as(tp.empty(6, 4)), x.view_as(tp.empty(6, 4)))


@pytest.mark.cuda
def test_cuda_masked_fill_and_gather(rng):
    a = rng.standard_normal((64, 33)).astype(np.float32)
    m = rng.random((64, 33)) < 0.3
    x, g = _cpu_and_cuda(a)
    mc, mg = _cpu_and_cuda(m)
    _same(g.masked_fill(mg, -1.5), x.masked_fill(mc, -1.5))
    _same(g.masked_fill(mg[0], 2), x.masked_fill(mc[0], 2))
    _same(g.masked_fill(mg, tp.tensor(4.0, device="cuda")), x.masked_fill(mc, tp.tensor(4.0)))
    _same(g.masked_fill(mg, tp.tensor(4.0)), x.masked_fill(mc, tp.tensor(4.0)))     # a 0-d CPU value
    h = g.clone()
    h.masked_fill_(mg, 0)
    _same(h, x.masked_fill(mc, 0))
    for dim in (0, 1, -1):
        idx = rng.integers(0, a.shape[dim], size=(40, 20))
        ic, ig = _cpu_and_cuda(idx)
        _same(tp.gather(g, dim, ig), tp.gather(x, dim, ic))
        other = 1 - dim % 2
        _same(g.T.gather(other, ig.T), x.T.gather(other, ic.T))      # strided input and index
    big = rng.standard_normal((1024, 1024)).astype(np.float32)
    idx = rng.integers(0, 1024, size=(1024, 256))
    _same(tp.gather(tp.tensor(big, device="cuda"), 1, tp.tensor(idx, device="cuda")),
          tp.gather(tp.tensor(big), 1, tp.tensor(idx)))


@pytest.mark.cuda
def test_cuda_gather_reports_bad_indices_on_the_device():
    g = tp.arange(10, dtype=tp.float32, device="cuda").view(2, 5)
    bad = tp.tensor([[0, 5]], device="cuda")
    out = tp.gather(g, 1, bad)                                   # no host read yet
    with pytest.raises(IndexError, match="out-of-range"):
        out.numpy()
    with pytest.raises(IndexError):
        tp.gather(g, 1, tp.tensor([[-1]], device="cuda"))
        tp.cuda.synchronize()
    assert tp.gather(g, 1, tp.tensor([[4]], device="cuda")).item() == 4.0     # the flag was reset


@pytest.mark.cuda
@pytest.mark.parametrize("d", [tp.float32, tp.float64, tp.int32, tp.int64, tp.bool, tp.uint8, tp.float16,
                               tp.bfloat16], ids=lambda d: d.name)
@pytest.mark.parametrize("shape, dim", [((1 << 20,), 0), ((1024, 1024), 1), ((1024, 1024), 0), ((3, 4097, 5), 1),
                                        ((7,), 0), ((), 0), ((0, 5), 1)])
def test_cuda_cumsum_matches_the_cpu(d, shape, dim, rng):
    a = (rng.random(shape) < 0.5) if d.kind == "b" else rng.integers(0, 4, size=shape).astype(d.numpy_dtype)
    x, g = _cpu_and_cuda(a, d)
    if d.kind == "f" and d.itemsize == 2 and x.numel() > 1000:
        g, x = g.float(), x.float()          # half types' sums of a million elements overflow or round
    _same(tp.cumsum(g, dim), tp.cumsum(x, dim))                  # integer-valued: exact
    _same(g.cumsum(-1 if len(shape) else 0, dtype=tp.float64), x.cumsum(-1 if len(shape) else 0, dtype=tp.float64))


@pytest.mark.cuda
def test_cuda_cumsum_of_random_floats_and_half_types(rng):
    a = rng.random(1 << 20).astype(np.float32)
    r = tp.cumsum(tp.tensor(a, device="cuda"), 0).numpy()
    np.testing.assert_allclose(r, np.cumsum(a.astype(np.float64)), rtol=2e-5)
    h = (rng.random((64, 300)) * 2 - 1).astype(np.float16)
    g = tp.cumsum(tp.tensor(h, device="cuda"), 1)
    assert g.dtype is tp.float16
    np.testing.assert_allclose(g.numpy().astype(np.float64), np.cumsum(h.astype(np.float64), 1).astype(np.float16),
                               rtol=2e-3, atol=2e-2)
    i = tp.tensor([2 ** 62, 2 ** 62, 2 ** 62], device="cuda")
    assert tp.cumsum(i, 0).tolist() == tp.cumsum(i.cpu(), 0).tolist()       # wraps as the CPU does
    out = tp.empty(1024, 1024, device="cuda").T                              # a strided out
    x = tp.tensor(rng.integers(0, 3, size=(1024, 1024)).astype(np.float32), device="cuda")
    tp.cumsum(x, 1, out=out)
    _same(out, tp.cumsum(x.cpu(), 1))


@pytest.mark.cuda
@pytest.mark.parametrize("d", [tp.float32, tp.float16, tp.bfloat16, tp.float64, tp.int64, tp.int32, tp.uint8,
                               tp.bool], ids=lambda d: d.name)
@pytest.mark.parametrize("descending", [False, True])
def test_cuda_sort_gives_the_cpus_indices(d, descending, rng):
    for shape, dim in (((1024, 1024), 1), ((1024, 1024), 0), ((1 << 20,), 0), ((5, 3000, 2), 1), ((1,), 0),
                       ((), 0), ((4, 0), 1)):
        a = _sort_data(d, shape, rng)
        x, g = _cpu_and_cuda(a, d)
        rg, rc = tp.sort(g, dim, descending), tp.sort(x, dim, descending)
        _same(rg.indices, rc.indices)
        _same(rg.values, rc.values)


@pytest.mark.cuda
def test_cuda_topk(rng):
    for d in (tp.float32, tp.float16, tp.int64):
        a = _sort_data(d, (64, 1 << 14), rng)
        x, g = _cpu_and_cuda(a, d)
        for k, largest, dim in ((1, True, 1), (10, True, 1), (10, False, 1), (64, True, 0), (0, True, 1)):
            rg, rc = tp.topk(g, k, dim, largest), tp.topk(x, k, dim, largest)
            _same(rg.indices, rc.indices)
            _same(rg.values, rc.values)
    v, i = tp.topk(tp.tensor([5, 7, 7, 1, 7], device="cuda"), 2)
    assert i.tolist() == [1, 2] and v.tolist() == [7, 7]


@pytest.mark.cuda
@pytest.mark.parametrize("d", [tp.float32, tp.float16, tp.bfloat16, tp.float64], ids=lambda d: d.name)
def test_cuda_softmax_matches_the_cpu(d, rng):
    tol = {tp.float32: 2e-6, tp.float64: 1e-12, tp.float16: 1e-3, tp.bfloat16: 8e-3}[d]
    for shape, dim in (((1024, 1024), -1), ((1024, 1024), 0), ((8, 50, 3), 1), ((5,), 0), ((), 0), ((0, 4), 1)):
        a = (rng.standard_normal(shape) * 5).astype(d.numpy_dtype)
        x, g = _cpu_and_cuda(a, d)
        _same(tp.softmax(g, dim), tp.softmax(x, dim), tol)
        _same(tp.log_softmax(g, dim), tp.log_softmax(x, dim), tol * 10)
        _same(F.softmax(g, dim, dtype=tp.float64), F.softmax(x, dim, dtype=tp.float64), 1e-12)
    x, g = _cpu_and_cuda(np.array([[1.0, np.nan, 0.0], [-np.inf] * 3, [1e4, 0.0, -1e4]], dtype=np.float32))
    _same(tp.softmax(g, 1), tp.softmax(x, 1), 1e-6)


@pytest.mark.cuda
def test_cuda_tril_triu_isclose_allclose(rng):
    a = rng.standard_normal((3, 1024, 1000)).astype(np.float32)
    x, g = _cpu_and_cuda(a)
    for k in (-3, 0, 5):
        _same(tp.tril(g, k), tp.tril(x, k))
        _same(g.triu(k), x.triu(k))
        _same(tp.tril(g.transpose(1, 2), k), tp.tril(x.transpose(1, 2), k))       # strided
    b = a + rng.standard_normal(a.shape).astype(np.float32) * 1e-6
    b.flat[::97] = np.nan
    y, h = _cpu_and_cuda(b)
    for equal_nan in (False, True):
        _same(tp.isclose(g, h, 1e-5, 1e-6, equal_nan), tp.isclose(x, y, 1e-5, 1e-6, equal_nan))
    assert tp.allclose(g, g.clone()) is True
    assert tp.allclose(g, h) is tp.allclose(x, y) is False
    assert tp.allclose(g, g + 1e-9) is True


def _replays_right(fn, make_input, rng, tol=0.0):
    """Capture ``fn`` over a static CUDA input, write new values into the
    input, replay, and compare each output with ``fn`` on the CPU."""
    first = make_input(rng)
    static = tp.tensor(first).cuda()
    warm(fn, static)
    g = CUDAGraph()
    with tp.cuda.graph(g):
        outs = fn(static)
    outs = outs if isinstance(outs, tuple) else (outs,)
    for _ in range(2):
        new = make_input(rng)
        static.copy_(tp.tensor(new).cuda())
        g.replay()
        ref = fn(tp.tensor(new))
        ref = ref if isinstance(ref, tuple) else (ref,)
        for o, r in zip(outs, ref):
            _same(o, r, tol)


@pytest.mark.cuda
@pytest.mark.parametrize("case", ["softmax", "softmax_dim0", "log_softmax_half", "cumsum", "cumsum_rows_int",
                                  "sort", "sort_dim0", "topk", "gather", "masked_fill", "tril", "triu",
                                  "isclose", "flip_repeat", "conversions"])
def test_graph_replay_gives_the_right_result(case, rng):
    idx = tp.tensor(rng.integers(0, 1024, size=(1024, 64)), device="cuda")
    cases = {
        "softmax": (lambda x: tp.softmax(x, -1), lambda r: r.standard_normal((1024, 1024)).astype(np.float32), 2e-6),
        "softmax_dim0": (lambda x: x.softmax(0), lambda r: r.standard_normal((1024, 1024)).astype(np.float32), 2e-6),
        "log_softmax_half": (lambda x: tp.log_softmax(x, 1),
                             lambda r: r.standard_normal((256, 1000)).astype(np.float16), 1e-2),
        "cumsum": (lambda x: tp.cumsum(x, 0), lambda r: r.integers(0, 4, size=1 << 20).astype(np.float32), 0),
        "cumsum_rows_int": (lambda x: x.cumsum(1), lambda r: r.integers(-9, 9, size=(1024, 1024)).astype(np.int32),
                            0),
        "sort": (lambda x: tuple(tp.sort(x, descending=True)),
                 lambda r: r.integers(0, 50, size=(256, 3000)).astype(np.float32), 0),
        "sort_dim0": (lambda x: tuple(x.sort(0)), lambda r: r.integers(0, 9, size=(1000, 64)).astype(np.int64), 0),
        "topk": (lambda x: tuple(tp.topk(x, 8, largest=False)),
                 lambda r: r.integers(0, 100, size=(64, 1 << 14)).astype(np.float32), 0),
        "gather": (lambda x: tp.gather(x, 1, idx if x.is_cuda else idx.cpu()),
                   lambda r: r.standard_normal((1024, 1024)).astype(np.float32), 0),
        "masked_fill": (lambda x: x.masked_fill(x > 0.5, -2.0),
                        lambda r: r.standard_normal((1024, 1024)).astype(np.float32), 0),
        "tril": (lambda x: tp.tril(x, -2), lambda r: r.standard_normal((4, 512, 512)).astype(np.float32), 0),
        "triu": (lambda x: x.triu(3), lambda r: r.standard_normal((1024, 1024)).astype(np.float32), 0),
        "isclose": (lambda x: tp.isclose(x, x * 1.000001, rtol=1e-6),
                    lambda r: r.standard_normal((1024, 1024)).astype(np.float32), 0),
        "flip_repeat": (lambda x: (x.flip(0, 1), x.repeat(2, 3)),
                        lambda r: r.standard_normal((300, 500)).astype(np.float32), 0),
        "conversions": (lambda x: (x.half(), x.int(), x.bool(), x.bfloat16(), x.double()),
                        lambda r: (r.standard_normal((1024, 1024)) * 100).astype(np.float32), 0),
    }
    fn, make, tol = cases[case]
    _replays_right(fn, make, rng, tol)
