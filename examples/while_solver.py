# SPDX-License-Identifier: Apache-2.0
"""Jacobi iteration until convergence, entirely on the GPU in one WHILE node.

Solves A x = b for a diagonally dominant A. The graph version loops inside a
single graph launch until the residual norm drops below the tolerance; the
host version reads the residual back after every iteration to decide.
Run:  python examples/while_solver.py
(in a clone: bash scripts/setup.sh, then .venv/bin/python in place of python)
"""

from __future__ import annotations

import sys
import time

import numpy as np
import numpy.typing as npt

import tensorplay as tp

N, TOL, MAX_ITERS = 512, 1e-5, 10_000


def make_system(rng: np.random.Generator) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]]:
    a = rng.uniform(-1, 1, (N, N)).astype(np.float32)
    a += np.diag(np.abs(a).sum(1) + 1.0).astype(np.float32)      # strictly diagonally dominant
    b = rng.uniform(-1, 1, N).astype(np.float32)
    return a, b


def main() -> int:
    if not tp.cuda.is_available():
        print(f"No CUDA GPU here ({tp.cuda.unavailable_reason()}); this example needs one.")
        return 0
    rng = np.random.default_rng(0)
    a_np, b_np = make_system(rng)
    A = tp.tensor(a_np, device="cuda")
    b = tp.tensor(b_np, device="cuda")
    d = tp.tensor(np.diag(a_np).copy(), device="cuda")
    R = tp.tensor(a_np - np.diag(np.diag(a_np)), device="cuda")
    x = tp.zeros(N, device="cuda")
    res = tp.zeros((), device="cuda")
    iters = tp.zeros((), dtype=tp.int32, device="cuda")
    go = tp.zeros((), dtype=tp.bool, device="cuda")

    def iterate() -> None:
        x.copy_((b - R @ x) / d)
        res.copy_((A @ x - b).norm())
        iters.add_(1)

    def keep_going() -> None:
        tp.logical_and(res > TOL, iters < MAX_ITERS, out=go)

    # warm up: compile and load every kernel once
    iterate()
    keep_going()
    tp.cuda.synchronize()

    g = tp.cuda.CUDAGraph()
    with tp.cuda.graph(g):
        x.zero_()
        iters.zero_()
        res.fill_(float("inf"))
        keep_going()
        g.begin_capture_to_while_node(go)
        iterate()
        keep_going()
        g.end_capture_to_conditional_node()

    def solve_graph() -> int:
        g.replay()
        return int(iters.item())

    def solve_host() -> int:
        x.zero_()
        iters.zero_()
        n = 0
        while True:
            iterate()
            n += 1
            if not (res.item() > TOL and n < MAX_ITERS):     # a host round trip per iteration
                return n

    n_graph = solve_graph()
    x_graph = x.numpy().copy()
    n_host = solve_host()
    x_host = x.numpy().copy()
    ref = np.linalg.solve(a_np.astype(np.float64), b_np.astype(np.float64))
    print(f"graph: {n_graph} iterations, residual {res.item():.2e}, error {np.abs(x_graph - ref).max():.2e}")
    print(f"host : {n_host} iterations, error {np.abs(x_host - ref).max():.2e}")
    print("same answer:", n_graph == n_host and np.allclose(x_graph, x_host, rtol=1e-5, atol=1e-6))

    times = {}
    for name, solve in (("one WHILE-node graph", solve_graph), ("host loop", solve_host)):
        solve()
        samples = []
        for _ in range(5):
            t0 = time.perf_counter()
            solve()
            samples.append(time.perf_counter() - t0)
        times[name] = float(np.median(samples))
        print(f"{name:>22}: {times[name] * 1e3:8.2f} ms per solve (median of 5)")
    print(f"speed-up: {times['host loop'] / times['one WHILE-node graph']:.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
