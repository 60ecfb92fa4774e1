# SPDX-License-Identifier: Apache-2.0
"""The CPU backend of the ops (NumPy underneath) against plain NumPy, and the
promotion rules against PyTorch's documented results."""

import math

import numpy as np
import pytest

import tensorplay as tp


@pytest.mark.parametrize("a,b,expected", [
    (tp.uint8, tp.int8, tp.int16), (tp.int32, tp.float16, tp.float16), (tp.float16, tp.bfloat16, tp.float32),
    (tp.bool, tp.int8, tp.int8), (tp.int64, tp.float32, tp.float32), (tp.uint8, tp.int64, tp.int64),
    (tp.float64, tp.float16, tp.float64), (tp.bool, tp.bool, tp.bool)])
def test_promote_types(a, b, expected):
    assert tp.promote_types(a, b) is expected
    assert tp.promote_types(b, a) is expected


def test_result_type_weak_scalars_and_zero_dim():
    i32 = tp.zeros(3, dtype=tp.int32)
    f16 = tp.zeros(3, dtype=tp.float16)
    assert tp.result_type(i32, 2) is tp.int32
    assert tp.result_type(i32, 2.5) is tp.float32
    assert tp.result_type(f16, 2.5) is tp.float16
    assert tp.result_type(tp.zeros(3, dtype=tp.bool), 1) is tp.int64
    assert tp.result_type(tp.zeros(3, dtype=tp.int8), tp.tensor(5, dtype=tp.int64)) is tp.int8
    assert tp.result_type(tp.zeros(3, dtype=tp.int8), tp.tensor(5.0, dtype=tp.float64)) is tp.float64
    assert tp.result_type(tp.zeros(3, dtype=tp.float16), tp.tensor(5.0, dtype=tp.float64)) is tp.float16
    assert (tp.zeros(2, dtype=tp.int8) + 1000).dtype is tp.int8
    assert tp.can_cast(tp.int64, tp.int8) and not tp.can_cast(tp.float16, tp.int64)
    assert not tp.can_cast(tp.int32, tp.bool)


def test_arithmetic_semantics_on_cpu():
    a = tp.tensor([-7, -3, 3, 7])
    b = tp.tensor([2, -2, 2, -2])
    assert (a // b).tolist() == [-4, 1, 1, -4]
    assert (a % b).tolist() == [1, -1, 1, -1]
    assert (a / b).dtype is tp.float32
    assert (a / b).tolist() == [-3.5, 1.5, 1.5, -3.5]
    assert tp.tensor([1, 0]).div(0).tolist()[0] == math.inf
    assert (tp.tensor([2]) ** 10).item() == 1024
    with pytest.raises(TypeError, match="bool"):
        tp.tensor([True]) - tp.tensor([False])
    with pytest.raises(TypeError, match="bool"):
        -tp.tensor([True])
    with pytest.raises(TypeError, match="integer and bool"):
        tp.tensor([1.0]) & tp.tensor([2.0])
    x = tp.tensor([1.0, float("nan"), -2.0])
    assert tp.maximum(x, 0.0).numpy()[1] != tp.maximum(x, 0.0).numpy()[1]     # NaN propagates
    assert tp.relu(x).tolist()[2] == 0.0
    assert (x > 0).dtype is tp.bool


def test_out_and_inplace_rules_on_cpu():
    a = tp.ones(3, dtype=tp.int32)
    out = tp.empty(3, dtype=tp.float64)
    tp.add(a, 2, out=out)
    assert out.tolist() == [3.0, 3.0, 3.0]
    with pytest.raises(TypeError, match="can't be cast"):
        tp.add(a, 2.5, out=tp.empty(3, dtype=tp.int32))
    with pytest.raises(ValueError, match="shape"):
        tp.add(a, 2, out=tp.empty(4, dtype=tp.int32))
    with pytest.raises(TypeError, match="can't be cast"):
        a.add_(0.5)
    a += 2
    assert a.tolist() == [3, 3, 3] and a.dtype is tp.int32
    with pytest.raises(ValueError, match="shape"):
        a.add_(tp.ones(2, 3, dtype=tp.int32))


def test_reductions_on_cpu_match_numpy(rng):
    a = rng.standard_normal((3, 4, 5)).astype(np.float32)
    t = tp.tensor(a)
    assert np.allclose(t.sum().item(), a.sum(dtype=np.float64), rtol=1e-5)
    assert np.allclose(t.sum((0, 2)).numpy(), a.sum((0, 2)), rtol=1e-5)
    assert t.sum(1, keepdim=True).shape == (3, 1, 5)
    assert np.allclose(t.mean(-1).numpy(), a.mean(-1), rtol=1e-5)
    vals, idx = t.max(1)
    assert np.array_equal(vals.numpy(), a.max(1)) and np.array_equal(idx.numpy(), a.argmax(1))
    assert t.argmin().item() == a.argmin()
    assert np.allclose(t.var(0).numpy(), a.var(0, ddof=1), rtol=1e-4)
    assert np.allclose(t.std(correction=0).item(), a.std(), rtol=1e-4)
    assert np.allclose(t.norm().item(), np.linalg.norm(a.ravel()), rtol=1e-5)
    assert tp.tensor([[True, False]]).all(1).tolist() == [False]
    assert tp.zeros(0).sum().item() == 0 and tp.ones(0).prod().item() == 1
    assert math.isnan(tp.zeros(0).mean().item())
    with pytest.raises(IndexError):
        tp.zeros(0).amax()
    with pytest.raises(TypeError, match="mean"):
        tp.arange(3).mean()
    with pytest.raises(ValueError, match="more than once"):
        t.sum((1, 1))
    assert tp.arange(5, dtype=tp.int8).sum().dtype is tp.int64


def test_matmul_and_creation_on_cpu(rng):
    a = rng.standard_normal((2, 3, 4)).astype(np.float32)
    b = rng.standard_normal((4, 5)).astype(np.float32)
    assert np.allclose((tp.tensor(a) @ tp.tensor(b)).numpy(), a @ b, rtol=1e-5)
    v = rng.standard_normal(4).astype(np.float32)
    assert np.allclose(tp.mv(tp.tensor(b.T), tp.tensor(v)).numpy(), b.T @ v, rtol=1e-5)
    with pytest.raises(ValueError, match="align"):
        tp.tensor(b) @ tp.tensor(b)
    with pytest.raises(TypeError, match="dtype"):
        tp.tensor(b) @ tp.tensor(b.T.astype(np.float64))
    assert np.allclose(tp.linspace(-1, 1, 5).numpy(), np.linspace(-1, 1, 5))
    assert np.array_equal(tp.eye(2, 3).numpy(), np.eye(2, 3))
    x, y = tp.tensor([[1, 2]]), tp.tensor([[3, 4]])
    assert tp.cat([x, y]).tolist() == [[1, 2], [3, 4]]
    assert tp.stack([x[0], y[0]], 1).tolist() == [[1, 3], [2, 4]]
    with pytest.raises(ValueError):
        tp.cat([x, tp.zeros(1, 3)])


def test_advanced_indexing_on_cpu():
    a = np.arange(20).reshape(4, 5)
    t = tp.tensor(a)
    assert np.array_equal(t[tp.tensor([3, 0, -1])].numpy(), a[[3, 0, -1]])
    assert np.array_equal(t[:, [1, 4]].numpy(), a[:, [1, 4]])
    assert np.array_equal(t[t > 10].numpy(), a[a > 10])
    assert np.array_equal(t[1, tp.tensor([[0, 1], [2, 3]])].numpy(), a[1, [[0, 1], [2, 3]]])
    with pytest.raises(IndexError, match="out of bounds"):
        t[tp.tensor([4])]
    with pytest.raises(IndexError, match="integer or bool"):
        t[tp.tensor([1.0])]
    t[t > 15] = -1
    t[:, [0]] = tp.tensor([[9], [8], [7], [6]])
    ref = a.copy()
    ref[ref > 15] = -1
    ref[:, [0]] = [[9], [8], [7], [6]]
    assert np.array_equal(t.numpy(), ref)
