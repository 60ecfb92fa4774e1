# SPDX-License-Identifier: Apache-2.0
"""Wall time of capturing a whole set of graphs, one per batch size (vLLM's
51 sizes, 1..512): tp.cuda.GraphSet against PyTorch.

Run from benchmarks/ on the GPU machine::

    python capture_set_time.py [--reps 3]

Two workloads written in PyTorch: the serving section's bf16 MLP step
(hidden 1024, ffn 4096, bias, tanh GELU, residual) and the small model's
batched decode step (tpbench.vllm_style.decode_step). Four ways to build
the set, each timed --reps times (median and min printed), its graphs reset
and both libraries' caches emptied between builds:

- PyTorch the way vLLM builds it (tpbench.vllm_style.VllmStyleGraphs: one
  gc.collect and gc.freeze, an eager warm-up and a synchronize before each
  size's capture, weak references to the outputs);
- a bare loop of ``torch.cuda.graph`` per size into one pool (its own
  gc.collect per capture, no warm-ups, outputs kept);
- ``tp.cuda.GraphSet`` with its default sleepable pool;
- ``tp.cuda.GraphSet`` with a plain pool (``graph_pool_handle()``).
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time

import tensorplay as tp
from tpbench import vllm_style as ss
from tpbench.common import gpu_and_torch

HIDDEN, FFN = 1024, 4096


class BareTorchGraphs:
    """``torch.cuda.graph`` of ``step`` per size, largest first, in one pool."""

    def __init__(self, torch, step, args, sizes):
        self.pool = torch.cuda.graph_pool_handle()
        self.graphs = []
        for s in reversed(sizes):
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, pool=self.pool):
                out = step(*[a[:s] for a in args])
            self.graphs.append((g, out))

    def reset(self):
        for entry in self.graphs:
            entry[0].reset()
        self.graphs.clear()


def mlp_step(torch):
    F = torch.nn.functional
    gen = torch.Generator(device="cuda").manual_seed(0)

    def weight(*shape, scale):
        return (torch.randn(*shape, device="cuda", generator=gen) * scale).to(torch.bfloat16)
    w1, b1 = weight(FFN, HIDDEN, scale=HIDDEN ** -0.5), weight(FFN, scale=0.1)
    w2, b2 = weight(HIDDEN, FFN, scale=FFN ** -0.5), weight(HIDDEN, scale=0.1)

    def step(x):
        return F.linear(F.gelu(F.linear(x, w1, b1), approximate="tanh"), w2, b2) + x
    return step, [weight(512, HIDDEN, scale=1.0)]


def decode_step(torch):
    step, cfg = ss.decode_step(torch, "small", 512, 256)
    tok = torch.randint(0, cfg.vocab - 1, (512,), device="cuda")
    pos = torch.randint(0, 256, (512,), device="cuda")
    return step, [tok, pos]


def timed(torch, name, build, reps):
    times = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        built = build()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        built.reset()
        del built
        gc.collect()
        torch.cuda.empty_cache()
        tp.cuda.empty_cache()
    print(f"{name:58s} median {statistics.median(times) * 1e3:8.1f} ms  min {min(times) * 1e3:8.1f} ms  "
          f"(n={reps})", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    torch, exit_code = gpu_and_torch("both workloads are PyTorch code")
    if torch is None:
        return exit_code
    sizes = ss.vllm_sizes(512)
    for name, make in (("MLP 1024/4096 bf16", mlp_step), ("small decode step", decode_step)):
        step, samples = make(torch)
        step(*samples)                       # both libraries start warm at the largest size
        torch.cuda.synchronize()
        timed(torch, f"{name}: vLLM-style torch.cuda.graph",
              lambda: ss.VllmStyleGraphs(torch, step, samples, sizes), args.reps)
        timed(torch, f"{name}: bare torch.cuda.graph loop",
              lambda: BareTorchGraphs(torch, step, samples, sizes), args.reps)
        timed(torch, f"{name}: GraphSet (sleepable pool)",
              lambda: tp.cuda.GraphSet(step, samples, sizes, progress=False), args.reps)
        timed(torch, f"{name}: GraphSet (plain pool)",
              lambda: tp.cuda.GraphSet(step, samples, sizes, pool=tp.cuda.graph_pool_handle(),
                                       progress=False), args.reps)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
