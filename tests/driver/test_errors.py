# SPDX-License-Identifier: Apache-2.0
"""The driver's error types: their public names (tensorplay.cuda.*), pickling,
the error made from a CUresult with and without a driver, and the open
captures named in a capture-related error."""

import pickle
import traceback

import pytest

import tensorplay as tp
from tensorplay._driver import context as _cuda


def test_cuda_error_is_picklable_and_named():
    err = tp.cuda.CudaError(1, "CUDA_ERROR_INVALID_VALUE", "invalid argument")
    assert isinstance(err, RuntimeError)
    assert str(err) == "CUDA_ERROR_INVALID_VALUE: invalid argument"
    back = pickle.loads(pickle.dumps(err))
    assert (back.code, back.name, back.description) == (1, "CUDA_ERROR_INVALID_VALUE", "invalid argument")
    oom = pickle.loads(pickle.dumps(tp.cuda.OutOfMemoryError()))
    assert isinstance(oom, tp.cuda.CudaError) and oom.name == "CUDA_ERROR_OUT_OF_MEMORY"


def test_make_error_names_the_result_without_a_driver():
    e = _cuda.make_error(2)
    assert isinstance(e, tp.cuda.OutOfMemoryError)
    assert e.name == "CUDA_ERROR_OUT_OF_MEMORY"
    assert _cuda.make_error(1).name == "CUDA_ERROR_INVALID_VALUE"


def test_capture_errors_name_the_open_captures():
    """A capture-related CUresult's error carries the graph layer's
    description of the open captures; other errors do not."""
    from cuda.bindings import driver
    from tensorplay._graph import registry
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
        _cuda.set_open_capture_describer(registry.describe_open_captures)


@pytest.mark.parametrize("err", [tp.cuda.CudaError(1, "CUDA_ERROR_INVALID_VALUE", "invalid argument"),
                                 tp.cuda.OutOfMemoryError(),
                                 tp.cuda.CudaUnavailableError("CUDA is not available: no GPU")])
def test_errors_print_their_public_path_and_pickle(err):
    cls = type(err)
    assert cls.__module__ == "tensorplay.cuda"
    assert getattr(tp.cuda, cls.__name__) is cls
    assert repr(cls) == f"<class 'tensorplay.cuda.{cls.__name__}'>"
    line = traceback.format_exception_only(cls, err)[-1]
    assert line.startswith(f"tensorplay.cuda.{cls.__name__}: ")
    data = pickle.dumps(err)
    assert b"tensorplay.cuda" in data and b"tensorplay._driver.context" not in data
    back = pickle.loads(data)
    assert type(back) is cls and str(back) == str(err)
    if isinstance(err, tp.cuda.CudaError):
        assert (back.code, back.name, back.description) == (err.code, err.name, err.description)


def test_make_error_keeps_the_status_code_and_name():
    err = _cuda.make_error(2, "cuMemAlloc of 1 TiB")
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is tp.cuda.OutOfMemoryError
    assert back.code == 2 and back.name == "CUDA_ERROR_OUT_OF_MEMORY" and "1 TiB" in str(back)
