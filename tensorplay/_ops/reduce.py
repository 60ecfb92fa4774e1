# SPDX-License-Identifier: Apache-2.0
"""Reductions, one pass where the GPU fills: rows (reduced elements
contiguous) go to a block or a warp each, with 16-byte vector loads and warp
shuffles, and long rows are split over blocks with a small second pass over
the per-chunk partials; outer dimensions are reduced in place by column
kernels (threads across the kept inner elements, coalesced, walking rows),
split over rows with a second pass when the columns alone do not fill the
GPU. Every partial is combined in a fixed order, so results are the same run
to run. Half types accumulate in float32, float32 in float32, float64 in
float64, integers in int64."""

from __future__ import annotations

import functools
import math
import numbers
import struct

import numpy as np

from tensorplay import _dtypes as dt
from tensorplay import return_types
from tensorplay._tensor.tensor import Tensor, _empty_cuda, empty, full
from tensorplay._kernels import cache as _kernels
from tensorplay._kernels import codegen as _codegen
from tensorplay._ops.elementwise import apply
from tensorplay._ops.views import permute

# op: (combine kind, has index)
_KINDS = {
    "sum": ("sum", False), "prod": ("prod", False), "amax": ("max", False), "amin": ("min", False),
    "argmax": ("max", True), "argmin": ("min", True), "all": ("all", False), "any": ("any", False),
}


def _acc_dtype(op, d):
    if op in ("all", "any"):
        return dt.bool_
    if op in ("sum", "prod"):
        if d.kind in "biu":
            return dt.int64
        return dt.float64 if d is dt.float64 else dt.float32
    return dt.float32 if d in (dt.float16, dt.bfloat16) else d


def _result_dtype(op, d, dtype):
    if dtype is not None:
        return dt.as_dtype(dtype)
    if op in ("sum", "prod"):
        return dt.int64 if d.kind in "biu" else d
    if op in ("argmax", "argmin"):
        return dt.int64
    if op in ("all", "any"):
        return dt.bool_
    return d


def _limits(acc):
    """(lowest, highest) C literals of an accumulator type."""
    if acc.kind == "f":
        if acc is dt.float64:
            inf = "__longlong_as_double(0x7ff0000000000000LL)"
        else:
            inf = "__int_as_float(0x7f800000)"
        return f"(-{inf})", inf
    if acc is dt.bool_:
        return "false", "true"
    info = np.iinfo(acc.numpy_dtype)
    lo = f"({info.min + 1}LL - 1)" if acc is dt.int64 else str(info.min)
    return f"(({acc.ctype}){lo})", f"(({acc.ctype}){info.max}LL)"


# Row kernels: a block (ROW_WARPS warps) or one warp per row chunk.
ROW_WARPS = 8
WARP_ROW_MAX = 512          # rows up to this long get one warp each
# Column kernels: 8 warps stacked over rows, each lane on up to 8 adjacent columns.
COL_WARPS = 8
COL_MAX_WIDTH = 8
COL_MIN_INNER = 16          # fewer kept inner elements: permute and reduce rows
COL_MIN_ROWS_PER_SPLIT = 64
BLOCKS_PER_SM = 8           # 256-thread blocks that fill an SM's 2048 threads
ROW_SPLIT_MIN = 16384       # rows at least this long may be split over blocks
ROW_CHUNK_MIN = 4096


def _collapsed_pattern(shape, dims):
    """``shape`` as runs of reduced (True) and kept (False) dimensions, size-1
    dimensions dropped: [(reduced, size), ...]."""
    runs = []
    for i, s in enumerate(shape):
        if s == 1:
            continue
        red = i in dims
        if runs and runs[-1][0] == red:
            runs[-1] = (red, runs[-1][1] * s)
        else:
            runs.append((red, s))
    return runs


@functools.lru_cache(maxsize=4096)     # pure; keeps eager host time flat
def reduction_strategy(shape, dims):
    """How a contiguous tensor of ``shape`` is reduced over ``dims`` (sorted):

    ("row", outer, inner)      the reduced elements of each output are contiguous
    ("column", A, R, B)        viewed as [A, R, B], reduce R: threads across B
                               (coalesced), each walking rows
    ("permute", outer, inner)  anything else: permute the reduced dimensions
                               last (a copy), then reduce rows
    """
    runs = _collapsed_pattern(shape, dims)
    numel = 1
    for s in shape:
        numel *= s
    red = [r for r in runs if r[0]]
    if len(red) <= 1 and (not runs or runs[-1][0] or not red):
        inner = red[0][1] if red else 1
        return ("row", numel // inner if inner else 0, inner)
    if len(red) == 1:
        k = runs.index(red[0])
        a = 1
        for r in runs[:k]:
            a *= r[1]
        b = 1
        for r in runs[k + 1:]:
            b *= r[1]
        if b >= COL_MIN_INNER:
            return ("column", a, red[0][1], b)
    inner = 1
    for r in red:
        inner *= r[1]
    return ("permute", numel // inner if inner else 0, inner)


@functools.lru_cache(maxsize=4096)     # pure; keeps eager host time flat
def row_plan(outer, inner, sms):
    """(warps per row, chunks per row, chunk length) for a row reduction.

    Short rows get a warp each; long rows a block each; when there are too few
    rows to fill the GPU, each row is split into chunks (a second pass then
    reduces the per-chunk partials, in a fixed order: deterministic). Chunk
    lengths are multiples of 16 elements so every chunk of an aligned row
    starts on a 16-byte boundary."""
    if inner <= WARP_ROW_MAX:
        return 1, 1, inner
    chunks = 1
    target = sms * BLOCKS_PER_SM
    if outer < 4 * sms and inner >= ROW_SPLIT_MIN:
        chunks = max(1, min(-(-inner // ROW_CHUNK_MIN), -(-target // outer)))
    chunk_len = -(-inner // chunks)
    chunk_len = -(-chunk_len // 16) * 16
    chunks = -(-inner // chunk_len)
    return ROW_WARPS, chunks, chunk_len


def column_width(itemsize):
    """Adjacent columns per lane in a column reduction (one load of up to 16 bytes)."""
    return min(COL_MAX_WIDTH, 16 // itemsize)


@functools.lru_cache(maxsize=4096)     # pure; keeps eager host time flat
def column_plan(a, r, b, itemsize, sms):
    """(row splits, rows per split) for a column reduction over [a, r, b]: split
    the rows over blocks until the grid fills the GPU (a second pass reduces the
    splits' partials in a fixed order)."""
    width = column_width(itemsize)
    blocks = a * -(-b // (32 * width))
    target = sms * BLOCKS_PER_SM
    splits = 1
    if blocks < target:
        splits = max(1, min(-(-target // blocks), r // COL_MIN_ROWS_PER_SPLIT, 65535))
    rows = -(-r // splits)
    return -(-r // rows), rows


def _combine_parts(kind, acc, with_index):
    """(identity, C of tp_combine, pair struct) for a reduction kind."""
    c_acc = _codegen.compute_ctype(acc)
    lo, hi = _limits(acc)
    identity = {"sum": "0", "prod": "1", "max": lo, "min": hi, "all": "true", "any": "false"}[kind]
    if kind in ("max", "min"):
        better = ">" if kind == "max" else "<"
        nan = "(b.v != b.v && a.v == a.v)" if acc.kind == "f" else "false"
        both_nan = "(b.v != b.v && a.v != a.v)" if acc.kind == "f" else "false"
        a_nan = "(a.v != a.v)" if acc.kind == "f" else "false"
        if with_index:
            combine = (f"  if ({nan}) return b;\n  if ({a_nan} && !{both_nan}) return a;\n"
                       f"  if ({both_nan} || b.v == a.v) return (b.i < a.i) ? b : a;\n"
                       f"  return (b.v {better} a.v) ? b : a;")
        else:
            combine = (f"  if ({nan}) return b;\n  if ({a_nan}) return a;\n"
                       f"  return (b.v {better} a.v) ? b : a;")
    else:
        op = {"sum": "a.v + b.v", "prod": "a.v * b.v", "all": "a.v && b.v", "any": "a.v || b.v"}[kind]
        combine = f"  tp_pair r; r.v = {op}; return r;"
    pair = f"struct tp_pair {{ {c_acc} v;" + (" long long i;" if with_index else "") + " };\n"
    text = (pair +
            f"__device__ __forceinline__ tp_pair tp_combine(tp_pair a, tp_pair b) {{\n{combine}\n}}\n"
            "__device__ __forceinline__ tp_pair tp_shfl_down(tp_pair a, int o) {\n"
            f"  tp_pair r; r.v = ({c_acc})__shfl_down_sync(0xffffffffu, a.v, o);\n"
            + ("  r.i = __shfl_down_sync(0xffffffffu, a.i, o);\n" if with_index else "") +
            "  return r;\n}\n"
            "__device__ __forceinline__ tp_pair tp_warp_reduce(tp_pair s) {\n"
            "#pragma unroll\n"
            "  for (int o = 16; o > 0; o >>= 1) s = tp_combine(s, tp_shfl_down(s, o));\n"
            "  return s;\n}\n")
    def init(var="s"):
        return f"tp_pair {var}; {var}.v = {identity};" + (f" {var}.i = 0x7fffffffffffffffLL;" if with_index else "")
    return text, init, c_acc


def _value_code(kind, in_t, c_acc, ptr, off):
    load = _codegen.load_expr(in_t, ptr, off)
    if kind in ("all", "any"):
        load = f"(({load}) != 0)"
    return f"({c_acc})({load})"


def _store_code(final, with_index, out_dt, c_acc, scaled, where):
    value = "s.v" if not scaled else f"({c_acc})(s.v * scale)"
    if final:
        return _codegen.store_stmt(out_dt, "out", where, value) if not with_index else f"out[{where}] = s.i;"
    return f"out[{where}] = s.v;" + (f" out_idx[{where}] = s.i;" if with_index else "")


def _signature(name, in_t, out_dt, acc, final, with_index, extra):
    out_ctype = (out_dt.ctype if final else acc.ctype) if not (final and with_index) else "long long"
    return (f'extern "C" __global__ void __launch_bounds__(256) {name}(const {in_t.ctype}* __restrict__ in, '
            f"const long long* __restrict__ in_idx, {out_ctype}* __restrict__ out, "
            f"long long* __restrict__ out_idx, {extra}, long long vw, double scale) {{\n")


def _row_source(name, kind, with_index, in_dt, in_is_acc, acc, out_dt, final, scaled, warps_per_row):
    """A row reduction over [outer, inner] split into ``chunks`` per row: each
    block (``warps_per_row`` 8) or warp (1) reduces one chunk with vector loads
    of 16 bytes when ``vw`` is the compiled width (row and chunk starts
    aligned), scalar loads otherwise; warp shuffles, then shared memory across
    warps, in a fixed order."""
    text, init, c_acc = _combine_parts(kind, acc, with_index)
    in_t = acc if in_is_acc else in_dt
    width = max(1, 16 // in_t.itemsize)
    index_of = (lambda k, j: "in_idx[" + k + "]") if (with_index and in_is_acc) else (lambda k, j: j)

    def take(ptr, off, k, j, indent):
        line = f"{indent}{{ tp_pair x; x.v = {_value_code(kind, in_t, c_acc, ptr, off)};"
        if with_index:
            line += f" x.i = {index_of(k, j)};"
        return line + " s = tp_combine(s, x); }"

    if warps_per_row == 1:
        head = ("  const int lane = threadIdx.x & 31;\n"
                "  const long long b = blockIdx.x * 8LL + (threadIdx.x >> 5);\n"
                "  if (b >= outer * chunks) return;\n"
                "  const int tid = lane; const int nthreads = 32;\n")
    else:
        head = ("  const long long b = blockIdx.x;\n"
                "  const int tid = threadIdx.x; const int nthreads = blockDim.x;\n")
    body = (head +
            "  const long long row = b / chunks, ch = b % chunks;\n"
            "  const long long start = ch * chunk_len;\n"
            "  const long long end = start + chunk_len < inner ? start + chunk_len : inner;\n"
            f"  const {in_t.ctype}* rowp = in + row * inner;\n"
            f"  {init()}\n")
    if width > 1:
        vec = f"tp_vec<{in_t.ctype}, {width}>"
        body += (f"  if (vw == {width}) {{\n"
                 f"    const {vec}* vp = reinterpret_cast<const {vec}*>(rowp);\n"
                 f"    const long long ve = end / {width};\n"
                 f"    long long q = start / {width} + tid;\n"
                 "    for (; q + nthreads < ve; q += 2 * nthreads) {\n"
                 f"      {vec} r0 = vp[q], r1 = vp[q + nthreads];\n"
                 "#pragma unroll\n"
                 f"      for (int j = 0; j < {width}; ++j)\n"
                 + take("r0.v", "j", f"row * inner + q * {width} + j", f"q * {width} + j", "        ") + "\n"
                 "#pragma unroll\n"
                 f"      for (int j = 0; j < {width}; ++j)\n"
                 + take("r1.v", "j", f"row * inner + (q + nthreads) * {width} + j",
                        f"(q + nthreads) * {width} + j", "        ") + "\n"
                 "    }\n"
                 "    if (q < ve) {\n"
                 f"      {vec} r0 = vp[q];\n"
                 "#pragma unroll\n"
                 f"      for (int j = 0; j < {width}; ++j)\n"
                 + take("r0.v", "j", f"row * inner + q * {width} + j", f"q * {width} + j", "        ") + "\n"
                 "    }\n"
                 "  } else {\n")
    body += ("    long long j = start + tid;\n"
             "    for (; j + nthreads < end; j += 2 * nthreads) {\n"
             + take("rowp", "j", "row * inner + j", "j", "      ") + "\n"
             + take("rowp", "j + nthreads", "row * inner + j + nthreads", "j + nthreads", "      ") + "\n"
             "    }\n"
             "    if (j < end)\n"
             + take("rowp", "j", "row * inner + j", "j", "      ") + "\n")
    if width > 1:
        body += "  }\n"
    else:
        body += "  (void)vw;\n"
    body += "  s = tp_warp_reduce(s);\n"
    store = _store_code(final, with_index, out_dt, c_acc, scaled, "b")
    if warps_per_row == 1:
        body += f"  if (lane == 0) {{ {store} }}\n"
    else:
        body += ("  __shared__ tp_pair sh[32];\n"
                 "  if ((tid & 31) == 0) sh[tid >> 5] = s;\n"
                 "  __syncthreads();\n"
                 "  if (tid < 32) {\n"
                 f"    {init('t')}\n"
                 "    s = tid < (nthreads >> 5) ? sh[tid] : t;\n"
                 "    s = tp_warp_reduce(s);\n"
                 f"    if (tid == 0) {{ {store} }}\n"
                 "  }\n")
    return (_codegen.PREAMBLE + _codegen.VECTOR_PREAMBLE + text +
            _signature(name, in_t, out_dt, acc, final, with_index,
                       "long long outer, long long inner, long long chunks, long long chunk_len") +
            body + "}\n")


def _column_source(name, kind, with_index, in_dt, in_is_acc, acc, out_dt, final, scaled):
    """A column reduction over [A, R, B] (reduce R): block x covers 32 * width
    adjacent columns of one A slice (each lane ``width`` adjacent columns,
    loaded together when ``vw`` is the width, else ``width`` columns 32 apart),
    its 8 warps take rows in turn within the block's split of R (blockIdx.y);
    then the warps' partials are combined in shared memory in warp order.
    Output element (split, a, col) of a [splits, A, B] array."""
    text, init, c_acc = _combine_parts(kind, acc, with_index)
    in_t = acc if in_is_acc else in_dt
    width = column_width(in_t.itemsize)
    cols = 32 * width
    vec = f"tp_vec<{in_t.ctype}, {width}>"

    def take(ptr, off, j, row, indent):
        line = f"{indent}{{ tp_pair x; x.v = {_value_code(kind, in_t, c_acc, ptr, off)};"
        if with_index:
            line += f" x.i = {'in_idx[base + ' + row + ' * B + c[' + j + ']]' if in_is_acc else row};"
        return line + f" s[{j}] = tp_combine(s[{j}], x); }}"

    body = ("  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;\n"
            "  const long long a = blockIdx.x / colblocks, cb = blockIdx.x % colblocks;\n"
            "  const long long split = blockIdx.y;\n"
            "  const long long r0 = split * rows_per_split;\n"
            "  const long long r1 = r0 + rows_per_split < R ? r0 + rows_per_split : R;\n"
            "  const long long base = a * R * B;\n"
            f"  const bool vec = vw == {width};\n"
            f"  tp_pair s[{width}];\n"
            f"  long long c[{width}];\n"
            "#pragma unroll\n"
            f"  for (int j = 0; j < {width}; ++j) {{\n"
            f"    {init('t')} s[j] = t;\n"
            f"    c[j] = cb * {cols} + (vec ? lane * {width} + j : lane + 32 * j);\n"
            "  }\n")
    if width > 1:
        body += ("  if (vec) {\n"
                 "    if (c[0] < B) {\n"
                 f"      const {in_t.ctype}* p = in + base + c[0];\n"
                 f"      long long r = r0 + w;\n"
                 f"      for (; r + {COL_WARPS} < r1; r += {2 * COL_WARPS}) {{\n"
                 f"        {vec} v0 = *reinterpret_cast<const {vec}*>(p + r * B);\n"
                 f"        {vec} v1 = *reinterpret_cast<const {vec}*>(p + (r + {COL_WARPS}) * B);\n"
                 "#pragma unroll\n"
                 f"        for (int j = 0; j < {width}; ++j)\n"
                 + take("v0.v", "j", "j", "r", "          ") + "\n"
                 "#pragma unroll\n"
                 f"        for (int j = 0; j < {width}; ++j)\n"
                 + take("v1.v", "j", "j", f"(r + {COL_WARPS})", "          ") + "\n"
                 "      }\n"
                 "      if (r < r1) {\n"
                 f"        {vec} v0 = *reinterpret_cast<const {vec}*>(p + r * B);\n"
                 "#pragma unroll\n"
                 f"        for (int j = 0; j < {width}; ++j)\n"
                 + take("v0.v", "j", "j", "r", "          ") + "\n"
                 "      }\n"
                 "    }\n"
                 "  } else {\n")
    body += (f"    for (long long r = r0 + w; r < r1; r += {COL_WARPS}) {{\n"
             f"      const {in_t.ctype}* p = in + base + r * B;\n"
             "#pragma unroll\n"
             f"      for (int j = 0; j < {width}; ++j)\n"
             "        if (c[j] < B)\n"
             + take("p", "c[j]", "j", "r", "          ") + "\n"
             "    }\n")
    if width > 1:
        body += "  }\n"
    else:
        body += "  (void)vec;\n"
    store = _store_code(final, with_index, out_dt, c_acc, scaled, "o")
    body += (f"  __shared__ tp_pair sh[{COL_WARPS}][{cols}];\n"
             "#pragma unroll\n"
             f"  for (int j = 0; j < {width}; ++j) sh[w][c[j] - cb * {cols}] = s[j];\n"
             "  __syncthreads();\n"
             f"  for (int slot = threadIdx.x; slot < {cols}; slot += blockDim.x) {{\n"
             f"    const long long col = cb * {cols} + slot;\n"
             "    if (col >= B) continue;\n"
             "    tp_pair s = sh[0][slot];\n"
             f"    for (int k = 1; k < {COL_WARPS}; ++k) s = tp_combine(s, sh[k][slot]);\n"
             "    const long long o = (split * A + a) * B + col;\n"
             f"    {store}\n"
             "  }\n")
    return (_codegen.PREAMBLE + _codegen.VECTOR_PREAMBLE + text +
            _signature(name, in_t, out_dt, acc, final, with_index,
                       "long long A, long long R, long long B, long long rows_per_split, long long colblocks") +
            body + "}\n")


def _kernel(op, shape_kind, in_t, in_is_acc, out_dt, final, scaled, dev, warps_per_row=ROW_WARPS):
    kind, with_index = _KINDS[op]
    acc = _acc_dtype(op, in_t)
    key = ("reduce", shape_kind, op, in_t.code, in_is_acc, out_dt.code, final, scaled, warps_per_row)

    def make():
        name = (f"tp_reduce_{shape_kind}_{op}_{in_t.name}_{out_dt.name}_"
                f"{int(in_is_acc)}{int(final)}{int(scaled)}_{warps_per_row}")
        if shape_kind == "row":
            src = _row_source(name, kind, with_index, in_t, in_is_acc, acc, out_dt, final, scaled, warps_per_row)
        else:
            src = _column_source(name, kind, with_index, in_t, in_is_acc, acc, out_dt, final, scaled)
        return src, name
    return _kernels.cached_function(key, dev, make)


def _launch_rows(op, src, outer, inner, out, scale=None, in_is_acc=False, in_idx=None, src_dtype=None):
    """Reduce contiguous CUDA ``src`` viewed as [outer, inner] into ``out`` (outer elements)."""
    kind, with_index = _KINDS[op]
    dev = src._device_index
    in_dt = src_dtype if src_dtype is not None else src.dtype
    acc = _acc_dtype(op, in_dt)
    warps, chunks, chunk_len = row_plan(outer, inner, _kernels.sm_count(dev))
    scaled = scale is not None
    in_t = acc if in_is_acc else in_dt
    # vectors of 16 bytes: the row start must be 16-byte aligned and every row
    # (chunk lengths are multiples of 16 elements) a whole number of vectors
    width = 16 // in_t.itemsize
    vw = width if (inner % width == 0 and not src.data_ptr() & 15) else 1
    blocks = outer * chunks if warps > 1 else -(-(outer * chunks) // 8)
    in_idx_ptr = in_idx.data_ptr() if in_idx is not None else 0
    if chunks == 1:
        f = _kernel(op, "row", in_dt, in_is_acc, out.dtype, True, scaled, dev, warps)
        f.launch(blocks, 256, struct.pack("<QQQQqqqqqd", src.data_ptr(), in_idx_ptr, out.data_ptr(), 0,
                                          outer, inner, 1, inner, vw, scale if scaled else 1.0), 0, None)
        return out
    part = _empty_cuda((outer * chunks,), acc, dev)
    part_idx = _empty_cuda((outer * chunks,), dt.int64, dev) if with_index else None
    f = _kernel(op, "row", in_dt, in_is_acc, out.dtype, False, scaled, dev, warps)
    f.launch(blocks, 256, struct.pack("<QQQQqqqqqd", src.data_ptr(), in_idx_ptr, part.data_ptr(),
                                      part_idx.data_ptr() if with_index else 0,
                                      outer, inner, chunks, chunk_len, vw, 1.0), 0, None)
    return _launch_rows(op, part, outer, chunks, out, scale, True, part_idx, in_dt)


def _launch_columns(op, src, a, r, b, out, scale=None, in_is_acc=False, in_idx=None, src_dtype=None):
    """Reduce contiguous CUDA ``src`` viewed as [a, r, b] over r into ``out`` ([a, b])."""
    kind, with_index = _KINDS[op]
    dev = src._device_index
    in_dt = src_dtype if src_dtype is not None else src.dtype
    acc = _acc_dtype(op, in_dt)
    in_t = acc if in_is_acc else in_dt
    width = column_width(in_t.itemsize)
    splits, rows = column_plan(a, r, b, in_t.itemsize, _kernels.sm_count(dev))
    colblocks = -(-b // (32 * width))
    vw = width if (b % width == 0 and src.data_ptr() % (width * in_t.itemsize) == 0) else 1
    scaled = scale is not None
    in_idx_ptr = in_idx.data_ptr() if in_idx is not None else 0
    final = splits == 1
    if final:
        dst, dst_idx = out, None
    else:
        dst = _empty_cuda((splits * a * b,), acc, dev)
        dst_idx = _empty_cuda((splits * a * b,), dt.int64, dev) if with_index else None
    f = _kernel(op, "column", in_dt, in_is_acc, out.dtype, final, scaled, dev, 0)
    f.launch((a * colblocks, splits), 256,
             struct.pack("<QQQQqqqqqqd", src.data_ptr(), in_idx_ptr, dst.data_ptr(),
                         dst_idx.data_ptr() if dst_idx is not None else 0,
                         a, r, b, rows, colblocks, vw, scale if (scaled and final) else 1.0), 0, None)
    if final:
        return out
    return _launch_columns(op, dst, 1, splits, a * b, out, scale, True, dst_idx, in_dt)


def _norm_dims(t, dim):
    if dim is None:
        return tuple(range(t.ndim))
    dims = dim if isinstance(dim, (tuple, list)) else (dim,)
    out = []
    for d in dims:
        d = t._dim(d)
        if d in out:
            raise ValueError(f"dimension {d} appears more than once in dim={dim!r}")
        out.append(d)
    return tuple(sorted(out))


def reduce(op, t, dim=None, keepdim=False, dtype=None, out=None, scale=None):
    """Reduce ``t`` over ``dim`` (all dims when None) with ``op``."""
    if not isinstance(t, Tensor):
        raise TypeError(f"{op} expects a Tensor, got {type(t).__name__}")
    if not isinstance(keepdim, int):
        raise TypeError(f"keepdim must be a bool, got {type(keepdim).__name__}")
    dims = _norm_dims(t, dim)
    kept = [i for i in range(t.ndim) if i not in dims]
    shape = t.shape
    out_shape = tuple(1 if i in dims else s for i, s in enumerate(shape)) if keepdim else \
        tuple(shape[i] for i in kept)
    inner = 1
    for d in dims:
        inner *= shape[d]
    outer = 1
    for i in kept:
        outer *= shape[i]
    result = _result_dtype(op, t.dtype, dtype)
    if inner == 0 and op in ("amax", "amin", "argmax", "argmin"):
        raise IndexError(f"{op}(): cannot reduce over a zero-size dimension (no identity)")
    if out is not None:
        if not isinstance(out, Tensor):
            raise TypeError(f"out must be a Tensor, got {type(out).__name__}")
        if out.shape != out_shape:
            raise ValueError(f"{op}: out has shape {out.shape}, the result has shape {out_shape}")
        if out._device_index != t._device_index:
            raise ValueError(f"{op}: out is on {out.device}, the input on {t.device}")
        if out.dtype is not result:
            raise TypeError(f"{op}: out has dtype {out.dtype.name}, expected {result.name}")
        dst = out
    else:
        dst = empty(out_shape, dtype=result, device=t.device)
    if dst.numel() == 0:
        return dst
    if t.is_cpu:
        return _reduce_cpu(op, t, dims, keepdim, dst, scale)
    if inner == 0:
        ident = {"sum": 0, "prod": 1, "all": True, "any": False}[op]
        return dst.fill_(ident if scale is None else float("nan"))
    target = dst if dst.is_contiguous() else empty(dst.shape, dtype=dst.dtype, device=dst.device)
    strategy = reduction_strategy(shape, dims)
    if strategy[0] == "row":
        _launch_rows(op, t.contiguous(), outer, inner, target, scale)
    elif strategy[0] == "column":
        _, a, r, b = strategy
        _launch_columns(op, t.contiguous(), a, r, b, target, scale)
    else:
        _launch_rows(op, permute(t, kept + list(dims)).contiguous(), outer, inner, target, scale)
    if target is not dst:
        dst.copy_(target)
    return dst


def _reduce_cpu(op, t, dims, keepdim, dst, scale):
    a = t.numpy()
    acc = _acc_dtype(op, t.dtype)
    axis = dims
    with np.errstate(all="ignore"):
        if op in ("sum", "prod"):
            r = (np.sum if op == "sum" else np.prod)(a.astype(acc.numpy_dtype), axis=axis, keepdims=keepdim)
            if scale is not None:
                r = r * scale if r.size else np.full(r.shape, np.nan)
        elif op in ("amax", "amin"):
            r = (np.max if op == "amax" else np.min)(a.astype(acc.numpy_dtype), axis=axis, keepdims=keepdim)
        elif op in ("all", "any"):
            r = (np.all if op == "all" else np.any)(a.astype(bool), axis=axis, keepdims=keepdim)
        else:
            fn = np.argmax if op == "argmax" else np.argmin
            b = a.astype(acc.numpy_dtype)
            if len(dims) == t.ndim:
                r = fn(b.reshape(-1))
                r = np.asarray(r).reshape((1,) * t.ndim if keepdim else ())
            elif len(dims) == 1:
                r = fn(b, axis=dims[0], keepdims=keepdim)
            else:
                raise ValueError(f"{op} reduces over one dimension or all of them")
    np.copyto(dst.numpy(), np.asarray(r), casting="unsafe")
    return dst


# ------------------------------------------------------------------ the public reductions
# Named with a trailing underscore here (this module uses the builtins max,
# min, sum, all and any); _public gives each its public name.

_DIM = """dim : int, sequence of int or None, optional
    The dimensions to reduce; None (the default) reduces over all of them."""
_KEEPDIM = """keepdim : bool, optional
    Keep the reduced dimensions, with size 1."""
_OUT = """out : Tensor, optional
    Write the result here: its shape must be the result's and its dtype the
    result dtype."""
_CUDA = """On CUDA tensors this launches generated NVRTC reduction kernels on the
current stream (cuLaunchKernel); it does not wait for them."""


def _public(name, doc=None):
    """Give a function its public name (``tensorplay.<name>``) and its docstring."""
    def deco(fn):
        fn.__name__ = fn.__qualname__ = name
        fn.__module__ = "tensorplay"
        if doc is not None:
            fn.__doc__ = doc.format(DIM=_DIM, KEEPDIM=_KEEPDIM, OUT=_OUT, CUDA=_CUDA)
        return fn
    return deco


_SIMPLE_DOC = """{summary}

{detail}

Parameters
----------
input : Tensor
    The tensor to reduce.
{{DIM}}
{{KEEPDIM}}{extra}
{{OUT}}

Returns
-------
Tensor
    {returns}

Notes
-----
{{CUDA}}
"""

_DTYPE = """
dtype : dtype, str or None, optional
    The dtype of the result (and of the accumulation); by default the input's
    dtype, int64 for bool and integer inputs."""


@_public("sum", _SIMPLE_DOC.format(
    summary="Sum the elements of ``input`` over ``dim``.",
    detail="Half types and float32 accumulate in float32, float64 in float64, bool and\n"
           "integers in int64 (PyTorch's promotion: integer sums are int64).",
    extra=_DTYPE, returns="The sums; a 0-d tensor when every dimension is reduced."))
def sum_(input, dim=None, keepdim=False, *, dtype=None, out=None):
    return reduce("sum", input, dim, keepdim, dtype, out)


@_public("prod", _SIMPLE_DOC.format(
    summary="Multiply the elements of ``input`` over ``dim``.",
    detail="Accumulates as :func:`sum` does; the product of no elements is 1.",
    extra=_DTYPE, returns="The products."))
def prod(input, dim=None, keepdim=False, *, dtype=None, out=None):
    return reduce("prod", input, dim, keepdim, dtype, out)


@_public("amax", _SIMPLE_DOC.format(
    summary="Return the largest elements of ``input`` over ``dim``.",
    detail="NaN propagates: a slice holding a NaN gives NaN. Reducing over a\n"
           "zero-size dimension raises IndexError (there is no identity).",
    extra="", returns="The largest values, in ``input``'s dtype."))
def amax(input, dim=None, keepdim=False, *, out=None):
    return reduce("amax", input, dim, keepdim, out=out)


@_public("amin", _SIMPLE_DOC.format(
    summary="Return the smallest elements of ``input`` over ``dim``.",
    detail="NaN propagates: a slice holding a NaN gives NaN. Reducing over a\n"
           "zero-size dimension raises IndexError (there is no identity).",
    extra="", returns="The smallest values, in ``input``'s dtype."))
def amin(input, dim=None, keepdim=False, *, out=None):
    return reduce("amin", input, dim, keepdim, out=out)


@_public("all", _SIMPLE_DOC.format(
    summary="Test whether every element of ``input`` over ``dim`` is nonzero.",
    detail="The test of no elements is True.",
    extra="", returns="A bool tensor."))
def all_(input, dim=None, keepdim=False, *, out=None):
    return reduce("all", input, dim, keepdim, out=out)


@_public("any", _SIMPLE_DOC.format(
    summary="Test whether any element of ``input`` over ``dim`` is nonzero.",
    detail="The test of no elements is False.",
    extra="", returns="A bool tensor."))
def any_(input, dim=None, keepdim=False, *, out=None):
    return reduce("any", input, dim, keepdim, out=out)


def _check_arg_dim(op, dim):
    if dim is not None and isinstance(dim, (tuple, list)):
        raise TypeError(f"{op} takes a single dim or None")


_ARG_DOC = """Return the index of the {which} element of ``input`` along ``dim``.

With ``dim=None`` the index is into the flattened tensor. Ties give the
first index; a NaN counts as {which} (its index is returned).

Parameters
----------
input : Tensor
    The tensor to search.
dim : int or None, optional
    The dimension to search along; None (the default) searches all elements.
{{KEEPDIM}}

Returns
-------
Tensor
    The indices, int64.

Notes
-----
{{CUDA}}
"""


@_public("argmax", _ARG_DOC.format(which="largest"))
def argmax(input, dim=None, keepdim=False):
    _check_arg_dim("argmax", dim)
    return reduce("argmax", input, dim, keepdim)


@_public("argmin", _ARG_DOC.format(which="smallest"))
def argmin(input, dim=None, keepdim=False):
    _check_arg_dim("argmin", dim)
    return reduce("argmin", input, dim, keepdim)


_EXTREME_DOC = """Return the {which} element of ``input``, or the {which} values along ``dim`` and where they are.

``{name}(input)`` is :func:`a{name}` over all elements (a 0-d tensor);
``{name}(input, dim)`` returns the named tuple
:class:`tensorplay.return_types.{name}` ``(values, indices)``, as
``torch.{name}`` does. Ties give the first index; NaN propagates.

Parameters
----------
input : Tensor
    The tensor to reduce.
dim : int, optional
    The dimension to reduce along.
keepdim : bool, optional
    Keep ``dim``, with size 1 (with ``dim`` only).

Returns
-------
Tensor or return_types.{name}
    The {which} element (without ``dim``), or ``(values, indices)`` with
    indices int64.

Notes
-----
{{CUDA}}
"""


@_public("max", _EXTREME_DOC.format(which="largest", name="max"))
def max_(input, dim=None, keepdim=False):
    if dim is None:
        return reduce("amax", input)
    _check_arg_dim("max", dim)
    return return_types.max(reduce("amax", input, dim, keepdim), reduce("argmax", input, dim, keepdim))


@_public("min", _EXTREME_DOC.format(which="smallest", name="min"))
def min_(input, dim=None, keepdim=False):
    if dim is None:
        return reduce("amin", input)
    _check_arg_dim("min", dim)
    return return_types.min(reduce("amin", input, dim, keepdim), reduce("argmin", input, dim, keepdim))


def _count(t, dim):
    n = 1
    for d in _norm_dims(t, dim):
        n *= t.shape[d]
    return n


@_public("mean", """Return the mean of the elements of ``input`` over ``dim``.

Sums in the accumulator type (float32 for half types and float32, float64
for float64) and scales once; the mean of no elements is NaN.

Parameters
----------
input : Tensor
    A floating tensor (or pass a floating ``dtype``).
{DIM}
{KEEPDIM}
dtype : dtype, str or None, optional
    The floating dtype of the result; ``input`` is cast to it first.
{OUT}

Returns
-------
Tensor
    The means.

Raises
------
TypeError
    If neither ``input`` nor ``dtype`` is floating.

Notes
-----
{CUDA}
""")
def mean(input, dim=None, keepdim=False, *, dtype=None, out=None):
    d = input.dtype if dtype is None else dt.as_dtype(dtype)
    if d.kind != "f":
        raise TypeError(f"mean(): could not infer the output dtype from {d.name}; pass a floating dtype")
    src = input if input.dtype is d else input.to(d)
    n = _count(input, dim)
    return reduce("sum", src, dim, keepdim, d, out, scale=(1.0 / n) if n else float("nan"))


_VAR_DOC = """Return the {what} of the elements of ``input`` over ``dim``.

Two passes (the mean, then the squared deviations) in float32, or float64
for float64 input; the result has ``input``'s dtype. With no degrees of
freedom left (``N - correction <= 0``) the result is NaN, as in PyTorch.

Parameters
----------
input : Tensor
    A floating tensor.
{{DIM}}
correction : int, optional
    Subtracted from the number of elements ``N`` in the divisor: 1 (the
    default) is Bessel's correction (the unbiased estimate), 0 the
    population {what}.
{{KEEPDIM}}
out : Tensor, optional
    Write the result here (cast to its dtype).

Returns
-------
Tensor
    The {what}s.

Notes
-----
{{CUDA}}
"""


@_public("var", _VAR_DOC.format(what="variance"))
def var(input, dim=None, *, correction=1, keepdim=False, out=None):
    if input.dtype.kind != "f":
        raise TypeError(f"var/std need a floating tensor, got {input.dtype.name}")
    work = dt.float64 if input.dtype is dt.float64 else dt.float32
    x = input.to(work)
    n = _count(input, dim)
    m = mean(x, dim, keepdim=True)
    dev = apply("sub", x, m)
    sq = apply("mul", dev, dev)
    denom = n - correction
    # no degrees of freedom left: 0 * inf and the empty reduction both give NaN, as PyTorch
    scale = (1.0 / denom) if denom > 0 else float("inf")
    r = reduce("sum", sq, dim, keepdim, scale=scale).to(input.dtype)
    if out is not None:
        out.copy_(r)
        return out
    return r


@_public("std", _VAR_DOC.format(what="standard deviation"))
def std(input, dim=None, *, correction=1, keepdim=False, out=None):
    r = apply("sqrt", var(input, dim, correction=correction, keepdim=keepdim))
    if out is not None:
        out.copy_(r)
        return out
    return r


@_public("norm", """Return the vector p-norm of ``input`` over ``dim``.

Computes in float32 (float64 for float64 input) and returns ``input``'s
dtype.

Parameters
----------
input : Tensor
    A floating tensor.
p : float, optional
    The order: 2 (the default, Euclidean), 1, ``inf`` (largest absolute
    value), ``-inf`` (smallest), 0 (number of nonzero elements), or any
    other real number (``sum(abs(x)**p)**(1/p)``).
{DIM}
{KEEPDIM}

Returns
-------
Tensor
    The norms.

Notes
-----
{CUDA}
""")
def norm(input, p=2, dim=None, keepdim=False):
    t = input
    if t.dtype.kind != "f":
        raise TypeError(f"norm needs a floating tensor, got {t.dtype.name}")
    if not isinstance(p, numbers.Real) or isinstance(p, bool):
        raise TypeError(f"norm: p must be a real number, got {p!r}")
    a = apply("abs", t)
    if p == math.inf:
        return reduce("amax", a, dim, keepdim)
    if p == -math.inf:
        return reduce("amin", a, dim, keepdim)
    work = dt.float64 if t.dtype is dt.float64 else dt.float32
    if p == 0:
        r = reduce("sum", apply("ne", t, 0).to(work), dim, keepdim)
    elif p == 1:
        r = reduce("sum", a.to(work), dim, keepdim)
    elif p == 2:
        w = t.to(work)
        r = apply("sqrt", reduce("sum", apply("mul", w, w), dim, keepdim))
    else:
        r = apply("pow", reduce("sum", apply("pow", a.to(work), float(p)), dim, keepdim), 1.0 / p)
    return r.to(t.dtype)


@_public("dot", """Return the inner product of two 1-D tensors of one dtype.

Each product is rounded once in the accumulator type (float32 for half
types and float32, float64 for float64, int64 for integers), then summed
as :func:`sum` does.

Parameters
----------
input : Tensor
    A 1-D tensor.
tensor : Tensor
    A 1-D tensor of the same size and dtype.

Returns
-------
Tensor
    A 0-d tensor: ``input``'s dtype for floating inputs, int64 for integers.

Notes
-----
{CUDA}
""")
def dot(input, tensor):
    a, b = input, tensor
    if not (isinstance(a, Tensor) and isinstance(b, Tensor)):
        raise TypeError("dot expects two tensors")
    if a.ndim != 1 or b.ndim != 1:
        raise ValueError(f"dot expects 1-D tensors, got {a.ndim}-D and {b.ndim}-D")
    if a.shape != b.shape:
        raise ValueError(f"dot: sizes differ ({a.shape[0]} and {b.shape[0]})")
    if a.dtype is not b.dtype:
        raise TypeError(f"dot expects one dtype, got {a.dtype.name} and {b.dtype.name}")
    work = _acc_dtype("sum", a.dtype)
    prod = empty(a.shape, dtype=work, device=a.device)
    apply("mul", a, b, out=prod)        # products rounded once, in the accumulator type
    return reduce("sum", prod).to(a.dtype if a.dtype.kind == "f" else work)
