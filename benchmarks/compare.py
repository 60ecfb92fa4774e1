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

The sections are modules of tpbench/ (their shared helpers in
tpbench/common.py); this script picks them and writes the results.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import time

import tensorplay as tp
from tpbench.capture import capture_rows, recapture_rows
from tpbench.common import MIB, RESULTS, write_json
from tpbench.control_flow import branch_rows, while_rows
from tpbench.decode import decode_rows
from tpbench.gaps import gap_rows
from tpbench.host_calls import eager_rows, replay_rows, thread_rows
from tpbench.inputs import rebind_rows, staging_rows
from tpbench.memory import memory_rows
from tpbench.random_numbers import random_rows
from tpbench.report import print_table, write_chart
from tpbench.serving import serving_rows
from tpbench.serving_set import serving_set_rows
from tpbench.work import work_rows

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
    write_json(args.out + ".json", meta, RESULTS)
    write_chart(args.out + ".png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
