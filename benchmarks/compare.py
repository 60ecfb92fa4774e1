# SPDX-License-Identifier: Apache-2.0
"""tensorplay side by side with PyTorch, CuPy, cuda.core and the raw driver.

Run on the GPU machine, from benchmarks/ (not the repository root):

    python compare.py [--quick] [--out results]

Prints a table (medians over repeated measurements, after warm-up), writes
``<out>.json`` and, where matplotlib is installed, ``<out>.png``. Host time
per call is measured back to back with the launch queue kept short; latency
is one call between two synchronizations.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import tempfile
import threading
import time

import numpy as np

import tensorplay as tp

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = []


def record(section, case, library, host_us=None, latency_us=None, extra=None, error=None):
    RESULTS.append({"section": section, "case": case, "library": library, "host_us": host_us,
                    "latency_us": latency_us, "extra": extra, "error": error})


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


# ---------------------------------------------------------------- output

def print_table():
    print(f"{'section':<9} {'case':<20} {'library':<52} {'host us':>10} {'latency us':>11}  note")
    for r in RESULTS:
        h = f"{r['host_us']:.2f}" if r["host_us"] is not None else "-"
        lat = f"{r['latency_us']:.1f}" if r["latency_us"] is not None else "-"
        note = r["error"] or (f"{r['extra']:.0f} launches/s" if r["extra"] else "")
        print(f"{r['section']:<9} {r['case']:<20} {r['library']:<52} {h:>10} {lat:>11}  {note}")


def write_chart(path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no chart")
        return
    rows = [r for r in RESULTS if r["section"] in ("replay", "staging") and r["host_us"] is not None]
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


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="fewer sizes and repetitions")
    ap.add_argument("--out", default="compare_results")
    args = ap.parse_args()
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
    replay_rows([1, 10, 100] if quick else [1, 10, 100, 1000], calls, repeats, torch, cp)
    staging_rows([1, 8, 32, 128], calls, repeats, torch)
    while_rows([10, 1000], repeats)
    thread_rows([1, 2, 4, 8], 2000 if quick else 20000)
    capture_rows([10, 100] if quick else [10, 100, 1000], 3 if quick else 7, torch)
    eager_rows(calls, repeats, torch, cp)
    elapsed = time.perf_counter() - t0
    meta = {"date": datetime.date.today().isoformat(), "gpu": tp.cuda.get_device_name(0),
            "driver": ".".join(map(str, tp.cuda.driver_version())), "tensorplay": tp.__version__,
            "torch": getattr(torch, "__version__", None), "cupy": getattr(cp, "__version__", None),
            "python": sys.version.split()[0], "elapsed_s": round(elapsed, 1), "quick": quick}
    print_table()
    print(json.dumps(meta))
    with open(args.out + ".json", "w") as f:
        json.dump({"meta": meta, "results": RESULTS}, f, indent=1)
    write_chart(args.out + ".png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
