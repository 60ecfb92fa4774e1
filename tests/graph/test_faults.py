# SPDX-License-Identifier: Apache-2.0
"""Faults inside captures: every one leaves the process usable and the next
capture correct (GPU)."""

import gc
import os
import signal
import sys
import threading
import traceback

import numpy as np
import pytest

import tensorplay as tp
from tensorplay._graph.registry import open_captures
from tensorplay.cuda import CUDAGraph

pytestmark = pytest.mark.cuda


class Boom(Exception):
    pass


def _clean():
    assert not tp.cuda.is_current_stream_capturing()
    assert tp.cuda.current_stream().handle == 0


def _fresh_capture_works():
    x = tp.ones(8, device="cuda")
    g = CUDAGraph()
    with tp.cuda.graph(g):
        y = x * 2 + 1
    g.replay()
    assert y.tolist() == [3.0] * 8
    g.reset()


def _steps(x, idx):
    """Ten captured steps, each a different kind of work."""
    return [
        lambda: x.add_(1),
        lambda: x.mul(2),
        lambda: x.sum(),
        lambda: tp.empty(1 << 18, device="cuda"),
        lambda: x[idx],
        lambda: x.unsqueeze(0) @ tp.ones(8, 2, device="cuda"),
        lambda: x.zero_(),
        lambda: tp.where(x > 0, x, 0.0),
        lambda: x.copy_(x[::-1]),
        lambda: x.clone(),
    ]


@pytest.fixture(scope="module", autouse=True)
def _warm_steps():
    """Kernels loaded and lazily made device state (the index-error flag) exist
    before any test takes its memory baseline."""
    x = tp.ones(8, device="cuda")
    for step in _steps(x, tp.tensor([0, 1], device="cuda")):
        step()
    tp.cuda.synchronize()


@pytest.mark.parametrize("fail_at", range(10))
def test_user_exception_at_every_point_of_a_capture(fail_at, memory_baseline):
    x = tp.ones(8, device="cuda")
    idx = tp.tensor([0, 1], device="cuda")     # host data is uploaded before the capture
    tp.cuda.synchronize()
    g = CUDAGraph()
    with pytest.raises(Boom):
        with tp.cuda.graph(g):
            for k, step in enumerate(_steps(x, idx)):
                if k == fail_at:
                    raise Boom(k)
                step()
    _clean()
    assert not g.is_capturing and not g.is_instantiated
    assert g.kept_storages == 0               # reset by the failed capture
    _fresh_capture_works()
    del x, idx, g, step                       # the step closures hold x too
    gc.collect()
    memory_baseline()


@pytest.mark.parametrize("depth", [1, 2, 3])
@pytest.mark.parametrize("kind", ["if", "while"])
def test_user_exception_inside_conditional_bodies(depth, kind):
    p = tp.zeros(1, dtype=tp.bool, device="cuda")
    x = tp.zeros(4, device="cuda")
    x.add_(1)
    tp.cuda.synchronize()
    g = CUDAGraph()
    with pytest.raises(Boom):
        with tp.cuda.graph(g):
            for _ in range(depth):
                (g.begin_capture_to_if_node if kind == "if" else g.begin_capture_to_while_node)(p)
                x.add_(1)
            raise Boom()
    _clean()
    assert g.conditional_depth == 0
    _fresh_capture_works()


@pytest.mark.parametrize("mode", ["global", "thread_local", "relaxed"])
@pytest.mark.parametrize("illegal", ["item", "pageable_copy"])
def test_illegal_calls_in_each_capture_mode(mode, illegal):
    import numpy as np
    x = tp.ones(4, device="cuda")
    big = tp.ones(2048, device="cuda")
    (x + 1).sum()
    tp.cuda.synchronize()
    g = CUDAGraph()
    with pytest.raises(tp.cuda.CudaError) as info:
        with tp.cuda.graph(g, capture_error_mode=mode):
            y = x + 1
            if illegal == "item":
                y.sum().item()
            else:
                big.copy_(np.zeros(2048, np.float32))     # 8 KiB: more than kernel parameters carry
    assert "CAPTURE" in info.value.name
    traceback.clear_frames(info.value.__traceback__)
    _clean()
    _fresh_capture_works()


def test_oom_inside_a_conditional_body():
    free, total = tp.cuda.mem_get_info()
    p = tp.ones(1, dtype=tp.bool, device="cuda")
    g = CUDAGraph()
    with pytest.raises(tp.cuda.OutOfMemoryError):
        with tp.cuda.graph(g):
            g.begin_capture_to_if_node(p)
            tp.empty(2 * total, dtype=tp.uint8, device="cuda")
    _clean()
    _fresh_capture_works()


def test_keyboard_interrupt_during_a_long_capture():
    x = tp.zeros(16, device="cuda")
    x.add_(1)
    tp.cuda.synchronize()
    g = CUDAGraph()
    with pytest.raises(KeyboardInterrupt):
        with tp.cuda.graph(g):
            for k in range(2000):
                x.add_(1)
                if k == 1000:
                    os.kill(os.getpid(), signal.SIGINT)     # delivered as KeyboardInterrupt
    _clean()
    _fresh_capture_works()


# ---------------------------------------------------------------- captures outliving their graph

def _eager_upload_works():
    t = tp.tensor([1.0, 2.0, 3.0], device="cuda")      # small: written from kernel parameters
    assert (t * 2).tolist() == [2.0, 4.0, 6.0]
    big = np.arange(2048, dtype=np.float32)
    assert np.array_equal(tp.tensor(big, device="cuda").numpy(), big)   # a pageable copy: forbidden in a capture


@pytest.mark.parametrize("in_a_cycle", [False, True])
def test_a_graph_dropped_mid_capture_ends_its_capture(in_a_cycle):
    """cuda.core's test_graph_gc_mid_capture: the collector ends the capture
    of a graph nobody ended, with a ResourceWarning, and restores the stream."""
    x = tp.ones(1 << 20, device="cuda")
    (x * 2).sum()
    tp.cuda.synchronize()
    g = CUDAGraph()
    g.capture_begin()
    y = x * 2
    if in_a_cycle:
        g.self_reference = g                 # only the cycle collector can free it
    assert tp.cuda.is_current_stream_capturing()
    with pytest.warns(ResourceWarning, match="destroyed while capturing") as caught:
        del g
        gc.collect()
    [w] = [w for w in caught if "destroyed while capturing" in str(w.message)]
    assert w.filename == __file__                          # where the graph was dropped
    assert f"capture_begin at {__file__}:" in str(w.message)   # and where its capture began
    _clean()
    assert open_captures() == []
    del y
    _eager_upload_works()
    _fresh_capture_works()


def test_an_exception_unwinding_past_an_open_capture():
    x = tp.ones(4096, device="cuda")
    (x + 1).sum()
    tp.cuda.synchronize()

    def forgets_to_end():
        g = CUDAGraph()
        g.capture_begin()
        x.add_(1)
        raise Boom()

    with pytest.warns(ResourceWarning):
        try:
            forgets_to_end()
        except Boom:
            pass
        gc.collect()
    _clean()
    _eager_upload_works()
    _fresh_capture_works()


def test_a_second_capture_names_the_open_one():
    """While a global-mode capture is open, another capture_begin says which
    graph captures, on which stream and thread, since where, and how to end it."""
    x = tp.ones(16, device="cuda")
    (x + 1).sum()
    tp.cuda.synchronize()
    g1, g2 = CUDAGraph(), CUDAGraph()
    g1.capture_begin(); line = sys._getframe().f_lineno   # noqa: E702 - the call site is this line
    try:
        with pytest.raises(RuntimeError) as info:
            g2.capture_begin()
        msg = str(info.value)
        assert f"CUDAGraph at {id(g1):#x}" in msg
        assert f"{g1.capture_stream.handle:#x}" in msg
        assert threading.current_thread().name in msg
        assert f"{__file__}:{line}" in msg
        assert "capture_end()" in msg
        assert not g2.is_capturing
        y = x + 1
    finally:
        g1.capture_end()
    g1.replay()
    assert y.tolist() == [2.0] * 16
    _clean()
    _fresh_capture_works()


def test_a_call_the_capture_forbids_names_the_open_capture():
    x = tp.ones(16, device="cuda")
    (x + 1).sum()
    tp.cuda.synchronize()
    g = CUDAGraph()
    with pytest.raises(tp.cuda.CudaError) as info:
        with tp.cuda.graph(g):
            y = x + 1
            tp.cuda.synchronize()             # forbidden while capturing
    msg = str(info.value)
    assert "CAPTURE" in info.value.name
    assert f"CUDAGraph at {id(g):#x}" in msg and "test_faults.py" in msg, msg
    traceback.clear_frames(info.value.__traceback__)
    del y
    _clean()
    assert open_captures() == []
    _fresh_capture_works()
