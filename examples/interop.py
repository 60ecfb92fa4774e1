# SPDX-License-Identifier: Apache-2.0
"""Zero-copy interop: the same GPU memory seen by tensorplay, PyTorch and
CuPy (DLPack and the CUDA Array Interface), and a tensorplay graph that reads
a PyTorch tensor's memory.

Run:  python examples/interop.py
(in a clone: bash scripts/setup.sh, then .venv/bin/python in place of python)
"""

from __future__ import annotations

import importlib
import sys

import numpy as np

import tensorplay as tp


def main() -> int:
    if not tp.cuda.is_available():
        print(f"No CUDA GPU here ({tp.cuda.unavailable_reason()}); CPU interop only.")
        a = np.arange(4, dtype=np.float32)
        t = tp.from_numpy(a)
        t.add_(1)
        print("NumPy array changed through the tensor (same memory):", a.tolist())
        return 0
    x = tp.arange(8, dtype=tp.float32, device="cuda")
    try:
        torch = importlib.import_module("torch")       # optional: typed as Any here
    except ImportError:
        print("PyTorch not installed: skipping the PyTorch part")
    else:
        tt = torch.from_dlpack(x)                     # no copy: the same device memory
        tt.mul_(2)
        print("PyTorch wrote, tensorplay reads:", x.tolist())
        back = tp.from_dlpack(tt)
        print("same pointer both ways:", back.data_ptr() == x.data_ptr() == tt.data_ptr())
        # a graph reading PyTorch-owned memory: the graph keeps its owner alive
        src = torch.ones(8, device="cuda")
        src_tp = tp.from_dlpack(src)
        (src_tp * 3).sum()
        g = tp.cuda.CUDAGraph()
        with tp.cuda.graph(g):
            total = (src_tp * 3).sum()
        src.fill_(2.0)                                 # PyTorch changes the input
        torch.cuda.synchronize()
        g.replay()
        print("graph over PyTorch memory:", total.item(), "(expect 48.0)")
    try:
        cp = importlib.import_module("cupy")
    except ImportError:
        print("CuPy not installed: skipping the CuPy part")
    else:
        c = cp.asarray(x)                              # CUDA Array Interface, no copy
        c += 1
        tp.cuda.synchronize()
        print("CuPy wrote, tensorplay reads:", x.tolist())
    return 0


if __name__ == "__main__":
    sys.exit(main())
