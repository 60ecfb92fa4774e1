# SPDX-License-Identifier: Apache-2.0
"""CUDAGraph.profile_nodes against Nsight Compute's per-kernel times (issue 46).

Run from benchmarks/ on the GPU machine::

    python profile_nodes_vs_ncu.py [--replays 20] [--json FILE]

Two graphs: the quick start's (examples/quickstart.py: 8 layers of a 256 x
256 matvec, tanh and a scaled add) and one decode step of
examples/decode_loop.py (model "small", batch 1, PyTorch's kernels captured
by tensorplay). For each, the profile's table, then per kernel name: the
profile's median us per execution, ncu's median gpu__time_duration of the
same kernels (``ncu --clock-control none --cache-control none
--graph-profiling node``, each
kernel node profiled alone, in a child process that builds the same graph),
and their ratio. Then the decode loop's WHILE graph: its per-iteration time
and iteration count. Without ncu on the PATH the comparison is skipped.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import shutil
import statistics
import subprocess
import sys
import traceback

import numpy as np

import tensorplay as tp
from tensorplay._graph.dot import demangle
from tpbench.common import decode_loop_module, event_latency

HERE = os.path.dirname(os.path.abspath(__file__))


def quickstart_graph():
    rng = np.random.default_rng(0)
    w = tp.tensor(rng.standard_normal((256, 256)).astype(np.float32) / 16, device="cuda")
    x = tp.tensor(rng.standard_normal(256).astype(np.float32), device="cuda")

    def step(x):
        h = x
        for _ in range(8):
            h = (w @ h).tanh() + 0.5 * h
        return h

    step(x)
    g = tp.cuda.CUDAGraph()
    with tp.cuda.graph(g):
        step(x)
    return g, (w, x)


def decode_graphs(while_too):
    import torch
    dl = decode_loop_module()
    model = dl.DecodeModel(dl.MODELS["small"], 1, 128)
    model.reset(1)
    model.step()
    model.update_keep_going()
    torch.cuda.synchronize()
    g = tp.cuda.CUDAGraph()
    with torch.no_grad(), tp.cuda.graph(g):
        model.step()
        model.update_keep_going()
    loop = dl.TensorplayWhileDecoder(model) if while_too else None
    return g, loop, model


def build(name, while_too=False):
    if name == "quickstart":
        g, keep = quickstart_graph()
        return g, None, keep
    g, loop, model = decode_graphs(while_too)
    return g, loop, model


def child(name, replays):
    """ncu's process: the same graph, replayed ``replays`` times."""
    g, _, keep = build(name)
    tp.cuda.synchronize()
    for _ in range(replays):
        g.replay()
    tp.cuda.synchronize()


def ncu_times(name, replays):
    """Kernel name -> ncu's gpu__time_duration (us) of each profiled node, or None without ncu."""
    tool = shutil.which("ncu")
    if tool is None:
        return None, "ncu not found"
    cmd = [tool, "--clock-control", "none", "--cache-control", "none", "--graph-profiling", "node",
           "--metrics", "gpu__time_duration.sum",
           "--print-kernel-base", "mangled", "--csv", "--print-units", "base",
           sys.executable, os.path.abspath(__file__), "--child", name, "--replays", str(replays)]
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=HERE, timeout=240)
    text = p.stdout[p.stdout.find('"ID"'):] if '"ID"' in p.stdout else ""
    if not text:
        return None, f"ncu gave no CSV (rc {p.returncode}): {(p.stderr or p.stdout)[-300:]}"
    out: dict[str, list[float]] = {}
    for row in csv.DictReader(io.StringIO(text)):
        if row.get("Metric Name") != "gpu__time_duration.sum":
            continue
        value = float(row["Metric Value"].replace(",", ""))
        unit = row.get("Metric Unit", "ns")
        us = value / 1e3 if unit in ("ns", "nsecond") else value * 1e3 if unit in ("ms", "msecond") else value
        out.setdefault(row["Kernel Name"], []).append(us)
    return out, None


def compare(name, replays, results):
    g, loop, keep = build(name, while_too=(name == "decode"))
    prof = g.profile_nodes(replays=replays)
    print(f"\n== {name}: {g.num_nodes} nodes")
    print(prof.table(top=12))
    by_name: dict[str, list[float]] = {}
    for n in prof.nodes:
        if n.kind == "kernel" and n.name:
            by_name.setdefault(n.name, []).append(n.us)
    ncu, why = ncu_times(name, 3)
    rows = []
    print(f"\n{'kernel':<60} {'nodes':>5} {'profile us':>10} {'ncu us':>8} {'ratio':>6}")
    for kname, values in sorted(by_name.items(), key=lambda kv: -sum(kv[1])):
        ours = statistics.median(values)
        theirs = statistics.median(ncu[kname]) if ncu and kname in ncu else None
        ratio = ours / theirs if theirs else None
        rows.append({"kernel": kname, "nodes": len(values), "profile_us": ours, "ncu_us": theirs, "ratio": ratio})
        label = demangle(kname)
        label = label if len(label) <= 58 else label[:55] + "..."
        print(f"{label:<60} {len(values):5d} {ours:10.2f} " +
              (f"{theirs:8.2f} {ratio:6.2f}" if theirs else f"{'-':>8} {'-':>6}"))
    if why:
        print(f"(no ncu comparison: {why})")
    entry = {"profile": prof.to_dict(), "kernels": rows, "ncu": why or "ok"}
    if loop is not None:
        # a replay runs the loop to its end and leaves it there: one profiled
        # replay from a fresh start, and one replay of the graph timed alike
        model = keep
        model.reset(1)
        tp.cuda.synchronize()
        lp = loop.graph.profile_nodes(replays=1, warmup=0)
        node = next(n for n in lp.nodes if n.iterations is not None)
        model.reset(1)
        whole_us = event_latency(tp, loop.graph.replay, 1)
        print(f"\n== decode WHILE graph, one generation: {node.iterations:g} iterations, "
              f"{node.per_iteration_us:.1f} us each (the body {node.body_us:.1f} us), {node.total_us:.0f} us in all; "
              f"the graph's replay {whole_us:.0f} us (events)")
        entry["while"] = {"iterations": node.iterations, "per_iteration_us": node.per_iteration_us,
                          "body_us": node.body_us,
                          "total_us": node.total_us, "replay_us": whole_us}
    results[name] = entry


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--replays", type=int, default=20)
    ap.add_argument("--json", default=None)
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child, args.replays)
        return
    if not tp.cuda.is_available():
        print(f"No CUDA GPU here ({tp.cuda.unavailable_reason()})")
        return
    print("GPU:", tp.cuda.get_device_name(0))
    results: dict = {}
    for name in ("quickstart", "decode"):
        try:
            compare(name, args.replays, results)
        except Exception as exc:         # one workload failing still reports the other
            traceback.print_exc(file=sys.stdout)
            print(f"{name}: failed: {type(exc).__name__}: {exc}")
            results[name] = {"error": f"{type(exc).__name__}: {exc}"}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
