# SPDX-License-Identifier: Apache-2.0
"""The public API's shape (CPU): PyTorch's parameter names, what
``from tensorplay import *`` brings in, named tuples, and a docstring for
every public name (NumPy style, an imperative or descriptive first line)."""

import builtins
import inspect
import re

import numpy as np
import pytest

import tensorplay as tp
from tensorplay._graph import cudagraphs
from tensorplay.cuda import CUDAGraph


def test_star_import_leaves_the_builtins_alone():
    ns = {}
    exec("from tensorplay import *\nseen = (int, float, bool, int('3'), float('0.5'), bool(0))", ns)
    assert ns["seen"] == (builtins.int, builtins.float, builtins.bool, 3, 0.5, False)
    assert "int" not in ns and "float" not in ns and "bool" not in ns
    assert ns["float32"] is tp.float32 and ns["bool_"] is tp.bool_
    # no builtin class is shadowed (functions such as max and sum are, as in NumPy and PyTorch)
    shadowed = [n for n in tp.__all__ if isinstance(getattr(builtins, n, None), type)]
    assert not shadowed, shadowed


def test_pytorch_dtype_aliases_stay_attributes():
    assert tp.bool is tp.bool_ and tp.int is tp.int32 and tp.float is tp.float32
    assert tp.long is tp.int64 and tp.half is tp.float16 and tp.double is tp.float64
    assert tp.short is tp.int16


def test_every_name_in_all_exists():
    for module in (tp, tp.cuda, cudagraphs, tp.types, tp.return_types, tp.nn, tp.nn.functional):
        missing = [n for n in module.__all__ if not hasattr(module, n)]
        assert not missing, (module.__name__, missing)
        assert len(set(module.__all__)) == len(module.__all__), module.__name__


def test_keyword_arguments_use_the_stub_names():
    """The parameter names are PyTorch's and the stub's: keywords work."""
    x = tp.tensor([[1.0, -2.0, 3.0], [4.0, 5.0, -6.0]])
    v = tp.tensor([1.0, 2.0, 3.0])
    assert tp.mean(input=x).item() == pytest.approx(0.8333333, rel=1e-6)
    assert tp.mean(input=x, dim=0, keepdim=True).shape == (1, 3)
    assert tp.var(input=x, dim=1, correction=0).shape == (2,)
    assert tp.std(input=x).item() == pytest.approx(float(np.std(x.numpy(), ddof=1)), rel=1e-6)
    assert tp.norm(input=v, p=1).item() == 6.0
    assert tp.max(input=x).item() == 5.0 and tp.min(input=x).item() == -6.0
    assert tp.argmax(input=x).item() == 4 and tp.argmin(input=x, dim=1).tolist() == [1, 2]
    assert tp.amax(input=x, dim=0).tolist() == [4.0, 5.0, 3.0]
    assert tp.sum(input=x, dim=0, dtype=tp.float64).dtype is tp.float64
    assert tp.prod(input=v).item() == 6.0
    assert tp.all(input=x).item() and tp.any(input=x, dim=1).tolist() == [True, True]
    assert tp.clamp(input=x, min=0.0, max=4.0).tolist() == [[1.0, 0.0, 3.0], [4.0, 4.0, 0.0]]
    assert tp.where(condition=x > 0, input=x, other=0.0).tolist() == [[1.0, 0.0, 3.0], [4.0, 5.0, 0.0]]
    assert tp.dot(input=v, tensor=v).item() == 14.0
    assert tp.matmul(input=x, other=v).tolist() == [6.0, -4.0]
    assert tp.mv(input=x, vec=v).tolist() == [6.0, -4.0]
    assert tp.add(input=x, other=1).shape == (2, 3) and tp.neg(input=v).tolist() == [-1.0, -2.0, -3.0]
    assert tp.true_divide(input=v, other=2).tolist() == [0.5, 1.0, 1.5]
    assert tp.zeros_like(input=x).shape == (2, 3) and tp.full_like(input=v, fill_value=2).tolist() == [2, 2, 2]
    assert tp.empty_like(input=x, dtype=tp.int8).dtype is tp.int8
    assert tp.ones_like(input=v, device="cpu").tolist() == [1.0, 1.0, 1.0]
    assert tp.from_numpy(ndarray=np.zeros(2)).dtype is tp.float64
    assert tp.as_tensor(data=[1, 2]).dtype is tp.int64
    assert tp.promote_types(type1=tp.uint8, type2=tp.int8) is tp.int16
    assert tp.can_cast(from_=tp.int32, to=tp.float16)
    assert tp.cat(tensors=[v, v], dim=0).shape == (6,) and tp.stack(tensors=[v, v], dim=1).shape == (3, 2)
    assert tp.linspace(start=0, end=1, steps=3).tolist() == [0.0, 0.5, 1.0]
    assert tp.eye(n=2, m=3).shape == (2, 3)
    assert tp.is_tensor(obj=x)
    # the methods take the same names after self
    assert x.mean(dim=1).shape == (2,) and x.var(dim=0, correction=0, keepdim=True).shape == (1, 3)
    assert x.clamp(min=0.0).min().item() == 0.0 and v.dot(tensor=v).item() == 14.0


def test_out_dtype_and_device_are_keyword_only_as_in_pytorch():
    x = tp.ones(3)
    with pytest.raises(TypeError):
        tp.sum(x, 0, False, tp.float64)            # dtype is keyword-only
    with pytest.raises(TypeError):
        tp.var(x, 0, 1)                              # correction is keyword-only
    with pytest.raises(TypeError):
        tp.add(x, 1, tp.empty(3))                    # out is keyword-only
    with pytest.raises(TypeError):
        tp.tensor([1], tp.int8)                      # dtype is keyword-only
    with pytest.raises(TypeError):
        tp.full((2,), 1, tp.int8)
    assert tp.sum(x, 0, False, dtype=tp.float64, out=tp.empty((), dtype=tp.float64)).item() == 3.0


def test_max_and_min_along_a_dim_return_named_tuples():
    x = tp.tensor([[1.0, 7.0, 3.0], [9.0, 2.0, 9.0]])
    r = tp.max(x, 1)
    assert isinstance(r, tp.return_types.max) and isinstance(r, tuple)
    assert r.values.tolist() == [7.0, 9.0] and r.indices.tolist() == [1, 0]   # first index on ties
    values, indices = x.min(dim=0, keepdim=True)
    assert values.tolist() == [[1.0, 2.0, 3.0]] and indices.tolist() == [[0, 1, 0]]
    assert isinstance(x.min(0), tp.return_types.min)
    assert isinstance(tp.max(x), tp.Tensor) and tp.max(x).ndim == 0
    with pytest.raises(TypeError):
        tp.max(x, (0, 1))


def test_iterating_a_tensor_gives_its_rows():
    x = tp.arange(6).reshape(2, 3)
    assert [r.tolist() for r in x] == [[0, 1, 2], [3, 4, 5]]
    with pytest.raises(TypeError):
        iter(tp.tensor(1.0))


# ------------------------------------------------------------------ docstrings

def _public_objects():
    """(qualified name, object) of every public function, class and member."""
    out = []
    for module in (tp, tp.cuda, cudagraphs, tp.types, tp.return_types, tp.nn.functional):
        for name in module.__all__:
            obj = getattr(module, name)
            if isinstance(obj, (tp.dtype, tuple, type(tp))) or name in ("Number", "TensorOrNumber",
                                                                       "DeviceLike", "DTypeLike", "Size",
                                                                       "Dims", "StreamLike",
                                                                       "CaptureErrorMode", "PoolLike", "Activation",
                                                                       "TensorLike"):
                continue                              # data, modules and type aliases
            out.append((f"{module.__name__}.{name}", obj))
    for cls in (tp.Tensor, CUDAGraph):
        for name in dir(cls):
            if not name.startswith("_"):
                out.append((f"{cls.__module__}.{cls.__qualname__}.{name}", inspect.getattr_static(cls, name)))
    for cls in (tp.cuda.Stream, tp.cuda.ExternalStream, tp.cuda.Event, tp.cuda.RawKernel,
                tp.cuda.ElementwiseKernel, tp.dtype, tp.device, cudagraphs.CUDAGraphified, tp.Generator):
        for name, member in vars(cls).items():
            if not name.startswith("_"):
                out.append((f"{cls.__module__}.{cls.__qualname__}.{name}", member))
    return out


_COMPILED = {"tensorplay._driver.context", "tensorplay._driver.stream", "tensorplay._memory.allocator", "tensorplay._memory.ipc", "tensorplay._tensor.base",
             "tensorplay._tensor.dlpack", "tensorplay._driver.memcpy", "tensorplay._driver.launch", "tensorplay._graph.capture"}
_EMBEDDED = re.compile(r"^[\w.]+\(.*\)(\s*->\s*[\w\[\]., |]+)?$")   # Cython's embedsignature line


def _summary(obj):
    doc = getattr(obj, "__doc__", None)
    if isinstance(obj, (staticmethod, classmethod)):
        doc = obj.__func__.__doc__
    if type(obj).__name__ == "member_descriptor" and not doc:
        slots = getattr(obj.__objclass__, "__slots__", None)   # __slots__ = {name: docstring}
        doc = slots.get(obj.__name__) if isinstance(slots, dict) else None
    if not doc or not doc.strip():
        return None
    lines = inspect.cleandoc(doc).splitlines()
    compiled = type(obj).__name__ in ("cython_function_or_method", "builtin_function_or_method",
                                      "method_descriptor") or \
        (isinstance(obj, type) and obj.__module__ in _COMPILED)
    if compiled and _EMBEDDED.match(lines[0]):
        lines = lines[1:]                              # Cython's embedded signature (embedsignature)
        while lines and not lines[0].strip():
            lines = lines[1:]
    summary = []                                       # the first paragraph, unwrapped
    for line in lines:
        if not line.strip():
            break
        summary.append(line.strip())
    return " ".join(summary) or None


def test_every_public_name_has_a_docstring():
    missing = [name for name, obj in _public_objects() if _summary(obj) is None]
    assert not missing, f"public names without a docstring: {missing}"


def test_docstring_first_lines_are_sentences_not_signatures():
    """The first line is a sentence (NumPy style): capitalised, ending in a period,
    not a signature (autodoc would take ``max(t) -> the largest value`` for one)."""
    bad = []
    for name, obj in _public_objects():
        line = _summary(obj)
        if line is None:
            continue
        if not (line[:1].isupper() or line.startswith("``")) or not line.rstrip().endswith((".", ":", "::")) \
                or re.match(r"^\w+\(.*\)\s*(->|$)", line):
            bad.append((name, line))
    assert not bad, bad


def test_functions_start_with_an_imperative():
    """Functions and methods say what they do, in the imperative (``Return ...``,
    not ``Returns ...``); properties and classes are described."""
    bad = []
    for name, obj in _public_objects():
        if isinstance(obj, (type, property)) or type(obj).__name__ in ("getset_descriptor", "member_descriptor"):
            continue
        if not callable(obj) and not isinstance(obj, (staticmethod, classmethod)):
            continue
        line = _summary(obj)
        first = re.sub(r"[^A-Za-z]", "", line.split()[0]) if line else ""
        if first.endswith("s") and not first.endswith("ss"):
            bad.append((name, line))
    assert not bad, bad


def test_package_ships_its_typing_marker():
    import importlib.resources
    assert importlib.resources.files("tensorplay").joinpath("py.typed").is_file()


def test_cudagraphify_has_one_module_under_three_names():
    """tensorplay.cuda.cudagraphify is public; its module is tensorplay.cuda.cudagraphs,
    the same object as the seed's tensorplay._stax.cudagraphs."""
    import importlib

    import tensorplay._stax.cudagraphs as seed
    public = importlib.import_module("tensorplay.cuda.cudagraphs")
    assert public is seed is tp.cuda.cudagraphs
    assert tp.cuda.cudagraphify is seed.cudagraphify
    assert "cudagraphify" in tp.cuda.__all__
