# SPDX-License-Identifier: Apache-2.0
"""Kernel generation and NVRTC compilation: no GPU needed."""

import itertools
import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import tensorplay as tp
from tensorplay._kernels import nvrtc as _nvrtc
from tensorplay._kernels import cache, graph_kernels
from tensorplay._kernels import codegen as _codegen
from tensorplay._stager import STAGE_CAPACITIES

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
            strides_list.append(list(tp._tensor._contiguous_strides(shape)))
        elif kind == "broadcast":
            base = tp._tensor._contiguous_strides(shape)
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
    for cap in STAGE_CAPACITIES:
        graph_kernels.multi_copy_function(cap, 0)
    graph_kernels.set_conditional_function(0)
    assert [k for k, _ in made] == [("multi_copy", c) for c in STAGE_CAPACITIES] + [("set_conditional",)]
    for _, (src, name) in made:
        assert f"void {name}(" in src
        assert _nvrtc.compile_cubin(src, name + ".cu", (), ARCH)[:4] == b"\x7fELF"
