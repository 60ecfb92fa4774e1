# SPDX-License-Identifier: Apache-2.0
"""What runs without a GPU of the cuBLASLt path: layouts as cuBLASLt sees
them, the batch stride, alignment, the loader and its error, the precision
switches, and addmm / linear on CPU tensors against NumPy."""

import numpy as np
import pytest

import tensorplay as tp
from helpers import activation_reference
from tensorplay._ops import blas as _blas
from tensorplay._ops import linalg as _linalg


# ------------------------------------------------------------------ layouts

def test_column_major_view_of_strided_matrices():
    # row-major 3x4 (strides 4, 1) is column-major 4x3 read transposed
    assert _blas.as_column_major(3, 4, 4, 1) == (True, 4)
    # column-major 3x4 (strides 1, 3)
    assert _blas.as_column_major(3, 4, 1, 3) == (False, 3)
    # a padded row pitch is the leading dimension
    assert _blas.as_column_major(3, 4, 10, 1) == (True, 10)
    # rows closer than a row's length overlap: no layout
    assert _blas.as_column_major(3, 4, 2, 1) is None
    # no unit stride (a[:, ::2])
    assert _blas.as_column_major(3, 4, 8, 2) is None
    # a single row or column takes any stride along its length... and
    # a broadcast dimension (stride 0 along a size > 1) is not a layout
    assert _blas.as_column_major(1, 5, 7, 1) is not None
    assert _blas.as_column_major(5, 1, 1, 99) == (False, 5)
    assert _blas.as_column_major(3, 4, 1, 0) is None


def test_contiguous_product_is_swapped_as_pytorch_calls_it():
    # D (M x N) = A (M x K) @ B (K x N), all row-major: D^T = B^T A^T
    lay = _blas.gemm_layout(64, 32, 16, (16, 1), (32, 1), (32, 1))
    assert lay == {"swap": True, "m": 32, "n": 64, "k": 16, "trans_a": False, "lda": 32,
                   "trans_b": False, "ldb": 16, "ldd": 32, "copy": ()}


def test_transposed_operands_pass_as_layouts():
    M, N, K = 64, 32, 16
    # A given as a transposed view of a (K, M) row-major array: strides (1, M)
    lay = _blas.gemm_layout(M, N, K, (1, M), (N, 1), (N, 1))
    assert lay["copy"] == () and lay["trans_b"] is True and lay["ldb"] == M
    # B as a transposed view of (N, K): strides (1, K), as linear's weight.T
    lay = _blas.gemm_layout(M, N, K, (K, 1), (1, K), (N, 1))
    assert lay["copy"] == () and lay["trans_a"] is True and lay["lda"] == K


def test_column_major_output_is_written_without_swap():
    M, N, K = 8, 6, 4
    lay = _blas.gemm_layout(M, N, K, (K, 1), (N, 1), (1, M))
    assert lay["swap"] is False and lay["ldd"] == M and lay["m"] == M and lay["n"] == N
    assert lay["trans_a"] is True and lay["lda"] == K
    # a bias epilogue runs along cuBLASLt's m: it needs the row-major output
    assert _blas.gemm_layout(M, N, K, (K, 1), (N, 1), (1, M), row_major_d=True) is None


def test_layouts_without_unit_stride():
    M, N, K = 8, 6, 4
    assert _blas.gemm_layout(M, N, K, (K, 1), (N, 1), (2 * N, 2)) is None
    lay = _blas.gemm_layout(M, N, K, (2 * K, 2), (N, 1), (N, 1))
    assert lay["copy"] == ("a",) and lay["ldb"] == K     # A^T of a dense copy
    lay = _blas.gemm_layout(M, N, K, (2 * K, 2), (1, 0), (N, 1))
    assert lay["copy"] == ("a", "b")


def test_gemv_shapes():
    # x (1, K) @ W (K, N): m = N, n = 1
    lay = _blas.gemm_layout(1, 4096, 4096, (4096, 1), (4096, 1), (4096, 1))
    assert lay["swap"] and lay["m"] == 4096 and lay["n"] == 1 and lay["copy"] == ()
    # W (M, K) @ v (K, 1)
    lay = _blas.gemm_layout(4096, 1, 4096, (4096, 1), (1, 1), (1, 1))
    assert lay is not None and lay["copy"] == ()


def test_batch_stride_collapse():
    assert _blas.collapse_batch((), ()) == 0
    assert _blas.collapse_batch((5,), (12,)) == 12
    assert _blas.collapse_batch((2, 3), (36, 12)) == 12
    assert _blas.collapse_batch((2, 3), (0, 0)) == 0          # broadcast
    assert _blas.collapse_batch((2, 1, 3), (36, 99, 12)) == 12  # size-1 dims don't count
    assert _blas.collapse_batch((2, 3), (12, 36)) is None      # not one stride
    assert _blas.collapse_batch((2, 3), (12, 0)) is None       # broadcast inside a batch


def test_alignment_and_workspace_limit(monkeypatch):
    assert _blas.pointer_alignment(0x1000) == 16
    assert _blas.pointer_alignment(0x1004) == 4
    assert _blas.pointer_alignment(0x1002) == 2
    assert _linalg._alignment(0x1000, 2, 7, 0) == 2            # odd leading dimension of halves
    assert _linalg._alignment(0x1000, 4, 1024, 4096) == 16
    monkeypatch.setenv("TENSORPLAY_CUBLASLT_WORKSPACE_SIZE", "1024")
    assert _blas.workspace_limit(0) == 1 << 20
    monkeypatch.setenv("TENSORPLAY_CUBLASLT_WORKSPACE_SIZE", "lots")
    with pytest.raises(ValueError, match="TENSORPLAY_CUBLASLT_WORKSPACE_SIZE must be an integer"):
        _blas.workspace_limit(0)
    monkeypatch.setenv("TENSORPLAY_CUBLASLT_WORKSPACE_SIZE", "-1")
    with pytest.raises(ValueError, match=">= 0"):
        _blas.workspace_limit(0)


# ------------------------------------------------------------------ loading

def test_cublaslt_loads_from_the_nvidia_cublas_wheel():
    # the library loads (and binds) without a GPU
    assert _blas.version() >= 130000


def test_missing_library_names_the_package(monkeypatch):
    def missing():
        raise RuntimeError("libcublasLt.so.13 not found")
    monkeypatch.setattr(_blas, "_state", {"version": None, "error": None})
    monkeypatch.setattr(_blas, "_load_library", missing)
    for _ in range(2):          # the failure is remembered, with the same message
        with pytest.raises(tp.cuda.CublasUnavailableError,
                           match=r"nvidia-cublas.*pip install 'nvidia-cublas>=13,<14'") as info:
            _blas.ensure_loaded()
        assert "libcublasLt.so.13 not found" in str(info.value)
    assert issubclass(tp.cuda.CublasUnavailableError, RuntimeError)


def test_cublas_error_carries_the_status_name():
    from tensorplay._kernels.cublaslt import CublasError
    e = CublasError(15, "cublasLtMatmul")
    assert e.status == 15 and e.name == "CUBLAS_STATUS_NOT_SUPPORTED" and e.call == "cublasLtMatmul"
    assert "CUBLAS_STATUS_NOT_SUPPORTED" in str(e) and "cublasLtMatmul" in str(e)
    assert tp.cuda.CublasError is CublasError and issubclass(CublasError, RuntimeError)


# ------------------------------------------------------------------ precision

def test_tf32_switches_mirror_each_other():
    assert tp.get_float32_matmul_precision() == "highest"
    assert tp.backends.cuda.matmul.allow_tf32 is False
    try:
        tp.backends.cuda.matmul.allow_tf32 = True
        assert tp.get_float32_matmul_precision() == "high" and _blas.tf32_allowed()
        tp.set_float32_matmul_precision("medium")
        assert tp.backends.cuda.matmul.allow_tf32 is True
        tp.set_float32_matmul_precision("highest")
        assert tp.backends.cuda.matmul.allow_tf32 is False
    finally:
        tp.set_float32_matmul_precision("highest")
    with pytest.raises(ValueError, match="'highest', 'high', 'medium'"):
        tp.set_float32_matmul_precision("low")
    with pytest.raises(TypeError, match="must be a bool"):
        tp.backends.cuda.matmul.allow_tf32 = 1
    with pytest.raises(AttributeError, match="no setting 'allow_fp16'"):
        tp.backends.cuda.matmul.allow_fp16 = True


# ------------------------------------------------------------------ CPU values

@pytest.mark.parametrize("activation", [None, "relu", "gelu"])
@pytest.mark.parametrize("bias_shape", [(5,), (1, 5), (3, 1), (3, 5), ()])
def test_addmm_on_cpu(rng, activation, bias_shape):
    a, b = rng.standard_normal((3, 4)), rng.standard_normal((4, 5))
    bias = rng.standard_normal(bias_shape)
    got = tp.addmm(tp.tensor(bias), tp.tensor(a), tp.tensor(b), beta=0.5, alpha=2.0, activation=activation)
    np.testing.assert_allclose(got.numpy(), activation_reference(0.5 * bias + 2.0 * (a @ b), activation), rtol=1e-12)
    assert tp.tensor(bias).addmm(tp.tensor(a), tp.tensor(b)).shape == (3, 5)


def test_linear_on_cpu(rng):
    x, w, bias = rng.standard_normal((2, 3, 4)), rng.standard_normal((5, 4)), rng.standard_normal(5)
    got = tp.linear(tp.tensor(x), tp.tensor(w), tp.tensor(bias), activation="relu")
    assert got.shape == (2, 3, 5)
    np.testing.assert_allclose(got.numpy(), np.maximum(x @ w.T + bias, 0), rtol=1e-12)
    np.testing.assert_allclose(tp.linear(tp.tensor(x[0, 0]), tp.tensor(w)).numpy(), x[0, 0] @ w.T, rtol=1e-12)


def test_matmul_batch_broadcast_on_cpu(rng):
    a, b = rng.standard_normal((2, 1, 3, 4)), rng.standard_normal((5, 4, 2))
    np.testing.assert_allclose(tp.matmul(tp.tensor(a), tp.tensor(b)).numpy(), a @ b, rtol=1e-12)


def test_product_errors():
    f32 = tp.ones(3, 4)
    with pytest.raises(TypeError, match="not int32"):
        tp.matmul(tp.ones(2, 3, dtype=tp.int32), tp.ones(3, 2, dtype=tp.int32))
    with pytest.raises(TypeError, match="one dtype"):
        tp.matmul(f32, tp.ones(4, 2, dtype=tp.float64))
    with pytest.raises(ValueError, match=r"do not align \(4 != 3\)"):
        tp.matmul(f32, f32)
    with pytest.raises(ValueError, match="batch dimensions"):
        tp.matmul(tp.ones(2, 3, 4), tp.ones(3, 4, 2))
    with pytest.raises(ValueError, match="at least 1 dimension"):
        tp.matmul(tp.tensor(1.0), f32)
    with pytest.raises(ValueError, match="out must be a float32 tensor of shape"):
        tp.matmul(f32, tp.ones(4, 2), out=tp.empty(3, 3))
    with pytest.raises(ValueError, match="does not broadcast"):
        tp.addmm(tp.ones(4), f32, tp.ones(4, 2))
    with pytest.raises(ValueError, match="activation must be None, 'relu' or 'gelu'"):
        tp.addmm(tp.ones(2), f32, tp.ones(4, 2), activation="tanh")
    with pytest.raises(ValueError, match="does not match weight"):
        tp.linear(f32, tp.ones(2, 3))
    with pytest.raises(ValueError, match="bias must have shape"):
        tp.linear(f32, tp.ones(2, 4), tp.ones(3))
    with pytest.raises(TypeError, match="expects tensors"):
        tp.matmul(f32, np.ones((4, 2)))
