# SPDX-License-Identifier: Apache-2.0
# cython: language_level=3
"""Benchmark helper (not part of tensorplay): the physical limit of replay, a C
loop of cuGraphLaunch on one executable with the GIL released."""

from cuda.bindings cimport cydriver
from libc.stdint cimport uintptr_t


def graph_launch_loop(uintptr_t graph_exec, uintptr_t stream, int n):
    """Launch ``graph_exec`` ``n`` times on ``stream``; returns the last CUresult."""
    cdef int i
    cdef cydriver.CUresult r = cydriver.CUDA_SUCCESS
    with nogil:
        for i in range(n):
            r = cydriver.cuGraphLaunch(<cydriver.CUgraphExec>graph_exec, <cydriver.CUstream>stream)
            if r != cydriver.CUDA_SUCCESS:
                break
    return <int>r


def graph_launch_once(uintptr_t graph_exec, uintptr_t stream):
    """One cuGraphLaunch from a plain Cython def with the GIL released: the
    floor for any launch called from Python (call + GIL release + driver)."""
    cdef cydriver.CUresult r
    with nogil:
        r = cydriver.cuGraphLaunch(<cydriver.CUgraphExec>graph_exec, <cydriver.CUstream>stream)
    return <int>r
