# SPDX-License-Identifier: Apache-2.0
"""Tensor.view(dtype) reinterprets the bytes as torch.Tensor.view(dtype) and
NumPy's ndarray.view do: the same shape for a dtype of the same size, the
last dimension scaled otherwise (it must have stride 1); a view of the same
memory, no copy, on the CPU and on CUDA."""

import itertools

import numpy as np
import pytest

import tensorplay as tp
from helpers import ALL_DTYPES, random_array

PAIRS = list(itertools.product(ALL_DTYPES, ALL_DTYPES))
_SAME_SIZE_INT = {1: tp.uint8, 2: tp.int16, 4: tp.int32, 8: tp.int64}


def _bits(a):
    """The bytes of a host array, to compare reinterpretations exactly (NaN payloads included)."""
    return np.ascontiguousarray(a).view(np.uint8)


def _expected(t, d):
    return t.numpy().view(d.numpy_dtype)


def _layouts(t):
    """Layouts that allow every dtype view: contiguous, every other row, a
    column block starting 8 elements in."""
    return [t, t[::2], t[:, 8:16]]


@pytest.mark.parametrize("src,dst", PAIRS, ids=[f"{a.name}-{b.name}" for a, b in PAIRS])
def test_cpu_view_dtype_matches_numpy(src, dst, rng):
    t = tp.tensor(random_array((4, 24), src, rng), dtype=src)
    for x in _layouts(t):
        v = x.view(dst)
        want = _expected(x, dst)
        assert v.dtype is dst and v.shape == want.shape
        assert v.strides == tuple(s // dst.itemsize for s in want.strides)
        assert np.array_equal(_bits(v.numpy()), _bits(want))
        assert v.data_ptr() == x.data_ptr()


def test_the_view_shares_memory_and_accepts_dtype_spellings():
    t = tp.zeros(2, 4, dtype=tp.float32)
    t.view(tp.int32)[0, 1] = 0x3F800000
    assert t[0, 1].item() == 1.0
    t.view("uint8")[1, 0:4] = tp.tensor([0, 0, 0x80, 0xBF], dtype=tp.uint8)
    assert t[1, 0].item() == -1.0
    assert t.view(np.int16).shape == (2, 8)
    assert t.view(np.dtype("float64")).shape == (2, 2)
    assert tp.tensor(1.0).view(tp.int32).item() == 0x3F800000          # 0-d, same size
    assert tp.zeros(3, 0).view(tp.float64).shape == (3, 0)


@pytest.mark.parametrize("make,dtype,match", [
    (lambda: tp.zeros(4, 4).T, tp.int8, "last dimension must have stride 1, it has 4"),
    (lambda: tp.zeros(4, 3), tp.float64, "last dimension's size 3 must be a multiple of 2"),
    (lambda: tp.zeros(4, 4, dtype=tp.int8)[:, 1:3], tp.int16, "2-byte aligned"),
    (lambda: tp.zeros(3, 4, dtype=tp.int8)[:, :2], tp.int32, "size 2 must be a multiple of 4"),
    (lambda: tp.tensor(1.0), tp.int8, "a 0-d tensor cannot change its element size"),
])
def test_layouts_that_do_not_allow_the_dtype_raise(make, dtype, match):
    with pytest.raises(ValueError, match=match):
        make().view(dtype)


def test_odd_strides_of_other_dims_raise():
    t = tp.zeros(6, 4, dtype=tp.int8).reshape(2, 3, 4)[:, :, :2]        # strides (12, 4, 1): fine for int16
    assert t.view(tp.int16).shape == (2, 3, 1)
    s = tp.zeros(3, 6, dtype=tp.int8)[:, :4]                              # row stride 6
    with pytest.raises(ValueError, match=r"strides \(6, 1\) must be multiples of 4"):
        s.view(tp.int32)


def test_view_of_something_else_is_a_clear_type_error():
    t = tp.zeros(4)
    for bad in (2.5, None, object()):
        with pytest.raises(TypeError, match="view takes a shape .* or a dtype"):
            t.view(bad)
    assert t.view(2, 2).shape == (2, 2) and t.view((4,)).shape == (4,) and t.view(-1).shape == (4,)


@pytest.mark.cuda
@pytest.mark.parametrize("src,dst", PAIRS, ids=[f"{a.name}-{b.name}" for a, b in PAIRS])
def test_cuda_view_dtype_is_a_view_matching_numpy(src, dst, rng):
    host = tp.tensor(random_array((4, 24), src, rng), dtype=src)
    t = host.cuda()
    for x, hx in zip(_layouts(t), _layouts(host)):
        v = x.view(dst)
        want = _expected(hx, dst)
        assert v.is_cuda and v.dtype is dst and v.shape == want.shape
        assert v.data_ptr() == x.data_ptr()
        # read back through an integer view of the same size: copying a
        # non-contiguous bool or half tensor normalises bools and NaN payloads
        raw = v.view(_SAME_SIZE_INT[dst.itemsize]).cpu().numpy()
        assert np.array_equal(_bits(raw), _bits(want))


@pytest.mark.cuda
def test_cuda_view_dtype_writes_through():
    t = tp.zeros(2, 4, device="cuda")
    t.view(tp.int32)[0, 1] = 0x3F800000
    assert t[0, 1].item() == 1.0
    with pytest.raises(ValueError, match="stride 1"):
        t.T.view(tp.float16)
