# SPDX-License-Identifier: Apache-2.0
"""Python numbers at creation (tensor, full, fill_) must fit the dtype, as
PyTorch checks them: OverflowError naming the value and the dtype, never a
wrapped value or a NumPy warning; ragged, non-numeric and complex data and
non-dtypes are refused in tensorplay's words."""

import numpy as np
import pytest

import tensorplay as tp
from helpers import ALL_DTYPES

pytestmark = pytest.mark.filterwarnings("error::RuntimeWarning")     # no NumPy warning may leak

INT64_MAX = 2 ** 63 - 1

# ------------------------------------------------------------------ tensor()


@pytest.mark.parametrize("data,dtype,value,name", [
    (2 ** 63, None, "9223372036854775808", "int64"),
    ([1, 2 ** 63], None, "9223372036854775808", "int64"),
    ([-1, 2 ** 63], None, "9223372036854775808", "int64"),      # NumPy would make float64 of these
    (-2 ** 63 - 1, None, "-9223372036854775809", "int64"),
    ([300], tp.int8, "300", "int8"),
    ([[1, 2], [3, -129]], tp.int8, "-129", "int8"),
    ([70000], tp.int16, "70000", "int16"),
    ([2 ** 31], tp.int32, "2147483648", "int32"),
    ([256], tp.uint8, "256", "uint8"),
    ([-256], tp.uint8, "-256", "uint8"),
    (float("nan"), tp.int32, "nan", "int32"),
    ([1.0, float("inf")], tp.int64, "inf", "int64"),
    ([float("-inf")], tp.int8, "-inf", "int8"),
    ([1e10], tp.int32, "10000000000.0", "int32"),
    ([-1.0], tp.uint8, "-1.0", "uint8"),
    ([255.5], tp.uint8, "255.5", "uint8"),
    ([2.0 ** 63], tp.int64, "9.223372036854776e+18", "int64"),
    (10 ** 400, tp.float64, "digits", "float64"),
])
def test_numbers_that_do_not_fit_raise_overflow_naming_value_and_dtype(data, dtype, value, name):
    with pytest.raises(OverflowError) as info:
        tp.tensor(data, dtype=dtype)
    msg = str(info.value)
    assert value in msg and f"does not fit {name}" in msg


def test_two_to_the_seventy_does_not_fit_int64():
    with pytest.raises(OverflowError, match=r"value 1180591620717411303424 does not fit int64 "
                                            r"\(-9223372036854775808 to 9223372036854775807\)"):
        tp.tensor(2 ** 70)
    with pytest.raises(OverflowError, match=r"value 100000000000\.\.\.0000 \(401 digits\) does not fit int64"):
        tp.tensor(10 ** 400)
    with pytest.raises(OverflowError, match="does not fit int64"):
        tp.tensor([[1, 2 ** 70]])
    with pytest.raises(OverflowError, match="does not fit int8"):
        tp.tensor([2 ** 70], dtype=tp.int8)


@pytest.mark.parametrize("data,dtype,expected", [
    ([-1, 2, -255], tp.uint8, [255, 2, 1]),            # PyTorch wraps negative ints into unsigned dtypes
    ([127, -128], tp.int8, [127, -128]),
    ([INT64_MAX, -INT64_MAX - 1], None, [INT64_MAX, -INT64_MAX - 1]),
    ([1.5, INT64_MAX], tp.int64, [1, INT64_MAX]),       # exact, not through float64
    ([3.9, -3.9, 127.0], tp.int8, [3, -3, 127]),         # truncated toward zero
    ([True, 2], None, [1, 2]),
    ([2 ** 70, 1], tp.float64, [float(2 ** 70), 1.0]),  # any int fits a floating dtype below float64's max
    ([float("nan"), 0.0, 2], tp.bool, [True, False, True]),
])
def test_numbers_that_fit_are_stored_exactly(data, dtype, expected):
    t = tp.tensor(data, dtype=dtype)
    assert t.tolist() == expected
    if dtype is not None:
        assert t.dtype is dtype


def test_floats_round_into_floating_dtypes_silently():
    assert tp.tensor([1e300, 2.0], dtype=tp.float16).tolist() == [float("inf"), 2.0]
    assert tp.tensor(1e300).item() == float("inf")                  # float32, as torch.tensor
    assert tp.tensor([70000], dtype=tp.float16).tolist() == [float("inf")]
    assert tp.tensor([1.5, float("inf")]).tolist() == [1.5, float("inf")]
    assert tp.tensor([-1, 2 ** 63, 0.5]).dtype is tp.float32        # a float among them: floats


def test_inference_is_unchanged():
    assert tp.tensor([1, 2]).dtype is tp.int64
    assert tp.tensor([1.0, 2]).dtype is tp.float32
    assert tp.tensor([True]).dtype is tp.bool
    assert tp.tensor([]).dtype is tp.float32 and tp.tensor([]).shape == (0,)
    assert tp.tensor([[], []]).shape == (2, 0)
    assert tp.tensor(np.array([1.0], np.float64)).dtype is tp.float64
    assert tp.tensor(np.int16(3)).dtype is tp.int16
    assert tp.tensor([tp.tensor([1, 2]), tp.tensor([3, 4])]).tolist() == [[1, 2], [3, 4]]


def test_numpy_arrays_and_tensors_are_cast_not_checked():
    """As torch.tensor(ndarray, dtype=...): existing values are cast, by the
    rule of Tensor.to (floats saturate, NaN becomes 0, ints wrap)."""
    a = np.array([300.0, float("nan"), -1e10, 2.5])
    assert tp.tensor(a, dtype=tp.int8).tolist() == [127, 0, -128, 2]
    assert tp.tensor(np.array([300, -1]), dtype=tp.int8).tolist() == [44, -1]
    assert tp.tensor(tp.tensor([300.0]), dtype=tp.uint8).tolist() == [255]
    assert tp.tensor(np.float64("nan"), dtype=tp.int32).item() == 0


def test_ragged_sequences_raise_value_error_in_our_words():
    with pytest.raises(ValueError, match=r"ragged nested sequences: data\[1\] has length 1 but data\[0\] "
                                         r"has length 2"):
        tp.tensor([[1, 2], [3]])
    with pytest.raises(ValueError, match=r"data\[1\] has length 1 but data\[0\] is a number"):
        tp.tensor([1, [2]])
    with pytest.raises(ValueError, match=r"data\[0\]\[1\] has length 3 but data\[0\]\[0\] has length 2"):
        tp.tensor([[[1, 2], [1, 2, 3]]])
    with pytest.raises(ValueError) as info:
        tp.tensor([[1.0, 2.0], [3.0]], dtype=tp.float32)
    assert "inhomogeneous" not in str(info.value)


@pytest.mark.parametrize("data,what", [
    ([1, None], r"NoneType None at data\[1\]"),
    ([[1, 2], [3, "x"]], r"str 'x' at data\[1\]\[1\]"),
    ("abc", "str 'abc'"),
    ({"a": 1}, "dict"),
    ([1j], r"complex 1j at data\[0\]: complex numbers are not supported"),
    (np.array([1, "a"], dtype=object), r"str 'a' at array\[1\]"),
    (np.array([[1, None]], dtype=object), r"NoneType None at array\[0\]\[1\]"),
])
def test_non_numeric_data_raises_type_error_naming_it(data, what):
    with pytest.raises(TypeError, match="cannot make a tensor from " + what):
        tp.tensor(data)


def test_object_arrays_of_numbers_are_python_numbers():
    assert tp.tensor(np.array([1, 2], dtype=object)).tolist() == [1, 2]
    with pytest.raises(OverflowError, match="does not fit int64"):
        tp.tensor(np.array([1, 2 ** 70], dtype=object))


@pytest.mark.parametrize("data", [np.array(["a", "b"]), np.array([1 + 2j]),
                                  np.array(["2020-01-01"], dtype="datetime64[D]")])
def test_numpy_arrays_of_other_kinds_are_refused(data):
    with pytest.raises(TypeError, match="cannot make a tensor from a NumPy array of dtype"):
        tp.tensor(data)
    with pytest.raises(TypeError, match="cannot make a tensor from a NumPy array of dtype"):
        tp.tensor(data, dtype=tp.float32)


@pytest.mark.parametrize("dtype,start", [(42, "42 is not a dtype"), (str, "str is not a dtype"),
                                         (object, "object is not a dtype"), (1.5, "1.5 is not a dtype"),
                                         (np.str_, "NumPy dtype str has no tensorplay dtype"),
                                         (np.complex64, "NumPy dtype complex64 has no tensorplay dtype"),
                                         ("nope", "unknown dtype 'nope'")])
def test_bad_dtypes_raise_type_error_in_our_words(dtype, start):
    with pytest.raises(TypeError) as info:
        tp.tensor([1, 2], dtype=dtype)
    msg = str(info.value)
    assert msg.startswith(start) and "<U0" not in msg and "Cannot interpret" not in msg
    with pytest.raises(TypeError, match=start):
        tp.zeros(2, dtype=dtype)


# ------------------------------------------------------------------ full and fill_


@pytest.mark.parametrize("value,dtype,name", [
    (300, tp.int8, "int8"), (-129, tp.int8, "int8"), (256, tp.uint8, "uint8"), (-256, tp.uint8, "uint8"),
    (2 ** 63, tp.int64, "int64"), (2 ** 70, None, "int64"),
    (float("nan"), tp.int32, "int32"), (float("inf"), tp.int32, "int32"), (-1.0, tp.uint8, "uint8"),
    (1e10, tp.int32, "int32"),
    (1e10, tp.float16, "float16"), (70000, tp.float16, "float16"), (-65520.0, tp.float16, "float16"),
    (1e39, tp.float32, "float32"), (1e39, tp.bfloat16, "bfloat16"), (10 ** 400, tp.float64, "float64"),
])
def test_fill_values_that_do_not_fit_raise_overflow(value, dtype, name):
    """PyTorch's full/fill_ check the value against the dtype, floating dtypes
    included (a finite value past the largest is refused, not made inf)."""
    with pytest.raises(OverflowError, match=f"fill value .* does not fit {name}"):
        tp.full((2,), value, dtype=dtype)
    if dtype is not None:
        t = tp.zeros(2, dtype=dtype)
        with pytest.raises(OverflowError, match=f"does not fit {name}"):
            t.fill_(value)
        assert t.tolist() == [0, 0]                    # untouched
        with pytest.raises(OverflowError, match=f"does not fit {name}"):
            tp.full_like(t, value)


@pytest.mark.parametrize("value,dtype,expected", [
    (-1, tp.uint8, 255), (-255, tp.uint8, 1), (255, tp.uint8, 255), (-128, tp.int8, -128),
    (3.7, tp.int32, 3), (-3.7, tp.int32, -3), (2.5, tp.bool, True), (float("nan"), tp.bool, True),
    (0.0, tp.bool, False), (True, tp.int8, 1), (float("inf"), tp.float16, float("inf")),
    (float("-inf"), tp.bfloat16, float("-inf")), (65504.0, tp.float16, 65504.0),
    (np.float64(2.5), tp.float32, 2.5), (np.int64(-1), tp.uint8, 255), (np.bool_(True), tp.float32, 1.0),
    (INT64_MAX, tp.int64, INT64_MAX),
])
def test_fill_values_that_fit(value, dtype, expected):
    assert tp.full((2,), value, dtype=dtype).tolist() == [expected] * 2
    assert tp.zeros(3, dtype=dtype).fill_(value).tolist() == [expected] * 3


def test_fill_nan_is_nan_in_every_floating_dtype():
    for d in (tp.float16, tp.bfloat16, tp.float32, tp.float64):
        assert np.isnan(tp.full((2,), float("nan"), dtype=d).numpy().astype(np.float32)).all()


def test_fill_takes_one_element_tensors_and_refuses_other_things():
    t = tp.zeros(3, dtype=tp.int8)
    assert t.fill_(tp.tensor([5.0])).tolist() == [5, 5, 5]
    with pytest.raises(OverflowError, match="does not fit int8"):
        t.fill_(tp.tensor(1000))
    with pytest.raises(ValueError, match="one-element"):
        t.fill_(tp.tensor([1, 2]))
    for bad in ("a", 1j, np.array([1.0]), None):
        with pytest.raises(TypeError, match="real number"):
            t.fill_(bad)


def test_setitem_with_a_number_checks_it_as_fill_does():
    t = tp.zeros(3, dtype=tp.int8)
    t[1] = 7
    t[2:] = -1
    assert t.tolist() == [0, 7, -1]
    with pytest.raises(OverflowError, match="does not fit int8"):
        t[0] = 300


@pytest.mark.parametrize("d", ALL_DTYPES)
def test_full_infers_and_fills_every_dtype(d):
    v = True if d is tp.bool else 3
    assert tp.full((2, 3), v, dtype=d).tolist() == [[v] * 3] * 2
