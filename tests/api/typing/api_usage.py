# SPDX-License-Identifier: Apache-2.0
"""Checked by ``mypy --strict`` (tests/api/test_typing.py), not run: typical uses of
the public API must type-check, and the types mypy infers must be these."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, assert_type

import numpy as np
import numpy.typing as npt

import tensorplay as tp
from tensorplay._graph import cudagraphs
from tensorplay.cuda import CUDAGraph
from tensorplay.types import DeviceLike, StreamLike


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
    assert_type(tp.zeros_like(input=a, dtype="float16"), tp.Tensor)
    assert_type(list(a), list[tp.Tensor])


def reductions(a: tp.Tensor) -> None:
    assert_type(tp.max(a), tp.Tensor)
    assert_type(tp.max(a, 0), tp.return_types.max[tp.Tensor])
    assert_type(tp.max(input=a, dim=1, keepdim=True).values, tp.Tensor)
    assert_type(a.min(dim=0).indices, tp.Tensor)
    assert_type(a.min(), tp.Tensor)
    values, indices = a.max(1)
    assert_type(values, tp.Tensor)
    assert_type(tp.mean(input=a, dim=(0, 1), keepdim=True, dtype=tp.float64), tp.Tensor)
    assert_type(a.var(dim=0, correction=0), tp.Tensor)
    tp.sum(a, 0, False, tp.float64)  # type: ignore[call-arg]  # dtype is keyword-only


def pytorch_names(a: tp.Tensor, idx: tp.Tensor) -> None:
    assert_type(tp.sort(a, descending=True), tp.return_types.sort[tp.Tensor])
    values, indices = a.sort(0, stable=True)
    assert_type(indices, tp.Tensor)
    assert_type(tp.topk(a, 3, largest=False).values, tp.Tensor)
    assert_type(a.softmax(-1), tp.Tensor)
    assert_type(tp.log_softmax(a, 1, dtype=tp.float64), tp.Tensor)
    assert_type(tp.nn.functional.softmax(a, dim=0), tp.Tensor)
    assert_type(a.cumsum(0, dtype="int64"), tp.Tensor)
    assert_type(tp.gather(a, 1, idx), tp.Tensor)
    assert_type(tp.allclose(a, a), bool)
    assert_type(a.isclose(a, equal_nan=True), tp.Tensor)
    assert_type(a.float().half().int().long().bool().double().bfloat16(), tp.Tensor)
    assert_type(a.mT.t().detach().flip(0).repeat(2, 1), tp.Tensor)
    assert_type(a.new_zeros(2, 3).new_full((2,), 1.5, dtype=tp.float16), tp.Tensor)
    assert_type(a.masked_fill(a > 0, 0.0).type_as(idx).view_as(idx), tp.Tensor)
    assert_type(tp.get_default_dtype(), tp.dtype)
    tp.cumsum(a, 0, tp.int64)  # type: ignore[call-arg]  # dtype is keyword-only


def narrowing(obj: object, where: DeviceLike) -> tp.Tensor:
    if tp.is_tensor(obj):
        assert_type(obj, tp.Tensor)
        return obj.to(where)
    return tp.zeros(1, device=where)


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
    g.replay(tp.cuda.ExternalStream(0))
    g.replay("stream")  # type: ignore[arg-type]  # streams, stream-like objects and handles only
    assert_type(g.capture_stream, tp.cuda.Stream | None)
    g.stage_and_launch([x], [tp.ones_like(x)])
    assert_type(g.pool_id, int | None)
    assert_type(g.describe(), dict[str, Any])
    assert_type(g.debug_dump("/tmp/g.dot"), str)
    assert_type(tp.cuda.to_dot(g.describe(), detailed=True), str)
    assert_type(tp.cuda.graphs.to_dot({"nodes": [], "edges": []}, title="empty"), str)
    h = CUDAGraph()
    with tp.cuda.graph(h, pool=g.pool_id):
        x.mul_(3)
    h.reset()
    h.capture_begin(capture_error_mode="relaxed")
    h.capture_end()
    h.capture_begin(capture_error_mode="strict")  # type: ignore[arg-type]  # a Literal of three modes
    with tp.cuda.graph(h, capture_error_mode="local"):  # type: ignore[arg-type]
        pass
    assert_type(tp.cuda.is_current_stream_capturing(), bool)
    assert_type(tp.cuda.live_driver_objects(), dict[str, int])
    return float(y.sum().item())


@cudagraphs.cudagraphify
def layer(x: tp.Tensor) -> tp.Tensor:
    return x.tanh()


@cudagraphs.cudagraphify(warmup=3, capture_error_mode="global")
def scaled(x: tp.Tensor, factor: float = 2.0) -> tuple[tp.Tensor, tp.Tensor]:
    return x * factor, x.relu()


def graphed_callables(x: tp.Tensor, s: StreamLike) -> None:
    # cudagraphify keeps the function's signature (ParamSpec) and return type
    typed: cudagraphs.CUDAGraphified[[tp.Tensor], tp.Tensor] = layer
    assert_type(typed.num_captures, int)
    assert_type(layer(x), tp.Tensor)
    assert_type(scaled(x, factor=0.5), tuple[tp.Tensor, tp.Tensor])
    layer(x, 2)  # type: ignore[call-arg]
    scaled(x, factor="big")  # type: ignore[arg-type]

    def step(a: tp.Tensor) -> tp.Tensor:
        return a * 2

    def pair(a: tp.Tensor, b: tp.Tensor) -> tuple[tp.Tensor, tp.Tensor]:
        return a + b, a - b

    # make_graphed_callables returns callables of the same signatures
    one = tp.cuda.make_graphed_callables(step, (x,))
    assert_type(one(x), tp.Tensor)
    one(x, x)  # type: ignore[call-arg]
    both = tp.cuda.make_graphed_callables((step, pair), ((x,), (x, x)))
    first: Callable[[tp.Tensor], tp.Tensor] = both[0]
    assert_type(both[1](x, x), tuple[tp.Tensor, tp.Tensor])
    many = tp.cuda.make_graphed_callables([step, step, step, step], [(x,)] * 4)
    assert_type(many, tuple[Callable[..., Any], ...])
    pooled = tp.cuda.make_graphed_callables(step, (x,), pool=tp.cuda.graph_pool_handle())
    assert_type(pooled(x), tp.Tensor)
    bounded = cudagraphs.cudagraphify(step, max_graphs=4)
    assert_type(bounded.stats(), dict[str, int])
    cudagraphs.cudagraphify(step, max_graphs="4")  # type: ignore[call-overload]
    assert_type(tp.cuda.CUDAGraph().update_result, str | None)
    first(x)
    with tp.cuda.stream(s):
        one(x)


def streams_and_memory() -> int:
    s = tp.cuda.Stream()
    with tp.cuda.stream(s):
        tp.ones(4, device="cuda").add_(1)
    e = tp.cuda.Event(enable_timing=True)
    e.record(s)
    s.synchronize()
    layer(tp.ones(3, device="cuda"))
    return tp.cuda.memory_allocated() + tp.cuda.memory_reserved() + layer.num_captures


def random_numbers(x: tp.Tensor) -> None:
    g = tp.Generator("cuda").manual_seed(0)
    assert_type(g, tp.Generator)
    assert_type(g.seed(), int)
    assert_type(g.get_state(), tp.Tensor)
    assert_type(g.set_state(tp.get_rng_state()), tp.Generator)
    assert_type(g.device, tp.device)
    assert_type(tp.manual_seed(1), tp.Generator)
    assert_type(tp.default_generator.initial_seed(), int)
    assert_type(tp.rand(2, 3, generator=g, dtype=tp.float16, device="cuda"), tp.Tensor)
    assert_type(tp.randn((4,), device="cuda"), tp.Tensor)
    assert_type(tp.randint(10, (3,)), tp.Tensor)
    assert_type(tp.randint(-5, 5, [2, 2], generator=g, dtype=tp.int8), tp.Tensor)
    assert_type(tp.randint_like(x, 3), tp.Tensor)
    assert_type(tp.rand_like(x, generator=g), tp.Tensor)
    assert_type(x.uniform_(-1.0, 1.0, generator=g).normal_(std=0.5).exponential_(2.0), tp.Tensor)
    assert_type(x.bernoulli_(0.3).bernoulli_(tp.rand_like(x)), tp.Tensor)
    assert_type(x.random_(), tp.Tensor)
    assert_type(x.random_(10), tp.Tensor)
    assert_type(x.random_(0, None, generator=g), tp.Tensor)
    assert_type(tp.bernoulli(x, generator=g), tp.Tensor)
    assert_type(tp.dropout(x, 0.1, train=True), tp.Tensor)
    assert_type(tp.nn.functional.dropout(x, p=0.2, training=True, inplace=True, generator=g), tp.Tensor)
    assert_type(tp.cuda.default_generators[0], tp.Generator)
    tp.cuda.manual_seed_all(3)
    assert_type(tp.cuda.get_rng_state(0), tp.Tensor)
    tp.cuda.set_rng_state(tp.cuda.get_rng_state(), device="cuda:0")
    assert_type(tp.cuda.initial_seed(), int)


def own_kernels(x: tp.Tensor) -> None:
    k = tp.cuda.RawKernel('extern "C" __global__ void k(float* x) { x[0] = 1.0f; }', "k")
    assert_type(k.compile(arch=90), bytes)
    assert_type(k.compile(arch=(9, 0)), bytes)
    k.compile("cuda:0")
    k.compile(0, arch=90)  # type: ignore[call-overload]  # a device or an arch, not both
    e = tp.cuda.ElementwiseKernel("T x", "T y", "y = x * 2", "double_it")
    assert_type(e.compile(arch=90, types={"T": tp.float32}), bytes)
    assert_type(e.compile(arch=90, types={"T": "float16"}), bytes)
    e.compile(types={"T": tp.float32})
    k((1,), (1,), (x,))
    e(x)
