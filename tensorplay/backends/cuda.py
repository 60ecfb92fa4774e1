# SPDX-License-Identifier: Apache-2.0
"""CUDA backend switches: ``tensorplay.backends.cuda.matmul.allow_tf32``."""

from __future__ import annotations

from tensorplay._ops import blas as _blas

__all__ = ["matmul"]


class _MatmulSettings:
    """Settings of CUDA matrix products (``tensorplay.backends.cuda.matmul``)."""

    __slots__ = ()

    @property
    def allow_tf32(self) -> bool:
        """Whether float32 products may use TF32 tensor cores (default False,
        as in PyTorch). Setting it is ``set_float32_matmul_precision("high")``
        (True) or ``("highest")`` (False)."""
        return _blas.tf32_allowed()

    @allow_tf32.setter
    def allow_tf32(self, value: bool) -> None:
        if not isinstance(value, bool):
            raise TypeError(f"allow_tf32 must be a bool, got {type(value).__name__}")
        _blas.set_float32_matmul_precision("high" if value else "highest")

    def __setattr__(self, name, value):
        if name != "allow_tf32":
            raise AttributeError(f"tensorplay.backends.cuda.matmul has no setting {name!r}")
        object.__setattr__(self, name, value)

    def __repr__(self) -> str:
        return f"tensorplay.backends.cuda.matmul(allow_tf32={self.allow_tf32})"


matmul = _MatmulSettings()
