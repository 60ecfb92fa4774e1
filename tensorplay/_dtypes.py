# SPDX-License-Identifier: Apache-2.0
"""Tensor element types and their mapping to NumPy, DLPack and CUDA C."""

from __future__ import annotations

from typing import Any

import numpy as np

try:
    import ml_dtypes as _ml_dtypes
    _BF16_NP = np.dtype(_ml_dtypes.bfloat16)
except ImportError:  # pragma: no cover - ml_dtypes is a dependency
    _BF16_NP = None


class dtype:
    """An element type: ``tensorplay.float32`` and the others below.

    Compare dtypes with ``is`` or ``==``; a dtype is also equal to its name
    (``tensorplay.float32 == "float32"``). The dtypes are the only instances;
    do not make new ones.
    """

    __slots__ = {
        "name": 'The name: ``"float32"``, ``"bfloat16"``, ...',
        "code": "Its index in :data:`ALL_DTYPES`.",
        "itemsize": "The size of one element in bytes.",
        "kind": '``"b"`` bool, ``"u"`` unsigned, ``"i"`` signed integer, ``"f"`` floating.',
        "ctype": "The storage type in generated CUDA C.",
        "_np": "The NumPy dtype, or None.",
    }
    name: str
    code: int
    itemsize: int
    kind: str
    ctype: str

    def __init__(self, name: str, code: int, itemsize: int, kind: str, ctype: str,
                 np_dtype: np.dtype[Any] | None) -> None:
        self.name = name
        self.code = code
        self.itemsize = itemsize
        self.kind = kind          # 'b' bool, 'u' unsigned, 'i' signed, 'f' floating
        self.ctype = ctype        # storage type in generated CUDA C
        self._np = np_dtype

    @property
    def is_floating_point(self) -> bool:
        """True for float16, bfloat16, float32 and float64."""
        return self.kind == "f"

    @property
    def is_signed(self) -> bool:
        """True for the signed integer and the floating types."""
        return self.kind in "if"

    @property
    def numpy_dtype(self) -> np.dtype[Any]:
        """The NumPy dtype of CPU tensors of this dtype (bfloat16's from ``ml_dtypes``)."""
        if self._np is None:
            raise TypeError(f"{self.name} has no NumPy dtype (install ml_dtypes)")
        return self._np

    def __repr__(self) -> str:
        return f"tensorplay.{self.name}"

    def __eq__(self, other: object) -> bool:
        if isinstance(other, dtype):
            return other is self
        if isinstance(other, str):
            return other == self.name
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.name)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_by_name, (self.name,))


bool_ = dtype("bool", 0, 1, "b", "bool", np.dtype(np.bool_))
uint8 = dtype("uint8", 1, 1, "u", "unsigned char", np.dtype(np.uint8))
int8 = dtype("int8", 2, 1, "i", "signed char", np.dtype(np.int8))
int16 = dtype("int16", 3, 2, "i", "short", np.dtype(np.int16))
int32 = dtype("int32", 4, 4, "i", "int", np.dtype(np.int32))
int64 = dtype("int64", 5, 8, "i", "long long", np.dtype(np.int64))
float16 = dtype("float16", 6, 2, "f", "unsigned short", np.dtype(np.float16))
bfloat16 = dtype("bfloat16", 7, 2, "f", "unsigned short", _BF16_NP)
float32 = dtype("float32", 8, 4, "f", "float", np.dtype(np.float32))
float64 = dtype("float64", 9, 8, "f", "double", np.dtype(np.float64))

ALL_DTYPES = (bool_, uint8, int8, int16, int32, int64, float16, bfloat16, float32, float64)
BY_NAME = {d.name: d for d in ALL_DTYPES}
BY_NAME.update({"half": float16, "float": float32, "double": float64, "long": int64,
                 "int": int32, "short": int16, "bool_": bool_})
_BY_NP = {d._np: d for d in ALL_DTYPES if d._np is not None}

default_float = float32
default_int = int64


def get_default_dtype() -> dtype:
    """Return the default floating dtype: float32.

    As ``torch.get_default_dtype``: the dtype of Python floats made into
    tensors (:func:`tensorplay.tensor`), of :func:`tensorplay.rand` and
    friends, and of the floating results of integer operands (true
    division, ``exp``, ...). tensorplay's default is fixed (there is no
    ``set_default_dtype``).

    Returns
    -------
    dtype
        :data:`tensorplay.float32`.
    """
    return default_float


def _by_name(name):
    return BY_NAME[name]


def from_code(code):
    return ALL_DTYPES[code]


def from_numpy_dtype(np_dtype):
    """The tensorplay dtype of a NumPy dtype; TypeError if unsupported."""
    nd = np.dtype(np_dtype)
    d = _BY_NP.get(nd)
    if d is None:
        d = _BY_NP.get(nd.newbyteorder("="))
    if d is None:
        raise TypeError(f"NumPy dtype {nd.name} has no tensorplay dtype; tensors hold "
                        f"{', '.join(x.name for x in ALL_DTYPES)}")
    return d


def as_dtype(spec):
    """Normalise a dtype given as a tensorplay dtype, a name (``"float32"``,
    ``"half"``), a NumPy dtype or scalar type, a PyTorch dtype, or ``bool``,
    ``int`` or ``float`` (bool, int64 and float64, as PyTorch reads them);
    TypeError naming ``spec`` for anything else."""
    if isinstance(spec, dtype):
        return spec
    if spec is None:
        raise TypeError("dtype must not be None here")
    if spec is bool:
        return bool_
    if spec is int:
        return int64
    if spec is float:
        return float64
    if isinstance(spec, str):
        d = BY_NAME.get(spec)
        if d is not None:
            return d
        raise TypeError(f"unknown dtype {spec!r}; expected one of {', '.join(x.name for x in ALL_DTYPES)}")
    if type(spec).__module__.startswith("torch"):     # torch.float32 and the like, without importing torch
        d = BY_NAME.get(str(spec).replace("torch.", ""))
        if d is not None:
            return d
    if isinstance(spec, np.dtype) or (isinstance(spec, type) and issubclass(spec, np.generic)):
        return from_numpy_dtype(spec)
    what = spec.__name__ if isinstance(spec, type) else repr(spec)
    raise TypeError(f"{what} is not a dtype: give a tensorplay dtype (tensorplay.float32, ...), its name "
                    f"('float32', ...), a NumPy dtype, or bool, int or float")


# DLPack (code, bits) <-> dtype
_DL = {(6, 8): bool_, (1, 8): uint8, (0, 8): int8, (0, 16): int16, (0, 32): int32,
       (0, 64): int64, (2, 16): float16, (4, 16): bfloat16, (2, 32): float32, (2, 64): float64,
       (1, 1): bool_}


def from_dlpack_type(code, bits, lanes):
    if lanes != 1:
        raise BufferError(f"DLPack vector types (lanes={lanes}) are not supported")
    d = _DL.get((code, bits))
    if d is None:
        raise BufferError(f"unsupported DLPack dtype (code={code}, bits={bits})")
    return d


# CUDA Array Interface typestr -> dtype
def from_typestr(typestr):
    try:
        return from_numpy_dtype(np.dtype(typestr))
    except TypeError:
        raise TypeError(f"unsupported __cuda_array_interface__ typestr {typestr!r}") from None
