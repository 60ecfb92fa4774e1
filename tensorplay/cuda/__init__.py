# SPDX-License-Identifier: Apache-2.0
"""CUDA devices, streams, events and memory: ``tensorplay.cuda``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..types import DeviceLike

from .._kernels import nvrtc as _nvrtc
from .._cublaslt import CublasError
from .._ops._blas import CublasUnavailableError
from .._alloc import (empty_cache, graph_pool_handle, max_memory_allocated, max_memory_reserved,
                      memory_allocated, memory_reserved, memory_snapshot, memory_stats,
                      reset_peak_memory_stats)
from .._cuda import (CudaError, CudaUnavailableError, OutOfMemoryError, can_device_access_peer,
                     disable_peer_access, enable_peer_access,
                     current_device, device_count, driver_version, get_device_capability,
                     get_device_name, get_device_properties, is_available, is_device_supported, mem_get_info,
                     set_device, unavailable_reason)
from .._cuda import device_index as _device_index, live_counts as _live_counts, synchronize as _synchronize_context
from .._stream import (Event, ExternalStream, Stream, current_stream, default_stream, set_stream,
                       stream)
from .._stream import cached_stream_count as _cached_stream_count
from .._tensor import run_device_error_checks as _run_device_error_checks

from ._custom import ElementwiseKernel, RawKernel
from ._memory import memory_summary
from .graphs import CUDAGraph, graph, is_current_stream_capturing, make_graphed_callables
from .random import default_generators, get_rng_state, initial_seed, manual_seed, manual_seed_all, set_rng_state


def live_driver_objects(device: DeviceLike = None) -> dict[str, int]:
    """Count the driver objects tensorplay created and has not destroyed.

    For leak checks: after ``gc.collect()`` and :func:`empty_cache` the
    counts return to what they were before the work (the stream cache only
    grows to the most streams alive at once).

    Parameters
    ----------
    device : device, str, int or None, optional
        The device whose allocator is asked about pending events; default
        the current device.

    Returns
    -------
    dict of str to int
        ``streams`` held by Stream objects, ``cached_streams`` kept for reuse
        (never destroyed, as in PyTorch), ``events``, ``graphs`` and
        ``execs`` (CUgraph and CUgraphExec handles), ``modules`` (loaded
        CUmodules) and, with a GPU, ``allocator_events``: the allocator's
        pending ``record_stream`` events on ``device``.
    """
    out = _live_counts()
    out["cached_streams"] = _cached_stream_count()
    if is_available():
        out["allocator_events"] = memory_stats(device)["pending_events"]
    return out


def kernel_cache_dir() -> str:
    """Return the folder holding the compiled kernels (CUBIN).

    ``$TENSORPLAY_CACHE_DIR/kernels``, else ``$XDG_CACHE_HOME/tensorplay/kernels``,
    else ``~/.cache/tensorplay/kernels``; read from the environment at each call.
    """
    return _nvrtc.cache_dir()


def kernel_cache_info() -> dict[str, Any]:
    """Return the kernel cache's state: ``path`` (:func:`kernel_cache_dir`),
    ``files`` and ``bytes`` on disk, and this process's counts of NVRTC
    compilations (``compiled``) and cache hits (``memory_hits``, ``disk_hits``)."""
    return _nvrtc.cache_info()


def clear_kernel_cache() -> dict[str, Any]:
    """Delete the compiled kernels on disk and in memory, so the next use of
    each op compiles again; return the ``path``, ``files`` and ``bytes`` removed.

    Only the files tensorplay writes are removed. Kernels already loaded into a
    device keep working; works without a GPU.
    """
    return _nvrtc.clear_cache()


def synchronize(device: DeviceLike = None) -> None:
    """Wait for all work on ``device`` to finish, cuCtxSynchronize.

    Device-side index errors found by kernels since the last check are
    raised here, as IndexError.

    Parameters
    ----------
    device : device, str, int or None, optional
        Default the current device.
    """
    _synchronize_context(device)
    _run_device_error_checks(_device_index(device))


__all__ = ["make_graphed_callables", "CUDAGraph", "ElementwiseKernel", "RawKernel", "graph", "is_current_stream_capturing",
    "CublasError", "CublasUnavailableError", "CudaError", "CudaUnavailableError", "OutOfMemoryError", "Event", "ExternalStream", "Stream",
    "can_device_access_peer", "clear_kernel_cache", "current_device", "current_stream", "default_stream", "device",
    "disable_peer_access", "enable_peer_access",
    "device_count", "driver_version", "empty_cache", "get_device_capability", "get_device_name",
    "get_device_properties", "graph_pool_handle", "is_available", "is_device_supported", "kernel_cache_dir", "kernel_cache_info",
    "live_driver_objects", "max_memory_allocated",
    "max_memory_reserved", "mem_get_info", "memory_allocated", "memory_reserved", "memory_snapshot", "memory_stats", "memory_summary",
    "reset_peak_memory_stats", "set_device", "set_stream", "stream", "synchronize",
    "unavailable_reason",
    "default_generators", "get_rng_state", "initial_seed", "manual_seed", "manual_seed_all", "set_rng_state",
]


class device:
    """Make ``device`` this thread's current CUDA device inside a ``with`` block.

    The previous current device is restored on exit (cuCtxSetCurrent on the
    device's primary context). ``None`` or a CPU device does nothing, as in
    PyTorch.

    Parameters
    ----------
    device : device, str, int or None
        The CUDA device: an index, ``"cuda:1"`` or a :class:`tensorplay.device`.
    """

    def __init__(self, device: DeviceLike) -> None:
        self._index: int | None = None
        self._prev: int | None = None
        if device is None or (isinstance(device, str) and device == "cpu") or \
                getattr(device, "type", None) == "cpu":
            return
        self._index = _device_index(device)

    def __enter__(self) -> device:
        if self._index is not None:
            self._prev = current_device()
            set_device(self._index)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._index is not None:
            set_device(self._prev)
