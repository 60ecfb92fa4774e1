# SPDX-License-Identifier: Apache-2.0
"""torch.compile's rules without a GPU (tensorplay._graph.compiled): the
compile-start callback refuses only on a thread with a tensorplay capture
open, each trigger with its own advice; it is registered once with Dynamo's
callback handler, and never imports Dynamo; the errors explained through
foreign.explain_capture_error (Dynamo's rewrapping, PyTorch's graph replay
inside a capture, Triton autotuning), others left alone; tp.cuda.embed's
argument checks."""

import sys
import threading
import types

import pytest

import tensorplay as tp
from tensorplay._graph import compiled, foreign

REPLAY_TEXT = "Cannot prepare for replay during capturing stage."


def _args(trigger, compile_id="0/0"):
    return types.SimpleNamespace(callback_trigger=types.SimpleNamespace(name=trigger), compile_id=compile_id)


@pytest.fixture
def capturing_here(monkeypatch):
    """A tensorplay capture open on this thread, as the registry tells it."""
    me = threading.get_ident()
    monkeypatch.setattr(compiled, "open_captures", lambda: [types.SimpleNamespace(thread_id=me)])


def test_no_capture_open_lets_compiles_run():
    assert compiled._on_compile_start(_args("DYNAMO")) is None
    assert not compiled.capture_open_on_this_thread()


def test_a_capture_on_another_thread_lets_compiles_run(monkeypatch):
    monkeypatch.setattr(compiled, "open_captures", lambda: [types.SimpleNamespace(thread_id=threading.get_ident() + 1)])
    assert compiled._on_compile_start(_args("DYNAMO")) is None


@pytest.mark.parametrize("trigger, words", [
    ("DYNAMO", ["began compiling", "first call", "recompilation", "new shape", "compile id 3/1",
                "eagerly before capturing", "can capture again"]),
    ("LAZY_BACKWARD", ["backward", "eagerly before capturing"]),
    ("TRITON_AUTOTUNING", ["autotuning", "eagerly before capturing"]),
    ("CUDAGRAPH_RECORDING", ["reduce-overhead", "max-autotune-no-cudagraphs", "can capture again"]),
    ("SOMETHING_NEW", ["SOMETHING_NEW", "eagerly before capturing"]),
])
def test_each_trigger_inside_a_capture_raises_with_its_advice(capturing_here, trigger, words):
    with pytest.raises(tp.cuda.CompileInCaptureError) as info:
        compiled._on_compile_start(_args(trigger, "3/1"))
    for w in words:
        assert w in str(info.value), (w, str(info.value))


def test_the_callback_is_registered_once_and_dynamo_never_imported(monkeypatch):
    registered = []
    handler = types.SimpleNamespace(register_start_callback=registered.append)
    fake = types.ModuleType("torch._dynamo.callback")
    fake.callback_handler = handler
    monkeypatch.setattr(compiled, "_watching", [None])
    monkeypatch.delitem(sys.modules, "torch._dynamo.callback", raising=False)
    compiled.watch_compiles()                       # Dynamo not imported: nothing, and nothing imported
    assert registered == [] and "torch._dynamo.callback" not in sys.modules
    monkeypatch.setitem(sys.modules, "torch._dynamo.callback", fake)
    for _ in range(3):
        compiled.watch_compiles()
    assert registered == [compiled._on_compile_start]
    old = types.ModuleType("torch._dynamo.callback")      # a Dynamo without the handler: nothing
    monkeypatch.setitem(sys.modules, "torch._dynamo.callback", old)
    compiled.watch_compiles()
    assert registered == [compiled._on_compile_start]


def _as_dynamo_wraps(exc):
    """``exc`` rewrapped as Dynamo's convert_frame does: ``from None``, the
    original kept as the context only."""
    try:
        try:
            raise exc
        except Exception as e:
            raise RuntimeError(f"{type(e).__qualname__}: {e}") from None
    except RuntimeError as wrapped:
        return wrapped


def test_our_error_comes_back_out_of_dynamos_wrapping(capturing_here):
    with pytest.raises(tp.cuda.CompileInCaptureError) as info:
        compiled._on_compile_start(_args("DYNAMO"))
    wrapped = _as_dynamo_wraps(info.value)
    better = foreign.explain_capture_error(wrapped)
    assert isinstance(better, tp.cuda.CompileInCaptureError) and str(better) == str(info.value)
    assert foreign.explain_capture_error(better) is None                # never rewrapped
    text_only = RuntimeError(f"InternalTorchDynamoError: CompileInCaptureError: {info.value}")
    assert str(foreign.explain_capture_error(text_only)) == str(info.value)


def test_a_torch_graph_replayed_in_a_capture_is_explained():
    better = foreign.explain_capture_error(RuntimeError(REPLAY_TEXT))
    assert isinstance(better, tp.cuda.CompileInCaptureError)
    for w in ("reduce-overhead", "max-autotune-no-cudagraphs", "keep_graph=True", "tp.cuda.embed"):
        assert w in str(better)


def test_triton_autotuning_in_the_traceback_is_explained():
    namespace = {}
    source = ("def do_bench(fn):\n"
              "    raise RuntimeError('CUDA error: operation not permitted when stream is capturing')\n")
    exec(compile(source, "/site-packages/triton/testing.py", "exec"), namespace)
    try:
        namespace["do_bench"](None)
    except RuntimeError as exc:
        better = foreign.explain_capture_error(exc)
    assert isinstance(better, tp.cuda.CompileInCaptureError)
    assert "Triton autotuning" in str(better) and "eagerly before capturing" in str(better)
    # the same name outside Triton's and Inductor's files is not autotuning
    exec(compile(source, "/home/me/bench.py", "exec"), namespace)
    try:
        namespace["do_bench"](None)
    except RuntimeError as exc:
        assert foreign.explain_capture_error(exc) is None


def test_other_errors_are_left_alone():
    assert compiled.explain_compile_error(RuntimeError("CUDA error: an illegal memory access")) is None
    assert compiled.explain_compile_error(ValueError("shape")) is None


def test_embed_refuses_what_is_not_a_graph():
    with pytest.raises(TypeError, match="embed expects"):
        tp.cuda.embed("a graph")
    with pytest.raises(TypeError, match="embed expects"):
        tp.cuda.embed(True)


class _NoGraph:
    """A torch.cuda.CUDAGraph captured with keep_graph=False, as its raw_cuda_graph() answers."""

    def raw_cuda_graph(self):
        raise RuntimeError("You cannot access the raw cudaGraph_t instance unless CUDAGraph was "
                           "initialized with keep_graph=true")


class _Reset:
    def raw_cuda_graph(self):
        return 0


def test_embed_refuses_a_torch_graph_without_its_graph():
    with pytest.raises(RuntimeError, match="keep_graph=True") as info:
        tp.cuda.embed(_NoGraph())
    assert isinstance(info.value.__cause__, RuntimeError)
    with pytest.raises(RuntimeError, match="holds no captured graph.*keep_graph=True"):
        tp.cuda.embed(_Reset())
