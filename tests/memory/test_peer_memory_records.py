# SPDX-License-Identifier: Apache-2.0
"""Pool memory other processes map, without a GPU: the exported segment
records (fields checked, picklable), the export's file descriptors (closed
once), what import_segments refuses before touching the driver (a record of
another type, a missing, closed or directory fd, a CUDA IPC handle opened
by its own process, overlapping segments), the order in which segments
fall back to fewer shareable handle types, the blocks read from an
allocator snapshot (the fake backend), an empty mapping, and the
arguments a pool export checks. The GPU half is test_peer_memory.py."""
import dataclasses
import os
import pickle

import pytest

import tensorplay as tp
from helpers import HAS_CUDA
from tensorplay._memory import ipc, sharing, vmm
from tensorplay._testing import DeviceAllocator, FakeBackend
from tensorplay.cuda import ExportedSegment, MappedPeerMemory, PoolExport, export_pool_handles, import_segments

MiB = 1 << 20
no_gpu = pytest.mark.skipif(HAS_CUDA, reason="checks the no-GPU behaviour")


def fd_segment(**changes):
    fields = dict(pool_id=3, device=0, device_uuid="ab" * 16, pid=os.getpid() + 1, address=0x7F0000000000,
                  size=2 * MiB, handle_type="posix_fd", fd_index=0, generation=1, blocks=((0, 512), (1024, 4096)))
    fields.update(changes)
    return ExportedSegment(**fields)


def ipc_segment(**changes):
    fields = dict(pool_id=4, device=0, device_uuid="cd" * 16, pid=os.getpid() + 1, address=0x7F0000400000,
                  size=20 * MiB, handle_type="cuda_ipc", handle=bytes(range(64)), blocks=((0, 20 * MiB),))
    fields.update(changes)
    return ExportedSegment(**fields)


def test_a_segment_record_pickles_to_an_equal_record():
    for seg in (fd_segment(), ipc_segment(), ipc_segment(handle_type="fabric"), fd_segment(blocks=None)):
        again = pickle.loads(pickle.dumps(seg))
        assert again == seg and again.blocks == seg.blocks
    seg = fd_segment()
    assert seg.address in seg and seg.address + seg.size - 1 in seg
    assert seg.address + seg.size not in seg and "x" not in seg


@pytest.mark.parametrize("changes, words", [
    ({"handle_type": "ipc"}, "handle_type must be one of posix_fd, fabric, cuda_ipc"),
    ({"fd_index": None}, "needs fd_index"),
    ({"fd_index": -1}, "needs fd_index"),
    ({"handle": bytes(64)}, "carries no handle bytes"),
    ({"size": 0}, "empty segment"),
    ({"address": -5}, "address must be a non-negative int"),
    ({"pid": True}, "pid must be a non-negative int"),
    ({"blocks": ((0, 4 * MiB),)}, "is not an (offset, size) inside the segment"),
    ({"blocks": ([0, 512],)}, "is not an (offset, size) inside the segment"),
    ({"handle_type": "fabric", "fd_index": None, "handle": bytes(63)}, "64-byte handle, got 63 bytes"),
    ({"handle_type": "cuda_ipc", "fd_index": None, "handle": "x" * 64}, "64-byte handle, got str"),
    ({"handle_type": "cuda_ipc", "handle": bytes(64)}, "has no fd_index"),
], ids=lambda v: str(v)[:40])
def test_a_record_whose_fields_do_not_fit_is_refused(changes, words):
    with pytest.raises(ValueError) as info:
        fd_segment(**changes)
    assert words in str(info.value)


def test_the_export_closes_its_fds_once():
    r, w = os.pipe()
    export = PoolExport([fd_segment()], [r, w])
    assert len(export) == 1 and "1 segments" in repr(export) and "2 fds" in repr(export)
    with export:
        pass
    assert export.fds == []
    for fd in (r, w):
        with pytest.raises(OSError):
            os.fstat(fd)
    export.close()                      # twice: nothing (never closes a number reused since)


def test_import_refuses_what_is_no_segment():
    with pytest.raises(TypeError, match="item 1 is a dict, not an ExportedSegment"):
        import_segments([ipc_segment(), {"address": 1}])


def test_import_needs_the_fd_of_each_posix_fd_segment():
    with pytest.raises(ValueError, match=r"needs fds\[0\], but 0 fds were given .*send_fds"):
        import_segments([fd_segment()])
    with pytest.raises(ValueError, match=r"needs fds\[2\], but 1 fds"):
        import_segments([fd_segment(fd_index=2)], [0])


def test_import_refuses_a_closed_fd_and_a_directory(tmp_path):
    r, w = os.pipe()
    os.close(r)
    os.close(w)
    with pytest.raises(ValueError, match=rf"fds\[0\] = {r} is not an open file descriptor"):
        import_segments([fd_segment()], [r])
    with pytest.raises(ValueError, match=r"is not a file descriptor: 'x'"):
        import_segments([fd_segment()], ["x"])
    d = os.open(tmp_path, os.O_RDONLY)
    try:
        with pytest.raises(ValueError, match="is a directory, not an exported segment"):
            import_segments([fd_segment()], [d])
    finally:
        os.close(d)


def test_import_refuses_a_cuda_ipc_handle_of_this_process():
    with pytest.raises(ValueError, match="cannot be opened by the process that exported it"):
        import_segments([ipc_segment(pid=os.getpid())])


def test_import_refuses_overlapping_segments_and_a_record_edited_around_its_checks():
    a = ipc_segment()
    with pytest.raises(ValueError, match="overlap"):
        import_segments([a, ipc_segment(address=a.address + MiB)])
    broken = dataclasses.replace(a)
    object.__setattr__(broken, "size", 0)                 # past __post_init__, as a hand-made pickle could be
    with pytest.raises(ValueError, match="empty segment"):
        import_segments([broken])


def test_a_pool_export_brings_its_own_fds():
    with pytest.raises(ValueError, match="brings its own fds"):
        import_segments(PoolExport([], []), [3])


@no_gpu
def test_import_checks_its_records_first_and_then_needs_a_gpu():
    r, w = os.pipe()
    try:
        with pytest.raises(tp.cuda.CudaUnavailableError):
            import_segments([fd_segment()], [r])
    finally:
        os.close(r)
        os.close(w)


def test_export_checks_its_arguments_before_the_device():
    with pytest.raises(TypeError, match="pool_id must be an int, got str"):
        export_pool_handles("1")
    with pytest.raises(ValueError, match="handle_type must be 'auto', 'posix_fd' or 'fabric', got 'dmabuf'"):
        export_pool_handles(1, handle_type="dmabuf")
    with pytest.raises(ValueError, match="is not sleepable; its cuMemAlloc segments are exported as CUDA IPC"):
        export_pool_handles(10**9, handle_type="posix_fd")


@no_gpu
def test_export_needs_a_gpu():
    with pytest.raises(tp.cuda.CudaUnavailableError):
        export_pool_handles(10**9)


def test_segments_fall_back_to_fewer_handle_types_fabric_first():
    both = vmm.FD_TYPE | vmm.FABRIC_TYPE
    assert vmm.next_handle_types(both) == vmm.FD_TYPE
    assert vmm.next_handle_types(vmm.FABRIC_TYPE) == 0
    assert vmm.next_handle_types(vmm.FD_TYPE) == 0
    assert vmm.next_handle_types(0) == -1
    assert vmm.handle_type_names(both) == ["posix_fd", "fabric"] and vmm.handle_type_names(0) == []


def test_the_live_blocks_of_a_segment_come_from_the_allocator_snapshot():
    a = DeviceAllocator(0, FakeBackend())
    x = a.allocate(1000)
    y = a.allocate(3000)
    z = a.allocate(700)
    del y                                # a free block between two live ones
    (seg,) = a.snapshot()
    blocks = sharing.segment_blocks(a.snapshot(), 0)
    assert blocks == {seg["address"]: ((0, 1024), (1024 + 3072, 1024))}      # sizes rounded to 512 B
    assert (x.ptr, z.ptr) == (seg["address"], seg["address"] + 1024 + 3072)
    assert sharing.segment_blocks(a.snapshot(), 7) == {}


def test_an_empty_mapping_translates_nothing_and_closes_quietly():
    m = ipc.map_segments([], 0, ())
    assert isinstance(m, MappedPeerMemory) and m.mappings == [] and m.blocks == [] and not m.closed
    with pytest.raises(ValueError, match="in none of the 0 mapped segments"):
        m.translate(0x1000)
    assert 0x1000 not in m and "x" not in m
    with pytest.raises(TypeError, match="send the exported segments instead"):
        pickle.dumps(m)
    with m:
        pass
    assert m.closed and "closed" in repr(m)
    with pytest.raises(ValueError, match="is closed"):
        m.translate(0x1000)
    m.close()
    with pytest.raises(TypeError, match="made by tensorplay.cuda.import_segments"):
        MappedPeerMemory()


def test_the_sharing_names_are_public_in_tensorplay_cuda():
    for name in ("ExportedSegment", "MappedPeerMemory", "PoolExport", "export_pool_handles", "import_segments"):
        assert name in tp.cuda.__all__ and getattr(tp.cuda, name) is getattr(sharing, name)
    assert callable(tp.cuda.GraphPool.export_handles) and callable(tp.cuda.CUDAGraph.kernel_buffers)


def test_kernel_buffers_of_an_empty_graph_names_the_method():
    with pytest.raises(RuntimeError, match="^kernel_buffers: nothing captured"):
        tp.cuda.CUDAGraph().kernel_buffers()
