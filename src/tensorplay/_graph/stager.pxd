# SPDX-License-Identifier: Apache-2.0
from cuda.bindings cimport cydriver
from libc.stdint cimport int64_t, uintptr_t
from libcpp.vector cimport vector

from tensorplay._driver.launch cimport Function
from tensorplay._graph.copytable cimport COPY_TABLE_WORDS


cdef class Stager:
    cdef int _device
    cdef cydriver.CUgraphExec _main       # the graph's own executable (its graph owns it and this)
    cdef cydriver.CUgraph _clone          # the captured graph with the copy node (NULL: two launches)
    cdef cydriver.CUgraphExec _exec       # the clone's executable
    cdef cydriver.CUgraphNode _node       # the copy node, in the clone
    cdef Function _fn                     # the multi-copy kernel for tables of _cap entries
    cdef Py_ssize_t _cap
    cdef Py_ssize_t _n
    cdef tuple _statics                   # the static inputs (tensorplay views of foreign ones)
    cdef tuple _given_statics             # the static inputs as given, that it was built for
    cdef object _copy                     # copy(static, source) for pairs the kernel cannot take
    # per static input: address, size in bytes, dtype code, rank, contiguity, shape (MAX_NDIM each)
    cdef vector[uintptr_t] _dst
    cdef vector[unsigned long long] _nbytes
    cdef vector[int] _dtype
    cdef vector[int] _ndim
    cdef vector[char] _contiguous
    cdef vector[int64_t] _shapes
    # the copy node's parameters: (n, then n (src, dst, nbytes) triples), passed as one buffer
    cdef unsigned long long _table[COPY_TABLE_WORDS]
    cdef size_t _table_size
    cdef void* _extra[5]
    cdef cydriver.CUDA_KERNEL_NODE_PARAMS _params
    # what the staged executable's copy node holds now (-1 entries: not set since it was built)
    cdef unsigned long long _node_table[COPY_TABLE_WORDS]
    cdef Py_ssize_t _node_table_entries
    cdef unsigned int _node_grid_x

    cdef bint holds(self, object static_inputs) noexcept
    cdef int launch(self, object inputs, cydriver.CUstream stream) except -1
    cdef bint _table_unchanged(self, Py_ssize_t nfast) noexcept nogil
    cdef void release(self) noexcept


cdef int check_stage_arguments(object static_inputs, object inputs) except -1
cdef Stager make_stager(cydriver.CUgraph graph, cydriver.CUgraphExec main, int device, object static_inputs,
                        bint can_clone, object multi_copy, object copy, cydriver.CUstream stream)
