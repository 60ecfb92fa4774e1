# SPDX-License-Identifier: Apache-2.0
"""Graphs across libraries on the GPU: a torch.cuda.CUDAGraph captured with
keep_graph=True embedded in tensorplay graphs (plainly and in a WHILE
body), its memory kept after the user drops it and given back with the
outer graph, keep_graph=False refused with the capture intact; a tensorplay
graph replayed and embedded inside torch.cuda.graph, its memory kept after
the tensorplay graph is dropped and given back when the outer graph is
destroyed (a user object released off the driver's thread), a graph with
conditional nodes refused there; torch.compile'd functions in captures and
conditional bodies (default and max-autotune-no-cudagraphs), and what
breaks: a first call or a recompilation inside the capture, and
mode="reduce-overhead", each a CompileInCaptureError with the graph
reusable."""

import gc
import time
import weakref

import numpy as np
import pytest

import tensorplay as tp
from tensorplay._testing import run_deferred_teardown
from tensorplay.cuda import CUDAGraph

from helpers import capture_construct, counted_loop, torch_cuda as torch, warm  # noqa: F401 (a fixture)

pytestmark = pytest.mark.cuda
N = 1 << 20                     # 1M float32: 4 MiB


def _expected(start, steps, scale=2.0):
    v = np.float32(start)
    for _ in range(steps):
        v = v * np.float32(scale) + np.float32(1.0)
    return v


def _torch_step_graph(torch, x, keep_graph=True):
    """A PyTorch graph of ``x = x * 2 + 1`` through a temporary of its pool."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        x.copy_(x * 2.0 + 1.0)                     # warm up, as torch.cuda.graph asks
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    tg = torch.cuda.CUDAGraph(keep_graph=keep_graph)
    with torch.cuda.graph(tg):
        x.copy_(x * 2.0 + 1.0)
    return tg


def _tp_step_graph(x):
    """A tensorplay graph of ``x = x * 2 + 1`` through a temporary of its own pool."""
    warm(lambda: x.copy_(x * 2.0 + 1.0))
    g = CUDAGraph()
    with tp.cuda.graph(g):
        x.copy_(x * 2.0 + 1.0)
    return g


def _values(torch, x):
    torch.cuda.synchronize()
    tp.cuda.synchronize()
    return np.unique(x.cpu().numpy() if hasattr(x, "cpu") else x.numpy()).tolist()


def _pool_stats(pool):
    return {k: v for k, v in tp.cuda.memory_stats().items() if k.startswith(f"pool.{pool}.")}


def _wait_for(cond, seconds=10.0):
    """Run deferred teardown until ``cond()`` (a user object's destructor
    runs on a driver thread some time after its graph is destroyed)."""
    deadline = time.monotonic() + seconds
    while True:
        gc.collect()
        run_deferred_teardown()
        if cond():
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)


# ------------------------------------------------------------------ PyTorch's graphs inside ours

def test_a_torch_graph_embedded_in_a_tensorplay_graph(torch):
    x = torch.zeros(N, device="cuda")
    tg = _torch_step_graph(torch, x)
    xt = tp.from_dlpack(x)
    warm(lambda: xt.add_(10.0))
    g = CUDAGraph()
    with tp.cuda.graph(g):
        tp.cuda.embed(tg)
        xt.add_(10.0)                                # ordered after the embedded graph
        tp.cuda.embed(tg)
    assert [n["kind"] for n in g.describe()["nodes"]].count("graph") == 2
    for _ in range(2):
        x.zero_()
        g.replay()
        assert _values(torch, x) == [_expected(_expected(0, 1) + 10.0, 1)]
    tg.replay()                                      # PyTorch's graph still replays on its own
    assert _values(torch, x) == [_expected(_expected(_expected(0, 1) + 10.0, 1), 1)]


def test_a_torch_graph_in_a_while_body_runs_each_iteration(torch):
    x = torch.zeros(N, device="cuda")
    tg = _torch_step_graph(torch, x)
    g, c, _ = counted_loop(lambda: tp.cuda.embed(tg), 5)
    x.zero_()
    g.replay()
    assert _values(torch, x) == [_expected(0, 5)] and c.item() == 5
    g.replay()
    assert _values(torch, x) == [_expected(_expected(0, 5), 5)]


def test_the_outer_graph_keeps_the_torch_graphs_memory(torch):
    x = torch.zeros(N, device="cuda")
    tg = _torch_step_graph(torch, x)
    ref = weakref.ref(tg)
    g, _, _ = counted_loop(lambda: tp.cuda.embed(tg), 3)
    del tg
    gc.collect()
    torch.cuda.empty_cache()
    assert ref() is not None                         # held by g: its pool holds the temporary
    reserved = torch.cuda.memory_reserved()
    for _ in range(3):
        x.zero_()
        g.replay()
        assert _values(torch, x) == [_expected(0, 3)]
    g.reset()
    assert _wait_for(lambda: ref() is None)          # given up with g's executable
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    assert torch.cuda.memory_reserved() < reserved   # PyTorch freed the graph's pool


def test_a_torch_graph_without_its_graph_is_refused(torch):
    x = torch.zeros(N, device="cuda")
    tg = _torch_step_graph(torch, x, keep_graph=False)
    xt = tp.from_dlpack(x)
    warm(lambda: xt.add_(1.0))
    g = CUDAGraph()
    with tp.cuda.graph(g):
        with pytest.raises(RuntimeError, match="keep_graph=True"):
            tp.cuda.embed(tg)
        xt.add_(1.0)                                 # the capture goes on
    x.zero_()
    g.replay()
    assert _values(torch, x) == [1.0]
    with pytest.raises(RuntimeError, match="nothing captures"):
        tp.cuda.embed(_torch_step_graph(torch, x))   # outside any capture


def test_a_torch_graph_replayed_inside_a_capture_is_explained(torch):
    x = torch.zeros(N, device="cuda")
    tg = _torch_step_graph(torch, x)
    tg.replay()                                      # instantiated, as a step replayed before would be
    torch.cuda.synchronize()
    g = CUDAGraph()
    with pytest.raises(tp.cuda.CompileInCaptureError, match="tp.cuda.embed"):
        with tp.cuda.graph(g):
            tg.replay()
    assert not g.is_capturing
    with tp.cuda.graph(g):
        tp.cuda.embed(tg)
    x.zero_()
    g.replay()
    assert _values(torch, x) == [1.0]


# ------------------------------------------------------------------ ours inside PyTorch's

def test_a_tensorplay_graph_inside_torch_cuda_graph(torch):
    x = tp.zeros(N, device="cuda")
    child = _tp_step_graph(x)
    pool = child.pool_id
    xt = torch.from_dlpack(x)
    xt.add_(10.0)
    torch.cuda.synchronize()
    outer = torch.cuda.CUDAGraph()
    with torch.cuda.graph(outer):
        child.replay(torch.cuda.current_stream())    # the capture stream: embedded, not launched
        xt.add_(10.0)
        tp.cuda.embed(child)                         # finds PyTorch's capture stream itself
    assert torch.cuda.current_stream() == torch.cuda.default_stream()
    want = _expected(_expected(0, 1) + 10.0, 1)
    x.zero_()
    tp.cuda.synchronize()
    outer.replay()
    assert _values(torch, x) == [want]
    del child                                        # the outer graph keeps its memory
    gc.collect()
    tp.cuda.synchronize()
    tp.cuda.empty_cache()
    assert _pool_stats(pool)[f"pool.{pool}.graph_refs"] == 2     # the two embeddings' holds
    for _ in range(2):
        x.zero_()
        tp.cuda.synchronize()
        outer.replay()
        assert _values(torch, x) == [want]
    reserved = tp.cuda.memory_reserved()
    del outer                                        # its user objects' destructors hand the holds back
    torch.cuda.synchronize()
    assert _wait_for(lambda: (tp.cuda.synchronize(), tp.cuda.empty_cache(), not _pool_stats(pool))[-1])
    assert reserved - tp.cuda.memory_reserved() >= N * 4         # the child's temporary went too


def test_a_graph_with_conditional_nodes_is_refused_inside_torch_cuda_graph(torch):
    x = tp.zeros(N, device="cuda")
    looped, _, _ = counted_loop(_tp_step_graph(x).replay, 2)
    xt = torch.from_dlpack(x)
    xt.add_(1.0)
    torch.cuda.synchronize()
    outer = torch.cuda.CUDAGraph()
    with torch.cuda.graph(outer):
        with pytest.raises(RuntimeError, match="conditional nodes"):
            looped.replay(torch.cuda.current_stream())
        xt.add_(1.0)                                 # PyTorch's capture goes on
    x.zero_()
    tp.cuda.synchronize()
    outer.replay()
    assert _values(torch, x) == [1.0]


# ------------------------------------------------------------------ torch.compile

_COMPILED = {}


def _compiled(torch, mode):
    """``f(a, b)`` compiled in ``mode`` (once per mode and process)."""
    pytest.importorskip("triton")
    if mode not in _COMPILED:
        def f(a, b):
            return (a * b).sin() + b.cos() * 0.5
        _COMPILED[mode] = torch.compile(f, mode=None if mode == "default" else mode, dynamic=False)
    return _COMPILED[mode]


class _CompiledWork:
    """capture_construct's work: ``f(a, b)`` written into or added to ``out``."""

    def __init__(self, f, a, b):
        self.f, self.a, self.b = f, a, b

    def write(self, out):
        out.copy_(self.f(self.a, self.b))

    def accumulate(self, out):
        out.add_(self.f(self.a, self.b))


class _Control:
    def __init__(self, torch):
        self.pred = torch.zeros(1, dtype=torch.bool, device="cuda")
        self.index = torch.zeros(1, dtype=torch.int64, device="cuda")
        self.count = torch.zeros(1, dtype=torch.int32, device="cuda")
        self.limit = torch.zeros(1, dtype=torch.int32, device="cuda")


@pytest.mark.parametrize("construct", ["graph", "if_else", "while", "switch"])
@pytest.mark.parametrize("mode", ["default", "max-autotune-no-cudagraphs"])
def test_compiled_functions_in_graphs_and_conditional_bodies(torch, mode, construct):
    f = _compiled(torch, mode)
    a, b = torch.randn(4096, device="cuda"), torch.randn(4096, device="cuda")
    out = torch.zeros(4096, device="cuda")
    c = _Control(torch)
    for _ in range(2):
        f(a, b)                                      # compile, autotune and warm up before capturing
    c.count.add_(1)
    torch.lt(c.count, c.limit, out=c.pred)
    c.count.zero_()
    torch.cuda.synchronize()
    g = CUDAGraph()
    capture_construct(g, construct, _CompiledWork(f, a, b), out, c, other=lambda o: o.fill_(-7.0),
                      recheck=lambda c: torch.lt(c.count, c.limit, out=c.pred), advance=lambda c: c.count.add_(1))
    for trial in range(2):
        a.copy_(torch.randn(4096, device="cuda"))
        want = (a * b).sin() + b.cos() * 0.5
        out.zero_()
        if construct == "if_else":
            c.pred.fill_(trial == 0)
            want = want if trial == 0 else torch.full_like(out, -7.0)
        elif construct == "while":
            c.count.zero_()
            c.limit.fill_(3)
            want = want * 3
        elif construct == "switch":
            c.index.fill_(trial)
            want = want if trial == 0 else torch.full_like(out, -7.0)
        g.replay()
        torch.cuda.synchronize()
        torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)


def test_a_first_call_inside_a_capture_is_refused_and_the_graph_reusable(torch):
    pytest.importorskip("triton")
    f = torch.compile(lambda a: a.exp() * 2.0 - a, dynamic=False)
    a = torch.randn(1024, device="cuda")
    g = CUDAGraph()
    with pytest.raises(tp.cuda.CompileInCaptureError, match="began compiling.*eagerly before capturing"):
        with tp.cuda.graph(g):
            f(a)                                     # never called before: Dynamo compiles here
    assert not g.is_capturing and not torch.cuda.is_current_stream_capturing()
    torch.testing.assert_close(f(a), a.exp() * 2.0 - a)      # compiled now, eagerly
    with tp.cuda.graph(g):
        out = f(a)
    a.copy_(torch.randn(1024, device="cuda"))
    g.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(out, a.exp() * 2.0 - a)


def test_a_recompilation_inside_a_capture_is_refused(torch):
    pytest.importorskip("triton")
    f = torch.compile(lambda a: a * 3.0 + 1.0)
    f(torch.randn(1024, device="cuda"))
    torch.cuda.synchronize()
    g = CUDAGraph()
    wide = torch.randn(1024, 3, device="cuda")       # drawn outside: PyTorch's random ops are refused inside
    with pytest.raises(tp.cuda.CompileInCaptureError, match="recompilation"):
        with tp.cuda.graph(g):
            f(wide)                                  # a new shape: Dynamo recompiles
    assert not g.is_capturing
    y = torch.randn(512, device="cuda")
    f(y)
    with tp.cuda.graph(g):
        out = f(y)
    g.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(out, y * 3.0 + 1.0)


def test_reduce_overhead_inside_a_capture_is_refused(torch):
    pytest.importorskip("triton")
    f = torch.compile(lambda a: a.sin() + 1.0, mode="reduce-overhead")
    a = torch.randn(1024, device="cuda")
    for _ in range(3):
        f(a)                                         # warmed up, recorded and replayed by PyTorch
    torch.cuda.synchronize()
    g = CUDAGraph()
    with pytest.raises(tp.cuda.CompileInCaptureError, match="reduce-overhead.*max-autotune-no-cudagraphs"):
        with tp.cuda.graph(g):
            f(a)
    assert not g.is_capturing and not torch.cuda.is_current_stream_capturing()
    with tp.cuda.graph(g):                           # the graph captures again
        out = torch.sin(a) + 1.0
    g.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(out, a.sin() + 1.0)
