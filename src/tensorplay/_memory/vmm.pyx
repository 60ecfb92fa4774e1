# SPDX-License-Identifier: Apache-2.0
"""Segments whose physical memory can leave and come back at the same
addresses, over the driver's virtual memory management: an address range is
reserved once (cuMemAddressReserve) and physical memory is created and
mapped into it (cuMemCreate, cuMemMap, cuMemSetAccess). ``vmm_sleep`` unmaps
and releases the physical part of a pool's segments, keeping the addresses,
so graphs instantiated over them stay valid; ``vmm_wake`` maps new physical
memory at the same addresses. Contents do not survive a sleep.

Physical memory is created with the shareable handle types the device
supports (a POSIX file descriptor, and a fabric handle where the device
and the system allow one), so another process can map a pool's segments
(tensorplay._memory.ipc, ``vmm_export``). A cuMemCreate refused with a
handle type is retried with fewer, and the device remembers what worked:
sharing is lost, never the allocation.

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
    int handle_types                          # the shareable handle types its physical memory has
    unsigned long long generation             # physical memories it has had (wake makes a new one)


cdef mutex _lock
cdef cmap[cydriver.CUdeviceptr, Region] _regions
cdef cmap[unsigned long long, long long] _capture_pools     # capture id -> sleepable pool
cdef size_t _granularity[MAX_DEVICES]
cdef signed char _supported[MAX_DEVICES]                    # 0 unknown, 1 yes, -1 no
cdef int _handle_types[MAX_DEVICES]                         # -1 unknown, else the types cuMemCreate asks for
for _d in range(MAX_DEVICES):
    _handle_types[_d] = -1

# the shareable handle types (CUmemAllocationHandleType bits) a segment may have
FD_TYPE = cydriver.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
FABRIC_TYPE = cydriver.CU_MEM_HANDLE_TYPE_FABRIC


cdef inline void _prop(cydriver.CUmemAllocationProp* prop, int device) noexcept nogil:
    memset(prop, 0, sizeof(cydriver.CUmemAllocationProp))
    prop.type = cydriver.CU_MEM_ALLOCATION_TYPE_PINNED
    prop.location.type = cydriver.CU_MEM_LOCATION_TYPE_DEVICE
    prop.location.id = device


cdef inline int fewer_handle_types(int types) noexcept nogil:
    """What cuMemCreate asks for after a refusal with ``types``: fabric goes
    first (it needs the system's fabric manager, not only the device), then
    every type; -1 when there is nothing left to drop."""
    if types & <int>cydriver.CU_MEM_HANDLE_TYPE_FABRIC:
        return types & ~<int>cydriver.CU_MEM_HANDLE_TYPE_FABRIC
    if types:
        return 0
    return -1


cdef int _device_handle_types(int device) noexcept nogil:
    """The shareable handle types to ask for on ``device``: those its
    attributes say it supports, less those a cuMemCreate refused."""
    cdef cydriver.CUdevice dev
    cdef int value = 0, types = 0
    if _handle_types[device] < 0:
        if cydriver.cuDeviceGet(&dev, device) != cydriver.CUDA_SUCCESS:
            return 0
        if cydriver.cuDeviceGetAttribute(&value, cydriver.CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
                                         dev) == cydriver.CUDA_SUCCESS and value:
            types |= <int>cydriver.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
        value = 0
        if cydriver.cuDeviceGetAttribute(&value, cydriver.CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED,
                                         dev) == cydriver.CUDA_SUCCESS and value:
            types |= <int>cydriver.CU_MEM_HANDLE_TYPE_FABRIC
        _handle_types[device] = types
    return _handle_types[device]


cdef cydriver.CUresult _create(size_t size, int device, cydriver.CUmemGenericAllocationHandle* out,
                               int* types_out) noexcept nogil:
    """cuMemCreate with the device's shareable handle types; a refusal other
    than out of memory is retried with fewer (remembered once one works)."""
    cdef cydriver.CUmemAllocationProp prop
    cdef cydriver.CUresult r
    cdef int first = _device_handle_types(device)
    cdef int types = first
    _prop(&prop, device)
    while True:
        prop.requestedHandleTypes = <cydriver.CUmemAllocationHandleType>types
        r = cydriver.cuMemCreate(out, size, &prop, 0)
        if r == cydriver.CUDA_SUCCESS:
            if types != first:
                _handle_types[device] = types     # later segments skip the refused types
            types_out[0] = types
            return r
        if r == cydriver.CUDA_ERROR_OUT_OF_MEMORY:
            return r
        types = fewer_handle_types(types)
        if types < 0:
            return r


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
                            cydriver.CUmemGenericAllocationHandle* out, int* types) noexcept nogil:
    """Create ``size`` bytes of physical memory on ``device`` and map them
    read-write at ``ptr`` (undone on failure); ``types``: its shareable
    handle types."""
    cdef cydriver.CUmemAllocationProp prop
    cdef cydriver.CUmemAccessDesc access
    cdef cydriver.CUmemGenericAllocationHandle h
    cdef cydriver.CUresult r
    _prop(&prop, device)
    r = _create(size, device, &h, types)
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
    r = _map(ptr, size, device, &reg.handle, &reg.handle_types)
    if r != cydriver.CUDA_SUCCESS:
        cydriver.cuMemAddressFree(ptr, size)
        return r
    reg.generation = 1
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
            r = _map(reg.ptr, reg.size, reg.device, &reg.handle, &reg.handle_types)
            if r != cydriver.CUDA_SUCCESS:
                break
            reg.mapped = True
            reg.generation += 1
            woken.push_back(reg)
            nbytes[0] += reg.size
        preinc(it)
    if r != cydriver.CUDA_SUCCESS:
        for reg in woken:
            _unmap(reg)
        nbytes[0] = 0
    _lock.unlock()
    return r


cdef cydriver.CUresult vmm_export(cydriver.CUdeviceptr ptr, int handle_type, void* out,
                                  unsigned long long* generation) noexcept nogil:
    """Export the physical memory of the region at ``ptr`` as a shareable
    handle of ``handle_type`` into ``out`` (an int file descriptor, or a
    CUmemFabricHandle), under the lock so that no sleep releases it meanwhile.
    CUDA_ERROR_INVALID_VALUE: no region there; CUDA_ERROR_NOT_MAPPED: asleep;
    CUDA_ERROR_NOT_SUPPORTED: its memory was made without that type."""
    cdef cydriver.CUresult r
    _lock.lock()
    it = _regions.find(ptr)
    if it == _regions.end():
        r = cydriver.CUDA_ERROR_INVALID_VALUE
    elif not deref(it).second.mapped:
        r = cydriver.CUDA_ERROR_NOT_MAPPED
    elif not (deref(it).second.handle_types & handle_type):
        r = cydriver.CUDA_ERROR_NOT_SUPPORTED
    else:
        generation[0] = deref(it).second.generation
        r = cydriver.cuMemExportToShareableHandle(out, deref(it).second.handle,
                                                  <cydriver.CUmemAllocationHandleType>handle_type, 0)
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


def handle_type_names(int types):
    """The names of the shareable handle types in the bitmask ``types``."""
    names = []
    if types & <int>cydriver.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR:
        names.append("posix_fd")
    if types & <int>cydriver.CU_MEM_HANDLE_TYPE_FABRIC:
        names.append("fabric")
    return names


def next_handle_types(int types):
    """The handle types a segment asks for after cuMemCreate refused
    ``types`` (-1: none left to drop); the fallback order, for tests."""
    return fewer_handle_types(types)


def shareable_handle_types(int device):
    """The shareable handle types ``device``'s sleepable segments are made
    with now (names): what its attributes allow, less what cuMemCreate refused."""
    ensure_context(device)
    return handle_type_names(_device_handle_types(device))


def regions(pool=None):
    """The registered regions as dicts (address, size, device, pool, mapped,
    handle_types: names, generation: physical memories it has had),
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
                            "mapped": bool(reg.mapped), "handle_types": handle_type_names(reg.handle_types),
                            "generation": reg.generation})
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
