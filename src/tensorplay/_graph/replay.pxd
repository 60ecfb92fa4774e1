# SPDX-License-Identifier: Apache-2.0
from cuda.bindings cimport cydriver
from libc.stdint cimport uintptr_t

from tensorplay._graph.rebind cimport Rebinder
from tensorplay._memory.pool cimport Pool
from tensorplay._graph.stager cimport Stager


cdef class Executable:
    cdef cydriver.CUgraph graph
    cdef cydriver.CUgraphExec handle      # the executable
    # The graph the executable was instantiated from when an in-place update
    # has since replaced ``graph`` (NULL: ``graph``): its nodes stay the ones
    # that cuGraphExec*SetParams knows the executable's nodes by.
    cdef cydriver.CUgraph exec_graph
    cdef dict kept                  # id -> storage from outside the pool that the captured work uses
    cdef dict foreign_holds         # what other libraries' captured work needs (PyTorch's pool)
    cdef dict conditionals          # conditional node -> (kind, [body graphs], handle), for describe()
    cdef long long pool_id
    cdef bint has_pool
    cdef Pool pool                  # the pool object while held: replays are refused while it sleeps

    cdef object update(self, cydriver.CUgraph g)
    cdef void take_updated(self, Executable previous) noexcept
    cdef void move_to(self, Executable other) noexcept
    cdef void destroy(self, int device, tuple streams) noexcept


cdef class ReplayBase:
    cdef Executable _cur            # never None
    cdef Executable _previous       # a re-capture's predecessor until capture_end has a new executable, or None
    cdef readonly int _device
    cdef object _kernels
    cdef bint _capturing            # (the capture's state, set by CUDAGraphBase)
    cdef int _pid                   # the process that captured
    cdef size_t _num_nodes
    cdef object _update_result      # None, "success" or why cuGraphExecUpdate failed
    cdef uintptr_t _last_replay_stream
    cdef set _replay_streams        # streams replayed on: kept memory is reused only after them
    cdef Stager _stager             # stage_and_launch's, for the last static inputs
    cdef Rebinder _rebinder         # rebind_and_launch's, for the last static tensors

    cdef Rebinder _rebinder_for(self, object static_inputs, object static_outputs, str what)
    cdef void _drop_rebinder(self) noexcept
    cdef void _drop_stager(self) noexcept
    cdef int _note_replay_stream(self, uintptr_t stream) except -1
    cdef bint _embed(self, cydriver.CUstream s) except -1
    cdef int _replay_error(self, str what) except -1
    cdef int _asleep_error(self, str what) except -1
    cdef void retire_previous(self) noexcept
    cdef void release_executables(self) noexcept
