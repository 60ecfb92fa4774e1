# SPDX-License-Identifier: Apache-2.0
"""Casts of existing values (Tensor.to, copy_, out= of a narrower dtype,
tensor(t, dtype=...)) are silent, as PyTorch's, and follow one rule on the
CPU and on CUDA: floating to integer truncates toward zero, saturates at the
dtype's limits and maps NaN to 0; integer to narrower integer wraps; to bool
nonzero is True (NaN too); floating casts round, overflowing to ±inf. The CPU
tests check explicit values; the CUDA ones compare the device's casts with
the CPU's."""

import math

import numpy as np
import pytest

import tensorplay as tp

pytestmark = pytest.mark.filterwarnings("error::RuntimeWarning")     # no NumPy warning may leak

INT_DTYPES = [tp.uint8, tp.int8, tp.int16, tp.int32, tp.int64]
FLOAT_DTYPES = [tp.float16, tp.bfloat16, tp.float32, tp.float64]

SPECIAL_FLOATS = [float("nan"), float("inf"), float("-inf"), 1e10, -1e10, 300.0, -300.0, 200.7, -200.7,
                  127.9, -128.9, 255.9, 256.0, -0.9, 0.5, 0.0, -0.0, 70000.0, -70000.0, 2.0 ** 31,
                  -2.0 ** 31 - 2 ** 10, 2.0 ** 63, -2.0 ** 63, 2.0 ** 64, 1e300, -1e300, 3.0, -3.0]
SPECIAL_INTS = [0, 1, -1, 127, 128, -128, -129, 255, 256, -255, -256, 300, -300, 32767, 32768, -32769,
                65535, 65536, 2 ** 31, -2 ** 31 - 1, 2 ** 40 + 5, -2 ** 40 - 3, 2 ** 63 - 1, -2 ** 63]


def _limits(d):
    info = np.iinfo(d.numpy_dtype)
    return int(info.min), int(info.max)


def saturated(x, d):
    """The rule for one floating value into integer dtype ``d``."""
    if math.isnan(x):
        return 0
    lo, hi = _limits(d)
    if x >= hi:
        return hi
    if x <= lo:
        return lo
    return int(x)                  # truncation toward zero


def wrapped(v, d):
    """The rule for one integer into integer dtype ``d``."""
    lo, _ = _limits(d)
    bits = 8 * d.itemsize
    return (v - lo) % (1 << bits) + lo


def _floats(src_dtype, n=1):
    """The special values as a ``src_dtype`` tensor (each repeated ``n`` times)."""
    return tp.tensor(np.repeat(np.array(SPECIAL_FLOATS, dtype=np.float64), n)).to(src_dtype)


# ------------------------------------------------------------------ explicit values on the CPU


def test_the_rule_on_examples():
    x = tp.tensor([300.0, -300.0, float("nan"), float("inf"), float("-inf"), -1.0, 2.9, -2.9], dtype=tp.float32)
    assert x.to(tp.int8).tolist() == [127, -128, 0, 127, -128, -1, 2, -2]
    assert x.to(tp.uint8).tolist() == [255, 0, 0, 255, 0, 0, 2, 0]
    assert x.to(tp.int32).tolist() == [300, -300, 0, 2 ** 31 - 1, -2 ** 31, -1, 2, -2]
    assert x.to(tp.int64).tolist() == [300, -300, 0, 2 ** 63 - 1, -2 ** 63, -1, 2, -2]
    assert x.to(tp.bool).tolist() == [True, True, True, True, True, True, True, True]
    n = tp.tensor([300, -1, 2 ** 40 + 5], dtype=tp.int64)
    assert n.to(tp.int8).tolist() == [44, -1, 5]
    assert n.to(tp.uint8).tolist() == [44, 255, 5]
    assert tp.tensor([1e300, -1e300, 1e-300]).to(tp.float64).to(tp.float32).tolist() == [
        float("inf"), float("-inf"), 0.0]
    big = tp.tensor([1e300, -1e300], dtype=tp.float64)
    assert big.to(tp.float32).tolist() == [float("inf"), float("-inf")]
    assert big.to(tp.float16).tolist() == [float("inf"), float("-inf")]
    assert big.to(tp.bfloat16).tolist() == [float("inf"), float("-inf")]
    assert tp.tensor([70000.0]).to(tp.float16).tolist() == [float("inf")]


@pytest.mark.parametrize("src", FLOAT_DTYPES)
@pytest.mark.parametrize("dst", INT_DTYPES + [tp.bool])
def test_floating_to_integer_and_bool_on_the_cpu(src, dst):
    x = _floats(src)
    values = x.tolist()
    expected = [(v != 0) for v in values] if dst is tp.bool else [saturated(v, dst) for v in values]
    assert x.to(dst).tolist() == expected
    out = tp.empty(len(values), dtype=dst)
    assert out.copy_(x).tolist() == expected
    assert tp.tensor(x, dtype=dst).tolist() == expected
    strided = tp.zeros(len(values), 2, dtype=dst)[:, 1]
    assert strided.copy_(x).tolist() == expected              # a non-contiguous destination


@pytest.mark.parametrize("dst", INT_DTYPES + [tp.bool])
def test_integer_to_integer_wraps_on_the_cpu(dst):
    x = tp.tensor(SPECIAL_INTS, dtype=tp.int64)
    expected = [(v != 0) for v in SPECIAL_INTS] if dst is tp.bool else [wrapped(v, dst) for v in SPECIAL_INTS]
    assert x.to(dst).tolist() == expected
    assert tp.empty(len(SPECIAL_INTS), dtype=dst).copy_(x).tolist() == expected


def test_out_of_a_narrower_dtype_is_a_silent_cast():
    a = tp.tensor([300, -1, 2 ** 40 + 5], dtype=tp.int64)
    out = tp.empty(3, dtype=tp.int8)
    assert tp.add(a, 0, out=out).tolist() == [44, -1, 5]
    f = tp.tensor([1e300, -1e300, 1.5], dtype=tp.float64)
    out32 = tp.empty(3, dtype=tp.float32)
    assert tp.mul(f, 1.0, out=out32).tolist() == [float("inf"), float("-inf"), 1.5]
    out16 = tp.empty(3, dtype=tp.float16)
    assert tp.where(tp.tensor([True, False, True]), f, 0.0, out=out16).tolist() == [float("inf"), 0.0, 1.5]
    h = tp.tensor([60000.0], dtype=tp.float16)
    assert (h + h).tolist() == [float("inf")]                  # computed in float32, stored as float16
    assert tp.sum(tp.tensor([60000.0, 60000.0], dtype=tp.float16)).tolist() == float("inf")


def test_linspace_and_eye_into_integer_dtypes():
    assert tp.linspace(-300, 300, 3, dtype=tp.int8).tolist() == [-128, 0, 127]
    assert tp.eye(2, dtype=tp.uint8).tolist() == [[1, 0], [0, 1]]


def test_the_generated_store_checks_the_range_before_converting():
    """The CUDA store of a floating value into an integer type tests NaN and
    both limits first (C leaves out-of-range conversions undefined), so the
    device follows the rule above whatever the compiler does with them."""
    from tensorplay._kernels import codegen
    from helpers import ptx_of
    lines = []
    for k, d in enumerate(INT_DTYPES):
        lines.append(codegen.store_stmt(d, f"o{k}", "0", "f[0]"))
        lines.append(codegen.store_stmt(d, f"o{k}", "1", "g[0]"))
        lines.append(codegen.store_stmt(d, f"o{k}", "2", "n[0]"))     # an integer value: converted as C does
    params = ", ".join(f"{d.ctype}* o{k}" for k, d in enumerate(INT_DTYPES))
    src = (codegen.PREAMBLE + 'extern "C" __global__ void k(const float* f, const double* g, const long long* n, '
           + params + ") {\n" + "\n".join(lines) + "\n}\n")
    ptx = ptx_of(src)
    assert ptx.count("setp.nan.f32") == len(INT_DTYPES) and ptx.count("setp.nan.f64") == len(INT_DTYPES)


# ------------------------------------------------------------------ CUDA against the CPU


@pytest.mark.cuda
@pytest.mark.parametrize("src", FLOAT_DTYPES)
@pytest.mark.parametrize("dst", INT_DTYPES + [tp.bool])
def test_cuda_floating_casts_match_the_cpu(src, dst):
    """Every path of a device cast: flat vectorized (4096 elements, aligned),
    flat element by element (an odd length), strided, and the tiled
    transpose copy; then a copy into a non-contiguous destination."""
    for n in (1, 3, 4096 // len(SPECIAL_FLOATS) + 1):
        x = _floats(src, n)
        expected = x.to(dst).tolist()
        xc = x.cuda()
        assert xc.to(dst).tolist() == expected, (src, dst, n)
        assert xc[1:].to(dst).tolist() == expected[1:]           # misaligned: element by element
    x = _floats(src, 40)
    m = x[: (x.numel() // 32) * 32].reshape(32, -1)
    expected = m.T.to(dst).tolist()
    mc = m.cuda()
    assert mc.T.to(dst).tolist() == expected                     # tiled transpose copy
    assert mc[:, ::2].to(dst).tolist() == m[:, ::2].to(dst).tolist()     # strided copy
    out = tp.zeros(m.shape[0], m.shape[1], 2, dtype=dst, device="cuda")[:, :, 0]
    assert out.copy_(mc).tolist() == m.to(dst).tolist()


@pytest.mark.cuda
@pytest.mark.parametrize("dst", INT_DTYPES + [tp.bool])
@pytest.mark.parametrize("src", INT_DTYPES)
def test_cuda_integer_casts_match_the_cpu(src, dst):
    x = tp.tensor([wrapped(v, src) for v in SPECIAL_INTS] * 50, dtype=src)
    assert x.cuda().to(dst).tolist() == x.to(dst).tolist()
    assert x.cuda()[1:].to(dst).tolist() == x[1:].to(dst).tolist()


@pytest.mark.cuda
@pytest.mark.parametrize("src", FLOAT_DTYPES)
@pytest.mark.parametrize("dst", FLOAT_DTYPES)
def test_cuda_floating_to_floating_overflow_matches_the_cpu(src, dst):
    x = _floats(src)
    got = x.cuda().to(dst).numpy().astype(np.float64)
    want = x.to(dst).numpy().astype(np.float64)
    assert np.array_equal(got, want, equal_nan=True)


@pytest.mark.cuda
def test_cuda_out_of_a_narrower_dtype_and_fill_match_the_cpu():
    a = tp.tensor([wrapped(v, tp.int64) for v in SPECIAL_INTS], dtype=tp.int64)
    for d in (tp.int8, tp.uint8, tp.int16, tp.int32):
        cpu = tp.add(a, 0, out=tp.empty(a.numel(), dtype=d)).tolist()
        assert tp.add(a.cuda(), 0, out=tp.empty(a.numel(), dtype=d, device="cuda")).tolist() == cpu
    f = tp.tensor([1e300, -1e300, 1.5], dtype=tp.float64)
    cpu = tp.mul(f, 1.0, out=tp.empty(3, dtype=tp.float32)).tolist()
    assert tp.mul(f.cuda(), 1.0, out=tp.empty(3, dtype=tp.float32, device="cuda")).tolist() == cpu
    for value, d in ((-1, tp.uint8), (3.7, tp.int32), (-3.7, tp.int8), (float("nan"), tp.bool), (2 ** 63 - 1, tp.int64)):
        assert tp.full((5,), value, dtype=d, device="cuda").tolist() == tp.full((5,), value, dtype=d).tolist()
    with pytest.raises(OverflowError, match="does not fit int32"):
        tp.full((1,), float("inf"), dtype=tp.int32, device="cuda")
    assert tp.linspace(-300, 300, 7, dtype=tp.int8, device="cuda").tolist() == \
        tp.linspace(-300, 300, 7, dtype=tp.int8).tolist()
