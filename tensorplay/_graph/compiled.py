# SPDX-License-Identifier: Apache-2.0
"""``torch.compile`` in tensorplay captures: what it asks of a capture,
known in one place.

A function compiled by ``torch.compile`` (the default mode, or
``mode="max-autotune-no-cudagraphs"``) launches its Triton kernels on
PyTorch's current stream, which inside ``with tp.cuda.graph(g):`` (and
inside a conditional body) is the capture's: once compiled and warmed up,
its kernels are captured like any other PyTorch work. What cannot be
captured:

- compiling: the first call, and every recompilation (a guard that
  fails, a new shape or dtype, a new dynamic size). Dynamo and Inductor
  allocate, synchronize and benchmark on the GPU while they compile;
- Triton autotuning (``max-autotune`` modes, ``@triton.autotune``): it
  benchmarks each configuration and synchronizes at the first run of a
  kernel for a new size;
- ``mode="reduce-overhead"`` (and ``"max-autotune"``): PyTorch's own CUDA
  graphs, recorded and replayed by the compiled function; a graph launch
  cannot be captured, and tensorplay's graph already is the CUDA graph.

:func:`watch_compiles` registers, once, a Dynamo compile-start callback
(``torch._dynamo.callback``) that raises :class:`CompileInCaptureError`
when a compilation or a CUDA graph recording starts on a thread with a
tensorplay capture open, before it queues any GPU work, so the capture is
discarded cleanly. :func:`explain_compile_error` (called from
``tensorplay._graph.foreign.explain_capture_error``) turns that error, as
Dynamo wraps it, and PyTorch's own errors for the other cases into a
:class:`CompileInCaptureError` saying what to do.
"""

from __future__ import annotations

import sys
import threading
from types import TracebackType
from typing import Any

from tensorplay._graph.registry import open_captures

__all__ = ["CompileInCaptureError", "explain_compile_error", "watch_compiles"]


class CompileInCaptureError(RuntimeError):
    """``torch.compile`` compiled, autotuned or used PyTorch's own CUDA graphs
    inside a tensorplay capture, which cannot be captured; the message says
    what to do. The capture was discarded and the graph can capture again."""


CompileInCaptureError.__module__ = "tensorplay.cuda"     # its public path, in tracebacks and reprs

_WARM_UP = ("Call the compiled function eagerly before capturing, with the same shapes, dtypes and "
            "settings as in the capture, so that it is compiled and its kernels autotuned; the capture was "
            "discarded and the graph can capture again")
_NO_CUDA_GRAPHS = ("inside tensorplay graphs use torch.compile's default mode or "
                   "mode='max-autotune-no-cudagraphs' (tensorplay's graph is the CUDA graph); the capture was "
                   "discarded and the graph can capture again")

# Dynamo's CallbackTrigger names -> what started, in words
_TRIGGERS = {
    "DYNAMO": "torch.compile began compiling inside a tensorplay capture (a compiled function's first call, "
              "or a recompilation: a guard failed, a new shape, dtype or dynamic size)",
    "LAZY_BACKWARD": "torch.compile began compiling a backward graph inside a tensorplay capture",
    "TRITON_AUTOTUNING": "torch.compile began autotuning Triton kernels inside a tensorplay capture",
}
_RECORDING = ("a function compiled with mode='reduce-overhead' (or 'max-autotune') began recording PyTorch's own "
              "CUDA graph inside a tensorplay capture; a CUDA graph cannot be recorded or replayed inside another "
              "capture: ")
_REPLAY_TEXT = "Cannot prepare for replay during capturing stage"
_REPLAYING = ("a PyTorch CUDA graph was replayed inside a tensorplay capture (torch.compile's "
              "mode='reduce-overhead' replays its own graphs, as does torch.cuda.CUDAGraph.replay()); a graph "
              "launch cannot be captured. For torch.compile, ")
_EMBED_HINT = ("; to run a torch.cuda.CUDAGraph inside the capture, capture it with "
               "torch.cuda.CUDAGraph(keep_graph=True) and call tp.cuda.embed(torch_graph) there")
_AUTOTUNING = ("Triton autotuning ran inside a tensorplay capture (a kernel of torch.compile's max-autotune "
               "modes, or a @triton.autotune kernel, met a new size): it benchmarks on the GPU and synchronizes, "
               "which invalidated the capture. ")
# where Triton's and Inductor's autotuning benchmarks (functions of theirs, by name)
_AUTOTUNE_FRAMES = frozenset(("benchmark_all_configs", "autotune_to_one_config", "_bench", "do_bench",
                              "coordinate_descent_tuning"))
_AUTOTUNE_FILES = ("triton", "_inductor")

_watching: list[Any] = [None]      # the torch._dynamo.callback module our callback is registered with
_lock = threading.Lock()


def capture_open_on_this_thread() -> bool:
    """True while a tensorplay capture begun on this thread is open."""
    me = threading.get_ident()
    return any(c.thread_id == me for c in open_captures())


def _on_compile_start(args: Any) -> None:
    """Dynamo's compile-start callback: refuse the compilation while this
    thread captures (before it queues GPU work, so the capture stays valid)."""
    if not capture_open_on_this_thread():
        return
    trigger = getattr(getattr(args, "callback_trigger", None), "name", "DYNAMO")
    compile_id = getattr(args, "compile_id", "?")
    if trigger == "CUDAGRAPH_RECORDING":
        raise CompileInCaptureError(_RECORDING + _NO_CUDA_GRAPHS + f" (compile id {compile_id})")
    what = _TRIGGERS.get(trigger, f"torch.compile began work ({trigger}) inside a tensorplay capture")
    raise CompileInCaptureError(f"{what}, compile id {compile_id}; compiling cannot be captured (it allocates, "
                                f"synchronizes and benchmarks on the GPU). {_WARM_UP}")


def watch_compiles() -> None:
    """Register the compile-start callback with Dynamo, once, if Dynamo is
    imported (``torch.compile`` imports it; never imported here: it is
    slow, and a process that never compiles has no use for it)."""
    callback = sys.modules.get("torch._dynamo.callback")
    if callback is None or _watching[0] is callback:
        return
    with _lock:
        if _watching[0] is callback:
            return
        handler = getattr(callback, "callback_handler", None)
        register = getattr(handler, "register_start_callback", None)
        if register is None:
            return                  # an older Dynamo: the errors are explained after the fact
        register(_on_compile_start)
        _watching[0] = callback


def _chain(exc: BaseException) -> list[BaseException]:
    """``exc`` and the exceptions it was raised from or during (Dynamo
    rewraps with ``from None``: the context is kept), at most 16."""
    seen: list[BaseException] = []
    todo: list[BaseException | None] = [exc]
    while todo and len(seen) < 16:
        e = todo.pop(0)
        if e is None or any(e is s for s in seen):
            continue
        seen.append(e)
        todo += [e.__cause__, e.__context__]
    return seen


def _autotuning_frames(tb: TracebackType | None) -> set[str]:
    """The names of Triton's and Inductor's autotuning functions on ``tb``."""
    names = set()
    while tb is not None:
        code = tb.tb_frame.f_code
        if code.co_name in _AUTOTUNE_FRAMES and any(f in code.co_filename for f in _AUTOTUNE_FILES):
            names.add(code.co_name)
        tb = tb.tb_next
    return names


def explain_compile_error(exc: BaseException) -> BaseException | None:
    """A :class:`CompileInCaptureError` for a capture that ``torch.compile``'s
    compiling, autotuning or CUDA graphs failed, or None when ``exc`` is
    something else (or already that error)."""
    if isinstance(exc, CompileInCaptureError):
        return None
    chain = _chain(exc)
    for e in chain:
        if isinstance(e, CompileInCaptureError):
            return CompileInCaptureError(str(e))
    text = " ".join(str(e) for e in chain)
    if "CompileInCaptureError: " in text:           # rewrapped as text alone
        return CompileInCaptureError(text.split("CompileInCaptureError: ", 1)[1].strip())
    if _REPLAY_TEXT in text:
        return CompileInCaptureError(_REPLAYING + _NO_CUDA_GRAPHS + _EMBED_HINT)
    if any(_autotuning_frames(e.__traceback__) for e in chain):
        return CompileInCaptureError(_AUTOTUNING + _WARM_UP)
    return None
