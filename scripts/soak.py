# SPDX-License-Identifier: Apache-2.0
"""Load and leak soak for tensorplay's graphs (GPU). Run from outside the
repository root (e.g. ``cd scripts && python soak.py``):

    python soak.py [--cycles 10000] [--threads 8] [--replays 10000] [--out soak.json]

1. ``cycles`` capture/replay/reset cycles of a graph with an IF node and a
   WHILE node and allocations inside the capture; every replay's result is
   checked. Afterwards ``memory_reserved()`` (after ``empty_cache()``) and the
   counts of live driver objects must equal their values before.
2. ``threads`` threads each replay their own graph ``replays`` times on their
   own stream, while two more threads capture and replay in ``thread_local``
   mode over and over; every result is checked.
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
from tensorplay.cuda import CUDAGraph


def baseline():
    gc.collect()
    tp.cuda.synchronize()
    tp.cuda.empty_cache()
    return tp.cuda.memory_reserved(), tp.cuda.live_driver_objects()


def one_cycle(x, flag, limit, counter):
    """Capture: y = x * 2; if flag: y += 1; while counter < limit: counter += 1.
    Replay twice and check."""
    g = CUDAGraph()
    p = tp.empty(1, dtype=tp.bool, device="cuda")
    with tp.cuda.graph(g):
        y = x * 2
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
    ok = y[0].item() == want_y and counter.item() == limit.item()
    g.reset()
    return ok


def cycles_phase(n):
    x = tp.full((256,), 3.0, device="cuda")
    flag = tp.ones(1, dtype=tp.bool, device="cuda")
    limit = tp.full((1,), 5, dtype=tp.int32, device="cuda")
    counter = tp.zeros(1, dtype=tp.int32, device="cuda")
    one_cycle(x, flag, limit, counter)          # kernels compiled and loaded before the baseline
    reserved0, live0 = baseline()
    bad = 0
    t0 = time.perf_counter()
    for k in range(n):
        flag.fill_(k % 2)
        limit.fill_(k % 7)
        if not one_cycle(x, flag, limit, counter):
            bad += 1
    elapsed = time.perf_counter() - t0
    reserved1, live1 = baseline()
    return {"cycles": n, "wrong_results": bad, "seconds": round(elapsed, 1),
            "reserved_before": reserved0, "reserved_after": reserved1,
            "live_before": live0, "live_after": live1,
            "ok": bad == 0 and reserved0 == reserved1 and live0 == live1}


def _where():
    """The innermost frames of the exception being handled, for the report."""
    tb = traceback.extract_tb(sys.exc_info()[2])
    return " <- ".join(f"{f.name}:{f.lineno}" for f in reversed(tb[-4:]))


def threads_phase(n_threads, replays, n_captures=200):
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
                a = tp.full((64,), float(k), device="cuda")
                b = a * 2 + 1                    # kernels compiled and loaded before capturing
                b[0].item()
                start.wait()
                for i in range(n_captures):
                    g = CUDAGraph()
                    with tp.cuda.graph(g, capture_error_mode="thread_local"):
                        b = a * 2 + i
                    g.replay()
                    if b[0].item() != 2 * k + i:
                        errors.append(f"capturer {k} step {i}: {b[0].item()}")
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
