# SPDX-License-Identifier: Apache-2.0
"""The protocols of other libraries' stream objects that tensorplay takes
where it takes a stream (``tensorplay.types`` publishes them). Kept at the
driver floor, without the Stream class, so that the driver's own type stubs
can name them."""

from __future__ import annotations

from typing import Protocol

__all__ = ["HasCudaStream", "SupportsCudaStream"]


class SupportsCudaStream(Protocol):
    """An object exporting a CUDA stream through the CUDA stream protocol
    (``__cuda_stream__() -> (version, handle)``), as ``cuda.core`` streams do."""

    def __cuda_stream__(self) -> tuple[int, int]:
        """Return ``(version, handle)``: the protocol version (0) and the ``CUstream``."""
        ...


class HasCudaStream(Protocol):
    """An object holding a CUDA stream handle in a ``cuda_stream`` attribute,
    as ``torch.cuda.Stream`` does."""

    @property
    def cuda_stream(self) -> int:
        """The ``CUstream`` handle as an int."""
        ...
