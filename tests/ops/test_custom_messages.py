# SPDX-License-Identifier: Apache-2.0
"""Custom kernels say what is wrong in the user's terms: a CPU tensor given
to an ElementwiseKernel, tensors on several devices, a number that does not
fit a RawKernel parameter (no internal device codes or struct messages)."""

import pytest

import tensorplay as tp
from tensorplay._ops import custom as _custom


def fake_cuda(shape, dtype, device=0):
    t = tp.Tensor.__new__(tp.Tensor)
    t._set_cuda(None, 0x100000, tuple(shape), tp._tensor.args.contiguous_strides(shape), dtype.code, device)
    return t


def test_elementwise_kernel_on_a_cpu_tensor_says_it_needs_cuda_tensors():
    k = tp.cuda.ElementwiseKernel("float32 x", "float32 y", "y = x * 2", "double_it")
    with pytest.raises(ValueError) as info:
        k(tp.zeros(3))
    msg = str(info.value)
    assert msg == ("double_it: x is on the CPU; custom kernels run on CUDA tensors "
                   "(move it with .cuda() or .to('cuda'))")
    with pytest.raises(ValueError, match="double_it: y is on the CPU"):
        k(fake_cuda((3,), tp.float32), tp.zeros(3))
    with pytest.raises(ValueError, match=r"double_it: x is on the CPU"):
        k([1.0, 2.0])                                   # host data becomes a CPU tensor


def test_elementwise_kernel_on_two_devices_names_them():
    k = tp.cuda.ElementwiseKernel("float32 x, float32 z", "float32 y", "y = x + z", "add_them")
    with pytest.raises(ValueError, match=r"add_them: the tensors must be on one CUDA device, "
                                         r"got x on cuda:0, z on cuda:1"):
        k(fake_cuda((3,), tp.float32, 0), fake_cuda((3,), tp.float32, 1))


def test_raw_kernel_messages():
    k = tp.cuda.RawKernel('extern "C" __global__ void k(float* x, unsigned char f) {}', "k")
    with pytest.raises(ValueError, match=r"k: tensors on cuda:0 and cuda:1; one launch runs on one device"):
        k((1,), (1,), (fake_cuda((2,), tp.float32, 0), fake_cuda((2,), tp.float32, 1)))
    with pytest.raises(OverflowError) as info:
        _custom._pack(["P", "B"], (0x1000, 300), 0)
    assert str(info.value) == "argument 1: 300 does not fit the kernel's unsigned char parameter"
    with pytest.raises(OverflowError, match="argument 0: -1 does not fit the kernel's unsigned long long"):
        _custom._pack(["Q"], (-1,), 0)
