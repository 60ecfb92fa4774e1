# SPDX-License-Identifier: Apache-2.0
"""A bitonic sort of (key, index) pairs, per row, as generated CUDA C, and
its schedule and NumPy model.

Keys are 64-bit words compared unsigned; each row's keys are sorted
together with their positions, ties broken by position, so the order is the
stable argsort of the keys (``np.argsort(kind="stable")``), a deterministic
function of the keys alone. A row of ``n`` keys is padded to ``padded``, the
next power of two, with the largest key (padding positions are beyond every
real one, so they sort last). Rows are independent; ``rows * padded`` pairs
sit in two arrays, row after row.

Which launches a sort takes depends on ``padded`` only (:func:`sort_steps`),
so a capture records the same fixed sequence whatever the keys: first
:data:`TILE`-element tiles are sorted in shared memory (``block`` step, all
merges up to ``min(padded, TILE)``), then each larger merge stage ``k``
takes one global pass per partner distance ``j >= TILE`` (``global`` steps)
and one shared-memory pass for the distances below TILE (``merge`` step).
:func:`simulate_sort` runs the same steps in NumPy (the tests check the
schedule against ``np.argsort`` with small tiles).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from tensorplay import _dtypes as dt
from tensorplay._kernels import cache
from tensorplay._kernels.codegen import GRID_WAIT

# Elements per shared-memory tile (two arrays of 8-byte words: 32 KB, under
# the 48 KB of static shared memory), one pair per thread of a 1024-thread block.
TILE = 2048
TILE_THREADS = TILE // 2
# The largest 64-bit key: padding sorts last.
PAD_KEY = 0xFFFFFFFFFFFFFFFF


def padded_length(n: int) -> int:
    """The sorted length of a row of ``n`` keys: the next power of two (1 for n <= 1)."""
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def sort_steps(padded: int, tile: int = TILE) -> list:
    """The launches sorting rows of ``padded`` (a power of two) pairs, in order:
    ``("block", kmax)`` sorts each tile's runs up to length ``kmax``;
    ``("global", k, j)`` compares partners ``j`` apart at merge stage ``k``;
    ``("merge", k)`` finishes stage ``k`` in shared memory (``j < tile``)."""
    if padded < 1 or padded & (padded - 1):
        raise ValueError(f"the padded row length must be a power of two, got {padded}")
    steps: list = [("block", min(padded, tile))]
    k = 2 * tile
    while k <= padded:
        j = k // 2
        while j >= tile:
            steps.append(("global", k, j))
            j //= 2
        steps.append(("merge", k))
        k *= 2
    return steps


# ------------------------------------------------------------------ NumPy model

def _compare_exchange(key, idx, padded, k, j):
    """One bitonic step over every row at once, as the kernels do it: pair
    (a, a + j) for each a with bit j clear, ascending where bit k of a's
    position in its row is clear, descending elsewhere."""
    t = np.arange(key.size // 2, dtype=np.int64)
    a = ((t & ~(j - 1)) << 1) | (t & (j - 1))
    b = a | j
    asc = ((a & (padded - 1)) & k) == 0
    ka, kb, ia, ib = key[a], key[b], idx[a], idx[b]
    a_greater = (ka > kb) | ((ka == kb) & (ia > ib))
    swap = a_greater == asc
    key[a[swap]], key[b[swap]] = kb[swap], ka[swap]
    idx[a[swap]], idx[b[swap]] = ib[swap], ia[swap]


def simulate_sort(keys, tile: int = TILE):
    """The kernels' result for ``keys`` (rows x n, uint64) in NumPy: the
    (rows, padded) positions in sorted order, padding last."""
    keys = np.asarray(keys, dtype=np.uint64)
    rows, n = keys.shape
    padded = padded_length(n)
    key = np.full((rows, padded), PAD_KEY, dtype=np.uint64)
    key[:, :n] = keys
    idx = np.broadcast_to(np.arange(padded, dtype=np.int64), (rows, padded)).copy()
    key, idx = key.reshape(-1), idx.reshape(-1)
    for step in sort_steps(padded, tile):
        if step[0] == "block":
            k = 2
            while k <= step[1]:
                j = k // 2
                while j:
                    _compare_exchange(key, idx, padded, k, j)
                    j //= 2
                k *= 2
        elif step[0] == "global":
            _compare_exchange(key, idx, padded, step[1], step[2])
        else:
            j = tile // 2
            while j:
                _compare_exchange(key, idx, padded, step[1], j)
                j //= 2
    return idx.reshape(rows, padded)


# ------------------------------------------------------------------ sort keys of values

# The order of values as the order of unsigned 64-bit keys, as ``torch.sort``
# orders them: floating values by value, -0.0 equal to 0.0, every NaN equal
# and after +inf; integers and bool by value. Descending order inverts the
# keys (so ties still go to the lower position: a stable descending sort).
KEY_PREAMBLE = r"""
__device__ __forceinline__ unsigned long long tp_sort_key_f32(float x) {
  if (x != x) x = __int_as_float(0x7fc00000);
  if (x == 0.0f) x = 0.0f;
  const unsigned int u = __float_as_uint(x);
  return (unsigned long long)((u & 0x80000000u) ? ~u : (u | 0x80000000u));
}
__device__ __forceinline__ unsigned long long tp_sort_key_f64(double x) {
  if (x != x) x = __longlong_as_double(0x7ff8000000000000LL);
  if (x == 0.0) x = 0.0;
  const unsigned long long u = (unsigned long long)__double_as_longlong(x);
  return (u >> 63) ? ~u : (u | 0x8000000000000000ULL);
}
__device__ __forceinline__ unsigned long long tp_sort_key_int(long long x) {
  return (unsigned long long)x ^ 0x8000000000000000ULL;
}
"""


def key_expr(d, descending: bool) -> str:
    """The C expression of an elementwise kernel (operand ``a0``, loaded as
    ``codegen.compute_ctype(d)``: float for the half types) giving the sort
    key of a value of dtype ``d`` as a long long (the key's bits)."""
    if d is dt.float64:
        key = "tp_sort_key_f64(a0)"
    elif d.kind == "f":
        key = "tp_sort_key_f32(a0)"
    else:
        key = "tp_sort_key_int((long long)a0)"
    return f"(long long)(~{key})" if descending else f"(long long)({key})"


def sort_keys(values: Any, descending: bool = False) -> npt.NDArray[np.uint64]:
    """The keys :func:`key_expr` computes, in NumPy: ``values`` (any real
    array; float16 and bfloat16 widened to float32 exactly) as uint64 keys
    whose order is the values' (``np.argsort(keys, kind="stable")`` is the
    stable sort of the values, NaN last)."""
    a = np.asarray(values)
    if a.dtype.kind == "f" or a.dtype.name == "bfloat16":
        double = a.dtype == np.float64
        wide = a.astype(np.float64 if double else np.float32)        # a copy
        wide[np.isnan(wide)] = np.nan                                 # one NaN
        wide[wide == 0] = 0.0                                         # -0.0 as 0.0
        bits = wide.view(np.uint64 if double else np.uint32).astype(np.uint64)
        width = 64 if double else 32
        top = np.uint64(1 << (width - 1))
        mask = np.uint64((1 << width) - 1)
        keys: npt.NDArray[np.uint64] = np.where(bits & top, ~bits & mask, bits | top).astype(np.uint64)
    else:
        keys = a.astype(np.int64).view(np.uint64) ^ np.uint64(1 << 63)
    return ~keys if descending else keys


# ------------------------------------------------------------------ CUDA C

_COMPARE = r"""
// Put (ka, ia) and (kb, ib) in order: ascending, or descending when !asc.
// Positions are unique within a row, so two pairs are never equal.
#define TP_SORT_ORDER(ka, ia, kb, ib, asc, SWAP) do {                        \
    bool a_greater = (ka) > (kb) || ((ka) == (kb) && (ia) > (ib));           \
    if (a_greater == (asc)) { SWAP; }                                        \
  } while (0)
"""

# The loop body of the two shared-memory kernels (one brace block, the
# barrier included): compare-exchange in the tile at distance j for the
# stage k, then wait for the whole block before the next distance.
_TILE_STEP = r"""    {
      const int t = threadIdx.x;
      const int a = ((t & ~(j - 1)) << 1) | (t & (j - 1));
      const int b = a | j;
      const bool asc = (((base + a) & (padded - 1)) & k) == 0;
      unsigned long long ka = sk[a], kb = sk[b];
      long long ia = si[a], ib = si[b];
      TP_SORT_ORDER(ka, ia, kb, ib, asc, { sk[a] = kb; sk[b] = ka; si[a] = ib; si[b] = ia; });
      __syncthreads();
    }
"""


def block_sort_source() -> str:
    """``tp_sort_block``: load tiles of TILE pairs (keys from ``src``, rows x
    n, padded with PAD_KEY; indices the positions in the row), sort their
    runs up to length ``kmax`` in shared memory (directions alternating by
    position, as the later merges need), write them to ``key``/``idx``."""
    return (_COMPARE + f"""
extern "C" __global__ void __launch_bounds__({TILE_THREADS}) tp_sort_block(
    const unsigned long long* __restrict__ src, unsigned long long* __restrict__ key,
    long long* __restrict__ idx, long long n, long long padded, long long total, long long kmax) {{{GRID_WAIT}  __shared__ unsigned long long sk[{TILE}];
  __shared__ long long si[{TILE}];
  const long long base = (long long)blockIdx.x * {TILE};
  for (int t = threadIdx.x; t < {TILE}; t += blockDim.x) {{
    const long long g = base + t;
    unsigned long long kv = 0x{PAD_KEY:X}ULL;
    long long iv = g;                 // beyond the last row: never written back
    if (g < total) {{
      const long long row = g / padded, pos = g - row * padded;
      if (pos < n) kv = src[row * n + pos];
      iv = pos;
    }}
    sk[t] = kv;
    si[t] = iv;
  }}
  __syncthreads();
  for (long long k = 2; k <= kmax; k <<= 1) {{
    for (long long j = k >> 1; j > 0; j >>= 1)
{_TILE_STEP}
  }}
  for (int t = threadIdx.x; t < {TILE}; t += blockDim.x) {{
    const long long g = base + t;
    if (g < total) {{ key[g] = sk[t]; idx[g] = si[t]; }}
  }}
}}
""")


def global_step_source() -> str:
    """``tp_sort_global``: one bitonic step at merge stage ``k``, partners
    ``j`` apart (j >= TILE), one pair per thread, grid-stride."""
    return (_COMPARE + r"""
extern "C" __global__ void __launch_bounds__(256) tp_sort_global(
    unsigned long long* __restrict__ key, long long* __restrict__ idx, long long pairs,
    long long padded, long long k, long long j) {""" + GRID_WAIT + r"""  for (long long t = blockIdx.x * (long long)blockDim.x + threadIdx.x; t < pairs;
       t += (long long)gridDim.x * blockDim.x) {
    const long long a = ((t & ~(j - 1)) << 1) | (t & (j - 1));
    const long long b = a | j;
    const bool asc = ((a & (padded - 1)) & k) == 0;
    unsigned long long ka = key[a], kb = key[b];
    long long ia = idx[a], ib = idx[b];
    TP_SORT_ORDER(ka, ia, kb, ib, asc, { key[a] = kb; key[b] = ka; idx[a] = ib; idx[b] = ia; });
  }
}
""")


def block_merge_source() -> str:
    """``tp_sort_merge``: finish merge stage ``k`` (k > TILE) in shared
    memory: the steps with partners closer than TILE, within each tile."""
    return (_COMPARE + f"""
extern "C" __global__ void __launch_bounds__({TILE_THREADS}) tp_sort_merge(
    unsigned long long* __restrict__ key, long long* __restrict__ idx, long long padded, long long k) {{{GRID_WAIT}  __shared__ unsigned long long sk[{TILE}];
  __shared__ long long si[{TILE}];
  const long long base = (long long)blockIdx.x * {TILE};   // rows * padded is a multiple of TILE here
  for (int t = threadIdx.x; t < {TILE}; t += blockDim.x) {{
    sk[t] = key[base + t];
    si[t] = idx[base + t];
  }}
  __syncthreads();
  for (int j = {TILE // 2}; j > 0; j >>= 1)
{_TILE_STEP}
  for (int t = threadIdx.x; t < {TILE}; t += blockDim.x) {{
    key[base + t] = sk[t];
    idx[base + t] = si[t];
  }}
}}
""")


SOURCES = {
    "block": (block_sort_source, "tp_sort_block"),
    "global": (global_step_source, "tp_sort_global"),
    "merge": (block_merge_source, "tp_sort_merge"),
}


def sort_function(step: str, device: int):
    """The loaded kernel of a sort step kind ("block", "global" or "merge")."""
    make, name = SOURCES[step]
    return cache.cached_function(("sort", step), device, lambda: (make(), name))
