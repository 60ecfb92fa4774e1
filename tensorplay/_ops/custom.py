# SPDX-License-Identifier: Apache-2.0
"""User kernels: RawKernel (CUDA C source, launched as written) and
ElementwiseKernel (CuPy-style: typed parameters and one operation, broadcast
over tensors). Both compile once per device through the NVRTC cache and run
on the current stream, so they can be captured in graphs."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, overload

import numbers
import re
import struct

import numpy as np

from tensorplay import _dtypes as dt
from tensorplay._driver.stream import stream_of, current_stream_handle_of
from tensorplay._tensor.args import broadcast_shape, broadcast_strides, resolve_device
from tensorplay._tensor.creation import empty
from tensorplay._tensor.tensor import Tensor, as_source
from tensorplay._driver.context import current_device
from tensorplay._kernels import cache as _kernels
from tensorplay._kernels import codegen as _codegen
from tensorplay._kernels import nvrtc as _nvrtc

if TYPE_CHECKING:
    from tensorplay._driver.launch import Function
    from tensorplay.types import DeviceLike, DTypeLike, StreamLike

__all__ = ["RawKernel", "ElementwiseKernel"]

# C parameter type -> struct format (natural alignment = size)
_C_TYPES = {
    "bool": "?", "char": "b", "signed char": "b", "int8_t": "b", "unsigned char": "B", "uint8_t": "B",
    "short": "h", "int16_t": "h", "unsigned short": "H", "uint16_t": "H", "__half": "H", "half": "H",
    "__nv_bfloat16": "H", "int": "i", "int32_t": "i", "unsigned int": "I", "unsigned": "I",
    "uint32_t": "I", "long": "q", "long int": "q", "long long": "q", "long long int": "q",
    "int64_t": "q", "ptrdiff_t": "q", "unsigned long": "Q", "unsigned long long": "Q",
    "uint64_t": "Q", "size_t": "Q", "float": "f", "double": "d",
}
# struct format -> the C type named in messages
_C_NAMES = {"?": "bool", "b": "signed char", "B": "unsigned char", "h": "short", "H": "unsigned short",
            "i": "int", "I": "unsigned int", "q": "long long", "Q": "unsigned long long", "f": "float",
            "d": "double"}
_QUALIFIERS = re.compile(r"\b(const|volatile|__restrict__|__restrict|restrict|struct)\b")


def parse_signature(source, name):
    """Struct format codes of kernel ``name``'s parameters ('P' for pointers),
    or None when the signature can't be read (templates, macros)."""
    m = re.search(r"__global__\s+void\s+(?:__launch_bounds__\s*\([^)]*\)\s*)?" + re.escape(name) +
                  r"\s*\(([^)]*)\)", source)
    if m is None:
        return None
    text = m.group(1).strip()
    if not text or text == "void":
        return []
    codes = []
    for p in text.split(","):
        p = _QUALIFIERS.sub(" ", p).strip()
        if "*" in p or "&" in p:
            codes.append("P")
            continue
        words = p.split()
        base = " ".join(words[:-1]) if len(words) > 1 else None
        if base not in _C_TYPES:
            return None
        codes.append(_C_TYPES[base])
    return codes


def _pack(codes, args, device):
    fmt_chars, values = [], []
    for k, a in enumerate(args):
        code = codes[k] if codes is not None else _guess_code(a)
        if code == "P":
            values.append(_pointer(a, device, k))
            fmt_chars.append("Q")
        else:
            if isinstance(a, Tensor):
                raise TypeError(f"argument {k}: the kernel takes a scalar here, got a tensor")
            if isinstance(a, np.generic):
                a = a.item()
            if not isinstance(a, (numbers.Number, np.bool_)):
                raise TypeError(f"argument {k}: expected a number, got {type(a).__name__}")
            values.append(float(a) if code in "fd" else (bool(a) if code == "?" else int(a)))
            fmt_chars.append(code)
    buf = b""
    for k, (c, v) in enumerate(zip(fmt_chars, values)):
        size = struct.calcsize(c)
        buf += b"\0" * (-len(buf) % size)       # natural alignment, as the C ABI lays it out
        try:
            buf += struct.pack("<" + c, v)
        except (struct.error, OverflowError):
            raise OverflowError(f"argument {k}: {v!r} does not fit the kernel's {_C_NAMES[c]} "
                                f"parameter") from None
    return buf


def _guess_code(a):
    if isinstance(a, Tensor) or hasattr(a, "__cuda_array_interface__"):
        return "P"
    if isinstance(a, (bool, np.bool_)):
        return "?"
    if isinstance(a, np.generic):
        return a.dtype.char if a.dtype.char in "bBhHiIqQfd" else "q"
    if isinstance(a, numbers.Integral):
        return "q"
    if isinstance(a, numbers.Real):
        return "d"
    raise TypeError(f"unsupported kernel argument of type {type(a).__name__}")


def _pointer(a, device, k):
    if isinstance(a, Tensor):
        if not a.is_cuda:
            raise TypeError(f"argument {k}: a CPU tensor cannot be passed to a CUDA kernel")
        if a._device_index != device:
            raise ValueError(f"argument {k}: tensor on {a.device}, kernel launched on cuda:{device}")
        return a.data_ptr()
    cai = getattr(a, "__cuda_array_interface__", None)
    if cai is not None:
        return int(cai["data"][0])
    if isinstance(a, int) and not isinstance(a, bool):
        return a                                  # a raw device address
    raise TypeError(f"argument {k}: expected a CUDA tensor for a pointer parameter, got {type(a).__name__}")


def _arch_of(arch: int | tuple[int, int] | None, device: DeviceLike) -> int | None:
    """The compute capability ``arch`` names, as an int (90 for 90 or (9, 0));
    None when none is given (compile for ``device``)."""
    if arch is None:
        return None
    if device is not None:
        raise TypeError("compile: give a device (compile and load there) or an arch (compile only), not both")
    bad = f"arch must be a compute capability such as 90 or (9, 0), got {arch!r}"
    if isinstance(arch, tuple):
        if len(arch) != 2 or not all(isinstance(v, int) and not isinstance(v, bool) for v in arch) \
                or not 0 <= arch[1] < 10:
            raise ValueError(bad)
        arch = arch[0] * 10 + arch[1]
    elif isinstance(arch, bool) or not isinstance(arch, numbers.Integral):
        raise TypeError(bad)
    if not 10 <= arch < 1000:
        raise ValueError(bad)
    return int(arch)


class RawKernel:
    """A kernel written in CUDA C, compiled once per device (NVRTC, cached).

    Call it as ``kernel(grid, block, args, shared_mem=0, stream=None)``.
    Tensors in ``args`` pass their device address; numbers are typed by the
    declared signature (or by their own type when it cannot be read).
    Constructing one compiles nothing; :meth:`compile` does, with
    ``arch=`` also without a GPU.

    Parameters
    ----------
    source : str
        CUDA C source; the kernel must have C linkage (declared extern "C").
    name : str
        The kernel's name.
    options : sequence of str
        Extra NVRTC options.
    pdl : bool, optional
        The kernel takes part in programmatic dependent launch: every block
        calls ``cudaGridDependencySynchronize()`` (or runs
        ``griddepcontrol.wait``) before it touches memory that kernels
        before it write or read, on every path, early returns included.
        It then launches with programmatic stream serialization on sm_90 and
        newer (while :data:`tensorplay.backends.cuda.pdl` is enabled), so it
        may start while the kernel before it drains, eagerly and in captured
        graphs. Default False: a plain launch, fully ordered after what came
        before. A kernel declared so that does not wait reads stale data.
    """

    def __init__(self, source: str, name: str, options: Sequence[str] = (), *, pdl: bool = False) -> None:
        if not isinstance(source, str) or not isinstance(name, str):
            raise TypeError("RawKernel(source: str, name: str, options=())")
        if isinstance(options, str):
            raise TypeError("options must be a sequence of strings, not a string")
        if not isinstance(pdl, bool):
            raise TypeError(f"pdl must be a bool, got {type(pdl).__name__}")
        self.source = source
        self.name = name
        self.options = tuple(str(o) for o in options)
        self.pdl = pdl
        self._codes = parse_signature(source, name)
        self._functions: dict[int, Any] = {}

    def _function(self, device):
        f = self._functions.get(device)
        if f is None:
            f = self._functions[device] = _kernels.load_function(self.source, self.name, device, self.options,
                                                                 pdl=self.pdl)
        return f

    @overload
    def compile(self, device: DeviceLike = None, *, arch: None = None) -> Function: ...
    @overload
    def compile(self, device: None = None, *, arch: int | tuple[int, int]) -> bytes: ...

    def compile(self, device: DeviceLike = None, *, arch: int | tuple[int, int] | None = None) -> Function | bytes:
        """Compile the kernel now (NVRTC, cached): for a device and load it there, or for ``arch`` alone.

        Without ``arch``: compile for ``device``'s compute capability
        (default the current CUDA device) and load it there
        (cuModuleLoadData), which the first call does otherwise, as CuPy's
        ``RawKernel.compile``. With ``arch``, a compute capability such as
        ``90`` or ``(9, 0)``: compile for it and return the image, touching
        no GPU (NVRTC needs none). That checks on a machine without a GPU,
        on CI say, that the source compiles, and fills the kernel cache
        ahead of time: it is keyed by the source, the options, the
        architecture and the NVRTC version, so a later call on such a
        device compiles nothing.

        Parameters
        ----------
        device : device, str, int or None, optional
            The device to compile for and load on; not with ``arch``.
        arch : int or tuple of int, optional
            The compute capability to compile for, without loading.

        Returns
        -------
        Function or bytes
            The loaded function; with ``arch``, the CUBIN (PTX when ``arch``
            is newer than this NVRTC knows).

        Raises
        ------
        NVRTCError
            If the source does not compile; its ``log`` holds NVRTC's messages.
        CudaUnavailableError
            Without ``arch``, when CUDA is not available.
        """
        target = _arch_of(arch, device)
        if target is not None:
            return _nvrtc.compile_cubin(self.source, self.name + ".cu", self.options, target)
        return self._function(resolve_device("cuda" if device is None else device))

    def __call__(self, grid: int | tuple[int, ...], block: int | tuple[int, ...], args: Sequence[Any],
                 shared_mem: int = 0, stream: StreamLike | None = None) -> None:
        """Launch the kernel on ``grid`` x ``block`` threads, cuLaunchKernel.

        Parameters
        ----------
        grid, block : int or tuple of int
            The grid and block dimensions (up to three each).
        args : sequence
            One value per kernel parameter: CUDA tensors for pointers (their
            device address), numbers for scalars.
        shared_mem : int, optional
            Dynamic shared memory in bytes (above 48 KiB the kernel's limit
            is raised first).
        stream : Stream or stream-like, optional
            Default the current stream of the tensors' device.
        """
        if not isinstance(args, (tuple, list)):
            raise TypeError(f"args must be a tuple or list, got {type(args).__name__}")
        if self._codes is not None and len(args) != len(self._codes):
            raise TypeError(f"{self.name} takes {len(self._codes)} arguments, {len(args)} given")
        devices = {a._device_index for a in args if isinstance(a, Tensor) and a.is_cuda}
        if len(devices) > 1:
            names = " and ".join(f"cuda:{i}" for i in sorted(devices))
            raise ValueError(f"{self.name}: tensors on {names}; one launch runs on one device")
        device = devices.pop() if devices else current_device()
        if stream is not None:
            s = stream_of(stream)
            if s.device_index != device:
                raise ValueError(f"{self.name}: stream is on cuda:{s.device_index}, arguments on cuda:{device}")
            handle = s.handle
        else:
            handle = current_stream_handle_of(device)
        f = self._function(device)
        params = _pack(self._codes, args, device)
        if shared_mem > 48 * 1024:
            f.set_max_dynamic_shared_memory(shared_mem)
        f.launch(grid, block, params, shared_mem, handle)

    @property
    def attributes(self) -> dict[str, int]:
        """The compiled kernel's attributes on the current device, cuFuncGetAttribute.

        ``num_regs``, ``max_threads_per_block``, ``shared_size_bytes`` and
        ``local_size_bytes``; reading them compiles and loads the kernel.
        """
        f = self._function(current_device())
        return {k: f.attribute(k) for k in ("num_regs", "max_threads_per_block", "shared_size_bytes",
                                            "local_size_bytes")}


_PARAM = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s+([A-Za-z_][A-Za-z0-9_]*)\s*$")


def _parse_params(text, what):
    out = []
    if not text.strip():
        return out
    for part in text.split(","):
        m = _PARAM.match(part)
        if m is None:
            raise ValueError(f"bad {what} parameter {part.strip()!r}; expected 'dtype name' such as 'float32 x'")
        typ, var = m.groups()
        if var in {v for _, v in out}:
            raise ValueError(f"parameter name {var!r} used twice")
        out.append((typ, var))
    return out


def _is_placeholder(typ):
    return typ not in dt.BY_NAME


def _resolve_type(typ, var, bound, unbound):
    """The dtype of parameter ``var`` declared ``typ``: named, or bound to the
    placeholder; TypeError ``unbound`` (formatted with ``typ`` and ``var``) if not."""
    if not _is_placeholder(typ):
        return dt.as_dtype(typ)
    if typ not in bound:
        raise TypeError(unbound.format(typ=typ, var=var))
    return bound[typ]


def _one_cuda_device(name, named):
    """The CUDA device index of the tensors among ``named`` ((parameter,
    value) pairs); ValueError naming a CPU tensor, or tensors on several
    devices."""
    devices = {}
    for var, a in named:
        if isinstance(a, Tensor):
            if a.is_cpu:
                raise ValueError(f"{name}: {var} is on the CPU; custom kernels run on CUDA tensors "
                                 f"(move it with .cuda() or .to('cuda'))")
            devices.setdefault(a._device_index, var)
    if len(devices) > 1:
        where = ", ".join(f"{var} on cuda:{i}" for i, var in sorted(devices.items()))
        raise ValueError(f"{name}: the tensors must be on one CUDA device, got {where}")
    return next(iter(devices))


class ElementwiseKernel:
    """An elementwise kernel in the spirit of CuPy's.

    ``ElementwiseKernel('float32 x, float32 y', 'float32 z', 'z = x * y + 1', 'fma1')``
    makes a callable ``k(x, y)`` returning z; inputs broadcast, outputs are
    allocated (or passed after the inputs, or as keyword arguments). Types are
    dtype names or placeholders (e.g. ``T``) bound by the arguments' dtypes;
    half types compute as float. Numbers passed for inputs become kernel
    arguments; ``i`` is the element's linear index.
    """

    def __init__(self, in_params: str, out_params: str, operation: str, name: str = "elementwise_kernel",
                 preamble: str = "") -> None:
        self.in_params = _parse_params(in_params, "input")
        self.out_params = _parse_params(out_params, "output")
        if not self.out_params:
            raise ValueError("an ElementwiseKernel needs at least one output")
        names = [v for _, v in self.in_params + self.out_params]
        if len(set(names)) != len(names):
            raise ValueError("input and output parameter names must differ")
        if not isinstance(operation, str) or not operation.strip():
            raise ValueError("operation must be a non-empty string of CUDA C")
        if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", name):
            raise ValueError(f"kernel name {name!r} is not a C identifier")
        self.operation = operation
        self.name = name
        self.preamble = preamble

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Run the operation over the broadcast inputs and return the output(s).

        Pass the inputs positionally, then optionally the outputs (or give
        outputs by name); missing outputs are allocated. One output is
        returned as a tensor, several as a tuple. Launches one generated
        kernel on the current stream (cuLaunchKernel).
        """
        n_in, n_out = len(self.in_params), len(self.out_params)
        if len(args) not in (n_in, n_in + n_out):
            raise TypeError(f"{self.name} takes {n_in} inputs (and optionally {n_out} outputs), got {len(args)}")
        outs = list(args[n_in:]) or [kwargs.pop(v, None) for _, v in self.out_params]
        if kwargs:
            raise TypeError(f"unexpected keyword arguments {sorted(kwargs)}")
        ins: list[Any] = [a if isinstance(a, (Tensor, numbers.Number, np.generic)) else as_source(a) for a in args[:n_in]]
        bound: dict[str, dt.dtype] = {}

        def bind(typ, d, what):
            if not _is_placeholder(typ):
                return
            if typ in bound and bound[typ] is not d:
                raise TypeError(f"{self.name}: type {typ} bound to {bound[typ].name} and {d.name} ({what})")
            bound[typ] = d
        for (typ, var), a in zip(self.in_params, ins):
            if isinstance(a, Tensor):
                if not _is_placeholder(typ) and a.dtype is not dt.as_dtype(typ):
                    raise TypeError(f"{self.name}: input {var} must be {typ}, got {a.dtype.name}")
                bind(typ, a.dtype, var)
        for (typ, var), o in zip(self.out_params, outs):
            if o is not None:
                if not isinstance(o, Tensor):
                    raise TypeError(f"output {var} must be a Tensor")
                bind(typ, o.dtype, var)

        def resolve(typ, var):
            return _resolve_type(typ, var, bound, self.name + ": cannot infer type {typ} of {var} from the arguments")
        tensors = [a for a in ins if isinstance(a, Tensor)] + [o for o in outs if o is not None]
        if not tensors:
            raise TypeError(f"{self.name} needs at least one tensor argument")
        shape = ()
        for a in ins:
            if isinstance(a, Tensor):
                shape = broadcast_shape(shape, a.shape)
        dev = _one_cuda_device(self.name, list(zip([v for _, v in self.in_params], ins)) +
                               list(zip([v for _, v in self.out_params], outs)))
        for k, ((typ, var), o) in enumerate(zip(self.out_params, outs)):
            if o is None:
                outs[k] = empty(shape, dtype=resolve(typ, var), device=f"cuda:{dev}")
            elif o.shape != shape and shape != ():
                raise ValueError(f"{self.name}: output {var} has shape {o.shape}, expected {shape}")
        shape = outs[0].shape if shape == () else shape
        arrays, strides, ptrs, scalars, svals, kinds = [], [], [], [], [], []
        for (typ, var), a in zip(self.in_params, ins):
            d = resolve(typ, var)
            if isinstance(a, Tensor):
                arrays.append((var, d, False))
                strides.append(broadcast_strides(a, shape))
                ptrs.append(a.data_ptr())
            else:
                scalars.append((var, d))
                kinds.append("f" if d.kind == "f" else "i")
                svals.append(float(a) if d.kind == "f" else int(a))
        for (typ, var), o in zip(self.out_params, outs):
            arrays.append((var, o.dtype, True))
            strides.append(o.strides)
            ptrs.append(o.data_ptr())
        n = 1
        for s in shape:
            n *= s
        if n:
            cshape, cstrides, ndim = _kernels.geometry(shape, strides)
            typedefs = dict(bound)
            key = self._variant_key(arrays, scalars, typedefs, ndim)
            pkey = _kernels.launch_plan_key(key, dev, cshape, cstrides)
            plan = _kernels.plans.get(pkey)
            if plan is None:
                f = _kernels.cached_function(key, dev, lambda: self._variant_source(arrays, scalars, typedefs, ndim))
                plan = _kernels.plans.put(pkey, _kernels.LaunchPlan(
                    f, dev, n, len(ptrs), kinds, cshape if ndim else (), cstrides if ndim else ()))
            plan.launch(ptrs, svals)
        return outs[0] if len(outs) == 1 else tuple(outs)

    @overload
    def compile(self, device: DeviceLike = None, *, arch: None = None,
                types: Mapping[str, DTypeLike] | None = None) -> Function: ...
    @overload
    def compile(self, device: None = None, *, arch: int | tuple[int, int],
                types: Mapping[str, DTypeLike] | None = None) -> bytes: ...

    def compile(self, device: DeviceLike = None, *, arch: int | tuple[int, int] | None = None,
                types: Mapping[str, DTypeLike] | None = None) -> Function | bytes:
        """Compile the kernel for contiguous tensors now (NVRTC, cached): for a device, or for ``arch`` alone.

        What is compiled is the kernel a call runs when every input is a
        contiguous tensor (the common case; a call passing a number for an
        input, or strided or broadcast tensors, compiles its own variant at
        its first use). Without ``arch``: for ``device``'s compute
        capability (default the current CUDA device), loaded there, so the
        first such call compiles nothing. With ``arch``, a compute
        capability such as ``90`` or ``(9, 0)``: the image, touching no GPU,
        as :meth:`RawKernel.compile`; on a machine without a GPU that checks
        that the operation compiles.

        Parameters
        ----------
        device : device, str, int or None, optional
            The device to compile for and load on; not with ``arch``.
        arch : int or tuple of int, optional
            The compute capability to compile for, without loading.
        types : mapping of str to dtype, optional
            The dtype of each placeholder type, ``{"T": tensorplay.float32}``:
            needed when the parameters use placeholders.

        Returns
        -------
        Function or bytes
            The loaded function; with ``arch``, the CUBIN.

        Raises
        ------
        NVRTCError
            If the operation does not compile; its ``log`` holds NVRTC's messages.
        TypeError
            For a placeholder without a dtype in ``types``, or a key of
            ``types`` that is no placeholder of this kernel.
        CudaUnavailableError
            Without ``arch``, when CUDA is not available.
        """
        target = _arch_of(arch, device)
        params = self.in_params + self.out_params
        placeholders = {typ for typ, _ in params if _is_placeholder(typ)}
        bound: dict[str, dt.dtype] = {}
        for typ, d in (types or {}).items():
            if typ not in placeholders:
                raise TypeError(f"{self.name}.compile: {typ!r} is not a placeholder type of this kernel "
                                f"(its placeholders: {sorted(placeholders) or 'none'})")
            bound[typ] = dt.as_dtype(d)
        unbound = self.name + ".compile: placeholder {typ} (of {var}) needs a dtype: pass types={{'{typ}': ...}}"
        arrays = [(var, _resolve_type(typ, var, bound, unbound), k >= len(self.in_params))
                  for k, (typ, var) in enumerate(params)]
        if target is not None:
            source, name = self._variant_source(arrays, [], bound, 0)
            return _nvrtc.compile_cubin(source, name + ".cu", (), target)
        dev = resolve_device("cuda" if device is None else device)
        return _kernels.cached_function(self._variant_key(arrays, [], bound, 0), dev,
                                        lambda: self._variant_source(arrays, [], bound, 0))

    def _variant_key(self, arrays, scalars, typedefs, ndim):
        """What names one compiled variant: the operation, each operand's
        name, dtype and role, the placeholders' dtypes and the indexing
        (``ndim``, 0 for contiguous operands)."""
        return ("custom", self.name, self.operation, self.preamble,
                tuple((v, d.code, o) for v, d, o in arrays), tuple((v, d.code) for v, d in scalars),
                tuple(sorted((k, v.code) for k, v in typedefs.items())), ndim)

    def _variant_source(self, arrays, scalars, typedefs, ndim):
        """(CUDA C, kernel name) of one variant."""
        name = f"{self.name}_{ndim}d"
        return _codegen.custom_elementwise_source(name, arrays, scalars, typedefs, self.operation, ndim,
                                                  self.preamble), name
