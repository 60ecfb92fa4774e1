# SPDX-License-Identifier: Apache-2.0
"""The kernels each op launches, by op name, and ``tensorplay.cuda.precompile``.

An op's kernels are found by running the op's own code over tensors of
``COLLECT_DEVICE`` (metadata over no memory, ``out=`` given) under
``tensorplay._kernels.cache.collect_kernel``, which stops at the kernel the
op asks for: the CUDA C compiled ahead is the op's own, byte for byte, so
its first use finds it in the on-disk cache. Kernel families whose choice
depends on sizes (a reduction's passes) are asked directly for each variant
the op can pick. This module sits on the graph floor because it reaches
every family: the ops', the generators' and the graph layer's.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, NamedTuple

import numpy as np

from tensorplay import _dtypes as dt
from tensorplay._graph import kernels as graph_kernels
from tensorplay._graph.copytable import COPY_CAPACITIES
from tensorplay._kernels import param_upload, random_kernels
from tensorplay._kernels.cache import COLLECT_DEVICE, KernelSpec, collect_kernel, launch_elementwise
from tensorplay._kernels.precompile import check_progress, check_workers, compile_kernels, resolve_archs
from tensorplay._kernels.reduce_kernels import ROW_WARPS, reduce_function
from tensorplay._ops.elementwise import OPS, apply, where
from tensorplay._ops.reduce import mean, reduce
from tensorplay._tensor.args import contiguous_strides
from tensorplay._tensor.creation import arange_kernel_args
from tensorplay._tensor.tensor import Tensor, copy_into, new_cpu, new_cuda

__all__ = ["precompile", "catalog_kernels", "CATALOG", "GROUPS", "DEFAULT_DTYPES"]

# dtypes=None: what models compute in; each op adds the index and mask dtypes it needs
DEFAULT_DTYPES = (dt.float32, dt.float16, dt.bfloat16)
INDEX = (dt.int64, dt.int32, dt.bool_)

Thunk = Callable[[], Any]


class _Tensors:
    """Operands for collecting: CUDA tensors on COLLECT_DEVICE at disjoint
    fake addresses (so no copy sees an overlap), CPU ones to ask an op its
    result's dtype and shape."""

    def __init__(self) -> None:
        self._next = 1 << 40

    def cuda(self, shape: tuple[int, ...], d: dt.dtype, strides: tuple[int, ...] | None = None) -> Tensor:
        ptr, self._next = self._next, self._next + (1 << 24)
        return new_cuda(None, ptr, shape, strides or contiguous_strides(shape), d, COLLECT_DEVICE)

    @staticmethod
    def cpu(shape: tuple[int, ...], d: dt.dtype) -> Tensor:
        return new_cpu(np.ones(shape, d.numpy_dtype), d)


def _number(d: dt.dtype) -> Any:
    """A Python number of ``d``'s kind, as a scalar operand."""
    return 2.0 if d.kind == "f" else (True if d is dt.bool_ else 2)


def _op_calls(t: _Tensors, fn: Callable[..., Tensor], head: tuple, operands: Sequence[tuple]) -> Iterator[Thunk]:
    """``fn(*head, *operands, out=...)`` over CUDA operands, ``out`` of the
    dtype and shape the op gives on CPU; none when the op refuses the dtypes.
    Each operand is (shape, dtype), shape None for a Python number."""
    def make(cuda: bool) -> list:
        return [_number(d) if shape is None else (t.cuda(shape, d) if cuda else t.cpu(shape, d))
                for shape, d in operands]
    try:
        r = fn(*head, *make(False))
    except (TypeError, ValueError):
        return                                  # the op refuses these dtypes (bool sub, float bitwise)
    yield functools.partial(fn, *head, *make(True), out=t.cuda(r.shape, r.dtype))


# Binary elementwise forms: same shapes (contiguous: one flat kernel), a
# broadcast row such as a bias (a keepdim reduction's column is the same
# kernel), a 0-d tensor, a Python number.
BINARY_FORMS = (((4,), (4,)), ((4, 8), (8,)), ((4,), ()), ((4,), None))


def _binary(op: str) -> Callable[[_Tensors, Sequence[dt.dtype]], Iterator[Thunk]]:
    def kernels(t: _Tensors, dtypes: Sequence[dt.dtype]) -> Iterator[Thunk]:
        for d in dtypes:
            for a, b in BINARY_FORMS:
                yield from _op_calls(t, apply, (op,), [(a, d), (b, d)])
    return kernels


def _unary(op: str) -> Callable[[_Tensors, Sequence[dt.dtype]], Iterator[Thunk]]:
    def kernels(t: _Tensors, dtypes: Sequence[dt.dtype]) -> Iterator[Thunk]:
        for d in dtypes:
            yield from _op_calls(t, apply, (op,), [((4,), d)])
    return kernels


def _where(t: _Tensors, dtypes: Sequence[dt.dtype]) -> Iterator[Thunk]:
    for d in dtypes:
        for cond, other in (((4,), (4,)), ((4,), None), ((8,), None)):     # the last: a mask broadcast, masked fill
            yield from _op_calls(t, where, (), [(cond, dt.bool_), ((4, 8) if cond == (8,) else (4,), d),
                                                (other, d)])


def _clamp(t: _Tensors, dtypes: Sequence[dt.dtype]) -> Iterator[Thunk]:
    for d in dtypes:
        for op in ("maximum", "minimum"):
            yield from _op_calls(t, apply, (op,), [((4,), d), (None, d)])


def _casts(t: _Tensors, dtypes: Sequence[dt.dtype]) -> Iterator[Thunk]:
    for a in dtypes:
        for b in dtypes:
            if a is not b:
                yield functools.partial(copy_into, t.cuda((4,), a), t.cuda((4,), b))


def _strided_copies(t: _Tensors, dtypes: Sequence[dt.dtype]) -> Iterator[Thunk]:
    for d in dtypes:
        # rows of a wider tensor (a slice), then a transpose (tiled through shared memory)
        yield functools.partial(copy_into, t.cuda((4, 8), d), t.cuda((4, 8), d, (16, 1)))
        yield functools.partial(copy_into, t.cuda((32, 32), d), t.cuda((32, 32), d, (1, 32)))


def _fill(t: _Tensors, dtypes: Sequence[dt.dtype]) -> Iterator[Thunk]:
    for d in dtypes:
        yield functools.partial(t.cuda((4,), d).fill_, 1)


def _arange(t: _Tensors, dtypes: Sequence[dt.dtype]) -> Iterator[Thunk]:
    for d in dtypes:
        kind, expr, scalars = arange_kernel_args(0, 1, d)
        # as tensorplay._tensor.creation.arange launches it
        yield functools.partial(launch_elementwise, ("arange", kind), expr, t.cuda((8,), d), (), (), scalars,
                                (kind,) * len(scalars))


def _uploads(t: _Tensors, dtypes: Sequence[dt.dtype]) -> Iterator[Thunk]:
    for capacity in param_upload.PARAM_UPLOAD_CAPACITIES:
        yield functools.partial(param_upload.param_write_function, capacity, COLLECT_DEVICE)


def _random(*ops: str) -> Callable[[_Tensors, Sequence[dt.dtype]], Iterator[Thunk]]:
    def kernels(t: _Tensors, dtypes: Sequence[dt.dtype]) -> Iterator[Thunk]:
        for op, d, variant in random_kernels.kernel_variants():
            if op not in ops or d not in dtypes or (isinstance(variant, dt.dtype) and variant not in dtypes):
                continue
            inp = None
            if op == "dropout":
                inp = t.cuda((8,), d)
            elif op == "bernoulli_tensor":
                inp = t.cuda((8,), variant)
            yield functools.partial(random_kernels.launch, op, t.cuda((8,), d), 0, (), inp, variant)
    return kernels


def _generator(t: _Tensors, dtypes: Sequence[dt.dtype]) -> Iterator[Thunk]:
    yield functools.partial(random_kernels.set_state_function, COLLECT_DEVICE)


# The variants a reduction can pick by size: (in_is_acc, final, warps) of a
# row reduction, (in_is_acc, final) of a column one. A split row or column
# is reduced in a second pass over the accumulator type (in_is_acc).
ROW_VARIANTS = ((False, True, 1), (False, True, ROW_WARPS), (False, False, ROW_WARPS), (True, True, 1),
                (True, True, ROW_WARPS))
COLUMN_VARIANTS = ((False, True), (False, False), (True, True), (True, False))


def _reduction(*ops: str, scaled: bool = False) -> Callable[[_Tensors, Sequence[dt.dtype]], Iterator[Thunk]]:
    def kernels(t: _Tensors, dtypes: Sequence[dt.dtype]) -> Iterator[Thunk]:
        for op in ops:
            for d in dtypes:
                try:                            # the result dtype, as the op gives it
                    out = (mean if scaled else functools.partial(reduce, op))(t.cpu((2, 3), d), -1).dtype
                except TypeError:
                    continue
                for in_is_acc, final, warps in ROW_VARIANTS:
                    yield functools.partial(reduce_function, op, "row", d, in_is_acc, out, final, scaled,
                                            COLLECT_DEVICE, warps)
                for in_is_acc, final in COLUMN_VARIANTS:
                    yield functools.partial(reduce_function, op, "column", d, in_is_acc, out, final, scaled,
                                            COLLECT_DEVICE, 0)
    return kernels


def _graph_kernel(fn: Callable[..., Any], *args: Any) -> Callable[[_Tensors, Sequence[dt.dtype]], Iterator[Thunk]]:
    def kernels(t: _Tensors, dtypes: Sequence[dt.dtype]) -> Iterator[Thunk]:
        yield functools.partial(fn, *args, COLLECT_DEVICE)
    return kernels


def _switch(t: _Tensors, dtypes: Sequence[dt.dtype]) -> Iterator[Thunk]:
    for d in dtypes:
        if d.name in graph_kernels.SWITCH_INDEX_TYPES:
            yield functools.partial(graph_kernels.set_switch_function, d.name, COLLECT_DEVICE)


def _stage(t: _Tensors, dtypes: Sequence[dt.dtype]) -> Iterator[Thunk]:
    for capacity in COPY_CAPACITIES:
        yield functools.partial(graph_kernels.multi_copy_function, capacity, COLLECT_DEVICE)


class Entry(NamedTuple):
    """One name precompile takes: its group, whether ``ops=None`` includes it,
    what yields its kernel requests, and the dtypes it adds to the default ones."""
    group: str
    default: bool
    kernels: Callable[[_Tensors, Sequence[dt.dtype]], Iterator[Thunk]]
    extra: tuple = ()


_DEFAULT_ELEMENTWISE = {"add", "sub", "mul", "div", "pow", "maximum", "minimum", "eq", "ne", "lt", "le", "gt", "ge",
                        "neg", "abs", "exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid", "relu", "sin", "cos",
                        "logical_not", "bitwise_not", "bitwise_and", "bitwise_or"}
_BOOL_OPS = {"logical_and", "logical_or", "logical_xor", "logical_not", "bitwise_and", "bitwise_or",
             "bitwise_xor", "bitwise_not"}


def _elementwise_entries() -> dict[str, Entry]:
    out = {}
    for op, (rule, gen, _) in OPS.items():
        unary = gen.__code__.co_argcount == 2            # (ctype, x): one operand
        out[op] = Entry("elementwise", op in _DEFAULT_ELEMENTWISE, _unary(op) if unary else _binary(op),
                        (dt.bool_,) if op in _BOOL_OPS else ())
    return out


CATALOG: dict[str, Entry] = {
    **_elementwise_entries(),
    "where": Entry("elementwise", True, _where),
    "clamp": Entry("elementwise", False, _clamp),
    "sum": Entry("reduce", True, _reduction("sum"), (dt.int64, dt.bool_)),
    "mean": Entry("reduce", True, _reduction("sum", scaled=True)),
    "amax": Entry("reduce", True, _reduction("amax")),
    "amin": Entry("reduce", False, _reduction("amin")),
    "argmax": Entry("reduce", True, _reduction("argmax")),
    "argmin": Entry("reduce", False, _reduction("argmin")),
    "max": Entry("reduce", False, _reduction("amax", "argmax")),
    "min": Entry("reduce", False, _reduction("amin", "argmin")),
    "prod": Entry("reduce", False, _reduction("prod")),
    "all": Entry("reduce", False, _reduction("all"), (dt.bool_,)),
    "any": Entry("reduce", False, _reduction("any"), (dt.bool_,)),
    "to": Entry("copy", True, _casts, INDEX),
    "contiguous": Entry("copy", True, _strided_copies),
    "upload": Entry("copy", True, _uploads),
    "fill": Entry("creation", True, _fill, INDEX),
    "arange": Entry("creation", True, _arange, (dt.int64,)),
    "rand": Entry("random", True, _random("uniform")),
    "randn": Entry("random", True, _random("normal")),
    "dropout": Entry("random", True, _random("dropout")),
    "manual_seed": Entry("random", True, _generator),
    "bernoulli": Entry("random", False, _random("bernoulli", "bernoulli_tensor")),
    "exponential": Entry("random", False, _random("exponential")),
    "randint": Entry("random", False, _random("random"), (dt.int64,)),
    "conditional": Entry("graph", True, _graph_kernel(graph_kernels.set_conditional_function)),
    "switch": Entry("graph", True, _switch, (dt.int32, dt.int64)),
    "stage_and_launch": Entry("graph", True, _stage),
}

GROUPS = tuple(dict.fromkeys(e.group for e in CATALOG.values()))


def _names(ops: str | Iterable[str] | None) -> list[str]:
    """The catalog entries ``ops`` names (op and group names), in catalog order."""
    if ops is None:
        return [name for name, e in CATALOG.items() if e.default]
    wanted = [ops] if isinstance(ops, str) else list(ops)
    unknown = [o for o in wanted if not isinstance(o, str) or (o not in CATALOG and o not in GROUPS)]
    if unknown:
        raise ValueError(f"precompile: unknown op {', '.join(map(repr, unknown))}; known ops: "
                         f"{', '.join(CATALOG)}; groups: {', '.join(GROUPS)}")
    return [name for name, e in CATALOG.items() if name in wanted or e.group in wanted]


def _dtypes(dtypes: Iterable[Any] | None) -> list[dt.dtype] | None:
    """The dtypes given (checked), or None."""
    return None if dtypes is None else list(dict.fromkeys(dt.as_dtype(d) for d in dtypes))


def catalog_kernels(ops: str | Iterable[str] | None = None,
                    dtypes: Iterable[Any] | None = None) -> list[KernelSpec]:
    """The distinct kernels of ``ops`` for ``dtypes`` (as :func:`precompile` takes them), in catalog order."""
    names = _names(ops)
    given = _dtypes(dtypes)
    t = _Tensors()
    specs: dict[KernelSpec, None] = {}
    for name in names:
        entry = CATALOG[name]
        ds = given if given is not None else list(dict.fromkeys(DEFAULT_DTYPES + entry.extra))
        for thunk in entry.kernels(t, ds):
            spec = collect_kernel(thunk)
            if spec is not None:
                specs[spec] = None
    return list(specs)


def precompile(ops: str | Iterable[str] | None = None, dtypes: Iterable[Any] | None = None,
               arch: int | str | Iterable[int | str] | None = None, progress: bool | None = None,
               workers: int | None = None) -> dict[str, Any]:
    """Compile the kernels of common ops ahead of their first use.

    Each op compiles its CUDA kernel for a dtype on first use (NVRTC, tens of
    milliseconds each) and keeps it in the on-disk kernel cache
    (:func:`kernel_cache_dir`), so a model's first step can spend seconds
    compiling. This compiles them beforehand, in parallel threads, into the
    same cache: run it once per machine (or in a container build, with the
    GPU named by ``arch``), and later processes load the kernels instead.
    NVRTC needs no GPU.

    Only the kernels that can be known ahead are compiled: contiguous
    operands (one flat kernel), a row broadcast over rows (a bias), 0-d
    tensors and Python numbers; copies of slices and 2-D transposes. An op
    over other layouts (a broadcast or permutation over more dimensions
    that do not merge) compiles a kernel of its shape's rank on first use,
    as do custom kernels (:class:`ElementwiseKernel`, :class:`RawKernel`),
    sorting, indexing and sampling kernels.

    Parameters
    ----------
    ops : str, sequence of str or None, optional
        Op names, or group names (``"elementwise"``, ``"reduce"``,
        ``"copy"``, ``"creation"``, ``"random"``, ``"graph"``: every op of
        the group). None (the default) is the set a model typically
        uses: ``add sub mul div pow maximum minimum eq ne lt le gt ge neg
        abs exp log sqrt rsqrt tanh sigmoid relu sin cos logical_not
        bitwise_not bitwise_and bitwise_or where`` (elementwise), ``sum mean
        amax argmax`` (each in every variant a size can pick), ``to``
        (casts between the dtypes), ``contiguous`` (strided copies),
        ``upload`` (small host-to-GPU copies), ``fill`` (``ones``, ``full``,
        ``fill_``), ``arange``, ``rand randn dropout manual_seed`` and the
        graph layer's ``conditional switch stage_and_launch``.
    dtypes : sequence of dtype or str, or None, optional
        The dtypes to compile for (ops skip those they refuse). None (the
        default): float32, float16 and bfloat16, plus what some ops need:
        int64, int32 and bool for casts and ``fill``, int64 and bool for
        ``sum``, bool for the logical and bitwise ops, int64 for
        ``arange``, int32 and int64 for ``switch``.
    arch : int, str, sequence of int or str, or None, optional
        Compute capabilities to compile for: an int (90 for 9.0), a string
        ``"sm_90"`` or ``"90"``, or a list of them, each one this NVRTC
        compiles for (13.x: 75, 80, 86, 87, 88, 89, 90, 100, 103, 110, 120
        and more; the error lists them). None (the default): each visible
        GPU's; without a GPU it must be given.
    progress : bool or None, optional
        None (the default): a tqdm bar on stderr when tqdm is installed
        and stderr is a terminal, else a line at INFO on the
        ``tensorplay.nvrtc`` logger every tenth of the kernels and one at
        the end (shown once logging is configured, e.g.
        ``logging.basicConfig(level=logging.INFO)``). True: the bar even
        when stderr is not a terminal. False: nothing.
    workers : int or None, optional
        Kernels compiling at once, in threads; None: one per CPU core, at
        most 8.

    Returns
    -------
    dict
        ``kernels`` (distinct kernels times architectures), ``compiled``
        (now), ``cached`` (found compiled already), ``seconds``, ``archs``
        and the cache ``path``. A second call with the same arguments
        compiles nothing.

    Raises
    ------
    ValueError
        If an op name is unknown (the message lists the known ones), or
        NVRTC cannot compile for ``arch`` (the message lists what it can).
    TypeError
        If ``arch`` is not an int, a string or a list of them (a float,
        say).
    CudaUnavailableError
        If ``arch`` is None and there is no GPU.
    NVRTCError
        If a kernel fails to compile.

    See Also
    --------
    compile_progress : show the compilations of ordinary work.
    kernel_cache_info, clear_kernel_cache

    Examples
    --------
    >>> tp.cuda.precompile(arch=90)                    # doctest: +SKIP
    {'kernels': 402, 'compiled': 402, 'cached': 0, 'seconds': 40.8, 'archs': [90], 'path': '...'}
    >>> tp.cuda.precompile(arch=90)["cached"]          # doctest: +SKIP
    402
    """
    start = time.perf_counter()
    _names(ops), _dtypes(dtypes), check_workers(workers)        # every argument checked first: cheap
    check_progress(progress)
    archs = resolve_archs(arch)
    specs = catalog_kernels(ops, dtypes)
    return compile_kernels(specs, archs, workers, progress, start=start)
