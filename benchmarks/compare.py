# SPDX-License-Identifier: Apache-2.0
"""tensorplay side by side with PyTorch, CuPy, cuda.core and the raw driver.

Run on the GPU machine, from benchmarks/ (not the repository root):

    python compare.py [--quick] [--only memory,replay,...] [--out results]

Prints a table (medians over repeated measurements, after warm-up), writes
``<out>.json`` and, where matplotlib is installed, ``<out>.png``. Host time
per call is measured back to back with the launch queue kept short; latency
is one call between two synchronizations. The memory section (run first,
before the others allocate) sets reserved device memory of tensorplay and
PyTorch side by side on the same work, each over its own baseline.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import math
import os
import random
import statistics
import sys
import tempfile
import threading
import time

import numpy as np

import tensorplay as tp

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = []


def record(section, case, library, host_us=None, latency_us=None, extra=None, error=None,
           reserved_mib=None, total_mib=None, peak_mib=None, final_mib=None):
    """Append one result; the ``*_mib`` figures are the memory section's (see MEMORY_LEGEND)."""
    RESULTS.append({"section": section, "case": case, "library": library, "host_us": host_us,
                    "latency_us": latency_us, "extra": extra, "error": error,
                    "reserved_mib": reserved_mib, "total_mib": total_mib, "peak_mib": peak_mib,
                    "final_mib": final_mib})


def host_per_call(fn, calls, repeats, sync):
    """Median host time of one call, timed over ``calls`` back-to-back calls
    after a synchronize (the launch queue stays short)."""
    return interleaved_host([("_", lambda k: [fn() for _ in range(k)], sync)], calls, repeats)["_"]


def interleaved_host(contenders, calls, rounds):
    """Median host time per call of each contender, ``(name, batch, sync)``
    with ``batch(k)`` making k calls. Rounds alternate between contenders so
    that drift of the machine affects all of them alike."""
    per = {name: [] for name, _, _ in contenders}
    for _ in range(rounds):
        for name, batch, sync in contenders:
            sync()
            t0 = time.perf_counter()
            batch(calls)
            per[name].append((time.perf_counter() - t0) / calls * 1e6)
    for _, _, sync in contenders:
        sync()
    return {name: statistics.median(v) for name, v in per.items()}


def latency(fn, repeats, sync):
    per = []
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        per.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(per)


def guarded(section, case, library):
    """Decorator: run a measurement, recording an error instead of stopping the run."""
    def wrap(fn):
        try:
            fn()
        except Exception as exc:    # a peer missing or failing is reported, not fatal
            record(section, case, library, error=f"{type(exc).__name__}: {exc}"[:200])
        return fn
    return wrap


def build_cloop():
    """Compile benchmarks/_cloop.pyx against cuda.bindings' cydriver."""
    import cuda.bindings
    import cuda.pathfinder
    from Cython.Build import cythonize
    from setuptools import Distribution, Extension
    inc = cuda.pathfinder.find_nvidia_header_directory("cudart")
    root = os.path.dirname(os.path.dirname(os.path.dirname(cuda.bindings.__file__)))
    build = tempfile.mkdtemp(prefix="tp_cloop_")
    ext = Extension("_cloop", [os.path.join(HERE, "_cloop.pyx")], include_dirs=[inc], language="c++")
    exts = cythonize([ext], include_path=[root], build_dir=build, quiet=True,
                     compiler_directives={"language_level": 3})
    dist = Distribution({"ext_modules": exts})
    cmd = dist.get_command_obj("build_ext")
    cmd.build_lib = build
    cmd.build_temp = build
    cmd.ensure_finalized()
    cmd.run()
    sys.path.insert(0, build)
    import _cloop
    return _cloop


# ---------------------------------------------------------------- 1. replay overhead

def _loop(fn):
    def batch(k):
        for _ in range(k):
            fn()
    return batch


def replay_rows(sizes, calls, repeats, torch, cp):
    """Host time per replay of an n-node graph: every contender is built first,
    then timed in alternating rounds. The C loop launches the same executable
    as tensorplay, on the same streams."""
    sync = tp.cuda.synchronize
    try:
        cloop = build_cloop()
    except Exception as exc:
        cloop = None
        record("replay", "all", "C loop cuGraphLaunch", error=f"build failed: {exc}"[:200])
    for n in sizes:
        case = f"{n} nodes"
        k = max(5, min(calls, 2000 // n))        # launches per round: the queue stays short
        contenders, latencies = [], {}
        x = tp.zeros(1, device="cuda")
        x.add_(1)
        g = tp.cuda.CUDAGraph()
        with tp.cuda.graph(g):
            for _ in range(n):
                x.add_(1)
        s = tp.cuda.Stream()
        contenders.append(("tensorplay replay()", _loop(g.replay), sync))
        contenders.append(("tensorplay replay(stream)", _loop(lambda: g.replay(s)), sync))
        latencies["tensorplay replay()"] = latency(g.replay, repeats, sync)
        latencies["tensorplay replay(stream)"] = latency(lambda: g.replay(s), repeats, sync)
        if cloop is not None:
            handle, sh = g.exec_handle, s.handle
            cur = tp.cuda.current_stream().handle
            contenders.append(("C loop cuGraphLaunch, current stream",
                               lambda k: cloop.graph_launch_loop(handle, cur, k), sync))
            contenders.append(("C loop cuGraphLaunch, same stream as replay(stream)",
                               lambda k: cloop.graph_launch_loop(handle, sh, k), sync))
            once = cloop.graph_launch_once
            contenders.append(("bare Cython def, nogil cuGraphLaunch, same stream",
                               _loop(lambda: once(handle, sh)), sync))

        @guarded("replay", case, "PyTorch CUDAGraph.replay()")
        def _torch():
            tx = torch.zeros(1, device="cuda")
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                tx.add_(1)
            torch.cuda.current_stream().wait_stream(side)
            tg = torch.cuda.CUDAGraph()
            with torch.cuda.graph(tg):
                for _ in range(n):
                    tx.add_(1)
            contenders.append(("PyTorch CUDAGraph.replay()", _loop(tg.replay), torch.cuda.synchronize))
            latencies["PyTorch CUDAGraph.replay()"] = latency(tg.replay, repeats, torch.cuda.synchronize)

        @guarded("replay", case, "CuPy Graph.launch()")
        def _cupy():
            cx = cp.zeros(1, dtype=cp.float32)
            cx += 1
            st = cp.cuda.Stream(non_blocking=True)
            with st:
                st.begin_capture()
                for _ in range(n):
                    cx += 1
                cg = st.end_capture()
            cg.upload(st) if hasattr(cg, "upload") else None
            csync = cp.cuda.Device().synchronize
            contenders.append(("CuPy Graph.launch()", _loop(lambda: cg.launch(st)), csync))
            latencies["CuPy Graph.launch()"] = latency(lambda: cg.launch(st), repeats, csync)

        @guarded("replay", case, "cuda.core Graph.launch()")
        def _core():
            try:
                from cuda.core import Device, LaunchConfig, Program, ProgramOptions, launch
            except ImportError:
                from cuda.core.experimental import Device, LaunchConfig, Program, ProgramOptions, launch
            dev = Device(0)
            dev.set_current()
            prog = Program('extern "C" __global__ void inc(float* x) { x[0] += 1.0f; }', code_type="c++",
                           options=ProgramOptions(arch=f"sm_{dev.arch}"))
            ker = prog.compile("cubin").get_kernel("inc")
            st = dev.create_stream()
            buf = tp.zeros(1, device="cuda")
            gb = st.create_graph_builder()
            gb.begin_building()
            for _ in range(n):
                launch(gb, LaunchConfig(grid=1, block=1), ker, np.uintp(buf.data_ptr()))
            graph = gb.end_building().complete()
            graph.upload(st)
            contenders.append(("cuda.core Graph.launch()", _loop(lambda: graph.launch(st)), st.sync))
            latencies["cuda.core Graph.launch()"] = latency(lambda: graph.launch(st), repeats, st.sync)

        host = interleaved_host(contenders, k, repeats)
        for name, _, _ in contenders:
            record("replay", case, name, host[name], latencies.get(name))


# ---------------------------------------------------------------- 2. staging

def staging_rows(counts, calls, repeats, torch):
    sync = tp.cuda.synchronize
    for n in counts:
        case = f"{n} inputs x 4 KiB"
        k = max(5, min(calls, 4000 // n))
        statics = [tp.zeros(1024, device="cuda") for _ in range(n)]
        inputs = [tp.ones(1024, device="cuda") for _ in range(n)]
        out = tp.zeros(1024, device="cuda")
        out.add_(statics[0])
        g = tp.cuda.CUDAGraph()
        with tp.cuda.graph(g):
            for st in statics:
                out.add_(st)
        g.stage_and_launch(statics, inputs)

        def stage():
            g.stage_and_launch(statics, inputs)

        def loop():
            for a, b in zip(statics, inputs):
                a.copy_(b)
            g.replay()
        contenders = [("tensorplay replay() (no inputs)", _loop(g.replay), sync),
                      ("tensorplay stage_and_launch", _loop(stage), sync),
                      ("tensorplay copy_ loop + replay", _loop(loop), sync)]
        latencies = {"tensorplay stage_and_launch": latency(stage, repeats, sync)}

        @guarded("staging", case, "PyTorch")
        def _torch():
            ts = [torch.zeros(1024, device="cuda") for _ in range(n)]
            ti = [torch.ones(1024, device="cuda") for _ in range(n)]
            to = torch.zeros(1024, device="cuda")
            tg = torch.cuda.CUDAGraph()
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                to.add_(ts[0])
            torch.cuda.current_stream().wait_stream(side)
            with torch.cuda.graph(tg):
                for a in ts:
                    to.add_(a)

            def tloop():
                for a, b in zip(ts, ti):
                    a.copy_(b)
                tg.replay()

            def tforeach():
                torch._foreach_copy_(ts, ti)
                tg.replay()
            tsync = torch.cuda.synchronize
            contenders.append(("PyTorch copy_ loop + replay", _loop(tloop), tsync))
            contenders.append(("PyTorch _foreach_copy_ + replay", _loop(tforeach), tsync))
            latencies["PyTorch _foreach_copy_ + replay"] = latency(tforeach, repeats, tsync)

        host = interleaved_host(contenders, k, repeats)
        for name, _, _ in contenders:
            record("staging", case, name, host[name], latencies.get(name))


# ---------------------------------------------------------------- 3. while loop

def while_rows(iterations, repeats):
    sync = tp.cuda.synchronize
    for n in iterations:
        case = f"{n} iterations"
        c = tp.zeros(1, dtype=tp.int32, device="cuda")
        lim = tp.full((1,), n, dtype=tp.int32, device="cuda")
        p = tp.zeros(1, dtype=tp.bool, device="cuda")
        c.add_(1)
        tp.lt(c, lim, out=p)
        g = tp.cuda.CUDAGraph()
        with tp.cuda.graph(g):
            c.zero_()
            tp.lt(c, lim, out=p)
            g.begin_capture_to_while_node(p)
            c.add_(1)
            tp.lt(c, lim, out=p)
            g.end_capture_to_conditional_node()
        g.replay()
        assert c.item() == n
        record("while", case, "tensorplay WHILE node (one launch)", latency_us=latency(g.replay, repeats, sync))

        def host_loop():
            c.zero_()
            while True:
                c.add_(1)
                tp.lt(c, lim, out=p)
                if not p.item():
                    break
        record("while", case, "host loop reading the predicate", latency_us=latency(host_loop, max(3, repeats // 4),
                                                                              sync))
        u = tp.cuda.CUDAGraph()
        with tp.cuda.graph(u):
            c.zero_()
            for _ in range(n):
                c.add_(1)
                tp.lt(c, lim, out=p)
        record("while", case, "unrolled static graph", latency_us=latency(u.replay, repeats, sync))


# ---------------------------------------------------------------- 4. threads

def thread_rows(thread_counts, launches):
    """Launches per second of N threads, each replaying its own 1-node graph
    on its own stream; the same with the C loop (GIL released for the whole
    loop) shows what the driver itself allows."""
    try:
        cloop = build_cloop()
    except Exception:
        cloop = None
    for nt in thread_counts:
        graphs, streams = [], []
        for _ in range(nt):
            x = tp.zeros(1, device="cuda")
            x.add_(1)
            g = tp.cuda.CUDAGraph()
            with tp.cuda.graph(g):
                x.add_(1)
            graphs.append((g, x))
            streams.append(tp.cuda.Stream())
        tp.cuda.synchronize()

        def py_work(k):
            g, s = graphs[k][0], streams[k]
            for _ in range(launches):
                g.replay(s)

        def c_work(k):
            cloop.graph_launch_loop(graphs[k][0].exec_handle, streams[k].handle, launches)

        for name, work in (("tensorplay replay(stream)", py_work), ("C loop cuGraphLaunch", c_work)):
            if work is c_work and cloop is None:
                continue
            barrier = threading.Barrier(nt + 1)

            def run(k, work=work, barrier=barrier):
                barrier.wait()
                work(k)
            threads = [threading.Thread(target=run, args=(k,)) for k in range(nt)]
            for t in threads:
                t.start()
            barrier.wait()
            t0 = time.perf_counter()
            for t in threads:
                t.join()
            wall = time.perf_counter() - t0
            tp.cuda.synchronize()
            record("threads", f"{nt} threads", name, extra=nt * launches / wall)


# ---------------------------------------------------------------- 5. capture

def capture_rows(sizes, repeats, torch):
    for n in sizes:
        case = f"{n} nodes"
        x = tp.zeros(1, device="cuda")
        x.add_(1)

        def cap():
            g = tp.cuda.CUDAGraph()
            with tp.cuda.graph(g):
                for _ in range(n):
                    x.add_(1)
            return g
        per = []
        for _ in range(repeats):
            tp.cuda.synchronize()
            t0 = time.perf_counter()
            g = cap()
            per.append((time.perf_counter() - t0) * 1e6)
            g.reset()
        record("capture", case, "tensorplay capture+instantiate", statistics.median(per))

        @guarded("capture", case, "PyTorch capture+instantiate")
        def _torch():
            tx = torch.zeros(1, device="cuda")
            tx.add_(1)
            per = []
            for _ in range(repeats):
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                tg = torch.cuda.CUDAGraph()
                with torch.cuda.graph(tg):
                    for _ in range(n):
                        tx.add_(1)
                per.append((time.perf_counter() - t0) * 1e6)
                del tg
            record("capture", case, "PyTorch capture+instantiate", statistics.median(per))


# ---------------------------------------------------------------- 6. eager ops

def eager_rows(calls, repeats, torch, cp):
    x = tp.ones(256, device="cuda")
    x.add_(1)
    contenders = [("tensorplay", _loop(lambda: x.add_(1)), tp.cuda.synchronize)]

    @guarded("eager", "small add_", "PyTorch")
    def _torch():
        tx = torch.ones(256, device="cuda")
        contenders.append(("PyTorch", _loop(lambda: tx.add_(1)), torch.cuda.synchronize))

    @guarded("eager", "small add_", "CuPy")
    def _cupy():
        cx = cp.ones(256, dtype=cp.float32)

        def add():
            cx.__iadd__(1)
        add()
        contenders.append(("CuPy", _loop(add), cp.cuda.Device().synchronize))

    host = interleaved_host(contenders, calls, repeats)
    for name, _, _ in contenders:
        record("eager", "small add_", name, host[name])


# ---------------------------------------------------------------- 7. memory (run first)

MIB = 1 << 20
MEMORY_FIGURES = (("reserved_mib", "growth"), ("total_mib", "total growth"), ("peak_mib", "peak"),
                  ("final_mib", "final"))
MEMORY_LEGEND = """\
growth: memory_reserved() after the work minus just before it (eager loop: after its first iteration,
  so the input's and the first output's segments are excluded; graphs: the inputs allocated and the
  cache emptied, so what the captures reserve); total growth: over the baseline (gc.collect(),
  empty_cache(), synchronize()); peak: max_memory_reserved() after reset_peak_memory_stats() at the
  baseline, minus the baseline; final: at the end of the sequence, its live tensors still held."""


def mib(nbytes):
    return nbytes / MIB


def size_label(nbytes):
    return f"{nbytes // MIB} MiB" if nbytes >= MIB else f"{nbytes >> 10} KiB"


def settle(lib):
    """Free what nothing references, empty the library's cache and return its
    reserved bytes: the baseline a memory figure is measured from."""
    gc.collect()
    lib.cuda.synchronize()
    lib.cuda.empty_cache()
    lib.cuda.synchronize()
    return lib.cuda.memory_reserved()


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


# ---------------------------------------------------------------- output

def print_table():
    """The timing table, then the memory table."""
    timed = [r for r in RESULTS if r["section"] != "memory"]
    if timed:
        print_timing_table(timed)
    print_memory_table([r for r in RESULTS if r["section"] == "memory"])


def print_timing_table(rows):
    print(f"{'section':<9} {'case':<20} {'library':<52} {'host us':>10} {'latency us':>11}  note")
    for r in rows:
        h = f"{r['host_us']:.2f}" if r["host_us"] is not None else "-"
        lat = f"{r['latency_us']:.1f}" if r["latency_us"] is not None else "-"
        note = r["error"] or (f"{r['extra']:.0f} launches/s" if r["extra"] else "")
        print(f"{r['section']:<9} {r['case']:<20} {r['library']:<52} {h:>10} {lat:>11}  {note}")


def _mib_cell(value):
    return f"{value:.2f}" if value is not None else "-"


def print_memory_table(rows):
    """One line per case and figure: tensorplay MiB, PyTorch MiB, their
    difference and ratio; a library's error goes in the case's first note."""
    if not rows:
        return
    by_case = {}
    for r in rows:
        by_case.setdefault(r["case"], {})[r["library"]] = r
    print()
    print(f"{'memory: reserved MiB':<76} {'tensorplay':>10} {'PyTorch':>10} {'tp - PT':>9} {'tp / PT':>8}  note")
    for case, libs in by_case.items():
        tpr, ptr = libs.get("tensorplay", {}), libs.get("PyTorch", {})
        figures = [(key, label) for key, label in MEMORY_FIGURES
                   if tpr.get(key) is not None or ptr.get(key) is not None] or MEMORY_FIGURES[:1]
        note = "; ".join(f"{name}: {r['error']}" for name, r in libs.items() if r.get("error"))
        for key, label in figures:
            a, b = tpr.get(key), ptr.get(key)
            diff = f"{a - b:+.2f}" if a is not None and b is not None else "-"
            ratio = f"{a / b:.2f}" if a is not None and b is not None and b > 0 else "-"
            print(f"{case + ': ' + label:<76} {_mib_cell(a):>10} {_mib_cell(b):>10} {diff:>9} {ratio:>8}  {note}")
            note = ""
    print(MEMORY_LEGEND)


def write_chart(path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no chart")
        return
    rows = [r for r in RESULTS if r["section"] in ("replay", "staging") and r["host_us"] is not None]
    if not rows:
        print("no replay or staging rows: no chart")
        return
    cases = list(dict.fromkeys((r["section"], r["case"]) for r in rows))
    libs = list(dict.fromkeys(r["library"] for r in rows))
    fig, ax = plt.subplots(figsize=(max(8, len(cases) * 1.4), 5))
    width = 0.8 / max(len(libs), 1)
    for j, lib in enumerate(libs):
        vals = [next((r["host_us"] for r in rows if (r["section"], r["case"]) == c and r["library"] == lib), 0)
                for c in cases]
        ax.bar([i + j * width for i in range(len(cases))], vals, width, label=lib)
    ax.set_xticks([i + 0.4 for i in range(len(cases))])
    ax.set_xticklabels([f"{s}\n{c}" for s, c in cases], fontsize=7)
    ax.set_yscale("log")
    ax.set_ylabel("host time per call (us, log)")
    ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


SECTIONS = ("memory", "replay", "staging", "while", "threads", "capture", "eager")


def parse_sections(only, ap):
    """The sections ``--only`` names (comma-separated), in SECTIONS' order; all when not given."""
    if only is None:
        return list(SECTIONS)
    names = [s.strip() for s in only.split(",") if s.strip()]
    unknown = [s for s in names if s not in SECTIONS]
    if unknown or not names:
        ap.error(f"--only: unknown section(s) {', '.join(unknown) or '(none given)'}; "
                 f"choose from {', '.join(SECTIONS)}")
    return [s for s in SECTIONS if s in names]


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="fewer sizes and repetitions")
    ap.add_argument("--only", metavar="SECTIONS",
                    help=f"comma-separated sections to run, of {','.join(SECTIONS)} (default: all, memory first)")
    ap.add_argument("--out", default="compare_results")
    args = ap.parse_args()
    sections = parse_sections(args.only, ap)
    if not tp.cuda.is_available():
        print(f"compare.py needs a CUDA GPU ({tp.cuda.unavailable_reason()})")
        return 0
    try:
        import torch
    except ImportError:
        torch = None
    try:
        import cupy as cp
    except ImportError:
        cp = None
    quick = args.quick
    repeats = 7 if quick else 31
    calls = 100
    t0 = time.perf_counter()
    if "memory" in sections:        # first: before the other sections allocate
        memory_rows(quick, torch)
    if "replay" in sections:
        replay_rows([1, 10, 100] if quick else [1, 10, 100, 1000], calls, repeats, torch, cp)
    if "staging" in sections:
        staging_rows([1, 8, 32, 128], calls, repeats, torch)
    if "while" in sections:
        while_rows([10, 1000], repeats)
    if "threads" in sections:
        thread_rows([1, 2, 4, 8], 2000 if quick else 20000)
    if "capture" in sections:
        capture_rows([10, 100] if quick else [10, 100, 1000], 3 if quick else 7, torch)
    if "eager" in sections:
        eager_rows(calls, repeats, torch, cp)
    elapsed = time.perf_counter() - t0
    meta = {"date": datetime.date.today().isoformat(), "gpu": tp.cuda.get_device_name(0),
            "driver": ".".join(map(str, tp.cuda.driver_version())), "tensorplay": tp.__version__,
            "torch": getattr(torch, "__version__", None), "cupy": getattr(cp, "__version__", None),
            "python": sys.version.split()[0], "elapsed_s": round(elapsed, 1), "quick": quick,
            "sections": sections}
    print_table()
    print(json.dumps(meta))
    with open(args.out + ".json", "w") as f:
        json.dump({"meta": meta, "results": RESULTS}, f, indent=1)
    write_chart(args.out + ".png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
