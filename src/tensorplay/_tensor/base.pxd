# SPDX-License-Identifier: Apache-2.0
from libc.stdint cimport int64_t, uintptr_t

cdef enum:
    MAX_NDIM = 32
    DEVICE_CPU = 0
    DEVICE_CUDA = 1

# dtype codes: the order of tensorplay._dtypes.ALL_DTYPES
cdef enum:
    DT_BOOL = 0
    DT_UINT8 = 1
    DT_INT8 = 2
    DT_INT16 = 3
    DT_INT32 = 4
    DT_INT64 = 5
    DT_FLOAT16 = 6
    DT_BFLOAT16 = 7
    DT_FLOAT32 = 8
    DT_FLOAT64 = 9
    NUM_DTYPES = 10


cdef class TensorBase:
    cdef readonly object _storage   # CUDA: DeviceAllocation or ForeignStorage; CPU: None
    cdef readonly object _array     # CPU: the numpy array this tensor is
    cdef uintptr_t _ptr             # CUDA: address of the element at index 0
    cdef int _ndim
    cdef int64_t _shape[MAX_NDIM]
    cdef int64_t _strides[MAX_NDIM] # in elements
    cdef readonly int _dtype_code
    cdef int _itemsize
    cdef int _device_type
    cdef readonly int _device_index
    cdef object __weakref__

    cdef int64_t c_numel(self) noexcept
    cdef bint c_is_contiguous(self) noexcept
    cdef int c_note_use(self) except -1
