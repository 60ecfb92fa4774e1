# SPDX-License-Identifier: Apache-2.0
"""The bandwidth paths of the generated kernels, without a GPU: each kernel
choice is a pure function of shapes, strides and pointers (tested here), and
each kernel compiles with NVRTC (checked in its PTX for the memory accesses
it is meant to make)."""

import struct
import random

import pytest

import tensorplay as tp
from tensorplay._kernels import nvrtc as _nvrtc
from tensorplay._kernels import cache as _kernels
from tensorplay._kernels import codegen as _codegen
from helpers import ptx_of

ARCH = 90


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
    assert _kernels.flat_grid(64 << 20, tile, 132) == (64 << 20) // tile     # one pass over 64 Mi
    assert _kernels.flat_grid(1 << 30, tile, 132) == 132 * _kernels.FLAT_BLOCKS_PER_SM
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
    # mid sizes: one 4-float vector a thread, blocks of 256 covering n
    plan = _kernels.LaunchPlan(None, 0, 10_000, 3, (), (), (), (4, 4, 4))
    assert (plan.grid, plan.block) == (-(-10_000 // 1024), 256)
    big = 132 * _kernels.COVER_BLOCKS_PER_SM * 1024 + 1          # past the covering grids: tiles
    plan = _kernels.LaunchPlan(None, 0, big, 3, (), (), (), (4, 4, 4))
    assert (plan.grid, plan.block) == (min(-(-big // 2048), 132 * _kernels.FLAT_BLOCKS_PER_SM), 256)
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


# ------------------------------------------------------------------ reductions

from tensorplay._kernels import reduce_kernels as _rk  # noqa: E402
from tensorplay._ops import reduce as _reduce  # noqa: E402


@pytest.mark.parametrize("shape, dims, expected", [
    ((64 << 20,), (0,), ("row", 1, 64 << 20)),
    ((8192, 8192), (0, 1), ("row", 1, 8192 * 8192)),
    ((8192, 8192), (1,), ("row", 8192, 8192)),
    ((8192, 8192), (0,), ("column", 1, 8192, 8192)),
    ((4, 5, 6), (1,), ("permute", 24, 5)),                 # 6 kept inner elements: too few
    ((4, 50, 64), (1,), ("column", 4, 50, 64)),
    ((4, 50, 8, 8), (1,), ("column", 4, 50, 64)),          # kept inner dims merge
    ((4, 50, 3, 64), (1, 2), ("column", 4, 150, 64)),      # adjacent reduced dims merge
    ((1000, 4), (0,), ("permute", 4, 1000)),               # too few columns to coalesce
    ((4, 5, 64), (0, 2), ("permute", 5, 256)),             # reduced dims not adjacent
    ((8192, 1), (0,), ("row", 1, 8192)),                   # size-1 dims do not count
    ((1, 8192, 1, 64), (1,), ("column", 1, 8192, 64)),
    ((7, 1), (1,), ("row", 7, 1)),
    ((), (), ("row", 1, 1)),
])
def test_reduction_strategy(shape, dims, expected):
    assert _rk.reduction_strategy(shape, dims) == expected


def test_row_plans_fill_the_gpu_and_keep_chunks_aligned():
    sms = 132
    warps, chunks, chunk_len = _rk.row_plan(1, 64 << 20, sms)
    assert warps == 8 and chunks == sms * _rk.BLOCKS_PER_SM and chunk_len % 16 == 0
    assert (chunks - 1) * chunk_len < 64 << 20 <= chunks * chunk_len
    assert _rk.row_plan(8192, 8192, sms) == (8, 1, 8192)          # a block per row
    assert _rk.row_plan(1 << 20, 128, sms) == (1, 1, 128)         # a warp per row
    assert _rk.row_plan(1, 1000, sms) == (8, 1, 1008)             # one block, chunk rounded to 16
    w, c, l = _rk.row_plan(16, 1 << 20, sms)
    assert 16 * c >= sms * _rk.BLOCKS_PER_SM and c * l >= 1 << 20 and l % 16 == 0
    for inner in (16384, 16385, 99999, 1 << 24):
        w, c, l = _rk.row_plan(3, inner, sms)
        assert (c - 1) * l < inner <= c * l and l % 16 == 0


def test_column_plans_split_rows_until_the_grid_fills_the_gpu():
    sms = 132
    splits, rows = _rk.column_plan(1, 8192, 8192, 4, sms)     # 64 column blocks
    assert splits == 17 or splits * 64 >= sms * _rk.BLOCKS_PER_SM
    assert (splits - 1) * rows < 8192 <= splits * rows
    assert _rk.column_plan(64, 8192, 8192, 4, sms) == (1, 8192)   # 4096 blocks: no split
    splits, rows = _rk.column_plan(1, 100, 16, 4, sms)
    assert splits == 1 and rows == 100                                # too few rows to split
    assert _rk.column_width(4) == 4 and _rk.column_width(2) == 8 and _rk.column_width(8) == 2
    assert _rk.column_width(1) == _rk.COL_MAX_WIDTH


class _Launches:
    def __init__(self):
        self.log = []

    def function(self, key, dev, make):
        src, name = make()
        log = self.log

        class F:
            def launch(self, grid, block, params, shared=0, stream=None):
                log.append((key, grid, block, params))
        return F()


def _fake(shape, dtype, ptr=0x100000, strides=None):
    t = tp.Tensor.__new__(tp.Tensor)
    strides = strides or tp._tensor.args.contiguous_strides(shape)
    t._set_cuda(None, ptr, tuple(shape), tuple(strides), dtype.code, 0)
    return t


@pytest.fixture
def launches(monkeypatch):
    rec = _Launches()
    monkeypatch.setattr(_kernels, "cached_function", rec.function)
    monkeypatch.setitem(_kernels._sm_cache, 0, 132)
    made = []

    def fake_empty(shape, dtype, dev):
        made.append(shape)
        return _fake(shape, dtype, 0x40000000 + 0x1000000 * len(made))
    monkeypatch.setattr(_reduce, "empty_cuda", fake_empty)
    monkeypatch.setattr(_reduce, "empty", lambda shape, dtype, device: _fake(shape, dtype, 0x20000000))
    return rec.log


def test_sum_over_the_outer_dimension_runs_column_kernels_without_a_copy(launches):
    import struct
    _reduce.reduce("sum", _fake((8192, 8192), tp.float32), 0)
    (k1, g1, b1, p1), (k2, g2, b2, p2) = launches
    assert k1[1] == "column" and k2[1] == "column"
    splits, rows = _rk.column_plan(1, 8192, 8192, 4, 132)
    assert g1 == (64, splits) and b1 == 256
    a, r, b, rps, colblocks, vw = struct.unpack_from("<6q", p1, 32)
    assert (a, r, b, rps, colblocks, vw) == (1, 8192, 8192, rows, 64, 4)
    a, r, b, rps, colblocks, vw = struct.unpack_from("<6q", p2, 32)
    assert (a, r, b, colblocks, vw) == (1, splits, 8192, 64, 4) and g2 == (64, 1)
    assert k2[4] is True and k2[6] is True          # the second pass reads partials, stores the result


def test_row_sums_use_one_block_per_row_and_vectors_only_when_aligned(launches):
    import struct
    x = _fake((8192, 8192), tp.float32)
    _reduce.reduce("sum", x, 1)
    (key, grid, block, params), = launches
    assert key[1] == "row" and grid == 8192 and struct.unpack_from("<5q", params, 32)[-1] == 4
    launches.clear()
    _reduce.reduce("sum", _fake((8192, 8191), tp.float32), 1)            # rows not 16-byte multiples
    assert struct.unpack_from("<5q", launches[0][3], 32)[-1] == 1
    launches.clear()
    _reduce.reduce("sum", _fake((1 << 20,), tp.float32, ptr=0x100004))   # x[1:]
    (k1, g1, _, p1), (k2, g2, _, p2) = launches
    assert struct.unpack_from("<5q", p1, 32)[-1] == 1 and g1 == (1 << 20) // _rk.ROW_CHUNK_MIN
    assert k2[4] is True and g2 == 1


def test_full_reduction_is_two_launches_with_the_partials_in_a_fixed_order(launches):
    import struct
    _reduce.reduce("argmax", _fake((64 << 20,), tp.float32))
    (k1, g1, _, p1), (k2, g2, _, p2) = launches
    outer, inner, chunks, chunk_len, vw = struct.unpack_from("<5q", p1, 32)
    assert (outer, inner, vw) == (1, 64 << 20, 4) and chunks == g1
    ptrs1 = struct.unpack_from("<4Q", p1)
    ptrs2 = struct.unpack_from("<4Q", p2)
    assert ptrs2[0] == ptrs1[2] and ptrs2[1] == ptrs1[3] != 0        # values and indices of the partials
    assert struct.unpack_from("<2q", p2, 32) == (1, chunks)


@pytest.mark.parametrize("op", ["sum", "argmax", "amin", "any"])
def test_reduction_kernels_make_vector_loads(op):
    kind, with_index = _rk.KINDS[op]
    for d in (tp.float32, tp.bfloat16):
        acc, out = _rk.acc_dtype(op, d), _reduce._result_dtype(op, d, None)
        for src in (_rk.row_source("r", kind, with_index, d, False, acc, out, True, False, 8),
                    _rk.row_source("r", kind, with_index, d, False, acc, out, True, False, 1),
                    _rk.column_source("c", kind, with_index, d, False, acc, out, True, False)):
            loads = [l for l in ptx_of(src).splitlines() if "ld.global" in l]
            assert any(".v4." in l or ".v2." in l for l in loads), (op, d.name)


# ------------------------------------------------------------------ copies

def test_copy_strategy_tiles_transposes_only():
    c = _kernels.copy_strategy
    assert c((8192, 8192), (1, 8192), (8192, 1)) == ("tile", (8192, 8192), [[8192, 1], [1, 8192]], 1, 0)
    # a batch of transposes: dims (b, m, n) from a (b, n, m) source
    kind, shape, strides, p, q = c((4, 64, 48), (64 * 48, 1, 64), (64 * 48, 48, 1))
    assert kind == "tile" and shape == (4, 64, 48) and (p, q) == (2, 1)
    assert c((8192, 4096), (8192, 2), (4096, 1)) == ("elementwise",)      # x[:, ::2]: no unit stride
    assert c((64, 64), (64, 1), (64, 1)) == ("elementwise",)               # contiguous
    assert c((64, 64), (128, 1), (64, 1)) == ("elementwise",)              # same inner dimension
    assert c((8192, 8), (1, 8192), (8, 1)) == ("elementwise",)             # too narrow to tile
    assert c((64, 64), (0, 1), (1, 64)) == ("tile", (64, 64), [[1, 64], [0, 1]], 0, 1)   # broadcast row
    assert c((1, 64), (1, 1), (64, 1)) == ("elementwise",)


@pytest.mark.parametrize("out, src", [(tp.float32, tp.float32), (tp.bfloat16, tp.float32),
                                      (tp.float64, tp.int8), (tp.bool, tp.float16), (tp.int64, tp.int64)])
@pytest.mark.parametrize("ndim, p, q", [(2, 1, 0), (2, 0, 1), (3, 2, 1), (3, 1, 2), (4, 3, 0)])
def test_tiled_copy_kernels_compile(out, src, ndim, p, q):
    assert cubin_ok(_codegen.tiled_copy_source("t", out, src, ndim, p, q))


def test_transposing_copies_launch_the_tiled_kernel(monkeypatch):
    import struct
    rec = _Launches()
    monkeypatch.setattr(_kernels, "cached_function", rec.function)
    monkeypatch.setitem(_kernels._sm_cache, 0, 132)
    src = _fake((8192, 8192), tp.float32, 0x100000, (1, 8192))                 # x.t()
    dst = _fake((8192, 8192), tp.float32, 0x100000 + 8192 * 8192 * 4)
    tp._tensor.tensor.copy_into(dst, src)
    (key, grid, block, params), = rec.log
    assert key[0] == "tiled_copy" and block == (32, 8) and grid == 132 * _kernels.TILED_COPY_BLOCKS_PER_SM
    assert struct.unpack_from("<QQq", params) == (dst.data_ptr(), 0x100000, 256 * 256)
    rec.log.clear()
    far = 0x100000 + 8192 * 8192 * 8
    tp._tensor.tensor.copy_into(dst[:, :4096], _fake((8192, 8192), tp.float32, far)[:, ::2])
    assert rec.log[0][0][0] == "copy"                                         # strided, not transposed


# ------------------------------------------------------------------ the plan cache

from tensorplay._ops import elementwise as _elementwise  # noqa: E402
from tensorplay._ops import custom as _custom  # noqa: E402


def _fake_on(shape, dtype, device=0, ptr=0x100000, strides=None):
    t = tp.Tensor.__new__(tp.Tensor)
    strides = strides or tp._tensor.args.contiguous_strides(shape)
    t._set_cuda(None, ptr, tuple(shape), tuple(strides), dtype.code, device)
    return t


class _CountedLaunches(_Launches):
    """Kernels that record their launches and count how often one is fetched."""
    def __init__(self):
        super().__init__()
        self.fetched = 0

    def function(self, key, dev, make):
        self.fetched += 1
        return super().function(key, dev, make)


@pytest.fixture
def counted(monkeypatch):
    rec = _CountedLaunches()
    monkeypatch.setattr(_kernels, "cached_function", rec.function)
    monkeypatch.setitem(_kernels._sm_cache, 0, 132)
    monkeypatch.setitem(_kernels._sm_cache, 1, 132)
    return rec


def test_plan_cache_is_bounded_and_evicts_the_least_recently_used():
    c = _kernels.PlanCache(3)
    for k in "abc":
        c.put(k, k.upper())
    assert c.keys() == ["a", "b", "c"] and len(c) == 3
    assert c.get("a") == "A"                 # a becomes the most recently used
    c.put("d", "D")                          # evicts b, the least recently used
    assert c.keys() == ["c", "a", "d"] and "b" not in c and c.get("b") is None
    c.put("c", "C2")                         # storing again refreshes and replaces
    c.put("e", "E")                          # evicts a
    assert c.keys() == ["d", "c", "e"] and c.get("c") == "C2"
    assert "d" in c and c.keys()[0] == "d"   # a membership test does not refresh
    for i in range(100):
        assert c.put(i, i) == i
    assert len(c) == 3 and c.keys() == [97, 98, 99]
    c.clear()
    assert len(c) == 0 and c.get(99) is None and c.keys() == []
    with pytest.raises(ValueError):
        _kernels.PlanCache(0)
    assert _kernels.plans.maxsize == _kernels.PLAN_CACHE_SIZE >= 4096


def test_plan_keys_tell_dtype_shape_strides_device_and_scalar_types_apart():
    key = _elementwise._plan_key
    f32, f64 = tp.float32, tp.float64
    a, b, o = _fake_on((4, 3), f32), _fake_on((4, 3), f32, ptr=0x200000), _fake_on((4, 3), f32, ptr=0x300000)
    base = key("add", (a, b), o, False)
    assert base is not None and hash(base) == hash(key("add", (a, b), o, False))
    # other pointers, the same plan: a plan holds no address
    assert key("add", (_fake_on((4, 3), f32, ptr=0x900000), b), o, False) == base
    variants = [
        key("sub", (a, b), o, False),                                         # op
        key("add", (a, b), o, True),                                          # in place
        key("add", (a, b), None, False),                                      # no out
        key("add", (_fake_on((4, 3), f64), b), o, False),                     # dtype
        key("add", (a, b), _fake_on((4, 3), f64), False),                     # out dtype
        key("add", (_fake_on((1, 3), f32), b), o, False),                     # shape
        key("add", (_fake_on((4, 3), f32, strides=(1, 4)), b), o, False),     # strides
        key("add", (a, b), _fake_on((4, 3), f32, strides=(1, 4)), False),     # out strides
        key("add", (_fake_on((4, 3), f32, device=1), b), o, False),           # device
        key("add", (a, 1), o, False),                                         # int scalar
        key("add", (a, 1.0), o, False),                                       # float scalar
        key("add", (a, True), o, False),                                      # bool scalar
        key("add", (1, a), o, False),                                         # operand order
    ]
    assert all(v is not None for v in variants)
    assert len({base, *variants}) == len(variants) + 1
    assert key("add", (a, 2), o, False) == key("add", (a, 3), o, False)       # values are not keyed
    # calls that are not planned
    assert key("add", (a, tp.zeros(())), o, False) is None                    # a CPU tensor
    assert key("add", (a, b), tp.zeros((4, 3)), False) is None                # a CPU out
    import numpy as np
    assert key("add", (a, np.float32(1)), o, False) is None                   # a NumPy scalar
    # launch-plan keys: the kernel and the collapsed geometry, never the front end's
    lk = _kernels.launch_plan_key
    k = ("copy", 0, (0,), 2, ())
    assert lk(k, 0, (4, 3), [[3, 1], [1, 4]]) == lk(k, 0, (4, 3), ([3, 1], [1, 4]))
    assert len({lk(k, 0, (4, 3), [[3, 1], [1, 4]]), lk(k, 1, (4, 3), [[3, 1], [1, 4]]),
                lk(k, 0, (4, 3), [[3, 1], [1, 3]]), lk(k, 0, (3, 4), [[3, 1], [1, 4]]),
                lk(("copy", 1, (0,), 2, ()), 0, (4, 3), [[3, 1], [1, 4]])}) == 5
    assert isinstance(base[0], str) and isinstance(lk(k, 0, (), [[]])[0], tuple)


def test_launch_plans_are_reused_for_the_same_geometry_only(counted):
    f32 = tp.float32
    launch = _kernels.launch_elementwise
    src, dst = _fake_on((64, 48), f32, ptr=0x100000), _fake_on((64, 48), f32, ptr=0x200000)
    p1 = launch("copy", "a0", dst, (src,), (src.strides,))
    p2 = launch("copy", "a0", _fake_on((64, 48), f32, ptr=0x300000), (_fake_on((64, 48), f32, ptr=0x400000),),
                ((48, 1),))
    assert p2 is p1 and counted.fetched == 1                      # no new plan, no kernel lookup
    (_, g1, b1, params1), (_, g2, b2, params2) = counted.log
    assert (g1, b1) == (g2, b2) and params1[16:] == params2[16:] and params1[:16] != params2[:16]
    # the same collapsed geometry from another shape shares the plan
    assert launch("copy", "a0", _fake_on((3072,), f32), (_fake_on((3072,), f32),), ((1,),)) is p1
    # other strides: another plan (and another kernel: a strided one)
    t = _fake_on((64, 48), f32, strides=(1, 64))
    p3 = launch("copy", "a0", dst, (t,), (t.strides,))
    assert p3 is not p1 and counted.fetched == 2
    p4 = launch("copy", "a0", dst, (t,), ((2, 128),))            # same kernel, other strides
    assert p4 is not p3 and p4.f is not None and counted.fetched == 3
    assert launch("copy", "a0", dst, (t,), ((2, 128),)) is p4 and counted.fetched == 3
    # another device, another dtype, other scalar kinds: other plans
    d1 = _fake_on((64, 48), f32, device=1)
    assert launch("copy", "a0", d1, (_fake_on((64, 48), f32, device=1),), ((48, 1),)) is not p1
    assert launch("copy", "a0", dst, (_fake_on((64, 48), tp.float64),), ((48, 1),)) is not p1
    assert (launch("fill", "s0", dst, (), (), (1.0,), ("f",)) is not
            launch("fill", "s0", dst, (), (), (1,), ("i",)))
    assert launch("fill", "s0", dst, (), (), (2.0,), ("f",)) is launch("fill", "s0", dst, (), (), (3.0,), ("f",))


def test_the_front_end_keeps_typed_plans_in_the_same_cache(counted):
    f32 = tp.float32
    a, b, o = _fake_on((4, 3), f32), _fake_on((3,), f32, ptr=0x200000), _fake_on((4, 3), f32, ptr=0x300000)
    _elementwise.apply("mul", a, 2.5, out=o)
    plan = _kernels.plans.get(_elementwise._plan_key("mul", (a, 2.5), o, False))
    assert isinstance(plan, _kernels.ElementwisePlan)
    assert (plan.dtype, plan.shape, plan.device) == (f32, (4, 3), 0)
    assert (plan.tensor_pos, plan.scalar_pos, plan.scalar_kinds) == ((0,), (1,), ("f",))
    assert isinstance(plan.launch_plan, _kernels.LaunchPlan)
    assert len(_kernels.plans) == 2                               # the typed plan and its launch plan
    _elementwise.apply("mul", a, 4.0, out=o)                      # replays the typed plan
    assert counted.fetched == 1 and len(counted.log) == 2 and len(_kernels.plans) == 2
    assert struct.unpack_from("<QQqd", counted.log[1][3]) == (o.data_ptr(), a.data_ptr(), 12, 4.0)
    # front-end calls over other shapes whose geometry collapses alike share the launch plan
    _elementwise.apply("mul", _fake_on((12,), f32), 2.5, out=_fake_on((12,), f32))
    plan12 = _kernels.plans.get(_elementwise._plan_key("mul", (_fake_on((12,), f32), 2.5),
                                                         _fake_on((12,), f32), False))
    assert plan12 is not plan and plan12.launch_plan is plan.launch_plan and counted.fetched == 1
    # a broadcast operand: another kernel
    _elementwise.apply("add", a, b, out=o)
    bplan = _kernels.plans.get(_elementwise._plan_key("add", (a, b), o, False))
    assert bplan.tensor_pos == (0, 1) and bplan.scalar_pos == () and bplan.launch_plan is not plan.launch_plan


def test_the_library_plan_cache_stays_bounded(counted, monkeypatch):
    monkeypatch.setattr(_kernels.plans, "maxsize", 6)
    f32 = tp.float32
    for n in range(1, 21):
        x = _fake_on((n, 5), f32)
        _elementwise.apply("neg", x, out=_fake_on((n, 5), f32, ptr=0x200000))
        assert len(_kernels.plans) <= 6
    last = _elementwise._plan_key("neg", (_fake_on((20, 5), f32),), _fake_on((20, 5), f32), False)
    first = _elementwise._plan_key("neg", (_fake_on((1, 5), f32),), _fake_on((1, 5), f32), False)
    assert last in _kernels.plans and first not in _kernels.plans
    fetched = counted.fetched
    _elementwise.apply("neg", _fake_on((1, 5), f32), out=_fake_on((1, 5), f32))   # evicted: planned again
    assert counted.fetched == fetched + 1 and first in _kernels.plans


def test_clearing_the_plan_cache_makes_launches_plan_again(counted):
    f32 = tp.float32
    a, o = _fake_on((4, 3), f32), _fake_on((4, 3), f32, ptr=0x200000)
    p1 = _kernels.launch_elementwise("copy", "a0", o, (a,), (a.strides,))
    _elementwise.apply("exp", a, out=o)
    key = _elementwise._plan_key("exp", (a,), o, False)
    assert key in _kernels.plans and len(_kernels.plans) == 3 and counted.fetched == 2
    _kernels.plans.clear()
    assert len(_kernels.plans) == 0 and key not in _kernels.plans
    p2 = _kernels.launch_elementwise("copy", "a0", o, (a,), (a.strides,))
    assert p2 is not p1 and counted.fetched == 3
    _elementwise.apply("exp", a, out=o)
    assert key in _kernels.plans and counted.fetched == 4


def test_tiled_copies_and_elementwise_kernels_reuse_their_plans(counted):
    f32 = tp.float32
    src = _fake_on((64, 48), f32, ptr=0x100000, strides=(1, 64))             # a transpose
    dst = _fake_on((64, 48), f32, ptr=0x200000)
    assert _kernels.launch_tiled_copy(dst, src, src.strides)
    assert _kernels.launch_tiled_copy(_fake_on((64, 48), f32, ptr=0x300000), src, src.strides)
    assert counted.fetched == 1 and len(_kernels.plans) == 1
    (k1, g1, b1, p1), (k2, g2, b2, p2) = counted.log
    # the arguments the tiled copy always passed: (dst, src, tiles, shape, dst strides, src strides)
    assert p1 == struct.pack("<QQq6q", 0x200000, 0x100000, 2 * 2, 64, 48, 48, 1, 1, 64)
    assert p2 == struct.pack("<QQq6q", 0x300000, 0x100000, 2 * 2, 64, 48, 48, 1, 1, 64)
    assert k1 == k2 and k1[0] == "tiled_copy" and b1 == b2 == (32, 8) and g1 == g2 == 4
    assert not _kernels.launch_tiled_copy(dst, dst, dst.strides) and len(_kernels.plans) == 1
    counted.log.clear()
    k = _custom.ElementwiseKernel("T x, float32 a", "T z", "z = a * x", "scale_t")
    x, z = _fake_on((4, 5), f32, ptr=0x400000), _fake_on((4, 5), f32, ptr=0x500000)
    k(x, 2.0, z)
    k(_fake_on((4, 5), f32, ptr=0x600000), 3.0, z)
    assert counted.fetched == 2 and len(_kernels.plans) == 2
    (_, g1, b1, p1), (_, g2, b2, p2) = counted.log
    assert struct.unpack("<QQqd", p1) == (0x400000, 0x500000, 20, 2.0)
    assert struct.unpack("<QQqd", p2) == (0x600000, 0x500000, 20, 3.0)
    k(x, 2.0, _fake_on((4, 5), f32, strides=(1, 4)))                       # other strides: another plan
    assert counted.fetched == 3 and len(_kernels.plans) == 3


@pytest.mark.parametrize("n, block, grid", [(1, 32, 1), (32, 32, 1), (33, 64, 1), (200, 224, 1), (255, 256, 1),
                                            (256, 256, 1), (4096, 256, 4)])
@pytest.mark.parametrize("contiguous", [True, False])
def test_small_tensors_launch_the_warps_they_need(launches, n, block, grid, contiguous):
    """Fewer elements than a block: whole warps covering them (a launch of one
    warp costs the GPU less than one of eight), for the flat kernel (every
    thread's first element, at most n, is its own) and the strided one."""
    strides = None if contiguous else (2,)
    src = _fake((n,), tp.float32, 0x100000, strides)
    out = _fake((n,), tp.float32, 0x10000000)
    _elementwise.apply("add", src, 1.0, out=out)
    (key, g, b, _), = launches
    assert b == block
    if contiguous:
        assert g == grid                         # 4096 floats: one 4-float vector a thread
    else:
        assert g == -(-n // block)
    assert _kernels.small_block(n) == block
