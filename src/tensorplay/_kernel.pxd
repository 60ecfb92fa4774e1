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

    cdef int c_launch(self, unsigned int gx, unsigned int gy, unsigned int gz,
                      unsigned int bx, unsigned int by, unsigned int bz,
                      unsigned int shared, cydriver.CUstream stream,
                      const void* params, size_t params_size) except -1 nogil
