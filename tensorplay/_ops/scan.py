# SPDX-License-Identifier: Apache-2.0
"""Cumulative sums: ``cumsum`` on the CPU (NumPy) and CUDA (the scan
kernels of ``tensorplay._kernels.scan_kernels``), capturable."""

from __future__ import annotations

import struct

import numpy as np

from tensorplay import _dtypes as dt
from tensorplay._tensor.args import cast_into, normalize_dim
from tensorplay._tensor.creation import empty
from tensorplay._tensor.tensor import Tensor, empty_cuda
from tensorplay._kernels import cache as _kernels
from tensorplay._kernels import scan_kernels as _scan
from tensorplay._ops.views import permute

__all__ = ["cumsum", "scan_rows"]


def scan_rows(src, rows: int, n: int, out) -> None:
    """Write the inclusive prefix sums of each row of the contiguous CUDA
    ``src`` (rows x n) into the contiguous CUDA ``out`` (rows x n, any
    dtype), accumulating in ``scan_kernels.acc_dtype(src.dtype)``. A fixed
    sequence of launches for given rows, n and dtypes: capturable."""
    dev = src._device_index
    acc = _scan.acc_dtype(src.dtype)
    threads, chunk, chunks = _scan.scan_plan(n)
    if chunks == 1:
        f = _scan.scan_function(src.dtype, out.dtype, dev)
        f.launch(rows, threads, struct.pack("<QQQqqq", src.data_ptr(), out.data_ptr(), 0, n, 1, chunk), 0, None)
        return
    local = out if out.dtype is acc else empty_cuda((rows * n,), acc, dev)
    part = empty_cuda((rows * chunks,), acc, dev)
    f = _scan.scan_function(src.dtype, acc, dev)
    f.launch(rows * chunks, threads, struct.pack("<QQQqqq", src.data_ptr(), local.data_ptr(), part.data_ptr(),
                                                 n, chunks, chunk), 0, None)
    scanned = empty_cuda((rows * chunks,), acc, dev)
    scan_rows(part, rows, chunks, scanned)
    total = rows * n
    g = _kernels.grid_for(total, dev)
    _scan.add_function(acc, out.dtype, dev).launch(
        g, _scan.ADD_BLOCK, struct.pack("<QQQqqqq", local.data_ptr(), scanned.data_ptr(), out.data_ptr(),
                                        total, n, chunks, chunk), 0, None)


def _result_dtype(d, dtype):
    if dtype is not None:
        return dt.as_dtype(dtype)
    return dt.int64 if d.kind in "biu" else d


def cumsum(input, dim, *, dtype=None, out=None):
    """Return the cumulative sums of the elements of ``input`` along ``dim``.

    As ``torch.cumsum``: element ``i`` of the result along ``dim`` is the
    sum of the elements ``0`` to ``i``. Bool and integer inputs give int64
    unless ``dtype`` says otherwise; with ``dtype`` the input is cast to it
    first. Half types and float32 accumulate in float32, float64 in
    float64, integers in int64 (wrapping on overflow).

    Parameters
    ----------
    input : Tensor
        The tensor to sum.
    dim : int
        The dimension to sum along (negative counts from the end).
    dtype : dtype, str or None, optional
        The dtype of the result; by default ``input``'s, int64 for bool and
        integer inputs.
    out : Tensor, optional
        Write the result here: ``input``'s shape and the result dtype.

    Returns
    -------
    Tensor
        The cumulative sums, ``input``'s shape.

    Raises
    ------
    TypeError
        If ``input`` is not a tensor or ``dim`` not an int.
    IndexError
        If ``dim`` is out of range.

    Notes
    -----
    On CUDA: a block-wise scan kernel (generated NVRTC C) over each row of
    the elements along ``dim``, and for rows longer than one block's chunk
    (4096 elements) a scan of the chunk totals and a pass adding them, on
    the current stream; the launches depend on the shape only, so a CUDA
    graph can capture them. Floating sums are added in a fixed order (the
    same every run) that differs from a sequential loop, so the last bits
    may differ from the CPU's.
    """
    if not isinstance(input, Tensor):
        raise TypeError(f"cumsum expects a Tensor, got {type(input).__name__}")
    d = normalize_dim(dim, input.ndim)
    result = _result_dtype(input.dtype, dtype)
    if out is not None:
        if not isinstance(out, Tensor):
            raise TypeError(f"out must be a Tensor, got {type(out).__name__}")
        if out.shape != input.shape:
            raise ValueError(f"cumsum: out has shape {out.shape}, the result has shape {input.shape}")
        if out._device_index != input._device_index:
            raise ValueError(f"cumsum: out is on {out.device}, the input on {input.device}")
        if out.dtype is not result:
            raise TypeError(f"cumsum: out has dtype {out.dtype.name}, expected {result.name}")
    x = input if input.dtype is result or dtype is None else input.to(result)
    dst = out if out is not None else empty(input.shape, dtype=result, device=input.device)
    if dst.numel() == 0:
        return dst
    if x.is_cpu:
        a = x.numpy()
        if a.ndim == 0:
            a = a.reshape(1)
        acc = _scan.acc_dtype(x.dtype)
        with np.errstate(all="ignore"):
            r = np.cumsum(a.astype(acc.numpy_dtype), axis=d)
        cast_into(dst.numpy(), r.reshape(dst.shape))
        return dst
    if x.ndim == 0:
        x = x.reshape(1)
    last = x.ndim - 1
    perm = [i for i in range(x.ndim) if i != d] + [d]
    moved = x if d == last else permute(x, perm)
    src = moved.contiguous()
    n = src.shape[-1]
    rows = src.numel() // n
    direct = d == last and dst.is_contiguous()
    target = dst if direct else empty_cuda(src.shape, result, src._device_index)
    scan_rows(src, rows, n, target)
    if not direct:
        if d == last:
            dst.copy_(target.reshape(dst.shape))
        else:
            permute(dst, perm).copy_(target)
    return dst
