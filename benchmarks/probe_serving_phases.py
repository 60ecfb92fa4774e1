# SPDX-License-Identifier: Apache-2.0
"""Where the serving capture's time goes, graph by graph (issue 42).

Runs on the GPU machine, from ``benchmarks/``::

    python probe_serving_phases.py [--rounds 5]

The serving section's 67 graphs of the MLP step (batch 512 down to 1, one
pool), captured by tensorplay with foreign capture on and off, by
``torch.cuda.graph`` and by PyTorch's ``capture_begin``/``capture_end``
(the serving section's ``capture_serving``: warmed up and settled first),
rounds interleaved (median ms a set); for tensorplay, the median host us
a graph of each phase (graph made, capture_begin, the input sliced, each
op, capture_end); the driver's share of one graph (cuGraphInstantiate of
the captured graphs, an empty capture begun and ended); the step's ops
eagerly; and what ``torch.cuda.graph`` does on entry besides capturing.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import io
import pstats
import statistics
import sys
import time

import tensorplay as tp
from tpbench.common import gpu_and_torch, median_host_us, to_library
from tpbench.serving import capture_serving, torch_capture_graph_ctx, torch_capture_raw
from tpbench.workloads import SERVING_BATCHES, serving_weights, torch_mlp_step

PHASES = ("graph made", "capture_begin", "slice", "linear 1", "linear 2", "add", "capture_end")


def tp_set(w, foreign, phases):
    """One set of tensorplay graphs; each phase's host us appended to ``phases``."""
    pool = tp.cuda.graph_pool_handle()
    graphs = []
    x = w["x"]
    clock = time.perf_counter
    tp.cuda.synchronize()
    start = clock()
    for b in sorted(SERVING_BATCHES, reverse=True):
        t0 = clock()
        g = tp.cuda.CUDAGraph()
        t1 = clock()
        g.capture_begin(pool=pool, foreign=foreign)
        t2 = clock()
        xb = x[:b]
        t3 = clock()
        h = tp.linear(xb, w["w1"], w["b1"], activation="gelu")
        t4 = clock()
        y = tp.linear(h, w["w2"], w["b2"])
        t5 = clock()
        out = y + xb
        t6 = clock()
        g.capture_end()
        t7 = clock()
        del h, y
        graphs.append((g, out))
        for name, a, b_ in zip(PHASES, (t0, t1, t2, t3, t4, t5, t6), (t1, t2, t3, t4, t5, t6, t7)):
            phases.setdefault(name, []).append((b_ - a) * 1e6)
    tp.cuda.synchronize()
    return (clock() - start) * 1e3, graphs


def torch_set(torch, w, capture):
    """One set of PyTorch graphs of the step, as the serving section captures
    them (``capture``: its torch.cuda.graph or capture_begin/end capture)."""
    graphs, ms, _ = capture_serving(torch, torch_mlp_step(torch, w), w["x"], capture)
    return ms, graphs


def gc_share(w, foreign):
    """(ms of one tensorplay set, ms the cyclic collector ran during it, collections by generation)."""
    spent, starts, counts = [0.0], [0.0], [0, 0, 0]

    def on_gc(phase, info):
        if phase == "start":
            starts[0] = time.perf_counter()
        else:
            spent[0] += time.perf_counter() - starts[0]
            counts[info["generation"]] += 1
    gc.collect()
    gc.callbacks.append(on_gc)
    try:
        ms, graphs = tp_set(w, foreign, {})
    finally:
        gc.callbacks.remove(on_gc)
    del graphs
    return ms, spent[0] * 1e3, counts


def profile_set(w, foreign, top):
    """The functions one tensorplay set spends its time in (cProfile, by own time)."""
    gc.collect()
    prof = cProfile.Profile()
    prof.enable()
    _, graphs = tp_set(w, foreign, {})
    prof.disable()
    del graphs
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(top)
    return text.getvalue()


def segments_made(lib, make_set):
    """Device allocations (new segments) the caching allocator of ``lib`` made
    while ``make_set()`` captured one set, the set's graphs dropped after."""
    key = "num_device_alloc" if lib is tp else "segment.all.allocated"
    before = lib.cuda.memory_stats().get(key, 0)
    made = make_set()
    after = lib.cuda.memory_stats().get(key, 0)
    del made
    gc.collect()
    return after - before


def mem_alloc_us(nbytes, repeats):
    """Median host us of cuMemAlloc and of cuMemFree of ``nbytes`` (cuda.bindings)."""
    from cuda.bindings import driver
    alloc, free = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        err, ptr = driver.cuMemAlloc(nbytes)
        t1 = time.perf_counter()
        assert err == driver.CUresult.CUDA_SUCCESS, err
        driver.cuMemFree(ptr)
        t2 = time.perf_counter()
        alloc.append((t1 - t0) * 1e6)
        free.append((t2 - t1) * 1e6)
    return statistics.median(alloc), statistics.median(free)


def driver_share(graphs, repeats):
    """Median us of cuGraphInstantiate + destroy over the captured graphs, and of
    an empty capture begun and ended on a fresh stream (cuda.bindings' calls)."""
    from cuda.bindings import driver
    inst = []
    for g, _ in graphs:
        handle = driver.CUgraph(g.graph_handle)
        t0 = time.perf_counter()
        err, ex = driver.cuGraphInstantiate(handle, 0)
        t1 = time.perf_counter()
        assert err == driver.CUresult.CUDA_SUCCESS, err
        driver.cuGraphExecDestroy(ex)
        inst.append((t1 - t0) * 1e6)
    stream = tp.cuda.Stream()
    s = driver.CUstream(stream.handle)
    mode = driver.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_GLOBAL

    def empty_capture():
        driver.cuStreamBeginCapture(s, mode)
        err, graph = driver.cuStreamEndCapture(s)
        driver.cuGraphDestroy(graph)
    return statistics.median(inst), median_host_us(empty_capture, repeats)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=300)
    ap.add_argument("--profile-top", type=int, default=30, help="functions listed by cProfile (0: no profile)")
    args = ap.parse_args()
    torch, code = gpu_and_torch("the sets are timed beside PyTorch's")
    if torch is None:
        sys.exit(code)
    weights = serving_weights()
    tw = {k: to_library(torch, v, "bfloat16") for k, v in weights.items()}
    w = {k: to_library(tp, v, "bfloat16") for k, v in weights.items()}
    torch_captures = {"torch.cuda.graph": torch_capture_graph_ctx,
                      "PyTorch capture_begin/end": torch_capture_raw(torch, torch.cuda.Stream())}
    for b in SERVING_BATCHES:                         # kernels, plans, cuBLAS handles
        tp.linear(tp.linear(w["x"][:b], w["w1"], w["b1"], activation="gelu"), w["w2"], w["b2"]) + w["x"][:b]
    tp_set(w, None, {})
    for capture in torch_captures.values():
        torch_set(torch, tw, capture)
    sets = {"tensorplay, foreign on": [], "tensorplay, foreign off": [],
            "torch.cuda.graph": [], "PyTorch capture_begin/end": []}
    phases = {True: {}, False: {}}
    kept = None
    for _ in range(args.rounds):
        for on in (True, False):
            ms, graphs = tp_set(w, on, phases[on])
            sets[f"tensorplay, foreign {'on' if on else 'off'}"].append(ms)
            if not on:
                kept = graphs
            del graphs
        for name, capture in torch_captures.items():
            ms, graphs = torch_set(torch, tw, capture)
            sets[name].append(ms)
            del graphs
        gc.collect()
    print("segments made (device allocations) during one set: "
          f"tensorplay {segments_made(tp, lambda: tp_set(w, True, {}))}, "
          f"torch.cuda.graph {segments_made(torch, lambda: torch_set(torch, tw, torch_captures['torch.cuda.graph']))}",
          flush=True)
    torch_ms = statistics.median(sets["torch.cuda.graph"])
    for name, v in sets.items():
        print(f"67 graphs, {name:28} {statistics.median(v):7.2f} ms  ({statistics.median(v) / torch_ms:.3f} "
              f"of torch.cuda.graph; rounds {' '.join(f'{t:.2f}' for t in v)})", flush=True)
    print("per graph, median / mean / max host us (a mean far above the median: a few graphs pay most):")
    for on in (True, False):
        print(f"  foreign {'on ' if on else 'off'}: " + ", ".join(
            f"{k} {statistics.median(v):.1f} / {statistics.fmean(v):.1f} / {max(v):.0f}"
            for k, v in phases[on].items()), flush=True)
    for on in (True, False):
        ms, gc_ms, counts = gc_share(w, on)
        print(f"collector during one set, foreign {'on' if on else 'off'}: {gc_ms:.2f} of {ms:.2f} ms, "
              f"collections by generation {counts}", flush=True)
    if args.profile_top:
        print("cProfile of one set, foreign on (own time; the profiler slows Python calls, not the driver's):")
        print(profile_set(w, True, args.profile_top), flush=True)
    inst, empty = driver_share(kept, args.repeats)
    print(f"driver: cuGraphInstantiate of a serving graph {inst:.1f} us (median over 67); "
          f"an empty capture begun and ended {empty:.1f} us; cuMemAlloc / cuMemFree "
          + ", ".join("{} MiB {:.1f} / {:.1f} us".format(m, *mem_alloc_us(m << 20, 30)) for m in (2, 20)),
          flush=True)
    del kept
    xb = w["x"][:256]
    h = tp.linear(xb, w["w1"], w["b1"], activation="gelu")
    y = tp.linear(h, w["w2"], w["b2"])
    n = args.repeats
    print("eager at batch 256, host us: "
          f"slice {median_host_us(lambda: w['x'][:256], n):.1f}, "
          f"linear 1 {median_host_us(lambda: tp.linear(xb, w['w1'], w['b1'], activation='gelu'), n):.1f}, "
          f"linear 2 {median_host_us(lambda: tp.linear(h, w['w2'], w['b2']), n):.1f}, "
          f"add {median_host_us(lambda: y + xb, n):.1f}", flush=True)
    tp.cuda.synchronize()
    from tensorplay._frames import call_site
    from tensorplay._graph import foreign
    from tensorplay._graph.collectives import note_capture
    g = tp.cuda.CUDAGraph()
    s = tp.cuda.Stream()
    cur = tp.cuda.current_stream()
    print("pieces, host us: "
          f"CUDAGraph() {median_host_us(tp.cuda.CUDAGraph, n):.2f}, "
          f"call_site() {median_host_us(call_site, n):.2f}, "
          f"current_stream() {median_host_us(tp.cuda.current_stream, n):.2f}, "
          f"set_stream {median_host_us(lambda: tp.cuda.set_stream(cur), n):.2f}, "
          f"begin_session {median_host_us(lambda: foreign.begin_session(0, None), n):.2f}, "
          f"note_capture {median_host_us(lambda: note_capture(g), n):.2f}, "
          f"empty_cuda 4 MiB {median_host_us(lambda: tp.empty(1 << 20, device='cuda'), n):.2f}", flush=True)
    del s
    print("torch.cuda.graph's entry, host us: "
          f"gc.collect() {median_host_us(gc.collect, 30):.1f}, "
          f"torch.cuda.synchronize() {median_host_us(torch.cuda.synchronize, n):.1f}, "
          f"torch.cuda.empty_cache() {median_host_us(torch.cuda.empty_cache, n):.1f}", flush=True)


if __name__ == "__main__":
    main()
