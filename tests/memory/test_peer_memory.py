# SPDX-License-Identifier: Apache-2.0
"""Pool memory other processes map, on the GPU: sleepable segments carry the
shareable handle types the device allows (fabric dropped cleanly where the
system refuses it); a second Python process on the same GPU receives the
segments and their file descriptors over a Unix socket (socket.send_fds),
maps the exporter's graph pool, reads what a replayed graph wrote, sees the
next replay's values, and writes values the exporter then reads; a plain
pool does the same through CUDA IPC handles; a peer's mapping keeps the
physical memory it mapped through the exporter's sleep; a sleeping pool is
not exported; a bad descriptor raises CudaError; a mapping closed inside a
capture is unmapped after it; kernel_buffers lists the pool pointers the
kernels were given. The CPU half is test_peer_memory_records.py."""
import os
import pickle
import socket
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import tensorplay as tp
from tensorplay._memory import vmm
from tensorplay.cuda import CUDAGraph, GraphPool, PoolAsleepError

pytestmark = pytest.mark.cuda
N = 1 << 14                     # a pickled read (64 KiB) fits one SOCK_SEQPACKET message

# The peer: maps what it receives, then follows the exporter's commands.
PEER = textwrap.dedent(r"""
    import os, pickle, socket, sys
    import numpy as np
    import tensorplay as tp

    sock = socket.socket(fileno=int(sys.argv[1]))

    def send(obj):
        sock.send(pickle.dumps(obj))

    class View:
        def __init__(self, ptr, n):
            self.__cuda_array_interface__ = {"shape": (n,), "typestr": "<f4", "data": (ptr, False), "version": 3}

    data, fds, _, _ = socket.recv_fds(sock, 1 << 20, 256)
    segments, ptrs, n = pickle.loads(data)
    mapped = tp.cuda.import_segments(segments, fds)
    for fd in fds:
        os.close(fd)                           # the mapping keeps the memory
    views = {name: tp.as_tensor(View(mapped.translate(p), n)) for name, p in ptrs.items()}
    send(("mapped", [m[2] for m in mapped.mappings]))
    while True:
        cmd = pickle.loads(sock.recv(1 << 20))
        if cmd[0] == "read":
            send(views[cmd[1]].cpu().numpy())
        elif cmd[0] == "write":
            views[cmd[1]].copy_(tp.arange(n, dtype=tp.float32, device="cuda") * cmd[2])
            tp.cuda.synchronize()
            send("written")
        elif cmd[0] == "close":
            mapped.close()
            send(mapped.closed)
            break
""")


class Peer:
    """A second process on this GPU, talking over a SOCK_SEQPACKET socket pair."""

    def __init__(self, export, ptrs, n=N):
        self.sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.proc = subprocess.Popen([sys.executable, "-c", PEER, str(theirs.fileno())], pass_fds=[theirs.fileno()],
                                     stderr=subprocess.PIPE, text=True, cwd="/")
        theirs.close()
        self.sock.settimeout(120)
        message = pickle.dumps((export.segments, ptrs, n))
        if export.fds:
            socket.send_fds(self.sock, [message], export.fds)
        else:                                   # CUDA IPC handles travel in the records
            self.sock.send(message)
        export.close()                          # sent: the peer holds its own descriptors now
        self.mapped_sizes = self.ask()

    def ask(self, *cmd):
        if cmd:
            self.sock.send(pickle.dumps(cmd))
        try:
            reply = pickle.loads(self.sock.recv(1 << 24))
        except (EOFError, OSError, pickle.UnpicklingError) as exc:
            self.proc.kill()
            raise AssertionError(f"the peer failed: {self.proc.communicate()[1]}") from exc
        return reply[1] if isinstance(reply, tuple) and reply[0] == "mapped" else reply

    def close(self):
        closed = self.ask("close")
        self.proc.wait(60)
        self.sock.close()
        assert closed is True and self.proc.returncode == 0, self.proc.stderr.read()


def capture_affine(pool, x):
    g = CUDAGraph()
    with tp.cuda.graph(g, pool=pool):
        y = x * 2.0
        out = y + 1.0
    return g, out


def test_sleepable_segments_carry_the_handle_types_the_device_allows():
    pool = GraphPool()
    types = vmm.shareable_handle_types(0)
    g = CUDAGraph()
    with tp.cuda.graph(g, pool=pool):
        t = tp.ones(N, device="cuda")
    regions = vmm.regions(pool.id)
    assert any(r["address"] <= t.data_ptr() < r["address"] + r["size"] for r in regions)
    assert regions
    for reg in regions:
        assert set(reg["handle_types"]) <= set(types), (reg, types)
        assert reg["generation"] == 1
    if "posix_fd" in types:                     # Linux GPUs: always
        assert all("posix_fd" in reg["handle_types"] for reg in regions)


@pytest.mark.parametrize("sleepable", [True, False], ids=["sleepable", "plain"])
def test_a_peer_process_reads_a_replayed_graph_and_writes_what_the_exporter_reads(sleepable):
    x = tp.arange(N, dtype=tp.float32, device="cuda")
    pool = GraphPool(sleepable=sleepable)
    g, out = capture_affine(pool, x)
    g.replay()
    tp.cuda.synchronize()
    export = pool.export_handles()
    kinds = {s.handle_type for s in export.segments}
    assert kinds == ({"posix_fd"} if sleepable else {"cuda_ipc"}) or (sleepable and kinds == {"fabric"})
    assert any(out.data_ptr() in s for s in export.segments)
    owner = next(s for s in export.segments if out.data_ptr() in s)
    assert any(owner.address + off <= out.data_ptr() < owner.address + off + size for off, size in owner.blocks)
    peer = Peer(export, {"out": out.data_ptr()})
    try:
        expected = np.arange(N, dtype=np.float32) * 2 + 1
        np.testing.assert_array_equal(peer.ask("read", "out"), expected)
        x.fill_(3.0)
        g.replay()                              # the peer sees the next replay: the same memory
        tp.cuda.synchronize()
        np.testing.assert_array_equal(peer.ask("read", "out"), np.full(N, 7.0, np.float32))
        assert peer.ask("write", "out", 5.0) == "written"
        np.testing.assert_array_equal(out.cpu().numpy(), np.arange(N, dtype=np.float32) * 5)
    finally:
        peer.close()
    g.replay()                                  # the exporter's graph is untouched by the peer's unmapping
    np.testing.assert_array_equal(out.cpu().numpy(), np.full(N, 7.0, np.float32))


def test_a_peer_mapping_keeps_the_memory_through_the_exporters_sleep():
    x = tp.arange(N, dtype=tp.float32, device="cuda")
    pool = GraphPool()
    g, out = capture_affine(pool, x)
    g.replay()
    tp.cuda.synchronize()
    peer = Peer(pool.export_handles(), {"out": out.data_ptr()})
    try:
        pool.sleep()
        with pytest.raises(PoolAsleepError, match="asleep.*wake"):
            pool.export_handles()
        # the exporter gave its handle back; the peer's import handle keeps the pages and their values
        np.testing.assert_array_equal(peer.ask("read", "out"), np.arange(N, dtype=np.float32) * 2 + 1)
        pool.wake()
        assert all(reg["generation"] == 2 for reg in vmm.regions(pool.id))
        with pool.export_handles() as again:    # a new physical memory: a new export
            assert {s.generation for s in again.segments} == {2}
        x.fill_(1.0)
        g.replay()
        tp.cuda.synchronize()
        # the peer still maps the memory of before the sleep, not the woken one
        np.testing.assert_array_equal(peer.ask("read", "out"), np.arange(N, dtype=np.float32) * 2 + 1)
        np.testing.assert_array_equal(out.cpu().numpy(), np.full(N, 3.0, np.float32))
    finally:
        peer.close()


def _pool_with_a_tensor():
    """(pool, graph, tensor): a sleepable pool holding one tensor of N
    zeros, allocated by the graph's capture (the graph keeps it)."""
    pool = GraphPool()
    g = CUDAGraph()
    with tp.cuda.graph(g, pool=pool):
        t = tp.zeros(N, device="cuda")
    return pool, g, t


def test_a_process_maps_its_own_exported_segments_at_new_addresses():
    pool, g, t = _pool_with_a_tensor()
    with pool.export_handles() as export:
        mapped = tp.cuda.import_segments(export)
    local = mapped.translate(t.data_ptr())
    assert local != t.data_ptr() and local in {m[1] + (t.data_ptr() - m[0]) for m in mapped.mappings}
    assert any(b[0] <= t.data_ptr() < b[0] + b[2] for b in mapped.blocks)
    view = tp.as_tensor(_View(local, N))
    view.copy_(tp.full((N,), 4.0, device="cuda"))
    tp.cuda.synchronize()
    np.testing.assert_array_equal(t.cpu().numpy(), np.full(N, 4.0, np.float32))
    del view
    mapped.close()
    assert mapped.closed
    with pytest.raises(ValueError, match="closed"):
        mapped.translate(t.data_ptr())


def test_a_mapping_closed_inside_a_capture_is_unmapped_after_it():
    pool, first, t = _pool_with_a_tensor()
    with pool.export_handles() as export:
        mapped = tp.cuda.import_segments(export)
    assert t.data_ptr() in mapped
    x = tp.ones(N, device="cuda")
    g = CUDAGraph()
    with tp.cuda.graph(g):
        y = x + 1.0
        mapped.close()                          # unmapping would break the capture: queued
    assert mapped.closed
    g.replay()
    tp.cuda.synchronize()                       # runs the queue
    np.testing.assert_array_equal(y.cpu().numpy(), np.full(N, 2.0, np.float32))


def test_a_descriptor_that_is_no_exported_segment_raises_cuda_error(tmp_path):
    pool, g, t = _pool_with_a_tensor()
    with pool.export_handles() as export:
        (seg,) = [s for s in export.segments if t.data_ptr() in s]
    if seg.handle_type != "posix_fd":
        pytest.skip(f"the device exports {seg.handle_type} handles here")
    path = tmp_path / "not-a-segment"
    path.write_bytes(b"\0" * 4096)
    fd = os.open(path, os.O_RDONLY)
    try:
        with pytest.raises(tp.cuda.CudaError) as info:
            tp.cuda.import_segments([seg], [fd])
        assert info.value.name.startswith("CUDA_ERROR_")
    finally:
        os.close(fd)


def test_exporting_a_pool_with_no_memory_gives_no_segments():
    with GraphPool().export_handles() as export:
        assert export.segments == [] and export.fds == []


def test_kernel_buffers_lists_the_pool_pointers_the_kernels_were_given():
    x = tp.arange(N, dtype=tp.float32, device="cuda")     # outside the pool
    pool = GraphPool()
    g = CUDAGraph()
    with tp.cuda.graph(g, pool=pool):
        y = x * 2.0
        z = y + 1.0
        w = z * 3.0
    buffers = g.kernel_buffers()
    assert buffers == sorted(set(buffers))
    assert {y.data_ptr(), z.data_ptr(), w.data_ptr()} <= set(buffers)
    assert x.data_ptr() not in buffers
    with pool.export_handles() as export:
        assert all(any(p in s for s in export.segments) for p in buffers)


class _View:
    def __init__(self, ptr, n):
        self.__cuda_array_interface__ = {"shape": (n,), "typestr": "<f4", "data": (ptr, False), "version": 3}
