# SPDX-License-Identifier: Apache-2.0
"""Where the caching allocator's segments and events come from: ``Backend``,
the interface its block policy is written over, and ``DriverBackend``, the
CUDA driver's (cuMemAlloc, cuEventRecord, ...; sleepable segments from
tensorplay._memory.vmm). The fake one for tests without a GPU is
tensorplay._memory.testing.FakeBackend.
"""

cimport cython

from tensorplay._driver.context cimport check, ensure_context
from tensorplay._memory.vmm cimport (vmm_create, vmm_free, vmm_granularity, vmm_route, vmm_sleep, vmm_supported,
                                     vmm_unroute, vmm_wake)


@cython.auto_pickle(False)
cdef class Backend:
    """Segments and events for one device's allocator (abstract)."""

    cdef cydriver.CUresult malloc(self, cydriver.CUdeviceptr* ptr, size_t n) except? cydriver.CUDA_ERROR_UNKNOWN:
        raise NotImplementedError

    cdef int free(self, cydriver.CUdeviceptr ptr) except -1:
        raise NotImplementedError

    cdef uintptr_t create_event(self) except? 0:
        raise NotImplementedError

    cdef int record_event(self, uintptr_t event, uintptr_t stream) except -1:
        raise NotImplementedError

    cdef bint event_done(self, uintptr_t event, bint wait) noexcept:
        return True

    cdef void destroy_event(self, uintptr_t event) noexcept:
        pass

    cdef int synchronize(self) except -1:
        raise NotImplementedError

    cdef unsigned long long capture_id(self, uintptr_t stream) except? 0:
        return 0

    cdef tuple mem_info(self):
        return (0, 0)

    cdef bint supports_sleep(self) except -1:
        return False

    cdef size_t granularity(self) except 0:
        return 2 << 20

    cdef cydriver.CUresult map_segment(self, cydriver.CUdeviceptr* ptr, size_t n, long long pool) except? cydriver.CUDA_ERROR_UNKNOWN:
        raise NotImplementedError

    cdef int free_mapped(self, cydriver.CUdeviceptr ptr) except -1:
        raise NotImplementedError

    cdef int sleep_segments(self, long long pool, size_t* nbytes) except -1:
        raise NotImplementedError

    cdef cydriver.CUresult wake_segments(self, long long pool, size_t* nbytes) except? cydriver.CUDA_ERROR_UNKNOWN:
        raise NotImplementedError

    cdef void route_capture(self, unsigned long long capture_id, long long pool) noexcept:
        pass

    cdef void unroute_capture(self, unsigned long long capture_id) noexcept:
        pass


@cython.final
cdef class DriverBackend(Backend):
    """The CUDA driver: cuMemAlloc/cuMemFree segments, cuEvent* events."""

    def __cinit__(self, int device):
        self.device = device

    cdef cydriver.CUresult malloc(self, cydriver.CUdeviceptr* ptr, size_t n) except? cydriver.CUDA_ERROR_UNKNOWN:
        cdef cydriver.CUresult r
        cdef cydriver.CUstreamCaptureMode mode = cydriver.CU_STREAM_CAPTURE_MODE_RELAXED
        with nogil:
            ensure_context(self.device)
            # cuMemAlloc is not allowed under a global capture; relax this thread
            # for the call, as PyTorch's allocator does.
            check(cydriver.cuThreadExchangeStreamCaptureMode(&mode))
            r = cydriver.cuMemAlloc(ptr, n)
            check(cydriver.cuThreadExchangeStreamCaptureMode(&mode))
        return r

    cdef int free(self, cydriver.CUdeviceptr ptr) except -1:
        with nogil:
            ensure_context(self.device)
            check(cydriver.cuMemFree(ptr))
        return 0

    cdef uintptr_t create_event(self) except? 0:
        cdef cydriver.CUevent ev = NULL
        with nogil:
            ensure_context(self.device)
            check(cydriver.cuEventCreate(&ev, cydriver.CU_EVENT_DISABLE_TIMING))
        return <uintptr_t>ev

    cdef int record_event(self, uintptr_t event, uintptr_t stream) except -1:
        with nogil:
            ensure_context(self.device)
            check(cydriver.cuEventRecord(<cydriver.CUevent>event, <cydriver.CUstream>stream))
        return 0

    cdef bint event_done(self, uintptr_t event, bint wait) noexcept:
        # an error (a dead context) counts as done: nothing runs there any more
        cdef cydriver.CUresult r
        if wait:
            with nogil:
                r = cydriver.cuEventSynchronize(<cydriver.CUevent>event)
        else:
            r = cydriver.cuEventQuery(<cydriver.CUevent>event)
        return r != cydriver.CUDA_ERROR_NOT_READY

    cdef void destroy_event(self, uintptr_t event) noexcept:
        cydriver.cuEventDestroy(<cydriver.CUevent>event)

    cdef int synchronize(self) except -1:
        with nogil:
            ensure_context(self.device)
            check(cydriver.cuCtxSynchronize())
        return 0

    cdef unsigned long long capture_id(self, uintptr_t stream) except? 0:
        cdef cydriver.CUstreamCaptureStatus status
        cdef cydriver.cuuint64_t cid = 0
        with nogil:
            ensure_context(self.device)
            check(cydriver.cuStreamGetCaptureInfo(<cydriver.CUstream>stream, &status, &cid,
                                                  NULL, NULL, NULL, NULL))
        return cid if status == cydriver.CU_STREAM_CAPTURE_STATUS_ACTIVE else 0

    cdef tuple mem_info(self):
        cdef size_t f = 0, t = 0
        try:
            ensure_context(self.device)
            if cydriver.cuMemGetInfo(&f, &t) != cydriver.CUDA_SUCCESS:
                return (0, 0)
        except Exception:
            return (0, 0)
        return (f, t)

    cdef bint supports_sleep(self) except -1:
        ensure_context(self.device)
        return vmm_supported(self.device)

    cdef size_t granularity(self) except 0:
        cdef size_t g = 0
        with nogil:
            ensure_context(self.device)
            check(vmm_granularity(self.device, &g))
        return g

    cdef cydriver.CUresult map_segment(self, cydriver.CUdeviceptr* ptr, size_t n, long long pool) except? cydriver.CUDA_ERROR_UNKNOWN:
        cdef cydriver.CUresult r
        cdef cydriver.CUstreamCaptureMode mode = cydriver.CU_STREAM_CAPTURE_MODE_RELAXED
        with nogil:
            ensure_context(self.device)
            # as malloc: relaxed for the call, so a global capture may allocate
            check(cydriver.cuThreadExchangeStreamCaptureMode(&mode))
            r = vmm_create(self.device, n, pool, ptr)
            check(cydriver.cuThreadExchangeStreamCaptureMode(&mode))
        return r

    cdef int free_mapped(self, cydriver.CUdeviceptr ptr) except -1:
        with nogil:
            ensure_context(self.device)
            check(vmm_free(ptr))
        return 0

    cdef int sleep_segments(self, long long pool, size_t* nbytes) except -1:
        with nogil:
            ensure_context(self.device)
            check(vmm_sleep(pool, self.device, nbytes))
        return 0

    cdef cydriver.CUresult wake_segments(self, long long pool, size_t* nbytes) except? cydriver.CUDA_ERROR_UNKNOWN:
        cdef cydriver.CUresult r
        cdef cydriver.CUstreamCaptureMode mode = cydriver.CU_STREAM_CAPTURE_MODE_RELAXED
        with nogil:
            ensure_context(self.device)
            check(cydriver.cuThreadExchangeStreamCaptureMode(&mode))
            r = vmm_wake(pool, self.device, nbytes)
            check(cydriver.cuThreadExchangeStreamCaptureMode(&mode))
        return r

    cdef void route_capture(self, unsigned long long capture_id, long long pool) noexcept:
        vmm_route(capture_id, pool)

    cdef void unroute_capture(self, unsigned long long capture_id) noexcept:
        vmm_unroute(capture_id)
