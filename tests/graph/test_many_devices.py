# SPDX-License-Identifier: Apache-2.0
"""Graphs on several devices, as one process serving on many GPUs uses
them: on one GPU, two threads capturing at once in thread_local mode; on
two or more (marked multigpu), a graph per device captured concurrently
from a thread per device, pools per device, a peer read in a graph, and an
NCCL all-reduce across two ranks (one process per GPU) captured and
replayed, whose NCCL kernels refuse its pool's sleep."""

import json
import textwrap
import threading

import numpy as np
import pytest

import tensorplay as tp
from tensorplay.cuda import CUDAGraph

from helpers import warm

pytestmark = pytest.mark.cuda
N = 1 << 16


def _capture_on_threads(devices, make):
    """Capture ``make(i, dev)`` on one thread per entry of ``devices``, both
    captures open at once (thread_local); (graph, out, x) per thread. Each
    thread warms up before any capture opens: a warm-up synchronizes its
    device, which a capture open on another thread of that device refuses."""
    barrier = threading.Barrier(len(devices), timeout=60)
    results, errors = [None] * len(devices), []

    def work(i, dev):
        try:
            with tp.cuda.device(dev):
                x = tp.arange(N, dtype=tp.float32, device="cuda")
                warm(make, i, x)
                barrier.wait()                      # every thread is warm
                g = CUDAGraph()
                with tp.cuda.graph(g, capture_error_mode="thread_local"):
                    barrier.wait()                  # every capture is open
                    out = make(i, x)
                    barrier.wait()
                results[i] = (g, out, x)
        except BaseException as exc:
            errors.append(exc)
            barrier.abort()
    threads = [threading.Thread(target=work, args=(i, d)) for i, d in enumerate(devices)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    return results


def _f(i, x):
    return (x * float(i + 2)).sin() + 1.0


def _check(results):
    for i, (g, out, x) in enumerate(results):
        with tp.cuda.device(x.device.index):
            x.copy_(tp.tensor(np.random.default_rng(i).standard_normal(N).astype(np.float32), device=f"cuda:{x.device.index}"))
            g.replay()
            tp.cuda.synchronize()
            want = np.sin(x.cpu().numpy() * (i + 2)) + 1.0
            np.testing.assert_allclose(out.cpu().numpy(), want, rtol=1e-5, atol=1e-5)


def test_two_threads_capture_at_once_on_one_device():
    results = _capture_on_threads([0, 0], _f)
    assert results[0][0].capture_stream.handle != results[1][0].capture_stream.handle
    assert results[0][0].pool_id != results[1][0].pool_id
    _check(results)


@pytest.mark.multigpu
def test_a_graph_per_device_captured_concurrently():
    n = tp.cuda.device_count()
    before = [tp.cuda.memory_reserved(d) for d in range(n)]
    results = _capture_on_threads(list(range(n)), _f)
    for d, (g, out, x) in enumerate(results):
        assert g.device_index == d and out.device.index == d
        assert tp.cuda.memory_reserved(d) > before[d]       # each graph's pool is on its own device
    _check(results)
    with pytest.raises(ValueError, match="cuda:1"):
        with tp.cuda.device(1):
            results[0][0].replay(tp.cuda.current_stream())   # device 0's graph on device 1's stream


@pytest.mark.multigpu
def test_a_peer_read_in_a_graph():
    if not tp.cuda.can_device_access_peer(0, 1):
        pytest.skip("cuda:0 cannot access cuda:1's memory (no peer access)")
    tp.cuda.enable_peer_access(0, 1)
    remote = tp.arange(N, dtype=tp.float32, device="cuda:1")
    with tp.cuda.device(0):
        local = tp.zeros(N, device="cuda:0")
        warm(local.copy_, remote)
        g = CUDAGraph()
        with tp.cuda.graph(g):
            local.copy_(remote)
            out = local * 2
    remote.copy_(tp.full((N,), 3.0, device="cuda:1"))
    g.replay()
    tp.cuda.synchronize()
    np.testing.assert_array_equal(out.cpu().numpy(), np.full(N, 6.0, np.float32))


_RANK = textwrap.dedent("""
    import json, sys, torch, torch.distributed as dist
    import tensorplay as tp
    rank, store = int(sys.argv[1]), sys.argv[2]
    torch.cuda.set_device(rank)
    tp.cuda.set_device(rank)                           # this process's GPU, for tensorplay too
    dist.init_process_group("nccl", store=dist.FileStore(store, 2), rank=rank, world_size=2)
    x = torch.full((4096,), float(rank + 1), device="cuda")
    y = torch.empty_like(x)
    y.copy_(x); dist.all_reduce(y)                     # eagerly first: NCCL's lazy setup
    torch.cuda.synchronize()
    tp.cuda.check_collectives_capturable()
    pool = tp.cuda.GraphPool()
    g = tp.cuda.CUDAGraph()
    with tp.cuda.graph(g, pool=pool, capture_error_mode="thread_local"):
        y.copy_(x); dist.all_reduce(y); z = y * 2
    out = {"rank": rank}
    for step in range(3):
        x.fill_(float((rank + 1) * (step + 1)))
        g.replay(); torch.cuda.synchronize()
        out[f"step{step}"] = [y[0].item(), z[0].item()]
    names = [n.get("name") or "" for n in g.describe()["nodes"]]
    out["nccl_kernels"] = any(n.startswith(("ncclDevKernel", "ncclKernel")) for n in names)
    try:
        pool.sleep(); out["sleep"] = "slept"; pool.wake()
    except tp.cuda.CollectiveError as exc:
        out["sleep"] = "refused: " + str(exc)
    dist.barrier(); dist.destroy_process_group()
    print(json.dumps(out))
    """)


@pytest.mark.multigpu
def test_an_all_reduce_across_two_gpus_in_a_graph(tmp_path):
    torch = pytest.importorskip("torch")
    d = pytest.importorskip("torch.distributed")
    if not d.is_available() or not d.is_nccl_available():
        pytest.skip("this PyTorch has no torch.distributed with NCCL")
    if torch.cuda.device_count() < 2:
        pytest.skip("PyTorch sees fewer than 2 GPUs")
    import os
    import subprocess
    import sys
    env = {k: v for k, v in os.environ.items() if k != "NCCL_GRAPH_REGISTER"}
    procs = [subprocess.Popen([sys.executable, "-c", _RANK, str(r), str(tmp_path / "store")], cwd="/",
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for r in range(2)]
    outs = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=240)
        assert p.returncode == 0, stderr[-4000:]
        outs.append(json.loads(stdout.strip().splitlines()[-1]))
    for out in outs:
        for step in range(3):
            total = 3.0 * (step + 1)                   # (1 + 2) * (step + 1)
            assert out[f"step{step}"] == [total, 2 * total], out
        if out["nccl_kernels"]:
            assert out["sleep"].startswith("refused") and "NCCL_GRAPH_REGISTER" in out["sleep"], out
