# SPDX-License-Identifier: Apache-2.0
"""The gaps between dependent kernels: GPU time per replay of captured
graphs, tensorplay with programmatic dependent launch (PDL) on and off,
beside PyTorch's torch.cuda.graph of the same ops (and CuPy and cuda.core
for the tiny-node case).

Run on the GPU machine, from benchmarks/::

    python gaps.py [--quick] [--only tiny,chains,quickstart,mlp,while,nested] [--out gaps]

Cases:

- ``tiny``: 100 nodes each adding 1 to one float: tensorplay's elementwise
  kernel (PDL on and off), a one-thread kernel of the user's launched
  through tensorplay (``RawKernel``, as cuda.core's below), PyTorch, CuPy and
  cuda.core; GPU us per node.
- ``chains``: 10, 100 and 1000 elementwise ops (alternately ``mul_`` and
  ``add_``, in place) over 4 KiB, 1 MiB and 64 MiB.
- ``quickstart``: examples/quickstart.py's graph (8 layers of a 256 x 256
  matrix-vector product, tanh and an axpy).
- ``mlp``: 4 layers of width 1024 in bf16 at batch 1 and 64; each layer a
  cuBLASLt matmul, a bias add, a GELU (tanh form, one elementwise kernel)
  and a residual add; also with the bias and GELU fused into the matmul's
  epilogue (``tp.linear(..., activation="gelu")``).
- ``while``: a WHILE node of 1000 iterations of a two-op body (a counter
  add and the compare that sets the predicate), and of 200 iterations of a
  20-op body (18 more elementwise ops on 4 KiB), against the same bodies
  unrolled in one graph; GPU us per iteration.
- ``nested``: a graph of 10 child graph nodes, each a captured step of 10
  elementwise ops on 4 KiB (``step.replay()`` inside the outer capture),
  against the same 100 ops captured flat, with PDL on and off (a child
  graph node's edges are not programmatic: PDL stops at its boundary).

GPU time: CUDA events around back-to-back replays queued behind a spin
kernel (so the GPU never waits on the host), median over rounds that
alternate between contenders (``tpbench.common.gpu_per_call``).

``--floor`` replays each case's tensorplay graph once, after a marker
kernel naming it, for Nsight Compute: run under ``ncu --clock-control none
--metrics gpu__time_duration.sum --csv --log-file ncu.csv`` and then
``python gaps.py --floors-from ncu.csv --merge gaps.json`` adds each case's
floor (the sum of its kernels' own durations) to the results.

The cases are in tpbench/gaps.py (also compare.py's ``gaps`` section);
this script picks them and writes the results.
"""

from __future__ import annotations

import argparse
import json
import sys

import tensorplay as tp
from tpbench import gaps
from tpbench.common import gpu_and_torch, write_json


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--only", help=f"comma-separated, of {','.join(gaps.SECTIONS)}")
    ap.add_argument("--out", default="gaps")
    ap.add_argument("--floor", action="store_true", help="replay each floor case once, for ncu")
    ap.add_argument("--floors-from", metavar="CSV", help="ncu's CSV of a --floor run")
    ap.add_argument("--merge", metavar="JSON", help="with --floors-from: the results to add the floors to")
    args = ap.parse_args()
    torch, code = gpu_and_torch("the side-by-side rows time torch.cuda.graph")
    if args.floors_from:
        floors = gaps.floors_from(args.floors_from, args.quick)
        print(json.dumps(floors, indent=1))
        if args.merge:
            with open(args.merge) as f:
                data = json.load(f)
            data["floors_us"] = floors
            with open(args.merge, "w") as f:
                json.dump(data, f, indent=1)
        return 0
    if code is not None and not tp.cuda.is_available():
        return code
    if args.floor:
        gaps.run_floors(args.quick)
        return 0
    sections = gaps.SECTIONS if not args.only else [s for s in gaps.SECTIONS if s in args.only.split(",")]
    if torch is not None:
        torch.cuda.synchronize()
    # tensorplay's work, its events and the spin kernel on one stream of its
    # own, which CuPy and cuda.core can capture on too (not the legacy stream)
    with tp.cuda.stream(tp.cuda.Stream()):
        gaps.run(sections, args.quick, torch)
    gaps.print_gaps_table()
    meta = {"gpu": tp.cuda.get_device_name(0), "driver": ".".join(map(str, tp.cuda.driver_version())),
            "torch": getattr(torch, "__version__", None), "quick": args.quick, "sections": list(sections)}
    print(json.dumps(meta))
    write_json(args.out + ".json", meta, gaps.RESULTS)
    return 0


if __name__ == "__main__":
    sys.exit(main())
