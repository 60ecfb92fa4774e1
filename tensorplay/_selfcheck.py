# SPDX-License-Identifier: Apache-2.0
"""``python -m tensorplay``: the configuration, then a short self-check on the GPU.

Each check runs a small piece of what users do (a capture and replay, a
WHILE node, a matmul, memory given back) and compares the result with NumPy;
a failing check prints its error and the next one still runs.
"""

from __future__ import annotations

import sys
import time
import traceback
from collections.abc import Callable
from typing import IO

import numpy as np

import tensorplay as tp


def _capture_and_replay() -> str:
    x = tp.zeros(1 << 20, device="cuda")                     # 4 MiB static input
    (x * 2 + 1).sum()                                        # compile and load the kernels
    g = tp.cuda.CUDAGraph()
    with tp.cuda.graph(g):
        y = (x * 2 + 1).sum()
    values = np.arange(1 << 20, dtype=np.float32) / (1 << 20)
    x.copy_(tp.tensor(values, device="cuda"))
    g.replay()
    expected = float((values * 2 + 1).sum(dtype=np.float64))
    got = y.item()
    if abs(got - expected) > 1e-3 * abs(expected):
        raise AssertionError(f"replay gave {got}, NumPy {expected}")
    return f"{g.num_nodes} nodes captured, replay matches NumPy"


def _while_node() -> str:
    count = tp.zeros((), dtype=tp.int32, device="cuda")
    go = tp.ones((), dtype=tp.bool, device="cuda")
    limit = 37
    tp.lt(count + 1, limit, out=go)                          # compile and load the kernels
    g = tp.cuda.CUDAGraph()
    with tp.cuda.graph(g):
        g.begin_capture_to_while_node(go)
        count.add_(1)
        tp.lt(count, limit, out=go)
        g.end_capture_to_conditional_node()
    for _ in range(2):                                       # the loop runs again at each replay
        count.zero_()
        go.fill_(True)
        g.replay()
        if count.item() != limit:
            raise AssertionError(f"the WHILE node stopped at {count.item()}, not {limit}")
    return f"a WHILE node looped {limit} times on the GPU, twice"


def _matmul() -> str:
    rng = np.random.default_rng(0)
    a = rng.standard_normal((1024, 1024), dtype=np.float32)
    b = rng.standard_normal((1024, 1024), dtype=np.float32)
    got = (tp.tensor(a, device="cuda") @ tp.tensor(b, device="cuda")).cpu().numpy()
    err = float(np.abs(got - a.astype(np.float64) @ b).max())
    if err > 0.05:                                           # TF32 is off by default: float32 accuracy
        raise AssertionError(f"1024 x 1024 matmul differs from NumPy by {err}")
    return f"1024 x 1024 float32 matmul matches NumPy (max error {err:.1e})"


def _memory_returned() -> str:
    tp.cuda.synchronize()
    tp.cuda.empty_cache()
    before = tp.cuda.memory_reserved()
    t = tp.empty(64 << 20, dtype=tp.uint8, device="cuda")
    held = tp.cuda.memory_reserved()
    del t
    tp.cuda.empty_cache()
    after = tp.cuda.memory_reserved()
    if held < before + (64 << 20) or after != before:
        raise AssertionError(f"reserved {before} -> {held} -> {after} bytes")
    return "64 MiB allocated, freed and given back to the device"


CHECKS: tuple[tuple[str, Callable[[], str]], ...] = (
    ("capture and replay", _capture_and_replay),
    ("conditional WHILE node", _while_node),
    ("matmul (cuBLASLt)", _matmul),
    ("memory given back", _memory_returned),
)


def self_check(file: IO[str] | None = None) -> bool:
    """Run the GPU self-check, printing one line per check; return True if all passed.

    Without a usable GPU, print why and return True: there is nothing to check.
    """
    out = sys.stdout if file is None else file
    if not tp.cuda.is_available():
        print(f"\nSelf-check skipped: no usable CUDA GPU ({tp.cuda.unavailable_reason()}).", file=out)
        return True
    print(f"\nSelf-check on {tp.cuda.get_device_name()}:", file=out)
    ok = True
    for name, check in CHECKS:
        t0 = time.perf_counter()
        try:
            what = check()
        except Exception as e:                               # report and go on to the next check
            ok = False
            print(f"  FAILED  {name}: {''.join(traceback.format_exception_only(type(e), e)).strip()}",
                  file=out)
            continue
        print(f"  ok      {name}: {what} ({(time.perf_counter() - t0) * 1e3:.0f} ms)", file=out)
    print("All checks passed." if ok else "Some checks failed: see above.", file=out)
    return ok


def main() -> int:
    """``python -m tensorplay``: print :func:`tensorplay.show_config`, then self-check."""
    tp.show_config()
    return 0 if self_check() else 1
