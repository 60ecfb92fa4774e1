# SPDX-License-Identifier: Apache-2.0
"""CUDA devices, streams, events, memory and graphs: ``tensorplay.cuda``.

A facade: every name is defined in the package of its concept (driver,
memory, tensor core, kernels, ops, random, graph) and re-exported here.
"""

import sys

from tensorplay._driver.context import (CudaError, CudaUnavailableError, OutOfMemoryError, can_device_access_peer,
                                        current_device, device_count, disable_peer_access, driver_version,
                                        enable_peer_access, get_device_capability, get_device_name,
                                        get_device_properties, is_available, is_device_supported, mem_get_info,
                                        set_device, unavailable_reason)
from tensorplay._driver.devices import device
from tensorplay._driver.stream import (Event, ExternalStream, HostFunctionError, Stream, current_stream,
                                       default_stream, set_stream, stream)
from tensorplay._driver.hostfn import launch_host_func
from tensorplay._memory.api import (empty_cache, graph_pool_handle, max_memory_allocated, max_memory_reserved,
                                    memory_allocated, memory_reserved, memory_snapshot, memory_stats,
                                    reset_peak_memory_stats)
from tensorplay._memory.summary import live_driver_objects, memory_summary
from tensorplay._memory.sharing import (ExportedSegment, MappedPeerMemory, PoolExport, export_pool_handles,
                                        import_segments)
from tensorplay._tensor.transfer import synchronize
from tensorplay._kernels.cublaslt import CublasError
from tensorplay._kernels.nvrtc import NVRTCError, clear_kernel_cache, kernel_cache_dir, kernel_cache_info
from tensorplay._kernels.precompile import compile_progress
from tensorplay._ops.blas import CublasUnavailableError
from tensorplay._ops.custom import ElementwiseKernel, RawKernel
from tensorplay._random.cuda import (default_generators, get_rng_state, initial_seed, manual_seed, manual_seed_all,
                                     set_rng_state)
from tensorplay._graph import cudagraphs
from tensorplay._graph.cudagraphs import cudagraphify
from tensorplay._graph.dot import to_dot
from tensorplay._graph.kernel_catalog import precompile
from tensorplay._graph.graphs import CUDAGraph, graph, is_current_stream_capturing, make_graphed_callables
from tensorplay._graph.foreign import ForeignRandomError, foreign_capture_libraries, set_foreign_capture
from tensorplay._graph.collectives import CollectiveError, check_collectives_capturable
from tensorplay._graph.compiled import CompileInCaptureError
from tensorplay._graph.embedding import embed
from tensorplay._graph.pools import GraphPool, PoolAsleepError
from tensorplay._graph.graphset import GraphSet
from tensorplay.cuda import graphs, random

# tensorplay.cuda.cudagraphs is the module tensorplay._graph.cudagraphs (and
# tensorplay._stax.cudagraphs, the seed's name): one object under each name.
sys.modules[__name__ + ".cudagraphs"] = cudagraphs

__all__ = ["make_graphed_callables", "CUDAGraph", "GraphPool", "GraphSet", "PoolAsleepError",
    "ExportedSegment", "MappedPeerMemory", "PoolExport", "export_pool_handles", "import_segments", "ElementwiseKernel", "RawKernel", "cudagraphify", "graph",
    "is_current_stream_capturing", "to_dot", "CollectiveError", "check_collectives_capturable", "CompileInCaptureError", "embed", "ForeignRandomError", "foreign_capture_libraries", "set_foreign_capture",
    "CublasError", "CublasUnavailableError", "CudaError", "CudaUnavailableError", "OutOfMemoryError", "Event", "ExternalStream", "Stream",
    "HostFunctionError", "NVRTCError", "launch_host_func",
    "can_device_access_peer", "clear_kernel_cache", "current_device", "current_stream", "default_stream", "device",
    "disable_peer_access", "enable_peer_access",
    "device_count", "driver_version", "empty_cache", "get_device_capability", "get_device_name",
    "get_device_properties", "graph_pool_handle", "is_available", "is_device_supported", "kernel_cache_dir", "kernel_cache_info",
    "compile_progress", "precompile",
    "live_driver_objects", "max_memory_allocated",
    "max_memory_reserved", "mem_get_info", "memory_allocated", "memory_reserved", "memory_snapshot", "memory_stats", "memory_summary",
    "reset_peak_memory_stats", "set_device", "set_stream", "stream", "synchronize",
    "unavailable_reason",
    "default_generators", "get_rng_state", "initial_seed", "manual_seed", "manual_seed_all", "set_rng_state",
]
