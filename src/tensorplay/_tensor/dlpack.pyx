# SPDX-License-Identifier: Apache-2.0
"""DLPack: export of a CUDA tensor as a capsule, import of a producer's capsule.

The structs are DLPack's stable C ABI, declared in _dlpack.pxd. No driver
call happens here: the memory stays the producer's (or the tensor's) own.
"""

from cpython.pycapsule cimport (PyCapsule_New, PyCapsule_IsValid, PyCapsule_GetPointer,
                                PyCapsule_SetName, PyCapsule_Destructor)
from cpython.ref cimport Py_INCREF, PyObject
from libc.stdint cimport int64_t, uintptr_t
from libc.stdlib cimport malloc, free

from tensorplay._tensor.base cimport TensorBase, DEVICE_CUDA

# the DLPack device codes, for the Python layer (defined once: the enum in _dlpack.pxd)
DLPACK_DEVICE_CPU = kDLCPU
DLPACK_DEVICE_CUDA = kDLCUDA

cdef extern from "Python.h":
    int Py_IsInitialized() nogil
    void Py_DecRef(PyObject*)
    # PyObject* forms: a capsule destructor must not touch its refcount
    int capsule_is_valid "PyCapsule_IsValid" (PyObject*, const char*)
    void* capsule_get_pointer "PyCapsule_GetPointer" (PyObject*, const char*)

# the DLPack type code of each dtype code (its bits are 8 * the item size)
cdef int DL_CODE[10]
DL_CODE[:] = [kDLBool, kDLUInt, kDLInt, kDLInt, kDLInt, kDLInt, kDLFloat, kDLBfloat, kDLFloat, kDLFloat]


def to_capsule(TensorBase t not None, bint versioned):
    """Export the CUDA tensor ``t`` as a DLPack capsule ('dltensor' or 'dltensor_versioned').

    The capsule holds a reference to ``t`` until the consumer calls the
    deleter (or the capsule dies unconsumed). Inside a capture, handing out
    the address makes the capturing graph keep the memory alive.
    """
    cdef DLManagedTensor* mt
    cdef DLManagedTensorVersioned* mv
    cdef DLTensor* dl
    cdef int64_t* dims
    cdef int i
    if t._device_type != DEVICE_CUDA:
        raise BufferError("CPU tensors export DLPack through numpy")
    dims = <int64_t*>malloc(sizeof(int64_t) * 2 * (t._ndim if t._ndim else 1))
    if dims == NULL:
        raise MemoryError()
    if versioned:
        mv = <DLManagedTensorVersioned*>malloc(sizeof(DLManagedTensorVersioned))
        if mv == NULL:
            free(dims)
            raise MemoryError()
        mv.version.major = DLPACK_MAJOR_VERSION
        mv.version.minor = DLPACK_MINOR_VERSION
        mv.manager_ctx = <void*>t
        mv.deleter = _deleter_versioned
        mv.flags = 0
        dl = &mv.dl_tensor
    else:
        mt = <DLManagedTensor*>malloc(sizeof(DLManagedTensor))
        if mt == NULL:
            free(dims)
            raise MemoryError()
        mt.manager_ctx = <void*>t
        mt.deleter = _deleter_unversioned
        dl = &mt.dl_tensor
    t.c_note_use()
    dl.data = <void*>t._ptr
    dl.device.device_type = kDLCUDA
    dl.device.device_id = t._device_index
    dl.ndim = t._ndim
    dl.dtype.code = DL_CODE[t._dtype_code]
    dl.dtype.bits = 8 * t._itemsize
    dl.dtype.lanes = 1
    dl.shape = dims
    dl.strides = dims + t._ndim
    dl.byte_offset = 0
    for i in range(t._ndim):
        dims[i] = t._shape[i]
        dims[t._ndim + i] = t._strides[i]
    Py_INCREF(t)
    if versioned:
        return PyCapsule_New(<void*>mv, b"dltensor_versioned",
                             <PyCapsule_Destructor>_capsule_destructor_versioned)
    return PyCapsule_New(<void*>mt, b"dltensor", <PyCapsule_Destructor>_capsule_destructor)


cdef void _deleter_unversioned(DLManagedTensor* mt) noexcept nogil:
    if mt == NULL:
        return
    if Py_IsInitialized():
        with gil:
            Py_DecRef(<PyObject*>mt.manager_ctx)
    free(mt.dl_tensor.shape)
    free(mt)


cdef void _deleter_versioned(DLManagedTensorVersioned* mv) noexcept nogil:
    if mv == NULL:
        return
    if Py_IsInitialized():
        with gil:
            Py_DecRef(<PyObject*>mv.manager_ctx)
    free(mv.dl_tensor.shape)
    free(mv)


cdef void _capsule_destructor(PyObject* capsule) noexcept:
    cdef DLManagedTensor* mt
    if capsule_is_valid(capsule, b"dltensor"):   # never consumed
        mt = <DLManagedTensor*>capsule_get_pointer(capsule, b"dltensor")
        if mt.deleter != NULL:
            mt.deleter(mt)


cdef void _capsule_destructor_versioned(PyObject* capsule) noexcept:
    cdef DLManagedTensorVersioned* mv
    if capsule_is_valid(capsule, b"dltensor_versioned"):
        mv = <DLManagedTensorVersioned*>capsule_get_pointer(capsule, b"dltensor_versioned")
        if mv.deleter != NULL:
            mv.deleter(mv)


cdef class DLPackOwner:
    """Owns an imported DLManagedTensor(Versioned); calls its deleter when it dies."""
    cdef void* managed
    cdef bint versioned

    def __dealloc__(self):
        cdef DLManagedTensor* mt
        cdef DLManagedTensorVersioned* mv
        if self.managed == NULL:
            return
        if self.versioned:
            mv = <DLManagedTensorVersioned*>self.managed
            if mv.deleter != NULL:
                mv.deleter(mv)
        else:
            mt = <DLManagedTensor*>self.managed
            if mt.deleter != NULL:
                mt.deleter(mt)
        self.managed = NULL


def dlpack_import(capsule):
    """Consume a DLPack capsule.

    Returns (owner, data_ptr, shape, strides_or_None, (code, bits, lanes),
    (device_type, device_id), read_only); ``owner`` calls the producer's
    deleter when it dies. The capsule is renamed to mark it used."""
    cdef DLTensor* t
    cdef DLManagedTensorVersioned* mv
    cdef DLManagedTensor* mt
    cdef DLPackOwner owner = DLPackOwner.__new__(DLPackOwner)
    cdef bint read_only = False
    cdef int i
    if PyCapsule_IsValid(capsule, b"dltensor_versioned"):
        mv = <DLManagedTensorVersioned*>PyCapsule_GetPointer(capsule, b"dltensor_versioned")
        if mv.version.major > DLPACK_MAJOR_VERSION:
            raise BufferError(f"DLPack {mv.version.major}.{mv.version.minor} is newer than supported 1.x")
        t = &mv.dl_tensor
        read_only = (mv.flags & DLPACK_FLAG_BITMASK_READ_ONLY) != 0
        PyCapsule_SetName(capsule, b"used_dltensor_versioned")
        owner.managed = mv
        owner.versioned = True
    elif PyCapsule_IsValid(capsule, b"dltensor"):
        mt = <DLManagedTensor*>PyCapsule_GetPointer(capsule, b"dltensor")
        t = &mt.dl_tensor
        PyCapsule_SetName(capsule, b"used_dltensor")
        owner.managed = mt
        owner.versioned = False
    else:
        raise TypeError("expected an unconsumed DLPack capsule ('dltensor' or 'dltensor_versioned')")
    shape = tuple([t.shape[i] for i in range(t.ndim)])
    strides = None if t.strides == NULL else tuple([t.strides[i] for i in range(t.ndim)])
    ptr = <uintptr_t>t.data + t.byte_offset
    return (owner, ptr, shape, strides, (t.dtype.code, t.dtype.bits, t.dtype.lanes),
            (t.device.device_type, t.device.device_id), read_only)
