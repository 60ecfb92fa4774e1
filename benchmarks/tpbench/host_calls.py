# SPDX-License-Identifier: Apache-2.0
"""Sections ``replay``, ``threads`` and ``eager``: host time of calls.

- replay: host time per replay of an n-node graph, tensorplay's
  ``replay()`` and ``replay(stream)`` beside a C loop of cuGraphLaunch on
  the same executable (``_cloop.pyx``), a bare Cython def, PyTorch, CuPy
  and cuda.core, every contender timed in alternating rounds;
- threads: launches per second of N threads, each replaying its own graph
  on its own stream, and the same with the C loop;
- eager: host time per call of a small ``add_``, beside PyTorch and CuPy.
"""

from __future__ import annotations

import threading
import time

import tensorplay as tp
from tpbench.common import (batch_of, build_cloop, cuda_core_graph, cupy_graph, guarded, interleaved_host, latency,
                            record, torch_graph)


# ---------------------------------------------------------------- replay

def replay_rows(sizes, calls, repeats, torch, cp):
    """Host time per replay of an n-node graph: every contender is built first,
    then timed in alternating rounds. The C loop launches the same executable
    as tensorplay, on the same streams."""
    sync = tp.cuda.synchronize
    try:
        cloop = build_cloop()
    except Exception as exc:
        cloop = None
        record("replay", "all", "C loop cuGraphLaunch", error=f"build failed: {exc}"[:200])
    for n in sizes:
        case = f"{n} nodes"
        k = max(5, min(calls, 2000 // n))        # launches per round: the queue stays short
        contenders, latencies = [], {}
        x = tp.zeros(1, device="cuda")
        x.add_(1)
        g = tp.cuda.CUDAGraph()
        with tp.cuda.graph(g):
            for _ in range(n):
                x.add_(1)
        s = tp.cuda.Stream()
        contenders.append(("tensorplay replay()", batch_of(g.replay), sync))
        contenders.append(("tensorplay replay(stream)", batch_of(lambda: g.replay(s)), sync))
        latencies["tensorplay replay()"] = latency(g.replay, repeats, sync)
        latencies["tensorplay replay(stream)"] = latency(lambda: g.replay(s), repeats, sync)
        if cloop is not None:
            handle, sh = g.exec_handle, s.handle
            cur = tp.cuda.current_stream().handle
            contenders.append(("C loop cuGraphLaunch, current stream",
                               lambda k: cloop.graph_launch_loop(handle, cur, k), sync))
            contenders.append(("C loop cuGraphLaunch, same stream as replay(stream)",
                               lambda k: cloop.graph_launch_loop(handle, sh, k), sync))
            once = cloop.graph_launch_once
            contenders.append(("bare Cython def, nogil cuGraphLaunch, same stream",
                               batch_of(lambda: once(handle, sh)), sync))

        @guarded("replay", case, "PyTorch CUDAGraph.replay()")
        def _torch():
            tx = torch.zeros(1, device="cuda")
            tg, _ = torch_graph(torch, lambda: [tx.add_(1) for _ in range(n)])
            contenders.append(("PyTorch CUDAGraph.replay()", batch_of(tg.replay), torch.cuda.synchronize))
            latencies["PyTorch CUDAGraph.replay()"] = latency(tg.replay, repeats, torch.cuda.synchronize)

        @guarded("replay", case, "CuPy Graph.launch()")
        def _cupy():
            st = cp.cuda.Stream(non_blocking=True)
            cg, cx = cupy_graph(cp, n, st)
            csync = cp.cuda.Device().synchronize
            contenders.append(("CuPy Graph.launch()", batch_of(lambda cx=cx: cg.launch(st)), csync))
            latencies["CuPy Graph.launch()"] = latency(lambda: cg.launch(st), repeats, csync)

        @guarded("replay", case, "cuda.core Graph.launch()")
        def _core():
            buf = tp.zeros(1, device="cuda")
            graph, st = cuda_core_graph(n, buf.data_ptr())
            # the graph writes buf through a raw address: the lambdas keep it alive
            contenders.append(("cuda.core Graph.launch()", batch_of(lambda buf=buf: graph.launch(st)), st.sync))
            latencies["cuda.core Graph.launch()"] = latency(lambda: graph.launch(st), repeats, st.sync)

        host = interleaved_host(contenders, k, repeats)
        for name, _, _ in contenders:
            record("replay", case, name, host[name], latencies.get(name))


# ---------------------------------------------------------------- threads

def thread_rows(thread_counts, launches):
    """Launches per second of N threads, each replaying its own 1-node graph
    on its own stream; the same with the C loop (GIL released for the whole
    loop) shows what the driver itself allows."""
    try:
        cloop = build_cloop()
    except Exception:
        cloop = None
    for nt in thread_counts:
        graphs, streams = [], []
        for _ in range(nt):
            x = tp.zeros(1, device="cuda")
            x.add_(1)
            g = tp.cuda.CUDAGraph()
            with tp.cuda.graph(g):
                x.add_(1)
            graphs.append((g, x))
            streams.append(tp.cuda.Stream())
        tp.cuda.synchronize()

        def py_work(k):
            g, s = graphs[k][0], streams[k]
            for _ in range(launches):
                g.replay(s)

        def c_work(k):
            cloop.graph_launch_loop(graphs[k][0].exec_handle, streams[k].handle, launches)

        for name, work in (("tensorplay replay(stream)", py_work), ("C loop cuGraphLaunch", c_work)):
            if work is c_work and cloop is None:
                continue
            barrier = threading.Barrier(nt + 1)

            def run(k, work=work, barrier=barrier):
                barrier.wait()
                work(k)
            threads = [threading.Thread(target=run, args=(k,)) for k in range(nt)]
            for t in threads:
                t.start()
            barrier.wait()
            t0 = time.perf_counter()
            for t in threads:
                t.join()
            wall = time.perf_counter() - t0
            tp.cuda.synchronize()
            record("threads", f"{nt} threads", name, extra=nt * launches / wall)


# ---------------------------------------------------------------- eager

def eager_rows(calls, repeats, torch, cp):
    x = tp.ones(256, device="cuda")
    x.add_(1)
    contenders = [("tensorplay", batch_of(lambda: x.add_(1)), tp.cuda.synchronize)]

    @guarded("eager", "small add_", "PyTorch")
    def _torch():
        tx = torch.ones(256, device="cuda")
        contenders.append(("PyTorch", batch_of(lambda: tx.add_(1)), torch.cuda.synchronize))

    @guarded("eager", "small add_", "CuPy")
    def _cupy():
        cx = cp.ones(256, dtype=cp.float32)

        def add():
            cx.__iadd__(1)
        add()
        contenders.append(("CuPy", batch_of(add), cp.cuda.Device().synchronize))

    host = interleaved_host(contenders, calls, repeats)
    for name, _, _ in contenders:
        record("eager", "small add_", name, host[name])
