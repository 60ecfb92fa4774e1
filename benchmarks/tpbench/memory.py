# SPDX-License-Identifier: Apache-2.0
"""Section ``memory``: reserved device memory of tensorplay and PyTorch on the same work.

Each figure is the growth of ``memory_reserved()`` (both libraries' own
counter) over a baseline taken after ``gc.collect()`` and ``empty_cache()``:
an eager loop, chained graphs in private and shared pools, a seeded random
sequence of allocations and frees, capture + reset cycles. compare.py runs
it first, before the other sections allocate.
"""

from __future__ import annotations

import gc
import math
import random

import numpy as np

import tensorplay as tp
from tpbench.common import MIB, guarded, mib, record, settle, size_label

MEMORY_FIGURES = (("reserved_mib", "growth"), ("total_mib", "total growth"), ("peak_mib", "peak"),
                  ("final_mib", "final"))
MEMORY_LEGEND = """\
growth: memory_reserved() after the work minus just before it (eager loop: after its first iteration,
  so the input's and the first output's segments are excluded; graphs: the inputs allocated and the
  cache emptied, so what the captures reserve); total growth: over the baseline (gc.collect(),
  empty_cache(), synchronize()); peak: max_memory_reserved() after reset_peak_memory_stats() at the
  baseline, minus the baseline; final: at the end of the sequence, its live tensors still held."""


def memory_case(case, libraries, measure, *args):
    """Record ``measure(lib, *args)``'s MiB figures for each library, each in
    its own guard, and leave each library settled for the next case."""
    for name, lib in libraries:
        @guarded("memory", case, name)
        def _measure():
            record("memory", case, name, **measure(lib, *args))
        settle(lib)


def eager_loop(lib, nbytes, iterations):
    """``y = x * 2.0; del y`` ``iterations`` times: reserved growth after the
    first iteration (the target is 0: every output reuses the freed block)
    and over the baseline."""
    y = lib.ones(nbytes // 4, dtype=lib.float32, device="cuda") * 2.0     # compiles the kernel
    del y
    base = settle(lib)
    x = lib.ones(nbytes // 4, dtype=lib.float32, device="cuda")
    y = x * 2.0
    del y
    after_first = lib.cuda.memory_reserved()
    for _ in range(iterations - 1):
        y = x * 2.0
        del y
    lib.cuda.synchronize()
    after = lib.cuda.memory_reserved()
    return {"reserved_mib": mib(after - after_first), "total_mib": mib(after - base)}


def chain(x, ops):
    """``x = x * 1.0001 + 1``, ``ops`` times (two kernels each)."""
    for _ in range(ops):
        x = x * 1.0001 + 1
    return x


def chained_graphs(lib, nbytes, graphs, ops, shared):
    """Capture ``graphs`` graphs of ``ops`` chained ``x = x * 1.0001 + 1``,
    graph k+1 reading graph k's output, each in its own private pool or all in
    one shared pool: the reserved growth of the captures, and a check of one
    replay of every graph in order against the same work done eagerly."""
    x_in = lib.ones(nbytes // 4, dtype=lib.float32, device="cuda")
    chain(x_in, ops)                                                    # compiles the kernels
    before = settle(lib)
    pool = lib.cuda.graph_pool_handle() if shared else None
    captured, x = [], x_in
    for _ in range(graphs):
        g = lib.cuda.CUDAGraph()
        with lib.cuda.graph(g, pool=pool):
            x = chain(x, ops)
        captured.append((g, x))
    lib.cuda.synchronize()
    growth = lib.cuda.memory_reserved() - before
    return {"reserved_mib": mib(growth), "error": check_chained_replay(x_in, captured, graphs * ops)}


def check_chained_replay(x_in, captured, ops):
    """Replay ``captured`` [(graph, its output)] in order from a fresh input
    value and compare the last output with ``ops`` eager steps: None when
    they agree, else what is wrong (for the row's error)."""
    x_in.fill_(0.5)             # not the warm-up's value: a replay that did nothing shows
    for g, _ in captured:
        g.replay()
    got = captured[-1][1].cpu().numpy()
    want = chain(x_in * 1.0, ops).cpu().numpy()
    if np.allclose(got, want, rtol=1e-5, atol=0.0):
        return None
    bad = int(np.count_nonzero(~np.isclose(got, want, rtol=1e-5, atol=0.0)))
    return f"wrong result after replay: {bad} of {want.size} values differ from eager"


def random_alloc_steps(steps, seed=0, p_alloc=0.55, smallest=512, largest=64 * MIB):
    """A seeded sequence for every library alike: a positive step allocates
    that many bytes (log-uniform in [smallest, largest]); a negative step
    -(k + 1) frees live tensor k, whose place the last live tensor takes.
    An empty live set always allocates."""
    rng = random.Random(seed)
    lo, hi = math.log(smallest), math.log(largest)
    out, live = [], 0
    for _ in range(steps):
        if live == 0 or rng.random() < p_alloc:
            out.append(int(math.exp(rng.uniform(lo, hi))))
            live += 1
        else:
            out.append(-(rng.randrange(live) + 1))
            live -= 1
    return out


def random_allocations(lib, steps):
    """Run ``random_alloc_steps`` on uint8 tensors: peak reserved over the
    sequence and reserved at its end, both over the baseline."""
    base = settle(lib)
    lib.cuda.reset_peak_memory_stats()
    live = []
    for step in steps:
        if step > 0:
            live.append(lib.empty(step, dtype=lib.uint8, device="cuda"))
        else:
            live[-step - 1] = live[-1]
            live.pop()
    lib.cuda.synchronize()
    final = lib.cuda.memory_reserved()
    peak = lib.cuda.max_memory_reserved()
    return {"peak_mib": mib(peak - base), "final_mib": mib(final - base)}


def capture_reset_cycles(lib, cycles):
    """Capture ``y = (x * 2.0).sum()`` on a 1 MiB input with a 4 MiB
    temporary allocated and freed inside the capture, then reset the graph,
    ``cycles`` times: reserved growth after gc.collect(), with no
    empty_cache() of ours (PyTorch's graph() empties the cache on entry)."""
    x = lib.ones(MIB // 4, dtype=lib.float32, device="cuda")

    def body():
        tmp = lib.ones(MIB, dtype=lib.float32, device="cuda")        # 4 MiB, freed inside the capture
        del tmp
        return (x * 2.0).sum()
    body()                                                              # compiles the kernels
    before = settle(lib)
    for _ in range(cycles):
        g = lib.cuda.CUDAGraph()
        with lib.cuda.graph(g):
            y = body()
        g.reset()
        del g, y
    lib.cuda.synchronize()
    gc.collect()
    return {"reserved_mib": mib(lib.cuda.memory_reserved() - before)}


def memory_rows(quick, torch):
    """Reserved device memory of tensorplay and PyTorch on the same work."""
    libraries = [("tensorplay", tp)] + ([("PyTorch", torch)] if torch is not None else [])
    eager_sizes = [MIB, 4 * MIB, 16 * MIB] if quick else [64 << 10, MIB, 2 * MIB, 4 * MIB, 8 * MIB, 16 * MIB,
                                                          64 * MIB]
    for nbytes in eager_sizes:
        memory_case(f"eager y = x * 2.0; del y (200x), x {size_label(nbytes)}", libraries, eager_loop, nbytes, 200)
    for nbytes in (4 * MIB, 16 * MIB):
        memory_case(f"1 graph of 16x (x * 1.0001 + 1), {size_label(nbytes)}", libraries, chained_graphs,
                    nbytes, 1, 16, False)
    for n in (2, 4):
        for nbytes in (4 * MIB, 16 * MIB):
            for shared, pools in ((False, "private pools"), (True, "one shared pool")):
                memory_case(f"{n} chained graphs of 4x (x * 1.0001 + 1), {size_label(nbytes)}, {pools}",
                            libraries, chained_graphs, nbytes, n, 4, shared)
    steps = 1000 if quick else 3000
    memory_case(f"random {steps} allocs/frees, 512 B-64 MiB, seed 0", libraries, random_allocations,
                random_alloc_steps(steps))
    memory_case("100 capture + reset cycles, 1 MiB input + 4 MiB temporary", libraries, capture_reset_cycles, 100)
