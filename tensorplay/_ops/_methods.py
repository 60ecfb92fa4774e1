# SPDX-License-Identifier: Apache-2.0
"""Operators and op methods of tensorplay.Tensor, and the module-level functions."""

from __future__ import annotations

from . import _creation, _elementwise, _linalg, _reduce
from ._elementwise import apply

BINARY = ("add", "sub", "mul", "div", "floor_divide", "remainder", "pow", "maximum", "minimum",
          "eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or", "logical_xor",
          "bitwise_and", "bitwise_or", "bitwise_xor")
UNARY = ("neg", "abs", "exp", "log", "log1p", "expm1", "sqrt", "rsqrt", "sin", "cos", "tanh",
         "sigmoid", "relu", "floor", "ceil", "round", "sign", "isnan", "isinf", "isfinite",
         "logical_not", "bitwise_not")
NO_INPLACE = ("eq", "ne", "lt", "le", "gt", "ge", "isnan", "isinf", "isfinite")

_OPERATORS = {
    "__add__": "add", "__sub__": "sub", "__mul__": "mul", "__truediv__": "div",
    "__floordiv__": "floor_divide", "__mod__": "remainder", "__pow__": "pow",
    "__and__": "bitwise_and", "__or__": "bitwise_or", "__xor__": "bitwise_xor",
    "__eq__": "eq", "__ne__": "ne", "__lt__": "lt", "__le__": "le", "__gt__": "gt", "__ge__": "ge",
}


def _binary_fn(op):
    def fn(input, other, *, out=None):
        return apply(op, input, other, out=out)
    fn.__name__ = op
    fn.__doc__ = f"Elementwise {op} with broadcasting and type promotion; ``out=`` writes in place."
    return fn


def _unary_fn(op):
    def fn(input, *, out=None):
        return apply(op, input, out=out)
    fn.__name__ = op
    fn.__doc__ = f"Elementwise {op}; half types compute in float32."
    return fn


FUNCTIONS = {}
for _op in BINARY:
    FUNCTIONS[_op] = _binary_fn(_op)
for _op in UNARY:
    FUNCTIONS[_op] = _unary_fn(_op)
FUNCTIONS.update({
    "where": _elementwise.where, "clamp": _elementwise.clamp,
    "sum": lambda input, dim=None, keepdim=False, dtype=None, out=None:
        _reduce.reduce("sum", input, dim, keepdim, dtype, out),
    "prod": lambda input, dim=None, keepdim=False, dtype=None, out=None:
        _reduce.reduce("prod", input, dim, keepdim, dtype, out),
    "amax": lambda input, dim=None, keepdim=False, out=None: _reduce.reduce("amax", input, dim, keepdim, out=out),
    "amin": lambda input, dim=None, keepdim=False, out=None: _reduce.reduce("amin", input, dim, keepdim, out=out),
    "all": lambda input, dim=None, keepdim=False, out=None: _reduce.reduce("all", input, dim, keepdim, out=out),
    "any": lambda input, dim=None, keepdim=False, out=None: _reduce.reduce("any", input, dim, keepdim, out=out),
    "max": _reduce.max_, "min": _reduce.min_, "argmax": _reduce.argmax, "argmin": _reduce.argmin,
    "mean": _reduce.mean, "var": _reduce.var, "std": _reduce.std, "norm": _reduce.norm,
    "dot": _reduce.dot, "matmul": _linalg.matmul, "mv": _linalg.mv,
    "linspace": _creation.linspace, "eye": _creation.eye, "cat": _creation.cat, "stack": _creation.stack,
})
FUNCTIONS["true_divide"] = FUNCTIONS["div"]
FUNCTIONS["multiply"] = FUNCTIONS["mul"]
FUNCTIONS["subtract"] = FUNCTIONS["sub"]
FUNCTIONS["negative"] = FUNCTIONS["neg"]


def _inplace(op):
    def method(self, *args):
        return apply(op, self, *args, out=self, _inplace=True)
    method.__name__ = op + "_"
    method.__doc__ = f"In-place {op}; refuses a result dtype that cannot be cast to this tensor's dtype."
    return method


def install(Tensor):
    """Attach operators and op methods to Tensor."""
    for op in BINARY + UNARY:
        f = FUNCTIONS[op]
        setattr(Tensor, op, f)
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
    Tensor.__matmul__ = lambda self, other: _linalg.matmul(self, other)
    Tensor.__rmatmul__ = lambda self, other: _linalg.matmul(other, self)
    for name in ("sum", "prod", "amax", "amin", "all", "any", "max", "min", "argmax", "argmin",
                 "mean", "var", "std", "norm", "dot", "matmul", "mv", "clamp"):
        setattr(Tensor, name, FUNCTIONS[name])
    Tensor.clamp_ = lambda self, min=None, max=None: self.copy_(_elementwise.clamp(self, min, max))
    Tensor.where = lambda self, condition, other: _elementwise.where(condition, self, other)
    Tensor.div_ = _inplace("div")
