# SPDX-License-Identifier: Apache-2.0
"""Pool memory other processes map: the records and the pool-level functions.

``export_pool_handles(pool_id)`` describes each segment of a pool on one
device as an ``ExportedSegment`` (picklable: the exporter's address, size,
handle type, the live blocks) and opens what a peer needs to map it: a
POSIX file descriptor per sleepable segment (returned apart, in
``PoolExport.fds``: descriptors travel over a Unix socket, never in a
pickle), or a fabric handle, or for a plain (cuMemAlloc) pool a CUDA IPC
handle carried in the record. ``import_segments(segments, fds)`` checks the
records and maps them (tensorplay._memory.ipc).
"""

from __future__ import annotations

import dataclasses
import os
import stat
from collections.abc import Iterable, Sequence
from typing import Any

from tensorplay._driver.context import device_index
from tensorplay._memory import ipc, vmm
from tensorplay._memory.allocator import PoolAsleepError, is_sleepable
from tensorplay._memory.api import allocator, pool_asleep
from tensorplay._memory.ipc import MappedPeerMemory

__all__ = ["ExportedSegment", "MappedPeerMemory", "PoolExport", "export_pool_handles", "import_segments"]

HANDLE_TYPES = ("posix_fd", "fabric", "cuda_ipc")
HANDLE_BYTES = 64


@dataclasses.dataclass(frozen=True)
class ExportedSegment:
    """One segment of an exported memory pool: what another process needs to map it.

    Picklable (send it with any transport); a ``posix_fd`` segment's file
    descriptor travels apart (``PoolExport.fds[fd_index]``), over a Unix
    socket (``socket.send_fds`` / ``socket.recv_fds``) or with
    ``pidfd_getfd``.

    Attributes
    ----------
    pool_id : int
        The exporter's pool.
    device : int
        The exporter's device index; ``device_uuid`` names the GPU.
    device_uuid : str
        The GPU's UUID (32 hex digits), the same in every process.
    pid : int
        The exporting process.
    address : int
        The segment's address in the exporting process.
    size : int
        Its size in bytes.
    handle_type : str
        ``"posix_fd"``, ``"fabric"`` (sleepable pools) or ``"cuda_ipc"`` (plain pools).
    handle : bytes or None
        The 64-byte fabric or CUDA IPC handle; None for ``posix_fd``.
    fd_index : int or None
        For ``posix_fd``: the index of its descriptor in the export's ``fds``.
    generation : int
        The physical memories the segment has had when exported (a wake
        makes a new one: a mapping made before it shows the old memory).
    blocks : tuple of (offset, size), or None
        The blocks allocated when exported; None for a segment PyTorch's
        allocator took for the pool (its blocks are PyTorch's).
    """

    pool_id: int
    device: int
    device_uuid: str
    pid: int
    address: int
    size: int
    handle_type: str
    handle: bytes | None = None
    fd_index: int | None = None
    generation: int = 0
    blocks: tuple[tuple[int, int], ...] | None = ()

    def __post_init__(self) -> None:
        check_segment(self)

    def __contains__(self, address: object) -> bool:
        return isinstance(address, int) and self.address <= address < self.address + self.size


def check_segment(seg: ExportedSegment) -> None:
    """Raise TypeError or ValueError unless ``seg``'s fields fit together."""
    for name in ("pool_id", "device", "pid", "address", "size", "generation"):
        value = getattr(seg, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"ExportedSegment.{name} must be a non-negative int, got {value!r}")
    if seg.size == 0 or seg.address == 0:
        raise ValueError(f"ExportedSegment: empty segment (address {seg.address:#x}, size {seg.size})")
    if seg.handle_type not in HANDLE_TYPES:
        raise ValueError(f"ExportedSegment.handle_type must be one of {', '.join(HANDLE_TYPES)}, "
                         f"got {seg.handle_type!r}")
    if seg.handle_type == "posix_fd":
        if seg.handle is not None:
            raise ValueError("ExportedSegment: a posix_fd segment carries no handle bytes (its fd travels apart)")
        if isinstance(seg.fd_index, bool) or not isinstance(seg.fd_index, int) or seg.fd_index < 0:
            raise ValueError(f"ExportedSegment: a posix_fd segment needs fd_index, got {seg.fd_index!r}")
    else:
        if not isinstance(seg.handle, bytes) or len(seg.handle) != HANDLE_BYTES:
            got = f"{len(seg.handle)} bytes" if isinstance(seg.handle, bytes) else type(seg.handle).__name__
            raise ValueError(f"ExportedSegment: a {seg.handle_type} segment needs its {HANDLE_BYTES}-byte "
                             f"handle, got {got}")
        if seg.fd_index is not None:
            raise ValueError(f"ExportedSegment: a {seg.handle_type} segment has no fd_index")
    if seg.blocks is not None:
        for b in seg.blocks:
            if not (isinstance(b, tuple) and len(b) == 2 and all(isinstance(x, int) for x in b)
                    and 0 <= b[0] and 0 < b[1] and b[0] + b[1] <= seg.size):
                raise ValueError(f"ExportedSegment.blocks: {b!r} is not an (offset, size) inside the segment")


class PoolExport:
    """The exported segments of a pool on one device, and the file descriptors they need.

    ``segments`` is picklable; ``fds`` (one per ``posix_fd`` segment, at
    its ``fd_index``) are this process's descriptors: send them over a
    Unix socket (``socket.send_fds``), then ``close()`` the export (or use
    it as a context manager), which closes them. The peer's mapping keeps
    the memory alive after they are closed.
    """

    def __init__(self, segments: Sequence[ExportedSegment], fds: Sequence[int]) -> None:
        self.segments: list[ExportedSegment] = list(segments)
        self.fds: list[int] = list(fds)

    def close(self) -> None:
        """Close the file descriptors (closing twice does nothing)."""
        fds, self.fds = self.fds, []
        for fd in fds:
            try:
                os.close(fd)
            except OSError:
                pass

    def __enter__(self) -> PoolExport:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __len__(self) -> int:
        return len(self.segments)

    def __repr__(self) -> str:
        total = sum(s.size for s in self.segments)
        return f"<PoolExport {len(self.segments)} segments, {total} bytes, {len(self.fds)} fds>"


def segment_blocks(snapshot: Iterable[dict[str, Any]], pool_id: int) -> dict[int, tuple[tuple[int, int], ...]]:
    """The allocated blocks of ``pool_id``'s segments in an allocator
    snapshot, as {segment address: ((offset, size), ...)}."""
    out = {}
    for seg in snapshot:
        if seg["segment_pool_id"] != pool_id:
            continue
        base = seg["address"]
        out[base] = tuple((b["address"] - base, b["size"]) for b in seg["blocks"] if b["state"] == "allocated")
    return out


def pool_ranges(pool_id: int, device: int) -> list[tuple[int, int]]:
    """The address ranges ``(address, size)`` of pool ``pool_id``'s segments
    on ``device``, sorted: the allocator's, and for a sleepable pool also
    those PyTorch's allocator took for work captured into it."""
    ranges = {s["address"]: s["total_size"] for s in allocator(device).snapshot() if s["segment_pool_id"] == pool_id}
    if is_sleepable(pool_id):
        for reg in vmm.regions(pool_id):
            if reg["device"] == device:
                ranges.setdefault(reg["address"], reg["size"])
    return sorted(ranges.items())


def export_pool_handles(pool_id: int, device: Any = None, handle_type: str = "auto") -> PoolExport:
    """Export the segments of memory pool ``pool_id`` on ``device`` for other processes to map.

    A sleepable pool's segments (tensorplay's and those PyTorch's allocator
    took for work captured into the pool) are exported as shareable
    handles: a POSIX file descriptor each (``handle_type="posix_fd"``, what
    ``"auto"`` picks where the segment has one) or a fabric handle
    (``"fabric"``, where the device and the system support it). A plain
    pool's segments (cuMemAlloc) are exported as CUDA IPC handles.
    A sleeping pool is refused (:class:`PoolAsleepError`).

    Parameters
    ----------
    pool_id : int
        The pool (``GraphPool.id``, ``graph_pool_handle()``, a graph's ``pool_id``).
    device : device, str, int or None, optional
        Default the current device.
    handle_type : str, optional
        ``"auto"``, ``"posix_fd"`` or ``"fabric"`` (sleepable pools).

    Returns
    -------
    PoolExport
        The segments and the file descriptors; close it once they are sent.
    """
    if isinstance(pool_id, bool) or not isinstance(pool_id, int):
        raise TypeError(f"pool_id must be an int, got {type(pool_id).__name__}")
    if handle_type not in ("auto", "posix_fd", "fabric"):
        raise ValueError(f"handle_type must be 'auto', 'posix_fd' or 'fabric', got {handle_type!r}")
    sleepable = is_sleepable(pool_id)
    if not sleepable and handle_type != "auto":
        raise ValueError(f"handle_type={handle_type!r}: memory pool {pool_id} is not sleepable; its cuMemAlloc "
                         f"segments are exported as CUDA IPC handles (handle_type='auto')")
    d = device_index(device)
    if pool_asleep(pool_id):
        raise PoolAsleepError(f"export: memory pool {pool_id} is asleep (its memory was given back by sleep()); "
                              f"wake() it before exporting it")
    a = allocator(d)
    blocks = segment_blocks(a.snapshot(), pool_id)
    uuid = ipc.device_uuid(d)
    pid = os.getpid()
    segments: list[ExportedSegment] = []
    fds: list[int] = []
    try:
        if sleepable:
            for reg in sorted(vmm.regions(pool_id), key=lambda r: r["address"]):
                if reg["device"] != d:
                    continue
                kind = handle_type
                if kind == "auto":
                    kind = "posix_fd" if "posix_fd" in reg["handle_types"] else "fabric"
                if kind not in reg["handle_types"]:
                    have = ", ".join(reg["handle_types"]) or "none"
                    raise RuntimeError(f"export: the segment at {reg['address']:#x} of memory pool {pool_id} has no "
                                       f"{kind} handle (its handle types: {have}; cuda:{d} or the system "
                                       f"refused the others: vmm.shareable_handle_types)")
                fd, handle, generation = ipc.export_segment(reg["address"], d, kind)
                if fd is not None:
                    fds.append(fd)
                segments.append(ExportedSegment(
                    pool_id=pool_id, device=d, device_uuid=uuid, pid=pid, address=reg["address"], size=reg["size"],
                    handle_type=kind, handle=handle, fd_index=len(fds) - 1 if fd is not None else None,
                    generation=generation, blocks=blocks.get(reg["address"])))
        else:
            for seg in sorted(a.snapshot(), key=lambda s: s["address"]):
                if seg["segment_pool_id"] != pool_id:
                    continue
                segments.append(ExportedSegment(
                    pool_id=pool_id, device=d, device_uuid=uuid, pid=pid, address=seg["address"],
                    size=seg["total_size"], handle_type="cuda_ipc", handle=ipc.ipc_handle(seg["address"], d),
                    blocks=blocks[seg["address"]]))
    except BaseException:
        PoolExport([], fds).close()
        raise
    return PoolExport(segments, fds)


def check_import(segments: Sequence[ExportedSegment], fds: Sequence[int]) -> list[tuple[int, int, str, Any]]:
    """Check what ``import_segments`` was given and return what to map:
    ``(address, size, kind, source)`` per segment (see ipc.map_segments)."""
    specs: list[tuple[int, int, str, Any]] = []
    seen: list[ExportedSegment] = []
    for i, seg in enumerate(segments):
        if not isinstance(seg, ExportedSegment):
            raise TypeError(f"import_segments: item {i} is a {type(seg).__name__}, not an ExportedSegment")
        check_segment(seg)      # a record built around __init__ (replace, unpickling) is checked too
        for other in seen:
            if other.pid == seg.pid and other.address < seg.address + seg.size and \
                    seg.address < other.address + other.size:
                raise ValueError(f"import_segments: segments at {other.address:#x} and {seg.address:#x} of "
                                 f"process {seg.pid} overlap")
        seen.append(seg)
        if seg.handle_type == "posix_fd":
            assert seg.fd_index is not None      # check_segment: a posix_fd segment has one
            if seg.fd_index >= len(fds):
                raise ValueError(f"import_segments: segment {i} needs fds[{seg.fd_index}], but {len(fds)} fds "
                                 f"were given (file descriptors travel apart: socket.send_fds / recv_fds)")
            fd = fds[seg.fd_index]
            if isinstance(fd, bool) or not isinstance(fd, int) or fd < 0:
                raise ValueError(f"import_segments: fds[{seg.fd_index}] is not a file descriptor: {fd!r}")
            try:
                mode = os.fstat(fd).st_mode
            except OSError as exc:
                raise ValueError(f"import_segments: fds[{seg.fd_index}] = {fd} is not an open file descriptor "
                                 f"({exc.strerror})") from None
            if stat.S_ISDIR(mode):
                raise ValueError(f"import_segments: fds[{seg.fd_index}] = {fd} is a directory, not an exported "
                                 f"segment")
            specs.append((seg.address, seg.size, "shareable", fd))
        elif seg.handle_type == "fabric":
            specs.append((seg.address, seg.size, "shareable", seg.handle))
        else:
            if seg.pid == os.getpid():
                raise ValueError("import_segments: a CUDA IPC handle (a plain pool's segment) cannot be opened by "
                                 "the process that exported it; use the pool's own memory, or a sleepable pool")
            specs.append((seg.address, seg.size, "cuda_ipc", seg.handle))
    return specs


def import_segments(segments: Iterable[ExportedSegment] | PoolExport, fds: Sequence[int] = (),
                    device: Any = None) -> MappedPeerMemory:
    """Map another process's exported pool segments into this process.

    Each segment is mapped read-write for ``device``: a shareable handle is
    imported (cuMemImportFromShareableHandle) and mapped at a new address
    range (cuMemAddressReserve, cuMemMap, cuMemSetAccess); a CUDA IPC
    handle is opened (cuIpcOpenMemHandle). The file descriptors are not
    closed: they are the caller's (close them once this returns; the
    mapping keeps the memory alive). The exporter's memory may be on
    another GPU than ``device`` where the two can access each other's
    memory (peer access).

    Parameters
    ----------
    segments : iterable of ExportedSegment, or a PoolExport
        What :func:`export_pool_handles` (``GraphPool.export_handles``)
        returned in the exporting process; a PoolExport brings its fds.
    fds : sequence of int, optional
        The file descriptors received for the ``posix_fd`` segments, in the
        exporter's ``fds`` order (``socket.recv_fds`` keeps it).
    device : device, str, int or None, optional
        The device that accesses the memory; default the current device.

    Returns
    -------
    MappedPeerMemory
        The mappings; ``translate(address)`` gives the local address of an
        exporter's address; ``close()`` unmaps.
    """
    if isinstance(segments, PoolExport):
        if fds:
            raise ValueError("import_segments: a PoolExport brings its own fds; pass fds only with a list of segments")
        records, fds = tuple(segments.segments), segments.fds
    else:
        records = tuple(segments)
    fds = tuple(fds)
    specs = check_import(records, fds)
    d = device_index(device)
    return ipc.map_segments(specs, d, records)
