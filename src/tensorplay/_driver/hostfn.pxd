# SPDX-License-Identifier: Apache-2.0
from cuda.bindings cimport cydriver


cdef int retain_in_graph(cydriver.CUgraph graph, object obj) except -1
