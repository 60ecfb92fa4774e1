# SPDX-License-Identifier: Apache-2.0
"""PyTorch code under a WHILE node: iterate until converged, decided on the GPU.

A fixed-point solve, as in a deep-equilibrium layer: z = tanh(z W^T + x) for
a batch of 64 inputs of width 1024, iterated from z = 0 until the relative
change of z drops below a tolerance. Each iteration is plain PyTorch (a
cuBLAS matmul with a 1024 x 1024 matrix, a tanh, two norms, a comparison).
tensorplay captures it once into a graph whose WHILE node repeats it while
the flag ``keep_going``, computed by PyTorch on the GPU, is true: a solve is
one graph launch and one wait, however many iterations it takes. The same
loop run eagerly reads the flag on the host (``.item()``) after every
iteration: one synchronization per iteration.

Needs a GPU and PyTorch. Run (in a clone: bash scripts/setup.sh, then
.venv/bin/python in place of python):
    python examples/torch_while.py
"""

from __future__ import annotations

import importlib
import statistics
import sys
import time
from typing import Any, Callable

import tensorplay as tp

BATCH, WIDTH, TOL, MAX_ITERS = 64, 1024, 1e-5, 1000


def main() -> int:
    if not tp.cuda.is_available():
        print(f"No CUDA GPU here ({tp.cuda.unavailable_reason()}); this example needs one.")
        return 0
    try:
        torch: Any = importlib.import_module("torch")          # optional: typed as Any here
    except ImportError:
        print("PyTorch is not installed: this example needs it (pip install torch).")
        return 0
    if not torch.cuda.is_available():
        print("PyTorch sees no CUDA GPU (a CPU-only build?): this example needs one.")
        return 0

    gen = torch.Generator(device="cuda").manual_seed(0)
    # every singular value of W is 0.95: the map is a contraction, so the iteration converges
    W = 0.95 * torch.linalg.qr(torch.randn(WIDTH, WIDTH, generator=gen, device="cuda"))[0]
    x = torch.zeros(BATCH, WIDTH, device="cuda")        # static input: the graph reads this memory
    z = torch.zeros(BATCH, WIDTH, device="cuda")        # the iterate, and the answer
    iters = torch.zeros((), dtype=torch.int32, device="cuda")
    keep_going = torch.ones((), dtype=torch.bool, device="cuda")      # the WHILE node's predicate

    def restart() -> None:
        z.zero_()
        iters.zero_()
        keep_going.fill_(True)

    def step() -> None:
        """One iteration, all on the GPU: no host read, so it can be captured."""
        z_next = torch.tanh(z @ W.T + x)
        change = (z_next - z).norm() / z_next.norm()
        z.copy_(z_next)
        iters.add_(1)
        torch.logical_and(change > TOL, iters < MAX_ITERS, out=keep_going)

    restart()
    step()                          # warm up: load the kernels and make cuBLAS's handle before capturing
    g = tp.cuda.CUDAGraph()
    with tp.cuda.graph(g):          # in here PyTorch's current stream is the capture stream
        restart()
        with g.while_(keep_going):  # repeats while keep_going is true, read on the GPU
            step()

    def solve_graph() -> int:
        g.replay()                  # the whole solve: one launch, on the default stream like PyTorch's work
        return int(iters.item())    # one wait, at the end

    def solve_eager() -> int:
        restart()
        while True:
            step()
            if not keep_going.item():       # a host round trip per iteration
                return int(iters.item())

    all_same = True
    for scale in (1.0, 0.1):                     # smaller inputs take more iterations
        x.copy_(scale * torch.randn(BATCH, WIDTH, generator=gen, device="cuda"))   # new input: copy it in
        n_graph = solve_graph()
        z_graph = z.clone()
        n_eager = solve_eager()
        # the same kernels run in both, but cuBLAS may choose another algorithm on the capture
        # stream: allow a last-bit difference, so one iteration more or less at the tolerance
        same = abs(n_graph - n_eager) <= 1 and bool(torch.allclose(z_graph, z, rtol=0, atol=1e-4))
        all_same &= same
        print(f"input scale {scale}: {n_graph} iterations in the graph, {n_eager} eagerly; same answer: {same}")

    def host_ms(solve: Callable[[], int]) -> float:
        solve()                                             # warm-up
        samples = []
        for _ in range(5):
            t0 = time.perf_counter()
            solve()
            samples.append(time.perf_counter() - t0)
        return statistics.median(samples) * 1e3

    t_graph, t_eager = host_ms(solve_graph), host_ms(solve_eager)
    print(f"one WHILE-node graph: {t_graph:7.3f} ms per solve (one launch, one wait)")
    print(f"   eager PyTorch loop: {t_eager:7.3f} ms per solve ({n_eager} iterations, a sync after each)")
    print(f"speed-up: {t_eager / t_graph:.1f}x")
    return 0 if all_same else 1


if __name__ == "__main__":
    sys.exit(main())
