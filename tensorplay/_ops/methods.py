# SPDX-License-Identifier: Apache-2.0
"""Operators and op methods of tensorplay.Tensor, and the module-level functions.

The op functions are made here from the tables (one function per op, with
its own name and docstring); scripts/gen_stubs.py writes their types into
tensorplay/__init__.pyi from the same tables.
"""

from __future__ import annotations

import inspect
import re

from tensorplay import _dtypes
from tensorplay._ops import creation as _creation
from tensorplay._ops import distributions as _distributions
from tensorplay._ops import elementwise as _elementwise
from tensorplay._ops import indexing as _indexing
from tensorplay._ops import linalg as _linalg
from tensorplay._ops import promotion as _promotion
from tensorplay._ops import reduce as _reduce
from tensorplay._ops import sampling as _sampling
from tensorplay._ops import scan as _scan
from tensorplay._ops import softmax as _softmax
from tensorplay._ops import sorting as _sorting
from tensorplay._ops import views as _views
from tensorplay._ops.elementwise import apply

BINARY = ("add", "sub", "mul", "div", "floor_divide", "remainder", "pow", "maximum", "minimum",
          "eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or", "logical_xor",
          "bitwise_and", "bitwise_or", "bitwise_xor")
UNARY = ("neg", "abs", "exp", "log", "log1p", "expm1", "sqrt", "rsqrt", "sin", "cos", "tanh",
         "sigmoid", "relu", "floor", "ceil", "round", "sign", "isnan", "isinf", "isfinite",
         "logical_not", "bitwise_not")
NO_INPLACE = ("eq", "ne", "lt", "le", "gt", "ge", "isnan", "isinf", "isfinite")
# alias -> op, as in PyTorch
ALIASES = {"true_divide": "div", "multiply": "mul", "subtract": "sub", "negative": "neg"}
# the functions that are also Tensor methods (besides the elementwise ops)
METHOD_FUNCTIONS = ("sum", "prod", "amax", "amin", "all", "any", "max", "min", "argmax", "argmin",
                    "mean", "var", "std", "norm", "dot", "matmul", "mv", "addmm", "clamp", "multinomial",
                    "softmax", "log_softmax", "cumsum", "sort", "topk", "gather", "tril", "triu", "isclose",
                    "allclose")

# What each op computes: the first line of its docstring, about ``input``.
SUMMARIES = {
    "add": "Add ``other`` to ``input``",
    "sub": "Subtract ``other`` from ``input``",
    "mul": "Multiply ``input`` by ``other``",
    "div": "Divide ``input`` by ``other`` (true division)",
    "floor_divide": "Divide ``input`` by ``other`` and round down to an integer value",
    "remainder": "Compute the remainder of ``input / other`` with the sign of ``other`` (Python's ``%``)",
    "pow": "Raise ``input`` to the power ``other``",
    "maximum": "Take the larger of ``input`` and ``other`` (NaN propagates)",
    "minimum": "Take the smaller of ``input`` and ``other`` (NaN propagates)",
    "eq": "Test whether ``input`` equals ``other``",
    "ne": "Test whether ``input`` differs from ``other``",
    "lt": "Test whether ``input`` is less than ``other``",
    "le": "Test whether ``input`` is less than or equal to ``other``",
    "gt": "Test whether ``input`` is greater than ``other``",
    "ge": "Test whether ``input`` is greater than or equal to ``other``",
    "logical_and": "Compute the logical AND of ``input`` and ``other`` (nonzero is true)",
    "logical_or": "Compute the logical OR of ``input`` and ``other`` (nonzero is true)",
    "logical_xor": "Compute the logical XOR of ``input`` and ``other`` (nonzero is true)",
    "bitwise_and": "Compute the bitwise AND of ``input`` and ``other``",
    "bitwise_or": "Compute the bitwise OR of ``input`` and ``other``",
    "bitwise_xor": "Compute the bitwise XOR of ``input`` and ``other``",
    "neg": "Negate ``input``",
    "abs": "Take the absolute value of ``input``",
    "exp": "Compute the exponential of ``input``",
    "log": "Compute the natural logarithm of ``input``",
    "log1p": "Compute ``log(1 + x)`` of ``input``, accurate for small values",
    "expm1": "Compute ``exp(x) - 1`` of ``input``, accurate for small values",
    "sqrt": "Compute the square root of ``input``",
    "rsqrt": "Compute the reciprocal of the square root of ``input``",
    "sin": "Compute the sine of ``input``",
    "cos": "Compute the cosine of ``input``",
    "tanh": "Compute the hyperbolic tangent of ``input``",
    "sigmoid": "Compute the logistic sigmoid ``1 / (1 + exp(-x))`` of ``input``",
    "relu": "Replace the negative elements of ``input`` by zero (NaN stays NaN)",
    "floor": "Round ``input`` down to integer values",
    "ceil": "Round ``input`` up to integer values",
    "round": "Round ``input`` to the nearest integer values, halves to even",
    "sign": "Return the sign of ``input``: -1, 0 or 1 (NaN stays NaN)",
    "isnan": "Test ``input`` for NaN",
    "isinf": "Test ``input`` for positive or negative infinity",
    "isfinite": "Test ``input`` for finite values (neither infinite nor NaN)",
    "logical_not": "Compute the logical NOT of ``input`` (zero is false)",
    "bitwise_not": "Compute the bitwise NOT of ``input`` (logical NOT for bool)",
}

# How the result dtype follows the operands, by the op's rule in _elementwise.OPS.
_RULES = {
    "arith": "The result dtype is :func:`result_type` of the operands (PyTorch's promotion).",
    "true_div": "The result dtype is :func:`result_type` of the operands; bool and integer "
                "operands give float32.",
    "compare": "The result is bool; the comparison runs in :func:`result_type` of the operands.",
    "logical": "The result is bool.",
    "bitwise": "Bool and integer operands only; the result dtype is :func:`result_type` of the operands.",
    "float": "Floating inputs keep their dtype (half types compute in float32), others give float32.",
    "same": "The result has ``input``'s dtype (half types compute in float32).",
    "predicate": "The result is bool.",
}

_KERNEL_NOTE = """Notes
-----
On CUDA tensors this launches one generated NVRTC kernel on the current
stream (cuLaunchKernel); it does not wait for it."""

_OUT_DOC = """out : Tensor, optional
    Write the result here: its shape must be the result's and its dtype one
    the result can be cast to (:func:`can_cast`)."""


def _binary_doc(op):
    return f"""{SUMMARIES[op]}, elementwise.

``input`` and ``other`` broadcast together. {_RULES[_elementwise.OPS[op][0]]}

Parameters
----------
input : Tensor or number
    The first operand.
other : Tensor or number
    The second operand.
{_OUT_DOC}

Returns
-------
Tensor
    The result.

{_KERNEL_NOTE}
"""


def _unary_doc(op):
    return f"""{SUMMARIES[op]}, elementwise.

{_RULES[_elementwise.OPS[op][0]]}

Parameters
----------
input : Tensor
    The operand.
{_OUT_DOC}

Returns
-------
Tensor
    The result.

{_KERNEL_NOTE}
"""


def _public(fn, name, doc):
    fn.__name__ = fn.__qualname__ = name
    fn.__module__ = "tensorplay"
    fn.__doc__ = doc
    return fn


def _binary_fn(op):
    def fn(input, other, *, out=None):
        return apply(op, input, other, out=out)
    return _public(fn, op, _binary_doc(op))


def _unary_fn(op):
    def fn(input, *, out=None):
        return apply(op, input, out=out)
    return _public(fn, op, _unary_doc(op))


def _alias_fn(alias, op):
    fn = _binary_fn(op) if op in BINARY else _unary_fn(op)
    return _public(fn, alias, f"{SUMMARIES[op]}, elementwise: an alias of :func:`{op}`.\n")


FUNCTIONS = {}
for _op in BINARY:
    FUNCTIONS[_op] = _binary_fn(_op)
for _op in UNARY:
    FUNCTIONS[_op] = _unary_fn(_op)
FUNCTIONS.update({
    "where": _elementwise.where, "clamp": _elementwise.clamp,
    "sum": _reduce.sum_, "prod": _reduce.prod, "amax": _reduce.amax, "amin": _reduce.amin,
    "all": _reduce.all_, "any": _reduce.any_,
    "max": _reduce.max_, "min": _reduce.min_, "argmax": _reduce.argmax, "argmin": _reduce.argmin,
    "mean": _reduce.mean, "var": _reduce.var, "std": _reduce.std, "norm": _reduce.norm,
    "dot": _reduce.dot, "matmul": _linalg.matmul, "mv": _linalg.mv,
    "addmm": _linalg.addmm, "linear": _linalg.linear,
    "linspace": _creation.linspace, "eye": _creation.eye, "cat": _creation.cat, "stack": _creation.stack,
    "randperm": _sampling.randperm, "multinomial": _sampling.multinomial,
    "softmax": _softmax.softmax, "log_softmax": _softmax.log_softmax, "cumsum": _scan.cumsum,
    "sort": _sorting.sort, "topk": _sorting.topk, "gather": _indexing.gather,
    "tril": _elementwise.tril, "triu": _elementwise.triu,
    "isclose": _elementwise.isclose, "allclose": _elementwise.allclose,
    "get_default_dtype": _dtypes.get_default_dtype,
})
for _alias, _op in ALIASES.items():
    FUNCTIONS[_alias] = _alias_fn(_alias, _op)
for _name, _fn in FUNCTIONS.items():          # tensorplay.where, not tensorplay._ops.elementwise.where
    _fn.__module__ = "tensorplay"
    _fn.__qualname__ = _name
for _fn in (_promotion.promote_types, _promotion.result_type, _promotion.can_cast):
    _fn.__module__ = "tensorplay"


# ------------------------------------------------------------------ methods

def _about_self(text):
    """A function's summary rewritten for the method: ``input`` is this tensor."""
    text = text.replace("``input``", "this tensor")
    return re.sub(r"``([^`]*)\binput\b([^`]*)``", r"``\1self\2``", text)


def _see(summary, name):
    return f"{_about_self(summary).rstrip('.')}; see :func:`tensorplay.{name}`."


def _method_name(fn, name, doc):
    fn.__name__ = name
    fn.__qualname__ = "Tensor." + name
    fn.__doc__ = doc
    return fn


def _binary_method(op):
    def method(self, other, *, out=None):
        return apply(op, self, other, out=out)
    return _method_name(method, op, _see(SUMMARIES[op] + ", elementwise", op) + "\n")


def _unary_method(op):
    def method(self, *, out=None):
        return apply(op, self, out=out)
    return _method_name(method, op, _see(SUMMARIES[op] + ", elementwise", op) + "\n")


_INPLACE_NOTE = """
The result must be castable to this tensor's dtype (:func:`tensorplay.can_cast`),
else TypeError. Returns ``self``.
"""


def _inplace_binary(op):
    def method(self, other):
        return apply(op, self, other, out=self, _inplace=True)
    return method


def _inplace_unary(op):
    def method(self):
        return apply(op, self, out=self, _inplace=True)
    return method


def _inplace(op):
    method = _inplace_binary(op) if op in BINARY else _inplace_unary(op)
    summary = _about_self(SUMMARIES[op]).rstrip(".")
    return _method_name(method, op + "_", f"{summary}, in place; see :func:`tensorplay.{op}`.\n"
                        + _INPLACE_NOTE)


def _method(fn, name):
    """``fn(input, ...)`` as the method ``Tensor.name(self, ...)``, with fn's
    signature (for help() and the docs) and a docstring pointing to fn."""
    def method(self, *args, **kwargs):
        return fn(self, *args, **kwargs)
    sig = inspect.signature(fn)
    params = list(sig.parameters.values())
    method.__signature__ = sig.replace(parameters=[params[0].replace(name="self")] + params[1:])
    summary = (fn.__doc__ or "").strip().splitlines()[0]
    return _method_name(method, name, _see(summary, name) + "\n")


def _clamp_(self, min=None, max=None):
    return self.copy_(_elementwise.clamp(self, min, max))


def _where(self, condition, other):
    return _elementwise.where(condition, self, other)


# PyTorch's dtype conversions: method name -> dtype
CONVERSIONS = {"float": _dtypes.float32, "half": _dtypes.float16, "double": _dtypes.float64,
               "int": _dtypes.int32, "long": _dtypes.int64, "bool": _dtypes.bool_,
               "bfloat16": _dtypes.bfloat16}


def _conversion(name, d):
    def method(self):
        return self.to(d)
    return _method_name(method, name, f"""Return this tensor as {d.name}: ``self.to(tensorplay.{d.name})``.

As PyTorch's conversion method of the same name: ``self`` when it already
is {d.name}, else a copy on the same device (cast by the rule of
:meth:`to`).

Returns
-------
Tensor
    The tensor in {d.name}.
""")


def _type_as(self, other):
    return self.to(other.dtype)


_TYPE_AS_DOC = """Return this tensor with ``other``'s dtype: ``self.to(other.dtype)``.

Parameters
----------
other : Tensor
    The tensor whose dtype to take.

Returns
-------
Tensor
    ``self`` when the dtypes match, else a copy cast to ``other``'s dtype.
"""


def _masked_fill(self, mask, value):
    return _indexing.masked_fill(self, mask, value)


def _masked_fill_(self, mask, value):
    return _indexing.masked_fill(self, mask, value, _inplace=True)


_MASKED_FILL_DOC = """Return a copy of this tensor with ``value`` where ``mask`` is true{inplace}.

As ``torch.Tensor.masked_fill{suffix}``: ``mask`` is a bool tensor that
broadcasts to this tensor's shape; ``value``, a number or a 0-d tensor, is
cast to this tensor's dtype (a number must fit it, as for :meth:`fill_`).

Parameters
----------
mask : Tensor
    Where to write ``value`` (bool, on this tensor's device, broadcast).
value : bool, int, float or Tensor
    The value, a number or a 0-d tensor.

Returns
-------
Tensor
    {returns}

Raises
------
TypeError
    If ``mask`` is not a bool tensor or ``value`` not a number or a 0-d tensor.
ValueError
    If ``mask`` does not broadcast to this tensor's shape.

Notes
-----
On CUDA tensors this launches one generated NVRTC kernel
(:func:`tensorplay.where`) on the current stream; a CUDA graph can
capture it.
"""


def install(Tensor):
    """Attach operators and op methods to Tensor."""
    for op in BINARY:
        setattr(Tensor, op, _binary_method(op))
    for op in UNARY:
        setattr(Tensor, op, _unary_method(op))
    for op in BINARY + UNARY:
        if op not in NO_INPLACE:
            setattr(Tensor, op + "_", _inplace(op))
    for name, op in _OPERATORS.items():
        setattr(Tensor, name, (lambda o: lambda self, other: apply(o, self, other))(op))
        if name not in ("__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__"):
            rname = "__r" + name[2:]
            setattr(Tensor, rname, (lambda o: lambda self, other: apply(o, other, self))(op))
            iname = "__i" + name[2:]
            setattr(Tensor, iname, (lambda o: lambda self, other: apply(o, self, other, out=self,
                                                                          _inplace=True))(op))
    Tensor.__hash__ = object.__hash__          # __eq__ is elementwise, identity hashing stays
    Tensor.__neg__ = lambda self: apply("neg", self)
    Tensor.__pos__ = lambda self: self
    Tensor.__abs__ = lambda self: apply("abs", self)
    Tensor.__invert__ = lambda self: apply("bitwise_not", self)
    Tensor.__getitem__ = _method_name(_indexing.tensor_getitem, "__getitem__", None)
    Tensor.__setitem__ = _method_name(_indexing.tensor_setitem, "__setitem__", None)
    for name, fn in _views.TENSOR_METHODS.items():
        setattr(Tensor, name, _method_name(fn, name, fn.__doc__))
    for name, fn in _distributions.TENSOR_METHODS.items():
        setattr(Tensor, name, _method_name(fn, name, fn.__doc__))
    Tensor.T = property(_method_name(_views.tensor_T, "T", _views.tensor_T.__doc__))
    Tensor.__matmul__ = lambda self, other: _linalg.matmul(self, other)
    Tensor.__rmatmul__ = lambda self, other: _linalg.matmul(other, self)
    for name in METHOD_FUNCTIONS:
        setattr(Tensor, name, _method(FUNCTIONS[name], name))
    Tensor.clamp_ = _method_name(_clamp_, "clamp_", _about_self(
        "Limit the elements of ``input`` to [``min``, ``max``], in place; see :func:`tensorplay.clamp`.\n"
        "\nReturns ``self``.\n"))
    for name, fn in _creation.TENSOR_METHODS.items():
        setattr(Tensor, name, _method_name(fn, name, fn.__doc__))
    Tensor.mT = property(_method_name(_views.tensor_mT, "mT", _views.tensor_mT.__doc__))
    for name, d in CONVERSIONS.items():
        setattr(Tensor, name, _conversion(name, d))
    Tensor.type_as = _method_name(_type_as, "type_as", _TYPE_AS_DOC)
    Tensor.masked_fill = _method_name(_masked_fill, "masked_fill", _MASKED_FILL_DOC.format(
        inplace="", suffix="", returns="A new tensor of this tensor's shape and dtype."))
    Tensor.masked_fill_ = _method_name(_masked_fill_, "masked_fill_", _MASKED_FILL_DOC.format(
        inplace=", in place", suffix="_", returns="``self``.").replace("Return a copy of this tensor with",
                                                                        "Write"))
    Tensor.where = _method_name(_where, "where", (
        "Choose elements of this tensor where ``condition`` is true, else of ``other``; "
        "see :func:`tensorplay.where`.\n"))


_OPERATORS = {
    "__add__": "add", "__sub__": "sub", "__mul__": "mul", "__truediv__": "div",
    "__floordiv__": "floor_divide", "__mod__": "remainder", "__pow__": "pow",
    "__and__": "bitwise_and", "__or__": "bitwise_or", "__xor__": "bitwise_xor",
    "__eq__": "eq", "__ne__": "ne", "__lt__": "lt", "__le__": "le", "__gt__": "gt", "__ge__": "ge",
}
