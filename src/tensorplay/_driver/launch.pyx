# SPDX-License-Identifier: Apache-2.0
"""Loaded CUBIN modules and their kernels, launched with packed arguments."""

cimport cython
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.float cimport PyFloat_AsDouble
from cuda.bindings cimport cydriver
from libc.stdint cimport uintptr_t
from libc.string cimport memcpy
from libcpp.vector cimport vector

from tensorplay._driver.context cimport LIVE_MODULES, check, count_live, ensure_context, validate_device
from tensorplay._driver.stream cimport current_stream_handle
from tensorplay._tensor.base cimport TensorBase

# the CUmodules this process loaded through Module, as ints: a graph's kernel
# node runs one of our kernels exactly when its function's module is here
cdef set _own_modules = set()


cdef bint is_own_function(cydriver.CUfunction func) noexcept:
    """True when ``func`` belongs to a module loaded by Module (our generated kernels)."""
    cdef cydriver.CUmodule mod = NULL
    if func == NULL or cydriver.cuFuncGetModule(&mod, func) != cydriver.CUDA_SUCCESS:
        return False
    return <uintptr_t>mod in _own_modules

cdef class Module:
    """A CUBIN loaded on one device, cuModuleLoadData; unloaded when it dies."""

    def __cinit__(self, bytes image not None, int device):
        self._handle = NULL
        self.device = device
        validate_device(device)
        cdef const char* data = PyBytes_AS_STRING(image)
        cdef cydriver.CUstreamCaptureMode mode = cydriver.CU_STREAM_CAPTURE_MODE_RELAXED
        cdef cydriver.CUresult r
        with nogil:
            ensure_context(device)
            # a first use inside a graph capture loads the module: relax this
            # thread's capture mode for the call, as for cuMemAlloc
            check(cydriver.cuThreadExchangeStreamCaptureMode(&mode))
            r = cydriver.cuModuleLoadData(&self._handle, <const void*>data)
            check(cydriver.cuThreadExchangeStreamCaptureMode(&mode))
            check(r)
        count_live(LIVE_MODULES, 1)
        _own_modules.add(<uintptr_t>self._handle)

    def __dealloc__(self):
        if self._handle != NULL:
            try:
                if _own_modules is not None:     # None at interpreter shutdown
                    _own_modules.discard(<uintptr_t>self._handle)
                ensure_context(self.device)
                cydriver.cuModuleUnload(self._handle)
                count_live(LIVE_MODULES, -1)
            except BaseException:
                pass
            self._handle = NULL

    def get_function(self, str name):
        """Look up kernel ``name``, cuModuleGetFunction."""
        cdef Function f = Function.__new__(Function)
        cdef bytes bname = name.encode()
        cdef const char* cname = bname
        with nogil:
            check(cydriver.cuModuleGetFunction(&f._handle, self._handle, cname))
        f.module = self
        f.name = name
        f.device = self.device
        return f

    @property
    def handle(self):
        return <uintptr_t>self._handle


@cython.final
cdef class Function:
    """A kernel of a loaded module."""

    cdef int c_launch(self, unsigned int gx, unsigned int gy, unsigned int gz,
                      unsigned int bx, unsigned int by, unsigned int bz,
                      unsigned int shared, cydriver.CUstream stream,
                      const void* params, size_t params_size) except -1 nogil:
        cdef void* extra[5]
        cdef void** ex = NULL
        if params_size:
            fill_launch_extra(extra, params, &params_size)
            ex = extra
        ensure_context(self.device)
        check(cydriver.cuLaunchKernel(self._handle, gx, gy, gz, bx, by, bz, shared, stream, NULL, ex))
        return 0

    def launch(self, grid, block, bytes params not None, unsigned int shared_mem=0, stream=None):
        """Launch on ``stream`` (a handle int; None: the current stream), cuLaunchKernel.

        ``grid`` and ``block`` are ints or tuples of up to three ints;
        ``params`` is the argument buffer laid out as the kernel's C signature.
        """
        cdef unsigned int g[3]
        cdef unsigned int b[3]
        _dims(grid, g, "grid")
        _dims(block, b, "block")
        cdef cydriver.CUstream s
        if stream is None:
            s = current_stream_handle(self.device)
        else:
            s = <cydriver.CUstream><uintptr_t>stream
        cdef const void* p = PyBytes_AS_STRING(params)
        cdef size_t n = PyBytes_GET_SIZE(params)
        with nogil:
            self.c_launch(g[0], g[1], g[2], b[0], b[1], b[2], shared_mem, s, p, n)

    def max_active_blocks(self, int block, size_t shared_mem=0):
        """How many blocks of ``block`` threads one SM holds at once,
        cuOccupancyMaxActiveBlocksPerMultiprocessor."""
        cdef int n = 0
        with nogil:
            ensure_context(self.device)
            check(cydriver.cuOccupancyMaxActiveBlocksPerMultiprocessor(&n, self._handle, block, shared_mem))
        return n

    def attribute(self, str which):
        """Read a function attribute: 'num_regs', 'max_threads_per_block',
        'shared_size_bytes', 'local_size_bytes', 'max_dynamic_shared_size_bytes'."""
        attrs = {
            "num_regs": cydriver.CU_FUNC_ATTRIBUTE_NUM_REGS,
            "max_threads_per_block": cydriver.CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK,
            "shared_size_bytes": cydriver.CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES,
            "local_size_bytes": cydriver.CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES,
            "max_dynamic_shared_size_bytes": cydriver.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
        }
        if which not in attrs:
            raise ValueError(f"unknown attribute {which!r}; expected one of {sorted(attrs)}")
        cdef int v = 0
        cdef cydriver.CUfunction_attribute a = attrs[which]
        with nogil:
            check(cydriver.cuFuncGetAttribute(&v, a, self._handle))
        return v

    def set_max_dynamic_shared_memory(self, int nbytes):
        with nogil:
            check(cydriver.cuFuncSetAttribute(
                self._handle, cydriver.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, nbytes))

    @property
    def handle(self):
        return <uintptr_t>self._handle

    def __repr__(self):
        return f"<Function {self.name} device={self.device}>"


cdef class LaunchPacker:
    """The compiled half of a launch plan: lays out (pointers, n, scalars,
    geometry) as the kernel's argument buffer, 8 bytes each but the trailing
    geometry bytes, and launches on the current stream, with no Python
    frame, struct packing or grid parsing per call.

    ``kinds`` gives each scalar as double ('f') or long long ('i'); ``f`` is
    a :class:`Function`, or any object with its ``launch`` method (tests'
    stand-ins, which get the same buffer)."""

    cdef object _f
    cdef Function _fn
    cdef int _device
    cdef long long _n
    cdef Py_ssize_t _nptrs
    cdef vector[char] _kinds
    cdef bytes _geom
    cdef object _grid
    cdef object _block
    cdef unsigned int _g[3]
    cdef unsigned int _b[3]

    def __init__(self, f, int device, long long n, Py_ssize_t nptrs, kinds, bytes geom not None, grid, block):
        self._f = f
        self._fn = f if type(f) is Function else None
        self._device = device
        self._n = n
        self._nptrs = nptrs
        for k in kinds:
            if k not in ("f", "i"):
                raise ValueError(f"scalar kinds are 'f' (double) or 'i' (long long), got {k!r}")
            self._kinds.push_back(b"f"[0] if k == "f" else b"i"[0])
        self._geom = geom
        self._grid = grid
        self._block = block
        _dims(grid, self._g, "grid")
        _dims(block, self._b, "block")

    cdef int _put_scalars(self, vector[unsigned long long]& words, object values, object positions) except -1:
        """Append each scalar as its kind's 8 bytes: ``values[positions[i]]``
        converted as the front end does (``float()``, ``int()``), or without
        positions ``values[i]`` as struct packing would take it (no float
        for an integer)."""
        cdef Py_ssize_t i, n = self._kinds.size()
        cdef double d
        cdef long long q
        cdef unsigned long long w
        if len(positions if positions is not None else values) != n:
            raise ValueError(f"the kernel takes {n} scalars, got {len(positions if positions is not None else values)}")
        for i in range(n):
            v = values[positions[i]] if positions is not None else values[i]
            try:
                if self._kinds[i] == b"f"[0]:
                    d = PyFloat_AsDouble(v) if type(v) is float else <double>float(v)
                    memcpy(&w, &d, 8)
                else:
                    q = int(v) if positions is not None else v
                    memcpy(&w, &q, 8)
            except (OverflowError, TypeError, ValueError) as exc:
                raise OverflowError(f"a scalar does not fit the kernel's argument type: {exc}") from None
            words.push_back(w)
        return 0

    cdef int _send(self, vector[unsigned long long]& words, object stream) except -1:
        cdef size_t nwords = words.size() * 8
        cdef size_t ng = PyBytes_GET_SIZE(self._geom)
        cdef vector[char] buf
        cdef cydriver.CUstream s
        buf.resize(nwords + ng)
        memcpy(buf.data(), words.data(), nwords)
        if ng:
            memcpy(buf.data() + nwords, PyBytes_AS_STRING(self._geom), ng)
        if stream is None:
            s = current_stream_handle(self._device)
        else:
            s = <cydriver.CUstream><uintptr_t>stream
        if self._fn is None:
            self._f.launch(self._grid, self._block, PyBytes_FromStringAndSize(buf.data(), buf.size()),
                           0, <uintptr_t>s)
            return 0
        with nogil:
            self._fn.c_launch(self._g[0], self._g[1], self._g[2], self._b[0], self._b[1], self._b[2], 0, s,
                              buf.data(), buf.size())
        return 0

    def launch(self, ptrs, scalars, stream=None):
        """Launch over the addresses ``ptrs`` and the ``scalars`` on ``stream``
        (a handle; None: the current stream of the plan's device)."""
        cdef vector[unsigned long long] words
        if len(ptrs) != self._nptrs:
            raise ValueError(f"the kernel takes {self._nptrs} pointers, got {len(ptrs)}")
        words.reserve(self._nptrs + 1 + self._kinds.size())
        for p in ptrs:
            words.push_back(<unsigned long long>p)
        words.push_back(<unsigned long long>self._n)
        self._put_scalars(words, scalars, None)
        return self._send(words, stream)

    def launch_operands(self, TensorBase out not None, tuple operands, tuple tensor_pos, tuple scalar_pos):
        """Launch writing ``out`` over ``operands[k]`` for k in ``tensor_pos``
        (CUDA tensors, their addresses handed out as ``data_ptr()`` does) and
        the scalars ``operands[k]`` for k in ``scalar_pos``, on the current stream."""
        cdef vector[unsigned long long] words
        cdef TensorBase t
        if len(tensor_pos) + 1 != self._nptrs:
            raise ValueError(f"the kernel takes {self._nptrs} pointers, got {len(tensor_pos) + 1}")
        words.reserve(self._nptrs + 1 + self._kinds.size())
        out.c_note_use()
        words.push_back(out._ptr)
        for k in tensor_pos:
            t = <TensorBase?>operands[k]
            t.c_note_use()
            words.push_back(t._ptr)
        words.push_back(<unsigned long long>self._n)
        self._put_scalars(words, operands, scalar_pos)
        return self._send(words, None)


cdef int _dims(object d, unsigned int* out, str what) except -1:
    out[0] = out[1] = out[2] = 1
    if isinstance(d, int):
        d = (d,)
    try:
        n = len(d)
    except TypeError:
        raise TypeError(f"{what} must be an int or a tuple of up to 3 ints, got {type(d).__name__}")
    if n < 1 or n > 3:
        raise ValueError(f"{what} must have 1 to 3 dimensions, got {n}")
    for i in range(n):
        v = d[i]
        if isinstance(v, bool) or not isinstance(v, int):
            raise TypeError(f"{what} dimensions must be ints, got {v!r}")
        if v < 1 or v > 0x7FFFFFFF:
            raise ValueError(f"{what} dimensions must be in [1, 2**31), got {v}")
        out[i] = v
    return 0
