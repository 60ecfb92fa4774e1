# SPDX-License-Identifier: Apache-2.0
"""Sections ``capture`` and ``recapture``: host time of capturing a graph.

- capture: capture + instantiate of n in-place adds on a one-element
  tensor, ``with tp.cuda.graph(g)`` against ``with torch.cuda.graph(g)``,
  also with the first replay (neither capture uploads: the first replay does);
- recapture: a re-capture into a graph that has an executable
  (cuGraphExecUpdate) against ``reset()`` then capture + instantiate.
"""

from __future__ import annotations

import statistics
import time

import tensorplay as tp
from tpbench.common import guarded, record


def tp_capture_adds(x, n):
    """A tensorplay graph of n in-place adds on ``x`` (the capture rows' work)."""
    g = tp.cuda.CUDAGraph()
    with tp.cuda.graph(g):
        for _ in range(n):
            x.add_(1)
    return g


def capture_phases(body, foreign=None, pool=None):
    """Host us of one capture of ``body()`` into a new graph, by phase:
    {"begin", "body", "end", "reset", "whole"} (whole: begin to end, the
    reset not included)."""
    g = tp.cuda.CUDAGraph()
    t0 = time.perf_counter_ns()
    g.capture_begin(pool=pool, foreign=foreign)
    t1 = time.perf_counter_ns()
    body()
    t2 = time.perf_counter_ns()
    g.capture_end()
    t3 = time.perf_counter_ns()
    g.reset()
    t4 = time.perf_counter_ns()
    return {"begin": (t1 - t0) / 1e3, "body": (t2 - t1) / 1e3, "end": (t3 - t2) / 1e3,
            "reset": (t4 - t3) / 1e3, "whole": (t3 - t0) / 1e3}


def capture_rows(sizes, repeats, torch):
    for n in sizes:
        case = f"{n} nodes"
        x = tp.zeros(1, device="cuda")
        x.add_(1)
        per, with_first = [], []
        for _ in range(repeats):
            tp.cuda.synchronize()
            t0 = time.perf_counter()
            g = tp_capture_adds(x, n)
            t1 = time.perf_counter()
            g.replay()                   # the first replay uploads the executable
            t2 = time.perf_counter()
            per.append((t1 - t0) * 1e6)
            with_first.append((t2 - t0) * 1e6)
            tp.cuda.synchronize()
            g.reset()
        record("capture", case, "tensorplay capture+instantiate", statistics.median(per))
        record("capture", case, "tensorplay capture+instantiate+first replay", statistics.median(with_first))

        @guarded("capture", case, "PyTorch capture+instantiate")
        def _torch():
            record("capture", case, "PyTorch capture+instantiate", torch_capture_us(torch, n, repeats))
            record("capture", case, "PyTorch capture+instantiate+first replay",
                   torch_capture_us(torch, n, repeats, first_replay=True))


def torch_capture_us(torch, n, repeats, first_replay=False):
    """Median host us of PyTorch's capture + instantiate of n in-place adds
    on a one-element tensor (the same work as tensorplay's row), and of its
    first replay with ``first_replay`` (which uploads the executable)."""
    tx = torch.zeros(1, device="cuda")
    tx.add_(1)
    per = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        tg = torch.cuda.CUDAGraph()
        with torch.cuda.graph(tg):
            for _ in range(n):
                tx.add_(1)
        if first_replay:
            tg.replay()
        per.append((time.perf_counter() - t0) * 1e6)
        torch.cuda.synchronize()
        del tg
    return statistics.median(per)


def recapture_rows(sizes, repeats):
    """Re-capture of a graph that has an executable: capture_end updates it
    in place (cuGraphExecUpdate), against reset() then capture + instantiate.
    Host time per re-capture (capture_begin to capture_end), median."""
    for n in sizes:
        case = f"{n} nodes"
        x = tp.zeros(1, device="cuda")
        x.add_(1)

        def capture_into(g):
            with tp.cuda.graph(g):
                for _ in range(n):
                    x.add_(1)
        for label, fresh in (("tensorplay re-capture (update)", False),
                             ("tensorplay reset + capture + instantiate", True)):
            g = tp.cuda.CUDAGraph()
            capture_into(g)
            per, results = [], set()
            for _ in range(repeats):
                tp.cuda.synchronize()
                t0 = time.perf_counter()
                if fresh:
                    g.reset()
                capture_into(g)
                per.append((time.perf_counter() - t0) * 1e6)
                results.add(g.update_result)
            g.replay()
            tp.cuda.synchronize()
            g.reset()
            record("recapture", case, label, statistics.median(per),
                   note=f"update_result: {', '.join(sorted(map(str, results)))}")
