# SPDX-License-Identifier: Apache-2.0
"""An inclusive prefix sum (scan) of rows, as generated CUDA C, and the
plan that shapes its launches.

Each row of ``n`` contiguous elements is cut into chunks of one block's
worth (``block * ITEMS`` elements); a block scans its chunk: each thread
adds up :data:`ITEMS` consecutive elements, the threads' totals are scanned
across each warp with shuffles, then across the block's warps, and every
thread writes its running sums plus what comes before it. A row of one
chunk is done in that one launch. Longer rows write their chunks' local
scans and chunk totals; the totals (rows x chunks) are scanned the same
way, and a last pass adds each chunk's preceding total (``tp_scan_add``).
Which launches run depends on the shape only (:func:`scan_plan`), never on
the values, so a CUDA graph captures the scan; the order of the additions
is fixed too, so results are the same run to run. Half types and float32
accumulate in float32, float64 in float64, bool and integers in int64.

The front end (dtypes, dimensions, the CPU path) is ``tensorplay._ops.scan``.
"""

from __future__ import annotations

from tensorplay import _dtypes as dt
from tensorplay._kernels import cache
from tensorplay._kernels.codegen import GRID_WAIT, PREAMBLE, load_expr, store_stmt

# Consecutive elements each thread adds up; blocks of 32 to SCAN_BLOCK threads.
ITEMS = 8
SCAN_BLOCK = 512
ADD_BLOCK = 256


def acc_dtype(d: dt.dtype) -> dt.dtype:
    """The accumulator dtype of a scan over dtype ``d``."""
    if d.kind in "biu":
        return dt.int64
    return dt.float64 if d is dt.float64 else dt.float32


def scan_plan(n: int, items: int = ITEMS, block: int = SCAN_BLOCK) -> tuple[int, int, int]:
    """(threads per block, chunk length, chunks per row) of a scan over rows
    of ``n`` elements: whole warps covering a short row, ``block`` threads
    for a long one, each thread on ``items`` elements (the tests run the
    schedule with small ones)."""
    need = -(-n // items)
    threads = min(block, max(32, -(-need // 32) * 32))
    chunk = threads * items
    return threads, chunk, max(1, -(-n // chunk))


def scan_source(name: str, in_t: dt.dtype, acc: dt.dtype, out_t: dt.dtype, items: int = ITEMS,
                block: int = SCAN_BLOCK) -> str:
    """``name``: the inclusive scan of each chunk of ``src`` (rows of ``n``
    elements, ``chunks`` chunks of ``chunk_len`` per row) into ``dst``, and,
    when a row has several chunks, each chunk's total into ``part`` (rows x
    chunks); blocks of at most ``block`` threads, each on ``items``
    consecutive elements."""
    a = acc.ctype
    return PREAMBLE + f"""
extern "C" __global__ void __launch_bounds__({block}) {name}(
    const {in_t.ctype}* __restrict__ src, {out_t.ctype}* __restrict__ dst, {a}* __restrict__ part,
    long long n, long long chunks, long long chunk_len) {{{GRID_WAIT}  __shared__ {a} warp_sum[{block // 32}];
  const long long row = blockIdx.x / chunks, c = blockIdx.x - row * chunks;
  const long long start = c * chunk_len;
  const long long len = (n - start < chunk_len) ? n - start : chunk_len;
  const {in_t.ctype}* s = src + row * n + start;
  {out_t.ctype}* d = dst + row * n + start;
  const int t = threadIdx.x, lane = t & 31, warp = t >> 5, warps = (int)(blockDim.x >> 5);
  const long long first = (long long)t * {items};
  {a} v[{items}];
  {a} run = 0;
#pragma unroll
  for (int k = 0; k < {items}; ++k) {{
    const long long j = first + k;
    if (j < len) run += ({a})({load_expr(in_t, "s", "j")});
    v[k] = run;
  }}
  // the threads' totals, scanned across the warp, then across the block's warps
  {a} incl = run;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {{
    const {a} y = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += y;
  }}
  if (lane == 31) warp_sum[warp] = incl;
  __syncthreads();
  if (warp == 0) {{
    {a} w = lane < warps ? warp_sum[lane] : ({a})0;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {{
      const {a} y = __shfl_up_sync(0xffffffffu, w, o);
      if (lane >= o) w += y;
    }}
    if (lane < warps) warp_sum[lane] = w;
  }}
  __syncthreads();
  const {a} before = incl - run + (warp ? warp_sum[warp - 1] : ({a})0);
#pragma unroll
  for (int k = 0; k < {items}; ++k) {{
    const long long j = first + k;
    if (j < len) {{ {store_stmt(out_t, "d", "j", f"v[k] + before")} }}
  }}
  if (chunks > 1 && t == (int)blockDim.x - 1) part[row * chunks + c] = before + run;
}}
"""


def add_source(name: str, acc: dt.dtype, out_t: dt.dtype) -> str:
    """``name``: ``dst[i] = local[i] + (the totals of the chunks before i's
    in its row)``, from the scanned chunk totals ``part`` (rows x chunks,
    inclusive), grid-stride over ``total`` elements. ``local`` and ``dst``
    may be one array."""
    a = acc.ctype
    return PREAMBLE + f"""
extern "C" __global__ void __launch_bounds__({ADD_BLOCK}) {name}(
    const {a}* local, const {a}* __restrict__ part, {out_t.ctype}* dst,
    long long total, long long n, long long chunks, long long chunk_len) {{{GRID_WAIT}  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total;
       i += (long long)gridDim.x * blockDim.x) {{
    const long long row = i / n, c = (i - row * n) / chunk_len;
    {a} v = local[i];
    if (c) v += part[row * chunks + c - 1];
    {store_stmt(out_t, "dst", "i", "v")}
  }}
}}
"""


def scan_function(in_t: dt.dtype, out_t: dt.dtype, device: int):
    """The loaded chunk-scan kernel from ``in_t`` to ``out_t`` (accumulating in acc_dtype(in_t))."""
    acc = acc_dtype(in_t)

    def make():
        name = f"tp_scan_{in_t.name}_{acc.name}_{out_t.name}"
        return scan_source(name, in_t, acc, out_t), name
    return cache.cached_function(("scan", in_t.code, out_t.code), device, make)


def add_function(acc: dt.dtype, out_t: dt.dtype, device: int):
    """The loaded kernel adding the chunks' preceding totals, from ``acc`` to ``out_t``."""
    def make():
        name = f"tp_scan_add_{acc.name}_{out_t.name}"
        return add_source(name, acc, out_t), name
    return cache.cached_function(("scan_add", acc.code, out_t.code), device, make)
