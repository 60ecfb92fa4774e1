# SPDX-License-Identifier: Apache-2.0
"""CUDA graphs: ``tensorplay.cuda.graphs`` (defined in ``tensorplay._graph.graphs``
and, for ``to_dot``, ``tensorplay._graph.dot``)."""

from tensorplay._graph.dot import to_dot
from tensorplay._graph.graphs import (CUDAGraph, graph, graph_pool_handle, is_current_stream_capturing,
                                      make_graphed_callables)

__all__ = ["CUDAGraph", "graph", "graph_pool_handle", "is_current_stream_capturing", "make_graphed_callables",
           "to_dot"]
