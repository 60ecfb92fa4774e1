# SPDX-License-Identifier: Apache-2.0
"""TensorBase: the C-level fields of a tensor and the CUDA Array Interface.

DLPack is tensorplay._tensor.dlpack, the raw memory copies tensorplay._driver.memcpy; both
sit above this module.
"""

from cpython.bytes cimport PyBytes_FromStringAndSize
from libc.stdint cimport int64_t, uintptr_t
from libcpp.vector cimport vector

from tensorplay._driver.context cimport open_capture_count
from tensorplay._driver.stream cimport current_stream_handle
from tensorplay._memory.allocator cimport c_note_capture_use

# the dimension limit, for the Python layer (defined once: the enum in _tensor_base.pxd)
MAX_DIMS = MAX_NDIM

cdef int ITEMSIZE[10]
ITEMSIZE[:] = [1, 1, 1, 2, 4, 8, 2, 2, 4, 8]

CAI_TYPESTR = ("|b1", "|u1", "|i1", "<i2", "<i4", "<i8", "<f2", None, "<f4", "<f8")


cdef class ForeignStorage:
    """Device memory owned by another object (a DLPack producer, a CUDA Array
    Interface exporter); keeps that owner alive."""
    cdef readonly object owner
    cdef readonly uintptr_t ptr
    cdef readonly size_t size
    cdef readonly int device

    def __cinit__(self, owner, uintptr_t ptr, size_t size, int device):
        self.owner = owner
        self.ptr = ptr
        self.size = size
        self.device = device

    def record_stream(self, stream_handle):
        pass   # foreign memory is freed by its owner, on its owner's terms


cdef class TensorBase:
    """C-level fields shared by every tensor; subclassed by tensorplay.Tensor."""

    def __cinit__(self):
        self._ndim = 0
        self._ptr = 0
        self._dtype_code = DT_FLOAT32
        self._itemsize = 4
        self._device_type = DEVICE_CPU
        self._device_index = -1

    # ------------------------------------------------------------ construction

    def _set_cuda(self, storage, uintptr_t ptr, shape, strides, int dtype_code, int device):
        """Fill in the fields of a CUDA tensor (used by the Python factories)."""
        cdef int n = len(shape), i
        if n > MAX_NDIM:
            raise ValueError(f"tensors have at most {MAX_NDIM} dimensions, got {n}")
        if dtype_code < 0 or dtype_code >= NUM_DTYPES:
            raise ValueError(f"bad dtype code {dtype_code}")
        self._storage = storage
        self._array = None
        self._ptr = ptr
        self._ndim = n
        for i in range(n):
            self._shape[i] = shape[i]
            self._strides[i] = strides[i]
        self._dtype_code = dtype_code
        self._itemsize = ITEMSIZE[dtype_code]
        self._device_type = DEVICE_CUDA
        self._device_index = device
        return self

    def _set_cpu(self, array, int dtype_code):
        """Fill in the fields of a CPU tensor viewing the numpy ``array``."""
        cdef int n = array.ndim, i
        cdef int isz = ITEMSIZE[dtype_code]
        if n > MAX_NDIM:
            raise ValueError(f"tensors have at most {MAX_NDIM} dimensions, got {n}")
        self._storage = None
        self._array = array
        self._ptr = 0
        self._ndim = n
        shp = array.shape
        st = array.strides
        for i in range(n):
            self._shape[i] = shp[i]
            if st[i] % isz:
                raise ValueError("numpy array strides must be multiples of its item size")
            self._strides[i] = st[i] // isz
        self._dtype_code = dtype_code
        self._itemsize = isz
        self._device_type = DEVICE_CPU
        self._device_index = -1
        return self

    # ------------------------------------------------------------ fields

    @property
    def shape(self):
        """The size of each dimension, a tuple of ints (``()`` for a 0-d tensor)."""
        return tuple([self._shape[i] for i in range(self._ndim)])

    @property
    def strides(self):
        """The step between neighbours along each dimension, in elements (as PyTorch gives them)."""
        return tuple([self._strides[i] for i in range(self._ndim)])

    @property
    def ndim(self):
        """The number of dimensions."""
        return self._ndim

    def dim(self):
        """Return the number of dimensions (:attr:`ndim`)."""
        return self._ndim

    cdef int64_t c_numel(self) noexcept:
        cdef int64_t n = 1
        cdef int i
        for i in range(self._ndim):
            n *= self._shape[i]
        return n

    def numel(self):
        """Return the number of elements."""
        return self.c_numel()

    @property
    def nbytes(self):
        """The size of the elements in bytes (``numel() * itemsize``)."""
        return self.c_numel() * self._itemsize

    @property
    def itemsize(self):
        """The size of one element in bytes."""
        return self._itemsize

    def element_size(self):
        """Return the size of one element in bytes (:attr:`itemsize`)."""
        return self._itemsize

    cdef bint c_is_contiguous(self) noexcept:
        cdef int64_t expected = 1
        cdef int i
        if self.c_numel() == 0:
            return True
        for i in range(self._ndim - 1, -1, -1):
            if self._shape[i] != 1:
                if self._strides[i] != expected:
                    return False
                expected *= self._shape[i]
        return True

    def is_contiguous(self):
        """Return True if the elements are laid out in row-major order without gaps."""
        return self.c_is_contiguous()

    cdef int c_note_use(self) except -1:
        """The pointer leaves this tensor: while a capture is open, the
        capturing graph keeps memory from outside its pool alive (the one
        place the keep-alive happens, so no op has to remember it)."""
        if open_capture_count() and self._storage is not None:
            c_note_capture_use(self._storage)
        return 0

    def data_ptr(self):
        """Return the address of the first element (a device address for CUDA tensors).

        Inside a capture, handing out a CUDA tensor's address makes the
        capturing graph keep its memory alive.
        """
        if self._device_type == DEVICE_CPU:
            return self._array.__array_interface__["data"][0]
        self.c_note_use()
        return self._ptr

    @property
    def is_cuda(self):
        """True for a tensor in CUDA device memory."""
        return self._device_type == DEVICE_CUDA

    @property
    def is_cpu(self):
        """True for a tensor in host memory (a NumPy array underneath)."""
        return self._device_type == DEVICE_CPU

    def storage_offset(self):
        """Return the offset of the first element from the start of its storage, in elements."""
        if self._device_type == DEVICE_CPU:
            return 0
        if self._storage is None:
            return 0
        return (self._ptr - self._storage.ptr) // self._itemsize

    def record_stream(self, stream):
        """Mark this tensor's memory as in use by ``stream``: the allocator reuses it
        only after the work queued there when the tensor dies has finished."""
        if self._device_type != DEVICE_CUDA:
            raise TypeError("record_stream needs a CUDA tensor")
        h = getattr(stream, "handle", None)
        if h is None:
            raise TypeError(f"expected a tensorplay.cuda.Stream, got {type(stream).__name__}")
        if stream.device_index != self._device_index:
            raise ValueError(f"stream is on cuda:{stream.device_index}, tensor on cuda:{self._device_index}")
        self._storage.record_stream(h)

    # ------------------------------------------------------------ CUDA Array Interface

    @property
    def __cuda_array_interface__(self):
        """The CUDA Array Interface v3 description of a CUDA tensor (AttributeError for CPU tensors).

        Its ``stream`` is this thread's current stream, on which the tensor's
        pending work is queued (1 for the legacy default stream).
        """
        if self._device_type != DEVICE_CUDA:
            raise AttributeError("CPU tensors have no __cuda_array_interface__; use __array_interface__")
        typestr = CAI_TYPESTR[self._dtype_code]
        if typestr is None:
            raise TypeError("bfloat16 has no CUDA Array Interface type string; use DLPack")
        cdef uintptr_t s = <uintptr_t>current_stream_handle(self._device_index)
        self.c_note_use()
        return {
            "shape": self.shape,
            "typestr": typestr,
            "descr": [("", typestr)],
            "data": (self._ptr, False),
            "strides": None if self.c_is_contiguous() else
                       tuple([self._strides[i] * self._itemsize for i in range(self._ndim)]),
            "version": 3,
            # the legacy default stream is 1 in the protocol (0 is disallowed)
            "stream": 1 if s == 0 else s,
        }


# ---------------------------------------------------------------- plan keys

cdef inline void _append(vector[char]& buf, const void* data, size_t n) noexcept:
    cdef const char* c = <const char*>data
    buf.insert(buf.end(), c, c + n)


cdef bint _append_cuda_tensor(vector[char]& buf, char tag, object x) noexcept:
    """Append a CUDA tensor's dtype, device, shape and strides; False for
    anything else."""
    cdef TensorBase t
    if not isinstance(x, TensorBase):
        return False
    t = <TensorBase>x
    if t._device_type != DEVICE_CUDA:
        return False
    buf.push_back(tag)
    buf.push_back(<char>t._dtype_code)
    buf.push_back(<char>t._ndim)
    _append(buf, &t._device_index, sizeof(int))
    _append(buf, t._shape, sizeof(int64_t) * t._ndim)
    _append(buf, t._strides, sizeof(int64_t) * t._ndim)
    return True


def plan_key(op, tuple operands, out, bint inplace):
    """The plan-cache key of elementwise ``op`` over ``operands`` into
    ``out`` (None: a new tensor): ``(op, inplace, bytes)``, the bytes laying
    out each operand's scalar type (bool, int or float exactly) or CUDA
    tensor dtype, device, shape and strides, then out's; None for a call
    that is not planned (a CPU tensor, another scalar type). One bytes
    object instead of nested tuples keeps the per-op host cost low."""
    cdef vector[char] buf
    buf.reserve(64)
    for x in operands:
        tx = type(x)
        if tx is bool:
            buf.push_back(b"b"[0])
        elif tx is int:
            buf.push_back(b"i"[0])
        elif tx is float:
            buf.push_back(b"f"[0])
        elif not _append_cuda_tensor(buf, b"t"[0], x):
            return None
    if out is not None and not _append_cuda_tensor(buf, b"o"[0], out):
        return None
    return (op, inplace, PyBytes_FromStringAndSize(buf.data(), buf.size()))
