# SPDX-License-Identifier: Apache-2.0
"""Pool memory another process maps: the driver half.

Exporting: a sleepable segment's physical memory as a POSIX file descriptor
or a fabric handle (``export_segment``: cuMemExportToShareableHandle under
the vmm registry's lock, so a sleep cannot release it meanwhile); a plain
(cuMemAlloc) segment as a CUDA IPC handle (``ipc_handle``:
cuIpcGetMemHandle).

Importing: ``map_segments`` maps each exported segment into this process
(cuMemImportFromShareableHandle, cuMemAddressReserve, cuMemMap,
cuMemSetAccess for the importing device; or cuIpcOpenMemHandle) and returns
a ``MappedPeerMemory`` that translates the exporter's addresses to the
mapped ones and unmaps on ``close()`` or when collected. Unmapping waits for
the device's work; inside a capture it waits for the capture's end, as the
library's other teardown does (tensorplay._driver.teardown).

The records, the checks of their arguments and the pool-level functions are
the pure-Python half, tensorplay._memory.sharing.
"""

cimport cython
from cuda.bindings cimport cydriver
from libc.stdint cimport uintptr_t
from libc.string cimport memcpy, memset
from libcpp.vector cimport vector

from tensorplay._driver.context cimport check, ensure_context
from tensorplay._driver.teardown cimport defer, destroy_must_wait
from tensorplay._memory.vmm cimport vmm_export

from tensorplay._memory.allocator import PoolAsleepError

DEF HANDLE_BYTES = 64           # CUmemFabricHandle and CUipcMemHandle

# how a segment was mapped here
DEF KIND_SHAREABLE = 0          # imported physical memory mapped under a reserved range
DEF KIND_CUDA_IPC = 1           # cuIpcOpenMemHandle


cdef struct Mapping:
    cydriver.CUdeviceptr remote                 # the exporter's address
    cydriver.CUdeviceptr local                  # where it is mapped here
    size_t size
    cydriver.CUmemGenericAllocationHandle handle    # KIND_SHAREABLE: the imported handle
    int kind


cdef int _handle_type(str name) except -1:
    if name == "posix_fd":
        return <int>cydriver.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
    if name == "fabric":
        return <int>cydriver.CU_MEM_HANDLE_TYPE_FABRIC
    raise ValueError(f"unknown shareable handle type {name!r} (posix_fd, fabric)")


def export_segment(uintptr_t address, int device, str handle_type):
    """Return ``(fd, handle, generation)`` for the sleepable segment at
    ``address``: a new file descriptor (the caller closes it) for
    "posix_fd", the 64-byte fabric handle for "fabric"; ``generation``
    counts the physical memories the segment has had (a wake makes a new one)."""
    cdef int kind = _handle_type(handle_type)
    cdef int fd = -1
    cdef cydriver.CUmemFabricHandle fabric
    cdef unsigned long long generation = 0
    cdef void* out = <void*>&fd if kind == <int>cydriver.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR else <void*>&fabric
    cdef cydriver.CUresult r
    memset(&fabric, 0, sizeof(fabric))
    with nogil:
        ensure_context(device)
        r = vmm_export(<cydriver.CUdeviceptr>address, kind, out, &generation)
    if r == cydriver.CUDA_ERROR_INVALID_VALUE:
        raise ValueError(f"no sleepable segment starts at {address:#x} (it was freed, or belongs to no sleepable pool)")
    if r == cydriver.CUDA_ERROR_NOT_MAPPED:
        raise PoolAsleepError(f"export: the segment at {address:#x} is asleep (its memory was given back by "
                              f"sleep()); wake() its pool before exporting it")
    if r == cydriver.CUDA_ERROR_NOT_SUPPORTED:
        raise RuntimeError(f"export: the segment at {address:#x} was made without a {handle_type} handle "
                           f"(cuda:{device} or the system does not allow one); try another handle_type")
    check(r)
    if kind == <int>cydriver.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR:
        return fd, None, generation
    return None, (<char*>fabric.data)[:HANDLE_BYTES], generation


def ipc_handle(uintptr_t address, int device):
    """Return the 64-byte CUDA IPC handle of the cuMemAlloc segment at ``address`` (cuIpcGetMemHandle)."""
    cdef cydriver.CUipcMemHandle h
    with nogil:
        ensure_context(device)
        check(cydriver.cuIpcGetMemHandle(&h, <cydriver.CUdeviceptr>address))
    return (<char*>h.reserved)[:HANDLE_BYTES]


def device_uuid(int device):
    """Return ``device``'s UUID as 32 hex digits (cuDeviceGetUuid)."""
    cdef cydriver.CUdevice dev
    cdef cydriver.CUuuid uuid
    with nogil:
        ensure_context(device)
        check(cydriver.cuDeviceGet(&dev, device))
        check(cydriver.cuDeviceGetUuid(&uuid, dev))
    return (<char*>uuid.bytes)[:16].hex()


cdef cydriver.CUresult _unmap(int kind, cydriver.CUdeviceptr local, size_t size,
                              cydriver.CUmemGenericAllocationHandle handle) noexcept nogil:
    """Undo one mapping; every step runs, the first failure is returned."""
    cdef cydriver.CUresult r, first = cydriver.CUDA_SUCCESS
    if kind == KIND_CUDA_IPC:
        return cydriver.cuIpcCloseMemHandle(local)
    r = cydriver.cuMemUnmap(local, size)
    if r != cydriver.CUDA_SUCCESS:
        first = r
    r = cydriver.cuMemRelease(handle)
    if r != cydriver.CUDA_SUCCESS and first == cydriver.CUDA_SUCCESS:
        first = r
    r = cydriver.cuMemAddressFree(local, size)
    if r != cydriver.CUDA_SUCCESS and first == cydriver.CUDA_SUCCESS:
        first = r
    return first


def _release_mappings(int device, tuple mappings):
    """Wait for ``device``'s work (a kernel may still read the peer's
    memory), then undo each (kind, local, size, handle) mapping."""
    cdef cydriver.CUresult r, first = cydriver.CUDA_SUCCESS
    cdef int kind
    cdef uintptr_t local, handle
    cdef size_t size
    ensure_context(device)
    with nogil:
        r = cydriver.cuCtxSynchronize()
    if r != cydriver.CUDA_SUCCESS:
        first = r
    for m in mappings:
        kind, local, size, handle = m
        with nogil:
            r = _unmap(kind, <cydriver.CUdeviceptr>local, size, <cydriver.CUmemGenericAllocationHandle>handle)
        if r != cydriver.CUDA_SUCCESS and first == cydriver.CUDA_SUCCESS:
            first = r
    check(first)


@cython.final
cdef class MappedPeerMemory:
    """Segments of another process's memory pool, mapped into this one.

    Made by :func:`tensorplay.cuda.import_segments`. :meth:`translate`
    turns an address of the exporting process (a pointer into its pool: a
    graph's output, a buffer its kernels were given) into the address that
    reaches the same memory here. ``close()`` unmaps everything (after the
    device's queued work; inside a capture, once no capture is open); the
    mappings are also undone when the object is collected.
    """
    cdef readonly int device
    cdef vector[Mapping] _maps
    cdef readonly tuple segments
    cdef bint _closed

    def __cinit__(self):
        self.device = -1
        self.segments = ()
        self._closed = False

    def __init__(self):
        raise TypeError("MappedPeerMemory is made by tensorplay.cuda.import_segments()")

    cdef int _add(self, uintptr_t remote, size_t size, int kind, object source) except -1:
        """Map one segment: ``source`` is an int fd, or bytes (a fabric
        handle, KIND_SHAREABLE; a CUDA IPC handle, KIND_CUDA_IPC)."""
        cdef Mapping m
        cdef cydriver.CUmemAccessDesc access
        cdef cydriver.CUmemFabricHandle fabric
        cdef cydriver.CUipcMemHandle ipc
        cdef cydriver.CUmemAllocationHandleType htype
        cdef void* os_handle
        cdef cydriver.CUresult r = cydriver.CUDA_SUCCESS
        cdef cydriver.CUstreamCaptureMode mode = cydriver.CU_STREAM_CAPTURE_MODE_RELAXED
        cdef bytes raw
        cdef int device = self.device
        memset(&m, 0, sizeof(m))
        m.remote = <cydriver.CUdeviceptr>remote
        m.size = size
        m.kind = kind
        if kind == KIND_CUDA_IPC:
            raw = source
            memcpy(ipc.reserved, <char*>raw, HANDLE_BYTES)
            with nogil:
                ensure_context(device)
                r = cydriver.cuIpcOpenMemHandle(&m.local, ipc, cydriver.CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS)
            check(r)
            self._maps.push_back(m)
            return 0
        if isinstance(source, int):
            htype = cydriver.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
            os_handle = <void*><uintptr_t><int>source
        else:
            raw = source
            memcpy(fabric.data, <char*>raw, HANDLE_BYTES)
            htype = cydriver.CU_MEM_HANDLE_TYPE_FABRIC
            os_handle = <void*>&fabric
        memset(&access, 0, sizeof(access))
        access.location.type = cydriver.CU_MEM_LOCATION_TYPE_DEVICE
        access.location.id = device
        access.flags = cydriver.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
        with nogil:
            ensure_context(device)
            # as the allocator's segments: relaxed for the calls, so a global capture may import
            check(cydriver.cuThreadExchangeStreamCaptureMode(&mode))
            r = cydriver.cuMemImportFromShareableHandle(&m.handle, os_handle, htype)
            if r == cydriver.CUDA_SUCCESS:
                r = cydriver.cuMemAddressReserve(&m.local, size, 0, 0, 0)
                if r != cydriver.CUDA_SUCCESS:
                    cydriver.cuMemRelease(m.handle)
                else:
                    r = cydriver.cuMemMap(m.local, size, 0, m.handle, 0)
                    if r != cydriver.CUDA_SUCCESS:
                        cydriver.cuMemRelease(m.handle)
                        cydriver.cuMemAddressFree(m.local, size)
                    else:
                        r = cydriver.cuMemSetAccess(m.local, size, &access, 1)
                        if r != cydriver.CUDA_SUCCESS:
                            _unmap(KIND_SHAREABLE, m.local, size, m.handle)
            check(cydriver.cuThreadExchangeStreamCaptureMode(&mode))
        check(r)
        self._maps.push_back(m)
        return 0

    cdef tuple _take(self):
        """Hand the mappings over as plain tuples (and forget them)."""
        cdef Mapping m
        out = []
        for m in self._maps:
            out.append((m.kind, <uintptr_t>m.local, m.size, <uintptr_t>m.handle))
        self._maps.clear()
        self._closed = True
        return tuple(out)

    def translate(self, uintptr_t address):
        """Return the address here of ``address``, an address in the exporting process.

        Raises ValueError for an address outside every mapped segment, and
        after ``close()``.
        """
        cdef Mapping m
        if self._closed:
            raise ValueError("translate: this MappedPeerMemory is closed")
        for m in self._maps:
            if m.remote <= address < m.remote + m.size:
                return <uintptr_t>(m.local + (address - m.remote))
        raise ValueError(f"translate: {address:#x} is in none of the {self._maps.size()} mapped segments")

    def __contains__(self, address):
        cdef Mapping m
        if not isinstance(address, int) or address < 0:
            return False
        for m in self._maps:
            if m.remote <= address < m.remote + m.size:
                return True
        return False

    @property
    def mappings(self):
        """Each mapped segment as ``(exporter's address, address here, size)``."""
        cdef Mapping m
        out = []
        for m in self._maps:
            out.append((<uintptr_t>m.remote, <uintptr_t>m.local, m.size))
        return out

    @property
    def blocks(self):
        """The blocks live in the exporter's pool when it exported, as
        ``(exporter's address, address here, size)`` (segments PyTorch's
        allocator made count as one block)."""
        out = []
        for seg in self.segments:
            if self._closed:
                break
            local = self.translate(seg.address)
            spans = seg.blocks if seg.blocks is not None else ((0, seg.size),)
            for offset, size in spans:
                out.append((seg.address + offset, local + offset, size))
        return out

    @property
    def closed(self):
        """Whether :meth:`close` ran (the mappings are gone or queued to go)."""
        return self._closed

    def close(self):
        """Unmap every segment and release the imported memory.

        Waits for the device's queued work first. Inside a graph capture the
        unmapping waits until no capture is open (it would break the
        capture). Closing twice does nothing.
        """
        if self._closed:
            return
        taken = self._take()
        if not taken:
            return
        if destroy_must_wait():
            defer(_release_mappings, (self.device, taken))
        else:
            _release_mappings(self.device, taken)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __reduce__(self):
        raise TypeError("a MappedPeerMemory is this process's mapping; send the exported segments instead")

    def __dealloc__(self):
        if self._maps.empty():
            return
        try:
            taken = self._take()
            if destroy_must_wait():
                defer(_release_mappings, (self.device, taken))
            else:
                _release_mappings(self.device, taken)
        except BaseException:
            pass                        # a dead context, a forked child: nothing left to unmap

    def __repr__(self):
        cdef Mapping m
        cdef size_t total = 0
        for m in self._maps:
            total += m.size
        state = "closed" if self._closed else f"{self._maps.size()} segments, {total} bytes"
        return f"<MappedPeerMemory cuda:{self.device} {state}>"


def map_segments(list specs, int device, tuple segments):
    """Map each ``(address, size, kind, source)`` of ``specs`` (kind:
    "shareable" with an int fd or a fabric handle, or "cuda_ipc" with an IPC
    handle) for ``device``; return the MappedPeerMemory. A failure unmaps
    what was mapped before raising."""
    cdef MappedPeerMemory out = MappedPeerMemory.__new__(MappedPeerMemory)
    out.device = device
    out.segments = segments
    try:
        for address, size, kind, source in specs:
            out._add(address, size, KIND_CUDA_IPC if kind == "cuda_ipc" else KIND_SHAREABLE, source)
    except BaseException:
        taken = out._take()
        try:
            if destroy_must_wait():
                defer(_release_mappings, (device, taken))
            else:
                _release_mappings(device, taken)
        except BaseException:
            pass                        # the first error is the one to report
        raise
    return out
