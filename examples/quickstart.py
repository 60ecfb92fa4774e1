# SPDX-License-Identifier: Apache-2.0
"""Quick start: capture a few GPU ops into a CUDA graph and replay it.

Run:  python examples/quickstart.py
(in a clone: bash scripts/setup.sh, then .venv/bin/python in place of python)
"""

from __future__ import annotations

import sys
import time

import numpy as np

import tensorplay as tp


def main() -> int:
    if not tp.cuda.is_available():
        print(f"No CUDA GPU here ({tp.cuda.unavailable_reason()}); nothing to capture.")
        print("CPU tensors still work:", (tp.arange(5) * 2).tolist())
        return 0
    print("GPU:", tp.cuda.get_device_name(0), "capability", tp.cuda.get_device_capability(0))
    rng = np.random.default_rng(0)
    w = tp.tensor(rng.standard_normal((256, 256)).astype(np.float32) / 16, device="cuda")
    x = tp.zeros(256, device="cuda")              # the graph's static input

    def step(x: tp.Tensor) -> tp.Tensor:
        h = x
        for _ in range(8):                        # 8 small layers: many tiny kernels
            h = (w @ h).tanh() + 0.5 * h
        return h

    step(x)                                       # compile and load the kernels once
    g = tp.cuda.CUDAGraph()
    with tp.cuda.graph(g):
        y = step(x)                               # y is the graph's static output
    print(f"captured {g.num_nodes} nodes into pool {g.pool_id}")

    a = rng.standard_normal(256).astype(np.float32)
    x.copy_(a)                                    # new input: copy into the static tensor
    g.replay()
    eager = step(tp.tensor(a, device="cuda"))
    print("replay matches eager:", np.allclose(y.numpy(), eager.numpy(), rtol=1e-5, atol=1e-6))

    for name, run in (("eager", lambda: step(x)), ("graph replay", g.replay)):
        run()
        tp.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(200):
            run()
        tp.cuda.synchronize()
        print(f"{name:>12}: {(time.perf_counter() - t0) / 200 * 1e6:8.1f} us per step")
    return 0


if __name__ == "__main__":
    sys.exit(main())
