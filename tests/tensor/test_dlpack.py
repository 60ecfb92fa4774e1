# SPDX-License-Identifier: Apache-2.0
"""DLPack without a GPU: a CPU round trip with NumPy sharing memory, and the
capsule machinery (export, import, consumption, release) on a CUDA-typed
tensor over a fake address. (test_interop.py exchanges CUDA tensors with
PyTorch and CuPy on the GPU.)"""

import gc
import sys

import numpy as np
import pytest

import tensorplay as tp
from tensorplay._tensor.dlpack import dlpack_import, to_capsule


def test_cpu_dlpack_roundtrip_with_numpy():
    a = np.arange(4.0)
    t = tp.from_dlpack(a)
    assert t.data_ptr() == a.ctypes.data
    back = np.from_dlpack(t)
    assert back.ctypes.data == a.ctypes.data
    assert t.__dlpack_device__() == (1, 0)


def test_cpu_tensor_has_no_cuda_array_interface():
    assert not hasattr(tp.zeros(2), "__cuda_array_interface__")


def test_dlpack_export_import_releases_every_reference():
    """The DLPack capsule machinery needs no GPU: a CUDA-typed tensor over a fake
    address exercises export, import, consumption and release."""
    t = tp.Tensor.__new__(tp.Tensor)
    t._set_cuda(None, 0x1000, (4, 3), (1, 4), tp.float32.code, 0)
    base = sys.getrefcount(t)
    for versioned in (False, True):
        cap = to_capsule(t, versioned)
        owner, ptr, shape, strides, dtype, device, ro = dlpack_import(cap)
        assert (ptr, shape, strides, dtype, device, ro) == (0x1000, (4, 3), (1, 4), (2, 32, 1), (2, 0), False)
        with pytest.raises(TypeError, match="unconsumed"):
            dlpack_import(cap)
        assert sys.getrefcount(t) == base + 1
        del owner, cap
        unused = to_capsule(t, versioned)    # never consumed: its destructor releases it
        del unused
    gc.collect()
    assert sys.getrefcount(t) == base
