# SPDX-License-Identifier: Apache-2.0
"""repr(tensor) prints what PyTorch prints with its default print options
(torch._tensor_str: precision 4, threshold 1000, edgeitems 3, linewidth
80): the expected texts are PyTorch's for the same values, with
``torch.`` dtypes read ``tensorplay.``."""

import numpy as np
import pytest

import tensorplay as tp
from tensorplay._tensor.printing import format_tensor

NAN, INF = float("nan"), float("inf")

CASES = [
    # floats that are all integers: "1.", the point saying float
    (lambda: tp.tensor([1.0, 2.0, 3.0]), "tensor([1., 2., 3.])"),
    (lambda: tp.tensor([1.0, -2.0]), "tensor([ 1., -2.])"),
    (lambda: tp.tensor(3.0), "tensor(3.)"),
    (lambda: tp.tensor([-0.0, 1.0]), "tensor([-0., 1.])"),
    # 4 digits after the point
    (lambda: tp.tensor([0.1, 0.25]), "tensor([0.1000, 0.2500])"),
    (lambda: tp.tensor(2.5), "tensor(2.5000)"),
    (lambda: tp.tensor([-1.5, 2.0]), "tensor([-1.5000,  2.0000])"),
    (lambda: tp.tensor([1.5, NAN, INF]), "tensor([1.5000,    nan,    inf])"),
    (lambda: tp.tensor([0.0, NAN]), "tensor([0., nan])"),
    (lambda: tp.tensor([1.0, -INF]), "tensor([1., -inf])"),
    # scientific: magnitudes over 1e8, spanning more than 1000x, or under 1e-4
    (lambda: tp.tensor([1e-5, 1.0]), "tensor([1.0000e-05, 1.0000e+00])"),
    (lambda: tp.tensor([123456789.0]), "tensor([1.2346e+08])"),
    (lambda: tp.tensor([1e8, 1.0]), "tensor([1.0000e+08, 1.0000e+00])"),
    (lambda: tp.tensor([0.5, 2000.0]), "tensor([5.0000e-01, 2.0000e+03])"),
    (lambda: tp.tensor([1.0, 1000.0]), "tensor([   1., 1000.])"),
    # 80 columns: 9 values of width 6 a line after "tensor("
    (lambda: tp.full((10,), 0.5), "tensor([0.5000, 0.5000, 0.5000, 0.5000, 0.5000, 0.5000, 0.5000, 0.5000, 0.5000,\n"
                                  "        0.5000])"),
    # integers, bools and their dtypes
    (lambda: tp.tensor([[1, 2], [3, 4]]), "tensor([[1, 2],\n        [3, 4]])"),
    (lambda: tp.tensor([1, -20, 300]), "tensor([  1, -20, 300])"),
    (lambda: tp.arange(3, dtype=tp.int32), "tensor([0, 1, 2], dtype=tensorplay.int32)"),
    (lambda: tp.tensor([7], dtype=tp.uint8), "tensor([7], dtype=tensorplay.uint8)"),
    (lambda: tp.tensor([True, False]), "tensor([ True, False])"),
    (lambda: tp.tensor(True), "tensor(True)"),
    (lambda: tp.arange(8).reshape(2, 2, 2), "tensor([[[0, 1],\n         [2, 3]],\n\n"
                                            "        [[4, 5],\n         [6, 7]]])"),
    # half and bfloat16 print as float, with their dtype
    (lambda: tp.zeros(2, 3, dtype=tp.float16),
     "tensor([[0., 0., 0.],\n        [0., 0., 0.]], dtype=tensorplay.float16)"),
    (lambda: tp.tensor([0.1, 1.0], dtype=tp.bfloat16), "tensor([0.1001, 1.0000], dtype=tensorplay.bfloat16)"),
    (lambda: tp.tensor([0.1], dtype=tp.float64), "tensor([0.1000], dtype=tensorplay.float64)"),
    # empty tensors: the size unless (0,), the dtype unless float32
    (lambda: tp.tensor([]), "tensor([])"),
    (lambda: tp.zeros(0, 3), "tensor([], size=(0, 3))"),
    (lambda: tp.tensor([], dtype=tp.int64), "tensor([], dtype=tensorplay.int64)"),
    (lambda: tp.zeros(2, 0, dtype=tp.bool), "tensor([], size=(2, 0), dtype=tensorplay.bool)"),
    # more than 1000 elements: 3 at each edge, the formatter over those only
    (lambda: tp.arange(2000.0), "tensor([0.0000e+00, 1.0000e+00, 2.0000e+00,  ..., 1.9970e+03, 1.9980e+03,\n"
                                "        1.9990e+03])"),
    (lambda: tp.arange(1001), "tensor([   0,    1,    2,  ...,  998,  999, 1000])"),
    (lambda: tp.arange(1000), None),          # 1000 elements: not summarised
    (lambda: tp.zeros(100, 100), "tensor([[0., 0., 0.,  ..., 0., 0., 0.],\n"
                                 "        [0., 0., 0.,  ..., 0., 0., 0.],\n"
                                 "        [0., 0., 0.,  ..., 0., 0., 0.],\n"
                                 "        ...,\n"
                                 "        [0., 0., 0.,  ..., 0., 0., 0.],\n"
                                 "        [0., 0., 0.,  ..., 0., 0., 0.],\n"
                                 "        [0., 0., 0.,  ..., 0., 0., 0.]])"),
    (lambda: tp.ones(2, 600, dtype=tp.int32), "tensor([[1, 1, 1,  ..., 1, 1, 1],\n"
                                              "        [1, 1, 1,  ..., 1, 1, 1]], dtype=tensorplay.int32)"),
]


@pytest.mark.parametrize("make, expected", CASES)
def test_repr_prints_as_pytorch(make, expected):
    t = make()
    if expected is None:                  # tp.arange(1000): every value, 14 a line of 80 columns
        lines = repr(t).split("\n")
        assert "..." not in repr(t) and len(lines) == 72 and lines[-1] == "        994, 995, 996, 997, 998, 999])"
        assert lines[0] == "tensor([  0,   1,   2,   3,   4,   5,   6,   7,   8,   9,  10,  11,  12,  13,"
        return
    assert repr(t) == expected
    assert str(t) == expected


def test_a_view_prints_its_own_values():
    x = tp.arange(12.0).reshape(3, 4)
    assert repr(x[:, 1]) == "tensor([1., 5., 9.])"
    assert repr(x.transpose(0, 1)[0]) == "tensor([0., 4., 8.])"


def test_device_and_dtype_suffixes_wrap_at_80_columns():
    """device first, then dtype; a suffix that would pass column 80 goes on a
    line of its own, indented under the values (PyTorch's _add_suffixes)."""
    values = np.array([1.0, 2.0], dtype=np.float32)
    assert format_tensor(values, tp.float32, "cuda:0") == "tensor([1., 2.], device='cuda:0')"
    assert format_tensor(values.astype(np.float16), tp.float16, "cuda:1") == \
        "tensor([1., 2.], device='cuda:1', dtype=tensorplay.float16)"
    assert format_tensor(np.zeros(0, np.int64), tp.int64, "cuda:0") == \
        "tensor([], device='cuda:0', dtype=tensorplay.int64)"
    row = np.full(9, 0.5, dtype=np.float64)
    assert format_tensor(row, tp.float64, "cuda:0") == (
        "tensor([0.5000, 0.5000, 0.5000, 0.5000, 0.5000, 0.5000, 0.5000, 0.5000, 0.5000],\n"
        "       device='cuda:0', dtype=tensorplay.float64)")


@pytest.mark.cuda
def test_cuda_tensors_print_their_device():
    x = tp.tensor([0.1, 0.25], device="cuda")
    assert repr(x) == "tensor([0.1000, 0.2500], device='cuda:0')"
    h = tp.tensor([[1, 2], [3, 4]], dtype=tp.int32, device="cuda")
    assert repr(h) == "tensor([[1, 2],\n        [3, 4]], device='cuda:0', dtype=tensorplay.int32)"
    assert repr(tp.arange(2000.0, device="cuda")) == (
        "tensor([0.0000e+00, 1.0000e+00, 2.0000e+00,  ..., 1.9970e+03, 1.9980e+03,\n"
        "        1.9990e+03], device='cuda:0')")
