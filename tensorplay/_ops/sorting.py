# SPDX-License-Identifier: Apache-2.0
"""Sorting along a dimension: ``sort`` and ``topk``, on the CPU (NumPy) and
CUDA, capturable.

Both turn the values into unsigned 64-bit keys whose order is the values'
(``sort_kernels.key_expr``, and its NumPy twin ``sort_keys``: NaN after
+inf, -0.0 equal to 0.0, the keys inverted for descending order), sort the
keys of each row with their positions, ties to the lower position (the
bitonic sort of ``sort_kernels``, which ``randperm`` and ``multinomial``
use too; ``np.argsort(kind="stable")`` on the CPU), and gather the values
at the sorted positions. So the sort is stable in both directions and the
CPU and CUDA give the same indices.
"""

from __future__ import annotations

import numbers

import numpy as np

from tensorplay import _dtypes as dt
from tensorplay import return_types
from tensorplay._tensor.args import normalize_dim
from tensorplay._tensor.creation import empty, from_numpy
from tensorplay._tensor.tensor import Tensor, empty_cuda
from tensorplay._kernels import cache as _kernels
from tensorplay._kernels import sort_kernels as _sort
from tensorplay._ops.indexing import gather
from tensorplay._ops.sampling import sort_rows
from tensorplay._ops.views import permute

__all__ = ["sort", "topk"]


def _sorted_positions(x, d, descending, k):
    """(positions, moved): the positions along ``d`` of the ``k`` first
    values of each row of ``x`` in sorted order, as an int64 tensor of
    ``x``'s shape moved so that ``d`` is last (size k there), and ``x``
    moved the same way (a view)."""
    last = x.ndim - 1
    perm = [i for i in range(x.ndim) if i != d] + [d]
    moved = x if d == last else permute(x, perm)
    n = moved.shape[-1]
    rows = moved.numel() // n
    if x.is_cpu:
        keys = _sort.sort_keys(moved.numpy(), descending)
        order = np.argsort(keys, axis=-1, kind="stable")[..., :k]
        return from_numpy(np.ascontiguousarray(order)), moved
    dev = x._device_index
    keys = empty_cuda(moved.shape, dt.int64, dev)
    _kernels.launch_elementwise(("sort_key", bool(descending)), _sort.key_expr(x.dtype, descending), keys,
                                (moved,), (moved.strides,), preamble=_sort.KEY_PREAMBLE)
    order = sort_rows(keys, rows, n)[:, :k]
    return order.contiguous().view(moved.shape[:-1] + (k,)), moved


def _place(result, x, d, into):
    """``result`` (laid out with ``d`` last) in ``x``'s layout of dimensions:
    copied into ``into`` when given, else a contiguous tensor."""
    last = x.ndim - 1
    if d == last:
        if into is None:
            return result
        into.copy_(result)
        return into
    perm = [i for i in range(x.ndim) if i != d] + [d]
    shape = list(x.shape)
    shape[d] = result.shape[-1]
    dst = into if into is not None else empty(tuple(shape), dtype=result.dtype, device=result.device)
    permute(dst, perm).copy_(result)
    return dst


def _check_out(op, out, shape, dtype, dev):
    if out is None:
        return None, None
    if not (isinstance(out, (tuple, list)) and len(out) == 2 and all(isinstance(t, Tensor) for t in out)):
        raise TypeError(f"{op}: out must be a tuple of two tensors (values, indices)")
    for t, want in zip(out, (dtype, dt.int64)):
        if t.shape != shape or t.dtype is not want or t._device_index != dev:
            raise ValueError(f"{op}: out must be tensors of shape {shape} on the input's device, of dtypes "
                             f"{dtype.name} and int64")
    return out[0], out[1]


def _sort_along(op, input, dim, descending, k, out):
    if not isinstance(input, Tensor):
        raise TypeError(f"{op} expects a Tensor, got {type(input).__name__}")
    d = normalize_dim(dim, input.ndim)
    cls = return_types.sort if op == "sort" else return_types.topk
    if input.ndim == 0:                 # as a 1-d tensor of one element
        shape = () if k else (0,)
        out_values, out_indices = _check_out(op, out, shape, input.dtype, input._device_index)
        r = _sort_along(op, input.reshape(1), 0, descending, k, None)
        values, indices = r.values.reshape(shape), r.indices.reshape(shape)
        if out is not None:
            values, indices = out_values.copy_(values), out_indices.copy_(indices)
        return cls(values, indices)
    shape = list(input.shape)
    shape[d] = k
    shape = tuple(shape)
    out_values, out_indices = _check_out(op, out, shape, input.dtype, input._device_index)
    if input.numel() == 0 or k == 0:
        values = out_values if out_values is not None else empty(shape, dtype=input.dtype, device=input.device)
        indices = out_indices if out_indices is not None else empty(shape, dtype=dt.int64, device=input.device)
        return cls(values, indices)
    positions, moved = _sorted_positions(input, d, descending, k)
    gathered = gather(moved, moved.ndim - 1, positions)
    return cls(_place(gathered, input, d, out_values), _place(positions, input, d, out_indices))


def sort(input, dim=-1, descending=False, *, stable=False, out=None):
    """Sort the elements of ``input`` along ``dim``; return the values and where they were.

    As ``torch.sort``, returning the named tuple
    :class:`tensorplay.return_types.sort` ``(values, indices)``. The sort
    is always stable: equal values keep their order, in ascending and in
    descending order alike. NaN sorts after +inf (first when descending),
    and -0.0 equals 0.0. The CPU and CUDA give the same indices.

    Parameters
    ----------
    input : Tensor
        The values to sort.
    dim : int, optional
        The dimension to sort along; default -1 (the last).
    descending : bool, optional
        Largest first (default False: smallest first).
    stable : bool, optional
        Accepted for PyTorch's signature: the sort is stable either way.
    out : tuple of two Tensor, optional
        Write the values and the indices here (``input``'s shape; its dtype
        and int64).

    Returns
    -------
    return_types.sort
        ``values`` (``input``'s dtype) and ``indices`` (int64), both of
        ``input``'s shape.

    Raises
    ------
    TypeError
        If ``input`` is not a tensor or ``dim`` not an int.
    IndexError
        If ``dim`` is out of range.

    Notes
    -----
    On CUDA: one kernel computes 64-bit sort keys, a bitonic sort of each
    row (generated NVRTC kernels, about ``log2(n)**2 / 2`` steps, most in
    shared memory) orders them, and a gather kernel reads the values, on the
    current stream; the launches depend on the shape only, so a CUDA graph
    can capture them.
    """
    if not isinstance(input, Tensor):
        raise TypeError(f"sort expects a Tensor, got {type(input).__name__}")
    n = input.shape[normalize_dim(dim, input.ndim)] if input.ndim else 1
    return _sort_along("sort", input, dim, bool(descending), n, out)


def topk(input, k, dim=-1, largest=True, sorted=True, *, out=None):
    """Return the ``k`` largest (or smallest) elements of ``input`` along ``dim`` and where they are.

    As ``torch.topk``, returning the named tuple
    :class:`tensorplay.return_types.topk` ``(values, indices)``, in sorted
    order (largest first, or smallest first with ``largest=False``). Ties
    go to the lower index, as :func:`sort` (stable) orders them; NaN counts
    as the largest value.

    Parameters
    ----------
    input : Tensor
        The values.
    k : int
        How many elements, from 0 to the size of ``dim``.
    dim : int, optional
        The dimension to search along; default -1 (the last).
    largest : bool, optional
        The largest elements (default True), or the smallest.
    sorted : bool, optional
        Accepted for PyTorch's signature: the result is always sorted.
    out : tuple of two Tensor, optional
        Write the values and the indices here.

    Returns
    -------
    return_types.topk
        ``values`` (``input``'s dtype) and ``indices`` (int64), of
        ``input``'s shape with size ``k`` along ``dim``.

    Raises
    ------
    TypeError
        If ``input`` is not a tensor, or ``k`` or ``dim`` not an int.
    IndexError
        If ``dim`` is out of range.
    ValueError
        If ``k`` is negative or larger than the size of ``dim``.

    Notes
    -----
    On CUDA: :func:`sort`'s kernels over whole rows, then a gather of the
    first ``k``; capturable.
    """
    if not isinstance(input, Tensor):
        raise TypeError(f"topk expects a Tensor, got {type(input).__name__}")
    if isinstance(k, bool) or not isinstance(k, numbers.Integral):
        raise TypeError(f"topk: k must be an int, got {type(k).__name__}")
    n = input.shape[normalize_dim(dim, input.ndim)] if input.ndim else 1
    if not 0 <= k <= n:
        raise ValueError(f"topk: k = {k} is out of range for a dimension of size {n}")
    return _sort_along("topk", input, dim, bool(largest), int(k), out)
