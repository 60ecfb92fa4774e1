# SPDX-License-Identifier: Apache-2.0
"""Feeding a graph new inputs: stage_and_launch and cudagraphify.

A captured graph reads its inputs from fixed ("static") tensors. Each step,
new data has to land in them before the replay. ``stage_and_launch`` does the
copies and the replay in one call; ``cudagraphify`` wraps a function so that
every call does exactly that.

Run:  python examples/staging.py
(in a clone: bash scripts/setup.sh, then .venv/bin/python in place of python)
"""

from __future__ import annotations

import sys
import time

import numpy as np

import tensorplay as tp


def main() -> int:
    if not tp.cuda.is_available():
        print(f"No CUDA GPU here ({tp.cuda.unavailable_reason()}); nothing to stage.")
        return 0
    rng = np.random.default_rng(0)
    w = tp.tensor(rng.standard_normal((64, 64)).astype(np.float32) / 8, device="cuda")

    # 1. stage_and_launch on a graph captured by hand
    a_static = tp.zeros(64, device="cuda")
    b_static = tp.zeros(64, device="cuda")
    (w @ a_static + b_static).relu()                     # kernels loaded before capture
    g = tp.cuda.CUDAGraph()
    with tp.cuda.graph(g):
        out = (w @ a_static + b_static).relu()
    a = tp.tensor(rng.standard_normal(64).astype(np.float32), device="cuda")
    b = tp.tensor(rng.standard_normal(64).astype(np.float32), device="cuda")
    g.stage_and_launch([a_static, b_static], [a, b])     # copies + replay, one call
    expect = (w @ a + b).relu()
    print("stage_and_launch matches eager:", np.allclose(out.numpy(), expect.numpy(), atol=1e-5))

    # 2. the same through cudagraphify: capture on the first call per signature
    @tp.cuda.cudagraphify
    def layer(x: tp.Tensor, bias: tp.Tensor) -> tp.Tensor:
        return (w @ x + bias).relu()

    for _ in range(3):
        x = tp.tensor(rng.standard_normal(64).astype(np.float32), device="cuda")
        y = layer(x, b)
        ok = np.allclose(y.numpy(), (w @ x + b).relu().numpy(), atol=1e-5)
    print("cudagraphify matches eager:", ok, f"({layer.num_captures} capture)")

    n = 500
    def copies_then_replay() -> None:
        a_static.copy_(a)
        b_static.copy_(b)
        g.replay()

    def staged() -> None:
        g.stage_and_launch([a_static, b_static], [a, b])

    for name, run in (("copy_ + copy_ + replay", copies_then_replay), ("stage_and_launch", staged)):
        run()
        tp.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            run()
        tp.cuda.synchronize()
        print(f"{name:>24}: {(time.perf_counter() - t0) / n * 1e6:7.1f} us per step")
    return 0


if __name__ == "__main__":
    sys.exit(main())
