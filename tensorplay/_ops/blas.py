# SPDX-License-Identifier: Apache-2.0
"""cuBLASLt for matrix products: loading the library, the layout of a row-major
problem as cuBLASLt's column-major one, and per-thread plans.

The library comes from the ``nvidia-cublas`` wheel, loaded on first use with
``cuda.pathfinder.load_nvidia_dynamic_lib("cublasLt")``. There is no fallback
kernel: a product 10-100x slower than the library would hide in a graph, so a
missing library is an error that names the package to install.

A product ``D = A @ B`` of row-major matrices is ``D^T = B^T @ A^T`` for
column-major cuBLASLt, so operands in either order (a transposed view is a
column-major matrix) pass without copies; only a layout with no unit stride
is copied first.
"""

from __future__ import annotations

import math
import os
import threading

from tensorplay._kernels import cublaslt as _cublaslt
from tensorplay._driver.context import get_device_capability

_lock = threading.Lock()
_state = {"version": None, "error": None}
_tls = threading.local()

# float32 matmul precision, as torch.set_float32_matmul_precision: "highest"
# (full float32, the default) or "high"/"medium" (TF32 tensor cores)
_precision = {"float32": "highest"}
PRECISIONS = ("highest", "high", "medium")

MISSING = ("matmul on CUDA tensors needs cuBLASLt from the nvidia-cublas wheel, which could not be "
           "loaded ({reason}); install it with: pip install 'nvidia-cublas>=13,<14'")


class CublasUnavailableError(RuntimeError):
    """The cuBLASLt library (the nvidia-cublas wheel) could not be loaded."""


CublasUnavailableError.__module__ = "tensorplay.cuda"


def _load_library():
    """cuda.pathfinder's LoadedDL of libcublasLt (a seam for tests)."""
    from cuda.pathfinder import load_nvidia_dynamic_lib
    return load_nvidia_dynamic_lib("cublasLt")


def ensure_loaded():
    """Load and bind cuBLASLt once; CublasUnavailableError when it is missing."""
    if _state["version"] is not None:
        return _state["version"]
    with _lock:
        if _state["version"] is None:
            if _state["error"] is not None:
                raise CublasUnavailableError(_state["error"])
            try:
                lib = _load_library()
                version = _cublaslt.bind(lib._handle_uint)
            except Exception as exc:      # pathfinder's not-found errors, a too old library
                _state["error"] = MISSING.format(reason=f"{type(exc).__name__}: {exc}")
                raise CublasUnavailableError(_state["error"]) from None
            if version < 130000:
                _state["error"] = MISSING.format(reason=f"found cuBLASLt {version}, too old")
                raise CublasUnavailableError(_state["error"])
            _state["version"] = version
    return _state["version"]


def version():
    """cublasLtGetVersion() of the loaded library (e.g. 130100), loading it."""
    return ensure_loaded()


def workspace_limit(device):
    """Workspace bytes per stream: PyTorch's default (32 MiB on compute
    capability 9.0 and newer, 4 MiB before), or TENSORPLAY_CUBLASLT_WORKSPACE_SIZE
    in KiB as PyTorch's CUBLASLT_WORKSPACE_SIZE."""
    env = os.environ.get("TENSORPLAY_CUBLASLT_WORKSPACE_SIZE")
    if env:
        try:
            kib = int(env)
        except ValueError:
            raise ValueError(f"TENSORPLAY_CUBLASLT_WORKSPACE_SIZE must be an integer (KiB), got {env!r}") from None
        if kib < 0:
            raise ValueError(f"TENSORPLAY_CUBLASLT_WORKSPACE_SIZE must be >= 0, got {kib}")
        return kib * 1024
    limits = tls_dict("limits")
    n = limits.get(device)
    if n is None:
        major, _ = get_device_capability(device)
        n = limits[device] = (32 << 20) if major >= 9 else (4 << 20)
    return n


def tls_dict(name):
    """This thread's dict ``name`` (made on first use): per-thread caches of handles, plans and recipes."""
    d = getattr(_tls, name, None)
    if d is None:
        d = {}
        setattr(_tls, name, d)
    return d


def handle(device):
    """This thread's cuBLASLt handle for ``device``."""
    handles = tls_dict("handles")
    h = handles.get(device)
    if h is None:
        ensure_loaded()
        h = handles[device] = _cublaslt.Handle(device)
    return h


_MAX_PLANS = 1024


def plan(key, device, make):
    """This thread's plan for problem ``key``; ``make(handle)`` builds it (the
    heuristic query) the first time. Plans are per thread: a call sets the bias
    pointer on its descriptor."""
    plans = tls_dict("plans")
    p = plans.get(key)
    if p is None:
        if len(plans) >= _MAX_PLANS:
            plans.clear()
        p = plans[key] = make(handle(device))
    return p


def pointer_alignment(ptr: int) -> int:
    """The largest power of two up to 16 dividing ``ptr`` (cuBLASLt's
    MIN_ALIGNMENT preferences)."""
    if ptr % 16 == 0:
        return 16
    return ptr & -ptr


# ------------------------------------------------------------------ layouts

def as_column_major(rows, cols, row_stride, col_stride):
    """A logical rows x cols matrix with these element strides as cuBLASLt sees
    it: ``(transposed, ld)`` such that op(stored) is the matrix, the stored one
    being column-major (rows x cols, ``transposed`` False) or the row-major
    memory read as its transpose (cols x rows, True); None when no unit stride
    allows either (the caller copies the operand)."""
    if (row_stride == 1 or rows == 1) and (col_stride >= rows or cols == 1) and col_stride > 0:
        return False, max(col_stride if cols > 1 else rows, 1)
    if (col_stride == 1 or cols == 1) and (row_stride >= cols or rows == 1) and row_stride > 0:
        return True, max(row_stride if rows > 1 else cols, 1)
    if rows == 1 and cols == 1:
        return False, 1
    return None


def output_layout(M, N, d_strides, row_major_d=False):
    """How cuBLASLt writes ``D`` (M x N, (row, column) strides): ``(True, ld)``
    row-major (computed as D^T), ``(False, ld)`` column-major, or None when
    it can't (no unit stride, or not row-major while ``row_major_d`` asks)."""
    d_row = as_column_major(N, M, d_strides[1], d_strides[0])     # D^T column-major
    if d_row is not None and not d_row[0]:
        return True, d_row[1]
    if row_major_d:
        return None
    return as_column_major(M, N, d_strides[0], d_strides[1])


def output_batch_stride(shape, strides):
    """The one batch stride of an output's batch dimensions, or None when they
    don't collapse or would overlap (a zero stride over more than one matrix)."""
    stride = collapse_batch(shape, strides)
    if stride is None or (stride == 0 and math.prod(shape) > 1):
        return None
    return stride


def gemm_layout(M, N, K, a_strides, b_strides, d_strides, row_major_d=False):
    """cuBLASLt's view of ``D (M x N) = A (M x K) @ B (K x N)`` given each
    matrix's (row, column) strides in elements.

    Returns a dict with ``swap`` (operands given to cuBLASLt as (B, A): D is
    row-major and cuBLASLt computes D^T = B^T A^T, as PyTorch calls it),
    ``m, n, k``, ``trans_a, trans_b, lda, ldb, ldd``; or None when D's layout
    has no unit stride (or is not row-major while ``row_major_d`` asks for it:
    a bias epilogue runs along cuBLASLt's m). An operand whose layout cuBLASLt
    can't take is named in ``copy`` ('a', 'b') and must be made contiguous
    (its entries then assume that)."""
    d_layout = output_layout(M, N, d_strides, row_major_d)
    if d_layout is None:
        return None
    d_transposed, ldd = d_layout
    copy = []
    if d_transposed:
        # D is row-major: D^T (N x M, column-major) = B^T (N x K) @ A^T (K x M)
        first = as_column_major(N, K, b_strides[1], b_strides[0])
        if first is None:
            copy.append("b")
            first = as_column_major(N, K, 1, N)
        second = as_column_major(K, M, a_strides[1], a_strides[0])
        if second is None:
            copy.append("a")
            second = as_column_major(K, M, 1, K)
        m, n = N, M
    else:
        first = as_column_major(M, K, a_strides[0], a_strides[1])
        if first is None:
            copy.append("a")
            first = as_column_major(M, K, K, 1)
        second = as_column_major(K, N, b_strides[0], b_strides[1])
        if second is None:
            copy.append("b")
            second = as_column_major(K, N, N, 1)
        m, n = M, N
    return {"swap": d_transposed, "m": m, "n": n, "k": K, "trans_a": first[0], "lda": first[1],
            "trans_b": second[0], "ldb": second[1], "ldd": ldd, "copy": tuple(sorted(copy))}


def collapse_batch(shape, strides):
    """One stride for batch dimensions ``shape`` with ``strides`` (0 where
    broadcast), or None when they don't collapse into one."""
    stride = None
    run = None         # stride the next dimension must have
    for size, st in zip(reversed(shape), reversed(strides)):
        if size == 1:
            continue
        if stride is None:
            stride, run = st, st * size
        elif st == run or (st == 0 and stride == 0):
            run = st * size
        else:
            return None
    return 0 if stride is None else stride


# ------------------------------------------------------------------ precision

def tf32_allowed():
    return _precision["float32"] != "highest"


def set_float32_matmul_precision(precision):
    """Set float32 matrix product precision: ``"highest"`` (full float32, the
    default, as in PyTorch), ``"high"`` or ``"medium"`` (TF32 tensor cores)."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(map(repr, PRECISIONS))}, got {precision!r}")
    _precision["float32"] = precision


def get_float32_matmul_precision():
    """The float32 matmul precision: ``"highest"``, ``"high"`` or ``"medium"``."""
    return _precision["float32"]
