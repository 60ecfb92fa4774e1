# SPDX-License-Identifier: Apache-2.0
"""Section ``serving``: one graph of the serving MLP step per batch size (1 to 512),
captured largest first into one shared pool, as LLM servers do.

Capture wall time of the 67 graphs, reserved growth (compare.py runs it
second, after memory, so that no other section's cached blocks are in its
baselines) and replay GPU time at batch 1 and 512, each replay checked
against the step run eagerly; PyTorch through ``torch.cuda.graph`` and
through ``capture_begin``/``capture_end`` on one side stream.
"""

from __future__ import annotations

import gc
import time

import tensorplay as tp
from tpbench.common import (RESULTS, TOLERANCE, as_torch, gpu_per_call, guarded, make_clocks, mib, record,
                            relative_error, set_speed, settle, to_library)
from tpbench.workloads import (SERVING_BATCHES, SERVING_FFN, SERVING_HIDDEN, serving_weights, torch_mlp_step,
                               tp_mlp_step)


def torch_capture_graph_ctx(torch, g, pool, step, x):
    with torch.cuda.graph(g, pool=pool):
        return step(x)


def torch_capture_raw(torch, side):
    """capture_begin/capture_end on one side stream: torch.cuda.graph()'s
    capture without its synchronize and empty_cache on every entry."""
    def capture(torch, g, pool, step, x):
        with torch.cuda.stream(side):
            g.capture_begin(pool=pool)
            try:
                y = step(x)
            finally:
                g.capture_end()
        return y
    return capture


def _tp_capture(lib, g, pool, step, x):
    with lib.cuda.graph(g, pool=pool):
        return step(x)


def capture_serving(lib, step, x_static, capture):
    """Warm ``step`` up at every batch size (kernels, plans), settle, then
    capture one graph per batch size, largest first, into one pool: returns
    ({batch: (graph, output)}, capture wall ms, reserved growth MiB)."""
    for b in SERVING_BATCHES:
        step(x_static[:b])
    base = settle(lib)
    pool = lib.cuda.graph_pool_handle()
    graphs = {}
    t0 = time.perf_counter()
    for b in sorted(SERVING_BATCHES, reverse=True):
        g = lib.cuda.CUDAGraph()
        graphs[b] = (g, capture(lib, g, pool, step, x_static[:b]))
    lib.cuda.synchronize()
    wall_ms = (time.perf_counter() - t0) * 1e3
    return graphs, wall_ms, mib(lib.cuda.memory_reserved() - base)


def check_serving(lib, step, graphs, x_static, x_new, batches, tolerance, torch):
    """Write new input values, replay the graphs of ``batches`` and compare
    each output with ``step`` run eagerly: None or what is wrong."""
    x_static.copy_(x_new)
    for b in batches:
        g, out = graphs[b]
        g.replay()
        want = step(x_static[:b])
        lib.cuda.synchronize()
        err = relative_error(out, as_torch(want, torch) if lib is tp else want, torch)
        if err > tolerance:
            return f"batch {b}: replay differs from eager by {err:.2e} of the largest value"
    return None


def serving_rows(quick, torch):
    """vLLM-style capture of one graph per batch size into one shared pool,
    for tensorplay and PyTorch: capture wall time, reserved growth, replay
    GPU time at batch 1 and 512, replays checked against eager."""
    section = "serving"
    n = len(SERVING_BATCHES)
    cap_case = f"capture {n} graphs (batch {SERVING_BATCHES[0]}..{SERVING_BATCHES[-1]}, largest first), one pool"
    big = max(SERVING_BATCHES)
    weights = serving_weights()
    tolerance = TOLERANCE["bfloat16"]
    clocks = make_clocks(torch)
    rounds, target_ms = (5, 5.0) if quick else (15, 20.0)
    state = {}
    contenders = [("tensorplay", tp, tp_mlp_step, _tp_capture)]
    if torch is not None:
        side = torch.cuda.Stream()
        contenders += [("PyTorch", torch, lambda w: torch_mlp_step(torch, w), torch_capture_graph_ctx),
                       ("PyTorch capture_begin/end (no per-graph sync, empty_cache)", torch,
                        lambda w: torch_mlp_step(torch, w), torch_capture_raw(torch, side))]
    for name, lib, make_step, capture in contenders:
        @guarded(section, cap_case, name)
        def _capture():
            w = {k: to_library(lib, v, "bfloat16") for k, v in weights.items()}
            step = make_step(w)
            graphs, wall_ms, growth = capture_serving(lib, step, w["x"], capture)
            error = None
            if torch is not None:
                error = check_serving(lib, step, graphs, w["x"], w["x_new"], (1, big), tolerance, torch)
            record(section, cap_case, name, capture_ms=wall_ms, reserved_mib=growth, error=error)
            if name in ("tensorplay", "PyTorch"):
                state[name] = (lib, graphs, w, error)
    if "tensorplay" in state and "PyTorch" in state and state["tensorplay"][3] is None:
        # both libraries' batch-1 outputs, replayed on the same input (x_new, written by the check)
        tp_lib, tp_graphs, tp_w, _ = state["tensorplay"]
        try:
            err = relative_error(tp_graphs[1][1], state["PyTorch"][1][1][1], torch)
            disagree = f"batch 1 replay differs from PyTorch's by {err:.2e} of the largest value" \
                if err > tolerance else None
        except Exception as exc:
            disagree = f"check against PyTorch failed: {type(exc).__name__}: {exc}"[:200]
        state["tensorplay"] = (tp_lib, tp_graphs, tp_w, disagree)
        if disagree:
            for r in RESULTS:
                if (r["section"], r["case"], r["library"]) == (section, cap_case, "tensorplay"):
                    r["error"] = disagree
    flops = 2 * SERVING_HIDDEN * SERVING_FFN * 2
    for b, case in ((1, "replay batch 1"), (big, f"replay batch {big}")):
        timed_contenders = [(name, graphs[b][0].replay, clocks[name])
                            for name, (lib, graphs, w, error) in state.items() if error is None]
        for name, (lib, graphs, w, error) in state.items():
            if error is not None:
                record(section, case, name, error=f"{error}; not timed")
        for name in ("tensorplay", "PyTorch")[:len(contenders)]:
            if name not in state:
                record(section, case, name, error="not captured (see the capture row)")
        timed = gpu_per_call(timed_contenders, rounds, target_ms)
        for name, (gpu_us, host_us, behind) in timed.items():
            if b == 1:       # bound by reading the weights
                rate, unit = SERVING_HIDDEN * SERVING_FFN * 2 * 2 / gpu_us / 1e3, "GB/s"
            else:
                rate, unit = flops * b / gpu_us / 1e6, "TFLOP/s"
            record(section, case, name, host_us=host_us, gpu_us=gpu_us, rate=rate, unit=unit,
                   note="host fell behind: GPU may have idled" if behind else None)
        if "tensorplay" in timed and "PyTorch" in timed:
            set_speed(section, case, timed["PyTorch"][0] / timed["tensorplay"][0])
    caps = {r["library"]: r for r in RESULTS if r["section"] == section and r["case"] == cap_case}
    if caps.get("tensorplay", {}).get("capture_ms") and caps.get("PyTorch", {}).get("capture_ms"):
        caps["tensorplay"]["speed_vs_torch"] = caps["PyTorch"]["capture_ms"] / caps["tensorplay"]["capture_ms"]
    state.clear()
    gc.collect()
    for lib in (tp, torch):
        if lib is not None:
            settle(lib)
