# SPDX-License-Identifier: Apache-2.0
"""Where the host time of a capture goes (issue 22, capture speed).

Runs on the GPU machine, from ``benchmarks/``::

    python profile_capture.py [--nodes 1000] [--repeats 20] [--out FILE]

Prints, for a capture of ``--nodes`` in-place adds on a one-element tensor
(the workload of compare.py's ``capture`` section):

- the median host time per op eagerly, per op inside a capture (begin to
  the last op), and of capture_end (instantiate and upload), for tensorplay
  and for PyTorch in the same process;
- capture_end's driver calls one by one (cuStreamEndCapture,
  cuGraphInstantiate, cuGraphUpload), timed through cuda.bindings on a raw
  capture of the same ops, and PyTorch's graph of them instantiated the
  same way (``keep_graph=True``): whether the two graphs cost the driver
  the same;
- a cProfile of one capture, sorted by own time, so the per-op front-end
  cost is written down function by function.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import pstats
import statistics
import struct
import time

import tensorplay as tp
from tpbench.common import median_host_us


def _phases(x, new_graph, sync, side_stream, n, repeats):
    """Median host us of ``n`` x.add_(1): per op eagerly, per op inside a
    capture (capture_begin to the last op), of capture_end, and of the first
    replay() call (an executable not uploaded yet uploads then)."""
    def ops():
        for _ in range(n):
            x.add_(1)

    eager = median_host_us(ops, repeats, sync)
    captured, ends, firsts = [], [], []
    for _ in range(repeats):
        g = new_graph()
        sync()
        with side_stream():
            t0 = time.perf_counter()
            g.capture_begin()
            ops()
            t1 = time.perf_counter()
            g.capture_end()
            t2 = time.perf_counter()
        g.replay()
        t3 = time.perf_counter()
        sync()
        captured.append((t1 - t0) * 1e6)
        ends.append((t2 - t1) * 1e6)
        firsts.append((t3 - t2) * 1e6)
        del g
    return {"eager per op": eager / n,
            "captured per op": statistics.median(captured) / n,
            "capture_end": statistics.median(ends),
            "first replay": statistics.median(firsts)}


def tensorplay_phases(n, repeats):
    x = tp.zeros(1, device="cuda")
    x.add_(1)
    # capture_begin takes a side stream itself
    phases = _phases(x, tp.cuda.CUDAGraph, tp.cuda.synchronize, contextlib.nullcontext, n, repeats)
    phases.update(launch_floors(x, n, repeats))
    return phases


def launch_floors(x, n, repeats):
    """Per op inside a capture without the front end: the cached launch plan
    of x.add_(1) (what the front end ends in), and the bare Function.launch
    of a packed buffer (cuLaunchKernel's own capture cost, nearly)."""
    from tensorplay._kernels import cache
    from tensorplay._ops import elementwise as _elementwise
    plan = cache.plans.get(_elementwise._plan_key("add", (x, 1), x, True))
    lp = plan.launch_plan
    params = struct.pack(lp.fmt, x.data_ptr(), x.data_ptr(), lp.n, 1) + lp.geom
    f, grid, block = lp.f, lp.grid, lp.block
    rows = {}
    for label, op in (("  plan launch only", lambda: lp.launch_operands(x, (x, 1), plan.tensor_pos, plan.scalar_pos)),
                      ("  Function.launch", lambda: f.launch(grid, block, params))):
        per = []
        for _ in range(repeats):
            g = tp.cuda.CUDAGraph()
            tp.cuda.synchronize()
            g.capture_begin()
            t0 = time.perf_counter()
            for _ in range(n):
                op()
            per.append((time.perf_counter() - t0) * 1e6)
            g.capture_end()
            del g
        rows[label] = statistics.median(per) / n
    return rows


def torch_phases(n, repeats):
    import torch
    x = torch.zeros(1, device="cuda")
    x.add_(1)
    return _phases(x, torch.cuda.CUDAGraph, torch.cuda.synchronize,
                   lambda: torch.cuda.stream(torch.cuda.Stream()), n, repeats)


def _driver_ok(result):
    err = result[0] if isinstance(result, tuple) else result
    if int(err) != 0:
        raise RuntimeError(f"driver call failed: {err}")
    return result[1] if isinstance(result, tuple) and len(result) > 1 else None


def _instantiate_and_upload(graph, stream, repeats):
    """Median host us of cuGraphInstantiate and of the cuGraphUpload call of ``graph``."""
    from cuda.bindings import driver as cu
    inst, up = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        ex = _driver_ok(cu.cuGraphInstantiate(graph, 0))
        t1 = time.perf_counter()
        _driver_ok(cu.cuGraphUpload(ex, stream))      # the host's part: the call returns before the GPU's
        t2 = time.perf_counter()
        _driver_ok(cu.cuStreamSynchronize(stream))
        inst.append((t1 - t0) * 1e6)
        up.append((t2 - t1) * 1e6)
        _driver_ok(cu.cuGraphExecDestroy(ex))
    return statistics.median(inst), statistics.median(up)


def driver_breakdown(n, repeats):
    """{row: (tensorplay us, PyTorch us or None)} of capture_end's driver calls."""
    from cuda.bindings import driver as cu
    x = tp.zeros(1, device="cuda")
    x.add_(1)
    s = tp.cuda.Stream()
    h = cu.CUstream(s.handle)
    ends = []
    graph = None
    for _ in range(repeats):
        tp.cuda.synchronize()
        _driver_ok(cu.cuStreamBeginCapture(h, cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED))
        with tp.cuda.stream(s):
            for _ in range(n):
                x.add_(1)
        t0 = time.perf_counter()
        g = _driver_ok(cu.cuStreamEndCapture(h))
        ends.append((time.perf_counter() - t0) * 1e6)
        if graph is not None:
            _driver_ok(cu.cuGraphDestroy(graph))
        graph = g
    inst, up = _instantiate_and_upload(graph, h, repeats)
    _driver_ok(cu.cuGraphDestroy(graph))
    rows = {"cuStreamEndCapture": [statistics.median(ends), None],
            "cuGraphInstantiate": [inst, None], "cuGraphUpload": [up, None]}
    try:
        import torch
        y = torch.zeros(1, device="cuda")
        y.add_(1)
        tg = torch.cuda.CUDAGraph(keep_graph=True)
        with torch.cuda.graph(tg):
            for _ in range(n):
                y.add_(1)
        ts = torch.cuda.Stream()
        tinst, tup = _instantiate_and_upload(cu.CUgraph(tg.raw_cuda_graph()), cu.CUstream(ts.cuda_stream), repeats)
        rows["cuGraphInstantiate"][1], rows["cuGraphUpload"][1] = tinst, tup
    except Exception as exc:                # an older torch without keep_graph
        print(f"PyTorch's raw graph not timed: {type(exc).__name__}: {exc}")
    return rows


def _row(key, value, other):
    ratio = f"  tp/PT {value / other:.2f}" if other else ""
    return f"  {key:18s} tensorplay {value:9.2f}" + (f"  PyTorch {other:9.2f}" if other else "") + ratio


def profile_one_capture(n, top):
    x = tp.zeros(1, device="cuda")
    x.add_(1)
    g = tp.cuda.CUDAGraph()
    prof = cProfile.Profile()
    tp.cuda.synchronize()
    prof.enable()
    with tp.cuda.graph(g):
        for _ in range(n):
            x.add_(1)
    prof.disable()
    g.reset()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(top)
    return buf.getvalue()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--top", type=int, default=30, help="functions in the profile")
    ap.add_argument("--out", help="also write the report here")
    args = ap.parse_args()
    if not tp.cuda.is_available():
        raise SystemExit("profile_capture.py needs a CUDA GPU: none was found")
    lines = [f"capture of {args.nodes} x.add_(1), medians over {args.repeats} (host us)"]
    ours = tensorplay_phases(args.nodes, args.repeats)
    try:
        theirs = torch_phases(args.nodes, args.repeats)
    except ImportError:
        theirs = {}
    for key, value in ours.items():
        lines.append(_row(key, value, theirs.get(key)))
    lines.append("capture_end's driver calls (host us; PyTorch: its graph of the same ops)")
    for key, (value, other) in driver_breakdown(args.nodes, args.repeats).items():
        lines.append(_row(key, value, other))
    lines.append("")
    lines.append(profile_one_capture(args.nodes, args.top))
    report = "\n".join(lines)
    print(report)
    if args.out:
        with open(args.out, "w") as f:
            f.write(report)


if __name__ == "__main__":
    main()
