# SPDX-License-Identifier: Apache-2.0
from cuda.bindings cimport cydriver
from libc.stdint cimport int64_t, uintptr_t
from libcpp.vector cimport vector

from tensorplay._driver.launch cimport Function
from tensorplay._graph.copytable cimport COPY_TABLE_WORDS
from tensorplay._tensor.base cimport TensorBase


# how a kernel node's arguments could be read (read_kernel_args)
cdef enum:
    ARGS_UNREADABLE = 0     # kernelParams without a layout: nothing known
    ARGS_RAW = 1            # the buffer, but not which bytes are which argument
    ARGS_LAID_OUT = 2       # the buffer and each argument's offset and size

cdef int read_kernel_args(cydriver.CUDA_KERNEL_NODE_PARAMS* kp, vector[char]& buf,
                          vector[size_t]& offsets, vector[size_t]& sizes) except -1


cdef struct ArgSlot:
    # one pointer argument of a patchable kernel node that points into a static tensor
    Py_ssize_t node               # index in Rebinder._nodes
    size_t offset                 # byte offset in that node's argument buffer
    unsigned long long delta      # the argument minus the static tensor's address


cdef struct PatchNode:
    cydriver.CUgraphNode node
    cydriver.CUDA_KERNEL_NODE_PARAMS params   # as read; kernelParams and extra are replaced per call
    size_t args_at                # where its argument buffer starts in Rebinder._args
    size_t args_size
    bint dirty                    # its buffer changed since the executable last got it


cdef class Rebinder:
    cdef int _device
    cdef cydriver.CUgraphExec _exec
    cdef Py_ssize_t _n                    # static tensors: the inputs, then the outputs
    cdef Py_ssize_t _n_in
    cdef tuple _statics                   # the static tensors (tensorplay views of foreign ones)
    cdef tuple _given_statics             # the static tensors as given (for holds)
    cdef object _copy                     # copy(dst, src) for fallbacks the copy kernel cannot take
    cdef Function _copy_fn                # the multi-copy kernel (tables of _cap entries), or None
    cdef Py_ssize_t _cap
    # per static tensor: address, the address bound now, layout, whether it is rebound or copied
    cdef vector[uintptr_t] _static_ptr
    cdef vector[uintptr_t] _bound_ptr
    cdef vector[int] _dtype
    cdef vector[int] _ndim
    cdef vector[int64_t] _shapes
    cdef vector[int64_t] _strides
    cdef vector[unsigned long long] _nbytes
    cdef vector[char] _contiguous
    cdef vector[char] _rebindable
    cdef vector[uintptr_t] _align         # the static's address alignment (up to 256)
    cdef vector[uintptr_t] _lo_off        # its span: [address - _lo_off, address + _hi_off)
    cdef vector[uintptr_t] _hi_off
    cdef vector[ArgSlot] _slots           # grouped by tensor: k's are [_slot_at[k], _slot_at[k + 1])
    cdef vector[Py_ssize_t] _slot_at
    cdef vector[PatchNode] _nodes
    cdef vector[char] _args               # every patchable node's argument buffer, back to back
    cdef unsigned long long _in_table[COPY_TABLE_WORDS]
    cdef unsigned long long _out_table[COPY_TABLE_WORDS]
    cdef size_t _table_size
    cdef tuple _bound                     # (inputs, outputs) bound now: kept alive until the next call
    cdef uintptr_t _last_stream           # the stream of the last launch
    cdef vector[uintptr_t] _given_prev    # the addresses of the tensors in _bound
    cdef vector[uintptr_t] _given         # this call's: the tensors' addresses, reused per call
    cdef vector[uintptr_t] _ptrs          # this call's: what each slot points at (given or static)
    cdef readonly bint rebound            # the executable reads other tensors than the statics
    cdef readonly Py_ssize_t patch_calls  # cuGraphExecKernelNodeSetParams calls made (tests)

    cdef bint holds(self, object static_inputs, object static_outputs) noexcept
    cdef int launch(self, object inputs, object outputs, cydriver.CUstream stream) except -1
    cdef str _name(self, Py_ssize_t k)
    cdef int _check_layout(self, TensorBase t, Py_ssize_t k) except -1
    cdef int _check_aliasing(self, const uintptr_t* given, const uintptr_t* ptrs) except -1
    cdef int restore(self) except -1
    cdef int _bind(self, const uintptr_t* ptrs) except -1
    cdef int _push_dirty(self) except -1 nogil
    cdef void release(self) noexcept


cdef Rebinder make_rebinder(cydriver.CUgraph graph, cydriver.CUgraph exec_graph,
                            cydriver.CUgraphExec main, int device,
                            object static_inputs, object static_outputs, dict conditionals,
                            object multi_copy, object copy, str what)
