# SPDX-License-Identifier: Apache-2.0
"""Faults inside captures: every one leaves the process usable and the next
capture correct (GPU)."""

import gc
import os
import signal
import traceback

import pytest

import tensorplay as tp
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
    (x + 1).sum()
    tp.cuda.synchronize()
    g = CUDAGraph()
    with pytest.raises(tp.cuda.CudaError) as info:
        with tp.cuda.graph(g, capture_error_mode=mode):
            y = x + 1
            if illegal == "item":
                y.sum().item()
            else:
                y.copy_(np.zeros(4, np.float32))
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
