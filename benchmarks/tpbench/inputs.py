# SPDX-License-Identifier: Apache-2.0
"""Sections ``staging`` and ``rebind``: feeding inputs to a captured graph.

- staging: N fresh 4 KiB inputs through ``stage_and_launch`` (the same
  tensors and other tensors each call), a ``copy_`` loop and a replay, a
  bare replay, PyTorch's ``copy_`` loop and ``_foreach_copy_`` + replay;
- rebind: 1, 8 and 32 inputs of 4 KiB and of 64 MiB into a graph of
  ``y = x * 2 + 1`` per input: bare ``replay()``, ``rebind_and_launch``
  with the same tensors and with two alternating sets,
  ``stage_and_launch``, PyTorch ``_foreach_copy_`` + replay; each row
  checked against NumPy first.
"""

from __future__ import annotations

import gc

import numpy as np

import tensorplay as tp
from tpbench.common import (MIB, batch_of, event_latency, guarded, interleaved_host, latency, record, settle,
                            size_label, torch_graph)


# ---------------------------------------------------------------- staging

def staging_rows(counts, calls, repeats, torch):
    sync = tp.cuda.synchronize
    for n in counts:
        case = f"{n} inputs x 4 KiB"
        k = max(5, min(calls, 4000 // n))
        statics = [tp.zeros(1024, device="cuda") for _ in range(n)]
        inputs = [tp.ones(1024, device="cuda") for _ in range(n)]
        out = tp.zeros(1024, device="cuda")
        out.add_(statics[0])
        g = tp.cuda.CUDAGraph()
        with tp.cuda.graph(g):
            for st in statics:
                out.add_(st)
        g.stage_and_launch(statics, inputs)

        def stage():
            g.stage_and_launch(statics, inputs)

        others = [[tp.ones(1024, device="cuda") for _ in range(n)] for _ in range(2)]
        turn = [0]

        def stage_fresh():                # other tensors each call: the copy node's table is set
            turn[0] ^= 1
            g.stage_and_launch(statics, others[turn[0]])

        def loop():
            for a, b in zip(statics, inputs):
                a.copy_(b)
            g.replay()
        contenders = [("tensorplay replay() (no inputs)", batch_of(g.replay), sync),
                      ("tensorplay stage_and_launch", batch_of(stage), sync),
                      ("tensorplay stage_and_launch (other inputs each call)", batch_of(stage_fresh), sync),
                      ("tensorplay copy_ loop + replay", batch_of(loop), sync)]
        latencies = {"tensorplay stage_and_launch": latency(stage, repeats, sync)}

        @guarded("staging", case, "PyTorch")
        def _torch():
            ts = [torch.zeros(1024, device="cuda") for _ in range(n)]
            ti = [torch.ones(1024, device="cuda") for _ in range(n)]
            to = torch.zeros(1024, device="cuda")
            tg, _ = torch_graph(torch, lambda: [to.add_(a) for a in ts])

            def tloop():
                for a, b in zip(ts, ti):
                    a.copy_(b)
                tg.replay()

            def tforeach():
                torch._foreach_copy_(ts, ti)
                tg.replay()
            tsync = torch.cuda.synchronize
            contenders.append(("PyTorch copy_ loop + replay", batch_of(tloop), tsync))
            contenders.append(("PyTorch _foreach_copy_ + replay", batch_of(tforeach), tsync))
            latencies["PyTorch _foreach_copy_ + replay"] = latency(tforeach, repeats, tsync)

        host = interleaved_host(contenders, k, repeats)
        for name, _, _ in contenders:
            record("staging", case, name, host[name], latencies.get(name))


# ---------------------------------------------------------------- rebind

REBIND_LEGEND = """\
rebind: a graph of y_k = x_k * 2 + 1 over n inputs of one size; host us: median host time per call
  (back-to-back calls, launch queue short); latency us: median of one call timed with CUDA events on
  the current stream (recorded before and after the call, after a synchronize: inputs in, graph done).
  rebind_and_launch rebinds the inputs only (the outputs stay the graph's); 'other tensors' alternates
  between two input sets. Each row is checked once (the first and last outputs against NumPy) before it
  is timed; a wrong result is reported as an error instead."""


def _check_rebind(outputs, inputs, to_numpy, what):
    """The first and last outputs equal NumPy's x * 2 + 1 of their inputs (exact in float32)."""
    for k in sorted({0, len(outputs) - 1}):
        want = to_numpy(inputs[k]) * np.float32(2) + np.float32(1)
        got = to_numpy(outputs[k])
        if not np.array_equal(got, want):
            bad = int(np.count_nonzero(got != want))
            raise AssertionError(f"{what}: output {k} differs from NumPy's in {bad} of {got.size} elements")


def _rebind_inputs(lib, n, elems, sign, device="cuda"):
    """n distinct float32 inputs: sign * arange(elems) + k (values differ per tensor and per set)."""
    base = lib.arange(elems, dtype=lib.float32, device=device)
    return [base * float(sign) + float(k + 1) for k in range(n)]


def rebind_rows(counts, sizes, calls, repeats, torch):
    """Host time and latency of feeding n inputs to a graph: bare replay, rebind_and_launch (same
    tensors, other tensors each call), stage_and_launch, PyTorch _foreach_copy_ + replay. Each case
    frees its tensors and graphs (and both libraries' caches) before the next: 32 x 64 MiB is 2 GiB a set."""
    sync = tp.cuda.synchronize
    has_rebind = hasattr(tp.cuda.CUDAGraph, "rebind_and_launch")
    rebind_names = ("tensorplay rebind_and_launch (same tensors)",
                    "tensorplay rebind_and_launch (other tensors each call)")
    for nbytes in sizes:
        for n in counts:
            case = f"{n} inputs x {size_label(nbytes)}"
            _rebind_case(case, n, nbytes // 4, calls, repeats, torch, sync, has_rebind, rebind_names)
            gc.collect()
            settle(tp)
            if torch is not None:
                settle(torch)


def _rebind_case(case, n, elems, calls, repeats, torch, sync, has_rebind, rebind_names):
    big = elems * 4 >= MIB
    k = max(3, min(calls, 20 // n)) if big else max(5, min(calls, 4000 // n))
    reps = max(5, repeats // 3) if big else repeats
    to_np = lambda t: t.numpy()
    statics = [tp.zeros(elems, device="cuda") for _ in range(n)]
    sets = [_rebind_inputs(tp, n, elems, 1), _rebind_inputs(tp, n, elems, -0.5)]
    (statics[0] * 2.0 + 1.0)                     # compile the kernels outside the capture
    sync()
    g = tp.cuda.CUDAGraph()
    with tp.cuda.graph(g):
        outs = [x * 2.0 + 1.0 for x in statics]
    inputs = sets[0]
    # build the staging executable outside the timing; the static inputs then hold the other set,
    # so that a rebinding that does not take is seen by the checks
    g.stage_and_launch(statics, sets[1])
    sync()
    turn = [0]

    def rebind_same():
        g.rebind_and_launch(statics, inputs)

    def rebind_other():                          # the kernels' parameters change on every call
        turn[0] ^= 1
        g.rebind_and_launch(statics, sets[turn[0]])

    def stage():
        g.stage_and_launch(statics, inputs)

    def check_replay():
        g.replay()
        sync()
        _check_rebind(outs, statics, to_np, "replay()")

    def check_same():
        rebind_same()
        sync()
        _check_rebind(outs, inputs, to_np, "rebind_and_launch")

    def check_other():
        for _ in range(2):
            rebind_other()
            sync()
            _check_rebind(outs, sets[turn[0]], to_np, "rebind_and_launch (other tensors)")

    def check_stage():
        stage()
        sync()
        _check_rebind(outs, inputs, to_np, "stage_and_launch")

    rows = [("tensorplay replay() (no inputs)", g.replay, check_replay, tp, None)]
    if has_rebind:
        flags = g.rebindable(statics)
        note = f"rebindable: {sum(map(bool, flags))} of {n}"
        rows += [(rebind_names[0], rebind_same, check_same, tp, note),
                 (rebind_names[1], rebind_other, check_other, tp, note)]
    else:
        for name in rebind_names:
            record("rebind", case, name, note="skipped: CUDAGraph.rebind_and_launch does not exist yet")
    rows.append(("tensorplay stage_and_launch", stage, check_stage, tp, None))

    @guarded("rebind", case, "PyTorch _foreach_copy_ + replay")
    def _torch():
        ts = [torch.zeros(elems, device="cuda") for _ in range(n)]
        ti = _rebind_inputs(torch, n, elems, 1)
        tg, touts = torch_graph(torch, lambda: [x * 2.0 + 1.0 for x in ts])

        def tforeach():
            torch._foreach_copy_(ts, ti)
            tg.replay()

        def tcheck():
            tforeach()
            torch.cuda.synchronize()
            _check_rebind(touts, ti, lambda t: t.cpu().numpy(), "PyTorch _foreach_copy_ + replay")
        rows.append(("PyTorch _foreach_copy_ + replay", tforeach, tcheck, torch, None))

    contenders, notes, latencies = [], {}, {}
    for name, fn, check, lib, note in rows:
        try:
            check()
        except Exception as exc:                 # a wrong result is reported and not timed
            record("rebind", case, name, error=f"{type(exc).__name__}: {exc}"[:200])
            continue
        contenders.append((name, batch_of(fn), lib.cuda.synchronize))
        latencies[name] = event_latency(lib, fn, reps)
        notes[name] = note
    host = interleaved_host(contenders, k, reps)
    for name, _, _ in contenders:
        record("rebind", case, name, host[name], latencies[name], note=notes[name])
    if has_rebind:
        try:                                     # after rebinding, replay() reads the static inputs again
            check_replay()
        except Exception as exc:
            record("rebind", case, "tensorplay replay() after rebinding", error=f"{type(exc).__name__}: {exc}"[:200])
    g.reset()
