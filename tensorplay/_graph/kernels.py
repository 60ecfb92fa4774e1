# SPDX-License-Identifier: Apache-2.0
"""The kernels the graph layer launches itself: stage_and_launch's table-driven
multi-tensor copy, and the one-thread kernels that set a conditional node's
handle: from a device bool (IF, IF/ELSE, WHILE) or from a device integer
index (SWITCH, one variant per integer dtype); the node profile's timestamp
kernels."""

from __future__ import annotations

from tensorplay._kernels import cache
from tensorplay._kernels.codegen import GRID_WAIT


def multi_copy_source(capacity: int) -> str:
    """A kernel copying up to ``capacity`` (src, dst, nbytes) entries given in its
    parameters; blockIdx.y picks the entry, 16-byte moves when aligned."""
    return f"""
struct tp_entry {{ const unsigned char* src; unsigned char* dst; unsigned long long nbytes; }};
struct tp_table_{capacity} {{ unsigned long long n; tp_entry e[{capacity}]; }};
extern "C" __global__ void tp_multi_copy_{capacity}(tp_table_{capacity} t) {{{GRID_WAIT}  unsigned int k = blockIdx.y;
  if (k >= t.n) return;
  const unsigned char* s = t.e[k].src;
  unsigned char* d = t.e[k].dst;
  unsigned long long nb = t.e[k].nbytes;
  unsigned long long tid = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
  unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
  if ((((unsigned long long)s | (unsigned long long)d | nb) & 15ULL) == 0) {{
    const uint4* s4 = (const uint4*)s;
    uint4* d4 = (uint4*)d;
    for (unsigned long long j = tid; j < nb / 16; j += stride) d4[j] = s4[j];
  }} else {{
    for (unsigned long long j = tid; j < nb; j += stride) d[j] = s[j];
  }}
}}
"""


SET_CONDITIONAL_SOURCE = r"""
typedef __device_builtin__ unsigned long long cudaGraphConditionalHandle;
extern "C" __device__ __cudart_builtin__ void cudaGraphSetConditional(cudaGraphConditionalHandle, unsigned int);
extern "C" __global__ void tp_set_conditional(cudaGraphConditionalHandle handle, const bool* pred) {""" + GRID_WAIT + r"""  cudaGraphSetConditional(handle, *pred ? 1u : 0u);
}
"""


# The C type of each integer dtype a SWITCH index may have, and whether it is signed.
SWITCH_INDEX_TYPES = {
    "uint8": ("unsigned char", False), "int8": ("signed char", True), "int16": ("short", True),
    "int32": ("int", True), "int64": ("long long", True),
}


def set_switch_source(dtype: str) -> str:
    """The one-thread kernel that writes a SWITCH node's case from a device
    integer of ``dtype``: the value when it lies in [0, num_cases), else
    ``num_cases``, which selects no body (a negative or huge index must not
    wrap into range when narrowed to the handle's unsigned int)."""
    try:
        ctype, signed = SWITCH_INDEX_TYPES[dtype]
    except KeyError:
        raise ValueError(f"a SWITCH index must have an integer dtype, got {dtype}") from None
    in_range = "v >= 0 && " if signed else ""
    return f"""
typedef __device_builtin__ unsigned long long cudaGraphConditionalHandle;
extern "C" __device__ __cudart_builtin__ void cudaGraphSetConditional(cudaGraphConditionalHandle, unsigned int);
extern "C" __global__ void tp_set_switch_{dtype}(cudaGraphConditionalHandle handle, const {ctype}* index,
                                                 unsigned long long num_cases) {{{GRID_WAIT}  {ctype} v = *index;
  bool in_range = {in_range}(unsigned long long)v < num_cases;
  cudaGraphSetConditional(handle, in_range ? (unsigned int)v : (unsigned int)num_cases);
}}
"""


def set_switch_function(dtype, device):
    """The loaded kernel that copies a device integer of ``dtype`` into a SWITCH handle."""
    return cache.cached_function(("set_switch", dtype), device,
                                 lambda: (set_switch_source(dtype), f"tp_set_switch_{dtype}"))


def set_conditional_function(device):
    """The one-thread kernel that copies a device bool into a conditional handle."""
    return cache.cached_function(("set_conditional",), device,
                                    lambda: (SET_CONDITIONAL_SOURCE, "tp_set_conditional"))


def multi_copy_function(capacity, device):
    """The loaded multi-copy kernel for tables of ``capacity`` entries."""
    return cache.cached_function(("multi_copy", capacity), device,
                                 lambda: (multi_copy_source(capacity), f"tp_multi_copy_{capacity}"))


# The node profile's stamps (profile_nodes): one thread reads the global
# timer (ns). A record is [last start, sum of durations, count, durations...];
# the end stamp keeps the first ``cap`` durations. No grid-dependency wait:
# they are graph nodes, never launched with PDL.
PROFILE_STAMP_SOURCE = r"""
__device__ __forceinline__ unsigned long long tp_now() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
extern "C" __global__ void tp_profile_start(unsigned long long* rec, unsigned int cap) {
  rec[0] = tp_now();
}
extern "C" __global__ void tp_profile_end(unsigned long long* rec, unsigned int cap) {
  unsigned long long d = tp_now() - rec[0];
  unsigned long long c = rec[2];
  if (c < cap) rec[3 + c] = d;
  rec[1] += d;
  rec[2] = c + 1;
}
extern "C" __global__ void tp_profile_empty() {}
"""


def profile_stamp_functions(device):
    """The start stamp, the end stamp and the empty kernel of the node profile."""
    return tuple(cache.cached_function(("profile_stamp", name), device,
                                       lambda name=name: (PROFILE_STAMP_SOURCE, name))
                 for name in ("tp_profile_start", "tp_profile_end", "tp_profile_empty"))
