# SPDX-License-Identifier: Apache-2.0
"""Zero-copy exchange with PyTorch and CuPy (both installed on the GPU machine)."""

import gc

import numpy as np
import pytest

import tensorplay as tp

pytestmark = pytest.mark.cuda


def test_dlpack_capsule_roundtrip_within_tensorplay():
    x = tp.arange(12, device="cuda").view(3, 4).T
    y = tp.from_dlpack(x.__dlpack__())
    assert y.data_ptr() == x.data_ptr() and y.strides == x.strides and y.shape == x.shape
    y2 = tp.from_dlpack(x)
    assert y2.data_ptr() == x.data_ptr()
    assert np.array_equal(y2.numpy(), x.numpy())
    cap = x.__dlpack__(max_version=(1, 0))
    z = tp.from_dlpack(cap)
    with pytest.raises(TypeError, match="unconsumed"):
        tp.from_dlpack(cap)         # a capsule is consumed once
    assert z.tolist() == x.tolist()
    x.__dlpack__()                  # an unconsumed capsule frees its export when it dies
    gc.collect()


def test_cuda_array_interface_roundtrip_within_tensorplay():
    x = tp.arange(6, dtype=tp.float32, device="cuda").view(2, 3)[:, 1:]
    cai = x.__cuda_array_interface__
    assert cai["version"] == 3 and cai["data"][0] == x.data_ptr()
    assert cai["strides"] == (12, 4) and cai["typestr"] == "<f4" and cai["stream"] == 1
    y = tp.as_tensor(x)
    assert y is x

    class Holder:
        __cuda_array_interface__ = cai
    z = tp.as_tensor(Holder())
    assert z.data_ptr() == x.data_ptr() and z.tolist() == [[1.0, 2.0], [4.0, 5.0]]
    with pytest.raises(TypeError, match="bfloat16"):
        tp.zeros(2, dtype=tp.bfloat16, device="cuda").__cuda_array_interface__


def test_foreign_pointer_of_no_device_is_rejected():
    class Bogus:
        __cuda_array_interface__ = {"shape": (4,), "typestr": "<f4", "data": (0x1000, False), "version": 3}
    with pytest.raises(tp.cuda.CudaError):
        tp.as_tensor(Bogus())


def test_pytorch_roundtrip_shares_memory():
    torch = pytest.importorskip("torch")
    t = torch.arange(12, dtype=torch.float32, device="cuda").reshape(3, 4)
    x = tp.from_dlpack(t)
    assert x.data_ptr() == t.data_ptr() and x.shape == (3, 4) and x.dtype is tp.float32
    x.fill_(2.0)
    assert float(t.sum().item()) == 24.0
    back = torch.from_dlpack(x)
    assert back.data_ptr() == t.data_ptr()
    y = tp.zeros(5, dtype=tp.bfloat16, device="cuda")
    ty = torch.from_dlpack(y)
    assert ty.dtype == torch.bfloat16 and ty.data_ptr() == y.data_ptr()
    ty += 1.5
    assert y.tolist() == [1.5] * 5
    del t, back
    gc.collect()
    assert x.tolist() == [[2.0] * 4] * 3         # x keeps PyTorch's storage alive
    z = tp.as_tensor(torch.ones(3, device="cuda"))
    assert z.tolist() == [1.0, 1.0, 1.0]
    s = torch.cuda.Stream()
    ext = tp.cuda.ExternalStream(s.cuda_stream)
    with tp.cuda.stream(ext):
        w = tp.full((3,), 4.0, device="cuda")
    s.synchronize()
    assert w.tolist() == [4.0] * 3
    with tp.cuda.stream(s):      # torch streams carry .cuda_stream
        pass


def test_cupy_roundtrip_shares_memory():
    cp = pytest.importorskip("cupy")
    a = cp.arange(10, dtype=cp.int32)
    x = tp.as_tensor(a)
    assert x.data_ptr() == a.data.ptr and x.dtype is tp.int32
    x.fill_(7)
    assert int(a.sum()) == 70
    b = cp.asarray(x)
    assert b.data.ptr == x.data_ptr()
    y = tp.arange(6, dtype=tp.float64, device="cuda").view(2, 3).T
    c = cp.asarray(y)
    assert c.data.ptr == y.data_ptr() and c.strides == (8, 24)
    assert np.array_equal(cp.asnumpy(c), y.numpy())
    d = tp.from_dlpack(cp.ones(4, dtype=cp.float16))
    assert d.tolist() == [1.0] * 4
    e = cp.from_dlpack(tp.full((2,), 3, dtype=tp.int16, device="cuda"))
    assert e.tolist() == [3, 3]


@pytest.mark.parametrize("via", ["dlpack", "cuda_array_interface"])
def test_a_graph_keeps_foreign_memory_alive(via):
    """Delete every reference to a PyTorch tensor a capture read and wrote,
    let PyTorch allocate again, replay: the graph still uses the original
    memory (kept through the owner object) and nothing else is overwritten."""
    torch = pytest.importorskip("torch")
    src = torch.full((4096,), 3.0, device="cuda")
    dst = torch.zeros(4096, device="cuda")
    wrap = tp.from_dlpack if via == "dlpack" else tp.as_tensor
    a, b = wrap(src), wrap(dst)
    b.copy_(a * 2)
    tp.cuda.synchronize()
    g = tp.cuda.CUDAGraph()
    with tp.cuda.graph(g):
        b.copy_(a * 2)
        total = b.sum()
    src_ptr = src.data_ptr()
    del src, dst, a, b
    gc.collect()
    torch.cuda.synchronize()
    fillers = [torch.full((4096,), -1.0, device="cuda") for _ in range(64)]
    assert all(f.data_ptr() != src_ptr for f in fillers)
    g.replay()
    assert total.item() == 6.0 * 4096
    torch.cuda.synchronize()
    assert all(bool((f == -1.0).all()) for f in fillers)
    g.reset()
