# SPDX-License-Identifier: Apache-2.0
"""Checked by ``mypy --strict`` (tests/test_typing.py), not run: typical uses of
the public API must type-check, and the types mypy infers must be these."""

from __future__ import annotations

from typing import Any, assert_type

import numpy as np
import numpy.typing as npt

import tensorplay as tp
from tensorplay._stax import cudagraphs
from tensorplay.cuda import CUDAGraph


def creation() -> None:
    a = tp.zeros(2, 3, dtype=tp.float32, device="cuda")
    assert_type(a, tp.Tensor)
    assert_type(tp.tensor([1, 2], dtype="int64"), tp.Tensor)
    assert_type(tp.arange(10), tp.Tensor)
    assert_type(tp.full((2,), 1.5), tp.Tensor)
    assert_type(tp.from_numpy(np.zeros(3, np.float32)), tp.Tensor)
    assert_type(a.shape, tuple[int, ...])
    assert_type(a.size(0), int)
    assert_type(a.dtype, tp.dtype)
    assert_type(a.device, tp.device)
    assert_type(a.numpy(), npt.NDArray[Any])
    assert_type(a.item(), bool | int | float)


def ops(a: tp.Tensor, b: tp.Tensor) -> tp.Tensor:
    c = a + b * 2 - 1.0
    c.add_(1).mul_(b)
    d = tp.where(c > 0, c, 0.0)
    e = tp.matmul(a, b.T) @ a
    f = tp.sum(d, dim=0, keepdim=True) + e.mean() + a.var(dim=(0, 1))
    tp.lt(a, b, out=tp.empty(a.shape, dtype=tp.bool, device=a.device))
    return f.relu().clamp(0.0, 1.0).to("cpu", dtype=tp.float64)


def graphs(x: tp.Tensor, flag: tp.Tensor) -> float:
    g = CUDAGraph()
    with tp.cuda.graph(g, capture_error_mode="thread_local") as captured:
        assert_type(captured, CUDAGraph)
        y = x * 2
        g.begin_capture_to_if_node(flag)
        y.add_(1)
        g.end_capture_to_conditional_node()
    g.replay()
    g.replay(tp.cuda.Stream())
    g.stage_and_launch([x], [tp.ones_like(x)])
    assert_type(g.pool_id, int | None)
    assert_type(g.describe(), dict[str, Any])
    assert_type(g.debug_dump("/tmp/g.dot"), str)
    h = CUDAGraph()
    with tp.cuda.graph(h, pool=g.pool_id):
        x.mul_(3)
    h.reset()
    assert_type(tp.cuda.is_current_stream_capturing(), bool)
    assert_type(tp.cuda.live_driver_objects(), dict[str, int])
    return float(y.sum().item())


@cudagraphs.cudagraphify
def layer(x: tp.Tensor) -> tp.Tensor:
    return x.tanh()


def streams_and_memory() -> int:
    s = tp.cuda.Stream()
    with tp.cuda.stream(s):
        tp.ones(4, device="cuda").add_(1)
    e = tp.cuda.Event(enable_timing=True)
    e.record(s)
    s.synchronize()
    layer(tp.ones(3, device="cuda"))
    return tp.cuda.memory_allocated() + tp.cuda.memory_reserved() + layer.num_captures
