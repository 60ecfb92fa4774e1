# SPDX-License-Identifier: Apache-2.0
"""Host cost of feeding N fresh 4 KiB inputs to a graph and replaying it.

Run on the GPU:  pytest benchmarks --benchmark-only
Compares tensorplay's stage_and_launch with a copy_ loop + replay, a bare
replay, and PyTorch's copy_ loop / _foreach_copy_ + replay on the same GPU.
"""

import pytest

import tensorplay as tp

SIZES = [1, 8, 32, 128]
ELEMS = 1024          # 4 KiB of float32


def _tp_graph(n):
    statics = [tp.zeros(ELEMS, device="cuda") for _ in range(n)]
    out = tp.zeros(ELEMS, device="cuda")
    out.add_(statics[0])
    tp.cuda.synchronize()
    g = tp.cuda.CUDAGraph()
    with tp.cuda.graph(g):
        out.zero_()
        for s in statics:
            out.add_(s)
    inputs = [tp.ones(ELEMS, device="cuda") for _ in range(n)]
    g.stage_and_launch(statics, inputs)          # compile the staging kernel outside the timing
    tp.cuda.synchronize()
    return g, statics, inputs


def _bench(benchmark, fn):
    benchmark.pedantic(fn, rounds=2000, iterations=1, warmup_rounds=100)
    tp.cuda.synchronize()


@pytest.mark.parametrize("n", SIZES)
def test_stage_and_launch(benchmark, n):
    g, statics, inputs = _tp_graph(n)
    benchmark.group = f"staging {n} inputs"
    _bench(benchmark, lambda: g.stage_and_launch(statics, inputs))


@pytest.mark.parametrize("n", SIZES)
def test_copy_loop_and_replay(benchmark, n):
    g, statics, inputs = _tp_graph(n)
    benchmark.group = f"staging {n} inputs"

    def run():
        for s, i in zip(statics, inputs):
            s.copy_(i)
        g.replay()
    _bench(benchmark, run)


@pytest.mark.parametrize("n", SIZES)
def test_bare_replay(benchmark, n):
    g, statics, inputs = _tp_graph(n)
    benchmark.group = f"staging {n} inputs"
    _bench(benchmark, g.replay)


def _torch_graph(torch, n):
    statics = [torch.zeros(ELEMS, device="cuda") for _ in range(n)]
    out = torch.zeros(ELEMS, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        out.zero_()
        for x in statics:
            out.add_(x)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out.zero_()
        for x in statics:
            out.add_(x)
    inputs = [torch.ones(ELEMS, device="cuda") for _ in range(n)]
    torch.cuda.synchronize()
    return g, statics, inputs


def _torch_bench(benchmark, n, stage):
    torch = pytest.importorskip("torch")
    g, statics, inputs = _torch_graph(torch, n)
    benchmark.group = f"staging {n} inputs"

    def run():
        stage(torch, statics, inputs)
        g.replay()
    benchmark.pedantic(run, rounds=2000, iterations=1, warmup_rounds=100)
    torch.cuda.synchronize()


def _copy_each(torch, statics, inputs):
    for s, i in zip(statics, inputs):
        s.copy_(i)


@pytest.mark.parametrize("n", SIZES)
def test_torch_copy_loop_and_replay(benchmark, n):
    _torch_bench(benchmark, n, _copy_each)


@pytest.mark.parametrize("n", SIZES)
def test_torch_foreach_copy_and_replay(benchmark, n):
    _torch_bench(benchmark, n, lambda torch, statics, inputs: torch._foreach_copy_(statics, inputs))
