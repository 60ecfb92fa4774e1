# SPDX-License-Identifier: Apache-2.0
from cuda.bindings cimport cydriver


cdef bint embed_if_capturing(int device, cydriver.CUstream stream, cydriver.CUgraph child, long long pool_id,
                             dict kept, dict foreign_holds, bint has_conditionals) except -1
