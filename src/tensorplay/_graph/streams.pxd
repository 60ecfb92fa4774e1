# SPDX-License-Identifier: Apache-2.0
from cuda.bindings cimport cydriver

from tensorplay._driver.stream cimport Stream


cdef object mode_name(int mode)
cdef Stream capture_side_stream(int device)
cdef void release_capture_side_stream(object stream) noexcept
cdef void discard_capture(cydriver.CUstream stream, bint owns_graph=*) noexcept
cdef cydriver.CUgraphNode add_to_capture(cydriver.CUstream stream, cydriver.CUgraphNodeParams* params) except NULL
