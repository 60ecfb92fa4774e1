# SPDX-License-Identifier: Apache-2.0
"""CUDA graphs: ``tensorplay.cuda.graphs`` (defined in ``tensorplay._graph.graphs``
and, for ``to_dot``, ``tensorplay._graph.dot``)."""

from tensorplay._graph.dot import to_dot
from tensorplay._graph.collectives import CollectiveError, check_collectives_capturable
from tensorplay._graph.compiled import CompileInCaptureError
from tensorplay._graph.embedding import embed
from tensorplay._graph.foreign import ForeignRandomError, foreign_capture_libraries, set_foreign_capture
from tensorplay._graph.graphs import (CUDAGraph, graph, graph_pool_handle, is_current_stream_capturing,
                                      make_graphed_callables)
from tensorplay._graph.graphset import GraphSet
from tensorplay._graph.node_profile import GraphProfile, NodeTime
from tensorplay._graph.pools import GraphPool, PoolAsleepError

__all__ = ["CUDAGraph", "CollectiveError", "CompileInCaptureError", "check_collectives_capturable", "embed", "ForeignRandomError", "GraphPool", "GraphProfile", "GraphSet", "NodeTime", "PoolAsleepError", "foreign_capture_libraries", "graph", "graph_pool_handle",
           "is_current_stream_capturing", "make_graphed_callables", "set_foreign_capture", "to_dot"]
