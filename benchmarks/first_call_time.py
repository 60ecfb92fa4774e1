# SPDX-License-Identifier: Apache-2.0
"""Time to the first result of a server's step, and the memory each way of
capturing leaves: tp.cuda.GraphSet with capture="all", "largest" and
"on_demand" against PyTorch capturing every size the way vLLM does.

Run from benchmarks/ on the GPU machine::

    python first_call_time.py [--reps 3] [--largest 512] [--first-rows 1]

The workload is the serving sections' bf16 MLP step (hidden 1024, ffn 4096,
bias, tanh GELU, residual: tpbench.workloads), written in PyTorch, at
vLLM's sizes up to --largest (51 sizes for 512). Both libraries are warm
(the step ran eagerly once at the largest size) before any build, as in a
server that loaded its model.

Part 1, time to first token. For each contender, from a settled device
(both caches emptied): the wall time from the start of construction to the
first call's result (--first-rows rows, synchronized), then to the end of a
trace that calls every size once more in a random order (so every size is
used, and a lazy set has captured them all); the device memory the server
holds after the trace (mem_get_info drop, caches emptied). Medians over
--reps builds, contenders interleaved in each round; the first call's and
the trace's last result are checked against eager PyTorch.

Part 2, the memory consequence of the capture order. For capture="largest"
and capture="on_demand", the pool growth of the set (the sum of
memory_added, which is the sleepable pool's mapped bytes) once every size
has been called in descending, random and ascending order, beside
capture="all" (largest first at construction).
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time

import numpy as np

import tensorplay as tp
from tpbench import vllm_style as ss
from tpbench.common import TOLERANCE, gpu_and_torch, mib, relative_error, to_library
from tpbench.workloads import SERVING_HIDDEN, serving_weights, torch_mlp_step

MODES = ("all", "largest", "on_demand")


def settle(torch):
    gc.collect()
    torch.cuda.synchronize()
    # PyTorch keeps a cuBLAS workspace per stream in its cache; a GraphSet's
    # build drops them, which would count as memory the set gave back
    clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
    if clear is not None:
        clear()
    torch.cuda.empty_cache()
    tp.cuda.synchronize()
    tp.cuda.empty_cache()
    tp.cuda.synchronize()
    return tp.cuda.mem_get_info()[0]


def make_inputs(torch, rows, seed):
    """One bf16 input of each row count in ``rows``, made before any timing."""
    rng = np.random.default_rng(seed)
    return [to_library(torch, rng.random((n, SERVING_HIDDEN), dtype=np.float32) * 2 - 1, "bfloat16")
            for n in rows]


def contenders(torch, step, samples, sizes):
    """[(name, build)]: each build() returns a callable server with reset()."""
    out = [("PyTorch, vLLM-style, every size up front", lambda: ss.VllmStyleGraphs(torch, step, samples, sizes))]
    for mode in MODES:
        out.append((f"GraphSet capture={mode!r}",
                    lambda mode=mode: tp.cuda.GraphSet(step, samples, sizes, capture=mode, progress=False)))
    return out


def one_start(torch, step, build, first, trace):
    """Build, call ``first``, then every input of ``trace``: (ms to the first
    result, ms to the trace's end, MiB held after it, worst error, server)."""
    free0 = settle(torch)
    t0 = time.perf_counter()
    server = build()
    got = server(first)
    torch.cuda.synchronize()
    first_ms = (time.perf_counter() - t0) * 1e3
    first_err = relative_error(got, step(first), torch)
    for x in trace:
        got = server(x)
    torch.cuda.synchronize()
    all_ms = (time.perf_counter() - t0) * 1e3
    last_err = relative_error(got, step(trace[-1]), torch)
    held = free0 - settle(torch)
    return first_ms, all_ms, mib(held), max(first_err, last_err), server


def time_to_first_token(torch, step, samples, sizes, first_rows, reps):
    first = make_inputs(torch, [first_rows], 1)[0]
    order = np.random.default_rng(2).permutation(sizes).tolist()
    trace = make_inputs(torch, order, 3)
    figures = {}
    for _ in range(reps):
        for name, build in contenders(torch, step, samples, sizes):
            first_ms, all_ms, held, err, server = one_start(torch, step, build, first, trace)
            figures.setdefault(name, []).append((first_ms, all_ms, held, err))
            server.reset()
            del server
            settle(torch)
    print(f"\ntime to first token: {len(sizes)} sizes (1..{sizes[-1]}), first call {first_rows} row(s), "
          f"then every size once in a random order; medians of {reps}")
    print(f"{'contender':44s} {'first result ms':>16s} {'all sizes used ms':>18s} {'held MiB':>9s}  check")
    for name, rows in figures.items():
        worst = max(r[3] for r in rows)
        check = "ok" if worst <= TOLERANCE["bfloat16"] else f"DIFFERS from eager by {worst:.2e}"
        print(f"{name:44s} {statistics.median(r[0] for r in rows):16.1f} "
              f"{statistics.median(r[1] for r in rows):18.1f} {statistics.median(r[2] for r in rows):9.0f}  {check}")


def capture_order_memory(torch, step, samples, sizes):
    orders = {"descending": sorted(sizes, reverse=True),
              "random": np.random.default_rng(4).permutation(sizes).tolist(),
              "ascending": sorted(sizes)}
    print("\npool growth once every size is called (MiB, sum of memory_added; the pool's mapped bytes)")
    for mode in MODES:
        for order_name, order in orders.items() if mode != "all" else [("at construction", [])]:
            settle(torch)
            trace = make_inputs(torch, order, 5)
            gs = tp.cuda.GraphSet(step, samples, sizes, capture=mode, progress=False)
            for x in trace:
                gs(x)
            torch.cuda.synchronize()
            added = sum(gs.memory_added.values())
            mapped = gs.pool.memory()["mapped"] if gs.pool is not None else 0
            print(f"  capture={mode!r:12s} {order_name:16s} {mib(added):8.1f} MiB  (mapped {mib(mapped):.1f} MiB, "
                  f"{len(gs.graphs)} graphs)")
            del trace
            gs.reset()
            del gs


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--largest", type=int, default=512)
    ap.add_argument("--first-rows", type=int, default=1)
    args = ap.parse_args()
    torch, exit_code = gpu_and_torch("the step is PyTorch code")
    if torch is None:
        return exit_code
    sizes = ss.vllm_sizes(args.largest)
    w = {k: to_library(torch, v, "bfloat16") for k, v in serving_weights().items()}
    step = torch_mlp_step(torch, w)
    samples = [w["x"][:sizes[-1]]]
    with torch.no_grad():
        step(*samples)                          # both libraries warm, as in a server that loaded its model
        torch.cuda.synchronize()
        time_to_first_token(torch, step, samples, sizes, args.first_rows, args.reps)
        capture_order_memory(torch, step, samples, sizes)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
