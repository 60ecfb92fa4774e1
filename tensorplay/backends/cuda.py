# SPDX-License-Identifier: Apache-2.0
"""CUDA backend switches: ``tensorplay.backends.cuda.matmul.allow_tf32`` and
``tensorplay.backends.cuda.pdl.enabled``."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from tensorplay._driver import launch as _launch
from tensorplay._ops import blas as _blas

__all__ = ["matmul", "pdl"]


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


class _PDLSettings:
    """Programmatic dependent launch (``tensorplay.backends.cuda.pdl``).

    On sm_90 and newer GPUs, tensorplay's own kernels open by waiting for the
    kernels before them (``griddepcontrol.wait``) and launch with
    programmatic stream serialization, so each may start while the one
    before it drains; in a captured graph the edge between two such kernels
    is programmatic (``describe()`` lists it). ``enabled = False`` launches
    them as plain launches again, for comparison or as a safety valve; the
    environment variable ``TENSORPLAY_PDL=0`` does so from the start. It is
    read at each launch: a graph keeps the edges its capture made.
    """

    __slots__ = ()

    @property
    def enabled(self) -> bool:
        """Whether the kernels that wait on their grid dependency launch with
        programmatic stream serialization (default True)."""
        return _launch.pdl_enabled()

    @enabled.setter
    def enabled(self, value: bool) -> None:
        if not isinstance(value, bool):
            raise TypeError(f"pdl.enabled must be a bool, got {type(value).__name__}")
        _launch.set_pdl_enabled(value)

    @contextlib.contextmanager
    def flags(self, enabled: bool) -> Iterator[None]:
        """Set :attr:`enabled` inside a ``with`` block and restore it after."""
        before = self.enabled
        self.enabled = enabled
        try:
            yield
        finally:
            _launch.set_pdl_enabled(before)

    def __setattr__(self, name, value):
        if name != "enabled":
            raise AttributeError(f"tensorplay.backends.cuda.pdl has no setting {name!r}")
        object.__setattr__(self, name, value)

    def __repr__(self) -> str:
        return f"tensorplay.backends.cuda.pdl(enabled={self.enabled})"


pdl = _PDLSettings()
