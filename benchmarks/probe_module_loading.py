# SPDX-License-Identifier: Apache-2.0
"""Why captures slow down once PyTorch has initialised CUDA (issue 42).

Runs on the GPU machine, from ``benchmarks/``::

    python probe_module_loading.py [--repeats 100]

Each case is a fresh process: CUDA_MODULE_LOADING unset, LAZY (what PyTorch
sets when it initialises CUDA with the variable unset), EAGER or DEFAULT;
PyTorch's CUDA initialised before tensorplay's first use or after; CuPy
used or not. Printed per case: the driver's module loading mode
(cuModuleGetLoadingMode), PyTorch's CUDA start (ms) and the device memory in
use after it, and the median host us of capture + instantiate of 100 in-place
adds for tensorplay and PyTorch, and of 100 eager adds.
"""

from __future__ import annotations

import argparse
import os

from tpbench.common import run_fresh

CASE = r"""
import json, statistics, sys, time
order, extra, repeats = sys.argv[1], sys.argv[2], int(sys.argv[3])
out = {}

def start_torch():
    global torch
    t0 = time.perf_counter()
    import torch
    torch.zeros(1, device="cuda").add_(1)
    torch.cuda.synchronize()
    out["torch start ms"] = (time.perf_counter() - t0) * 1e3

def start_tp():
    global tp
    import tensorplay as tp
    tp.zeros(1, device="cuda").add_(1)
    tp.cuda.synchronize()

if order == "torch-first":
    start_torch(); start_tp()
else:
    start_tp(); start_torch()
if extra == "cupy":
    import cupy
    cupy.zeros(1).sum()
from cuda.bindings import driver
err, mode = driver.cuModuleGetLoadingMode()
out["mode"] = str(mode).split(".")[-1]
free, total = tp.cuda.mem_get_info()
out["used MiB"] = (total - free) / 2**20

x = tp.zeros(1, device="cuda")
x.add_(1)
from tpbench.capture import tp_capture_adds, torch_capture_us

def capture(n):
    return tp_capture_adds(x, n)

for _ in range(20):
    capture(100).reset()
per, eager = [], []
for _ in range(repeats):
    tp.cuda.synchronize()
    t0 = time.perf_counter()
    g = capture(100)
    per.append((time.perf_counter() - t0) * 1e6)
    g.reset()
    t0 = time.perf_counter()
    for _ in range(100):
        x.add_(1)
    eager.append((time.perf_counter() - t0) * 1e6)
out["tp capture 100"] = statistics.median(per)
out["tp eager 100"] = statistics.median(eager)
out["torch capture 100"] = torch_capture_us(torch, 100, repeats)
print("RESULT" + json.dumps(out))
"""


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=100)
    args = ap.parse_args()
    cases = [(loading, order, "none") for loading in (None, "LAZY", "EAGER", "DEFAULT")
             for order in ("torch-first", "tp-first")]
    cases += [("LAZY", "torch-first", "cupy"), (None, "torch-first", "cupy")]
    print(f"{'loading':8} {'order':12} {'extra':5} {'mode':>22} {'torch ms':>9} {'used MiB':>9} "
          f"{'tp cap100':>9} {'tp eager':>9} {'pt cap100':>9}")
    for loading, order, extra in cases:
        env = dict(os.environ)
        env.pop("CUDA_MODULE_LOADING", None)
        if loading is not None:
            env["CUDA_MODULE_LOADING"] = loading
        r, failure = run_fresh(CASE, [order, extra, str(args.repeats)], env)
        if r is None:
            print(f"{loading or 'unset':8} {order:12} {extra:5} failed: {failure}")
            continue
        print(f"{loading or 'unset':8} {order:12} {extra:5} {r['mode']:>22} {r['torch start ms']:9.0f} "
              f"{r['used MiB']:9.0f} {r['tp capture 100']:9.1f} {r['tp eager 100']:9.1f} "
              f"{r['torch capture 100']:9.1f}")


if __name__ == "__main__":
    main()
