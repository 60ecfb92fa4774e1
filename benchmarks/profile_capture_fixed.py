# SPDX-License-Identifier: Apache-2.0
"""The fixed host cost of one capture, and where it goes (issue 42).

Runs on the GPU machine, from ``benchmarks/``::

    python profile_capture_fixed.py [--repeats 200] [--top 30]

Each case runs in a fresh process, so what is imported is exactly what the
case names: capture + instantiate of 1 and 100 in-place adds (median host
us) with torch not imported, torch imported and foreign capture off, and on
(the default); CuPy imported too; without PyTorch under
CUDA_MODULE_LOADING=LAZY (what importing PyTorch sets) and with it under EAGER; PyTorch's own capture of the same in the
same process. Then a cProfile of the default case (torch imported, foreign
capture on), sorted by own time: what a capture pays for following PyTorch.
"""

from __future__ import annotations

import argparse
import os

from tpbench.common import run_fresh

CASE = r"""
import json, statistics, sys, time
imports, foreign, repeats, profile = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] == "1"
torch = None
if "torch" in imports:
    import torch
    torch.zeros(1, device="cuda").add_(1)
if "cupy" in imports:
    import cupy
    cupy.zeros(1).sum()
import tensorplay as tp
if foreign != "default":
    tp.cuda.set_foreign_capture(foreign == "on")
x = tp.zeros(1, device="cuda")
x.add_(1)
from tpbench.capture import capture_phases, tp_capture_adds, torch_capture_us

def capture(n):
    return tp_capture_adds(x, n)

def phases(n):
    # (begin, body, end) host us of one capture of n ops
    def body():
        for _ in range(n):
            x.add_(1)
    p = capture_phases(body)
    return p["begin"], p["body"], p["end"]

out = {}
for n in (1, 100):
    for _ in range(20):
        capture(n).reset()
    per = []
    for _ in range(repeats):
        tp.cuda.synchronize()
        t0 = time.perf_counter()
        g = capture(n)
        per.append((time.perf_counter() - t0) * 1e6)
        g.reset()
        del g
    out[f"tensorplay {n}"] = statistics.median(per)
    split = [phases(n) for _ in range(repeats)]
    out[f"split {n}"] = [statistics.median(s[i] for s in split) for i in range(3)]
    if torch is not None:
        out[f"torch {n}"] = torch_capture_us(torch, n, repeats)
if profile:
    import cProfile, io, pstats
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(repeats):
        capture(int(sys.argv[6])).reset()
    pr.disable()
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(int(sys.argv[5]))
    out["profile"] = s.getvalue()
print("RESULT" + json.dumps(out))
"""


def run_case(imports, foreign, repeats, profile=False, top=30, nodes=1, loading=None):
    """One case in a fresh process; ``loading``: CUDA_MODULE_LOADING for it
    (importing PyTorch sets LAZY where the variable is unset)."""
    env = dict(os.environ)
    if loading is not None:
        env["CUDA_MODULE_LOADING"] = loading
    r, failure = run_fresh(CASE, [imports, foreign, str(repeats), "1" if profile else "0", str(top), str(nodes)], env)
    if r is None:
        raise RuntimeError(f"case {imports}/{foreign} failed:\n{failure}")
    return r


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=200)
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--profile-nodes", type=int, default=1, help="ops of each profiled capture (default 1)")
    args = ap.parse_args()
    # the module-loading rows ask whether importing PyTorch (which sets
    # CUDA_MODULE_LOADING=LAZY) is what slows 100 captured ops down without following it
    cases = [("none", "default", None), ("none", "default", "LAZY"), ("torch", "off", None),
             ("torch", "off", "EAGER"), ("torch", "on", None), ("torch+cupy", "on", None)]
    print(f"{'imported':12} {'foreign':8} {'loading':8} {'tp 1 op':>9} {'tp 100':>9} {'torch 1':>9} {'torch 100':>9}"
          "  (median host us)")
    splits = []
    for imports, foreign, loading in cases:
        r = run_case(imports, foreign, args.repeats, loading=loading)
        print(f"{imports:12} {foreign:8} {loading or 'unset':8} {r['tensorplay 1']:9.1f} {r['tensorplay 100']:9.1f} "
              f"{r.get('torch 1', float('nan')):9.1f} {r.get('torch 100', float('nan')):9.1f}")
        splits.append((imports, foreign, loading, r["split 1"], r["split 100"]))
    print(f"\n{'imported':12} {'foreign':8} {'loading':8}  begin/body/end of 1 op | of 100 ops (median host us)")
    for imports, foreign, loading, s1, s100 in splits:
        print(f"{imports:12} {foreign:8} {loading or 'unset':8}  " + "/".join(f"{v:.1f}" for v in s1) + "  |  "
              + "/".join(f"{v:.1f}" for v in s100))
    r = run_case("torch", "on", args.repeats, profile=True, top=args.top, nodes=args.profile_nodes)
    print(f"\ncProfile of {args.repeats} captures of {args.profile_nodes} op(s), torch imported, foreign capture on:")
    print(r["profile"])


if __name__ == "__main__":
    main()
