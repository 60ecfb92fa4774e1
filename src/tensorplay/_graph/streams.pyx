# SPDX-License-Identifier: Apache-2.0
"""The streams captures run on: the capture modes, the per-device side
streams a capture (and each conditional body) is captured on, the warm-up
stream of graphed callables, adding a node to a stream's capture, and
ending a stream's capture."""

from cuda.bindings cimport cydriver
from libc.stdint cimport uintptr_t

from tensorplay._driver.context cimport check, ensure_context
from tensorplay._driver.stream cimport Stream

import threading

CAPTURE_MODES = {"global": <int>cydriver.CU_STREAM_CAPTURE_MODE_GLOBAL,
                 "thread_local": <int>cydriver.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
                 "relaxed": <int>cydriver.CU_STREAM_CAPTURE_MODE_RELAXED}
cdef dict _MODE_NAMES = {v: k for k, v in CAPTURE_MODES.items()}

cdef object mode_name(int mode):
    """The name of a capture mode (CAPTURE_MODES), or the number when none."""
    return _MODE_NAMES.get(mode, mode)


cdef dict _side_streams = {}      # device -> [Stream]
cdef set _side_in_use = set()     # handles of side streams a capture holds
_side_lock = threading.Lock()     # threads capturing at once must get different streams


cdef Stream capture_side_stream(int device):
    """Reserve a non-blocking stream of ``device`` for a capture (the default
    capture stream, and conditional bodies' streams). Streams are created once
    and reused; give the stream back with release_capture_side_stream."""
    cdef cydriver.CUstreamCaptureStatus status
    cdef Stream s
    with _side_lock:
        pool = _side_streams.setdefault(device, [])
        for obj in pool:
            s = <Stream>obj
            if <uintptr_t>s._handle in _side_in_use:
                continue
            with nogil:
                ensure_context(device)
                check(cydriver.cuStreamIsCapturing(s._handle, &status))
            if status == cydriver.CU_STREAM_CAPTURE_STATUS_NONE:
                _side_in_use.add(<uintptr_t>s._handle)
                return s
        s = Stream(device)
        pool.append(s)
        _side_in_use.add(<uintptr_t>s._handle)
        return s


cdef void release_capture_side_stream(object stream) noexcept:
    """End a capture's hold on a stream from capture_side_stream (any other
    stream, None included: nothing happens)."""
    if isinstance(stream, Stream):
        with _side_lock:
            _side_in_use.discard(<uintptr_t>(<Stream>stream)._handle)


cdef dict _warmup_streams = {}


def warmup_stream(int device):
    """Return the stream graphed callables are warmed up on before capture.

    One per device, kept for the process, so blocks its warm-up freed are
    reused on the same CUDA stream, never on a stream that merely got its
    handle.
    """
    s = _warmup_streams.get(device)
    if s is None:
        s = _warmup_streams[device] = Stream(device)
    return s


cdef void discard_capture(cydriver.CUstream stream, bint owns_graph=True) noexcept:
    """End the capture on ``stream`` and drop what it made; a conditional
    body's graph belongs to its node (owns_graph False) and dies with the
    parent graph."""
    cdef cydriver.CUgraph g = NULL
    if cydriver.cuStreamEndCapture(stream, &g) == cydriver.CUDA_SUCCESS and g != NULL and owns_graph:
        cydriver.cuGraphDestroy(g)


def is_stream_capturing(uintptr_t stream, int device):
    """Return True while ``stream`` is capturing, cuStreamIsCapturing."""
    cdef cydriver.CUstreamCaptureStatus status
    with nogil:
        ensure_context(device)
        check(cydriver.cuStreamIsCapturing(<cydriver.CUstream>stream, &status))
    return status == cydriver.CU_STREAM_CAPTURE_STATUS_ACTIVE


cdef cydriver.CUgraphNode add_to_capture(cydriver.CUstream stream, cydriver.CUgraphNodeParams* params) except NULL:
    """Add a node of ``params`` to ``stream``'s capture after what the stream
    captured last (cuGraphAddNode with the capture's dependencies), and make
    the next captured work follow it (cuStreamUpdateCaptureDependencies)."""
    cdef cydriver.CUstreamCaptureStatus status
    cdef cydriver.cuuint64_t cid = 0
    cdef cydriver.CUgraph g = NULL
    cdef const cydriver.CUgraphNode* deps = NULL
    cdef const cydriver.CUgraphEdgeData* edges = NULL
    cdef size_t ndeps = 0
    cdef cydriver.CUgraphNode node = NULL
    with nogil:
        check(cydriver.cuStreamGetCaptureInfo(stream, &status, &cid, &g, &deps, &edges, &ndeps))
        check(cydriver.cuGraphAddNode(&node, g, deps, edges, ndeps, params))
        check(cydriver.cuStreamUpdateCaptureDependencies(
            stream, &node, NULL, 1, cydriver.CU_STREAM_SET_CAPTURE_DEPENDENCIES))
    return node
