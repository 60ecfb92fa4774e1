# SPDX-License-Identifier: Apache-2.0
"""Tensors pickle as their values, dtype and shape (a view as its own values,
not its base's); CUDA tensors come back on the same device index, as
PyTorch's; a CUDA tensor pickled inside a capture raises the capture error
and leaves the capture usable. copy.deepcopy clones on the device."""

import copy
import pickle

import numpy as np
import pytest

import tensorplay as tp
from helpers import ALL_DTYPES, random_array

PROTOCOLS = range(2, pickle.HIGHEST_PROTOCOL + 1)


def _same(a, b):
    assert a.dtype is b.dtype and a.shape == b.shape and a.device == b.device
    x, y = a.cpu().numpy(), b.cpu().numpy()
    if a.dtype is tp.bfloat16:
        x, y = x.astype(np.float32), y.astype(np.float32)
    assert np.array_equal(x, y, equal_nan=a.dtype.is_floating_point)


def _layouts(t):
    """t (2-D), a transpose, a strided slice, a row, a 0-d element and an empty slice."""
    return [t, t.T, t[:, ::2], t[1], t[1, 2], t[:0]]


@pytest.mark.parametrize("d", ALL_DTYPES)
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_cpu_round_trip_every_dtype_and_layout(d, protocol, rng):
    t = tp.tensor(random_array((3, 5), d, rng), dtype=d)
    if d.is_floating_point:
        t[0, 0] = float("nan")
    for x in _layouts(t):
        y = pickle.loads(pickle.dumps(x, protocol=protocol))
        _same(x, y)
        assert y.is_contiguous()
        if x.numel():
            y.fill_(0)                        # its own, writable memory
    assert pickle.loads(pickle.dumps(tp.tensor(7, dtype=d))).ndim == 0


def test_a_view_pickles_only_its_values():
    base = tp.zeros(1000, 1000)
    small = base[3:5, 7:9]
    assert len(pickle.dumps(small)) < 1000
    y = pickle.loads(pickle.dumps(small))
    y.fill_(1)
    assert base.sum().item() == 0


def test_tensors_inside_structures_and_deepcopy():
    a = tp.arange(6).reshape(2, 3)
    obj = {"a": a, "b": [a.T, tp.tensor(2.5)]}
    back = pickle.loads(pickle.dumps(obj))
    _same(back["a"], a)
    _same(back["b"][0], a.T)
    c = copy.deepcopy(obj)
    _same(c["b"][1], obj["b"][1])
    c["a"].fill_(0)
    assert a.tolist() == [[0, 1, 2], [3, 4, 5]]
    assert copy.deepcopy(a.T).is_contiguous()


@pytest.mark.cuda
@pytest.mark.parametrize("d", ALL_DTYPES)
def test_cuda_round_trip_comes_back_on_the_same_device(d, rng):
    dev = tp.cuda.device_count() - 1              # the last device: the index must be kept
    t = tp.tensor(random_array((4, 6), d, rng), dtype=d, device=f"cuda:{dev}")
    for x in _layouts(t):
        for protocol in PROTOCOLS:
            y = pickle.loads(pickle.dumps(x, protocol=protocol))
            assert y.is_cuda and y.device == x.device
            _same(x, y)
    z = copy.deepcopy(t.T)
    assert z.is_cuda and z.device == t.device and z.data_ptr() != t.data_ptr()
    _same(z, t.T)


@pytest.mark.cuda
def test_pickling_a_cuda_tensor_inside_a_capture_raises_and_keeps_the_capture():
    x = tp.ones(4, device="cuda")
    (x * 2).sum()
    tp.cuda.synchronize()
    g = tp.cuda.CUDAGraph()
    with tp.cuda.graph(g):
        y = x * 2
        with pytest.raises(tp.cuda.CudaError, match="CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED.*pickled") as info:
            pickle.dumps(y)
        assert "pickle it before or after the capture" in str(info.value)
        assert tp.cuda.is_current_stream_capturing()
        z = copy.deepcopy(y)                       # a device copy: captured, no host read
    g.replay()
    assert z.tolist() == [2.0] * 4
    assert pickle.loads(pickle.dumps(y)).tolist() == [2.0] * 4
