# SPDX-License-Identifier: Apache-2.0
"""CUDA C of the reductions and the plans that shape their launches.

Rows (reduced elements contiguous) go to a block or a warp each, with
16-byte vector loads and warp shuffles; long rows are split over blocks and
a second pass reduces the per-chunk partials. Outer dimensions are reduced
in place by column kernels (threads across the kept inner elements,
coalesced, walking rows), split over rows with a second pass when the
columns alone do not fill the GPU. Every partial is combined in a fixed
order, so results are the same run to run. Half types accumulate in
float32, float32 in float32, float64 in float64, integers in int64.

The front end (argument checks, dtypes of results, the CPU path, the
launches and their temporaries) is ``tensorplay._ops.reduce``.
"""

from __future__ import annotations

import functools

import numpy as np

from tensorplay import _dtypes as dt
from tensorplay._kernels import cache as _kernels
from tensorplay._kernels import codegen as _codegen

# op: (combine kind, has index)
KINDS = {
    "sum": ("sum", False), "prod": ("prod", False), "amax": ("max", False), "amin": ("min", False),
    "argmax": ("max", True), "argmin": ("min", True), "all": ("all", False), "any": ("any", False),
}


def acc_dtype(op, d):
    """The accumulator dtype of reduction ``op`` over dtype ``d``."""
    if op in ("all", "any"):
        return dt.bool_
    if op in ("sum", "prod"):
        if d.kind in "biu":
            return dt.int64
        return dt.float64 if d is dt.float64 else dt.float32
    return dt.float32 if d in (dt.float16, dt.bfloat16) else d


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
            f"long long* __restrict__ out_idx, {extra}, long long vw, double scale) {{" + _codegen.GRID_WAIT)


def row_source(name, kind, with_index, in_dt, in_is_acc, acc, out_dt, final, scaled, warps_per_row):
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


def column_source(name, kind, with_index, in_dt, in_is_acc, acc, out_dt, final, scaled):
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


def reduce_function(op, shape_kind, in_t, in_is_acc, out_dt, final, scaled, dev, warps_per_row=ROW_WARPS):
    kind, with_index = KINDS[op]
    acc = acc_dtype(op, in_t)
    key = ("reduce", shape_kind, op, in_t.code, in_is_acc, out_dt.code, final, scaled, warps_per_row)

    def make():
        name = (f"tp_reduce_{shape_kind}_{op}_{in_t.name}_{out_dt.name}_"
                f"{int(in_is_acc)}{int(final)}{int(scaled)}_{warps_per_row}")
        if shape_kind == "row":
            src = row_source(name, kind, with_index, in_t, in_is_acc, acc, out_dt, final, scaled, warps_per_row)
        else:
            src = column_source(name, kind, with_index, in_t, in_is_acc, acc, out_dt, final, scaled)
        return src, name
    return _kernels.cached_function(key, dev, make)
