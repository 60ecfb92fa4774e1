# SPDX-License-Identifier: Apache-2.0
"""Types for annotating code that uses tensorplay: ``tensorplay.types``.

These are the names the API reference's signatures and the type stubs use
for what a parameter accepts (a number, a device, a dtype, a size, a
stream). Use them in your own annotations::

    import tensorplay as tp
    from tensorplay.types import DeviceLike

    def ramp(n: int, device: DeviceLike = None) -> tp.Tensor:
        return tp.arange(n, device=device)
"""

from __future__ import annotations

from typing import Any, Literal, Protocol, TypeAlias, Union

from tensorplay._device import DeviceLike as _DeviceLike
from tensorplay._driver.stream import Stream
from tensorplay._driver.stream_protocols import HasCudaStream, SupportsCudaStream
from tensorplay._tensor import aliases as _aliases
from tensorplay._tensor.tensor import Tensor

__all__ = ["Activation", "CaptureErrorMode", "DTypeLike", "DeviceLike", "Dims", "HasCudaStream", "HasPoolId", "Number",
           "PoolLike", "Size", "StreamLike", "SupportsCudaArrayInterface", "SupportsCudaStream", "SupportsDLPack",
           "TensorLike", "TensorOrNumber"]

#: A Python scalar operand: ``bool``, ``int`` or ``float``.
Number: TypeAlias = _aliases.Number

#: An operand of the elementwise operations: a tensor or a Python scalar.
TensorOrNumber: TypeAlias = Union[Tensor, bool, int, float]

#: A device: a :class:`tensorplay.device`, a string (``"cpu"``, ``"cuda"``,
#: ``"cuda:1"``), a CUDA device index, or None (the default device).
DeviceLike: TypeAlias = _DeviceLike

#: A dtype: a :class:`tensorplay.dtype`, its name (``"float16"``), a NumPy
#: dtype, a Python type (``bool``, ``int``, ``float``), or None (the default).
DTypeLike: TypeAlias = _aliases.DTypeLike

#: A shape: one int or a sequence of ints.
Size: TypeAlias = _aliases.Size

#: The dimensions a reduction runs over: one, several, or None (all).
Dims: TypeAlias = _aliases.Dims


#: A stream: a :class:`tensorplay.cuda.Stream`, an object exporting one
#: (``__cuda_stream__`` or ``cuda_stream``, as cuda.core, CuPy and PyTorch
#: streams do), or a raw ``CUstream`` handle as an int.
StreamLike: TypeAlias = Union[Stream, SupportsCudaStream, HasCudaStream, int]

#: How strictly a capture guards against unsafe CUDA calls (CU_STREAM_CAPTURE_MODE_*):
#: ``"global"`` (any thread's unsafe call fails the capture), ``"thread_local"``
#: (only this thread's) or ``"relaxed"`` (no guard).
CaptureErrorMode: TypeAlias = Literal["global", "thread_local", "relaxed"]

#: The activation fused into a matrix product (:func:`tensorplay.linear`,
#: :func:`tensorplay.addmm`): ``"relu"``, ``"gelu"`` (the tanh approximation) or None.
Activation: TypeAlias = _aliases.Activation


class SupportsDLPack(Protocol):
    """Another library's array exporting DLPack (``__dlpack__`` and
    ``__dlpack_device__``), as PyTorch, CuPy and JAX arrays do."""

    def __dlpack__(self, *args: Any, **kwargs: Any) -> Any:
        """Export the array as a DLPack capsule."""
        ...

    def __dlpack_device__(self) -> Any:
        """Return the array's (device type, device index)."""
        ...


class SupportsCudaArrayInterface(Protocol):
    """Another library's CUDA array exporting ``__cuda_array_interface__``."""

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        """The array's description: shape, typestr, data pointer, strides."""
        ...


#: A tensor where the graph API takes one: a tensorplay tensor, or another
#: library's CUDA array (PyTorch, CuPy), used through its memory without a copy.
TensorLike: TypeAlias = Union[Tensor, SupportsDLPack, SupportsCudaArrayInterface]


class HasPoolId(Protocol):
    """An object owning a capture's memory pool, with its id in a ``pool_id``
    attribute, as a :class:`tensorplay.cuda.CUDAGraph` has."""

    @property
    def pool_id(self) -> int | None:
        """The pool's id, or None before anything was captured."""
        ...


#: The memory pool a capture allocates from: None (a fresh private pool), an
#: id from :func:`tensorplay.cuda.graph_pool_handle` or a graph's ``pool_id``,
#: or a :class:`tensorplay.cuda.CUDAGraph` whose pool is shared (typed as
#: :class:`HasPoolId`, so that this module need not import the graph layer).
PoolLike: TypeAlias = Union[HasPoolId, int, None]
