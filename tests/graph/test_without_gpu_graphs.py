# SPDX-License-Identifier: Apache-2.0
"""Graphs without a GPU and the messages of a graph with nothing captured:
each public method names itself; is_current_stream_capturing() is False
without CUDA (as PyTorch's); make_graphed_callables and cudagraphify given
CPU tensors on a machine without CUDA say that CUDA is unavailable and why."""

import pytest

import tensorplay as tp
from helpers import HAS_CUDA, run_python
from tensorplay.cuda import CUDAGraph

no_gpu = pytest.mark.skipif(HAS_CUDA, reason="checks the no-GPU behaviour")


# ---------------------------------------------------------------- a graph with nothing captured (any machine)

@pytest.mark.parametrize("method, call, words", [
    ("replay", lambda g, x: g.replay(), "nothing to replay"),
    ("upload", lambda g, x: g.upload(), "nothing to replay"),
    ("stage_and_launch", lambda g, x: g.stage_and_launch([x], [x]), "nothing to replay"),
    ("rebind_and_launch", lambda g, x: g.rebind_and_launch([x], [x]), "nothing to replay"),
    ("rebindable", lambda g, x: g.rebindable([x]), "nothing captured"),
    ("describe", lambda g, x: g.describe(), "nothing captured"),
    ("debug_dump", lambda g, x: g.debug_dump("unused.dot"), "nothing captured"),
    ("instantiate", lambda g, x: g.instantiate(), "nothing captured"),
])
def test_an_empty_graph_names_the_method_called(method, call, words, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    g = CUDAGraph()
    with pytest.raises(RuntimeError) as info:
        call(g, tp.ones(2))
    assert str(info.value).startswith(f"{method}: {words}"), str(info.value)
    assert not (tmp_path / "unused.dot").exists()


def test_an_empty_graph_has_no_device_in_its_repr():
    assert repr(CUDAGraph()) == "<CUDAGraph empty>"


# ---------------------------------------------------------------- without CUDA

@no_gpu
def test_nothing_is_capturing_without_cuda():
    assert tp.cuda.is_current_stream_capturing() is False
    assert tp.cuda.graphs.is_current_stream_capturing() is False


@no_gpu
def test_graphing_cpu_tensors_says_cuda_is_unavailable_and_why():
    reason = tp.cuda.unavailable_reason()
    x = tp.ones(3)
    with pytest.raises(tp.cuda.CudaUnavailableError) as info:
        tp.cuda.make_graphed_callables(lambda a: a * 2, (x,))
    assert str(info.value) == (f"make_graphed_callables: sample args must be CUDA tensors, but CUDA is not "
                               f"available: {reason}")
    f = tp.cuda.cudagraphify(lambda a: a * 2)          # wrapping needs no GPU
    with pytest.raises(tp.cuda.CudaUnavailableError) as info:
        f(x)
    assert str(info.value) == (f"cudagraphify: tensor arguments must be CUDA tensors, but CUDA is not "
                               f"available: {reason}")
    assert f.stats()["captures"] == 0


@no_gpu
def test_capturing_without_cuda_says_why():
    reason = tp.cuda.unavailable_reason()
    g = CUDAGraph()
    for call in (g.capture_begin, lambda: tp.cuda.graph(g).__enter__(),
                 lambda: tp.cuda.make_graphed_callables(lambda: tp.ones(1), ()),
                 lambda: tp.cuda.cudagraphify(lambda n: [n])(3)):
        with pytest.raises(tp.cuda.CudaUnavailableError) as info:
            call()
        assert str(info.value) == f"CUDA is not available: {reason}"
    assert not g.is_capturing and repr(g) == "<CUDAGraph empty>"


def test_make_graphed_callables_checks_every_callable_before_capturing():
    with pytest.raises(TypeError, match="^make_graphed_callables: 3 is not callable$"):
        tp.cuda.make_graphed_callables((lambda: tp.ones(1), 3), ((), ()))
    with pytest.raises(TypeError, match=r"^make_graphed_callables: sample args must be a tuple of CUDA tensors "
                                        r"\(one tuple per callable\), got int$"):
        tp.cuda.make_graphed_callables((lambda: tp.ones(1), lambda a: a), ((), 3))


_DISABLED = """
import tensorplay as tp
assert tp.cuda.is_current_stream_capturing() is False
try:
    tp.cuda.make_graphed_callables(lambda a: a, (tp.ones(2),))
except tp.cuda.CudaUnavailableError as exc:
    assert str(exc).startswith("make_graphed_callables: sample args must be CUDA tensors, but CUDA is not "
                               "available: the environment variable TENSORPLAY_DISABLE_CUDA"), exc
else:
    raise AssertionError("make_graphed_callables with CUDA turned off")
print("OK")
"""


def test_the_decisions_hold_with_cuda_turned_off():
    out = run_python(_DISABLED, TENSORPLAY_DISABLE_CUDA="1")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "OK"

