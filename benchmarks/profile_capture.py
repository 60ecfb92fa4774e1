# SPDX-License-Identifier: Apache-2.0
"""Where the host time of a capture goes (issue 22, capture speed).

Runs on the GPU machine, from ``benchmarks/``::

    python profile_capture.py [--nodes 1000] [--repeats 20] [--out FILE]

Prints, for a capture of ``--nodes`` in-place adds on a one-element tensor
(the workload of compare.py's ``capture`` section):

- the median host time per op eagerly, per op inside a capture (begin to
  the last op), and of capture_end (instantiate and upload), for tensorplay
  and for PyTorch in the same process;
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
import time

import tensorplay as tp


def _median_us(fn, repeats, sync=None):
    per = []
    for _ in range(repeats):
        (sync or tp.cuda.synchronize)()
        t0 = time.perf_counter()
        fn()
        per.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(per)


def _phases(x, new_graph, sync, side_stream, n, repeats):
    """Median host us of ``n`` x.add_(1): per op eagerly, per op inside a
    capture (capture_begin to the last op), and of capture_end."""
    def ops():
        for _ in range(n):
            x.add_(1)

    eager = _median_us(ops, repeats, sync)
    captured, ends = [], []
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
        captured.append((t1 - t0) * 1e6)
        ends.append((t2 - t1) * 1e6)
        del g
    return {"eager per op": eager / n,
            "captured per op": statistics.median(captured) / n,
            "capture_end": statistics.median(ends)}


def tensorplay_phases(n, repeats):
    x = tp.zeros(1, device="cuda")
    x.add_(1)
    # capture_begin takes a side stream itself
    return _phases(x, tp.cuda.CUDAGraph, tp.cuda.synchronize, contextlib.nullcontext, n, repeats)


def torch_phases(n, repeats):
    import torch
    x = torch.zeros(1, device="cuda")
    x.add_(1)
    return _phases(x, torch.cuda.CUDAGraph, torch.cuda.synchronize,
                   lambda: torch.cuda.stream(torch.cuda.Stream()), n, repeats)


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
        other = theirs.get(key)
        ratio = f"  tp/PT {value / other:.2f}" if other else ""
        lines.append(f"  {key:16s} tensorplay {value:9.2f}" + (f"  PyTorch {other:9.2f}" if other else "") + ratio)
    lines.append("")
    lines.append(profile_one_capture(args.nodes, args.top))
    report = "\n".join(lines)
    print(report)
    if args.out:
        with open(args.out, "w") as f:
            f.write(report)


if __name__ == "__main__":
    main()
