# SPDX-License-Identifier: Apache-2.0
"""The bandwidth paths of the generated kernels, without a GPU: each kernel
choice is a pure function of shapes, strides and pointers (tested here), and
each kernel compiles with NVRTC (checked in its PTX for the memory accesses
it is meant to make)."""

import itertools
import random

import pytest

import tensorplay as tp
from tensorplay import _nvrtc
from tensorplay._ops import _codegen, _kernels

ARCH = 90


def ptx_of(source):
    """PTX of ``source`` for compute_90: to see which loads a kernel makes."""
    from cuda.bindings import nvrtc
    err, prog = nvrtc.nvrtcCreateProgram(source.encode(), b"k.cu", 0, [], [])
    assert err == nvrtc.nvrtcResult.NVRTC_SUCCESS
    try:
        opts = [b"--gpu-architecture=compute_90", b"-std=c++17"]
        (res,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
        assert res == nvrtc.nvrtcResult.NVRTC_SUCCESS
        err, n = nvrtc.nvrtcGetPTXSize(prog)
        buf = b" " * n
        (res,) = nvrtc.nvrtcGetPTX(prog, buf)
        assert res == nvrtc.nvrtcResult.NVRTC_SUCCESS
        return buf.decode()
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


def cubin_ok(source):
    return _nvrtc.compile_cubin(source, "k.cu", (), ARCH)[:4] == b"\x7fELF"


# ------------------------------------------------------------------ flat elementwise

def test_vector_width_is_16_bytes_of_the_widest_operand_when_all_are_aligned():
    assert _kernels.vector_width([0x1000, 0x2000, 0x3000], [4, 4, 4], 1 << 20) == 4
    assert _kernels.vector_width([0x1000, 0x2000], [2, 2], 100) == 8
    assert _kernels.vector_width([0x1000, 0x2000], [1, 8], 100) == 2     # bool out of float64
    assert _kernels.vector_width([0x1000], [1], 100) == 16
    # bool out of float32: 4 elements, the bool pointer needs only 4-byte alignment
    assert _kernels.vector_width([0x1004, 0x2000], [1, 4], 100) == 4
    assert _kernels.vector_width([0x1002, 0x2000], [1, 4], 100) == 1


def test_vector_width_falls_back_to_scalar_for_misaligned_pointers_or_tiny_counts():
    assert _kernels.vector_width([0x1000, 0x2004, 0x3000], [4, 4, 4], 1 << 20) == 1   # x[1:]
    assert _kernels.vector_width([0x1008, 0x2000], [4, 4], 1 << 20) == 1
    assert _kernels.vector_width([0x1000, 0x2000], [4, 4], 3) == 1
    assert _kernels.vector_width([0x1000, 0x2000], [4, 4], 4) == 4


def test_flat_grid_covers_every_tile_up_to_a_cap_from_the_sm_count():
    tile = _codegen.flat_tile([4, 4, 4])
    assert tile == 256 * 2 * 4
    assert _kernels.flat_grid(1, tile, 132) == 1
    assert _kernels.flat_grid(tile * 10 + 1, tile, 132) == 11
    assert _kernels.flat_grid(64 << 20, tile, 132) == 132 * _kernels.FLAT_BLOCKS_PER_SM
    assert _kernels.flat_grid(64 << 20, tile, 16) == 16 * _kernels.FLAT_BLOCKS_PER_SM


class _Recorder:
    def __init__(self, log):
        self.log = log

    def launch(self, grid, block, params, shared=0, stream=None):
        self.log.append((grid, block, params))


def test_flat_kernels_test_the_alignment_vector_width_tests():
    """The flat kernel decides its vector path on the device (a cached plan is
    reused with other pointers); it must test the same masks as vector_width."""
    rnd = random.Random(3)
    for sizes in ([4, 4, 4], [2, 2], [1, 4], [8, 1, 8], [1], [2, 4, 8]):
        masks = _codegen.alignment_masks(sizes)
        for _ in range(100):
            ptrs = [0x10000 + rnd.choice([0, 1, 2, 4, 8, 16, 32]) * s for s in sizes]
            aligned = not any(p & m for p, m in zip(ptrs, masks))
            assert (_kernels.vector_width(ptrs, sizes, 1000) > 1) == aligned
    src = _codegen.elementwise_source("k", tp.float16, (tp.float32, tp.int8), "a0", 0)
    masks = _codegen.alignment_masks([2, 4, 1])
    assert masks == (7, 15, 3)
    assert ("((unsigned long long)out & 7ULL) | ((unsigned long long)in0 & 15ULL) | "
            "((unsigned long long)in1 & 3ULL)") in src


def test_flat_launch_plans_size_the_grid_in_tiles(monkeypatch):
    monkeypatch.setitem(_kernels._sm_cache, 0, 132)
    plan = _kernels.LaunchPlan(None, 0, 10_000, 3, (), (), (), (4, 4, 4))
    assert plan.grid == -(-10_000 // 2048)
    plan = _kernels.LaunchPlan(None, 0, 10_000, 3, (), (4,), ([1], [1], [1]))
    assert plan.grid == -(-10_000 // 256)


@pytest.mark.parametrize("d", tp.ALL_DTYPES)
def test_flat_kernels_load_and_store_128_bits_per_access(d):
    src = _codegen.elementwise_source("k", d, (d, d), "a0", 0)
    ptx = ptx_of(src)
    width = _codegen.flat_vector_width([d.itemsize])
    assert width * d.itemsize == 16
    def wide(line):    # 128 bits: four 32-bit or two 64-bit lanes
        return any(v in line for v in (".v4.f32", ".v4.u32", ".v4.b32", ".v4.s32",
                                       ".v2.f64", ".v2.u64", ".v2.b64", ".v2.s64"))
    lines = ptx.splitlines()
    assert any("ld.global" in l and wide(l) for l in lines), f"no 128-bit loads for {d.name}"
    assert any("st.global" in l and wide(l) for l in lines), f"no 128-bit stores for {d.name}"


def test_flat_kernels_compile_for_mixed_dtypes_fill_and_index_expressions():
    f32, f64, b, bf = tp.float32, tp.float64, tp.bool, tp.bfloat16
    assert cubin_ok(_codegen.elementwise_source("k", b, (f64, f64), "(a0) < (a1)", 0))
    assert cubin_ok(_codegen.elementwise_source("k", bf, (f32, tp.int8), "(a0) * (a1) + s0", 0, ("f",)))
    assert cubin_ok(_codegen.elementwise_source("k", tp.int64, (), "s0", 0, ("i",)))         # fill
    assert cubin_ok(_codegen.elementwise_source("k", f32, (), "(i / s0) == (i % s0)", 0, ("i",)))  # eye
