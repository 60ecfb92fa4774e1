# SPDX-License-Identifier: Apache-2.0
from cuda.bindings cimport cydriver
from libc.stdint cimport uintptr_t

from tensorplay._driver.launch cimport Function
from tensorplay._driver.stream cimport Stream


# The kinds of conditional node, numbered as the driver's CUgraphConditionalNodeType
# (cpdef: Python sees them as ints of the same names).
cpdef enum:
    IF_NODE = 0                 # one body (then) or two (then, else)
    WHILE_NODE = 1
    SWITCH_NODE = 2             # num_cases bodies, one per case


cdef class ConditionalFrame:
    cdef cydriver.CUgraphConditionalHandle handle
    cdef int kind
    cdef uintptr_t node
    cdef list bodies                # the node's body CUgraphs as ints, in branch order
    cdef Stream body
    cdef Stream parent
    cdef uintptr_t pred
    cdef str index_dtype            # a SWITCH's index dtype (None: a bool predicate)
    cdef int branch                 # the open branch (-1: none)
    cdef int next_branch            # branches below this one were begun already


cdef class Conditionals:
    cdef list _stack                # [ConditionalFrame], innermost last
    cdef Function _set_cond_fn
    cdef dict _set_switch_fns       # index dtype -> the set-switch kernel
    # the open capture (between open and close): its graph's kernels, device,
    # mode, thread, stream and allocator state; the captured graph's records
    # of its conditional nodes (for describe) and the storages it keeps
    cdef object _kernels
    cdef int _device
    cdef int _mode
    cdef unsigned long _thread
    cdef Stream _root
    cdef object _state
    cdef dict _nodes
    cdef dict _keep
    # the capture's ForeignSession (tensorplay._graph.foreign) or None: other
    # libraries' current streams follow each body's
    cdef object foreign

    cdef int open(self, object kernels, int device, int mode, unsigned long thread, Stream root, object state,
                  dict nodes, dict keep) except -1
    cdef void close(self) noexcept
    cdef void discard(self) noexcept
    cdef void forget_kernels(self) noexcept
    cdef Py_ssize_t depth(self) noexcept
    cdef int begin(self, object graph, int kind, uintptr_t pred, object pred_owner, unsigned int num_bodies,
                   bint open_first, str index_dtype) except -1
    cdef int begin_branch(self, object graph, int kind, int k, str what) except -1
    cdef int end_branch(self, object graph) except -1
    cdef int end(self, object graph) except -1
    cdef int set(self, uintptr_t pred, object pred_owner, str index_dtype) except -1
    cdef tuple innermost(self)
    cdef ConditionalFrame _innermost(self)
    cdef Stream _current_stream(self)
    cdef int _check_capture_thread(self, str what) except -1
    cdef int _check_between_branches(self, ConditionalFrame frame, str what) except -1
    cdef Function _set_kernel_for(self, int kind, str index_dtype)
    cdef int _launch_set_conditional(self, ConditionalFrame frame, uintptr_t pred,
                                     cydriver.CUstream stream) except -1
    cdef int _add_node(self, cydriver.CUgraphConditionalHandle handle, int kind, uintptr_t pred, object pred_owner,
                       unsigned int num_bodies, bint open_first, str index_dtype, Stream cur,
                       cydriver.CUcontext ctx) except -1
    cdef int _open_branch(self, ConditionalFrame frame, int k) except -1
    cdef int _close_branch(self, object graph, ConditionalFrame frame) except -1
    cdef int _check_parent_untouched(self, object graph, ConditionalFrame frame, str what) except -1


cdef str kind_name(int kind)
cdef str body_label(int kind, Py_ssize_t b)
