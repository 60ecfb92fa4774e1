# SPDX-License-Identifier: Apache-2.0
"""Host time of matrix products: eager matmul, linear with a fused bias, and
the replay of a captured graph of matmuls, next to PyTorch's.

Run on the GPU:  pytest benchmarks/test_bench_matmul.py --benchmark-only
A round times one call (the host's cost of launching it) after an untimed
synchronize, so the launch queue is empty each time; compare.py's work
section has the GPU time (CUDA events).
"""

import numpy as np
import pytest

import tensorplay as tp

N = 1024
LAYERS = 4


def _inputs(lib, shapes, dtype, seed=0):
    """Uniform [-1, 1) CUDA tensors of ``lib`` (the same values for both libraries)."""
    rng = np.random.default_rng(seed)
    return [lib.from_numpy(rng.random(s, dtype=np.float32) * 2 - 1).to("cuda").to(getattr(lib, dtype))
            for s in shapes]


def _bench(benchmark, lib, fn, group):
    benchmark.group = group
    for _ in range(3):               # compile kernels, build the cuBLASLt plan
        fn()
    lib.cuda.synchronize()
    benchmark.pedantic(fn, setup=lib.cuda.synchronize, rounds=1000, iterations=1, warmup_rounds=20)
    lib.cuda.synchronize()


def test_matmul_bf16(benchmark):
    a, b = _inputs(tp, [(N, N), (N, N)], "bfloat16")
    _bench(benchmark, tp, lambda: tp.matmul(a, b), f"matmul {N}^2 bf16")


def test_torch_matmul_bf16(benchmark):
    torch = pytest.importorskip("torch")
    a, b = _inputs(torch, [(N, N), (N, N)], "bfloat16")
    _bench(benchmark, torch, lambda: torch.matmul(a, b), f"matmul {N}^2 bf16")


def test_linear_bias_bf16(benchmark):
    x, w, bias = _inputs(tp, [(N, N), (N, N), (N,)], "bfloat16")
    _bench(benchmark, tp, lambda: tp.linear(x, w, bias), f"linear + bias {N}^2 bf16")


def test_torch_linear_bias_bf16(benchmark):
    torch = pytest.importorskip("torch")
    x, w, bias = _inputs(torch, [(N, N), (N, N), (N,)], "bfloat16")
    _bench(benchmark, torch, lambda: torch.nn.functional.linear(x, w, bias), f"linear + bias {N}^2 bf16")


def _layers(x, w):
    for _ in range(LAYERS):
        x = (x @ w).relu() + x
    return x


def test_graph_of_matmuls_replay(benchmark):
    x, w = _inputs(tp, [(1, N), (N, N)], "float32")
    w.mul_(1 / 32)
    _layers(x, w)
    tp.cuda.synchronize()
    g = tp.cuda.CUDAGraph()
    with tp.cuda.graph(g):
        _layers(x, w)
    _bench(benchmark, tp, g.replay, f"replay {LAYERS} x ((x @ w).relu() + x), 1x{N} fp32")


def test_torch_graph_of_matmuls_replay(benchmark):
    torch = pytest.importorskip("torch")
    x, w = _inputs(torch, [(1, N), (N, N)], "float32")
    w.mul_(1 / 32)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        _layers(x, w)
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        _layers(x, w)
    _bench(benchmark, torch, g.replay, f"replay {LAYERS} x ((x @ w).relu() + x), 1x{N} fp32")
