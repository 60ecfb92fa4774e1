# SPDX-License-Identifier: Apache-2.0
from cuda.bindings cimport cydriver

cdef dict describe_graph(cydriver.CUgraph g, bint detailed, dict conditionals)
