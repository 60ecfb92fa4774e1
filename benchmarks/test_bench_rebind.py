# SPDX-License-Identifier: Apache-2.0
"""Host cost of feeding 8 inputs to a graph: rebind_and_launch (the kernels
read the new tensors, no copy) against stage_and_launch (a copy into the
captured inputs), at 4 KiB and 64 MiB per input. The graph is
y_k = x_k * 2 + 1 per input, so every input is read by tensorplay's own
kernels and is rebindable.

Run on the GPU:  pytest benchmarks/test_bench_rebind.py --benchmark-only
Skipped until CUDAGraph has rebind_and_launch. The 64 MiB cases synchronize
(untimed) before each call: their graph runs longer than its launch, and
back-to-back calls would time the GPU once the launch queue is full.
"""

import gc

import numpy as np
import pytest

import tensorplay as tp

pytestmark = pytest.mark.skipif(not hasattr(tp.cuda.CUDAGraph, "rebind_and_launch"),
                                reason="CUDAGraph.rebind_and_launch is not there yet")

N = 8
SIZES = {"4KiB": 1024, "64MiB": 16 << 20}          # float32 elements


@pytest.fixture(params=list(SIZES))
def graph8(request):
    elems = SIZES[request.param]
    statics = [tp.zeros(elems, device="cuda") for _ in range(N)]
    base = tp.arange(elems, dtype=tp.float32, device="cuda")
    sets = [[base * sign + float(k + 1) for k in range(N)] for sign in (1.0, -0.5)]
    statics[0] * 2.0 + 1.0                            # compile the kernels outside the capture
    tp.cuda.synchronize()
    g = tp.cuda.CUDAGraph()
    with tp.cuda.graph(g):
        outs = [x * 2.0 + 1.0 for x in statics]
    g.stage_and_launch(statics, sets[1])              # the staging executable, built untimed
    g.rebind_and_launch(statics, sets[0])
    tp.cuda.synchronize()
    assert all(g.rebindable(statics))
    for k in (0, N - 1):                              # the rebound inputs were read
        np.testing.assert_array_equal(outs[k].numpy(), sets[0][k].numpy() * np.float32(2) + np.float32(1))
    yield request.param, g, statics, sets
    g.reset()
    del g, statics, sets, outs, base
    gc.collect()
    tp.cuda.synchronize()
    tp.cuda.empty_cache()


def _bench(benchmark, size, fn):
    if size == "4KiB":
        benchmark.pedantic(fn, rounds=2000, iterations=1, warmup_rounds=100)
    else:
        benchmark.pedantic(fn, setup=tp.cuda.synchronize, rounds=200, iterations=1, warmup_rounds=10)
    tp.cuda.synchronize()


def test_rebind_and_launch_same_tensors(benchmark, graph8):
    size, g, statics, sets = graph8
    benchmark.group = f"rebind {N} inputs x {size}"
    _bench(benchmark, size, lambda: g.rebind_and_launch(statics, sets[0]))


def test_rebind_and_launch_alternating_tensors(benchmark, graph8):
    size, g, statics, sets = graph8
    benchmark.group = f"rebind {N} inputs x {size}"
    turn = [0]

    def run():
        turn[0] ^= 1
        g.rebind_and_launch(statics, sets[turn[0]])
    _bench(benchmark, size, run)


def test_stage_and_launch(benchmark, graph8):
    size, g, statics, sets = graph8
    benchmark.group = f"rebind {N} inputs x {size}"
    _bench(benchmark, size, lambda: g.stage_and_launch(statics, sets[0]))


def test_bare_replay(benchmark, graph8):
    size, g, statics, sets = graph8
    benchmark.group = f"rebind {N} inputs x {size}"
    _bench(benchmark, size, g.replay)
