# SPDX-License-Identifier: Apache-2.0
"""Advanced indexing: one integer-tensor or boolean-mask index (with any basic
indices beside it), for reading (a copy) and writing; ``gather`` along a
dimension, and ``masked_fill``.

Indices known on the host are bounds-checked at once (IndexError). Indices in
device memory are checked by the kernel: an out-of-range index is never
dereferenced; it raises a device-side error flag that the next synchronizing
call (item, tolist, numpy, bool, synchronize) turns into an IndexError.
"""

from __future__ import annotations

import numbers
import struct

import numpy as np

from tensorplay import _dtypes as dt
from tensorplay._tensor.args import broadcast_shape, cast_into, check_value, normalize_dim
from tensorplay._tensor.creation import empty, tensor
from tensorplay._tensor.tensor import Tensor, as_source, copy_into, empty_cuda, host_to_cuda, is_literal
from tensorplay._driver.memcpy import memcpy_dtoh, memset_d8_async, refuse_in_capture
from tensorplay._driver.stream import current_stream_handle_of
from tensorplay._kernels import cache as _kernels
from tensorplay._ops.elementwise import where
from tensorplay._ops.views import getitem as basic_getitem

_flags: dict = {}          # device -> int32 error flag in device memory
_pending: set = set()      # devices with checked kernels launched since the last look


def _flag(dev):
    f = _flags.get(dev)
    if f is None:
        f = _flags[dev] = empty_cuda((1,), dt.int32, dev)
        memset_d8_async(f.data_ptr(), 0, 4, dev, current_stream_handle_of(dev))
    return f


def check_device_errors(dev):
    """Raise IndexError if a kernel saw an out-of-range device index (and reset it).

    Run at every synchronizing host read of device ``dev`` (tensorplay/__init__.py
    registers it with tensorplay._tensor.transfer)."""
    if dev not in _pending:
        return
    _pending.discard(dev)
    f = _flags[dev]
    host = np.zeros(1, np.int32)
    s = current_stream_handle_of(dev)
    memcpy_dtoh(host.ctypes.data, f.data_ptr(), 4, dev, s)
    if host[0]:
        memset_d8_async(f.data_ptr(), 0, 4, dev, s)
        raise IndexError("an index tensor held an out-of-range index (reported by a CUDA kernel; "
                         "nothing was read or written out of bounds)")


def is_advanced(ix):
    """Whether one index entry is advanced: a tensor, list, array or CUDA array."""
    return isinstance(ix, (Tensor, list, np.ndarray)) or (
        isinstance(ix, tuple) is False and hasattr(ix, "__cuda_array_interface__"))


def has_advanced(index):
    """Whether ``index`` (an entry or a tuple of them) takes advanced indexing."""
    return any(is_advanced(ix) for ix in (index if isinstance(index, tuple) else (index,)))


def _split(t, index):
    """(basic index with the advanced entry replaced by a full slice, the
    advanced entry, the dimension it applies to in the basic view)."""
    if not isinstance(index, tuple):
        index = (index,)
    adv = [k for k, ix in enumerate(index) if is_advanced(ix)]
    if len(adv) > 1:
        raise IndexError("only one tensor, list or array index per indexing expression is supported")
    k = adv[0]
    n_real = sum(1 for ix in index if ix is not None and ix is not Ellipsis)
    dim = 0
    for ix in index[:k]:
        if ix is Ellipsis:
            dim += t.ndim - n_real
        elif ix is None or isinstance(ix, slice):
            dim += 1
    adv_ix = index[k]
    basic = index[:k] + (slice(None),) + index[k + 1:]
    return basic, adv_ix, dim


def _index_tensor(ix, device):
    """The index as (CUDA or CPU tensor of int64 or bool, known_on_host)."""
    if isinstance(ix, Tensor):
        t = ix
    else:
        t = as_source(ix)
    if t.dtype.kind == "f":
        raise IndexError(f"tensors used as indices must be integer or bool, not {t.dtype.name}")
    return t, t.is_cpu


def _index_on_device(flat, view, literal):
    """The flat index as a contiguous int64 tensor on CUDA ``view``'s device;
    host indices by the host-data rule of copy_ (``literal``: made from a
    Python list, so a capture may copy it into the graph)."""
    if flat.is_cpu:
        return host_to_cuda(flat, view._device_index, literal, dt.int64)
    return flat.to(dt.int64).to(view.device).contiguous()


def _refuse_host_mask_in_capture(view):
    """CudaError CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED while CUDA ``view``'s
    stream captures: a mask in a CPU tensor or NumPy array decides the
    result's shape now, so a graph would silently keep this mask."""
    dev = view._device_index
    refuse_in_capture(dev, current_stream_handle_of(dev), (
        "a boolean mask in a CPU tensor or NumPy array cannot index a CUDA tensor inside a CUDA graph capture: "
        "the mask's values decide the result's shape when the call is made, so the graph would keep this mask "
        "whatever the tensor holds at a replay; give the mask as a Python list (copied into the graph), or "
        "use where() with a CUDA mask"))


def _check_host_bounds(ix, size, dim):
    """IndexError for the first index outside [-size, size) (indices known on the host)."""
    h = ix.numpy().astype(np.int64).reshape(-1)
    bad = (h < -size) | (h >= size)
    if bad.any():
        raise IndexError(f"index {int(h[bad][0])} is out of bounds for dimension {dim} with size {size}")


def _mask_to_indices(mask, view, dim):
    """Boolean mask over dims [dim, dim+mask.ndim) -> (flattened view, int64 index)."""
    shape = view.shape[dim:dim + mask.ndim]
    if mask.shape != shape:
        raise IndexError(f"the mask shape {mask.shape} does not match the indexed shape {shape}")
    if mask.ndim > 1:
        n = int(np.prod(shape))
        view = view.reshape(view.shape[:dim] + (n,) + view.shape[dim + mask.ndim:])
    host = mask.numpy().reshape(-1)          # the result's size depends on the data: a sync
    idx = np.flatnonzero(host).astype(np.int64)
    return view, idx


def _gather_source(name, d, ndim, p, body):
    return (f'extern "C" __global__ void {name}({d.ctype}* __restrict__ out, '
            f"{d.ctype}* __restrict__ src, const long long* __restrict__ idx, long long n, "
            f"long long dimsize, int* err, tp_g g) {{{_kernels.GRID_WAIT}"
            "  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;\n"
            "       i += (long long)gridDim.x * blockDim.x) {\n"
            "    long long rem = i, off = 0;\n"
            "    bool bad = false;\n"
            f"    for (int d = {ndim - 1}; d >= 0; --d) {{\n"
            "      long long c = rem % g.size[d]; rem /= g.size[d];\n"
            f"      if (d == {p}) {{\n"
            "        long long k = idx[c];\n"
            "        if (k < 0) k += dimsize;\n"
            "        if (k < 0 || k >= dimsize) { atomicExch(err, 1); bad = true; k = 0; }\n"
            "        off += k * g.stride[d];\n"
            "      } else off += c * g.stride[d];\n"
            "    }\n"
            "    if (bad) continue;   // never touch memory through a bad index\n"
            f"    {body}\n"
            "  }\n"
            "}\n")


def _kernel(kind, d, ndim, p, dev):
    key = ("index", kind, d.code, ndim, p)

    def make():
        name = f"tp_{kind}_{d.name}_{ndim}_{p}"
        body = "out[i] = src[off];" if kind == "gather" else "src[off] = out[i];"
        src = _gather_source(name, d, ndim, p, body)
        geom = f"struct tp_g {{ long long size[{ndim}]; long long stride[{ndim}]; }};\n"
        return geom + src, name
    return _kernels.cached_function(key, dev, make)


def _run(kind, view, dim, idx, other):
    """gather: other[...] = view[.., idx, ..]; scatter: view[.., idx, ..] = other[...].
    ``other`` is contiguous with shape view.shape[:dim] + (len(idx),) + view.shape[dim+1:]."""
    dev = view._device_index
    n = other.numel()
    if n == 0:
        return
    shape = other.shape
    strides = view.strides
    f = _kernel(kind, view.dtype, len(shape), dim, dev)
    params = struct.pack("<QQQqqQ", other.data_ptr(), view.data_ptr(), idx.data_ptr(), n,
                         view.shape[dim], _flag(dev).data_ptr())
    params += struct.pack(f"<{2 * len(shape)}q", *shape, *strides)
    f.launch(_kernels.grid_for(n, dev), _kernels.BLOCK, params)
    _pending.add(dev)


# ------------------------------------------------------------------ gather

def _gather_along_source(name, d, ndim, dim):
    """``out[i] = src[..., index[i], ...]``: for each element of ``index``
    (walked row-major over its shape, its own strides), the element of
    ``src`` at the same coordinates except along ``dim``, where the index
    says; an index outside ``[0, size)`` raises the error flag and writes
    nothing."""
    return (f"struct tp_ga_{ndim} {{ long long size[{ndim}]; long long istride[{ndim}]; "
            f"long long sstride[{ndim}]; }};\n"
            f'extern "C" __global__ void {name}({d.ctype}* __restrict__ out, '
            f"const {d.ctype}* __restrict__ src, const long long* __restrict__ idx, long long n, "
            f"long long dimsize, int* err, tp_ga_{ndim} g) {{{_kernels.GRID_WAIT}"
            "  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;\n"
            "       i += (long long)gridDim.x * blockDim.x) {\n"
            "    long long rem = i, io = 0, so = 0;\n"
            f"    for (int d = {ndim - 1}; d >= 0; --d) {{\n"
            "      const long long c = rem % g.size[d]; rem /= g.size[d];\n"
            "      io += c * g.istride[d];\n"
            f"      if (d != {dim}) so += c * g.sstride[d];\n"
            "    }\n"
            "    const long long k = idx[io];\n"
            "    if (k < 0 || k >= dimsize) { atomicExch(err, 1); continue; }   // never read through a bad index\n"
            f"    out[i] = src[so + k * g.sstride[{dim}]];\n"
            "  }\n"
            "}\n")


def _gather_along_kernel(d, ndim, dim, dev):
    def make():
        name = f"tp_gather_along_{d.name}_{ndim}_{dim}"
        return _gather_along_source(name, d, ndim, dim), name
    return _kernels.cached_function(("gather_along", d.code, ndim, dim), dev, make)


def gather(input, dim, index, *, sparse_grad=False, out=None):
    """Gather the elements of ``input`` along ``dim`` at the positions ``index`` holds.

    As ``torch.gather``: for a 3-d tensor and ``dim=1``,
    ``out[i][j][k] = input[i][index[i][j][k]][k]``. ``index`` has as many
    dimensions as ``input``, and along every dimension but ``dim`` at most
    ``input``'s size; the result has ``index``'s shape and ``input``'s
    dtype. Indices are not wrapped: each must lie in ``[0, input.size(dim))``.

    Parameters
    ----------
    input : Tensor
        The values.
    dim : int
        The dimension to index along (negative counts from the end).
    index : Tensor
        The positions, int64, on ``input``'s device.
    sparse_grad : bool, optional
        Accepted for PyTorch's signature; tensorplay has no autograd.
    out : Tensor, optional
        Write the result here (``index``'s shape, ``input``'s dtype).

    Returns
    -------
    Tensor
        The gathered values.

    Raises
    ------
    TypeError
        If ``input`` or ``index`` is not a tensor, or ``index`` is not int64.
    IndexError
        If ``dim`` is out of range, or an index is out of range (on CUDA at
        the next synchronizing host read, as for tensor indices).
    ValueError
        If the numbers of dimensions differ, ``index`` is larger than
        ``input`` outside ``dim``, or the tensors are on different devices.

    Notes
    -----
    On CUDA tensors this launches one generated NVRTC kernel on the current
    stream, which checks the indices on the device (nothing is read out of
    bounds); a CUDA graph can capture it.
    """
    if not isinstance(input, Tensor) or not isinstance(index, Tensor):
        raise TypeError("gather expects tensors for input and index")
    if index.dtype is not dt.int64:
        raise TypeError(f"gather: index must be int64, got {index.dtype.name}")
    d = normalize_dim(dim, input.ndim)
    if max(index.ndim, 1) != max(input.ndim, 1):
        raise ValueError(f"gather: index has {index.ndim} dimensions, input {input.ndim}; they must be equal")
    if index._device_index != input._device_index:
        raise ValueError(f"gather: input is on {input.device}, index on {index.device}")
    src = input.reshape(1) if input.ndim == 0 else input          # 0-d as 1-d, as PyTorch
    ix = index.reshape(1) if index.ndim == 0 else index
    for k, (a, b) in enumerate(zip(ix.shape, src.shape)):
        if k != d and a > b:
            raise ValueError(f"gather: index has size {a} in dimension {k}, larger than input's {b}")
    if out is not None:
        if not isinstance(out, Tensor):
            raise TypeError(f"out must be a Tensor, got {type(out).__name__}")
        if out.shape != index.shape or out.dtype is not input.dtype or out._device_index != input._device_index:
            raise ValueError(f"gather: out must have index's shape {index.shape}, input's dtype "
                             f"{input.dtype.name} and device {input.device}")
    dst = out if out is not None else empty(index.shape, dtype=input.dtype, device=input.device)
    if dst.numel() == 0:
        return dst
    size = src.shape[d]
    if src.is_cpu:
        k = ix.numpy()
        bad = (k < 0) | (k >= size)
        if bad.any():
            raise IndexError(f"gather: index {int(k[bad][0])} is out of bounds for dimension {d} with size {size}")
        a = src.numpy()[tuple(slice(0, n) if j != d else slice(None) for j, n in enumerate(ix.shape))]
        cast_into(dst.numpy(), np.take_along_axis(a, k, axis=d).reshape(dst.shape))
        return dst
    dev = src._device_index
    target = dst if dst.is_contiguous() else empty(index.shape, dtype=input.dtype, device=input.device)
    ndim = ix.ndim
    f = _gather_along_kernel(src.dtype, ndim, d, dev)
    n = ix.numel()
    params = struct.pack("<QQQqqQ", target.data_ptr(), src.data_ptr(), ix.data_ptr(), n, size, _flag(dev).data_ptr())
    params += struct.pack(f"<{3 * ndim}q", *ix.shape, *ix.strides, *src.strides)
    f.launch(_kernels.grid_for(n, dev), _kernels.BLOCK, params)
    _pending.add(dev)
    if target is not dst:
        dst.copy_(target)
    return dst


def masked_fill(input, mask, value, *, _inplace=False):
    """``input`` with ``value`` where the bool ``mask`` (broadcast to
    ``input``'s shape) is true: a new tensor, or ``input`` itself with
    ``_inplace``; ``value`` (a number or a 0-d tensor) is cast to
    ``input``'s dtype."""
    name = "masked_fill_" if _inplace else "masked_fill"
    if not isinstance(mask, Tensor):
        raise TypeError(f"{name}: mask must be a bool tensor, got {type(mask).__name__}")
    if mask.dtype is not dt.bool_:
        raise TypeError(f"{name}: mask must be a bool tensor, got {mask.dtype.name}")
    if isinstance(value, Tensor):
        if value.ndim:
            raise ValueError(f"{name}: value must be a number or a 0-d tensor, got a {value.ndim}-d tensor")
        v = value if value.dtype is input.dtype else value.to(input.dtype)
        if v.is_cpu and input.is_cuda:
            v = v.item()
    elif isinstance(value, (numbers.Real, np.generic)) and not isinstance(value, np.ndarray):
        v = check_value(value, input.dtype, fill=True)
        if input.dtype is dt.bool_:
            v = bool(v)
    else:
        raise TypeError(f"{name}: value must be a number or a 0-d tensor, got {type(value).__name__}")
    if broadcast_shape(mask.shape, input.shape) != input.shape:
        raise ValueError(f"{name}: the mask's shape {mask.shape} does not broadcast to the tensor's {input.shape}")
    out = input if _inplace else empty(input.shape, dtype=input.dtype, device=input.device)
    return where(mask, v, input, out=out)


def getitem(t, index):
    basic, adv_ix, dim = _split(t, index)
    view = basic_getitem(t, basic)
    ix, on_host = _index_tensor(adv_ix, view._device_index)
    literal = is_literal(adv_ix)
    if ix.dtype is dt.bool_:
        if ix.is_cpu and view.is_cuda and not literal:
            _refuse_host_mask_in_capture(view)
        view, host_idx = _mask_to_indices(ix, view, dim)
        out_idx_shape = (len(host_idx),)
        ix = tensor(host_idx)
        on_host = literal = True
    else:
        out_idx_shape = ix.shape
    if view.ndim <= dim:
        raise IndexError(f"too many indices for a {t.ndim}-d tensor")
    size = view.shape[dim]
    if on_host:
        _check_host_bounds(ix, size, dim)
    flat = ix.reshape(-1)
    out_shape = view.shape[:dim] + (flat.numel(),) + view.shape[dim + 1:]
    final_shape = view.shape[:dim] + tuple(out_idx_shape) + view.shape[dim + 1:]
    if view.is_cpu:
        a = np.take(view.numpy(), flat.numpy().astype(np.int64), axis=dim)
        return tensor(a.reshape(final_shape), dtype=view.dtype)
    idx = _index_on_device(flat, view, literal)
    out = empty(out_shape, dtype=view.dtype, device=view.device)
    _run("gather", view, dim, idx, out)
    return out.view(final_shape)


def setitem(t, index, value):
    basic, adv_ix, dim = _split(t, index)
    view = basic_getitem(t, basic)
    ix, on_host = _index_tensor(adv_ix, view._device_index)
    literal = is_literal(adv_ix)
    scalar = isinstance(value, (numbers.Number, np.generic)) and not isinstance(value, np.ndarray)
    if ix.dtype is dt.bool_ and scalar and ix.shape == view.shape[dim:dim + ix.ndim] and dim == 0 \
            and ix._device_index == view._device_index:
        # masked fill without a host round trip: view = where(mask, value, view)
        m = ix.reshape(ix.shape + (1,) * (view.ndim - ix.ndim))
        where(m, value, view, out=view)
        return
    if ix.dtype is dt.bool_:
        if ix.is_cpu and view.is_cuda and not literal:
            _refuse_host_mask_in_capture(view)
        view, host_idx = _mask_to_indices(ix, view, dim)
        ix = tensor(host_idx)
        on_host = literal = True
    size = view.shape[dim]
    if on_host:
        _check_host_bounds(ix, size, dim)
    flat = ix.reshape(-1)
    # the index first: a host index a capture refuses is refused before any GPU work
    idx = None if view.is_cpu else _index_on_device(flat, view, literal)
    shape = view.shape[:dim] + (flat.numel(),) + view.shape[dim + 1:]
    src = empty(shape, dtype=view.dtype, device=view.device)
    if scalar:
        src.fill_(value)
    else:
        v = as_source(value)
        if v.shape != shape:
            vshape = view.shape[:dim] + tuple(ix.shape) + view.shape[dim + 1:]
            if v.ndim and v.shape == vshape:
                v = v.reshape(shape)
        copy_into(src, v, literal=is_literal(value))
    if view.is_cpu:
        a = view.numpy()
        sl = (slice(None),) * dim
        a[sl + (flat.numpy().astype(np.int64),)] = src.numpy()
        return
    _run("scatter", view, dim, idx, src)


# ------------------------------------------------------------------ Tensor methods
# installed on Tensor by _methods.install as __getitem__ / __setitem__

def tensor_getitem(self, index):
    if has_advanced(index):
        return getitem(self, index)
    return basic_getitem(self, index)


def tensor_setitem(self, index, value):
    if has_advanced(index):
        return setitem(self, index, value)
    target = basic_getitem(self, index)
    if isinstance(value, (numbers.Number, np.generic)) and not isinstance(value, np.ndarray):
        target.fill_(value)
    else:
        copy_into(target, value)
