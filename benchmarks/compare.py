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

The work section times the GPU side instead: CUDA events around back-to-back
calls (matmuls on cuBLASLt, linear with fused epilogues, bandwidth-bound
kernels, a small captured graph), as TFLOP/s or GB/s and as a ratio to
PyTorch, each result checked against PyTorch's first. The serving section
captures one graph of an MLP step per batch size (1 to 512) into one shared
pool, largest first, as LLM servers do: capture time, reserved memory
(second, after memory, so that no other section's cached blocks are in its
baselines) and replay GPU time at batch 1 and 512. The serving_set section
(third) sets tp.cuda.GraphSet against torch.cuda.graph captures made as vLLM
makes them (static inputs, gc frozen, weak references to the outputs), on
vLLM's 51 sizes up to 512 (19 up to 128 with --quick) of a bf16 MLP step and
a transformer decode step: capture wall time, device memory, replays checked
against eager, replay GPU time, padding waste, and sleep/wake of the set and
of 1 GiB and 8 GiB GraphPools (memory given back, sleep and wake ms, the
first call after wake). The random section times
rand, randn and exponential_ of 64 Mi float32 on the GPU against PyTorch's, and the host
time per replay of a graph with a random op in it. The recapture section
times a re-capture of 100 and 1000 small nodes into a graph that has an
executable (capture_end updates it, cuGraphExecUpdate) against reset() then
capture + instantiate: host time per re-capture, median.

The decode section (last) runs examples/decode_loop.py's measurements: a
GPT-2-like transformer (models small and gpt2-small, batch 1 and 8, random
bf16 weights) generating until every row emits its end token, four ways:
PyTorch eager, a torch.cuda.graph step replayed from a host loop that reads
the end flag every step or every 8 steps, and tensorplay's one graph with
the step's PyTorch code in a WHILE node. Per method: useful tokens/s, GPU
busy share, host CPU us per token (the host us column), wall time of a
generation (latency), steps; then the GPU time per step of the WHILE node's
iterations against an unrolled tensorplay graph, and what capturing a
transformers GPT-2 decode step does. max_len 128 and 3 generations per
method with --quick, 256 and 10 without.
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
           reserved_mib=None, total_mib=None, peak_mib=None, final_mib=None,
           gpu_us=None, rate=None, unit=None, note=None, capture_ms=None):
    """Append one result; the ``*_mib`` figures are the memory section's (see
    MEMORY_LEGEND, and serving's reserved growth); ``gpu_us``, ``rate``/``unit``
    and ``capture_ms`` the work and serving sections' (see WORK_LEGEND).
    ``speed_vs_torch`` is set later on tensorplay's rows (set_speed)."""
    RESULTS.append({"section": section, "case": case, "library": library, "host_us": host_us,
                    "latency_us": latency_us, "extra": extra, "error": error,
                    "reserved_mib": reserved_mib, "total_mib": total_mib, "peak_mib": peak_mib,
                    "final_mib": final_mib, "gpu_us": gpu_us, "rate": rate, "unit": unit, "note": note,
                    "capture_ms": capture_ms, "speed_vs_torch": None})


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

def torch_graph(torch, build):
    """(a torch.cuda.CUDAGraph of ``build()``, what the captured call
    returned), warmed up first on a side stream as PyTorch's docs ask."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        build()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = build()
    return g, out


def cuda_core_graph(n, ptr, stream_handle=None):
    """(cuda.core graph of ``n`` one-thread kernels each adding 1 to the float
    at ``ptr``, uploaded, the cuda.core stream it launches on): that stream
    wraps ``stream_handle``, or is a new one."""
    try:
        from cuda.core import Device, LaunchConfig, Program, ProgramOptions, Stream, launch
    except ImportError:
        from cuda.core.experimental import Device, LaunchConfig, Program, ProgramOptions, Stream, launch
    dev = Device(tp.cuda.current_device())
    dev.set_current()
    prog = Program('extern "C" __global__ void inc(float* x) { x[0] += 1.0f; }', code_type="c++",
                   options=ProgramOptions(arch=f"sm_{dev.arch}"))
    ker = prog.compile("cubin").get_kernel("inc")
    st = dev.create_stream() if stream_handle is None else Stream.from_handle(stream_handle)
    gb = st.create_graph_builder()
    gb.begin_building()
    for _ in range(n):
        launch(gb, LaunchConfig(grid=1, block=1), ker, np.uintp(ptr))
    graph = gb.end_building().complete()
    graph.upload(st)
    return graph, st


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
            buf = tp.zeros(1, device="cuda")
            graph, st = cuda_core_graph(n, buf.data_ptr())
            # the graph writes buf through a raw address: the lambdas keep it alive
            contenders.append(("cuda.core Graph.launch()", _loop(lambda buf=buf: graph.launch(st)), st.sync))
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

        others = [[tp.ones(1024, device="cuda") for _ in range(n)] for _ in range(2)]
        turn = [0]

        def stage_fresh():                # other tensors each call: the copy node's table is set
            turn[0] ^= 1
            g.stage_and_launch(statics, others[turn[0]])

        def loop():
            for a, b in zip(statics, inputs):
                a.copy_(b)
            g.replay()
        contenders = [("tensorplay replay() (no inputs)", _loop(g.replay), sync),
                      ("tensorplay stage_and_launch", _loop(stage), sync),
                      ("tensorplay stage_and_launch (other inputs each call)", _loop(stage_fresh), sync),
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


# ---------------------------------------------------------------- 2b. rebinding

REBIND_LEGEND = """\
rebind: a graph of y_k = x_k * 2 + 1 over n inputs of one size; host us: median host time per call
  (back-to-back calls, launch queue short); latency us: median of one call timed with CUDA events on
  the current stream (recorded before and after the call, after a synchronize: inputs in, graph done).
  rebind_and_launch rebinds the inputs only (the outputs stay the graph's); 'other tensors' alternates
  between two input sets. Each row is checked once (the first and last outputs against NumPy) before it
  is timed; a wrong result is reported as an error instead."""


def event_latency(lib, fn, repeats):
    """Median time of one ``fn()`` between two CUDA events on the current
    stream, recorded after a synchronize: the GPU waits for the host's
    launch too, so this is end to end (inputs in, graph done), in µs."""
    per = []
    start, end = lib.cuda.Event(enable_timing=True), lib.cuda.Event(enable_timing=True)
    for _ in range(repeats):
        lib.cuda.synchronize()
        start.record()
        fn()
        end.record()
        end.synchronize()
        per.append(start.elapsed_time(end) * 1e3)
    return statistics.median(per)


def _check_rebind(outputs, inputs, to_numpy, what):
    """The first and last outputs equal NumPy's x * 2 + 1 of their inputs (exact in float32)."""
    for k in sorted({0, len(outputs) - 1}):
        want = to_numpy(inputs[k]) * np.float32(2) + np.float32(1)
        got = to_numpy(outputs[k])
        if not np.array_equal(got, want):
            bad = int(np.count_nonzero(got != want))
            raise AssertionError(f"{what}: output {k} differs from NumPy's in {bad} of {got.size} elements")


def _rebind_inputs(lib, n, elems, sign, device="cuda"):
    """n distinct float32 inputs: sign * arange(elems) + k (values differ per tensor and per set)."""
    base = lib.arange(elems, dtype=lib.float32, device=device)
    return [base * float(sign) + float(k + 1) for k in range(n)]


def rebind_rows(counts, sizes, calls, repeats, torch):
    """Host time and latency of feeding n inputs to a graph: bare replay, rebind_and_launch (same
    tensors, other tensors each call), stage_and_launch, PyTorch _foreach_copy_ + replay. Each case
    frees its tensors and graphs (and both libraries' caches) before the next: 32 x 64 MiB is 2 GiB a set."""
    sync = tp.cuda.synchronize
    has_rebind = hasattr(tp.cuda.CUDAGraph, "rebind_and_launch")
    rebind_names = ("tensorplay rebind_and_launch (same tensors)",
                    "tensorplay rebind_and_launch (other tensors each call)")
    for nbytes in sizes:
        for n in counts:
            case = f"{n} inputs x {size_label(nbytes)}"
            _rebind_case(case, n, nbytes // 4, calls, repeats, torch, sync, has_rebind, rebind_names)
            gc.collect()
            settle(tp)
            if torch is not None:
                settle(torch)


def _rebind_case(case, n, elems, calls, repeats, torch, sync, has_rebind, rebind_names):
    big = elems * 4 >= MIB
    k = max(3, min(calls, 20 // n)) if big else max(5, min(calls, 4000 // n))
    reps = max(5, repeats // 3) if big else repeats
    to_np = lambda t: t.numpy()
    statics = [tp.zeros(elems, device="cuda") for _ in range(n)]
    sets = [_rebind_inputs(tp, n, elems, 1), _rebind_inputs(tp, n, elems, -0.5)]
    (statics[0] * 2.0 + 1.0)                     # compile the kernels outside the capture
    sync()
    g = tp.cuda.CUDAGraph()
    with tp.cuda.graph(g):
        outs = [x * 2.0 + 1.0 for x in statics]
    inputs = sets[0]
    # build the staging executable outside the timing; the static inputs then hold the other set,
    # so that a rebinding that does not take is seen by the checks
    g.stage_and_launch(statics, sets[1])
    sync()
    turn = [0]

    def rebind_same():
        g.rebind_and_launch(statics, inputs)

    def rebind_other():                          # the kernels' parameters change on every call
        turn[0] ^= 1
        g.rebind_and_launch(statics, sets[turn[0]])

    def stage():
        g.stage_and_launch(statics, inputs)

    def check_replay():
        g.replay()
        sync()
        _check_rebind(outs, statics, to_np, "replay()")

    def check_same():
        rebind_same()
        sync()
        _check_rebind(outs, inputs, to_np, "rebind_and_launch")

    def check_other():
        for _ in range(2):
            rebind_other()
            sync()
            _check_rebind(outs, sets[turn[0]], to_np, "rebind_and_launch (other tensors)")

    def check_stage():
        stage()
        sync()
        _check_rebind(outs, inputs, to_np, "stage_and_launch")

    rows = [("tensorplay replay() (no inputs)", g.replay, check_replay, tp, None)]
    if has_rebind:
        flags = g.rebindable(statics)
        note = f"rebindable: {sum(map(bool, flags))} of {n}"
        rows += [(rebind_names[0], rebind_same, check_same, tp, note),
                 (rebind_names[1], rebind_other, check_other, tp, note)]
    else:
        for name in rebind_names:
            record("rebind", case, name, note="skipped: CUDAGraph.rebind_and_launch does not exist yet")
    rows.append(("tensorplay stage_and_launch", stage, check_stage, tp, None))

    @guarded("rebind", case, "PyTorch _foreach_copy_ + replay")
    def _torch():
        ts = [torch.zeros(elems, device="cuda") for _ in range(n)]
        ti = _rebind_inputs(torch, n, elems, 1)
        tg = torch.cuda.CUDAGraph()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            ts[0] * 2.0 + 1.0
        torch.cuda.current_stream().wait_stream(side)
        with torch.cuda.graph(tg):
            touts = [x * 2.0 + 1.0 for x in ts]

        def tforeach():
            torch._foreach_copy_(ts, ti)
            tg.replay()

        def tcheck():
            tforeach()
            torch.cuda.synchronize()
            _check_rebind(touts, ti, lambda t: t.cpu().numpy(), "PyTorch _foreach_copy_ + replay")
        rows.append(("PyTorch _foreach_copy_ + replay", tforeach, tcheck, torch, None))

    contenders, notes, latencies = [], {}, {}
    for name, fn, check, lib, note in rows:
        try:
            check()
        except Exception as exc:                 # a wrong result is reported and not timed
            record("rebind", case, name, error=f"{type(exc).__name__}: {exc}"[:200])
            continue
        contenders.append((name, _loop(fn), lib.cuda.synchronize))
        latencies[name] = event_latency(lib, fn, reps)
        notes[name] = note
    host = interleaved_host(contenders, k, reps)
    for name, _, _ in contenders:
        record("rebind", case, name, host[name], latencies[name], note=notes[name])
    if has_rebind:
        try:                                     # after rebinding, replay() reads the static inputs again
            check_replay()
        except Exception as exc:
            record("rebind", case, "tensorplay replay() after rebinding", error=f"{type(exc).__name__}: {exc}"[:200])
    g.reset()


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


# ---------------------------------------------------------------- 3b. branches (IF/ELSE, SWITCH)

def branch_rows(repeats):
    """An if/else as one IF/ELSE node vs two IF nodes (pred, logical_not(pred))
    vs host branching (read pred back, replay one of two graphs); a SWITCH of 8
    cases vs 8 IF nodes (index == k) vs host dispatch (read the index back,
    replay one of 8 graphs). Latency from replay to completion, both branches
    alternating, each body one small kernel."""
    sync = tp.cuda.synchronize
    x = tp.zeros(1024, device="cuda")
    pred = tp.zeros(1, dtype=tp.bool, device="cuda")
    not_pred = tp.zeros(1, dtype=tp.bool, device="cuda")
    index = tp.zeros(1, dtype=tp.int32, device="cuda")
    hits = [tp.zeros(1, dtype=tp.bool, device="cuda") for _ in range(8)]
    x.add_(1)
    x.mul_(1.5)
    tp.logical_not(pred, out=not_pred)
    tp.eq(index, 0, out=hits[0])
    sync()

    def alternating(replay_for, values):
        state = [0]

        def step():
            v = values[state[0] % len(values)]
            state[0] += 1
            replay_for(v)
        return step

    case = "if/else, branch alternating"
    one = tp.cuda.CUDAGraph()
    with tp.cuda.graph(one):
        with one.if_else(pred) as (then, otherwise):
            with then:
                x.add_(1)
            with otherwise:
                x.mul_(0.5)
    two = tp.cuda.CUDAGraph()
    with tp.cuda.graph(two):
        tp.logical_not(pred, out=not_pred)
        with two.if_(pred):
            x.add_(1)
        with two.if_(not_pred):
            x.mul_(0.5)
    then_g, else_g = tp.cuda.CUDAGraph(), tp.cuda.CUDAGraph()
    with tp.cuda.graph(then_g):
        x.add_(1)
    with tp.cuda.graph(else_g):
        x.mul_(0.5)

    def set_pred(v):
        pred.fill_(v)

    def on_device(g):
        return lambda v: (set_pred(v), g.replay())

    def host_if(v):
        set_pred(v)
        (then_g if pred.item() else else_g).replay()      # the read-back the graph avoids
    for name, fn in (("one IF/ELSE node", on_device(one)), ("two IF nodes (pred, not pred)", on_device(two)),
                     ("host branch (item(), one of two graphs)", host_if)):
        record("branch", case, name, latency_us=latency(alternating(fn, [True, False]), repeats, sync))

    case = "switch of 8 cases, case cycling"
    sw = tp.cuda.CUDAGraph()
    with tp.cuda.graph(sw):
        with sw.switch(index, 8) as cases:
            for k in range(8):
                with cases[k]:
                    x.add_(k)
    ifs = tp.cuda.CUDAGraph()
    with tp.cuda.graph(ifs):
        for k in range(8):
            tp.eq(index, k, out=hits[k])
        for k in range(8):
            with ifs.if_(hits[k]):
                x.add_(k)
    per_case = []
    for k in range(8):
        gk = tp.cuda.CUDAGraph()
        with tp.cuda.graph(gk):
            x.add_(k)
        per_case.append(gk)

    def set_index(v):
        index.fill_(v)

    def host_switch(v):
        set_index(v)
        per_case[int(index.item())].replay()
    for name, fn in (("one SWITCH node", lambda v: (set_index(v), sw.replay())),
                     ("8 IF nodes (index == k)", lambda v: (set_index(v), ifs.replay())),
                     ("host dispatch (item(), one of 8 graphs)", host_switch)):
        record("branch", case, name, latency_us=latency(alternating(fn, list(range(8))), repeats, sync))


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


def recapture_rows(sizes, repeats):
    """Re-capture of a graph that has an executable: capture_end updates it
    in place (cuGraphExecUpdate), against reset() then capture + instantiate.
    Host time per re-capture (capture_begin to capture_end), median."""
    for n in sizes:
        case = f"{n} nodes"
        x = tp.zeros(1, device="cuda")
        x.add_(1)

        def capture_into(g):
            with tp.cuda.graph(g):
                for _ in range(n):
                    x.add_(1)
        for label, fresh in (("tensorplay re-capture (update)", False),
                             ("tensorplay reset + capture + instantiate", True)):
            g = tp.cuda.CUDAGraph()
            capture_into(g)
            per, results = [], set()
            for _ in range(repeats):
                tp.cuda.synchronize()
                t0 = time.perf_counter()
                if fresh:
                    g.reset()
                capture_into(g)
                per.append((time.perf_counter() - t0) * 1e6)
                results.add(g.update_result)
            g.replay()
            tp.cuda.synchronize()
            g.reset()
            record("recapture", case, label, statistics.median(per),
                   note=f"update_result: {', '.join(sorted(map(str, results)))}")


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


# ---------------------------------------------------------------- 8. GPU work per call (matmul, fast kernels)

# A kernel that waits on the GPU: queued ahead of a timed batch, it keeps the
# GPU busy while the host enqueues the batch, so the events around the batch
# measure the kernels back to back, not the host's launch rate.
SPIN_SOURCE = r"""
extern "C" __global__ void bench_spin(unsigned long long ns) {
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    } while (t - t0 < ns);
}
"""


class GpuClock:
    """One library's CUDA events, synchronize and current stream, for GPU time.

    ``spin(ms)`` queues the spin kernel on the library's current stream (it is
    launched through tensorplay in both cases: one context, any stream)."""

    def __init__(self, lib, spin_kernel, stream_of=None):
        self.lib = lib
        self._spin_kernel = spin_kernel
        self._stream_of = stream_of or (lambda: None)

    def spin(self, ms):
        if self._spin_kernel is not None:
            self._spin_kernel(1, 1, [int(ms * 1e6)], stream=self._stream_of())

    def batch(self, fn, calls, spin_ms):
        """(GPU ms per call, host enqueue ms for the whole batch) of ``calls`` calls."""
        self.lib.cuda.synchronize()
        start = self.lib.cuda.Event(enable_timing=True)
        end = self.lib.cuda.Event(enable_timing=True)
        self.spin(spin_ms)
        start.record()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        host_ms = (time.perf_counter() - t0) * 1e3
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / calls, host_ms


def make_clocks(torch):
    """{library: GpuClock}; the spin kernel is None (and timed batches start
    with an empty queue) when it cannot be built."""
    try:
        spin = tp.cuda.RawKernel(SPIN_SOURCE, "bench_spin")
        spin(1, 1, [1000])
        tp.cuda.synchronize()
    except Exception as exc:
        print(f"no spin kernel ({type(exc).__name__}: {exc}); GPU times may include host launch gaps")
        spin = None
    clocks = {"tensorplay": GpuClock(tp, spin)}
    if torch is not None:
        def torch_stream():
            return tp.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream, device=torch.cuda.current_device())
        clocks["PyTorch"] = GpuClock(torch, spin, torch_stream)
    return clocks


def gpu_per_call(contenders, rounds, target_ms, min_calls=20, max_calls=100):
    """Median GPU time per call of each contender ``(name, fn, clock)``, in µs,
    with the median host enqueue time per call and whether the host fell
    behind the GPU in any round (the GPU may then have idled between calls).

    A calibration batch per contender picks the calls per round (enough for
    ``target_ms`` of GPU work, within [min_calls, max_calls]) and the spin
    (longer than the host needs to enqueue the batch); rounds then alternate
    between contenders so that drift affects them alike."""
    plan = {}
    for name, fn, clock in contenders:
        gpu_ms, host_ms = clock.batch(fn, min_calls, 5.0)
        calls = max(min_calls, min(max_calls, int(target_ms / max(gpu_ms, 1e-4))))
        spin_ms = min(50.0, max(0.5, 2.0 * host_ms / min_calls * calls + 0.2))
        plan[name] = (calls, spin_ms)
    gpu = {name: [] for name, _, _ in contenders}
    host = {name: [] for name, _, _ in contenders}
    behind = {name: False for name, _, _ in contenders}
    for _ in range(rounds):
        for name, fn, clock in contenders:
            calls, spin_ms = plan[name]
            gpu_ms, host_ms = clock.batch(fn, calls, spin_ms)
            gpu[name].append(gpu_ms * 1e3)
            host[name].append(host_ms / calls * 1e3)
            behind[name] |= clock._spin_kernel is None or host_ms > spin_ms
    return {name: (statistics.median(gpu[name]), statistics.median(host[name]), behind[name])
            for name, _, _ in contenders}


# Largest error allowed, relative to the largest magnitude of PyTorch's
# result: rounding of the output dtype and a different summation order pass,
# a wrong layout, transpose or epilogue does not.
TOLERANCE = {"float64": 1e-9, "float32": 1e-4, "tf32": 4e-3, "float16": 4e-3, "bfloat16": 2e-2}


def as_torch(x, torch):
    """A tensorplay CUDA tensor as a torch tensor (DLPack, no copy), or
    through the host where DLPack fails."""
    try:
        return torch.from_dlpack(x)
    except Exception:
        return torch.from_numpy(np.asarray(x.cpu().numpy(), dtype=np.float64)).cuda()


def relative_error(got, want, torch):
    """max |got - want| / max |want| (inf for a shape mismatch); ``got`` is a
    tensorplay or torch tensor, ``want`` a torch tensor."""
    if not isinstance(got, torch.Tensor):
        got = as_torch(got, torch)
    if tuple(got.shape) != tuple(want.shape):
        return math.inf
    got, want = got.double(), want.to(got.device).double()
    scale = want.abs().max().item() or 1.0
    return (got - want).abs().max().item() / scale


def check_against(got, want, tolerance, torch):
    """None when ``got`` agrees with torch's ``want``, else why not (a row's error)."""
    err = relative_error(got, want, torch)
    if err <= tolerance:
        return None
    return f"wrong result: max error {err:.2e} of the largest value (tolerance {tolerance:.0e}); not timed"


def _same(make):
    return {"tensorplay": make, "PyTorch": make}


def _matmul(lib, a, b):
    return lambda: lib.matmul(a, b)


def _matmul_operator(lib, a, b):
    return lambda: a @ b


def _mv(lib, a, v):
    return lambda: lib.mv(a, v)


def _add_out(lib, a, b):
    out = lib.empty_like(a)
    return lambda: lib.add(a, b, out=out)


def _sum(lib, a):
    return lambda: a.sum()


def _transpose_copy(lib, a):
    return lambda: a.transpose(0, 1).contiguous()


def _tp_linear(activation):
    def make(lib, x, w, b):
        return lambda: lib.linear(x, w, b, activation=activation)
    return make


def _torch_linear(activation):
    def make(lib, x, w, b):
        F = lib.nn.functional
        if activation is None:
            return lambda: F.linear(x, w, b)
        if activation == "relu":
            return lambda: F.relu(F.linear(x, w, b))
        return lambda: F.gelu(F.linear(x, w, b), approximate="tanh")    # cuBLASLt's GELU epilogue is tanh's
    return make


def _layers(x, w, layers):
    for _ in range(layers):
        x = (x @ w).relu() + x
    return x


def _replayer(g, y):
    """A work-row call: replay ``g``, return its output ``y``."""
    def replay():
        g.replay()
        return y
    return replay


def _tp_graph_layers(lib, x, w, layers=4):
    _layers(x, w, layers)                                   # compiles the kernels, makes the plans
    tp.cuda.synchronize()
    g = tp.cuda.CUDAGraph()
    with tp.cuda.graph(g):
        y = _layers(x, w, layers)
    return _replayer(g, y)


def _torch_graph_layers(torch, x, w, layers=4):
    g, y = torch_graph(torch, lambda: _layers(x, w, layers))
    return _replayer(g, y)


class WorkCase:
    """One row of the work section.

    ``shapes`` are the inputs' shapes (uniform in [low, 1), ``scale`` times,
    the same values for both libraries); ``ops`` maps a library name to
    ``make(lib, *inputs)``, which returns a call that does the work once and
    returns its result. ``flops`` gives TFLOP/s, else ``nbytes`` (bytes read
    and written) gives GB/s. ``tf32`` runs the row with TF32 matmuls allowed
    in both libraries."""

    def __init__(self, case, dtype, shapes, ops, flops=0, nbytes=0, low=-1.0, scale=1.0, tf32=False):
        self.case, self.dtype, self.shapes, self.ops = case, dtype, shapes, ops
        self.flops, self.nbytes, self.low, self.scale, self.tf32 = flops, nbytes, low, scale, tf32

    @property
    def tolerance(self):
        return TOLERANCE["tf32" if self.tf32 else self.dtype]

    def rate(self, gpu_us):
        """(value, unit) of the achieved rate for a GPU time per call."""
        if self.flops:
            return self.flops / gpu_us / 1e6, "TFLOP/s"
        return self.nbytes / gpu_us / 1e3, "GB/s"


def _gemm(m, n, k, dtype, tf32=False, batch=1, label=None):
    shapes = ((batch, m, k), (batch, k, n)) if batch > 1 else ((m, k), (k, n))
    size = f"{batch} x ({m}x{k} @ {k}x{n})" if batch > 1 else (f"{m}^2" if m == n == k else f"{m}x{k} @ {k}x{n}")
    case = label or f"matmul {size} {dtype}" + (" TF32" if tf32 else "")
    itemsize = np.dtype(dtype).itemsize if dtype != "bfloat16" else 2
    return WorkCase(case, dtype, shapes, _same(_matmul), flops=2 * batch * m * n * k, tf32=tf32,
                    nbytes=batch * (m * k + k * n + m * n) * itemsize)


def _linear(n, dtype, activation):
    name = {None: "linear + bias", "relu": "linear + bias + relu", "gelu": "linear + bias + gelu"}[activation]
    return WorkCase(f"{name} {n}^2 {dtype}", dtype, ((n, n), (n, n), (n,)),
                    {"tensorplay": _tp_linear(activation), "PyTorch": _torch_linear(activation)},
                    flops=2 * n * n * n)


MI = 1 << 20
WORK_CASES = [
    _gemm(4096, 4096, 4096, "float32"),
    _gemm(4096, 4096, 4096, "float32", tf32=True),
    _gemm(4096, 4096, 4096, "bfloat16"),
    _gemm(4096, 4096, 4096, "float16"),
    _gemm(1024, 1024, 1024, "bfloat16"),
    _gemm(2048, 2048, 2048, "bfloat16"),
    _gemm(8192, 8192, 8192, "bfloat16"),
    WorkCase("a @ b 4096^2 bf16 (operator)", "bfloat16", ((4096, 4096), (4096, 4096)), _same(_matmul_operator),
             flops=2 * 4096 ** 3),
    # GEMV: bound by reading the matrix, so GB/s
    WorkCase("matmul 1x4096 @ 4096x4096 float32 (GEMV)", "float32", ((1, 4096), (4096, 4096)), _same(_matmul),
             nbytes=(4096 + 4096 * 4096 + 4096) * 4),
    WorkCase("mv 4096x4096 @ 4096 float32", "float32", ((4096, 4096), (4096,)), _same(_mv),
             nbytes=(4096 + 4096 * 4096 + 4096) * 4),
    _gemm(512, 512, 64, "bfloat16", batch=32),
    _linear(4096, "bfloat16", None),
    _linear(4096, "bfloat16", "relu"),
    _linear(4096, "bfloat16", "gelu"),
    WorkCase("add 64Mi float32, out=", "float32", ((64 * MI,), (64 * MI,)), _same(_add_out), nbytes=3 * 64 * MI * 4),
    WorkCase("sum 64Mi float32", "float32", ((64 * MI,),), _same(_sum), nbytes=64 * MI * 4, low=0.0),
    WorkCase("transpose copy 8192^2 float32", "float32", ((8192, 8192),), _same(_transpose_copy),
             nbytes=2 * 8192 * 8192 * 4),
    # weights read per replay (4 layers of 1024x1024 float32), so GB/s
    WorkCase("graph replay: 4 x ((x @ w).relu() + x), 1x1024 @ 1024^2 float32", "float32",
             ((1, 1024), (1024, 1024)), {"tensorplay": _tp_graph_layers, "PyTorch": _torch_graph_layers},
             nbytes=4 * 1024 * 1024 * 4, scale=1 / 32),
]


def host_inputs(case, seed):
    """The case's inputs as float32 NumPy arrays, the same for every library."""
    rng = np.random.default_rng(seed)
    return [(rng.random(shape, dtype=np.float32) * (1 - case.low) + case.low) * np.float32(case.scale)
            for shape in case.shapes]


def to_library(lib, array, dtype):
    """A float32 NumPy array as a CUDA tensor of ``lib`` with ``dtype`` (cast on the device)."""
    return lib.from_numpy(array).to("cuda").to(getattr(lib, dtype))


class _Tf32:
    """Sets TF32 matmuls on (``enabled``) or off in both libraries for a row,
    and restores the previous settings on exit. ``tp_error`` says why
    tensorplay's switch could not be set (its row is then not measured)."""

    def __init__(self, enabled, torch):
        self.enabled, self.torch, self.saved, self.tp_error = enabled, torch, [], None

    def _set(self, holder):
        self.saved.append((holder, holder.allow_tf32))
        holder.allow_tf32 = self.enabled

    def __enter__(self):
        if self.torch is not None:
            self._set(self.torch.backends.cuda.matmul)
        try:
            self._set(tp.backends.cuda.matmul)
        except AttributeError as exc:
            if self.enabled:                # off is tensorplay's default: nothing to set
                self.tp_error = f"cannot allow TF32 in tensorplay: {exc}"
        return self

    def __exit__(self, *exc):
        for holder, value in reversed(self.saved):
            holder.allow_tf32 = value
        return False


def work_rows(quick, torch, cases=None):
    """GPU time per call of each WORK_CASES row in both libraries, from CUDA
    events around back-to-back calls; tensorplay's result checked against
    PyTorch's once per row before it is timed."""
    clocks = make_clocks(torch)
    rounds, target_ms = (5, 10.0) if quick else (15, 25.0)
    for seed, case in enumerate(WORK_CASES if cases is None else cases):
        work_case(case, seed, clocks, rounds, target_ms, torch)
        gc.collect()


def work_case(case, seed, clocks, rounds, target_ms, torch):
    arrays = host_inputs(case, seed)
    libraries = [("tensorplay", tp)] + ([("PyTorch", torch)] if torch is not None else [])
    with _Tf32(case.tf32, torch) as tf32:
        calls, errors = {}, {}
        for name, lib in libraries:
            @guarded("work", case.case, name)
            def _build():
                if name == "tensorplay" and tf32.tp_error:
                    raise RuntimeError(tf32.tp_error)
                inputs = [to_library(lib, a, case.dtype) for a in arrays]
                fn = case.ops[name](lib, *inputs)
                for _ in range(3):                 # compile, plan, fill caches
                    fn()
                lib.cuda.synchronize()
                calls[name] = fn
        if "tensorplay" in calls and "PyTorch" in calls:
            try:
                wrong = check_against(calls["tensorplay"](), calls["PyTorch"](), case.tolerance, torch)
            except Exception as exc:     # an unchecked result is not timed either
                wrong = f"check failed: {type(exc).__name__}: {exc}"[:200]
            if wrong:
                errors["tensorplay"] = wrong
                del calls["tensorplay"]
        elif "tensorplay" in calls:
            errors["tensorplay"] = "unchecked (no PyTorch)"
        for name, msg in errors.items():
            if name not in calls:
                record("work", case.case, name, error=msg)
        timed = gpu_per_call([(name, fn, clocks[name]) for name, fn in calls.items()], rounds, target_ms)
    for name, (gpu_us, host_us, behind) in timed.items():
        rate, unit = case.rate(gpu_us)
        note = [errors[name]] if name in errors else []
        if behind:
            note.append("host fell behind: GPU may have idled")
        record("work", case.case, name, host_us=host_us, gpu_us=gpu_us, rate=rate, unit=unit,
               note="; ".join(note) or None)
    if "tensorplay" in timed and "PyTorch" in timed:
        set_speed("work", case.case, timed["PyTorch"][0] / timed["tensorplay"][0])


def set_speed(section, case, speed):
    """Store PyTorch's GPU time / tensorplay's (>1: tensorplay faster) on the tensorplay row."""
    for r in RESULTS:
        if r["section"] == section and r["case"] == case and r["library"] == "tensorplay":
            r["speed_vs_torch"] = speed


# ---------------------------------------------------------------- 8b. gaps between dependent kernels (gaps.py)

def gap_rows(quick, torch):
    """gaps.py's cases (GPU time per replay, PDL on and off, beside PyTorch's
    graphs), as rows of section gaps; each tensorplay row's note gives its
    GPU time over PyTorch's."""
    import gaps
    with tp.cuda.stream(tp.cuda.Stream()):
        gaps.run(gaps.SECTIONS, quick, torch)
    for r in gaps.RESULTS:
        record("gaps", f"{r['section']}: {r['case']}", r["library"], gpu_us=r["gpu_us"], note=r["note"],
               error=r["error"])


# ---------------------------------------------------------------- 9. serving: one graph per batch size

# vLLM's default capture sizes: 1, 2, 4, then every multiple of 8 up to 512
SERVING_BATCHES = [1, 2, 4] + list(range(8, 513, 8))
SERVING_HIDDEN, SERVING_FFN = 1024, 4096


def serving_weights(seed=100):
    """bf16 MLP weights (as float32 arrays) and two 512-row inputs: one for
    warm-up and capture, one written before the checked replay."""
    rng = np.random.default_rng(seed)
    h, f = SERVING_HIDDEN, SERVING_FFN

    def uniform(shape, scale):
        return ((rng.random(shape, dtype=np.float32) * 2 - 1) * np.float32(scale))
    return {"w1": uniform((f, h), h ** -0.5), "b1": uniform((f,), 0.1), "w2": uniform((h, f), f ** -0.5),
            "b2": uniform((h,), 0.1), "x": uniform((max(SERVING_BATCHES), h), 1.0),
            "x_new": uniform((max(SERVING_BATCHES), h), 1.0)}


def tp_mlp_step(w):
    """y = x + linear(gelu(linear(x, w1, b1)), w2, b2), bias and GELU fused."""
    def step(x):
        h = tp.linear(x, w["w1"], w["b1"], activation="gelu")
        return tp.linear(h, w["w2"], w["b2"]) + x
    return step


def torch_mlp_step(torch, w):
    F = torch.nn.functional

    def step(x):
        h = F.gelu(F.linear(x, w["w1"], w["b1"]), approximate="tanh")
        return F.linear(h, w["w2"], w["b2"]) + x
    return step


def _torch_capture_graph_ctx(torch, g, pool, step, x):
    with torch.cuda.graph(g, pool=pool):
        return step(x)


def _torch_capture_raw(torch, side):
    """capture_begin/capture_end on one side stream: torch.cuda.graph()'s
    capture without its synchronize and empty_cache on every entry."""
    def capture(torch, g, pool, step, x):
        with torch.cuda.stream(side):
            g.capture_begin(pool=pool)
            try:
                y = step(x)
            finally:
                g.capture_end()
        return y
    return capture


def _tp_capture(lib, g, pool, step, x):
    with lib.cuda.graph(g, pool=pool):
        return step(x)


def capture_serving(lib, step, x_static, capture):
    """Warm ``step`` up at every batch size (kernels, plans), settle, then
    capture one graph per batch size, largest first, into one pool: returns
    ({batch: (graph, output)}, capture wall ms, reserved growth MiB)."""
    for b in SERVING_BATCHES:
        step(x_static[:b])
    base = settle(lib)
    pool = lib.cuda.graph_pool_handle()
    graphs = {}
    t0 = time.perf_counter()
    for b in sorted(SERVING_BATCHES, reverse=True):
        g = lib.cuda.CUDAGraph()
        graphs[b] = (g, capture(lib, g, pool, step, x_static[:b]))
    lib.cuda.synchronize()
    wall_ms = (time.perf_counter() - t0) * 1e3
    return graphs, wall_ms, mib(lib.cuda.memory_reserved() - base)


def check_serving(lib, step, graphs, x_static, x_new, batches, tolerance, torch):
    """Write new input values, replay the graphs of ``batches`` and compare
    each output with ``step`` run eagerly: None or what is wrong."""
    x_static.copy_(x_new)
    for b in batches:
        g, out = graphs[b]
        g.replay()
        want = step(x_static[:b])
        lib.cuda.synchronize()
        err = relative_error(out, as_torch(want, torch) if lib is tp else want, torch)
        if err > tolerance:
            return f"batch {b}: replay differs from eager by {err:.2e} of the largest value"
    return None


def serving_rows(quick, torch):
    """vLLM-style capture of one graph per batch size into one shared pool,
    for tensorplay and PyTorch: capture wall time, reserved growth, replay
    GPU time at batch 1 and 512, replays checked against eager."""
    section = "serving"
    n = len(SERVING_BATCHES)
    cap_case = f"capture {n} graphs (batch {SERVING_BATCHES[0]}..{SERVING_BATCHES[-1]}, largest first), one pool"
    big = max(SERVING_BATCHES)
    weights = serving_weights()
    tolerance = TOLERANCE["bfloat16"]
    clocks = make_clocks(torch)
    rounds, target_ms = (5, 5.0) if quick else (15, 20.0)
    state = {}
    contenders = [("tensorplay", tp, tp_mlp_step, _tp_capture)]
    if torch is not None:
        side = torch.cuda.Stream()
        contenders += [("PyTorch", torch, lambda w: torch_mlp_step(torch, w), _torch_capture_graph_ctx),
                       ("PyTorch capture_begin/end (no per-graph sync, empty_cache)", torch,
                        lambda w: torch_mlp_step(torch, w), _torch_capture_raw(torch, side))]
    for name, lib, make_step, capture in contenders:
        @guarded(section, cap_case, name)
        def _capture():
            w = {k: to_library(lib, v, "bfloat16") for k, v in weights.items()}
            step = make_step(w)
            graphs, wall_ms, growth = capture_serving(lib, step, w["x"], capture)
            error = None
            if torch is not None:
                error = check_serving(lib, step, graphs, w["x"], w["x_new"], (1, big), tolerance, torch)
            record(section, cap_case, name, capture_ms=wall_ms, reserved_mib=growth, error=error)
            if name in ("tensorplay", "PyTorch"):
                state[name] = (lib, graphs, w, error)
    if "tensorplay" in state and "PyTorch" in state and state["tensorplay"][3] is None:
        # both libraries' batch-1 outputs, replayed on the same input (x_new, written by the check)
        tp_lib, tp_graphs, tp_w, _ = state["tensorplay"]
        try:
            err = relative_error(tp_graphs[1][1], state["PyTorch"][1][1][1], torch)
            disagree = f"batch 1 replay differs from PyTorch's by {err:.2e} of the largest value" \
                if err > tolerance else None
        except Exception as exc:
            disagree = f"check against PyTorch failed: {type(exc).__name__}: {exc}"[:200]
        state["tensorplay"] = (tp_lib, tp_graphs, tp_w, disagree)
        if disagree:
            for r in RESULTS:
                if (r["section"], r["case"], r["library"]) == (section, cap_case, "tensorplay"):
                    r["error"] = disagree
    flops = 2 * SERVING_HIDDEN * SERVING_FFN * 2
    for b, case in ((1, "replay batch 1"), (big, f"replay batch {big}")):
        timed_contenders = [(name, graphs[b][0].replay, clocks[name])
                            for name, (lib, graphs, w, error) in state.items() if error is None]
        for name, (lib, graphs, w, error) in state.items():
            if error is not None:
                record(section, case, name, error=f"{error}; not timed")
        for name in ("tensorplay", "PyTorch")[:len(contenders)]:
            if name not in state:
                record(section, case, name, error="not captured (see the capture row)")
        timed = gpu_per_call(timed_contenders, rounds, target_ms)
        for name, (gpu_us, host_us, behind) in timed.items():
            if b == 1:       # bound by reading the weights
                rate, unit = SERVING_HIDDEN * SERVING_FFN * 2 * 2 / gpu_us / 1e3, "GB/s"
            else:
                rate, unit = flops * b / gpu_us / 1e6, "TFLOP/s"
            record(section, case, name, host_us=host_us, gpu_us=gpu_us, rate=rate, unit=unit,
                   note="host fell behind: GPU may have idled" if behind else None)
        if "tensorplay" in timed and "PyTorch" in timed:
            set_speed(section, case, timed["PyTorch"][0] / timed["tensorplay"][0])
    caps = {r["library"]: r for r in RESULTS if r["section"] == section and r["case"] == cap_case}
    if caps.get("tensorplay", {}).get("capture_ms") and caps.get("PyTorch", {}).get("capture_ms"):
        caps["tensorplay"]["speed_vs_torch"] = caps["PyTorch"]["capture_ms"] / caps["tensorplay"]["capture_ms"]
    state.clear()
    gc.collect()
    for lib in (tp, torch):
        if lib is not None:
            settle(lib)


# ---------------------------------------------------------------- 9b. serving_set: GraphSet against vLLM-style capture

SET_TP, SET_PT = "tensorplay GraphSet", "PyTorch, vLLM-style"
SET_DECODE_MAX_LEN = 256
SERVING_SET_LEGEND = """\
serving_set: per workload, tp.cuda.GraphSet against torch.cuda.graph captures made as vLLM makes them
  (same sizes, same step, same process; both warmed up eagerly at the largest size first). Capture: wall
  ms of building the whole set (static inputs, warm-ups, captures); MiB: drop of the device's free memory
  (mem_get_info) over the capture, both libraries' caches emptied before and after (the note has the drop
  before emptying, vLLM's own figure, and each library's memory_reserved growth); tp/PT = PyTorch's time
  over tensorplay's (target >= 2). Each set is checked against eager at n = 1, 3, 100 and the largest
  (padded calls included). Replay rows: GPU time of one graph replay, interleaved rounds (target: tp/PT
  GPU time <= 1.02, i.e. the tp/PT column >= 0.98). Padding waste: rate = mean % of padded rows over
  n = 1..largest. Sleep/wake: bytes sleep() gave back over the pool's mapped bytes (target >= 95%), the
  device's free memory gained, sleep and wake ms and the first call after wake (checked), medians."""


def _settle_both(torch):
    """Free what nothing references and empty both libraries' caches: a baseline."""
    gc.collect()
    if torch is not None:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    tp.cuda.synchronize()
    tp.cuda.empty_cache()
    tp.cuda.synchronize()


def _sync_both(torch):
    if torch is not None:
        torch.cuda.synchronize()
    tp.cuda.synchronize()


def _footprint_now(torch):
    """(device free bytes, torch reserved, tensorplay reserved)."""
    _sync_both(torch)
    return (tp.cuda.mem_get_info()[0], torch.cuda.memory_reserved() if torch is not None else 0,
            tp.cuda.memory_reserved())


def _set_workloads(quick, torch, largest):
    """[(name, build)]; build() -> (step, sample args of the largest size, make_args(n, rng)). The
    weights and caches are made when a workload's turn comes and freed after it."""
    import serving_set as ss

    def mlp():
        w = {k: to_library(torch, v, "bfloat16") for k, v in serving_weights().items()}

        def make_args(n, rng):
            return [to_library(torch, (rng.random((n, SERVING_HIDDEN), dtype=np.float32) * 2 - 1), "bfloat16")]
        return torch_mlp_step(torch, w), [w["x"][:largest]], make_args

    def decode(model):
        def build():
            step, cfg = ss.decode_step(torch, model, largest, SET_DECODE_MAX_LEN)

            def make_args(n, rng):
                tok = torch.from_numpy(rng.integers(0, cfg.vocab - 1, n)).to("cuda")
                pos = torch.from_numpy(rng.integers(0, SET_DECODE_MAX_LEN, n)).to("cuda")
                return [tok, pos]
            return step, make_args(largest, np.random.default_rng(7)), make_args
        return build

    models = ("small",) if quick else ("small", "gpt2-small")
    return [("MLP 1024/4096 bf16", mlp)] + [(f"{m} decode step", decode(m)) for m in models]


def _check_set(call, step, make_args, counts, rng, torch):
    """Run ``call`` on fresh inputs of each row count and compare with eager
    ``step``: (largest error, None or what is wrong)."""
    worst = 0.0
    for n in counts:
        args = make_args(n, rng)
        want = step(*args)
        got = call(*args)
        _sync_both(torch)
        err = relative_error(got, want, torch)
        worst = max(worst, err)
        if err > TOLERANCE["bfloat16"]:
            return worst, f"n={n}: differs from eager by {err:.2e} of the largest value"
    return worst, None


def _capture_contender(section, case, library, make, torch, step, make_args, checks, state):
    """Build one contender's set between two settled baselines and check it;
    the row goes to RESULTS, the set to ``state``."""
    @guarded(section, case, library)
    def _capture():
        _settle_both(torch)
        free0, torch0, tp0 = _footprint_now(torch)
        t0 = time.perf_counter()
        built = make()
        _sync_both(torch)
        wall_ms = (time.perf_counter() - t0) * 1e3
        free1 = _footprint_now(torch)[0]
        _settle_both(torch)              # the warm-ups' cached blocks are not the set's
        free2, torch2, tp2 = _footprint_now(torch)
        state[library] = built
        worst, error = _check_set(built, step, make_args, checks, np.random.default_rng(11), torch)
        note = [f"{mib(free0 - free1):.0f} MiB before emptying the caches",
                f"reserved: torch {mib(torch2 - torch0):+.0f} MiB, tp {mib(tp2 - tp0):+.0f} MiB",
                f"checked n={','.join(map(str, checks))}: max error {worst:.1e}"]
        if library == SET_TP:
            note.append(f"capture_seconds_total {built.capture_seconds_total * 1e3:.0f} ms, memory_added "
                        f"{mib(sum(built.memory_added.values())):.0f} MiB")
        record(section, case, library, capture_ms=wall_ms, reserved_mib=mib(free0 - free2), error=error,
               note="; ".join(note), extra={"device_mib": mib(free0 - free2),
                                            "device_mib_unsettled": mib(free0 - free1),
                                            "torch_reserved_mib": mib(torch2 - torch0),
                                            "tp_reserved_mib": mib(tp2 - tp0), "max_error": worst})


def _sleep_row(section, case, library, cycles, cycle):
    """Run ``cycle()`` -> dict of one sleep/wake cycle ``cycles`` times and
    record the medians (an error from any cycle is kept)."""
    @guarded(section, case, library)
    def _run():
        per = [cycle() for _ in range(cycles)]
        med = {k: statistics.median(c[k] for c in per) for k in per[0] if k != "error"}
        error = next((c["error"] for c in per if c.get("error")), None)
        given = med["given_mib"] / med["mapped_mib"] if med["mapped_mib"] else 0.0
        med["given_share"] = given
        note = (f"given back {given:.1%} of mapped (target >= 95%); first call after wake {med['first_ms']:.2f} ms, "
                f"the next {med['steady_ms']:.2f} ms; median of {cycles} cycles")
        record(section, case, library, extra=med, error=error, note=note)


def _set_sleep_cycle(gs, step, make_args, rng, torch):
    """One cycle of the set: sleep, wake, then a call of the largest size on new input, checked."""
    def cycle():
        args = make_args(gs.max_size, rng)
        want = step(*args)
        _sync_both(torch)
        mapped = gs.pool.memory()["mapped"]
        free0 = tp.cuda.mem_get_info()[0]
        t0 = time.perf_counter()
        given = gs.sleep()
        sleep_ms = (time.perf_counter() - t0) * 1e3
        free1 = tp.cuda.mem_get_info()[0]
        t0 = time.perf_counter()
        gs.wake()
        wake_ms = (time.perf_counter() - t0) * 1e3
        t0 = time.perf_counter()
        got = gs(*args)
        _sync_both(torch)
        first_ms = (time.perf_counter() - t0) * 1e3
        err = relative_error(got, want, torch)
        t0 = time.perf_counter()
        gs(*args)
        _sync_both(torch)
        steady_ms = (time.perf_counter() - t0) * 1e3
        return {"mapped_mib": mib(mapped), "given_mib": mib(given), "freed_mib": mib(free1 - free0),
                "sleep_ms": sleep_ms, "wake_ms": wake_ms, "first_ms": first_ms, "steady_ms": steady_ms,
                "error": None if err <= TOLERANCE["bfloat16"] else
                f"first call after wake differs from eager by {err:.2e} of the largest value"}
    return cycle


def _pool_sleep_rows(section, gib, cycles):
    """A GraphPool holding ~``gib`` GiB of temporaries (y = x * 2; z = y + 1 over float32, x outside
    the pool): sleep/wake cycles, the first replay after wake checked against NumPy on samples of z."""
    case = f"sleep/wake: GraphPool, y = x * 2; z = y + 1, {gib} GiB in the pool"
    n = gib * (1 << 30) // 8                         # y and z: 4 bytes each per element
    k = 4096
    held = {}                                        # x, z, graph, pool: cleared at the end, freeing them

    @guarded(section, case, "tensorplay GraphPool")
    def _build():
        x = tp.rand(n, device="cuda")
        (x[:k] * 2.0) + 1.0                          # compile the kernels outside the capture
        pool = tp.cuda.GraphPool()
        g = tp.cuda.CUDAGraph()
        with tp.cuda.graph(g, pool=pool):
            y = x * 2.0
            z = y + 1.0
        del y                                        # a temporary: its block stays in the pool
        g.replay()
        held.update(x=x, z=z, g=g, pool=pool)
    if not held:
        return
    rng = np.random.default_rng(gib)

    def cycle():
        x, z, g, pool = held["x"], held["z"], held["g"], held["pool"]
        tp.cuda.synchronize()
        mapped = pool.memory()["mapped"]
        free0 = tp.cuda.mem_get_info()[0]
        t0 = time.perf_counter()
        given = pool.sleep()
        sleep_ms = (time.perf_counter() - t0) * 1e3
        free1 = tp.cuda.mem_get_info()[0]
        x.mul_(-0.5)                                 # new input: a replay that did nothing shows
        tp.cuda.synchronize()
        t0 = time.perf_counter()
        pool.wake()
        wake_ms = (time.perf_counter() - t0) * 1e3
        t0 = time.perf_counter()
        g.replay()
        tp.cuda.synchronize()
        first_ms = (time.perf_counter() - t0) * 1e3
        t0 = time.perf_counter()
        g.replay()
        tp.cuda.synchronize()
        steady_ms = (time.perf_counter() - t0) * 1e3
        error = None
        for o in [*rng.integers(0, n - k, 4).tolist(), n - k]:
            xs, zs = x[o:o + k].cpu().numpy(), z[o:o + k].cpu().numpy()
            if not np.array_equal(zs, xs * np.float32(2) + np.float32(1)):
                error = f"first replay after wake: z[{o}:{o + k}] differs from NumPy's x * 2 + 1"
                break
        return {"mapped_mib": mib(mapped), "given_mib": mib(given), "freed_mib": mib(free1 - free0),
                "sleep_ms": sleep_ms, "wake_ms": wake_ms, "first_ms": first_ms, "steady_ms": steady_ms,
                "error": error}
    try:
        _sleep_row(section, case, "tensorplay GraphPool", cycles, cycle)
    finally:
        if held["pool"].asleep:
            held["pool"].wake()
        g = held["g"]
        held.clear()                                 # z (pool memory) and x go before the graph's reset
        g.reset()
        _settle_both(None)


def serving_set_rows(quick, torch):
    """tp.cuda.GraphSet against vLLM-style torch.cuda.graph captures, one
    graph per batch size in one pool, on two workloads written in PyTorch:
    the serving section's bf16 MLP step (hidden 1024, ffn 4096) and one
    decode step of examples/decode_loop.py's models (small; gpt2-small too
    without --quick): their configs and weights, the step rewritten in
    serving_set.decode_step with per-row positions and closure-held KV
    caches (max_len 256) sliced to the batch, because DecodeModel.step is
    tied to one batch and one position shared by all rows.

    Sizes: vLLM's rule, 1, 2, 4, multiples of 8 below 256, multiples of 16
    from 256 (the issue's "35 sizes" is this rule capped at 256; we cap it at
    512: 51 sizes), capped at 128 with --quick (19 sizes). Rows: capture
    wall time and device memory of each set (checked against eager), GPU
    time of one replay at up to 8 sizes, the padding waste of the sizes, and
    what only tensorplay can do: sleep/wake of the MLP set and of GraphPools
    holding 1 GiB and 8 GiB (1 GiB only with --quick)."""
    import serving_set as ss
    section = "serving_set"
    if torch is None:
        record(section, "capture (all workloads)", "PyTorch", error="PyTorch is not installed: the workloads need it")
    else:
        largest = 128 if quick else 512
        sizes = ss.vllm_sizes(largest)
        clocks = make_clocks(torch)
        for name, build in _set_workloads(quick, torch, largest):
            _set_workload_rows(section, name, build, sizes, quick, torch, clocks)
            _settle_both(torch)
    for gib in (1,) if quick else (1, 8):
        _pool_sleep_rows(section, gib, cycles=5)


def _set_workload_rows(section, name, build, sizes, quick, torch, clocks):
    """One workload: both contenders' capture rows, the replay rows, and for
    the MLP the padding-waste and sleep/wake rows; every set is reset after."""
    import serving_set as ss
    largest = sizes[-1]
    cap_case = f"capture {len(sizes)} sizes ({sizes[0]}..{largest}), {name}"
    try:
        step, samples, make_args = build()
        step(*samples)                                   # both warmed up before either capture
        _sync_both(torch)
    except Exception as exc:
        record(section, cap_case, "workload", error=f"{type(exc).__name__}: {exc}"[:200])
        return
    checks = sorted({1, 3, 100 if 100 < largest else largest - 1, largest})
    state = {}
    try:
        for library, make in ((SET_TP, lambda: tp.cuda.GraphSet(step, samples, sizes, progress=False)),
                              (SET_PT, lambda: ss.VllmStyleGraphs(torch, step, samples, sizes))):
            _capture_contender(section, cap_case, library, make, torch, step, make_args, checks, state)
        caps = {r["library"]: r for r in RESULTS if (r["section"], r["case"]) == (section, cap_case)}
        a, b = caps.get(SET_TP, {}), caps.get(SET_PT, {})
        if a.get("capture_ms") and b.get("capture_ms"):
            a["speed_vs_torch"] = b["capture_ms"] / a["capture_ms"]
            memory = f"{a['reserved_mib'] / b['reserved_mib']:.2f}" if b["reserved_mib"] > 0 else "-"
            a["note"] += (f"; tp/PT time {a['capture_ms'] / b['capture_ms']:.2f} (target <= 0.5), "
                          f"memory {memory} (target <= 1)")
        good = {lib: s for lib, s in state.items() if not caps.get(lib, {}).get("error")}
        _set_replay_rows(section, name, good, sizes, quick, clocks)
        gs = good.get(SET_TP)
        if name.startswith("MLP"):
            mean, worst, at = ss.padding_waste(gs.size_for if gs is not None else
                                               (lambda n: ss.size_for(sizes, n)), largest)
            record(section, f"padding waste, n = 1..{largest} uniform, {len(sizes)} sizes", "both (same sizes)",
                   rate=mean * 100, unit="% mean", note=f"mean {mean:.2%}, max {worst:.1%} at n={at}")
            if gs is not None:
                _sleep_row(section, f"sleep/wake: {name} GraphSet ({len(sizes)} sizes)", SET_TP, 5,
                           _set_sleep_cycle(gs, step, make_args, np.random.default_rng(13), torch))
    finally:
        for s in state.values():
            if getattr(s, "asleep", False):
                s.wake()
            s.reset()
        state.clear()


def _set_replay_rows(section, name, sets, sizes, quick, clocks):
    """GPU time of one replay of each set's graph at up to 8 sizes, the
    contenders' rounds interleaved; tp/PT on tensorplay's row."""
    rounds, target_ms = (5, 5.0) if quick else (15, 20.0)
    clock = {SET_TP: clocks["tensorplay"], SET_PT: clocks["PyTorch"]}
    graphs = {lib: s.graphs for lib, s in sets.items()}
    for size in [s for s in (1, 4, 8, 32, 64, 128, 256, 512) if s in sizes] if graphs else ():
        case = f"{name}: replay batch {size}"

        @guarded(section, case, " / ".join(graphs))
        def _time():
            timed = gpu_per_call([(lib, g[size].replay, clock[lib]) for lib, g in graphs.items()], rounds,
                                 target_ms)
            ratio = timed[SET_TP][0] / timed[SET_PT][0] if len(timed) == 2 else None
            for lib, (gpu_us, host_us, behind) in timed.items():
                note = [f"tp/PT GPU time {ratio:.3f} (target <= 1.02)"] if lib == SET_TP and ratio else []
                if behind:
                    note.append("host fell behind: GPU may have idled")
                record(section, case, lib, host_us=host_us, gpu_us=gpu_us, note="; ".join(note) or None)
                if lib == SET_TP and ratio:
                    RESULTS[-1]["speed_vs_torch"] = 1 / ratio


# ---------------------------------------------------------------- 10. random numbers

RANDOM_N = 64 * MI            # rand / randn GPU time
RANDOM_GRAPH_N = 1 * MI       # the graph whose replay host time is measured


def _moments_error(y, mean, std):
    """None when ``y`` (a tensor of either library) has about the mean and
    standard deviation of its distribution, else why not. The values differ
    from PyTorch's by design (other generators), so they are not compared."""
    m, s = float(y.mean().item()), float(y.std().item())
    if abs(m - mean) > 1e-3 or abs(s - std) > 1e-3:
        return f"wrong distribution: mean {m:.5f} (want {mean:.5f}), std {s:.5f} (want {std:.5f}); not timed"
    return None


def random_rows(quick, torch, repeats, calls):
    """rand, randn and exponential_ of 64 Mi float32: GPU time per call against PyTorch's
    (CUDA events around back-to-back calls, as the work section; each
    library's output checked for its distribution's moments first). Then the
    host time per replay of a graph drawing ``x = rand(1 Mi) * 2``, beside
    the same graph without the random op: PyTorch's replay first updates its
    generator's offset on the host and copies it to the device, tensorplay's
    kernels advance the offset on the device themselves."""
    section = "random"
    clocks = make_clocks(torch)
    rounds, target_ms = (5, 10.0) if quick else (15, 25.0)
    n = RANDOM_N
    libraries = [("tensorplay", tp)] + ([("PyTorch", torch)] if torch is not None else [])
    def drawing(fname):
        return lambda lib, g: (lambda: getattr(lib, fname)(n, device="cuda", generator=g))

    def exponential(lib, g):
        x = lib.empty(n, device="cuda")
        return lambda: x.exponential_(generator=g)

    for case, make, mean, std in (("rand 64Mi float32", drawing("rand"), 0.5, 1 / math.sqrt(12)),
                                  ("randn 64Mi float32", drawing("randn"), 0.0, 1.0),
                                  ("exponential_ 64Mi float32 (no target)", exponential, 1.0, 1.0)):
        fns = {}
        for name, lib in libraries:
            @guarded(section, case, name)
            def _build():
                gen = lib.Generator("cuda").manual_seed(0)
                fn = make(lib, gen)
                for _ in range(3):                     # compile, plan, fill caches
                    y = fn()
                lib.cuda.synchronize()
                wrong = _moments_error(y, mean, std)
                if wrong:
                    raise RuntimeError(wrong)
                fns[name] = fn
        timed = gpu_per_call([(name, fn, clocks[name]) for name, fn in fns.items()], rounds, target_ms)
        for name, (gpu_us, host_us, behind) in timed.items():
            record(section, case, name, host_us=host_us, gpu_us=gpu_us, rate=n * 4 / gpu_us / 1e3, unit="GB/s",
                   note="host fell behind: GPU may have idled" if behind else None)
        if len(timed) == 2:
            set_speed(section, case, timed["PyTorch"][0] / timed["tensorplay"][0])
        gc.collect()

    m = RANDOM_GRAPH_N
    for case, with_random in ((f"replay host time: x = rand({m // MI}Mi) * 2", True),
                              (f"replay host time: x = y * 2 ({m // MI}Mi, no random op)", False)):
        contenders = []

        @guarded(section, case, "tensorplay replay()")
        def _tp_graph():
            gen = tp.Generator("cuda").manual_seed(1)
            src = tp.ones(m, device="cuda")

            def step():
                return (tp.rand(m, device="cuda", generator=gen) if with_random else src) * 2
            step()                                     # compile and plan before the capture
            tp.cuda.synchronize()
            g = tp.cuda.CUDAGraph()
            with tp.cuda.graph(g):
                out = step()
            g.replay()
            first = out.cpu().numpy().copy()
            g.replay()
            if with_random and np.array_equal(first, out.cpu().numpy()):
                raise RuntimeError("two replays drew the same numbers; not timed")
            contenders.append(("tensorplay replay()", _loop(g.replay), tp.cuda.synchronize))

        @guarded(section, case, "PyTorch CUDAGraph.replay()")
        def _torch_graph():
            src = torch.ones(m, device="cuda")

            def step():
                return (torch.rand(m, device="cuda") if with_random else src) * 2
            tg, _ = torch_graph(torch, step)
            contenders.append(("PyTorch CUDAGraph.replay()", _loop(tg.replay), torch.cuda.synchronize))

        if contenders:
            host = interleaved_host(contenders, calls, repeats)
            for name, _, _ in contenders:
                record(section, case, name, host_us=host[name])
            if len(host) == 2:
                speed = host["PyTorch CUDAGraph.replay()"] / host["tensorplay replay()"]
                set_speed(section, case, speed)
        gc.collect()


# ---------------------------------------------------------------- 11. decode loop (examples/decode_loop.py)

def decode_rows(quick, torch):
    """A transformer's decode loop, four ways (examples/decode_loop.py's
    measure()): models small and gpt2-small at batch 1 and 8, max_len 128
    and 3 generations per method with --quick (256 and 10 without). A row
    per method: host us = host CPU us per generated token, latency us = wall
    time of one generation, gpu_us = one step's GPU time (method 2's graph),
    rate = useful tokens/s, the rest in the note; then the GPU time per step
    of the unrolled and WHILE graphs, and the transformers capture probe."""
    section = "decode"
    if torch is None:
        record(section, "all", "PyTorch", error="PyTorch is not installed: the decode section needs it")
        return
    examples = os.path.join(os.path.dirname(HERE), "examples")
    sys.path.insert(0, examples)
    try:
        import decode_loop
    finally:
        sys.path.remove(examples)
    max_len, generations = (128, 3) if quick else (256, 10)
    for name in ("small", "gpt2-small"):
        for batch in (1, 8):
            case = f"{name} b{batch} L{max_len}"
            try:
                res = decode_loop.measure(decode_loop.MODELS[name], batch, max_len, generations, check_every=8,
                                          log=lambda _line: None)
            except Exception as exc:    # reported, not fatal
                record(section, case, "all methods", error=f"{type(exc).__name__}: {exc}"[:200])
                continue
            for r in res["rows"]:
                note = "-"
                if r["tok_s"] is not None:
                    note = (f"{r['tok_s']:.0f} useful tok/s, GPU busy {r['busy']:.0%}, {r['steps']:.0f} steps"
                            + (f" (+{r['overshoot_mean']:.1f} past the end)"
                               if r["method"] == "torch_graph_every_k" else "")
                            + f", tok/s x{r['tok_s_vs_2']:.2f} and CPU x{r['cpu_vs_2']:.2f} vs method 2")
                record(section, case, r["label"].replace("every k", "every 8"), host_us=r["cpu_us_tok"],
                       latency_us=None if r["wall_ms"] is None else r["wall_ms"] * 1e3, gpu_us=res["step_gpu_us"],
                       rate=r["tok_s"], unit="tok/s", note=note, extra=r, error=r["error"])
            w = res.get("while")
            if w:
                def us(key):
                    return "-" if w.get(key) is None else f"{w[key]:.1f}"
                record(section, case, "GPU us/step: WHILE iteration vs unrolled", gpu_us=w["tp_while_iteration_us"],
                       extra=w, note=(f"torch graph {us('torch_graph_step_us')}, tp unrolled "
                                      f"{us('tp_unrolled_step_us')}, + predicate {us('tp_unrolled_step_pred_us')}, "
                                      f"WHILE iteration {us('tp_while_iteration_us')} ({w['unroll']} steps)"))
            for key, err in res["errors"].items():
                if key not in decode_loop.METHODS:
                    record(section, case, key, error=err[:200])
            if res["mismatches"]:
                record(section, case, "token check",
                       error=f"tokens differ from method 2's: {res['mismatches'][:3]}"[:200])
            torch.cuda.empty_cache()
    for p in decode_loop.probe_transformers():   # last: a failed capture may leave junk behind
        record(section, "transformers", f"{p['cache']}, {p['capturer']}".strip(", ") or p["case"],
               note=p["result"][:300], extra=p)


# ---------------------------------------------------------------- output

GPU_SECTIONS = ("work", "serving", "serving_set", "random", "gaps")
WORK_LEGEND = """\
GPU us: CUDA events around 20-100 back-to-back calls queued behind a spin kernel (so the GPU runs them
  without waiting on the host), median over rounds after warm-up; host us: time to enqueue one call;
  rate: the row's FLOPs (TFLOP/s) or bytes read + written (GB/s) over GPU us; tp/PT: PyTorch's GPU time
  over tensorplay's (>1: tensorplay faster). tensorplay's result is checked against PyTorch's once per row
  and a wrong one is not timed. Serving capture: wall time of all captures, reserved growth over the
  library's baseline (weights and inputs allocated, each batch size warmed up, cache emptied).
  Random: rand/randn are checked for their distribution's mean and std, not against PyTorch (other
  generators); the replay rows' host us is the host time per replay and tp/PT PyTorch's over tensorplay's."""


def print_table():
    """The timing table, the GPU work and serving tables, then the memory table."""
    timed = [r for r in RESULTS if r["section"] not in ("memory",) + GPU_SECTIONS]
    if timed:
        print_timing_table(timed)
    if any(r["section"] == "rebind" for r in timed):
        print(REBIND_LEGEND)
    print_gpu_tables([r for r in RESULTS if r["section"] in GPU_SECTIONS])
    print_memory_table([r for r in RESULTS if r["section"] == "memory"])


def print_timing_table(rows):
    print(f"{'section':<9} {'case':<20} {'library':<52} {'host us':>10} {'latency us':>11}  note")
    for r in rows:
        h = f"{r['host_us']:.2f}" if r["host_us"] is not None else "-"
        lat = f"{r['latency_us']:.1f}" if r["latency_us"] is not None else "-"
        note = r["error"] or r["note"] or (f"{r['extra']:.0f} launches/s" if r["extra"] else "")
        print(f"{r['section']:<9} {r['case']:<20} {r['library']:<52} {h:>10} {lat:>11}  {note}")


def _cell(value, fmt):
    return format(value, fmt) if value is not None else "-"


def print_gpu_tables(rows):
    """Work and serving rows: GPU time, rate, host time, speed against PyTorch;
    serving's capture rows as capture time and reserved growth."""
    if not rows:
        return
    captures = [r for r in rows if r["section"] in ("serving", "serving_set") and r["case"].startswith("capture")]
    sleeps = [r for r in rows if r["section"] == "serving_set" and r["case"].startswith("sleep/wake")]
    timed = [r for r in rows if r not in captures and r not in sleeps]
    print()
    print(f"{'section':<11} {'case':<64} {'library':<28} {'GPU us':>10} {'rate':>9} {'unit':<7} "
          f"{'host us':>8} {'tp/PT':>6}  note")
    for r in timed:
        note = "; ".join(x for x in (r["error"], r["note"]) if x)
        print(f"{r['section']:<11} {r['case']:<64} {r['library']:<28} {_cell(r['gpu_us'], '.2f'):>10} "
              f"{_cell(r['rate'], '.1f'):>9} {r['unit'] or '':<7} {_cell(r['host_us'], '.2f'):>8} "
              f"{_cell(r['speed_vs_torch'], '.2f'):>6}  {note}")
    if captures:
        print()
        print(f"{'serving capture':<80} {'library':<58} {'wall ms':>9} {'MiB':>8} {'tp/PT':>6}  note")
        for r in captures:
            note = "; ".join(x for x in (r["error"], r["note"]) if x)
            print(f"{r['case']:<80} {r['library']:<58} {_cell(r['capture_ms'], '.1f'):>9} "
                  f"{_cell(r['reserved_mib'], '.1f'):>8} {_cell(r['speed_vs_torch'], '.2f'):>6}  {note}")
    if sleeps:
        print_sleep_table(sleeps)
    print(WORK_LEGEND)
    if any(r["section"] == "serving_set" for r in rows):
        print(SERVING_SET_LEGEND)


def print_sleep_table(rows):
    """serving_set's sleep/wake rows: the medians kept in ``extra``."""
    print()
    print(f"{'sleep/wake (medians)':<64} {'library':<22} {'mapped MiB':>10} {'given':>7} {'freed MiB':>9} "
          f"{'sleep ms':>8} {'wake ms':>8} {'1st call ms':>11}  note")
    for r in rows:
        e = r["extra"] or {}
        note = "; ".join(x for x in (r["error"], r["note"]) if x)
        print(f"{r['case']:<64} {r['library']:<22} {_cell(e.get('mapped_mib'), '.1f'):>10} "
              f"{_cell(e.get('given_share'), '.1%'):>7} {_cell(e.get('freed_mib'), '.1f'):>9} "
              f"{_cell(e.get('sleep_ms'), '.2f'):>8} {_cell(e.get('wake_ms'), '.2f'):>8} "
              f"{_cell(e.get('first_ms'), '.2f'):>11}  {note}")


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
    rows = [r for r in RESULTS if r["section"] in ("replay", "staging", "rebind") and r["host_us"] is not None]
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


# memory first, then serving and serving_set (they measure memory too), before the others allocate
SECTIONS = ("memory", "serving", "serving_set", "work", "gaps", "random", "replay", "staging", "rebind", "while", "branch",
            "threads", "capture", "recapture", "eager", "decode")


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


def cublaslt_version():
    """tensorplay's loaded cuBLASLt (cublasLtGetVersion), None when not loaded."""
    try:
        from tensorplay._ops import blas as _blas
        return _blas.version()
    except Exception:
        return None


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
    if "serving" in sections:       # measures reserved memory: before work's large tensors are cached
        serving_rows(quick, torch)
    if "serving_set" in sections:   # device memory too: before work's large tensors are cached
        serving_set_rows(quick, torch)
    if "work" in sections:
        work_rows(quick, torch)
    if "gaps" in sections:
        gap_rows(quick, torch)
    if "random" in sections:
        random_rows(quick, torch, repeats, calls)
    if "replay" in sections:
        replay_rows([1, 10, 100] if quick else [1, 10, 100, 1000], calls, repeats, torch, cp)
    if "staging" in sections:
        staging_rows([1, 8, 32, 128], calls, repeats, torch)
    if "rebind" in sections:
        rebind_rows([1, 8, 32], [4 << 10, 64 * MIB], calls, repeats, torch)
    if "while" in sections:
        while_rows([10, 1000], repeats)
    if "branch" in sections:
        branch_rows(repeats)
    if "threads" in sections:
        thread_rows([1, 2, 4, 8], 2000 if quick else 20000)
    if "capture" in sections:
        capture_rows([10, 100] if quick else [10, 100, 1000], 3 if quick else 7, torch)
    if "recapture" in sections:
        recapture_rows([100, 1000], 7 if quick else 21)
    if "eager" in sections:
        eager_rows(calls, repeats, torch, cp)
    if "decode" in sections:        # last: its transformers probe may leave a failed capture behind
        decode_rows(quick, torch)
    elapsed = time.perf_counter() - t0
    meta = {"date": datetime.date.today().isoformat(), "gpu": tp.cuda.get_device_name(0),
            "driver": ".".join(map(str, tp.cuda.driver_version())), "tensorplay": tp.__version__,
            "torch": getattr(torch, "__version__", None), "cupy": getattr(cp, "__version__", None),
            "python": sys.version.split()[0], "elapsed_s": round(elapsed, 1), "quick": quick,
            "sections": sections, "cublaslt": cublaslt_version()}
    print_table()
    print(json.dumps(meta))
    with open(args.out + ".json", "w") as f:
        json.dump({"meta": meta, "results": RESULTS}, f, indent=1)
    write_chart(args.out + ".png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
