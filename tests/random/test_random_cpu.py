# SPDX-License-Identifier: Apache-2.0
"""Random numbers without a GPU: Philox4x32-10 against Random123's known
answers, the stream layout, the generated CUDA C (built on the host: the
same bits as NumPy; and by NVRTC: every kernel compiles to CUBIN), the
generators' determinism and state, the distributions' statistics on the CPU
path, and argument errors."""

import math

import numpy as np
import pytest

import tensorplay as tp
from helpers import HOST_CXX, check_exponential, check_normal, check_uniform, host_values
from tensorplay._kernels import nvrtc as _nvrtc
from tensorplay._kernels import random_kernels as rk
from tensorplay._kernels import philox

N = 10 ** 6
FLOATS = [tp.float16, tp.bfloat16, tp.float32, tp.float64]


# ------------------------------------------------------------------ Philox

@pytest.mark.parametrize("counter,key,expected", [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF, 0xFFFFFFFF), (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
])
def test_philox_matches_random123_known_answers(counter, key, expected):
    words = philox.philox4x32(*counter, *key)
    assert tuple(int(w) for w in words) == expected
    # vectorized: the same counter in a batch gives the same words
    batch = philox.philox4x32(*(np.full(3, c, dtype=np.uint32) for c in counter), *key)
    assert all(tuple(int(w[i]) for w in batch) == expected for i in range(3))


def test_block_words_put_the_block_in_the_low_counter_words_and_the_offset_in_the_high():
    seed, offset = 0x0123456789ABCDEF, 0xFEDCBA9876543210
    words = philox.block_words(seed, offset, (1 << 32) - 1, 3)         # blocks cross 2**32
    for row, b in enumerate(range((1 << 32) - 1, (1 << 32) + 2)):
        ref = philox.philox4x32(b & 0xFFFFFFFF, b >> 32, offset & 0xFFFFFFFF, offset >> 32,
                                seed & 0xFFFFFFFF, seed >> 32)
        assert [int(w) for w in words[row]] == [int(w) for w in ref]


def test_stream_layout_of_32_and_64_bit_draws_and_normals():
    seed = 99
    g = tp.Generator().manual_seed(seed)
    n = 11
    words = philox.block_words(seed, 0, 0, 4)
    r32 = tp.rand(n, generator=g).numpy()                 # offset 0
    for i in range(n):
        w = int(words[i // 4, i % 4])
        assert r32[i] == np.float32((w >> 8) * 2.0 ** -24)
    words = philox.block_words(seed, 1, 0, 6)
    r64 = tp.rand(n, generator=g, dtype=tp.float64).numpy()   # offset 1
    for i in range(n):
        lo, hi = int(words[i // 2, 2 * (i % 2)]), int(words[i // 2, 2 * (i % 2) + 1])
        assert r64[i] == ((lo | (hi << 32)) >> 11) * 2.0 ** -53
    words = philox.block_words(seed, 2, 0, 3)
    z = tp.randn(n, generator=g, dtype=tp.float64).numpy()    # offset 2
    for i in range(n):
        p = (i % 4) // 2
        a, b = int(words[i // 4, 2 * p]), int(words[i // 4, 2 * p + 1])
        r = math.sqrt(-2 * math.log((a + 1) * 2.0 ** -32))
        t = 2 * math.pi * b * 2.0 ** -32
        assert z[i] == pytest.approx(r * (math.cos(t) if i % 2 == 0 else math.sin(t)), rel=1e-13, abs=1e-13)
    assert [int(x) for x in g.get_state().numpy().view("<u8")] == [seed, 3]


# ------------------------------------------------------------------ the exact math

def test_exact_log_is_within_a_few_ulp():
    u = (np.arange(1, 1 << 24, 13, dtype=np.uint32).astype(np.float32) * np.float32(2.0 ** -24))
    ref = np.log(u.astype(np.float64))
    got = philox.F32.log(u).astype(np.float64)
    nz = ref != 0
    ulps = np.abs(got - ref)[nz] / np.spacing(np.abs(ref[nz]).astype(np.float32)).astype(np.float64)
    assert ulps.max() <= 3
    assert philox.F32.log(np.float32([1.0]))[0] == 0
    u64 = np.concatenate([np.arange(1, 2 ** 32, 104729, dtype=np.uint64) * 2.0 ** -32,
                          1 - np.arange(1, 100) * 2.0 ** -53])
    ref64 = np.log(u64)
    ulps64 = np.abs(philox.F64.log(u64) - ref64) / np.spacing(np.abs(ref64))
    assert ulps64.max() <= 3


def test_exact_sin_cos_of_2_pi_u_are_within_a_few_ulp_of_one():
    k = np.arange(0, 1 << 24, 7, dtype=np.uint32)
    c, s = philox.F32.sincos_2pi(k, 24)
    angle = 2 * np.pi * k.astype(np.float64) / 2 ** 24
    assert np.max(np.abs(c - np.cos(angle))) <= 3 * 2.0 ** -24
    assert np.max(np.abs(s - np.sin(angle))) <= 3 * 2.0 ** -24
    # the quarter turns are exact
    c, s = philox.F32.sincos_2pi(np.array([0, 1 << 22, 2 << 22, 3 << 22], dtype=np.uint32), 24)
    assert c.tolist() == [1, 0, -1, 0] and s.tolist() == [0, 1, 0, -1]


# ------------------------------------------------------------------ the generated CUDA C

CASES = ([("uniform", d, (0.0, 1.0), None) for d in FLOATS]
         + [("uniform", d, (-3.0, 7.25), None) for d in FLOATS]
         + [("normal", d, (0.0, 1.0), None) for d in FLOATS]
         + [("normal", d, (-2.5, 0.3), None) for d in FLOATS]
         + [("exponential", d, (0.37,), None) for d in FLOATS]
         + [("dropout", d, (0.7, 1 / 0.7), None) for d in FLOATS]
         + [("bernoulli", tp.float32, (0.3,), None)]
         + [("bernoulli_tensor", tp.bool_, (), d) for d in FLOATS]
         + [("random", tp.int64, (-5, 1000), "w32"), ("random", tp.int64, (-(2 ** 40), 3 << 50), "w64"),
            ("random", tp.int64, (-(2 ** 63), 0), "full")])


@pytest.mark.skipif(HOST_CXX is None, reason="no C++ compiler to build the generated code for the host")
@pytest.mark.parametrize("op,out,scalars,variant", CASES,
                         ids=[f"{c[0]}-{c[1].name}-{c[3]}-{i}" for i, c in enumerate(CASES)])
def test_generated_cuda_c_built_for_the_host_gives_numpys_bits(tmp_path_factory, op, out, scalars, variant):
    """The kernels' Philox, scalar preparation and transforms, compiled as
    host C++ with the CUDA intrinsics as IEEE operations, against
    philox.values: equal bits for 40,003 elements (all four lanes, a tail)."""
    folder = tmp_path_factory.getbasetemp()
    n = 40003
    seed, offset = 0x9E3779B97F4A7C15, 12345
    inp = None
    rng = np.random.default_rng(7)
    if op == "dropout":
        inp = rng.standard_normal(n).astype(np.float64 if out is tp.float64 else np.float32)
    elif op == "bernoulli_tensor":
        inp = rng.random(n).astype(np.float64 if variant is tp.float64 else np.float32)
    mode = variant if op == "random" else None
    got = host_values(folder, op, out, seed, offset, n, scalars, inp, variant)
    ref = philox.values(op, out.name, seed, offset, n, scalars, inp, mode)
    assert got.dtype == ref.dtype
    assert np.array_equal(got.view(np.uint8), np.ascontiguousarray(ref).view(np.uint8)), \
        f"{int((got != ref).sum())} of {n} elements differ"


def test_generated_source_uses_the_reference_constants_and_no_fused_multiply_add():
    src = rk.kernel_source("k", "normal", tp.float32)
    for c in (philox.PHILOX_M0, philox.PHILOX_M1, philox.PHILOX_W0, philox.PHILOX_W1):
        assert f"{c:#010x}u" in src
    assert f"round < {philox.PHILOX_ROUNDS}" in src
    f32, f64 = philox.F32, philox.F64
    for coef in f32.log1p_coefs + (f32.sincos_step, f32.sin_coef, f32.ln2_hi, f32.ln2_lo, f32.sqrt2):
        assert rk.literal(coef, "float") in src, coef
    for coef in f64.log_coefs + f64.cos_coefs + f64.sin_coefs + (f64.ln2_hi, f64.ln2_lo, f64.sqrt2, f64.two_pi):
        assert rk.literal(coef, "double") in src, coef
    # the tables, row for row, and copied into shared memory before use
    for table, rows in (("tp_rng_sincos_table_f", f32.sincos_table), ("tp_rng_log_table_f", f32.log_table)):
        assert f"{table}[{len(rows)}]" in src
        for row in (rows[1], rows[len(rows) // 3], rows[-1]):
            assert "{" + ", ".join(rk.literal(v, "float") for v in row) + "}" in src
    assert src.index("__syncthreads();") < src.index("for (long long b =")
    assert "fma" not in src.lower().replace("fmad", "")
    assert "--fmad=false" in rk.OPTIONS
    # exact literals: each parses back to the constant
    assert float.fromhex(rk.literal(f32.sincos_step, "float")[:-1]) == float(f32.sincos_step)


def test_every_random_kernel_compiles_to_cubin():
    variants = rk.kernel_variants()
    ops = {v[0] for v in variants}
    assert ops == {"uniform", "normal", "exponential", "dropout", "bernoulli", "bernoulli_tensor", "random"}
    assert len(variants) == 79
    for op, out, variant in variants:
        name = rk.kernel_name(op, out, variant)
        src = rk.kernel_source(name, op, out, variant)
        assert f"void __launch_bounds__({rk.BLOCK}) {name}(" in src
        assert "tp_rng_advance(st, offset);" in src
        image = _nvrtc.compile_cubin(src, name + ".cu", rk.OPTIONS, 90)
        assert image[:4] == b"\x7fELF", name


def test_set_state_kernel_compiles():
    assert _nvrtc.compile_cubin(rk.SET_STATE_SOURCE, "tp_rng_set_state.cu", (), 90)[:4] == b"\x7fELF"


def test_kernels_reject_what_they_cannot_draw():
    with pytest.raises(TypeError, match="floating"):
        rk.dist_for("normal", tp.int32)
    with pytest.raises(ValueError, match="unknown random op"):
        rk.dist_for("gamma", tp.float32)


# ------------------------------------------------------------------ generators

def _offset(g):
    return int(g.get_state().numpy().view("<u8")[1])


def test_same_seed_same_values_and_every_op_advances_the_offset_by_one():
    a = tp.Generator().manual_seed(1234)
    b = tp.Generator().manual_seed(1234)
    for make in (lambda g: tp.rand(1000, generator=g), lambda g: tp.randn(17, 3, generator=g),
                 lambda g: tp.randint(-4, 9, (100,), generator=g),
                 lambda g: tp.empty(50, dtype=tp.float16).exponential_(2.0, generator=g)):
        x, y = make(a), make(b)
        assert np.array_equal(x.numpy(), y.numpy())
    assert _offset(a) == _offset(b) == 4
    assert a.initial_seed() == 1234
    assert not np.array_equal(tp.rand(100, generator=a).numpy(), tp.rand(100, generator=b.manual_seed(1235)).numpy())


def test_get_state_and_set_state_replay_the_stream():
    g = tp.Generator().manual_seed(7)
    tp.rand(10, generator=g)
    state = g.get_state()
    assert state.dtype is tp.uint8 and state.shape == (16,) and state.is_cpu
    assert state.numpy().view("<u8").tolist() == [7, 1]
    first = tp.randn(100, generator=g).numpy()
    g.set_state(state)
    assert np.array_equal(tp.randn(100, generator=g).numpy(), first)
    # a state carries the seed too: another generator continues the same stream
    other = tp.Generator().set_state(state)
    assert other.initial_seed() == 7
    assert np.array_equal(tp.randn(100, generator=other).numpy(), first)


def test_generators_are_independent():
    a = tp.Generator().manual_seed(5)
    b = tp.Generator().manual_seed(5)
    tp.rand(100, generator=a)
    tp.rand(100, generator=a)
    assert _offset(b) == 0 and _offset(a) == 2
    ref = tp.rand(100, generator=tp.Generator().manual_seed(5)).numpy()
    assert np.array_equal(tp.rand(100, generator=b).numpy(), ref)


def test_default_generator_and_the_seeding_functions():
    tp.manual_seed(42)
    assert tp.initial_seed() == 42 and tp.default_generator.initial_seed() == 42
    x = tp.rand(20).numpy()
    assert np.array_equal(x, tp.rand(20, generator=tp.Generator().manual_seed(42)).numpy())
    state = tp.get_rng_state()
    y = tp.randn(5).numpy()
    tp.set_rng_state(state)
    assert np.array_equal(tp.randn(5).numpy(), y)
    s = tp.seed()
    assert 0 <= s < 2 ** 64 and tp.initial_seed() == s
    assert tp.manual_seed(-1) is tp.default_generator
    assert tp.initial_seed() == 2 ** 64 - 1            # negative seeds wrap, as PyTorch
    g = tp.Generator()
    assert g.initial_seed() == 67280421310721 and g.device == tp.device("cpu")
    assert g.manual_seed(3) is g
    assert repr(g) == "<tensorplay.Generator device=cpu>"
    tp.manual_seed(0)


def test_cuda_seeding_without_cuda_is_quiet_and_generators_need_it(monkeypatch):
    if tp.cuda.is_available():
        pytest.skip("checks the behaviour without CUDA")
    tp.cuda.manual_seed(3)              # silently nothing, as PyTorch
    tp.cuda.manual_seed_all(3)
    assert len(tp.cuda.default_generators) == 0
    with pytest.raises(IndexError):
        tp.cuda.default_generators[0]
    with pytest.raises(tp.cuda.CudaUnavailableError):
        tp.Generator("cuda")
    with pytest.raises(tp.cuda.CudaUnavailableError):
        tp.cuda.get_rng_state()


def test_seed_and_state_errors():
    g = tp.Generator()
    with pytest.raises(TypeError, match="seed must be an int"):
        g.manual_seed(1.5)
    with pytest.raises(TypeError, match="seed must be an int"):
        tp.manual_seed(True)
    with pytest.raises(ValueError, match=r"\[-2\*\*63, 2\*\*64\)"):
        g.manual_seed(2 ** 64)
    with pytest.raises(TypeError, match="from get_state"):
        g.set_state(b"0" * 16)
    with pytest.raises(TypeError, match="uint8"):
        g.set_state(tp.zeros(16))
    with pytest.raises(ValueError, match="16 bytes"):
        g.set_state(tp.zeros(8, dtype=tp.uint8))
    with pytest.raises(TypeError, match="tensorplay.Generator"):
        tp.rand(3, generator=np.random.default_rng())


# ------------------------------------------------------------------ element order, layouts

def test_values_follow_row_major_order_whatever_the_strides():
    g = tp.Generator()
    flat = tp.rand(12, generator=g.manual_seed(3)).numpy()
    t = tp.zeros(4, 3).T                                 # shape (3, 4), not contiguous
    t.uniform_(generator=g.manual_seed(3))
    assert np.array_equal(t.numpy(), flat.reshape(3, 4))
    big = tp.zeros(6, 8)
    view = big[::2, 1::2]
    view.normal_(generator=g.manual_seed(3))
    assert np.array_equal(view.numpy(), tp.randn(3, 4, generator=g.manual_seed(3)).numpy())
    assert np.count_nonzero(big.numpy()) == 12          # only the view's elements were written


def test_empty_tensors_draw_nothing_and_keep_the_offset():
    g = tp.Generator().manual_seed(1)
    assert tp.rand(0, 5, generator=g).shape == (0, 5)
    tp.empty(0).normal_(generator=g)
    assert _offset(g) == 0
    assert tp.rand((), generator=g).shape == () and _offset(g) == 1


def test_dtypes_of_the_functions():
    assert tp.rand(3).dtype is tp.float32 and tp.randn(3, dtype=tp.float64).dtype is tp.float64
    assert tp.randint(5, (3,)).dtype is tp.int64
    assert tp.randint(0, 5, [2, 2], dtype=tp.float16).dtype is tp.float16
    x = tp.zeros(2, 3, dtype=tp.bfloat16)
    assert tp.rand_like(x).dtype is tp.bfloat16 and tp.rand_like(x).shape == (2, 3)
    assert tp.randn_like(x, dtype=tp.float64).dtype is tp.float64
    assert tp.randint_like(tp.zeros(4, dtype=tp.int8), 3).dtype is tp.int8
    v = tp.randint_like(tp.zeros(1000, dtype=tp.int16), -2, 2).numpy()
    assert v.min() == -2 and v.max() == 1


# ------------------------------------------------------------------ statistics (CPU path)

@pytest.mark.parametrize("dtype", FLOATS, ids=lambda d: d.name)
def test_uniform_statistics(dtype):
    check_uniform(tp.rand(N, dtype=dtype, generator=tp.Generator().manual_seed(11)).numpy(), dtype)


@pytest.mark.parametrize("dtype", FLOATS, ids=lambda d: d.name)
def test_normal_statistics(dtype):
    check_normal(tp.randn(N, dtype=dtype, generator=tp.Generator().manual_seed(12)).numpy(), dtype)
    x = tp.empty(N, dtype=dtype).normal_(3.0, 0.5, generator=tp.Generator().manual_seed(13))
    check_normal(x.numpy(), dtype, 3.0, 0.5)


@pytest.mark.parametrize("dtype", FLOATS, ids=lambda d: d.name)
def test_exponential_statistics(dtype):
    x = tp.empty(N, dtype=dtype).exponential_(2.5, generator=tp.Generator().manual_seed(14))
    check_exponential(x.numpy(), dtype, 2.5)


@pytest.mark.parametrize("dtype", FLOATS, ids=lambda d: d.name)
def test_uniform_between_bounds(dtype):
    x = tp.empty(N, dtype=dtype).uniform_(-2.0, 6.0, generator=tp.Generator().manual_seed(15)).numpy()
    x = x.astype(np.float64)
    assert x.min() >= -2.0 and x.max() <= 6.0
    assert abs(x.mean() - 2.0) < 5 * 8 / math.sqrt(12 * N) + (0.02 if dtype == tp.bfloat16 else 0)
    assert abs(x.var() / (64 / 12) - 1) < 0.01 + (0.02 if dtype == tp.bfloat16 else 0)


def test_randint_bounds_and_every_value_drawn():
    g = tp.Generator().manual_seed(16)
    v = tp.randint(-3, 7, (N,), generator=g).numpy()
    counts = np.bincount(v + 3)
    assert v.min() == -3 and v.max() == 6 and counts.size == 10
    assert np.all(np.abs(counts - N / 10) < 5 * math.sqrt(N * 0.1 * 0.9))
    big = tp.randint(-(2 ** 62), 2 ** 62, (N,), generator=g).numpy()     # 64-bit draws
    assert big.min() >= -(2 ** 62) and big.max() < 2 ** 62
    assert abs(np.mean(big / 2.0 ** 62)) < 5 / math.sqrt(3 * N)
    assert abs(np.mean(big > 0) - 0.5) < 5 * 0.5 / math.sqrt(N)
    full = tp.empty(N, dtype=tp.int64).random_(-(2 ** 63), None, generator=g).numpy()
    assert abs(np.mean(full < 0) - 0.5) < 5 * 0.5 / math.sqrt(N)
    assert np.unique(tp.randint(2, (1000,), generator=g).numpy()).tolist() == [0, 1]


@pytest.mark.parametrize("dtype", tp.ALL_DTYPES, ids=lambda d: d.name)
def test_random_default_ranges_follow_pytorch(dtype):
    g = tp.Generator().manual_seed(17)
    x = tp.empty(20000, dtype=dtype).random_(generator=g).numpy().astype(np.float64)
    if dtype.kind == "f":
        hi = {"float16": 2 ** 11, "bfloat16": 2 ** 8, "float32": 2 ** 24, "float64": 2 ** 53}[dtype.name]
    elif dtype.kind == "b":
        hi = 1
    else:
        hi = int(np.iinfo(dtype.numpy_dtype).max)
    assert x.min() >= 0 and x.max() <= hi and np.all(x == np.floor(x))
    assert abs(x.mean() / hi - 0.5) < 0.02
    y = tp.empty(1000, dtype=dtype).random_(2, generator=g).numpy()
    assert sorted(np.unique(y.astype(np.int64)).tolist()) == [0, 1]       # random_(to)
    if dtype is not tp.bool_:
        z = tp.empty(1000, dtype=dtype).random_(1, 4, generator=g).numpy().astype(np.int64)
        assert sorted(np.unique(z).tolist()) == [1, 2, 3]                  # random_(from_, to)
    w = tp.empty(1000, dtype=dtype).random_(1, None, generator=g).numpy().astype(np.float64)
    assert w.min() >= 1 and w.max() <= hi                                  # random_(from_, None)


def test_bernoulli_frequencies():
    g = tp.Generator().manual_seed(18)
    x = tp.empty(N, dtype=tp.int32).bernoulli_(0.3, generator=g).numpy()
    assert set(np.unique(x).tolist()) == {0, 1}
    assert abs(x.mean() - 0.3) < 5 * math.sqrt(0.21 / N)
    p = tp.tensor(np.tile(np.array([0.0, 0.25, 0.5, 1.0], dtype=np.float32), N // 4))
    y = tp.bernoulli(p, generator=g).numpy().reshape(-1, 4)
    assert y.dtype == np.float32
    assert y[:, 0].sum() == 0 and y[:, 3].min() == 1
    assert abs(y[:, 1].mean() - 0.25) < 5 * math.sqrt(0.1875 * 4 / N)
    assert abs(y[:, 2].mean() - 0.5) < 5 * math.sqrt(0.25 * 4 / N)
    z = tp.zeros(1000, 4, dtype=tp.bool).bernoulli_(tp.tensor([0.0, 1.0, 0.0, 1.0], dtype=tp.float16),
                                                     generator=g).numpy()     # p broadcast to self
    assert z[:, 1].all() and z[:, 3].all() and not z[:, 0].any() and not z[:, 2].any()
    assert np.array_equal(tp.ones(3).bernoulli(generator=g).numpy(), np.ones(3, dtype=np.float32))


@pytest.mark.parametrize("dtype", FLOATS, ids=lambda d: d.name)
def test_dropout_zeroes_the_fraction_p_and_scales_the_rest(dtype):
    g = tp.Generator().manual_seed(19)
    x = tp.full((N,), 1.5, dtype=dtype)
    y = tp.dropout(x, 0.2, generator=g).numpy().astype(np.float64)
    zeros = y == 0
    assert abs(zeros.mean() - 0.2) < 5 * math.sqrt(0.16 / N)
    kept = np.unique(y[~zeros])
    scale = np.float64(1.5) * (np.float64(1) / 0.8 if dtype is tp.float64 else np.float32(1 / 0.8))
    assert kept.tolist() == [float(np.asarray(scale).astype(dtype.numpy_dtype).astype(np.float64))]
    assert tp.dropout(x, 0.2, train=False) is x
    assert np.array_equal(tp.dropout(x[:100], 0.0, generator=g).numpy(), x[:100].numpy())
    assert np.count_nonzero(tp.dropout(x[:100], 1.0, generator=g).numpy()) == 0


def test_nn_functional_dropout_in_place_and_not():
    from tensorplay.nn import functional as F
    g = tp.Generator().manual_seed(20)
    x = tp.ones(4, 250)
    same = F.dropout(x, 0.5, generator=g.manual_seed(20))
    assert same is not x and x.numpy().min() == 1
    out = F.dropout(x, 0.5, inplace=True, generator=g.manual_seed(20))
    assert out is x and np.array_equal(x.numpy(), same.numpy())
    assert set(np.unique(x.numpy()).tolist()) == {0.0, 2.0}
    assert F.dropout(x, 0.5, training=False) is x
    with pytest.raises(ValueError, match="between 0 and 1"):
        F.dropout(x, 1.5)


# ------------------------------------------------------------------ argument errors

def test_errors_come_before_any_work():
    g = tp.Generator().manual_seed(0)
    with pytest.raises(TypeError, match="floating"):
        tp.rand(3, dtype=tp.int32)
    with pytest.raises(TypeError, match="floating"):
        tp.randn(3, dtype=tp.bool)
    with pytest.raises(TypeError, match="floating"):
        tp.zeros(3, dtype=tp.int64).normal_()
    with pytest.raises(TypeError, match="floating"):
        tp.bernoulli(tp.zeros(3, dtype=tp.int32))
    with pytest.raises(ValueError, match="from=2.0 > to=1.0"):
        tp.zeros(3).uniform_(2.0, 1.0)
    with pytest.raises(ValueError, match="finite"):
        tp.zeros(3).uniform_(0.0, math.inf)
    with pytest.raises(ValueError, match="exceeds the largest float16"):
        tp.zeros(3, dtype=tp.float16).uniform_(-60000.0, 60000.0)
    with pytest.raises(ValueError, match="std >= 0.0"):
        tp.zeros(3).normal_(0.0, -1.0)
    with pytest.raises(ValueError, match="lambda > 0.0"):
        tp.zeros(3).exponential_(0.0)
    with pytest.raises(ValueError, match=r"p to be in \[0, 1\]"):
        tp.zeros(3).bernoulli_(1.5)
    with pytest.raises(ValueError, match="does not broadcast"):
        tp.zeros(3).bernoulli_(tp.zeros(4))
    with pytest.raises(TypeError, match="floating"):
        tp.zeros(3).bernoulli_(tp.zeros(3, dtype=tp.int32))
    with pytest.raises(ValueError, match="from=5 >= to=5"):
        tp.randint(5, 5, (3,))
    with pytest.raises(ValueError, match="outside the values int8 holds"):
        tp.randint(0, 300, (3,), dtype=tp.int8)
    with pytest.raises(ValueError, match="outside the values float16 holds"):
        tp.randint(0, 5000, (3,), dtype=tp.float16)
    with pytest.raises(ValueError, match="outside the values uint8 holds"):
        tp.empty(3, dtype=tp.uint8).random_(-1, 3)
    with pytest.raises(TypeError, match="tuple of ints"):
        tp.randint(0, 10, 5)
    with pytest.raises(TypeError, match="needs high and size"):
        tp.randint(10)
    with pytest.raises(TypeError, match="must be an int"):
        tp.randint(0.5, 10, (3,))
    with pytest.raises(TypeError, match="at most 2 positional"):
        tp.zeros(3).random_(1, 2, 3)
    with pytest.raises(TypeError, match="give to as well"):
        tp.zeros(3).random_(from_=2)
    with pytest.raises(ValueError, match="between 0 and 1"):
        tp.dropout(tp.ones(3), -0.1)
    with pytest.raises(TypeError, match="floating"):
        tp.dropout(tp.ones(3, dtype=tp.int32), 0.5)
    with pytest.raises(TypeError, match="expected a Tensor"):
        tp.rand_like([1.0, 2.0])
    assert _offset(g) == 0
    assert _offset(tp.default_generator) >= 0
