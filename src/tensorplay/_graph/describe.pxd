# SPDX-License-Identifier: Apache-2.0
from cuda.bindings cimport cydriver
from libcpp.vector cimport vector

cdef vector[cydriver.CUgraphNode] graph_nodes(cydriver.CUgraph g) except *
cdef int graph_edges(cydriver.CUgraph g, vector[cydriver.CUgraphNode]& froms, vector[cydriver.CUgraphNode]& tos,
                     vector[cydriver.CUgraphEdgeData]& edata) except -1

cdef dict describe_graph(cydriver.CUgraph g, bint detailed, dict conditionals)
cdef int kernel_argument_words(cydriver.CUgraph g, dict conditionals, set out) except -1
