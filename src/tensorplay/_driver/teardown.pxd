# SPDX-License-Identifier: Apache-2.0
from cuda.bindings cimport cydriver

# Teardown that would break a capture, or call CUDA from the driver's own
# thread, waits: see teardown.pyx.
cdef bint on_driver_thread() noexcept nogil
cdef void set_driver_thread(bint on) noexcept nogil
cdef bint teardown_must_wait() noexcept nogil
cdef bint destroy_must_wait() noexcept
cdef int defer(object fn, tuple args) except -1
cdef void drop_reference_later(void* obj) noexcept nogil
cdef int run_deferred() noexcept
cdef void destroy_graph_objects(int device, cydriver.CUgraphExec exec_graph, cydriver.CUgraph graph) noexcept
cdef void destroy_event(int device, cydriver.CUevent event) noexcept
cdef void unload_module(int device, cydriver.CUmodule module) noexcept
