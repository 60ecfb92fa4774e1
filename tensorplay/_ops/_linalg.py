# SPDX-License-Identifier: Apache-2.0
"""matmul / mv: a tiled shared-memory kernel (16x16 tiles, float32 accumulation
for half types and float32, float64 for float64), batched over blockIdx.z."""

from __future__ import annotations

import struct

import numpy as np

from .. import _dtypes as dt
from .._tensor_api import Tensor, empty
from . import _codegen, _kernels

TILE = 16
_FLOATS = (dt.float16, dt.bfloat16, dt.float32, dt.float64)


def _source(name, d):
    acc = "double" if d is dt.float64 else "float"
    la = _codegen.load_expr(d, "A", "ia")
    lb = _codegen.load_expr(d, "B", "ib")
    return (_codegen.PREAMBLE +
            f'extern "C" __global__ void {name}(const {d.ctype}* __restrict__ A, '
            f"const {d.ctype}* __restrict__ B, {d.ctype}* __restrict__ C, long long M, long long N, "
            "long long K, long long sab, long long sam, long long sak, long long sbb, long long sbk, "
            "long long sbn) {\n"
            f"  __shared__ {acc} As[{TILE}][{TILE + 1}];\n"
            f"  __shared__ {acc} Bs[{TILE}][{TILE + 1}];\n"
            "  const int tx = threadIdx.x, ty = threadIdx.y;\n"
            "  const long long bz = blockIdx.z;\n"
            f"  const long long row = (long long)blockIdx.y * {TILE} + ty;\n"
            f"  const long long col = (long long)blockIdx.x * {TILE} + tx;\n"
            f"  {acc} acc = 0;\n"
            f"  for (long long k0 = 0; k0 < K; k0 += {TILE}) {{\n"
            "    long long ia = bz * sab + row * sam + (k0 + tx) * sak;\n"
            "    long long ib = bz * sbb + (k0 + ty) * sbk + col * sbn;\n"
            f"    As[ty][tx] = (row < M && k0 + tx < K) ? ({acc})({la}) : ({acc})0;\n"
            f"    Bs[ty][tx] = (k0 + ty < K && col < N) ? ({acc})({lb}) : ({acc})0;\n"
            "    __syncthreads();\n"
            "    #pragma unroll\n"
            f"    for (int k = 0; k < {TILE}; ++k) acc += As[ty][k] * Bs[k][tx];\n"
            "    __syncthreads();\n"
            "  }\n"
            "  if (row < M && col < N) {\n"
            "    long long ic = bz * M * N + row * N + col;\n"
            f"    {_codegen.store_stmt(d, 'C', 'ic', 'acc')}\n"
            "  }\n"
            "}\n")


def _launch(a, b, out, batch, M, N, K, sa, sb):
    d = a.dtype
    dev = a._device_index_
    f = _kernels.cached_function(("matmul", d.code), dev, lambda: (_source(f"tp_matmul_{d.name}", d),
                                                                    f"tp_matmul_{d.name}"))
    params = struct.pack("<QQQqqqqqqqqq", a.data_ptr(), b.data_ptr(), out.data_ptr(), M, N, K, *sa, *sb)
    grid = (-(-N // TILE), -(-M // TILE), batch)
    if grid[1] > 65535 or batch > 65535:
        raise ValueError(f"matmul: {M} rows or {batch} batches exceed the kernel's grid limits")
    f.launch(grid, (TILE, TILE), params)


def matmul(input, other, *, out=None):
    """Return the matrix product of ``input`` and ``other``.

    NumPy's and PyTorch's rules for 1-D, 2-D and batched 3-D operands: a 1-D
    first operand is a row vector, a 1-D second operand a column vector (the
    added dimension is removed again), and 3-D operands multiply batch by
    batch (a batch of 1 broadcasts). Half types and float32 accumulate in
    float32, float64 in float64.

    Parameters
    ----------
    input : Tensor
        The left operand: float16, bfloat16, float32 or float64.
    other : Tensor
        The right operand, of the same dtype and device.
    out : Tensor, optional
        Write the product here (same dtype, the result's shape).

    Returns
    -------
    Tensor
        The product.

    Notes
    -----
    On CUDA tensors this launches a tiled shared-memory NVRTC kernel on the
    current stream (cuLaunchKernel).
    """
    a, b = input, other
    if not (isinstance(a, Tensor) and isinstance(b, Tensor)):
        raise TypeError("matmul expects two tensors")
    if a.dtype is not b.dtype:
        raise TypeError(f"matmul expects one dtype, got {a.dtype.name} and {b.dtype.name}")
    if a.dtype not in _FLOATS:
        raise TypeError(f"matmul supports float16, bfloat16, float32 and float64, not {a.dtype.name}")
    if a._device_index_ != b._device_index_:
        raise ValueError(f"matmul: operands on {a.device} and {b.device}")
    if a.ndim == 0 or b.ndim == 0 or a.ndim > 3 or b.ndim > 3:
        raise ValueError(f"matmul supports 1-D, 2-D and 3-D operands, got {a.ndim}-D and {b.ndim}-D")
    # promote to 3-D: (batch, M, K) @ (batch, K, N)
    squeeze_m = a.ndim == 1
    squeeze_n = b.ndim == 1
    a3 = a.unsqueeze(0) if a.ndim == 1 else a
    b3 = b.unsqueeze(1) if b.ndim == 1 else b
    if a3.ndim == 2:
        a3 = a3.unsqueeze(0)
    if b3.ndim == 2:
        b3 = b3.unsqueeze(0)
    if a3.shape[2] != b3.shape[1]:
        raise ValueError(f"matmul: shapes {a.shape} and {b.shape} do not align ({a3.shape[2]} != {b3.shape[1]})")
    ba, bb = a3.shape[0], b3.shape[0]
    if ba != bb and ba != 1 and bb != 1:
        raise ValueError(f"matmul: batch sizes {ba} and {bb} do not broadcast")
    batch = max(ba, bb)
    M, K, N = a3.shape[1], a3.shape[2], b3.shape[2]
    shape = (batch, M, N)
    final = list(shape)
    if squeeze_n:
        final.pop(2)
    if squeeze_m:
        final.pop(1)
    if a.ndim < 3 and b.ndim < 3:
        final.pop(0)
    final = tuple(final)
    if out is not None:
        if not isinstance(out, Tensor) or out.shape != final or out.dtype is not a.dtype:
            raise ValueError(f"matmul: out must be a {a.dtype.name} tensor of shape {final}")
    if a.is_cpu:
        cd = np.float32 if a.dtype in (dt.float16, dt.bfloat16) else a.dtype.numpy_dtype
        r = np.matmul(a.numpy().astype(cd), b.numpy().astype(cd))
        res = out if out is not None else empty(final, dtype=a.dtype)
        np.copyto(res.numpy(), np.asarray(r).reshape(final), casting="unsafe")
        return res
    res3 = empty(shape, dtype=a.dtype, device=a.device)
    if res3.numel():
        sa = (a3.strides[0] if ba > 1 else 0, a3.strides[1], a3.strides[2])
        sb = (b3.strides[0] if bb > 1 else 0, b3.strides[1], b3.strides[2])
        if K == 0:
            res3.zero_()
        else:
            _launch(a3, b3, res3, batch, M, N, K, sa, sb)
    res = res3.view(final)
    if out is not None:
        return out.copy_(res)
    return res


def mv(input, vec):
    """Return the product of the matrix ``input`` (M, K) and the vector ``vec`` (K,).

    Parameters
    ----------
    input : Tensor
        A 2-D tensor.
    vec : Tensor
        A 1-D tensor of the same dtype.

    Returns
    -------
    Tensor
        A 1-D tensor of size M; see :func:`matmul`.
    """
    a, v = input, vec
    if not (isinstance(a, Tensor) and isinstance(v, Tensor)) or a.ndim != 2 or v.ndim != 1:
        raise ValueError("mv expects a 2-D tensor and a 1-D tensor")
    return matmul(a, v)
