# SPDX-License-Identifier: Apache-2.0
"""cuBLASLt, loaded at run time from the nvidia-cublas wheel.

The library's entry points are looked up with dlsym on the handle that
cuda.pathfinder returns (nothing of cuBLAS is linked or bundled). A
``MatmulPlan`` holds everything of one problem signature: the operation and
layout descriptors and the algorithm the heuristic chose, so a call costs
one cublasLtMatmul. Workspaces come from our caching allocator: per stream
eagerly, and per capture (from its pool, released into it at capture end)
while a stream captures, so a graph never allocates inside cuBLASLt and its
workspace is never shared with work outside the graph.

The types and enum values below are cuBLASLt's stable C ABI (cublasLt.h,
cublas_api.h of CUDA 13), declared here because the headers are not a build
requirement.
"""

cimport cython
from cuda.bindings cimport cydriver
from libc.stdint cimport int32_t, int64_t, uint64_t, uintptr_t
from libc.string cimport memset
from posix.dlfcn cimport dlsym

from tensorplay._driver.context cimport check, ensure_context, open_capture_count

from tensorplay._memory.api import allocator as _allocator_of

ctypedef int cublasStatus_t
ctypedef void* cublasLtHandle_t
ctypedef void* cublasLtMatmulDesc_t
ctypedef void* cublasLtMatrixLayout_t
ctypedef void* cublasLtMatmulPreference_t

ctypedef struct cublasLtMatmulAlgo_t:
    uint64_t data[8]

ctypedef struct cublasLtMatmulHeuristicResult_t:
    cublasLtMatmulAlgo_t algo
    size_t workspaceSize
    cublasStatus_t state
    float wavesCount
    int reserved[4]

cdef enum:
    # cudaDataType_t (library_types.h)
    C_R_32F = 0
    C_R_64F = 1
    C_R_16F = 2
    C_R_16BF = 14
    # cublasComputeType_t
    C_COMPUTE_32F = 68
    C_COMPUTE_32F_FAST_TF32 = 77
    C_COMPUTE_64F = 70
    # cublasLtEpilogue_t
    C_EPILOGUE_DEFAULT = 1
    C_EPILOGUE_RELU = 2
    C_EPILOGUE_BIAS = 4
    C_EPILOGUE_GELU = 32

R_32F, R_64F, R_16F, R_16BF = C_R_32F, C_R_64F, C_R_16F, C_R_16BF
COMPUTE_32F, COMPUTE_32F_FAST_TF32, COMPUTE_64F = C_COMPUTE_32F, C_COMPUTE_32F_FAST_TF32, C_COMPUTE_64F
OP_N = 0          # cublasOperation_t
OP_T = 1
EPILOGUE_DEFAULT = C_EPILOGUE_DEFAULT
EPILOGUE_RELU = C_EPILOGUE_RELU
EPILOGUE_BIAS = C_EPILOGUE_BIAS
EPILOGUE_RELU_BIAS = C_EPILOGUE_RELU | C_EPILOGUE_BIAS
EPILOGUE_GELU = C_EPILOGUE_GELU
EPILOGUE_GELU_BIAS = C_EPILOGUE_GELU | C_EPILOGUE_BIAS

cdef enum:
    STATUS_SUCCESS = 0
    DESC_TRANSA = 3
    DESC_TRANSB = 4
    DESC_EPILOGUE = 7
    DESC_BIAS_POINTER = 8
    DESC_BIAS_DATA_TYPE = 26
    LAYOUT_BATCH_COUNT = 5
    LAYOUT_STRIDED_BATCH_OFFSET = 6
    PREF_MAX_WORKSPACE_BYTES = 1
    PREF_MIN_ALIGNMENT_A_BYTES = 5
    PREF_MIN_ALIGNMENT_B_BYTES = 6
    PREF_MIN_ALIGNMENT_C_BYTES = 7
    PREF_MIN_ALIGNMENT_D_BYTES = 8

_STATUS_NAMES = {
    0: "CUBLAS_STATUS_SUCCESS", 1: "CUBLAS_STATUS_NOT_INITIALIZED", 3: "CUBLAS_STATUS_ALLOC_FAILED",
    7: "CUBLAS_STATUS_INVALID_VALUE", 8: "CUBLAS_STATUS_ARCH_MISMATCH", 11: "CUBLAS_STATUS_MAPPING_ERROR",
    13: "CUBLAS_STATUS_EXECUTION_FAILED", 14: "CUBLAS_STATUS_INTERNAL_ERROR",
    15: "CUBLAS_STATUS_NOT_SUPPORTED", 16: "CUBLAS_STATUS_LICENSE_ERROR",
}


class CublasError(RuntimeError):
    """A cuBLASLt call failed.

    Attributes
    ----------
    status : int
        The cublasStatus_t value.
    name : str
        Its name, e.g. ``"CUBLAS_STATUS_NOT_SUPPORTED"``.
    """

    def __init__(self, status, call=""):
        self.status = int(status)
        self.name = _STATUS_NAMES.get(self.status, f"cublasStatus_t({self.status})")
        self.call = call
        super().__init__(f"{call}: {self.name}" if call else self.name)

    def __reduce__(self):
        return (type(self), (self.status, self.call))


CublasError.__module__ = "tensorplay.cuda"

# ------------------------------------------------------------------ entry points

ctypedef cublasStatus_t (*create_fn)(cublasLtHandle_t*) noexcept nogil
ctypedef cublasStatus_t (*destroy_fn)(void*) noexcept nogil
ctypedef size_t (*version_fn)() noexcept nogil
ctypedef cublasStatus_t (*desc_create_fn)(cublasLtMatmulDesc_t*, int, int) noexcept nogil
ctypedef cublasStatus_t (*layout_create_fn)(cublasLtMatrixLayout_t*, int, uint64_t, uint64_t,
                                            int64_t) noexcept nogil
ctypedef cublasStatus_t (*pref_create_fn)(cublasLtMatmulPreference_t*) noexcept nogil
ctypedef cublasStatus_t (*set_attr_fn)(void*, int, const void*, size_t) noexcept nogil
ctypedef cublasStatus_t (*heuristic_fn)(cublasLtHandle_t, cublasLtMatmulDesc_t, cublasLtMatrixLayout_t,
                                        cublasLtMatrixLayout_t, cublasLtMatrixLayout_t,
                                        cublasLtMatrixLayout_t, cublasLtMatmulPreference_t, int,
                                        cublasLtMatmulHeuristicResult_t*, int*) noexcept nogil
ctypedef cublasStatus_t (*matmul_fn)(cublasLtHandle_t, cublasLtMatmulDesc_t, const void*, const void*,
                                     cublasLtMatrixLayout_t, const void*, cublasLtMatrixLayout_t,
                                     const void*, const void*, cublasLtMatrixLayout_t, void*,
                                     cublasLtMatrixLayout_t, const cublasLtMatmulAlgo_t*, void*, size_t,
                                     cydriver.CUstream) noexcept nogil

cdef create_fn lt_create = NULL
cdef destroy_fn lt_destroy = NULL
cdef version_fn lt_version = NULL
cdef desc_create_fn lt_desc_create = NULL
cdef destroy_fn lt_desc_destroy = NULL
cdef set_attr_fn lt_desc_set = NULL
cdef layout_create_fn lt_layout_create = NULL
cdef destroy_fn lt_layout_destroy = NULL
cdef set_attr_fn lt_layout_set = NULL
cdef pref_create_fn lt_pref_create = NULL
cdef destroy_fn lt_pref_destroy = NULL
cdef set_attr_fn lt_pref_set = NULL
cdef heuristic_fn lt_heuristic = NULL
cdef matmul_fn lt_matmul = NULL
cdef bint g_loaded = False


cdef void* _symbol(void* lib, str name) except NULL:
    cdef bytes b = name.encode()
    cdef void* p = dlsym(lib, b)
    if p == NULL:
        raise RuntimeError(f"libcublasLt has no symbol {name}: the nvidia-cublas wheel is too old "
                           f"(tensorplay needs cuBLAS 13)")
    return p


def bind(uintptr_t library_handle):
    """Look up the entry points in the dlopen handle ``library_handle``
    (cuda.pathfinder's LoadedDL._handle_uint). Returns cublasLtGetVersion()."""
    global lt_create, lt_destroy, lt_version, lt_desc_create, lt_desc_destroy, lt_desc_set
    global lt_layout_create, lt_layout_destroy, lt_layout_set, lt_pref_create, lt_pref_destroy
    global lt_pref_set, lt_heuristic, lt_matmul, g_loaded
    cdef void* lib = <void*>library_handle
    if lib == NULL:
        raise ValueError("bind: a null library handle")
    lt_create = <create_fn>_symbol(lib, "cublasLtCreate")
    lt_destroy = <destroy_fn>_symbol(lib, "cublasLtDestroy")
    lt_version = <version_fn>_symbol(lib, "cublasLtGetVersion")
    lt_desc_create = <desc_create_fn>_symbol(lib, "cublasLtMatmulDescCreate")
    lt_desc_destroy = <destroy_fn>_symbol(lib, "cublasLtMatmulDescDestroy")
    lt_desc_set = <set_attr_fn>_symbol(lib, "cublasLtMatmulDescSetAttribute")
    lt_layout_create = <layout_create_fn>_symbol(lib, "cublasLtMatrixLayoutCreate")
    lt_layout_destroy = <destroy_fn>_symbol(lib, "cublasLtMatrixLayoutDestroy")
    lt_layout_set = <set_attr_fn>_symbol(lib, "cublasLtMatrixLayoutSetAttribute")
    lt_pref_create = <pref_create_fn>_symbol(lib, "cublasLtMatmulPreferenceCreate")
    lt_pref_destroy = <destroy_fn>_symbol(lib, "cublasLtMatmulPreferenceDestroy")
    lt_pref_set = <set_attr_fn>_symbol(lib, "cublasLtMatmulPreferenceSetAttribute")
    lt_heuristic = <heuristic_fn>_symbol(lib, "cublasLtMatmulAlgoGetHeuristic")
    lt_matmul = <matmul_fn>_symbol(lib, "cublasLtMatmul")
    g_loaded = True
    return lt_version()


cdef int _raise_status(cublasStatus_t status, const char* call) except -1 nogil:
    with gil:
        raise CublasError(status, call.decode())


cdef inline int check_status(cublasStatus_t status, const char* call) except -1 nogil:
    if status == STATUS_SUCCESS:
        return 0
    return _raise_status(status, call)


cdef int _require_bound() except -1:
    if not g_loaded:
        raise RuntimeError("cuBLASLt is not loaded (tensorplay._ops.blas loads it on first use)")
    return 0


# ------------------------------------------------------------------ handles

@cython.final
cdef class Handle:
    """A cuBLASLt handle for one device, used by one thread."""
    cdef cublasLtHandle_t handle
    cdef readonly int device

    def __cinit__(self, int device):
        _require_bound()
        self.handle = NULL
        self.device = device
        cdef cydriver.CUstreamCaptureMode mode = cydriver.CU_STREAM_CAPTURE_MODE_RELAXED
        cdef cublasStatus_t s
        with nogil:
            ensure_context(device)
            # a first matmul inside a capture creates the handle: relax this
            # thread's capture mode for the call, as for cuMemAlloc
            check(cydriver.cuThreadExchangeStreamCaptureMode(&mode))
            s = lt_create(&self.handle)
            check(cydriver.cuThreadExchangeStreamCaptureMode(&mode))
            check_status(s, "cublasLtCreate")

    def __dealloc__(self):
        # the last reference may go on a thread without a current context
        # (a thread-local's teardown): make the device's current first
        if self.handle != NULL and lt_destroy != NULL:
            try:
                ensure_context(self.device)
            except BaseException:
                pass
            lt_destroy(self.handle)
            self.handle = NULL


# ------------------------------------------------------------------ plans

cdef int _set(set_attr_fn fn, void* obj, int attr, const void* value, size_t size,
              const char* call) except -1:
    check_status(fn(obj, attr, value, size), call)
    return 0


@cython.final
cdef class MatmulPlan:
    """One problem signature, column-major as cuBLASLt sees it:
    ``D = alpha * op(A) @ op(B) + beta * C`` (+ epilogue), D of m x n, k the
    inner size, batch strides in elements (0: broadcast), C's layout is D's.
    Construction asks the heuristic once; ``run`` only launches."""
    cdef Handle owner
    cdef cublasLtMatmulDesc_t desc
    cdef cublasLtMatrixLayout_t a_layout, b_layout, d_layout
    cdef cublasLtMatmulAlgo_t algo
    cdef readonly size_t workspace_size
    cdef readonly int epilogue
    cdef readonly bint double_scale
    cdef readonly float waves

    def __cinit__(self, Handle handle not None, int data_type, int compute_type, int trans_a, int trans_b,
                  uint64_t m, uint64_t n, uint64_t k, int64_t lda, int64_t ldb, int64_t ldd,
                  int32_t batch, int64_t stride_a, int64_t stride_b, int64_t stride_d,
                  int epilogue, int bias_type, size_t workspace_limit, int align_a, int align_b,
                  int align_d):
        self.owner = handle
        self.desc = NULL
        self.a_layout = self.b_layout = self.d_layout = NULL
        self.epilogue = epilogue
        self.double_scale = compute_type == C_COMPUTE_64F
        cdef int scale_type = C_R_64F if self.double_scale else C_R_32F
        check_status(lt_desc_create(&self.desc, compute_type, scale_type), "cublasLtMatmulDescCreate")
        _set(lt_desc_set, self.desc, DESC_TRANSA, &trans_a, sizeof(int), "cublasLtMatmulDescSetAttribute")
        _set(lt_desc_set, self.desc, DESC_TRANSB, &trans_b, sizeof(int), "cublasLtMatmulDescSetAttribute")
        if epilogue != C_EPILOGUE_DEFAULT:
            _set(lt_desc_set, self.desc, DESC_EPILOGUE, &epilogue, sizeof(int),
                 "cublasLtMatmulDescSetAttribute")
        if epilogue & C_EPILOGUE_BIAS:
            _set(lt_desc_set, self.desc, DESC_BIAS_DATA_TYPE, &bias_type, sizeof(int),
                 "cublasLtMatmulDescSetAttribute")
        # stored shapes: op(A) is m x k, op(B) is k x n
        self.a_layout = self._layout(data_type, k if trans_a else m, m if trans_a else k, lda, batch, stride_a)
        self.b_layout = self._layout(data_type, n if trans_b else k, k if trans_b else n, ldb, batch, stride_b)
        self.d_layout = self._layout(data_type, m, n, ldd, batch, stride_d)

        cdef cublasLtMatmulPreference_t pref = NULL
        cdef cublasLtMatmulHeuristicResult_t result
        cdef int found = 0
        cdef unsigned int alignment
        memset(&result, 0, sizeof(result))
        check_status(lt_pref_create(&pref), "cublasLtMatmulPreferenceCreate")
        try:
            _set(lt_pref_set, pref, PREF_MAX_WORKSPACE_BYTES, &workspace_limit, sizeof(size_t),
                 "cublasLtMatmulPreferenceSetAttribute")
            # the pointers' alignment: an algorithm needing more would fault
            alignment = align_a
            _set(lt_pref_set, pref, PREF_MIN_ALIGNMENT_A_BYTES, &alignment, 4, "cublasLtMatmulPreferenceSetAttribute")
            alignment = align_b
            _set(lt_pref_set, pref, PREF_MIN_ALIGNMENT_B_BYTES, &alignment, 4, "cublasLtMatmulPreferenceSetAttribute")
            alignment = align_d
            _set(lt_pref_set, pref, PREF_MIN_ALIGNMENT_C_BYTES, &alignment, 4, "cublasLtMatmulPreferenceSetAttribute")
            _set(lt_pref_set, pref, PREF_MIN_ALIGNMENT_D_BYTES, &alignment, 4, "cublasLtMatmulPreferenceSetAttribute")
            with nogil:
                check_status(lt_heuristic(handle.handle, self.desc, self.a_layout, self.b_layout,
                                          self.d_layout, self.d_layout, pref, 1, &result, &found),
                             "cublasLtMatmulAlgoGetHeuristic")
        finally:
            lt_pref_destroy(pref)
        if found < 1 or result.state != STATUS_SUCCESS:
            raise CublasError(15, "cublasLtMatmulAlgoGetHeuristic found no algorithm")
        self.algo = result.algo
        self.workspace_size = result.workspaceSize
        self.waves = result.wavesCount

    cdef cublasLtMatrixLayout_t _layout(self, int data_type, uint64_t rows, uint64_t cols, int64_t ld,
                                        int32_t batch, int64_t stride) except NULL:
        cdef cublasLtMatrixLayout_t layout = NULL
        check_status(lt_layout_create(&layout, data_type, rows, cols, ld), "cublasLtMatrixLayoutCreate")
        if batch > 1:
            try:
                _set(lt_layout_set, layout, LAYOUT_BATCH_COUNT, &batch, sizeof(int32_t),
                     "cublasLtMatrixLayoutSetAttribute")
                _set(lt_layout_set, layout, LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof(int64_t),
                     "cublasLtMatrixLayoutSetAttribute")
            except BaseException:
                lt_layout_destroy(layout)
                raise
        return layout

    def __dealloc__(self):
        if lt_layout_destroy != NULL:
            if self.a_layout != NULL:
                lt_layout_destroy(self.a_layout)
            if self.b_layout != NULL:
                lt_layout_destroy(self.b_layout)
            if self.d_layout != NULL:
                lt_layout_destroy(self.d_layout)
        if self.desc != NULL and lt_desc_destroy != NULL:
            lt_desc_destroy(self.desc)
        self.desc = NULL
        self.a_layout = self.b_layout = self.d_layout = NULL

    def run(self, uintptr_t a, uintptr_t b, uintptr_t c, uintptr_t d, uintptr_t bias, double alpha,
            double beta, uintptr_t workspace, size_t workspace_bytes, uintptr_t stream):
        """D = alpha * op(A) op(B) + beta * C (+ bias and activation) on ``stream``."""
        cdef double alpha_d = alpha, beta_d = beta
        cdef float alpha_f = <float>alpha, beta_f = <float>beta
        cdef const void* pa = <const void*>&alpha_d if self.double_scale else <const void*>&alpha_f
        cdef const void* pb = <const void*>&beta_d if self.double_scale else <const void*>&beta_f
        cdef void* bias_ptr = <void*>bias
        cdef cydriver.CUstreamCaptureMode mode = cydriver.CU_STREAM_CAPTURE_MODE_RELAXED
        cdef bint relax = open_capture_count() > 0
        cdef cublasStatus_t s
        if workspace_bytes < self.workspace_size:
            raise ValueError(f"the plan needs {self.workspace_size} bytes of workspace, got {workspace_bytes}")
        with nogil:
            ensure_context(self.owner.device)
            if self.epilogue & C_EPILOGUE_BIAS:
                # plans are per thread (see _blas.py): no other call shares the descriptor
                check_status(lt_desc_set(self.desc, DESC_BIAS_POINTER, &bias_ptr, sizeof(void*)),
                             "cublasLtMatmulDescSetAttribute")
            if relax:
                # a first use inside a capture may load cuBLAS's kernels
                check(cydriver.cuThreadExchangeStreamCaptureMode(&mode))
            s = lt_matmul(self.owner.handle, self.desc, pa, <const void*>a, self.a_layout,
                          <const void*>b, self.b_layout, pb, <const void*>c, self.d_layout,
                          <void*>d, self.d_layout, &self.algo, <void*>workspace, workspace_bytes,
                          <cydriver.CUstream>stream)
            if relax:
                check(cydriver.cuThreadExchangeStreamCaptureMode(&mode))
            check_status(s, "cublasLtMatmul")


# ------------------------------------------------------------------ workspaces

cdef dict _stream_workspaces = {}       # (device, stream) -> DeviceAllocation


def workspace(int device, uintptr_t stream, size_t nbytes):
    """Workspace memory for cuBLASLt work queued on ``stream``: while the stream
    captures into one of our pools, the capture's own (from its pool, kept
    until the capture ends, then reusable by later captures sharing the pool);
    otherwise the stream's, allocated once from the device pool."""
    mem = capture_workspace(device, stream, nbytes)
    if mem is not None:
        return mem
    key = (device, stream)
    mem = _stream_workspaces.get(key)
    if mem is None or mem.size < nbytes:
        mem = _stream_workspaces[key] = _allocator_of(device).allocate(nbytes, stream)
    return mem


def captures_open():
    """Whether any capture into our pools is open (cheap: no driver call)."""
    return open_capture_count() > 0


def capture_workspace(int device, uintptr_t stream, size_t nbytes):
    """Take the capture's workspace (see :func:`workspace`) while ``stream``
    captures into one of our pools, else do nothing and return None. Called
    before a product allocates its output, so that a capture sharing a pool
    gets back the workspace block an earlier capture returned, whole."""
    if not open_capture_count():
        return None
    return _allocator_of(device).capture_scratch(stream, "cublaslt-workspace", nbytes)


def clear_workspaces():
    """Return the streams' workspaces to the caching allocator (work already
    queued keeps its memory: the blocks are reused in stream order)."""
    _stream_workspaces.clear()


def workspace_count():
    return len(_stream_workspaces)
