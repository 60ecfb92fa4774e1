# SPDX-License-Identifier: Apache-2.0
"""CPU tensors against NumPy: sizes, creation, from_numpy sharing memory,
copies casting and broadcasting, views and their errors, item/tolist/bool,
to and clone, and the guarded constructor."""

import numpy as np
import pytest

import tensorplay as tp
from helpers import ALL_DTYPES, random_array


@pytest.mark.parametrize("size,exc", [((-1,), ValueError), ((2, -3), ValueError), ((1.5,), TypeError),
                                      (("a",), TypeError), (((2, None),), TypeError)])
def test_bad_sizes_raise(size, exc):
    with pytest.raises(exc):
        tp.empty(*size)


def test_creation_matches_numpy_on_cpu():
    assert np.array_equal(tp.zeros(2, 3).numpy(), np.zeros((2, 3), np.float32))
    assert np.array_equal(tp.ones((4,), dtype=tp.int8).numpy(), np.ones(4, np.int8))
    assert np.array_equal(tp.full((2, 2), 7).numpy(), np.full((2, 2), 7, np.int64))
    assert tp.full((2,), 1.5).dtype is tp.float32
    assert tp.full((2,), True).dtype is tp.bool
    assert np.array_equal(tp.arange(5).numpy(), np.arange(5))
    assert np.allclose(tp.arange(0, 1, 0.25).numpy(), np.arange(0, 1, 0.25))
    assert tp.arange(0, 1, 0.25).dtype is tp.float32
    assert tp.tensor([1, 2]).dtype is tp.int64
    assert tp.tensor([1.0, 2]).dtype is tp.float32
    assert tp.tensor(np.array([1.0])).dtype is tp.float64
    assert tp.tensor([True]).dtype is tp.bool
    with pytest.raises(ValueError):
        tp.arange(0, 3, 0)
    with pytest.raises(ValueError, match="ragged"):
        tp.tensor([[1, 2], [3]])


def test_from_numpy_shares_memory():
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    t = tp.from_numpy(a)
    t[1, 2] = 100
    assert a[1, 2] == 100
    assert t.data_ptr() == a.ctypes.data
    assert np.shares_memory(np.asarray(t), a)
    with pytest.raises(TypeError):
        tp.from_numpy([1, 2])


@pytest.mark.parametrize("src_dt", ALL_DTYPES)
@pytest.mark.parametrize("dst_dt", ALL_DTYPES)
def test_cpu_copy_casts_like_numpy(src_dt, dst_dt, rng):
    src = random_array((3, 4), src_dt, rng, 0, 100)
    dst = tp.empty(3, 4, dtype=dst_dt)
    dst.copy_(tp.from_numpy(src))
    expected = src.astype(dst_dt.numpy_dtype)
    assert np.array_equal(dst.numpy(), expected)


def test_cpu_copy_broadcasts_and_rejects_bad_shapes():
    dst = tp.zeros(2, 3)
    dst.copy_(tp.tensor([1.0, 2.0, 3.0]))
    assert np.array_equal(dst.numpy(), np.tile([1, 2, 3], (2, 1)))
    with pytest.raises(ValueError, match="broadcast"):
        dst.copy_(tp.zeros(4))
    with pytest.raises(ValueError, match="broadcast"):
        tp.zeros(3).copy_(tp.zeros(2, 3))
    with pytest.raises(TypeError):
        dst.copy_(object())


def test_views_on_cpu_match_numpy(rng):
    a = rng.standard_normal((4, 5, 6)).astype(np.float32)
    t = tp.tensor(a)
    cases = [
        (lambda x: x[1], lambda y: y[1]),
        (lambda x: x[:, 1:4:2], lambda y: y[:, 1:4:2]),
        (lambda x: x[..., ::-2], lambda y: y[..., ::-2]),
        (lambda x: x[None, 2, ..., None], lambda y: y[None, 2, ..., None]),
        (lambda x: x.transpose(0, 2), lambda y: y.transpose(2, 1, 0)),
        (lambda x: x.permute(1, 2, 0), lambda y: y.transpose(1, 2, 0)),
        (lambda x: x.reshape(20, 6), lambda y: y.reshape(20, 6)),
        (lambda x: x.view(-1), lambda y: y.reshape(-1)),
        (lambda x: x.T.reshape(-1), lambda y: y.T.reshape(-1)),
        (lambda x: x.flatten(1), lambda y: y.reshape(4, 30)),
        (lambda x: x[:, :1].expand(4, 3, 6), lambda y: np.broadcast_to(y[:, :1], (4, 3, 6))),
        (lambda x: x.unsqueeze(1).squeeze(1), lambda y: y),
        (lambda x: x[-1, -1, -1], lambda y: y[-1, -1, -1]),
    ]
    for f, g in cases:
        assert np.array_equal(f(t).numpy(), g(a))


def test_view_errors():
    t = tp.zeros(4, 5)
    with pytest.raises(ValueError, match="not compatible"):
        t.T.view(20)
    with pytest.raises(ValueError, match="invalid"):
        t.view(3, 7)
    with pytest.raises(IndexError):
        t[4]
    with pytest.raises(IndexError, match="too many"):
        t[0, 0, 0]
    with pytest.raises(TypeError, match="unsupported index"):
        t[1.5]
    with pytest.raises(ValueError):
        t.expand(3, 5)
    with pytest.raises(ValueError):
        t.permute(0, 0)


def test_item_tolist_bool_on_cpu():
    assert tp.tensor([3.5]).item() == 3.5
    assert tp.tensor([[1, 2]]).tolist() == [[1, 2]]
    assert bool(tp.tensor([1])) is True
    with pytest.raises(ValueError, match="ambiguous"):
        bool(tp.tensor([1, 2]))
    with pytest.raises(ValueError, match="exactly one element"):
        tp.tensor([1, 2]).item()
    assert tp.tensor([1.5], dtype=tp.bfloat16).item() == 1.5


def test_to_and_clone_on_cpu():
    t = tp.tensor([1.5, 2.5])
    assert t.to(tp.float32) is t
    h = t.to(tp.float16)
    assert h.dtype is tp.float16 and np.array_equal(h.numpy(), np.array([1.5, 2.5], np.float16))
    c = t.clone()
    c[0] = 9
    assert t[0].item() == 1.5
    assert t.to("cpu") is t


def test_tensor_constructor_is_guarded():
    with pytest.raises(TypeError, match="tensorplay.tensor"):
        tp.Tensor([1, 2])


