# SPDX-License-Identifier: Apache-2.0
"""Where a capture's time goes, phase by phase, beside PyTorch's (issue 42).

Runs on the GPU machine, from ``benchmarks/``::

    python profile_capture_phases.py [--repeats 200] [--nodes 1 10 100]

For n in-place adds on one float, median host us of:

- the whole capture + instantiate through the public API (tensorplay with
  PDL on and off, PyTorch's ``torch.cuda.graph``);
- the driver's share, timed on each library's captured graph (tensorplay's
  ``graph_handle``, PyTorch's ``raw_cuda_graph()``): cuGraphInstantiate,
  cuGraphUpload, instantiate with the upload flag in one call, and
  cuGraphExecDestroy;
- what is left for the library's front end (whole capture minus the
  driver's instantiate and upload).

A graph with programmatic edges (PDL) may cost the driver more to
instantiate: the PDL rows answer that on the machine at hand.

``--serving``: the serving section's 67 graphs of the MLP step (batch
1..512, largest first, one pool): median us per graph of the step eagerly,
the step inside a capture, capture_end; then a cProfile of one set's
capture sorted by own time.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics
import time

from cuda.bindings import driver

import tensorplay as tp
from tpbench.capture import tp_capture_adds


def _check(result):
    err = result[0] if isinstance(result, tuple) else result
    if err != driver.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"driver call failed: {err}")
    return result[1] if isinstance(result, tuple) and len(result) == 2 else None


def driver_phases(graph_handle, stream_handle, repeats):
    """Median us of instantiate, upload, instantiate+upload flag, destroy on one CUgraph."""
    graph = driver.CUgraph(graph_handle)
    stream = driver.CUstream(stream_handle)
    inst, upload, fused, destroy = [], [], [], []
    params = driver.CUDA_GRAPH_INSTANTIATE_PARAMS()
    params.flags = driver.CUgraphInstantiate_flags.CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD
    params.hUploadStream = stream
    for _ in range(repeats):
        _check(driver.cuStreamSynchronize(stream))
        t0 = time.perf_counter()
        ex = _check(driver.cuGraphInstantiate(graph, 0))
        t1 = time.perf_counter()
        _check(driver.cuGraphUpload(ex, stream))
        t2 = time.perf_counter()
        _check(driver.cuStreamSynchronize(stream))
        t3 = time.perf_counter()
        _check(driver.cuGraphExecDestroy(ex))
        t4 = time.perf_counter()
        ex = _check(driver.cuGraphInstantiateWithParams(graph, params))
        t5 = time.perf_counter()
        _check(driver.cuStreamSynchronize(stream))
        _check(driver.cuGraphExecDestroy(ex))
        inst.append((t1 - t0) * 1e6)
        upload.append((t2 - t1) * 1e6)
        destroy.append((t4 - t3) * 1e6)
        fused.append((t5 - t4) * 1e6)
    return {k: statistics.median(v) for k, v in
            (("instantiate", inst), ("upload", upload), ("instantiate+upload flag", fused), ("exec destroy", destroy))}


def torch_capture(tx, n, keep=False):
    import torch  # on the GPU machine only: CI imports this module without PyTorch
    g = torch.cuda.CUDAGraph(keep_graph=keep) if keep else torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(n):
            tx.add_(1)
    return g


def serving_profile(top):
    from tpbench.common import to_library
    from tpbench.workloads import SERVING_BATCHES, serving_weights, tp_mlp_step
    w = {k: to_library(tp, v, "bfloat16") for k, v in serving_weights().items()}
    step = tp_mlp_step(w)
    x = w["x"]
    for b in SERVING_BATCHES:
        step(x[:b])
    tp.cuda.synchronize()
    eager, inside, ends, begins = [], [], [], []

    def capture_set(timed):
        pool = tp.cuda.graph_pool_handle()
        graphs = []
        for b in sorted(SERVING_BATCHES, reverse=True):
            g = tp.cuda.CUDAGraph()
            t0 = time.perf_counter()
            g.capture_begin(pool=pool)
            t1 = time.perf_counter()
            out = step(x[:b])
            t2 = time.perf_counter()
            g.capture_end()
            t3 = time.perf_counter()
            if timed:
                begins.append((t1 - t0) * 1e6)
                inside.append((t2 - t1) * 1e6)
                ends.append((t3 - t2) * 1e6)
            graphs.append((g, out))
        tp.cuda.synchronize()
        return graphs
    capture_set(False)
    for _ in range(3):
        t0 = time.perf_counter()
        capture_set(True)
        print(f"serving set: {(time.perf_counter() - t0) * 1e3:.2f} ms for {len(SERVING_BATCHES)} graphs")
    for b in SERVING_BATCHES:
        t0 = time.perf_counter()
        step(x[:b])
        eager.append((time.perf_counter() - t0) * 1e6)
    tp.cuda.synchronize()
    print(f"per graph, median us: step eagerly {statistics.median(eager):.1f}, capture_begin "
          f"{statistics.median(begins):.1f}, step inside the capture {statistics.median(inside):.1f}, "
          f"capture_end {statistics.median(ends):.1f}")
    pr = cProfile.Profile()
    pr.enable()
    capture_set(False)
    pr.disable()
    out = io.StringIO()
    pstats.Stats(pr, stream=out).sort_stats("tottime").print_stats(top)
    print(out.getvalue())


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=200)
    ap.add_argument("--nodes", type=int, nargs="+", default=[1, 10, 100])
    ap.add_argument("--serving", action="store_true", help="profile the serving set's capture instead")
    ap.add_argument("--top", type=int, default=40)
    args = ap.parse_args()
    if args.serving:
        serving_profile(args.top)
        return
    import torch
    x = tp.zeros(1, device="cuda")
    x.add_(1)
    tx = torch.zeros(1, device="cuda")
    tx.add_(1)
    stream = tp.cuda.Stream()
    print(f"{'nodes':>5} {'who':22} {'whole':>8} {'inst':>8} {'upload':>8} {'inst+up':>8} {'destroy':>8} "
          f"{'front end':>9}  (median host us)")
    for n in args.nodes:
        rows = []
        for pdl in (True, False):
            tp.backends.cuda.pdl.enabled = pdl
            for _ in range(10):
                tp_capture_adds(x, n).reset()

            def whole():
                tp.cuda.synchronize()
                t0 = time.perf_counter()
                g = tp_capture_adds(x, n)
                dt = (time.perf_counter() - t0) * 1e6
                g.reset()
                return dt
            w = statistics.median(whole() for _ in range(args.repeats))
            g = tp_capture_adds(x, n)
            ph = driver_phases(g.graph_handle, stream.handle, args.repeats)
            rows.append((f"tensorplay PDL {'on' if pdl else 'off'}", w, ph))
            g.reset()
        tp.backends.cuda.pdl.enabled = True
        for _ in range(10):
            torch_capture(tx, n)

        def torch_whole():
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            torch_capture(tx, n)
            return (time.perf_counter() - t0) * 1e6
        w = statistics.median(torch_whole() for _ in range(args.repeats))
        tg = torch_capture(tx, n, keep=True)
        ph = driver_phases(tg.raw_cuda_graph(), stream.handle, args.repeats)
        rows.append(("PyTorch torch.cuda.graph", w, ph))
        for who, w, ph in rows:
            front = w - ph["instantiate"] - (0 if who.startswith("PyTorch") else ph["upload"])
            print(f"{n:5d} {who:22} {w:8.1f} {ph['instantiate']:8.1f} {ph['upload']:8.1f} "
                  f"{ph['instantiate+upload flag']:8.1f} {ph['exec destroy']:8.1f} {front:9.1f}")
    print("front end: the whole capture less the driver's instantiate (and, for tensorplay, upload: "
          "PyTorch does not upload at capture end)")


if __name__ == "__main__":
    main()
