# SPDX-License-Identifier: Apache-2.0
"""Export and import time of a graph pool's memory (issue 43).

Runs on the GPU machine, from ``benchmarks/``::

    python peer_memory_time.py [--gib 1] [--repeats 5]

A sleepable ``GraphPool`` holding one graph whose output is ``--gib`` GiB;
median wall ms of ``pool.export_handles()`` (shareable handles and file
descriptors of every segment), ``tp.cuda.import_segments()`` of that export
in this process (a second mapping of the same physical memory at new
addresses: what a peer process pays, less the socket), and
``MappedPeerMemory.close()``; the values read through the mapping are
checked against the graph's output. A plain pool's export (CUDA IPC
handles) is timed the same way where the driver allows it.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

import tensorplay as tp


def _timed(fn):
    tp.cuda.synchronize()
    t0 = time.perf_counter()
    out = fn()
    tp.cuda.synchronize()
    return out, (time.perf_counter() - t0) * 1e3


def measure(pool, out, repeats):
    rows = {"export": [], "import": [], "close": []}
    n = out.numel()
    for _ in range(repeats):
        export, ms = _timed(pool.export_handles)
        rows["export"].append(ms)
        try:
            try:
                mapped, ms = _timed(lambda: tp.cuda.import_segments(export))
            except (tp.cuda.CudaError, ValueError) as exc:   # CUDA IPC handles open in another process only
                rows["import note"] = [getattr(exc, "name", type(exc).__name__)]
                continue
            rows["import"].append(ms)
            ptr = mapped.translate(out.data_ptr())
            view = tp.as_tensor(_View(ptr, n))
            probe = view[-4:].cpu().numpy()
            np.testing.assert_array_equal(probe, out[-4:].cpu().numpy())
            del view
            _, ms = _timed(mapped.close)
            rows["close"].append(ms)
        finally:
            export.close()
    return {k: (statistics.median(v) if k != "import note" else v[0]) for k, v in rows.items() if v}


class _View:
    def __init__(self, ptr, n):
        self.__cuda_array_interface__ = {"shape": (n,), "typestr": "<f4", "data": (ptr, False), "version": 3}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gib", type=float, default=1.0)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    n = int(args.gib * 2**30) // 4
    x = tp.arange(n, dtype=tp.float32, device="cuda")
    print(f"{'pool':10} {'segments':>8} {'GiB':>6} {'export ms':>10} {'import ms':>10} {'close ms':>9}  (median of "
          f"{args.repeats})")
    for kind in ("sleepable", "plain"):
        pool = tp.cuda.GraphPool() if kind == "sleepable" else tp.cuda.graph_pool_handle()
        g = tp.cuda.CUDAGraph()
        with tp.cuda.graph(g, pool=pool):
            y = x * 2.0
        g.replay()
        try:
            if kind == "sleepable":
                export = pool.export_handles()
            else:
                export = tp.cuda.export_pool_handles(pool)
            segments = len(export.segments)
            mapped_bytes = sum(s.size for s in export.segments)
            export.close()
            if kind == "sleepable":
                r = measure(pool, y, args.repeats)
            else:
                r = measure(_PlainPool(pool), y, args.repeats)
            if "import" in r:
                print(f"{kind:10} {segments:8d} {mapped_bytes / 2**30:6.2f} {r['export']:10.2f} {r['import']:10.2f} "
                      f"{r['close']:9.2f}")
            else:
                print(f"{kind:10} {segments:8d} {mapped_bytes / 2**30:6.2f} {r['export']:10.2f}  import in this "
                      f"process refused ({r.get('import note')}): timed by a peer process only")
        except Exception as exc:
            print(f"{kind:10} failed: {type(exc).__name__}: {exc}"[:300])
        del g, y


class _PlainPool:
    def __init__(self, pool_id):
        self.pool_id = pool_id

    def export_handles(self):
        return tp.cuda.export_pool_handles(self.pool_id)


if __name__ == "__main__":
    main()
