# SPDX-License-Identifier: Apache-2.0
"""Section ``serving_set``: ``tp.cuda.GraphSet`` against ``torch.cuda.graph`` captures
made as vLLM makes them (``vllm_style.VllmStyleGraphs``).

vLLM's 51 sizes up to 512 (19 up to 128 with --quick) of a bf16 MLP step and
a transformer decode step: capture wall time, device memory, replays checked
against eager, replay GPU time, padding waste, and sleep/wake of the set and
of 1 GiB and 8 GiB GraphPools (memory given back, sleep and wake ms, the
first call after wake).
"""

from __future__ import annotations

import gc
import statistics
import time

import numpy as np

import tensorplay as tp
from tpbench import vllm_style as ss
from tpbench.common import (RESULTS, TOLERANCE, gpu_per_call, guarded, make_clocks, mib, record, relative_error,
                            to_library)
from tpbench.workloads import SERVING_HIDDEN, serving_weights, torch_mlp_step

SET_TP, SET_PT = "tensorplay GraphSet", "PyTorch, vLLM-style"
SET_DECODE_MAX_LEN = 256
SERVING_SET_LEGEND = """\
serving_set: per workload, tp.cuda.GraphSet against torch.cuda.graph captures made as vLLM makes them
  (same sizes, same step, same process; both warmed up eagerly at the largest size first). Capture: wall
  ms of building the whole set (static inputs, warm-ups, captures); MiB: drop of the device's free memory
  (mem_get_info) over the capture, both libraries' caches emptied before and after (the note has the drop
  before emptying, vLLM's own figure, and each library's memory_reserved growth); tp/PT = PyTorch's time
  over tensorplay's (target >= 2). Each set is checked against eager at n = 1, 3, 100 and the largest
  (padded calls included). Replay rows: GPU time of one graph replay, interleaved rounds (target: tp/PT
  GPU time <= 1.02, i.e. the tp/PT column >= 0.98). Padding waste: rate = mean % of padded rows over
  n = 1..largest. Sleep/wake: bytes sleep() gave back over the pool's mapped bytes (target >= 95%), the
  device's free memory gained, sleep and wake ms and the first call after wake (checked), medians."""


def _settle_both(torch):
    """Free what nothing references and empty both libraries' caches: a baseline."""
    gc.collect()
    if torch is not None:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    tp.cuda.synchronize()
    tp.cuda.empty_cache()
    tp.cuda.synchronize()


def _sync_both(torch):
    if torch is not None:
        torch.cuda.synchronize()
    tp.cuda.synchronize()


def _footprint_now(torch):
    """(device free bytes, torch reserved, tensorplay reserved)."""
    _sync_both(torch)
    return (tp.cuda.mem_get_info()[0], torch.cuda.memory_reserved() if torch is not None else 0,
            tp.cuda.memory_reserved())


def _set_workloads(quick, torch, largest):
    """[(name, build)]; build() -> (step, sample args of the largest size, make_args(n, rng)). The
    weights and caches are made when a workload's turn comes and freed after it."""

    def mlp():
        w = {k: to_library(torch, v, "bfloat16") for k, v in serving_weights().items()}

        def make_args(n, rng):
            return [to_library(torch, (rng.random((n, SERVING_HIDDEN), dtype=np.float32) * 2 - 1), "bfloat16")]
        return torch_mlp_step(torch, w), [w["x"][:largest]], make_args

    def decode(model):
        def build():
            step, cfg = ss.decode_step(torch, model, largest, SET_DECODE_MAX_LEN)

            def make_args(n, rng):
                tok = torch.from_numpy(rng.integers(0, cfg.vocab - 1, n)).to("cuda")
                pos = torch.from_numpy(rng.integers(0, SET_DECODE_MAX_LEN, n)).to("cuda")
                return [tok, pos]
            return step, make_args(largest, np.random.default_rng(7)), make_args
        return build

    models = ("small",) if quick else ("small", "gpt2-small")
    return [("MLP 1024/4096 bf16", mlp)] + [(f"{m} decode step", decode(m)) for m in models]


def _check_set(call, step, make_args, counts, rng, torch):
    """Run ``call`` on fresh inputs of each row count and compare with eager
    ``step``: (largest error, None or what is wrong)."""
    worst = 0.0
    for n in counts:
        args = make_args(n, rng)
        want = step(*args)
        got = call(*args)
        _sync_both(torch)
        err = relative_error(got, want, torch)
        worst = max(worst, err)
        if err > TOLERANCE["bfloat16"]:
            return worst, f"n={n}: differs from eager by {err:.2e} of the largest value"
    return worst, None


def _capture_contender(section, case, library, make, torch, step, make_args, checks, state):
    """Build one contender's set between two settled baselines and check it;
    the row goes to RESULTS, the set to ``state``."""
    @guarded(section, case, library)
    def _capture():
        _settle_both(torch)
        free0, torch0, tp0 = _footprint_now(torch)
        t0 = time.perf_counter()
        built = make()
        _sync_both(torch)
        wall_ms = (time.perf_counter() - t0) * 1e3
        free1 = _footprint_now(torch)[0]
        _settle_both(torch)              # the warm-ups' cached blocks are not the set's
        free2, torch2, tp2 = _footprint_now(torch)
        state[library] = built
        worst, error = _check_set(built, step, make_args, checks, np.random.default_rng(11), torch)
        note = [f"{mib(free0 - free1):.0f} MiB before emptying the caches",
                f"reserved: torch {mib(torch2 - torch0):+.0f} MiB, tp {mib(tp2 - tp0):+.0f} MiB",
                f"checked n={','.join(map(str, checks))}: max error {worst:.1e}"]
        if library == SET_TP:
            note.append(f"capture_seconds_total {built.capture_seconds_total * 1e3:.0f} ms, memory_added "
                        f"{mib(sum(built.memory_added.values())):.0f} MiB")
        record(section, case, library, capture_ms=wall_ms, reserved_mib=mib(free0 - free2), error=error,
               note="; ".join(note), extra={"device_mib": mib(free0 - free2),
                                            "device_mib_unsettled": mib(free0 - free1),
                                            "torch_reserved_mib": mib(torch2 - torch0),
                                            "tp_reserved_mib": mib(tp2 - tp0), "max_error": worst})


def _sleep_row(section, case, library, cycles, cycle):
    """Run ``cycle()`` -> dict of one sleep/wake cycle ``cycles`` times and
    record the medians (an error from any cycle is kept)."""
    @guarded(section, case, library)
    def _run():
        per = [cycle() for _ in range(cycles)]
        med = {k: statistics.median(c[k] for c in per) for k in per[0] if k != "error"}
        error = next((c["error"] for c in per if c.get("error")), None)
        given = med["given_mib"] / med["mapped_mib"] if med["mapped_mib"] else 0.0
        med["given_share"] = given
        note = (f"given back {given:.1%} of mapped (target >= 95%); first call after wake {med['first_ms']:.2f} ms, "
                f"the next {med['steady_ms']:.2f} ms; median of {cycles} cycles")
        record(section, case, library, extra=med, error=error, note=note)


def _sleep_wake(sleeper, mapped, call, sync, before_wake=None):
    """Time one cycle of ``sleeper`` (a GraphSet or GraphPool, ``mapped`` bytes): sleep, ``before_wake()``,
    wake, then ``call()`` twice, each followed by ``sync()``. Returns (the cycle's MiB and ms, the first
    call's result)."""
    free0 = tp.cuda.mem_get_info()[0]
    t0 = time.perf_counter()
    given = sleeper.sleep()
    sleep_ms = (time.perf_counter() - t0) * 1e3
    free1 = tp.cuda.mem_get_info()[0]
    if before_wake is not None:
        before_wake()
    t0 = time.perf_counter()
    sleeper.wake()
    wake_ms = (time.perf_counter() - t0) * 1e3
    t0 = time.perf_counter()
    first = call()
    sync()
    first_ms = (time.perf_counter() - t0) * 1e3
    t0 = time.perf_counter()
    call()
    sync()
    steady_ms = (time.perf_counter() - t0) * 1e3
    return {"mapped_mib": mib(mapped), "given_mib": mib(given), "freed_mib": mib(free1 - free0),
            "sleep_ms": sleep_ms, "wake_ms": wake_ms, "first_ms": first_ms, "steady_ms": steady_ms}, first


def _set_sleep_cycle(gs, step, make_args, rng, torch):
    """One cycle of the set: sleep, wake, then a call of the largest size on new input, checked."""
    def cycle():
        args = make_args(gs.max_size, rng)
        want = step(*args)
        _sync_both(torch)
        figures, got = _sleep_wake(gs, gs.pool.memory()["mapped"], lambda: gs(*args), lambda: _sync_both(torch))
        err = relative_error(got, want, torch)
        figures["error"] = None if err <= TOLERANCE["bfloat16"] else \
            f"first call after wake differs from eager by {err:.2e} of the largest value"
        return figures
    return cycle


def _pool_sleep_rows(section, gib, cycles):
    """A GraphPool holding ~``gib`` GiB of temporaries (y = x * 2; z = y + 1 over float32, x outside
    the pool): sleep/wake cycles, the first replay after wake checked against NumPy on samples of z."""
    case = f"sleep/wake: GraphPool, y = x * 2; z = y + 1, {gib} GiB in the pool"
    n = gib * (1 << 30) // 8                         # y and z: 4 bytes each per element
    k = 4096
    held = {}                                        # x, z, graph, pool: cleared at the end, freeing them

    @guarded(section, case, "tensorplay GraphPool")
    def _build():
        x = tp.rand(n, device="cuda")
        (x[:k] * 2.0) + 1.0                          # compile the kernels outside the capture
        pool = tp.cuda.GraphPool()
        g = tp.cuda.CUDAGraph()
        with tp.cuda.graph(g, pool=pool):
            y = x * 2.0
            z = y + 1.0
        del y                                        # a temporary: its block stays in the pool
        g.replay()
        held.update(x=x, z=z, g=g, pool=pool)
    if not held:
        return
    rng = np.random.default_rng(gib)

    def cycle():
        x, z, g, pool = held["x"], held["z"], held["g"], held["pool"]
        tp.cuda.synchronize()

        def new_input():                             # a replay that did nothing shows
            x.mul_(-0.5)
            tp.cuda.synchronize()
        figures, _ = _sleep_wake(pool, pool.memory()["mapped"], g.replay, tp.cuda.synchronize, new_input)
        error = None
        for o in [*rng.integers(0, n - k, 4).tolist(), n - k]:
            xs, zs = x[o:o + k].cpu().numpy(), z[o:o + k].cpu().numpy()
            if not np.array_equal(zs, xs * np.float32(2) + np.float32(1)):
                error = f"first replay after wake: z[{o}:{o + k}] differs from NumPy's x * 2 + 1"
                break
        figures["error"] = error
        return figures
    try:
        _sleep_row(section, case, "tensorplay GraphPool", cycles, cycle)
    finally:
        if held["pool"].asleep:
            held["pool"].wake()
        g = held["g"]
        held.clear()                                 # z (pool memory) and x go before the graph's reset
        g.reset()
        _settle_both(None)


def serving_set_rows(quick, torch):
    """tp.cuda.GraphSet against vLLM-style torch.cuda.graph captures, one
    graph per batch size in one pool, on two workloads written in PyTorch:
    the serving section's bf16 MLP step (hidden 1024, ffn 4096) and one
    decode step of examples/decode_loop.py's models (small; gpt2-small too
    without --quick): their configs and weights, the step rewritten in
    vllm_style.decode_step with per-row positions and closure-held KV
    caches (max_len 256) sliced to the batch, because DecodeModel.step is
    tied to one batch and one position shared by all rows.

    Sizes: vLLM's rule, 1, 2, 4, multiples of 8 below 256, multiples of 16
    from 256 (the issue's "35 sizes" is this rule capped at 256; we cap it at
    512: 51 sizes), capped at 128 with --quick (19 sizes). Rows: capture
    wall time and device memory of each set (checked against eager), GPU
    time of one replay at up to 8 sizes, the padding waste of the sizes, and
    what only tensorplay can do: sleep/wake of the MLP set and of GraphPools
    holding 1 GiB and 8 GiB (1 GiB only with --quick)."""
    section = "serving_set"
    if torch is None:
        record(section, "capture (all workloads)", "PyTorch", error="PyTorch is not installed: the workloads need it")
    else:
        largest = 128 if quick else 512
        sizes = ss.vllm_sizes(largest)
        clocks = make_clocks(torch)
        for name, build in _set_workloads(quick, torch, largest):
            _set_workload_rows(section, name, build, sizes, quick, torch, clocks)
            _settle_both(torch)
    for gib in (1,) if quick else (1, 8):
        _pool_sleep_rows(section, gib, cycles=5)


def capture_set_rows(torch, largest=512, workload="MLP 1024/4096 bf16"):
    """Only the capture rows of one workload, both contenders (the gate's
    subset of the section); the sets are reset after. Returns the rows' case."""
    section = "serving_set"
    sizes = ss.vllm_sizes(largest)
    build = dict(_set_workloads(False, torch, largest))[workload]
    state = {}
    try:
        return _capture_both(section, workload, build, sizes, torch, state)[0]
    finally:
        _reset_sets(state)
        _settle_both(torch)


def _capture_both(section, name, build, sizes, torch, state):
    """Build the workload, then both contenders' sets (into ``state``), each
    checked against eager: (the capture rows' case, step, make_args), with
    step None when the workload itself failed (recorded)."""
    largest = sizes[-1]
    cap_case = f"capture {len(sizes)} sizes ({sizes[0]}..{largest}), {name}"
    try:
        step, samples, make_args = build()
        step(*samples)                                   # both warmed up before either capture
        _sync_both(torch)
    except Exception as exc:
        record(section, cap_case, "workload", error=f"{type(exc).__name__}: {exc}"[:200])
        return cap_case, None, None
    checks = sorted({1, 3, 100 if 100 < largest else largest - 1, largest})
    for library, make in ((SET_TP, lambda: tp.cuda.GraphSet(step, samples, sizes, progress=False)),
                          (SET_PT, lambda: ss.VllmStyleGraphs(torch, step, samples, sizes))):
        _capture_contender(section, cap_case, library, make, torch, step, make_args, checks, state)
    caps = {r["library"]: r for r in RESULTS if (r["section"], r["case"]) == (section, cap_case)}
    a, b = caps.get(SET_TP, {}), caps.get(SET_PT, {})
    if a.get("capture_ms") and b.get("capture_ms"):
        a["speed_vs_torch"] = b["capture_ms"] / a["capture_ms"]
        memory = f"{a['reserved_mib'] / b['reserved_mib']:.2f}" if b["reserved_mib"] > 0 else "-"
        a["note"] += (f"; tp/PT time {a['capture_ms'] / b['capture_ms']:.2f} (target <= 0.5), "
                      f"memory {memory} (target <= 1)")
    return cap_case, step, make_args


def _reset_sets(state):
    """Wake and reset every set of ``state`` and forget them."""
    for s in state.values():
        if getattr(s, "asleep", False):
            s.wake()
        s.reset()
    state.clear()


def _set_workload_rows(section, name, build, sizes, quick, torch, clocks):
    """One workload: both contenders' capture rows, the replay rows, and for
    the MLP the padding-waste and sleep/wake rows; every set is reset after."""
    largest = sizes[-1]
    state = {}
    try:
        cap_case, step, make_args = _capture_both(section, name, build, sizes, torch, state)
        if step is None:
            return
        caps = {r["library"]: r for r in RESULTS if (r["section"], r["case"]) == (section, cap_case)}
        good = {lib: s for lib, s in state.items() if not caps.get(lib, {}).get("error")}
        _set_replay_rows(section, name, good, sizes, quick, clocks)
        gs = good.get(SET_TP)
        if name.startswith("MLP"):
            mean, worst, at = ss.padding_waste(gs.size_for if gs is not None else
                                               (lambda n: ss.size_for(sizes, n)), largest)
            record(section, f"padding waste, n = 1..{largest} uniform, {len(sizes)} sizes", "both (same sizes)",
                   rate=mean * 100, unit="% mean", note=f"mean {mean:.2%}, max {worst:.1%} at n={at}")
            if gs is not None:
                _sleep_row(section, f"sleep/wake: {name} GraphSet ({len(sizes)} sizes)", SET_TP, 5,
                           _set_sleep_cycle(gs, step, make_args, np.random.default_rng(13), torch))
    finally:
        _reset_sets(state)


def _set_replay_rows(section, name, sets, sizes, quick, clocks):
    """GPU time of one replay of each set's graph at up to 8 sizes, the
    contenders' rounds interleaved; tp/PT on tensorplay's row."""
    rounds, target_ms = (5, 5.0) if quick else (15, 20.0)
    clock = {SET_TP: clocks["tensorplay"], SET_PT: clocks["PyTorch"]}
    graphs = {lib: s.graphs for lib, s in sets.items()}
    for size in [s for s in (1, 4, 8, 32, 64, 128, 256, 512) if s in sizes] if graphs else ():
        case = f"{name}: replay batch {size}"

        @guarded(section, case, " / ".join(graphs))
        def _time():
            timed = gpu_per_call([(lib, g[size].replay, clock[lib]) for lib, g in graphs.items()], rounds,
                                 target_ms)
            ratio = timed[SET_TP][0] / timed[SET_PT][0] if len(timed) == 2 else None
            for lib, (gpu_us, host_us, behind) in timed.items():
                note = [f"tp/PT GPU time {ratio:.3f} (target <= 1.02)"] if lib == SET_TP and ratio else []
                if behind:
                    note.append("host fell behind: GPU may have idled")
                record(section, case, lib, host_us=host_us, gpu_us=gpu_us, note="; ".join(note) or None)
                if lib == SET_TP and ratio:
                    RESULTS[-1]["speed_vs_torch"] = 1 / ratio
