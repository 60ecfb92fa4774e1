# SPDX-License-Identifier: Apache-2.0
"""What following PyTorch costs a capture, step by step (issue 42).

Runs on the GPU machine, from ``benchmarks/``::

    python probe_foreign_steps.py [--repeats 300]

With PyTorch imported and its CUDA up, times (median host us over
``--repeats`` calls, each step in a loop of its own) every PyTorch call a
tensorplay capture makes to follow PyTorch: the session's preparation, a
``torch.cuda.MemPool`` made and let go, routing allocations to it and back,
switching PyTorch's current stream, the live-allocation check of a parked
pool; then capture + instantiate of 1 and 10 in-place adds with foreign
capture on and off, and the phases (begin, body, end, reset) of each.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import tensorplay as tp
from tensorplay._graph import foreign
from tpbench.capture import capture_phases
from tpbench.common import gpu_and_torch, median_host_us, to_library
from tpbench.workloads import SERVING_BATCHES, serving_weights, tp_mlp_step


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=300)
    args = ap.parse_args()
    n = args.repeats
    torch, code = gpu_and_torch("the steps timed are PyTorch's")
    if torch is None:
        sys.exit(code)
    torch.zeros(1, device="cuda").add_(1)
    x = tp.zeros(1, device="cuda")
    x.add_(1)
    dev = 0
    c = torch._C
    lib = next(lib for lib in foreign._libraries if lib.name == "torch")
    stream = tp.cuda.Stream()

    def row(name, us):
        print(f"{name:62} {us:9.2f}", flush=True)

    row("begin_session (libraries looked up)", median_host_us(lambda: foreign.begin_session(dev, True), n))
    row("TorchLibrary.prepare", median_host_us(lambda: lib.prepare(dev), n))
    row("torch._C._cuda_clearCublasWorkspaces", median_host_us(lambda: c._cuda_clearCublasWorkspaces(), n))
    row("release_parked_pools (none parked)", median_host_us(lambda: foreign.release_parked_pools(), n))
    row("TorchLibrary.current_stream_handle", median_host_us(lambda: lib.current_stream_handle(dev), n))
    row("TorchLibrary.is_capturing", median_host_us(lambda: lib.is_capturing(), n))
    session = foreign.begin_session(dev, True)
    row("ForeignSession.streams_to_join", median_host_us(lambda: session.streams_to_join(), n))
    row("torch.cuda.MemPool() made", median_host_us(lambda: torch.cuda.MemPool(), n))
    pools = []
    row("torch.cuda.MemPool() made and kept", median_host_us(lambda: pools.append(torch.cuda.MemPool()), n))
    row("torch.cuda.MemPool() let go (never used)", median_host_us(lambda: pools.pop(), n))
    pool = torch.cuda.MemPool()
    pid = pool.id
    row("MemPool.id", median_host_us(lambda: pool.id, n))

    def route():
        c._cuda_beginAllocateCurrentThreadToPool(dev, pid)
        c._cuda_endAllocateToPool(dev, pid)
    row("begin + end allocating to a pool", median_host_us(route, n))
    prev = c._cuda_getCurrentStream(dev)
    ext = lib._external(dev, stream)

    def switch():
        c._cuda_setStream(stream_id=ext.stream_id, device_index=ext.device_index, device_type=ext.device_type)
        c._cuda_setStream(stream_id=prev[0], device_index=prev[1], device_type=prev[2])
    row("PyTorch's current stream set and restored", median_host_us(switch, n))
    row("torch._C._cuda_checkPoolLiveAllocations",
        median_host_us(lambda: c._cuda_checkPoolLiveAllocations(dev, pid, set()), n))
    row("_cuda_getDevice", median_host_us(lambda: c._cuda_getDevice(), n))

    def lib_begin_end():
        state = lib.begin(dev, stream, tp.cuda.graph_pool_handle())
        keep = lib.end(state, True)
        keep.clear()
    row("TorchLibrary.begin + end, a fresh pool, hold let go", median_host_us(lib_begin_end, n))

    def session_all():
        s = foreign.begin_session(dev, True)
        s.streams_to_join()
        s.begin(stream, tp.cuda.graph_pool_handle())
        s.end().clear()
    row("a whole session (join, begin, end, hold let go)", median_host_us(session_all, n))

    for nodes in (1, 10):
        def adds():
            for _ in range(nodes):
                x.add_(1)
        for on in (False, True):
            phases = {}
            for _ in range(n):
                tp.cuda.synchronize()
                for k, v in capture_phases(adds, on).items():
                    phases.setdefault(k, []).append(v)
            label = f"capture {nodes} add(s), foreign {'on' if on else 'off'}: "
            print(label + ", ".join(f"{k} {statistics.median(v):.1f}" for k, v in phases.items()), flush=True)

    serving_calls(n)


def serving_calls(n):
    """The serving step's calls, eagerly and inside an open capture (median host us)."""
    w = {k: to_library(tp, v, "bfloat16") for k, v in serving_weights().items()}
    step = tp_mlp_step(w)
    x = w["x"][:8]
    calls = {
        "empty 4 MiB": lambda: tp.empty((1024, 1024), device="cuda"),
        "linear 1 (bias, gelu)": lambda: tp.linear(x, w["w1"], w["b1"], activation="gelu"),
        "add": lambda: x + x,
        "the whole step": lambda: step(x),
    }
    for name, fn in calls.items():
        for _ in range(5):
            fn()
        eager = median_host_us(lambda: fn(), n)
        g = tp.cuda.CUDAGraph()
        g.capture_begin()
        try:
            inside = median_host_us(lambda: fn(), min(n, 200))
        finally:
            g.capture_end()
        g.reset()
        print(f"{name:40} eager {eager:8.2f}   inside a capture {inside:8.2f}", flush=True)
    serving_graphs(step, x, n)
    serving_set(step, w["x"])
    attribute(step, x, min(n, 200))


def _stat(key):
    return tp.cuda.memory_stats().get(key, 0)


def serving_graphs(step, x, n):
    """One graph of the step at batch 8 in a private pool, foreign capture
    off and on interleaved: the phases (median host us) and the device
    allocations and frees a capture + reset made (mean)."""
    phases = {False: {}, True: {}}
    counts = {on: [0, 0] for on in (False, True)}
    for _ in range(n):
        for on in (False, True):
            a0, f0 = _stat("num_device_alloc"), _stat("num_device_free")
            for k, v in capture_phases(lambda: step(x), on).items():
                phases[on].setdefault(k, []).append(v)
            counts[on][0] += _stat("num_device_alloc") - a0
            counts[on][1] += _stat("num_device_free") - f0
    for on in (False, True):
        print(f"the step at batch 8, private pool, foreign {'on' if on else 'off'}: "
              + ", ".join(f"{k} {statistics.median(v):.1f}" for k, v in phases[on].items())
              + f"; device allocs {counts[on][0] / n:.2f}, frees {counts[on][1] / n:.2f} a capture", flush=True)


def serving_set(step, x_all):
    """The gate's serving row without PyTorch's side: 67 graphs of the step,
    largest first, into one pool, foreign capture off and on (3 rounds
    each, interleaved; median ms)."""
    times = {False: [], True: []}
    for _ in range(3):
        for on in (False, True):
            pool = tp.cuda.graph_pool_handle()
            graphs = []
            tp.cuda.synchronize()
            t0 = time.perf_counter()
            for b in sorted(SERVING_BATCHES, reverse=True):
                g = tp.cuda.CUDAGraph()
                g.capture_begin(pool=pool, foreign=on)
                graphs.append((g, step(x_all[:b])))
                g.capture_end()
            tp.cuda.synchronize()
            times[on].append((time.perf_counter() - t0) * 1e3)
            del graphs
    for on in (False, True):
        print(f"67 graphs into one pool, foreign {'on' if on else 'off'}: {statistics.median(times[on]):.2f} ms",
              flush=True)


def attribute(step, x, n):
    """Where the foreign-on capture's host time goes: the follow session's
    functions timed in place (accumulated, us a capture; nested calls count
    in both), over n captures of the step at batch 8 in a private pool."""
    totals = {}

    def timed(owner, name, label):
        fn = getattr(owner, name)

        def wrapper(*a, **k):
            t0 = time.perf_counter_ns()
            try:
                return fn(*a, **k)
            finally:
                totals[label] = totals.get(label, 0) + time.perf_counter_ns() - t0
        setattr(owner, name, wrapper)
        return fn

    lib_type = type(next(lib for lib in foreign._libraries if lib.name == "torch"))
    targets = [(foreign.ForeignSession, "streams_to_join"), (foreign.ForeignSession, "begin"),
               (foreign.ForeignSession, "end"), (lib_type, "prepare"), (lib_type, "begin"),
               (lib_type, "end"), (lib_type, "mem_pool"), (foreign, "release_parked_pools"),
               (foreign, "_release_parked"), (foreign._PoolHold, "__del__")]
    saved = [(o, nm, timed(o, nm, f"{getattr(o, '__name__', o)}.{nm}")) for o, nm in targets]
    whole = []
    try:
        for _ in range(n):
            g = tp.cuda.CUDAGraph()
            t0 = time.perf_counter_ns()
            g.capture_begin(foreign=True)
            step(x)
            g.capture_end()
            g.reset()
            whole.append(time.perf_counter_ns() - t0)
    finally:
        for o, nm, fn in saved:
            setattr(o, nm, fn)
    print(f"attribution over {n} captures + resets of the step, foreign on: {sum(whole) / n / 1e3:.1f} us each")
    for label, ns in sorted(totals.items(), key=lambda kv: -kv[1]):
        print(f"  {label:60} {ns / n / 1e3:8.2f}")


if __name__ == "__main__":
    main()
