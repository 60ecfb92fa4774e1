# SPDX-License-Identifier: Apache-2.0
"""The public memory functions (``tensorplay.cuda.empty_cache``,
``memory_stats``, ``memory_allocated``, ``graph_pool_handle``, ...) over the
caching allocator of each device, and ``allocator(device)``, the
DeviceAllocator itself for the graph layer, the matrix products and tests.

Without CUDA the statistics read as those of an allocator that never
allocated (``memory_stats()`` is ``{}``, the counters 0) and
``empty_cache`` and ``reset_peak_memory_stats`` do nothing, as PyTorch's
before CUDA is initialised: code that reports memory runs on any machine.
``graph_pool_handle`` raises CudaUnavailableError: a pool is device memory.
"""

from tensorplay._driver.context cimport checked_device_count, open_capture_count
from tensorplay._memory.allocator cimport DeviceAllocator, device_allocators, get_allocator
from tensorplay._memory.pool cimport ALL

from tensorplay._driver.context import CudaUnavailableError, is_available
from tensorplay._memory.allocator import PoolAsleepError, is_sleepable, make_sleepable
from tensorplay._driver.context import device_index as _device_index

import itertools

cdef object _pool_ids = itertools.count(1)


cdef DeviceAllocator _allocator_or_none(object device):
    """``device``'s allocator, or None when CUDA is not available (the
    statistics of an allocator that never allocated). A device that is no
    CUDA device ('cpu', a bad string) raises all the same."""
    try:
        d = _device_index(device)
    except CudaUnavailableError:
        if is_available():
            raise               # usable, but not here: a forked child
        return None
    return get_allocator(d)


def graph_pool_handle(sleepable=False):
    """Return a new memory pool id, for graphs that share one pool.

    Pass it as ``pool=`` to :meth:`CUDAGraph.capture_begin` or
    :class:`graph`; graphs sharing a pool must replay in capture order.
    Without CUDA it raises :class:`CudaUnavailableError`: a pool holds
    device memory.

    Parameters
    ----------
    sleepable : bool, optional
        Build the pool from address-reserved segments whose physical memory
        :func:`sleep_pool` gives back and :func:`wake_pool` maps again at
        the same addresses (see :class:`tensorplay.cuda.GraphPool`).
    """
    checked_device_count()
    pid = next(_pool_ids)
    if sleepable:
        make_sleepable(pid)
    return pid


def sleep_pool(long long pool_id):
    """Give the physical memory of a sleepable pool back to every device
    it holds memory on, keeping its addresses; return the bytes given back.
    Graphs captured into it stay instantiated; their replays raise
    :class:`PoolAsleepError` until :func:`wake_pool`. Contents are lost."""
    if not is_sleepable(pool_id):
        raise ValueError(f"memory pool {pool_id} cannot sleep: it was made without sleepable segments "
                         f"(use tensorplay.cuda.GraphPool(sleepable=True) or graph_pool_handle(sleepable=True))")
    if open_capture_count() > 0:
        raise RuntimeError(f"sleep: a CUDA graph capture is under way; memory pool {pool_id} can sleep once "
                           f"it ends (unmapping memory would invalidate the capture)")
    total = 0
    for a in device_allocators():
        if (<DeviceAllocator>a).pools.get(pool_id) is not None:
            total += (<DeviceAllocator>a).sleep_pool(pool_id)
    return total


def wake_pool(long long pool_id):
    """Map new physical memory under a sleeping pool's addresses on every
    device; return the bytes mapped (see :func:`sleep_pool`)."""
    total = 0
    for a in device_allocators():
        total += (<DeviceAllocator>a).wake_pool(pool_id)
    return total


def pool_asleep(long long pool_id):
    """Whether pool ``pool_id`` is asleep on any device."""
    for a in device_allocators():
        p = (<DeviceAllocator>a).pools.get(pool_id)
        if p is not None and p.asleep:
            return True
    return False


def allocator(device=None):
    """The DeviceAllocator of ``device`` (default: current)."""
    return get_allocator(_device_index(device))


def empty_cache(device=None):
    """Release every cached, unused segment back to the device (cuMemFree).

    Memory of a private pool still held by a graph, and memory under live
    tensors, is kept. Not allowed while a graph capture is under way.
    Without CUDA there is nothing to release: it does nothing.

    Parameters
    ----------
    device : device, str, int or None, optional
        The device; default every device the allocator has used.
    """
    if open_capture_count() > 0:
        raise RuntimeError("empty_cache() cannot run while a CUDA graph capture is under way")
    if device is None:
        for each in device_allocators():
            (<DeviceAllocator>each).release_cached()
        return
    cdef DeviceAllocator a = _allocator_or_none(device)
    if a is not None:
        a.release_cached()


def memory_stats(device=None):
    """Return the caching allocator's counters for ``device`` as a dict.

    The keys are PyTorch's (``allocated_bytes.all.current``,
    ``segment.large_pool.peak``, ``num_alloc_retries``, ...), plus
    ``pool.<id>.reserved_bytes`` and the like per graph pool. Without CUDA
    an empty dict, as PyTorch's before CUDA is initialised.

    Parameters
    ----------
    device : device, str, int or None, optional
        Default the current device.
    """
    cdef DeviceAllocator a = _allocator_or_none(device)
    return {} if a is None else a.stats()


def memory_snapshot(device=None):
    """Return every segment of ``device``'s allocator with its blocks, as ``torch.cuda.memory_snapshot``.

    Each segment is a dict (its address, ``total_size``, ``segment_pool_id``
    and its ``blocks``, each with ``size`` and ``state``). Without CUDA an
    empty list.

    Parameters
    ----------
    device : device, str, int or None, optional
        Default the current device.
    """
    cdef DeviceAllocator a = _allocator_or_none(device)
    return [] if a is None else a.snapshot()


def memory_allocated(device=None):
    """Return the bytes held by live tensors on ``device`` (rounded to the allocator's granularity).

    0 without CUDA, as PyTorch's before CUDA is initialised.

    Parameters
    ----------
    device : device, str, int or None, optional
        Default the current device.
    """
    cdef DeviceAllocator a = _allocator_or_none(device)
    return 0 if a is None else a.allocated


def max_memory_allocated(device=None):
    """Return the peak of :func:`memory_allocated` since the start or :func:`reset_peak_memory_stats`.

    0 without CUDA.

    Parameters
    ----------
    device : device, str, int or None, optional
        Default the current device.
    """
    cdef DeviceAllocator a = _allocator_or_none(device)
    return 0 if a is None else a.st_allocated_bytes[ALL].peak


def memory_reserved(device=None):
    """Return the bytes the caching allocator holds from ``device`` (its cuMemAlloc'd segments).

    0 without CUDA, as PyTorch's before CUDA is initialised.

    Parameters
    ----------
    device : device, str, int or None, optional
        Default the current device.
    """
    cdef DeviceAllocator a = _allocator_or_none(device)
    return 0 if a is None else a.reserved


def max_memory_reserved(device=None):
    """Return the peak of :func:`memory_reserved` since the start or :func:`reset_peak_memory_stats`.

    0 without CUDA.

    Parameters
    ----------
    device : device, str, int or None, optional
        Default the current device.
    """
    cdef DeviceAllocator a = _allocator_or_none(device)
    return 0 if a is None else a.st_reserved_bytes[ALL].peak


def reset_peak_memory_stats(device=None):
    """Set every peak counter of ``device``'s allocator to its current value.

    Without CUDA every counter is 0 already: it does nothing.

    Parameters
    ----------
    device : device, str, int or None, optional
        Default the current device.
    """
    cdef DeviceAllocator a = _allocator_or_none(device)
    if a is not None:
        a.reset_peak_stats()
