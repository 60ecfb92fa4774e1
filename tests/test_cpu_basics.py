# SPDX-License-Identifier: Apache-2.0
"""What works on any machine: import, dtypes, devices, CPU tensors, errors."""

import pickle
import subprocess
import sys

import numpy as np
import pytest

import tensorplay as tp
from conftest import ALL_DTYPES, HAS_CUDA, random_array


def test_import_without_gpu_reports_unavailable():
    code = ("import os; os.environ['TENSORPLAY_DISABLE_CUDA']='1'\n"
            "import tensorplay as tp\n"
            "assert tp.cuda.is_available() is False\n"
            "assert tp.cuda.device_count() == 0\n"
            "assert 'TENSORPLAY_DISABLE_CUDA' in tp.cuda.unavailable_reason()\n"
            "try:\n    tp.empty(2, device='cuda')\nexcept tp.cuda.CudaUnavailableError as e:\n"
            "    print('OK', e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("OK CUDA is not available")


@pytest.mark.skipif(HAS_CUDA, reason="checks the no-GPU behaviour")
def test_cuda_calls_raise_clearly_without_gpu():
    assert not tp.cuda.is_available()
    for call in (lambda: tp.cuda.current_device(), lambda: tp.cuda.Stream(),
                 lambda: tp.zeros(3, device="cuda"), lambda: tp.cuda.synchronize(),
                 lambda: tp.cuda.memory_allocated(), lambda: tp.cuda.enable_peer_access(0, 1)):
        with pytest.raises(tp.cuda.CudaUnavailableError, match="CUDA is not available"):
            call()


def test_cuda_error_is_picklable_and_named():
    err = tp.cuda.CudaError(1, "CUDA_ERROR_INVALID_VALUE", "invalid argument")
    assert isinstance(err, RuntimeError)
    assert str(err) == "CUDA_ERROR_INVALID_VALUE: invalid argument"
    back = pickle.loads(pickle.dumps(err))
    assert (back.code, back.name, back.description) == (1, "CUDA_ERROR_INVALID_VALUE", "invalid argument")
    oom = pickle.loads(pickle.dumps(tp.cuda.OutOfMemoryError()))
    assert isinstance(oom, tp.cuda.CudaError) and oom.name == "CUDA_ERROR_OUT_OF_MEMORY"


def test_make_error_names_the_result_without_a_driver():
    from tensorplay._driver.context import make_error
    e = make_error(2)
    assert isinstance(e, tp.cuda.OutOfMemoryError)
    assert e.name == "CUDA_ERROR_OUT_OF_MEMORY"
    assert make_error(1).name == "CUDA_ERROR_INVALID_VALUE"


@pytest.mark.parametrize("spec,expected", [
    ("float32", tp.float32), (np.float16, tp.float16), (np.dtype("int8"), tp.int8),
    (bool, tp.bool), (int, tp.int64), (float, tp.float64), ("half", tp.float16),
    (tp.bfloat16, tp.bfloat16)])
def test_dtype_parsing(spec, expected):
    assert tp._dtypes.as_dtype(spec) is expected


@pytest.mark.parametrize("bad", ["float128", np.complex64, np.uint16, object(), "nope"])
def test_unknown_dtypes_raise_type_error(bad):
    with pytest.raises(TypeError):
        tp.empty(2, dtype=bad)


def test_dtype_identity_survives_pickle():
    for d in ALL_DTYPES:
        assert pickle.loads(pickle.dumps(d)) is d


@pytest.mark.parametrize("spec,typ,index", [("cpu", "cpu", None), ("cuda", "cuda", None),
                                            ("cuda:3", "cuda", 3), (2, "cuda", 2)])
def test_device_parsing(spec, typ, index):
    d = tp._device.as_device(spec)
    assert (d.type, d.index) == (typ, index)
    assert d == tp.device(str(d))


@pytest.mark.parametrize("bad,exc", [("gpu", ValueError), ("cuda:x", ValueError), (-1, ValueError),
                                     ("cuda:-1", ValueError), (1.5, TypeError), (True, TypeError)])
def test_bad_devices_raise(bad, exc):
    with pytest.raises(exc):
        tp.empty(2, device=bad)


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
    with pytest.raises(TypeError):
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
    import gc
    from tensorplay._tensor.dlpack import dlpack_import, to_capsule
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


def test_show_config_reports_versions(capsys):
    info = tp.config()
    assert info["tensorplay"] == tp.__version__ and info["numpy"] == np.__version__
    assert info["nvrtc"].split(".")[0].isdigit()
    if not HAS_CUDA:
        assert info["gpus"] == [] and info["cuda"]     # the driver may be there, the GPU not
    tp.show_config()
    out = capsys.readouterr().out
    assert "tensorplay" in out and "cuda-bindings" in out


def test_package_ships_its_typing_marker():
    import importlib.resources
    assert importlib.resources.files("tensorplay").joinpath("py.typed").is_file()


def test_capture_errors_name_the_open_captures():
    """A capture-related CUresult's error carries the graph layer's
    description of the open captures; other errors do not."""
    from cuda.bindings import driver
    from tensorplay._driver import context as _cuda
    from tensorplay._graph import capture as _graph
    assert _cuda.describe_open_captures() == ""          # none open
    _cuda.set_open_capture_describer(lambda: "CUDAGraph at 0x1 is capturing")
    try:
        err = _cuda.make_error(int(driver.CUresult.CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED))
        assert "CUDAGraph at 0x1 is capturing" in str(err)
        assert err.name == "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED"
        assert "CUDAGraph" not in str(_cuda.make_error(int(driver.CUresult.CUDA_ERROR_INVALID_VALUE)))
        _cuda.set_open_capture_describer(lambda: 1 / 0)
        assert _cuda.describe_open_captures() == ""      # a broken describer hides nothing
        assert "CAPTURE" in str(_cuda.make_error(int(driver.CUresult.CUDA_ERROR_STREAM_CAPTURE_INVALIDATED)))
    finally:
        _cuda.set_open_capture_describer(_graph._describe_open_captures)
