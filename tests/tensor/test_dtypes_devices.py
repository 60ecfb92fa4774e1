# SPDX-License-Identifier: Apache-2.0
"""Dtypes and devices (no GPU needed): what each spelling parses to, the
errors of unknown ones, and dtype identity through pickling."""

import pickle

import numpy as np
import pytest

import tensorplay as tp
from helpers import ALL_DTYPES


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
