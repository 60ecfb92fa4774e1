# SPDX-License-Identifier: Apache-2.0
"""Segments whose physical memory can leave and come back at the same
addresses, over the driver's virtual memory management: an address range is
reserved once (cuMemAddressReserve) and physical memory is created and
mapped into it (cuMemCreate, cuMemMap, cuMemSetAccess). ``vmm_sleep`` unmaps
and releases the physical part of a pool's segments, keeping the addresses,
so graphs instantiated over them stay valid; ``vmm_wake`` maps new physical
memory at the same addresses. Contents do not survive a sleep.

The registry (address -> region) serves the caching allocator's sleepable
pools (tensorplay._memory.backend) and, through the exported C functions
``tensorplay_torch_malloc`` / ``tensorplay_torch_free`` (tp_export.hpp),
PyTorch's allocator for the MemPool of a sleepable pool: PyTorch asks for a
segment on the capturing stream, whose capture id names the pool
(``vmm_route``). Everything here runs without the GIL, so PyTorch may call
in while holding its allocator lock.
"""

from cuda.bindings cimport cydriver
from libc.string cimport memset
from libcpp.map cimport map as cmap
from libcpp.mutex cimport mutex
from libcpp.vector cimport vector
from cython.operator cimport dereference as deref, preincrement as preinc

from tensorplay._driver.context cimport MAX_DEVICES, ensure_context

cdef extern from "tp_export.hpp" nogil:
    ctypedef void* (*tp_alloc_hook)(size_t, int, void*)
    ctypedef void (*tp_free_hook)(void*, size_t, int, void*)
    void tp_install_hooks(tp_alloc_hook a, tp_free_hook f)


cdef struct Region:
    cydriver.CUdeviceptr ptr
    size_t size
    int device
    long long pool                            # -1: not a pool's (never slept)
    cydriver.CUmemGenericAllocationHandle handle
    bint mapped


cdef mutex _lock
cdef cmap[cydriver.CUdeviceptr, Region] _regions
cdef cmap[unsigned long long, long long] _capture_pools     # capture id -> sleepable pool
cdef size_t _granularity[MAX_DEVICES]
cdef signed char _supported[MAX_DEVICES]                    # 0 unknown, 1 yes, -1 no


cdef inline void _prop(cydriver.CUmemAllocationProp* prop, int device) noexcept nogil:
    memset(prop, 0, sizeof(cydriver.CUmemAllocationProp))
    prop.type = cydriver.CU_MEM_ALLOCATION_TYPE_PINNED
    prop.location.type = cydriver.CU_MEM_LOCATION_TYPE_DEVICE
    prop.location.id = device


cdef bint vmm_supported(int device) noexcept nogil:
    cdef cydriver.CUdevice dev
    cdef int value = 0
    if device < 0 or device >= MAX_DEVICES:
        return False
    if _supported[device] == 0:
        if cydriver.cuDeviceGet(&dev, device) != cydriver.CUDA_SUCCESS or cydriver.cuDeviceGetAttribute(
                &value, cydriver.CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, dev) \
                != cydriver.CUDA_SUCCESS:
            return False
        _supported[device] = 1 if value else -1
    return _supported[device] == 1


cdef cydriver.CUresult vmm_granularity(int device, size_t* granularity) noexcept nogil:
    cdef cydriver.CUmemAllocationProp prop
    cdef cydriver.CUresult r
    cdef size_t g = 0
    if device < 0 or device >= MAX_DEVICES:
        return cydriver.CUDA_ERROR_INVALID_DEVICE
    if _granularity[device] == 0:
        _prop(&prop, device)
        r = cydriver.cuMemGetAllocationGranularity(&g, &prop, cydriver.CU_MEM_ALLOC_GRANULARITY_MINIMUM)
        if r != cydriver.CUDA_SUCCESS:
            return r
        _granularity[device] = g
    granularity[0] = _granularity[device]
    return cydriver.CUDA_SUCCESS


cdef cydriver.CUresult _map(cydriver.CUdeviceptr ptr, size_t size, int device,
                            cydriver.CUmemGenericAllocationHandle* out) noexcept nogil:
    """Create ``size`` bytes of physical memory on ``device`` and map them
    read-write at ``ptr`` (undone on failure)."""
    cdef cydriver.CUmemAllocationProp prop
    cdef cydriver.CUmemAccessDesc access
    cdef cydriver.CUmemGenericAllocationHandle h
    cdef cydriver.CUresult r
    _prop(&prop, device)
    r = cydriver.cuMemCreate(&h, size, &prop, 0)
    if r != cydriver.CUDA_SUCCESS:
        return r
    r = cydriver.cuMemMap(ptr, size, 0, h, 0)
    if r != cydriver.CUDA_SUCCESS:
        cydriver.cuMemRelease(h)
        return r
    memset(&access, 0, sizeof(access))
    access.location = prop.location
    access.flags = cydriver.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
    r = cydriver.cuMemSetAccess(ptr, size, &access, 1)
    if r != cydriver.CUDA_SUCCESS:
        cydriver.cuMemUnmap(ptr, size)
        cydriver.cuMemRelease(h)
        return r
    out[0] = h
    return cydriver.CUDA_SUCCESS


cdef cydriver.CUresult _unmap(Region* reg) noexcept nogil:
    cdef cydriver.CUresult r = cydriver.cuMemUnmap(reg.ptr, reg.size)
    if r != cydriver.CUDA_SUCCESS:
        return r
    r = cydriver.cuMemRelease(reg.handle)
    reg.mapped = False
    reg.handle = 0
    return r


cdef cydriver.CUresult vmm_create(int device, size_t size, long long pool, cydriver.CUdeviceptr* out) noexcept nogil:
    """Reserve ``size`` bytes of addresses (a multiple of the granularity)
    and map physical memory of ``device`` there, registered under ``pool``."""
    cdef cydriver.CUdeviceptr ptr = 0
    cdef cydriver.CUresult r
    cdef Region reg
    r = cydriver.cuMemAddressReserve(&ptr, size, 0, 0, 0)
    if r != cydriver.CUDA_SUCCESS:
        return r
    r = _map(ptr, size, device, &reg.handle)
    if r != cydriver.CUDA_SUCCESS:
        cydriver.cuMemAddressFree(ptr, size)
        return r
    reg.ptr = ptr
    reg.size = size
    reg.device = device
    reg.pool = pool
    reg.mapped = True
    _lock.lock()
    _regions[ptr] = reg
    _lock.unlock()
    out[0] = ptr
    return cydriver.CUDA_SUCCESS


cdef cydriver.CUresult vmm_free(cydriver.CUdeviceptr ptr) noexcept nogil:
    """Unmap (when mapped) and release a region and its addresses."""
    cdef Region reg
    cdef cydriver.CUresult r = cydriver.CUDA_SUCCESS
    _lock.lock()
    it = _regions.find(ptr)
    if it == _regions.end():
        _lock.unlock()
        return cydriver.CUDA_ERROR_INVALID_VALUE
    reg = deref(it).second
    _regions.erase(it)
    _lock.unlock()
    if reg.mapped:
        r = _unmap(&reg)
    if r == cydriver.CUDA_SUCCESS:
        r = cydriver.cuMemAddressFree(reg.ptr, reg.size)
    return r


cdef cydriver.CUresult vmm_sleep(long long pool, int device, size_t* nbytes) noexcept nogil:
    """Give back the physical memory of ``pool``'s regions on ``device``
    (the caller has made sure nothing runs on them)."""
    cdef cydriver.CUresult r, first = cydriver.CUDA_SUCCESS
    cdef Region* reg
    nbytes[0] = 0
    _lock.lock()
    it = _regions.begin()
    while it != _regions.end():
        reg = &deref(it).second
        if reg.pool == pool and reg.device == device and reg.mapped:
            r = _unmap(reg)
            if r == cydriver.CUDA_SUCCESS:
                nbytes[0] += reg.size
            elif first == cydriver.CUDA_SUCCESS:
                first = r
        preinc(it)
    _lock.unlock()
    return first


cdef cydriver.CUresult vmm_wake(long long pool, int device, size_t* nbytes) noexcept nogil:
    """Map new physical memory under ``pool``'s unmapped regions on
    ``device``; on failure the regions mapped by this call are given back
    again, so the pool stays wholly asleep."""
    cdef cydriver.CUresult r = cydriver.CUDA_SUCCESS
    cdef Region* reg
    cdef vector[Region*] woken
    nbytes[0] = 0
    _lock.lock()
    it = _regions.begin()
    while it != _regions.end():
        reg = &deref(it).second
        if reg.pool == pool and reg.device == device and not reg.mapped:
            r = _map(reg.ptr, reg.size, reg.device, &reg.handle)
            if r != cydriver.CUDA_SUCCESS:
                break
            reg.mapped = True
            woken.push_back(reg)
            nbytes[0] += reg.size
        preinc(it)
    if r != cydriver.CUDA_SUCCESS:
        for reg in woken:
            _unmap(reg)
        nbytes[0] = 0
    _lock.unlock()
    return r


cdef void vmm_route(unsigned long long capture_id, long long pool) noexcept nogil:
    _lock.lock()
    _capture_pools[capture_id] = pool
    _lock.unlock()


cdef void vmm_unroute(unsigned long long capture_id) noexcept nogil:
    _lock.lock()
    _capture_pools.erase(capture_id)
    _lock.unlock()


# ------------------------------------------------------------------ PyTorch's allocator

cdef void* _torch_malloc(size_t size, int device, void* stream) noexcept nogil:
    """A segment for PyTorch's MemPool of a sleepable pool: the pool is the
    one the capture on ``stream`` allocates into (-1 outside our captures)."""
    cdef cydriver.CUcontext ctx = NULL
    cdef cydriver.CUdevice dev
    cdef cydriver.CUstreamCaptureStatus status
    cdef cydriver.cuuint64_t cid = 0
    cdef cydriver.CUdeviceptr ptr = 0
    cdef size_t g = 0
    cdef long long pool = -1
    if cydriver.cuCtxGetCurrent(&ctx) != cydriver.CUDA_SUCCESS:
        return NULL
    if ctx == NULL:                       # PyTorch has its device's context current; be safe
        if cydriver.cuDeviceGet(&dev, device) != cydriver.CUDA_SUCCESS or \
                cydriver.cuDevicePrimaryCtxRetain(&ctx, dev) != cydriver.CUDA_SUCCESS or \
                cydriver.cuCtxSetCurrent(ctx) != cydriver.CUDA_SUCCESS:
            return NULL
    if vmm_granularity(device, &g) != cydriver.CUDA_SUCCESS or g == 0:
        return NULL
    if cydriver.cuStreamGetCaptureInfo(<cydriver.CUstream>stream, &status, &cid, NULL, NULL, NULL, NULL) \
            == cydriver.CUDA_SUCCESS and status == cydriver.CU_STREAM_CAPTURE_STATUS_ACTIVE:
        _lock.lock()
        it = _capture_pools.find(cid)
        if it != _capture_pools.end():
            pool = deref(it).second
        _lock.unlock()
    if vmm_create(device, (size + g - 1) // g * g, pool, &ptr) != cydriver.CUDA_SUCCESS:
        return NULL
    return <void*>ptr


cdef void _torch_free(void* ptr, size_t size, int device, void* stream) noexcept nogil:
    vmm_free(<cydriver.CUdeviceptr>ptr)


tp_install_hooks(_torch_malloc, _torch_free)

# the exported names, for torch.cuda.memory.CUDAPluggableAllocator(library_path(), ...)
TORCH_MALLOC = "tensorplay_torch_malloc"
TORCH_FREE = "tensorplay_torch_free"


def library_path():
    """The shared library exporting ``tensorplay_torch_malloc`` and ``tensorplay_torch_free``."""
    return __file__


def supported(int device):
    """Whether ``device`` supports virtual memory management (sleepable pools)."""
    ensure_context(device)
    return vmm_supported(device)


def regions(pool=None):
    """The registered regions as dicts (address, size, device, pool, mapped),
    optionally only ``pool``'s: for tests and memory reports."""
    out = []
    cdef Region reg
    with nogil:
        _lock.lock()
    try:
        for entry in _regions:
            reg = entry.second
            if pool is None or reg.pool == pool:
                out.append({"address": reg.ptr, "size": reg.size, "device": reg.device, "pool": reg.pool,
                            "mapped": bool(reg.mapped)})
    finally:
        _lock.unlock()
    return out


def pool_bytes(long long pool, int device):
    """(mapped, unmapped) bytes of ``pool``'s regions on ``device``."""
    cdef size_t mapped = 0, unmapped = 0
    with nogil:
        _lock.lock()
        it = _regions.begin()
        while it != _regions.end():
            if deref(it).second.pool == pool and deref(it).second.device == device:
                if deref(it).second.mapped:
                    mapped += deref(it).second.size
                else:
                    unmapped += deref(it).second.size
            preinc(it)
        _lock.unlock()
    return mapped, unmapped
