# SPDX-License-Identifier: Apache-2.0
from cuda.bindings cimport cydriver

cdef dict describe_graph(cydriver.CUgraph g, bint detailed, dict conditionals)
cdef int kernel_argument_words(cydriver.CUgraph g, dict conditionals, set out) except -1
