# SPDX-License-Identifier: Apache-2.0
"""Every generated op kernel compiles with NVRTC to CUBIN: no GPU needed.

CUDA tensors here are metadata over fake addresses; the launch is replaced by
a recorder, so the real code paths (type promotion, expression generation,
geometry) run up to the point of launching.
"""

import itertools

import numpy as np
import pytest

import tensorplay as tp
from tensorplay._kernels import nvrtc as _nvrtc
from tensorplay._kernels import cache as _kernels
from tensorplay._kernels import codegen as _codegen
from tensorplay._kernels import reduce_kernels as _rk
from tensorplay._ops import elementwise as _elementwise
from tensorplay._ops import indexing as _indexing
from tensorplay._ops import reduce as _reduce
from tensorplay._ops import custom as _custom

ARCH = 90


def fake_cuda(shape, dtype, strides=None):
    t = tp.Tensor.__new__(tp.Tensor)
    strides = strides or tp._tensor.args.contiguous_strides(shape)
    t._set_cuda(None, 0x100000, tuple(shape), tuple(strides), dtype.code, 0)
    return t


@pytest.fixture
def recorder(monkeypatch):
    sources = []

    def cached_function(key, device, make):
        src, name = make()
        sources.append((name, src))
        return _Recorder(key, [])            # launches go nowhere
    monkeypatch.setattr(_kernels, "cached_function", cached_function)
    monkeypatch.setitem(_kernels._sm_cache, 0, 132)     # no device to ask
    return sources


def compile_all(sources):
    for name, src in sources:
        image = _nvrtc.compile_cubin(src, name + ".cu", (), ARCH)
        assert image[:4] == b"\x7fELF", name


@pytest.mark.parametrize("op", _elementwise.OPS)
def test_every_elementwise_op_compiles_for_every_dtype(op, recorder):
    rule = _elementwise.OPS[op][0]
    unary = _elementwise.OPS[op][1].__code__.co_argcount == 2
    for d in tp.ALL_DTYPES:
        operands = [fake_cuda((4, 3), d)] if unary else [fake_cuda((4, 3), d), fake_cuda((3,), d)]
        try:
            result, _ = _elementwise._dtypes_for(op, rule, operands)
        except TypeError:
            continue            # refused combinations (bool subtraction, float bitwise ops)
        _elementwise.apply(op, *operands, out=fake_cuda((4, 3), result))
        if not unary:
            for args in ((operands[0], 2), (2.5, operands[0])):    # scalar operands
                try:
                    r, _ = _elementwise._dtypes_for(op, rule, list(args))
                except TypeError:
                    continue
                _elementwise.apply(op, *args, out=fake_cuda((4, 3), r))
    compile_all(recorder)
    assert recorder


def test_where_and_mixed_dtype_binary_ops_compile(recorder):
    for a, b in itertools.product([tp.float16, tp.int32, tp.bool, tp.bfloat16], repeat=2):
        x, y = fake_cuda((5, 2), a), fake_cuda((5, 2), b, strides=(1, 5))
        r = tp.result_type(x, y)
        _elementwise.apply("add", x, y, out=fake_cuda((5, 2), r))
        _elementwise.where(fake_cuda((5, 1), tp.bool), x, y, out=fake_cuda((5, 2), r))
    _elementwise.where(fake_cuda((5,), tp.bool), 1.5, fake_cuda((5,), tp.float16),
                       out=fake_cuda((5,), tp.float16))
    compile_all(recorder)


@pytest.mark.parametrize("op", list(_rk.KINDS))
def test_reduction_kernels_compile(op):
    kind, with_index = _rk.KINDS[op]
    for d in tp.ALL_DTYPES:
        acc = _rk.acc_dtype(op, d)
        out = _reduce._result_dtype(op, d, None)
        for in_is_acc, final, scaled in [(False, True, False), (False, False, False), (True, True, False),
                                         (True, True, True)]:
            if scaled and op != "sum":
                continue
            for warps in (1, 8):
                src = _rk.row_source("r", kind, with_index, d, in_is_acc, acc, out, final, scaled, warps)
                assert _nvrtc.compile_cubin(src, "r.cu", (), ARCH)[:4] == b"\x7fELF"
            src = _rk.column_source("c", kind, with_index, d, in_is_acc, acc, out, final, scaled)
            assert _nvrtc.compile_cubin(src, "c.cu", (), ARCH)[:4] == b"\x7fELF"


@pytest.mark.parametrize("kind", ["gather", "scatter"])
def test_index_kernels_compile(kind, monkeypatch):
    srcs = []
    monkeypatch.setattr(_kernels, "cached_function", lambda key, dev, make: srcs.append(make()))
    for d in (tp.float32, tp.bfloat16, tp.bool):
        _indexing._kernel(kind, d, 3, 1, 0)
    for src, name in srcs:
        assert _nvrtc.compile_cubin(src, name + ".cu", (), ARCH)[:4] == b"\x7fELF"


def test_linspace_and_eye_kernels_compile(recorder):
    for d in (tp.float32, tp.int64, tp.float16):
        _kernels.launch_elementwise("linspace", "((double)i < s3 / 2.0) ? (s0 + s1 * (double)i) : "
                                    "(s2 - s1 * (s3 - 1.0 - (double)i))", fake_cuda((7,), d), (), (),
                                    (0.0, 1.0, 6.0, 7.0), ("f", "f", "f", "f"))
        _kernels.launch_elementwise("eye", "(i / s0) == (i % s0)", fake_cuda((3, 4), d), (), (), (4,), ("i",))
    compile_all(recorder)


def test_elementwise_kernel_codegen_compiles(recorder):
    k = _custom.ElementwiseKernel("T x, T y, float32 a", "T z, bool w", "z = a * x + y; w = z > 0", "axpy_flag")
    for d in (tp.float32, tp.float16, tp.float64):
        x, y = fake_cuda((4, 5), d), fake_cuda((5,), d)
        z, w = fake_cuda((4, 5), d), fake_cuda((4, 5), tp.bool)
        k(x, y, 2.0, z, w)
    compile_all(recorder)
    assert "typedef float T;" in recorder[1][1]     # float16 computes as float


def test_elementwise_kernel_validation():
    with pytest.raises(ValueError, match="bad input parameter"):
        _custom.ElementwiseKernel("float32", "float32 z", "z = 1", "k")
    with pytest.raises(ValueError, match="at least one output"):
        _custom.ElementwiseKernel("float32 x", "", "x = 1", "k")
    with pytest.raises(ValueError, match="C identifier"):
        _custom.ElementwiseKernel("float32 x", "float32 z", "z = x", "bad name")
    k = _custom.ElementwiseKernel("T x, T y", "T z", "z = x + y", "add2")
    with pytest.raises(TypeError, match="bound to"):
        k(fake_cuda((2,), tp.float32), fake_cuda((2,), tp.float64))
    with pytest.raises(TypeError, match="takes 2 inputs"):
        k(fake_cuda((2,), tp.float32))


def test_raw_kernel_signature_parsing_and_packing():
    src = ('extern "C" __global__ void __launch_bounds__(256) k(const float* __restrict__ x, int n, '
           'double a, unsigned char flag, long long m, float* out) {}')
    codes = _custom.parse_signature(src, "k")
    assert codes == ["P", "i", "d", "B", "q", "P"]
    x, out = fake_cuda((4,), tp.float32), fake_cuda((4,), tp.float32)
    buf = _custom._pack(codes, (x, 3, 1.5, 7, -2, out), 0)
    import struct
    assert len(buf) == 8 + 4 + 4 + 8 + 1 + 7 + 8 + 8          # natural alignment
    assert struct.unpack_from("<Qi", buf, 0) == (0x100000, 3)
    assert struct.unpack_from("<d", buf, 16) == (1.5,)
    assert buf[24] == 7 and struct.unpack_from("<q", buf, 32) == (-2,)
    assert _custom.parse_signature("template <class T> __global__ void k(T x) {}", "k") is None
    assert _custom.parse_signature('extern "C" __global__ void k() {}', "k") == []
    with pytest.raises(TypeError, match="CPU tensor"):
        _custom._pack(["P"], (tp.zeros(2),), 0)
    with pytest.raises(OverflowError):
        _custom._pack(["B"], (300,), 0)
    with pytest.raises(TypeError):
        tp.cuda.RawKernel(b"src", "k")


class _Recorder:
    def __init__(self, key, log):
        self.key, self.log = key, log

    def launch(self, grid, block, params, shared=0, stream=None):
        self.log.append((self.key, grid, block, params))


def _fake_at(shape, dtype, ptr, strides=None):
    t = tp.Tensor.__new__(tp.Tensor)
    strides = strides or tp._tensor.args.contiguous_strides(shape)
    t._set_cuda(None, ptr, tuple(shape), tuple(strides), dtype.code, 0)
    return t


def test_launch_plans_pack_what_the_full_path_packs(monkeypatch):
    """A repeated call replays a cached launch plan; its launch must be byte for
    byte the launch the full path computes for the same operands."""
    import random
    log = []
    monkeypatch.setattr(_kernels, "cached_function", lambda key, dev, make: _Recorder(key, log))
    monkeypatch.setitem(_kernels._sm_cache, 0, 132)
    rnd = random.Random(7)
    ops = ["add", "mul", "sub", "div", "maximum", "lt", "pow", "exp", "neg", "bitwise_and", "where_like"]
    compared = 0
    for trial in range(300):
        op = rnd.choice(ops[:-1])
        unary = _elementwise.OPS[op][1].__code__.co_argcount == 2
        da, db = rnd.choice(tp.ALL_DTYPES), rnd.choice(tp.ALL_DTYPES)
        shape = tuple(rnd.randint(1, 4) for _ in range(rnd.randint(1, 3)))
        bshape = tuple(1 if rnd.random() < 0.3 else s for s in shape)
        scalar = rnd.choice([None, None, 3, 2.5, True])

        def operands(base):
            a = _fake_at(shape, da, base)
            if unary:
                return [a]
            b = scalar if scalar is not None else _fake_at(bshape, db, base + 0x1000)
            return [a, b]
        try:
            result, _ = _elementwise._dtypes_for(op, _elementwise.OPS[op][0], operands(0x10000))
        except TypeError:
            continue
        _kernels.plans.clear()
        _elementwise.apply(op, *operands(0x10000), out=_fake_at(shape, result, 0x90000))   # makes a plan
        log.clear()
        _elementwise.apply(op, *operands(0x20000), out=_fake_at(shape, result, 0xA0000))   # replays it
        planned = log[:]
        assert len(planned) == 1
        _kernels.plans.clear()
        log.clear()
        _elementwise.apply(op, *operands(0x20000), out=_fake_at(shape, result, 0xA0000))   # full path
        assert log == planned, (op, da, db, shape, bshape, scalar)
        compared += 1
    assert compared > 150
    _kernels.plans.clear()


def test_launch_plans_allocate_outputs_and_check_scalar_ranges(monkeypatch):
    log = []
    monkeypatch.setattr(_kernels, "cached_function", lambda key, dev, make: _Recorder(key, log))
    monkeypatch.setitem(_kernels._sm_cache, 0, 132)
    made = []

    def fake_empty(shape, dtype, dev):
        made.append(shape)
        return _fake_at(shape, dtype, 0x500000 + 0x1000 * len(made))
    monkeypatch.setattr(_elementwise, "empty_cuda", fake_empty)
    monkeypatch.setattr(_elementwise, "empty", lambda shape, dtype, device: fake_empty(shape, dtype, 0))
    _kernels.plans.clear()
    a = _fake_at((3,), tp.int64, 0x1000)
    r1 = _elementwise.apply("add", a, 1)
    r2 = _elementwise.apply("add", a, 2)          # from the plan
    assert r1.data_ptr() != r2.data_ptr() and r2.dtype is tp.int64 and r2.shape == (3,)
    assert log[0][0] == log[1][0] and log[0][3][:8] != log[1][3][:8]
    with pytest.raises(OverflowError):
        _elementwise.apply("add", a, 2 ** 70)
    _kernels.plans.clear()


def test_ops_under_capture_register_their_storages(monkeypatch):
    """While a capture is open on this thread, every pointer an op takes from a
    tensor hands its storage to the capture (the graph keeps what comes from
    outside its pool until reset); otherwise nothing is registered."""
    from tensorplay._testing import DeviceAllocator, FakeBackend
    monkeypatch.setattr(_kernels, "cached_function", lambda key, dev, make: _Recorder(key, []))
    monkeypatch.setitem(_kernels._sm_cache, 0, 132)

    class Storage:
        ptr = 0x10000

    def fake_with_storage(shape, dtype, ptr):
        t = tp.Tensor.__new__(tp.Tensor)
        t._set_cuda(Storage(), ptr, shape, tp._tensor.args.contiguous_strides(shape), dtype.code, 0)
        return t
    a, b = fake_with_storage((4,), tp.float32, 0x10000), fake_with_storage((4,), tp.float32, 0x20000)
    out = fake_with_storage((4,), tp.float32, 0x30000)
    alloc = DeviceAllocator(0, FakeBackend())
    state = alloc.begin_capture(1, 1, 0x100)
    try:
        _elementwise.apply("add", a, b, out=out)             # full path
        _elementwise.apply("add", a, b, out=out)             # launch plan
        _elementwise.where(fake_with_storage((4,), tp.bool, 0x40000), a, 1.0, out=out)
    finally:
        kept = alloc.end_capture(state)
    assert len(kept) == 4
    _elementwise.apply("mul", a, b, out=out)
    assert state.kept == 0                                    # nothing after the capture
