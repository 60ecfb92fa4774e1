# SPDX-License-Identifier: Apache-2.0
"""Loaded CUBIN modules and their kernels, launched with packed arguments.

The launch plans that pack tensors' addresses and scalars for a kernel are
tensorplay._kernels.packer (they read tensors, a floor above this one)."""

cimport cython
import os

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE
from cuda.bindings cimport cydriver
from libc.stdint cimport uintptr_t
from libc.string cimport memset

from tensorplay._driver.context cimport LIVE_MODULES, check, count_live, ensure_context, validate_device
from tensorplay._driver.stream cimport current_stream_handle
from tensorplay._driver.teardown cimport unload_module

# the CUmodules this process loaded through Module, as ints: a graph's kernel
# node runs one of our kernels exactly when its function's module is here
cdef set _own_modules = set()

# Programmatic dependent launch (Hopper and newer): a kernel whose code waits
# on the grid dependency (griddepcontrol.wait) before it reads anything is
# launched with programmatic stream serialization, so it may start while the
# kernel before it drains. TENSORPLAY_PDL=0 turns it off from the start.
cdef bint pdl_on = os.environ.get("TENSORPLAY_PDL", "1").strip().lower() not in ("0", "false", "no", "off")


def set_pdl_enabled(bint enabled):
    """Launch the kernels that wait on their grid dependency with programmatic
    stream serialization (True, the default) or as plain launches (False).
    Read at each launch: a graph keeps what its capture used."""
    global pdl_on
    pdl_on = enabled


def pdl_enabled():
    """Whether kernels that wait on their grid dependency launch with
    programmatic stream serialization (:func:`set_pdl_enabled`)."""
    return pdl_on


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
            except BaseException:
                pass
            unload_module(self.device, self._handle)     # later, if a capture is open
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
        f.pdl = False
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
        cdef cydriver.CUlaunchConfig config
        cdef cydriver.CUlaunchAttribute attr
        if params_size:
            fill_launch_extra(extra, params, &params_size)
            ex = extra
        ensure_context(self.device)
        if not (self.pdl and pdl_on):
            check(cydriver.cuLaunchKernel(self._handle, gx, gy, gz, bx, by, bz, shared, stream, NULL, ex))
            return 0
        memset(&attr, 0, sizeof(attr))
        attr.id = cydriver.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
        attr.value.programmaticStreamSerializationAllowed = 1
        config.gridDimX, config.gridDimY, config.gridDimZ = gx, gy, gz
        config.blockDimX, config.blockDimY, config.blockDimZ = bx, by, bz
        config.sharedMemBytes = shared
        config.hStream = stream
        config.attrs = &attr
        config.numAttrs = 1
        check(cydriver.cuLaunchKernelEx(&config, self._handle, NULL, ex))
        return 0

    def launch(self, grid, block, bytes params not None, unsigned int shared_mem=0, stream=None):
        """Launch on ``stream`` (a handle int; None: the current stream), cuLaunchKernel.

        ``grid`` and ``block`` are ints or tuples of up to three ints;
        ``params`` is the argument buffer laid out as the kernel's C signature.
        """
        cdef unsigned int g[3]
        cdef unsigned int b[3]
        launch_dims(grid, g, "grid")
        launch_dims(block, b, "block")
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


cdef int launch_dims(object d, unsigned int* out, str what) except -1:
    """Read ``d`` (an int or a tuple of up to three ints, each in [1, 2**31))
    into ``out`` as x, y, z, the missing ones 1; ``what`` names it in errors."""
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
