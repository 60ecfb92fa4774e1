# SPDX-License-Identifier: Apache-2.0
from cuda.bindings cimport cydriver

# Address-reserved segments (the driver's virtual memory management): the
# physical part can be given back (sleep) and mapped again at the same
# addresses (wake). One registry per process, every device, with a lock.
cdef cydriver.CUresult vmm_create(int device, size_t size, long long pool, cydriver.CUdeviceptr* out) noexcept nogil
cdef cydriver.CUresult vmm_free(cydriver.CUdeviceptr ptr) noexcept nogil
cdef cydriver.CUresult vmm_sleep(long long pool, int device, size_t* nbytes) noexcept nogil
cdef cydriver.CUresult vmm_wake(long long pool, int device, size_t* nbytes) noexcept nogil
cdef cydriver.CUresult vmm_granularity(int device, size_t* granularity) noexcept nogil
cdef bint vmm_supported(int device) noexcept nogil
cdef void vmm_route(unsigned long long capture_id, long long pool) noexcept nogil
cdef void vmm_unroute(unsigned long long capture_id) noexcept nogil
# a region's physical memory as a shareable handle (another process maps it: tensorplay._memory.ipc)
cdef cydriver.CUresult vmm_export(cydriver.CUdeviceptr ptr, int handle_type, void* out,
                                  unsigned long long* generation) noexcept nogil
