# SPDX-License-Identifier: Apache-2.0
from cuda.bindings cimport cydriver


cdef class Module:
    cdef cydriver.CUmodule _handle
    cdef readonly int device


cdef class Function:
    cdef cydriver.CUfunction _handle
    cdef readonly Module module
    cdef readonly str name
    cdef readonly int device
    # launched with programmatic stream serialization (while pdl_on): the
    # kernel waits on its grid dependency before its first read (sm_90 code)
    cdef public bint pdl

    cdef int c_launch(self, unsigned int gx, unsigned int gy, unsigned int gz,
                      unsigned int bx, unsigned int by, unsigned int bz,
                      unsigned int shared, cydriver.CUstream stream,
                      const void* params, size_t params_size) except -1 nogil


cdef bint is_own_function(cydriver.CUfunction func) noexcept
cdef int launch_dims(object d, unsigned int* out, str what) except -1


cdef inline void fill_launch_extra(void** extra, const void* params, size_t* params_size) noexcept nogil:
    """The five-slot ``extra`` array of cuLaunchKernel and kernel nodes that
    passes ``params`` as one packed buffer."""
    extra[0] = <void*>cydriver.CU_LAUNCH_PARAM_BUFFER_POINTER
    extra[1] = <void*>params
    extra[2] = <void*>cydriver.CU_LAUNCH_PARAM_BUFFER_SIZE
    extra[3] = <void*>params_size
    extra[4] = <void*>cydriver.CU_LAUNCH_PARAM_END
