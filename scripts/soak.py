# SPDX-License-Identifier: Apache-2.0
"""Load and leak soak for tensorplay's graphs (GPU). Run from outside the
repository root (e.g. ``cd scripts && python soak.py``):

    python soak.py [--cycles 10000] [--threads 8] [--replays 10000] [--out soak.json]

1. ``cycles`` capture/replay/reset cycles of a graph with an IF node and a
   WHILE node and allocations inside the capture, on a 256-element input;
   after every fourth of them one more cycle of the same graph on a 1, 4, 16
   or 64 MiB input (in turn) with a temporary of that size allocated and
   freed inside the capture. Every replay's result is checked. After the
   cycles (``gc.collect()``, no ``empty_cache()``) ``memory_reserved()`` must
   not exceed its value after the first round of sizes by more than one
   segment of the largest size; after ``empty_cache()`` it and the counts of
   live driver objects must equal their values before.
2. ``threads`` threads each replay their own graph ``replays`` times on their
   own stream, while two more threads capture, replay and reset in
   ``thread_local`` mode over and over, on 64-element and 1-64 MiB inputs in
   turn; every result is checked.
Exit status 0 only when every check held.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import threading
import time
import traceback

import tensorplay as tp
from tensorplay._memory.pool import segment_bytes
from tensorplay.cuda import CUDAGraph

MiB = 1 << 20
SIZES_MIB = (1, 4, 16, 64)          # the sized cycles' inputs, float32, in turn
SIZED_EVERY = 4                     # one sized cycle after every 4 small ones




def baseline():
    gc.collect()
    tp.cuda.synchronize()
    tp.cuda.empty_cache()
    return tp.cuda.memory_reserved(), tp.cuda.live_driver_objects()


def one_cycle(x, flag, limit, counter, temporary=False):
    """Capture: y = x * 2; if flag: y += 1; while counter < limit: counter += 1
    (with ``temporary``, also t = x * 0 allocated, added to y and freed inside
    the capture). Replay twice and check the first and last element."""
    g = CUDAGraph()
    p = tp.empty(1, dtype=tp.bool, device="cuda")
    with tp.cuda.graph(g):
        y = x * 2
        if temporary:
            t = x * 0.0
            y.add_(t)
            del t
        g.begin_capture_to_if_node(flag)
        y.add_(1)
        g.end_capture_to_conditional_node()
        counter.zero_()
        tp.lt(counter, limit, out=p)
        g.begin_capture_to_while_node(p)
        counter.add_(1)
        tp.lt(counter, limit, out=p)
        g.end_capture_to_conditional_node()
    for _ in range(2):
        g.replay()
    want_y = float(x[0].item()) * 2 + (1 if flag.item() else 0)
    ok = (y[0].item() == want_y and y[-1].item() == want_y and
          counter.item() == limit.item())
    del y
    g.reset()
    return ok


def cycles_phase(n):
    x = tp.full((256,), 3.0, device="cuda")
    sized = [tp.full((mib * MiB // 4,), 3.0, device="cuda") for mib in SIZES_MIB]
    flag = tp.ones(1, dtype=tp.bool, device="cuda")
    limit = tp.full((1,), 5, dtype=tp.int32, device="cuda")
    counter = tp.zeros(1, dtype=tp.int32, device="cuda")
    one_cycle(x, flag, limit, counter)          # kernels compiled and loaded before the baseline
    for xs in sized:
        one_cycle(xs, flag, limit, counter, temporary=True)
    reserved0, live0 = baseline()
    bad = 0
    n_sized = 0
    reserved_first = None            # after the first sized cycle of each size
    t0 = time.perf_counter()
    for k in range(n):
        flag.fill_(k % 2)
        limit.fill_(k % 7)
        if not one_cycle(x, flag, limit, counter):
            bad += 1
        if k % SIZED_EVERY == SIZED_EVERY - 1:
            if not one_cycle(sized[n_sized % len(sized)], flag, limit, counter, temporary=True):
                bad += 1
            n_sized += 1
            if n_sized == len(sized):
                gc.collect()
                reserved_first = tp.cuda.memory_reserved()
    elapsed = time.perf_counter() - t0
    gc.collect()
    reserved_cycles = tp.cuda.memory_reserved()          # before any empty_cache
    if reserved_first is None:                           # fewer cycles than one round of sizes
        reserved_first = reserved_cycles
    slack = segment_bytes(max(SIZES_MIB) * MiB)         # one segment of the largest size
    reserved1, live1 = baseline()
    return {"cycles": n, "sized_cycles": n_sized, "sizes_mib": list(SIZES_MIB),
            "wrong_results": bad, "seconds": round(elapsed, 1),
            "reserved_before": reserved0, "reserved_after_first_sizes": reserved_first,
            "reserved_after_cycles": reserved_cycles, "reserved_slack": slack,
            "reserved_after": reserved1,
            "live_before": live0, "live_after": live1,
            "ok": (bad == 0 and reserved_cycles <= reserved_first + slack and
                   reserved0 == reserved1 and live0 == live1)}


def _where():
    """The innermost frames of the exception being handled, for the report."""
    tb = traceback.extract_tb(sys.exc_info()[2])
    return " <- ".join(f"{f.name}:{f.lineno}" for f in reversed(tb[-4:]))


def threads_phase(n_threads, replays, n_captures=200):
    # the capturing threads' inputs, in turn: 64 elements, then 1-64 MiB
    capture_sizes = (64,) + tuple(mib * MiB // 4 for mib in SIZES_MIB)
    errors = []
    graphs = []
    for k in range(n_threads):
        x = tp.zeros(1, device="cuda")
        x.add_(0)
        g = CUDAGraph()
        with tp.cuda.graph(g):
            x.add_(1)
        x.zero_()
        graphs.append((g, x, tp.cuda.Stream()))
    tp.cuda.synchronize()
    start = threading.Barrier(n_threads + 2 + 1)

    def replayer(k):
        g, x, s = graphs[k]
        try:
            start.wait()
            for _ in range(replays):
                g.replay(s)
            s.synchronize()
            if x.item() != replays:
                errors.append(f"replayer {k}: {x.item()} != {replays}")
        except BaseException as exc:      # reported, and the phase fails
            errors.append(f"replayer {k}: {exc!r} at {_where()}")

    def capturer(k):
        try:
            s = tp.cuda.Stream()
            with tp.cuda.stream(s):
                inputs = [tp.full((size,), float(k), device="cuda") for size in capture_sizes]
                for a in inputs:                         # kernels compiled and loaded before capturing
                    b = a * 2 + 1
                    b[0].item()
                start.wait()
                for i in range(n_captures):
                    a = inputs[i % len(inputs)]
                    g = CUDAGraph()
                    with tp.cuda.graph(g, capture_error_mode="thread_local"):
                        b = a * 2 + i                    # a temporary (a * 2) freed inside the capture
                    g.replay()
                    got = (b[0].item(), b[-1].item())
                    if got != (2 * k + i, 2 * k + i):
                        errors.append(f"capturer {k} step {i} ({a.numel()} elements): {got}")
                    del b
                    g.reset()
        except BaseException as exc:
            errors.append(f"capturer {k}: {exc!r} at {_where()}")

    threads = [threading.Thread(target=replayer, args=(k,)) for k in range(n_threads)]
    threads += [threading.Thread(target=capturer, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - t0
    return {"threads": n_threads, "replays_per_thread": replays, "capturing_threads": 2,
            "captures_per_capturing_thread": n_captures, "seconds": round(elapsed, 2),
            "errors": errors[:20], "ok": not errors}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cycles", type=int, default=10000)
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--replays", type=int, default=10000)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if not tp.cuda.is_available():
        print(f"soak.py needs a CUDA GPU ({tp.cuda.unavailable_reason()})")
        return 0
    cycles = cycles_phase(args.cycles)
    print(json.dumps({"cycles": cycles}))
    threads = threads_phase(args.threads, args.replays)
    print(json.dumps({"threads": threads}))
    report = {"cycles": cycles, "threads": threads, "gpu": tp.cuda.get_device_name(0)}
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)
    ok = cycles["ok"] and threads["ok"]
    print("soak:", "PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
