# SPDX-License-Identifier: Apache-2.0
"""Kernel generation and NVRTC compilation: no GPU needed."""

import itertools
import os
import re
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import tensorplay as tp
from tensorplay._kernels import nvrtc as _nvrtc
from tensorplay._kernels import cache
from tensorplay._graph import kernels as graph_kernels
from tensorplay._kernels import param_upload
from tensorplay._kernels import codegen as _codegen
from tensorplay._graph.copytable import COPY_CAPACITIES

ARCH = 90


def test_nvrtc_version_and_archs():
    major, minor = _nvrtc.nvrtc_version()
    assert major >= 12
    assert ARCH in _nvrtc.supported_archs()
    assert _nvrtc.target_for(ARCH) == ("sm_90", True)


@pytest.mark.parametrize("ndim", [0, 1, 3])
def test_copy_kernels_compile_to_cubin_for_every_dtype_pair(ndim):
    for out, inp in itertools.product(tp.ALL_DTYPES, tp.ALL_DTYPES):
        src = _codegen.elementwise_source("k", out, (inp,), "a0", ndim)
        image = _nvrtc.compile_cubin(src, arch=ARCH)
        assert image[:4] == b"\x7fELF", "expected a CUBIN (ELF), not PTX"


@pytest.mark.parametrize("d", tp.ALL_DTYPES)
def test_fill_kernels_compile(d):
    kind = "f" if d.kind == "f" else "i"
    src = _codegen.elementwise_source("fill", d, (), "s0", 2, (kind,))
    assert "s0" in src and ("double s0" if kind == "f" else "long long s0") in src
    assert _nvrtc.compile_cubin(src, arch=ARCH)[:4] == b"\x7fELF"


def test_compile_errors_carry_the_log():
    with pytest.raises(tp.NVRTCError) as info:
        _nvrtc.compile_cubin('extern "C" __global__ void k() { undefined_name = 1; }', arch=ARCH)
    assert "undefined_name" in info.value.log
    assert "NVRTC_ERROR_COMPILATION" in str(info.value)


def test_disk_cache_is_used_by_a_new_process(tmp_path):
    src = 'extern "C" __global__ void cached_kernel(int* x) { x[0] = %d; }' % os.getpid()
    code = ("import tensorplay._kernels.nvrtc as n, sys\n"
            f"n.compile_cubin({src!r}, arch={ARCH})\n"
            "print(n.cache_stats()['compiled'], n.cache_stats()['disk_hits'])\n")
    env = dict(os.environ, TENSORPLAY_CACHE_DIR=str(tmp_path))
    first = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd="/")
    second = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd="/")
    assert first.returncode == 0, first.stderr
    assert first.stdout.split() == ["1", "0"]
    assert second.stdout.split() == ["0", "1"]
    assert list(tmp_path.rglob("*.bin"))


def test_cache_key_covers_source_options_and_arch():
    k = _nvrtc.cache_key("a", (), 90)
    assert k != _nvrtc.cache_key("b", (), 90)
    assert k != _nvrtc.cache_key("a", ("-lineinfo",), 90)
    assert k != _nvrtc.cache_key("a", (), 80)
    assert k == _nvrtc.cache_key("a", (), 90)


def _offsets(shape, strides):
    return [sum(i * s for i, s in zip(idx, strides)) for idx in np.ndindex(*shape)] if shape else [0]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 4), min_size=0, max_size=5), st.data())
def test_collapse_dims_preserves_every_offset(shape, data):
    n_ops = data.draw(st.integers(1, 3))
    strides_list = []
    for _ in range(n_ops):
        kind = data.draw(st.sampled_from(["contig", "broadcast", "random"]))
        if kind == "contig":
            strides_list.append(list(tp._tensor.args.contiguous_strides(shape)))
        elif kind == "broadcast":
            base = tp._tensor.args.contiguous_strides(shape)
            strides_list.append([0 if data.draw(st.booleans()) else s for s in base])
        else:
            strides_list.append([data.draw(st.integers(-7, 7)) for _ in shape])
    cshape, cstrides = _codegen.collapse_dims(tuple(shape), strides_list)
    for st_orig, st_new in zip(strides_list, cstrides):
        assert _offsets(tuple(shape), st_orig) == _offsets(cshape, st_new)


def test_graph_layer_kernels_compile(monkeypatch):
    """stage_and_launch's multi-copy kernels (every table capacity) and the
    conditional-handle setter generate sources NVRTC compiles."""
    made = []
    monkeypatch.setattr(cache, "cached_function", lambda key, dev, make: made.append((key, make())))
    for cap in COPY_CAPACITIES:
        graph_kernels.multi_copy_function(cap, 0)
    graph_kernels.set_conditional_function(0)
    assert [k for k, _ in made] == [("multi_copy", c) for c in COPY_CAPACITIES] + [("set_conditional",)]
    for _, (src, name) in made:
        assert f"void {name}(" in src
        assert _nvrtc.compile_cubin(src, name + ".cu", (), ARCH)[:4] == b"\x7fELF"


# ------------------------------------------------------------------ creation and small host data

def test_param_write_kernels_compile_and_take_the_packed_table(monkeypatch):
    """Every table of the small-host-data kernel compiles to CUBIN for the
    oldest (sm_75) and our (sm_90) GPUs; its one parameter is exactly as
    large as the buffer pack_param_write makes, and it stores bytes only
    (any destination alignment)."""
    from helpers import ptx_of
    made = []
    monkeypatch.setattr(cache, "cached_function", lambda key, dev, make: made.append((key, make())))
    for cap in param_upload.PARAM_UPLOAD_CAPACITIES:
        param_upload.param_write_function(cap, 0)
    assert [k for k, _ in made] == [("param_write", c) for c in param_upload.PARAM_UPLOAD_CAPACITIES]
    for (_, cap), (src, name) in made:
        assert name == f"tp_write_param_bytes_{cap}"
        for arch in (75, ARCH):
            assert _nvrtc.compile_cubin(src, name + ".cu", (), arch)[:4] == b"\x7fELF"
        ptx = ptx_of(src)
        declared = re.search(rf"\.param \.align (\d+) \.b8 {name}_param_0\[(\d+)\]", ptx)
        assert declared, ptx
        _, packed = param_upload.pack_param_write(0x1001, bytes(cap))
        assert int(declared.group(1)) == 8 and int(declared.group(2)) == len(packed) == cap + 16
        stores = [line.split()[0] for line in ptx.splitlines() if line.strip().startswith("st.")]
        assert stores == ["st.global.u8"]


@pytest.mark.parametrize("d", tp.ALL_DTYPES)
def test_arange_kernels_compile_for_every_dtype(d):
    """arange's kernel (flat: its output is a fresh contiguous tensor) compiles
    for every dtype; the floating one multiplies and adds in float64 rounded
    at each step, as NumPy's loop, never as a fused multiply-add."""
    from helpers import ptx_of
    kind, expr, scalars = tp._tensor.creation.arange_kernel_args(0.5, 0.25, d)
    src = _codegen.elementwise_source(f"tp_arange_{d.name}", d, (), expr, 0, (kind,) * len(scalars))
    assert _nvrtc.compile_cubin(src, "arange.cu", (), ARCH)[:4] == b"\x7fELF"
    ptx = ptx_of(src)
    if d.kind == "f":
        assert kind == "f" and "mul.rn.f64" in ptx and "add.rn.f64" in ptx
        assert "fma.rn.f64" not in ptx
    else:
        assert kind == "i" and "f64" not in ptx
