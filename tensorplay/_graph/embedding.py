# SPDX-License-Identifier: Apache-2.0
"""``tensorplay.cuda.embed``: a captured CUDA graph, tensorplay's or another
library's, added to the capture open on a stream as a child graph node.

The capture is tensorplay's (the graph's owner joins the objects the
capture keeps, given up when its executable is destroyed) or another
library's, PyTorch's ``torch.cuda.graph`` among them (the owner is held
by a CUDA user object of that graph; see tensorplay._graph.children).
"""

from __future__ import annotations

from typing import Any

from tensorplay._driver.context import CudaError, current_device
from tensorplay._driver.stream import ExternalStream, current_stream, stream_of
from tensorplay._graph.foreign import foreign_capture_stream
from tensorplay._graph.children import embed_graph
from tensorplay._graph.capture import CUDAGraphBase
from tensorplay._graph.streams import is_stream_capturing

__all__ = ["embed"]

_KEEP_GRAPH = ("capture it with torch.cuda.CUDAGraph(keep_graph=True), which keeps the graph after "
               "capture_end (raw_cuda_graph()), and keep it un-reset")


def _capturing(handle: int, device: int) -> bool:
    try:
        return bool(is_stream_capturing(handle, device))
    except CudaError:                  # the legacy stream while a blocking stream captures: not ours to use
        return False


def _capture_stream(stream: Any, device: int) -> Any:
    """The capturing stream to embed on: ``stream``, or tensorplay's current
    stream when it captures, or PyTorch's or CuPy's current one when it does."""
    if stream is not None:
        s = stream_of(stream, device)
        if not _capturing(s.handle, s.device_index):
            raise RuntimeError("embed: the stream is not capturing; call embed inside a capture on that stream "
                               "(use replay() to run a graph)")
        return s
    s = current_stream(device)
    if _capturing(s.handle, device):
        return s
    handle = foreign_capture_stream(device)
    if handle is None:
        raise RuntimeError("embed: nothing captures on this thread (neither tensorplay's current stream nor "
                           "PyTorch's or CuPy's); call embed inside 'with tp.cuda.graph(g):' or another "
                           "library's capture (torch.cuda.graph), or pass the capturing stream")
    return ExternalStream(handle, device=device)


def embed(graph: Any, stream: Any = None, *, owner: Any = None) -> None:
    """Add a captured CUDA graph to the capture open now, as a child graph node.

    The driver copies ``graph``'s nodes into the capture; the outer graph
    runs them at each of its replays (inside a WHILE body: at each
    iteration), in stream order with the work captured around the call.
    ``graph``'s memory is kept alive until the outer graph and its
    executables are destroyed, whatever becomes of ``graph``: a tensorplay
    capture keeps the owner with the objects it keeps, another library's
    (``torch.cuda.graph``, CuPy's, cuda.core's) holds it through a CUDA
    user object of its graph, released once that graph is destroyed and
    its replays are done.

    Parameters
    ----------
    graph : CUDAGraph, torch.cuda.CUDAGraph or int
        A tensorplay ``CUDAGraph`` (what ``graph.replay(stream)`` does
        inside a capture); a ``torch.cuda.CUDAGraph`` captured with
        ``keep_graph=True`` (its ``raw_cuda_graph()``; the PyTorch graph
        object, which holds its memory pool, is the owner); any object with
        a ``raw_cuda_graph()`` method; or a raw ``CUgraph`` handle.
    stream : Stream or stream-like, optional
        The capturing stream. Default: tensorplay's current stream when it
        captures (inside ``with tp.cuda.graph(g):`` and its conditional
        bodies), else PyTorch's or CuPy's current stream on this thread
        when it captures.
    owner : object, optional
        What keeps the memory ``graph``'s work uses valid, held as long as
        the outer graph needs it; default the PyTorch graph object (None
        for a raw handle: its memory is the caller's to keep).

    Raises
    ------
    RuntimeError
        Nothing captures; a ``torch.cuda.CUDAGraph`` that keeps no graph
        (``keep_graph=False``, or reset); a graph the driver would refuse as
        a child (conditional nodes, memory allocation or free nodes, or
        inside a conditional body host or event nodes). The capture is left
        intact.
    TypeError
        ``graph`` is none of the above.

    Notes
    -----
    PyTorch advances its random generator's offset in
    ``torch.cuda.CUDAGraph.replay()``, which an embedded graph does not
    call: random ops captured by PyTorch repeat their numbers at every
    replay of the outer graph. Do not ``reset()`` the PyTorch graph while
    the outer graph may replay: reset gives its memory pool back.
    """
    if isinstance(graph, CUDAGraphBase):
        device = graph.device_index if graph.device_index >= 0 else current_device()
        graph.replay(_capture_stream(stream, device))
        return
    raw = getattr(graph, "raw_cuda_graph", None)
    if callable(raw):
        try:
            handle = int(raw())
        except RuntimeError as exc:
            raise RuntimeError(f"embed: this {type(graph).__name__} keeps no CUDA graph ({exc}); "
                               f"{_KEEP_GRAPH}") from exc
        if handle == 0:
            raise RuntimeError(f"embed: this {type(graph).__name__} holds no captured graph (not captured, or "
                               f"reset); {_KEEP_GRAPH}")
        if owner is None:
            owner = graph
    elif isinstance(graph, int) and not isinstance(graph, bool):
        handle = graph
    else:
        raise TypeError(f"embed expects a tensorplay CUDAGraph, a torch.cuda.CUDAGraph (keep_graph=True), an "
                        f"object with raw_cuda_graph() or a CUgraph handle, got {type(graph).__name__}")
    device = current_device()
    s = _capture_stream(stream, device)
    embed_graph(s.device_index, s.handle, handle, owner, "embed")
