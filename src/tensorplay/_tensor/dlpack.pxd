# SPDX-License-Identifier: Apache-2.0
# DLPack's stable C ABI (dlpack.h v1.x), declared here so no header is needed.
from libc.stdint cimport int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t

cdef extern from *:
    """
    typedef enum { tpDLCPU = 1, tpDLCUDA = 2, tpDLCUDAHost = 3, tpDLCUDAManaged = 13 } tpDLDeviceType;
    typedef struct { int32_t device_type; int32_t device_id; } tpDLDevice;
    typedef struct { uint8_t code; uint8_t bits; uint16_t lanes; } tpDLDataType;
    typedef struct {
        void* data; tpDLDevice device; int32_t ndim; tpDLDataType dtype;
        int64_t* shape; int64_t* strides; uint64_t byte_offset;
    } tpDLTensor;
    typedef struct tpDLManagedTensor {
        tpDLTensor dl_tensor; void* manager_ctx;
        void (*deleter)(struct tpDLManagedTensor* self);
    } tpDLManagedTensor;
    typedef struct { uint32_t major; uint32_t minor; } tpDLPackVersion;
    typedef struct tpDLManagedTensorVersioned {
        tpDLPackVersion version; void* manager_ctx;
        void (*deleter)(struct tpDLManagedTensorVersioned* self);
        uint64_t flags; tpDLTensor dl_tensor;
    } tpDLManagedTensorVersioned;
    """
    ctypedef struct DLDevice "tpDLDevice":
        int32_t device_type
        int32_t device_id
    ctypedef struct DLDataType "tpDLDataType":
        uint8_t code
        uint8_t bits
        uint16_t lanes
    ctypedef struct DLTensor "tpDLTensor":
        void* data
        DLDevice device
        int32_t ndim
        DLDataType dtype
        int64_t* shape
        int64_t* strides
        uint64_t byte_offset
    ctypedef struct DLManagedTensor "tpDLManagedTensor":
        DLTensor dl_tensor
        void* manager_ctx
        void (*deleter)(DLManagedTensor*) noexcept
    ctypedef struct DLPackVersion "tpDLPackVersion":
        uint32_t major
        uint32_t minor
    ctypedef struct DLManagedTensorVersioned "tpDLManagedTensorVersioned":
        DLPackVersion version
        void* manager_ctx
        void (*deleter)(DLManagedTensorVersioned*) noexcept
        uint64_t flags
        DLTensor dl_tensor

cdef enum:
    kDLCPU = 1
    kDLCUDA = 2
    kDLCUDAHost = 3
    kDLCUDAManaged = 13
    kDLInt = 0
    kDLUInt = 1
    kDLFloat = 2
    kDLBfloat = 4
    kDLBool = 6
    DLPACK_FLAG_BITMASK_READ_ONLY = 1
    DLPACK_MAJOR_VERSION = 1
    DLPACK_MINOR_VERSION = 1
