# SPDX-License-Identifier: Apache-2.0
"""Small host data carried to the device inside a kernel's parameters.

A CUDA graph cannot hold a copy from pageable host memory: the buffer may be
gone or changed by the time the graph replays, so the driver refuses it in a
capture. Kernel parameters, though, are copied by the driver when the kernel
is launched (and kept by the kernel node a capture records), so data up to
:data:`PARAM_UPLOAD_MAX_BYTES` travels in the parameter buffer of a one-block
"write these bytes" kernel instead: the values are baked in at the call, the
host object may go at once, and every replay writes the same bytes.

tensorplay uses this path inside and outside captures alike (one behaviour;
for tiny data a launch also beats the driver's pageable-copy staging).

The kernel comes in a few parameter capacities (:data:`PARAM_UPLOAD_CAPACITIES`),
because the parameter buffer is always packed to the kernel's full parameter
size: 12 bytes need not carry 4 KiB through every launch and graph node.
"""

from __future__ import annotations

import struct

from tensorplay._kernels import cache
from tensorplay._kernels.codegen import GRID_WAIT

# The most host bytes one upload carries in kernel parameters: 4 KiB, the
# classic kernel-parameter limit. The parameter buffer of the largest table is
# this plus a 16-byte header, within the 32,764 bytes every GPU tensorplay
# supports (compute capability 7.5+) takes since CUDA 12.1.
PARAM_UPLOAD_MAX_BYTES = 4096
# Data capacities of the write kernel's tables, smallest first; the last is the limit.
PARAM_UPLOAD_CAPACITIES = (256, 1024, PARAM_UPLOAD_MAX_BYTES)
# One block writes the bytes: 4 KiB is 16 byte stores per thread.
PARAM_WRITE_BLOCK = 256

# The table's header: destination address, byte count (then the data).
_HEADER = struct.Struct("<QQ")
PARAM_HEADER_BYTES = _HEADER.size


def param_write_source(capacity: int) -> str:
    """CUDA C of the kernel writing up to ``capacity`` bytes given in its
    parameters to a device address. Byte stores, so any destination alignment
    and size (1-byte bool, 2-byte halves, odd offsets) is written exactly."""
    return f"""
struct tp_param_bytes_{capacity} {{ unsigned char* dst; unsigned long long nbytes; unsigned char data[{capacity}]; }};
extern "C" __global__ void __launch_bounds__({PARAM_WRITE_BLOCK})
tp_write_param_bytes_{capacity}(const __grid_constant__ tp_param_bytes_{capacity} p) {{{GRID_WAIT}  for (unsigned long long j = threadIdx.x; j < p.nbytes; j += blockDim.x) p.dst[j] = p.data[j];
}}
"""


def param_write_capacity(nbytes: int) -> int:
    """The smallest table capacity holding ``nbytes`` bytes; ValueError above
    :data:`PARAM_UPLOAD_MAX_BYTES`."""
    if nbytes < 0:
        raise ValueError(f"a byte count cannot be negative, got {nbytes}")
    for capacity in PARAM_UPLOAD_CAPACITIES:
        if nbytes <= capacity:
            return capacity
    raise ValueError(f"{nbytes} bytes do not fit in kernel parameters: at most "
                     f"{PARAM_UPLOAD_MAX_BYTES} bytes travel this way")


def pack_param_write(dst: int, data) -> tuple:
    """(capacity, parameter buffer) of the launch writing the bytes ``data``
    at device address ``dst``: the header (dst, len(data)), the data, then
    zeros up to the capacity, laid out as the kernel's parameter struct."""
    data = bytes(data)
    capacity = param_write_capacity(len(data))
    return capacity, _HEADER.pack(dst, len(data)) + data + bytes(capacity - len(data))


def param_write_function(capacity: int, device: int):
    """The loaded write kernel for tables of ``capacity`` bytes on ``device``."""
    return cache.cached_function(("param_write", capacity), device,
                                 lambda: (param_write_source(capacity), f"tp_write_param_bytes_{capacity}"))


def launch_param_write(dst: int, data, device: int, stream: int) -> None:
    """Write the bytes ``data`` (bytes-like) (at most :data:`PARAM_UPLOAD_MAX_BYTES`) at
    device address ``dst`` of ``device``, ordered on ``stream``: one
    cuLaunchKernel carrying the data in its parameters, so it can be
    captured and ``data`` may be dropped when this returns."""
    data = bytes(data)
    if not data:
        return
    capacity, params = pack_param_write(dst, data)
    param_write_function(capacity, device).launch(1, PARAM_WRITE_BLOCK, params, 0, stream)
