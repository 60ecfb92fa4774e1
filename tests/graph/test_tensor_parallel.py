# SPDX-License-Identifier: Apache-2.0
"""Tensor-parallel pieces across two GPUs, one process per GPU (marked
multigpu; they skip with fewer than two GPUs):

- an NCCL all-reduce inside a WHILE body: each rank captures a tensorplay
  graph whose WHILE body adds its input, all-reduces and counts down; every
  replay gives the same, expected sums on both ranks;
- a custom all-reduce over imported graph buffers: each rank captures a
  graph into a sleepable GraphPool, exports the pool's segments, exchanges
  them with the other rank over a Unix socket pair (the file descriptors
  with socket.send_fds), maps the peer's (import_segments), finds the
  peer's buffer among the peer graph's kernel_buffers() and translates it,
  and replays a graph whose kernel adds its own buffer and the peer's
  mapped one: both ranks get the sum, step after step.

Each rank is a fresh Python process (``-c`` with one of the programs
below), its output in files under ``tmp_path``; a rank that waits on the
other forever is killed after RANK_TIMEOUT seconds. Without a GPU only the
check that the programs are valid Python runs."""

import json
import os
import socket
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import tensorplay as tp

from helpers import N_GPUS

RANK_TIMEOUT = 120                   # seconds for both ranks together
N = 4096

def needs_two_gpus(what):
    """Skip with fewer than two GPUs, saying what the test needs them for
    (a skipif mark: its reason is shown before conftest's for multigpu)."""
    return pytest.mark.skipif(N_GPUS < 2, reason=f"needs 2 GPUs: {what} ({N_GPUS} present)")


def _run_ranks(code, tmp_path, args, sockets=None, env=None):
    """Run ``code`` as rank 0 and rank 1 (argv: rank, *args[rank], result
    path), both at once, within RANK_TIMEOUT seconds; return each rank's
    result (the JSON it wrote). ``sockets``: one socket per rank, passed to
    it (its fd is in its ``args``) and closed here once both ranks started,
    so a rank sees the other's end close if that one dies. A rank that
    fails or hangs fails the test with both ranks' output."""
    procs, logs, results = [], [], []
    try:
        for rank in range(2):
            results.append(tmp_path / f"rank{rank}.json")
            logs.append(open(tmp_path / f"rank{rank}.log", "w+"))
            procs.append(subprocess.Popen(
                [sys.executable, "-c", code, str(rank), *map(str, args[rank]), str(results[rank])],
                cwd="/", env=env, stdout=logs[rank], stderr=subprocess.STDOUT,
                pass_fds=[sockets[rank].fileno()] if sockets else ()))
    finally:
        for s in sockets or ():
            s.close()
    deadline = time.monotonic() + RANK_TIMEOUT
    hung = []
    try:
        for rank, p in enumerate(procs):
            try:
                p.wait(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                hung.append(rank)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    said = []
    for rank, log in enumerate(logs):
        log.seek(0)
        said.append(f"--- rank {rank} (exit {procs[rank].returncode}):\n{log.read()[-4000:]}")
        log.close()
    if hung:
        pytest.fail(f"rank(s) {hung} did not finish in {RANK_TIMEOUT} s (one rank waiting on the other)\n"
                    + "\n".join(said))
    if any(p.returncode != 0 for p in procs):
        pytest.fail("a rank failed\n" + "\n".join(said))
    return [json.loads(path.read_text()) for path in results]


# ------------------------------------------------------------------ an all-reduce in a WHILE body

# argv: rank, FileStore path, result path. Rank r adds x_r = arange(N) * (r + 1)
# to acc and all-reduces it, `remaining` times: acc <- 2 * acc + S, with
# S = x_0 + x_1 = 3 * arange(N), so acc = S * (2**k - 1) after k iterations.
WHILE_RANK = textwrap.dedent("""
    import json, sys
    import torch, torch.distributed as dist
    import tensorplay as tp

    rank, store, result = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    N = %d
    torch.cuda.set_device(rank)
    tp.cuda.set_device(rank)                     # this process's GPU, for tensorplay too
    dist.init_process_group("nccl", store=dist.FileStore(store, 2), rank=rank, world_size=2)
    x = torch.arange(N, dtype=torch.float32, device="cuda") * (rank + 1)
    acc = torch.zeros(N, device="cuda")
    remaining = torch.zeros(1, dtype=torch.int64, device="cuda")
    go = torch.zeros(1, dtype=torch.bool, device="cuda")

    def body():
        acc.add_(x)
        dist.all_reduce(acc)                     # the same sum on both ranks
        remaining.sub_(1)
        torch.gt(remaining, 0, out=go)

    body()                                       # eagerly once: NCCL's lazy setup, PyTorch's kernels
    torch.cuda.synchronize()
    tp.cuda.check_collectives_capturable(in_conditional_body=True)   # NCCL_GRAPH_MIXING_SUPPORT=0 is set
    g = tp.cuda.CUDAGraph()
    with torch.no_grad(), tp.cuda.graph(g, capture_error_mode="thread_local"):
        torch.gt(remaining, 0, out=go)
        with g.while_(go):
            body()
    out = {"rank": rank, "runs": []}
    for k in (3, 0, 5, 1):                       # the same counts on both ranks: the loops match
        acc.zero_()
        remaining.fill_(k)
        g.replay()
        torch.cuda.synchronize()
        out["runs"].append({"k": k, "remaining": remaining.item(), "acc": acc.cpu().tolist()})
    dist.barrier()
    dist.destroy_process_group()
    with open(result, "w") as f:
        json.dump(out, f)
    """) % N


@pytest.mark.cuda
@pytest.mark.multigpu
@needs_two_gpus("an NCCL all-reduce across two ranks, one process per GPU")
def test_an_all_reduce_across_two_gpus_in_a_while_body(tmp_path):
    torch = pytest.importorskip("torch")
    d = pytest.importorskip("torch.distributed")
    if not d.is_available() or not d.is_nccl_available():
        pytest.skip("this PyTorch has no torch.distributed with NCCL")
    if torch.cuda.device_count() < 2:
        pytest.skip(f"needs 2 GPUs: PyTorch sees {torch.cuda.device_count()}")
    # NCCL's event nodes are refused in conditional bodies: off before NCCL initialises
    env = dict(os.environ, NCCL_GRAPH_MIXING_SUPPORT="0")
    store = tmp_path / "store"
    outs = _run_ranks(WHILE_RANK, tmp_path, [[store], [store]], env=env)
    s = np.arange(N, dtype=np.float32) * 3                # x_0 + x_1
    for rank, out in enumerate(outs):
        assert out["rank"] == rank
        assert [run["k"] for run in out["runs"]] == [3, 0, 5, 1]
        for run in out["runs"]:
            assert run["remaining"] == 0, (rank, run["k"])    # counted down on the GPU
            want = s * (2 ** run["k"] - 1)
            np.testing.assert_array_equal(np.asarray(run["acc"], np.float32), want,
                                          err_msg=f"rank {rank}, {run['k']} iterations")


# ------------------------------------------------------------------ a custom all-reduce over imported buffers

# argv: rank, socket fd, result path. Rank r's graph writes buf_r = x_r * (r + 1)
# into its sleepable pool; the reduce graph adds buf_r and the peer's buf,
# read through the mapping of the peer's pool.
CUSTOM_RANK = textwrap.dedent("""
    import json, os, pickle, socket, sys
    import tensorplay as tp

    rank, result = int(sys.argv[1]), sys.argv[3]
    N = %d
    sock = socket.socket(fileno=int(sys.argv[2]))
    sock.settimeout(100)                         # never wait forever on a dead peer

    def send(obj, fds=()):
        if fds:
            socket.send_fds(sock, [pickle.dumps(obj)], list(fds))
        else:                                    # fabric handles travel in the records
            sock.send(pickle.dumps(obj))

    def recv():
        data, fds, _, _ = socket.recv_fds(sock, 1 << 20, 256)
        if not data:
            raise EOFError("the other rank closed its socket")
        return pickle.loads(data), fds

    def barrier(tag):
        send(tag)
        got, _ = recv()
        assert got == tag, (got, tag)

    tp.cuda.set_device(rank)
    x = tp.zeros(N, dtype=tp.float32, device="cuda")
    scale = float(rank + 1)
    x * scale                                    # warm: the kernel compiled and loaded before capturing
    tp.cuda.synchronize()

    # 1. capture this rank's part into a sleepable pool, the memory the peer maps
    pool = tp.cuda.GraphPool()
    produce = tp.cuda.CUDAGraph()
    with tp.cuda.graph(produce, pool=pool):
        buf = x * scale
    mine = produce.kernel_buffers()              # the pool pointers its kernels were given
    assert buf.data_ptr() in mine, (hex(buf.data_ptr()), [hex(p) for p in mine])

    # 2. export after the capture; exchange segments (pickled) and descriptors (SCM_RIGHTS)
    with pool.export_handles() as export:
        send((export.segments, mine, buf.data_ptr()), export.fds)
        handle_types = sorted({s.handle_type for s in export.segments})
    (segments, theirs, their_buf), fds = recv()

    # 3. map the peer's pool for this GPU (import_segments grants this device access)
    try:
        mapped = tp.cuda.import_segments(segments, fds, device=rank)
    finally:
        for fd in fds:
            os.close(fd)                         # the mapping keeps the memory
    # the same graph on both ranks: the peer's i-th buffer is the one matching our i-th
    assert len(theirs) == len(mine), (mine, theirs)
    peer_ptr = theirs[mine.index(buf.data_ptr())]
    local = mapped.translate(peer_ptr)

    # 4. the reduce: a kernel reading this rank's buffer and the peer's, captured
    add = tp.RawKernel(r'''
    extern "C" __global__ void add_peer(const float* mine, const float* theirs, float* out, int n) {
      int i = blockIdx.x * blockDim.x + threadIdx.x;
      if (i < n) out[i] = mine[i] + theirs[i];
    }''', "add_peer")
    add.compile(rank)
    out = tp.zeros(N, dtype=tp.float32, device="cuda")
    reduce = tp.cuda.CUDAGraph()
    with tp.cuda.graph(reduce):
        add(((N + 255) // 256,), (256,), (buf, local, out, N))

    runs = []
    for step in range(3):
        x.copy_(tp.arange(N, dtype=tp.float32, device="cuda") * float(step + 1) + float(rank))
        produce.replay()
        tp.cuda.synchronize()
        barrier(("produced", step))              # the peer's part is written
        reduce.replay()
        tp.cuda.synchronize()
        barrier(("reduced", step))               # the peer read ours: the next step may overwrite it
        runs.append(out.cpu().numpy().tolist())
    mapped.close()
    barrier("closed")
    with open(result, "w") as f:
        json.dump({"rank": rank, "handle_types": handle_types, "buffers": len(mine),
                   "found_peer_buffer": peer_ptr == their_buf, "closed": mapped.closed, "runs": runs}, f)
    """) % N


@pytest.mark.cuda
@pytest.mark.multigpu
@needs_two_gpus("each rank maps the graph pool of the other rank's GPU")
def test_a_custom_all_reduce_over_imported_graph_buffers(tmp_path):
    from tensorplay._memory import vmm
    for d in range(2):
        if not vmm.supported(d):
            pytest.skip(f"cuda:{d} has no virtual memory management: no sleepable pool to export")
        if not {"posix_fd", "fabric"} & set(vmm.shareable_handle_types(d)):
            pytest.skip(f"cuda:{d}'s pool segments get no shareable handle type")
    # import_segments maps the peer's memory with cuMemSetAccess for this GPU: it needs the
    # two GPUs to reach each other's memory (cuCtxEnablePeerAccess is for cuMemAlloc memory)
    if not (tp.cuda.can_device_access_peer(0, 1) and tp.cuda.can_device_access_peer(1, 0)):
        pytest.skip("cuda:0 and cuda:1 cannot access each other's memory (no peer access)")
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    outs = _run_ranks(CUSTOM_RANK, tmp_path, [[a.fileno()], [b.fileno()]], sockets=[a, b])
    ramp = np.arange(N, dtype=np.float32)
    for rank, out in enumerate(outs):
        assert out["rank"] == rank
        assert out["handle_types"] and set(out["handle_types"]) <= {"posix_fd", "fabric"}, out["handle_types"]
        assert out["buffers"] == 1 and out["found_peer_buffer"] is True, out
        assert out["closed"] is True
        for step, got in enumerate(out["runs"]):
            parts = [(ramp * (step + 1) + r) * (r + 1) for r in range(2)]   # buf_r = x_r * (r + 1)
            np.testing.assert_array_equal(np.asarray(got, np.float32), parts[0] + parts[1],
                                          err_msg=f"rank {rank}, step {step}")


# ------------------------------------------------------------------ without a GPU

@pytest.mark.parametrize("name", ["WHILE_RANK", "CUSTOM_RANK"])
def test_the_rank_programs_are_valid_python(name):
    """The programs only run with two GPUs: at least they compile everywhere."""
    code = globals()[name]
    compile(code, f"<{name}>", "exec")
    assert "%d" not in code and f"N = {N}" in code
