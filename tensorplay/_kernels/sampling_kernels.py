# SPDX-License-Identifier: Apache-2.0
"""The arithmetic of ``multinomial``, twice: as generated CUDA C and as its
NumPy twin, operation for operation, so CPU and CUDA pick the same
categories from the same uniforms.

Both twins use only IEEE-754 float64 additions, subtractions,
multiplications and divisions, each rounded once (``__dadd_rn`` and
friends on the device, which the compiler never fuses into an FMA; NumPy
ufuncs round each operation), plus bit manipulation. No libm call: CUDA's
``log`` and the host's may differ in the last bit.

Without replacement (the exponential race, or Gumbel top-k): category
``i`` of a row gets the key ``E_i / w_i`` with ``E_i = -log(1 - u_i)``,
an Exp(1) variate from the uniform ``u_i`` in [0, 1) (so ``1 - u_i`` is
exact and in (0, 1]); the ``k`` smallest keys, in increasing order, are the
sample. Zero weights get :data:`ZERO_WEIGHT_KEY`, above every key of a
positive weight (+inf included). ``-log`` is :func:`neg_log`, fdlibm's
``log`` reduction and polynomial (one of its branches for every argument),
within 1 ulp of the true value.

With replacement (the inverse CDF): the weights' cumulative sums in
float64, in :data:`CDF_CHUNKS` consecutive chunks of ``L = ceil(n / 256)``
categories: ``c_i = base_j + p_i``, where ``p_i`` sums chunk ``j``'s weights
up to ``i`` from 0 in order and ``base_j`` is the in-order running sum of the
whole chunks before ``j``; the row's total is the last running sum. The
sample for a uniform ``u`` is the first ``i`` with ``c_i > u * total``
(``c`` never decreases and a zero weight repeats the previous value, so a
zero-weight category is never drawn); when rounding makes ``u * total``
reach ``total`` (possible for subnormal totals only), the last category of
positive weight.

Invalid rows (negative or non-finite weights, no positive weight, too few
of them without replacement, a total that overflows) set bits of a status
word (:data:`STATUS_MESSAGES`); the kernels still write indices in range.
"""

from __future__ import annotations

import numpy as np

from tensorplay import _dtypes as dt
from tensorplay._kernels import cache
from tensorplay._kernels import codegen as _codegen

# Status bits the kernels set for the host to report.
BAD_WEIGHT = 1
ZERO_SUM = 2
TOO_FEW_POSITIVE = 4
SUM_OVERFLOW = 8
STATUS_MESSAGES = {
    BAD_WEIGHT: "the probability tensor contains inf, nan or an element < 0",
    ZERO_SUM: "a row of the probability tensor sums to zero (no category has a positive weight)",
    TOO_FEW_POSITIVE: "without replacement, num_samples must not exceed the number of categories of "
                      "positive weight in any row",
    SUM_OVERFLOW: "the sum of a row of the probability tensor overflows float64",
}

# The key of a zero (or invalid) weight: a NaN pattern, above +inf as an
# int64, so every positive weight's key (even one that overflowed to +inf)
# sorts before it; still positive as an int64, so keys compare the same
# signed or unsigned.
ZERO_WEIGHT_KEY = 0x7FF8000000000000

# Chunks of a row's cumulative sum: one per thread of the block doing the row.
CDF_CHUNKS = 256

# fdlibm e_log.c constants, as bit patterns (exact on both sides).
_LOG_CONSTANTS = {
    "LN2_HI": 0x3FE62E42FEE00000, "LN2_LO": 0x3DEA39EF35793C76,
    "LG1": 0x3FE5555555555593, "LG2": 0x3FD999999997FA04, "LG3": 0x3FD2492494229359,
    "LG4": 0x3FCC71C51D8E78AF, "LG5": 0x3FC7466496CB03DE, "LG6": 0x3FC39A09D078C69F,
    "LG7": 0x3FC2F112DF3E5244,
}
_C = {k: np.array(v, dtype=np.uint64).view(np.float64)[()] for k, v in _LOG_CONSTANTS.items()}
DBL_MAX = np.finfo(np.float64).max


def cdf_chunk_length(n: int) -> int:
    """Categories per chunk of the cumulative sum of a row of ``n``."""
    return max(1, -(-n // CDF_CHUNKS))


# ------------------------------------------------------------------ NumPy twins

def neg_log(x):
    """``-log(x)`` of float64 ``x`` in [2**-1022, 1] (normal numbers), as the
    kernels compute it: x = 2**k * m with m in [sqrt(2)/2, sqrt(2)),
    f = m - 1, s = f / (2 + f), then fdlibm's polynomial in s."""
    x = np.asarray(x, dtype=np.float64)
    bits = x.view(np.uint64)
    hx = (bits >> np.uint64(32)).astype(np.int64)
    lx = bits & np.uint64(0xFFFFFFFF)
    k = (hx >> 20) - 1023
    hx = hx & 0x000FFFFF
    i = (hx + 0x95F64) & 0x100000
    m = (((hx | (i ^ 0x3FF00000)).astype(np.uint64) << np.uint64(32)) | lx).view(np.float64)
    k = k + (i >> 20)
    c = _C
    f = m - 1.0
    s = f / (2.0 + f)
    dk = k.astype(np.float64)
    z = s * s
    w = z * z
    t1 = w * (c["LG2"] + w * (c["LG4"] + w * c["LG6"]))
    t2 = z * (c["LG1"] + w * (c["LG3"] + w * (c["LG5"] + w * c["LG7"])))
    r = t2 + t1
    hfsq = (0.5 * f) * f
    # log(x) = dk*ln2_hi - ((hfsq - (s*(hfsq + r) + dk*ln2_lo)) - f); its negation, exactly:
    return ((hfsq - (s * (hfsq + r) + dk * c["LN2_LO"])) - f) - dk * c["LN2_HI"]


def race_keys(weights, uniforms):
    """The exponential-race keys (int64 bit patterns of non-negative
    float64) of float64 ``weights`` for float64 ``uniforms`` in [0, 1), same
    shape: ``-log(1 - u) / w``, :data:`ZERO_WEIGHT_KEY` where w is not a
    positive finite number."""
    w = np.asarray(weights, dtype=np.float64)
    u = np.asarray(uniforms, dtype=np.float64)
    positive = (w > 0) & (w <= DBL_MAX)
    e = neg_log(1.0 - u)
    with np.errstate(over="ignore"):
        q = e / np.where(positive, w, 1.0)
    return np.where(positive, q.view(np.int64), np.int64(ZERO_WEIGHT_KEY))


def chunked_cdf(weights):
    """The cumulative sums ``c`` (rows x n) of non-negative finite float64
    ``weights`` (rows x n) in the chunked order of the kernels, and the rows'
    totals."""
    w = np.asarray(weights, dtype=np.float64)
    rows, n = w.shape
    length = cdf_chunk_length(n)
    chunks = np.zeros((rows, CDF_CHUNKS * length))
    chunks[:, :n] = w + 0.0                   # -0.0 -> +0.0, as the kernel's 0.0 + w
    p = np.add.accumulate(chunks.reshape(rows, CDF_CHUNKS, length), axis=2)   # in order
    running = np.add.accumulate(p[:, :, -1], axis=1)                          # in order
    base = np.concatenate([np.zeros((rows, 1)), running[:, :-1]], axis=1)
    c = (base[:, :, None] + p).reshape(rows, -1)[:, :n]
    return c, running[:, -1]


def inverse_cdf(weights, uniforms):
    """The categories (rows x k, int64) drawn with replacement from float64
    ``weights`` (rows x n, non-negative, finite, each row with a positive
    weight) by float64 ``uniforms`` (rows x k) in [0, 1)."""
    w = np.asarray(weights, dtype=np.float64)
    u = np.asarray(uniforms, dtype=np.float64)
    c, total = chunked_cdf(w)
    x = u * total[:, None]
    rows, n = w.shape
    last_positive = n - 1 - np.argmax(w[:, ::-1] > 0, axis=1)
    out = np.empty(u.shape, dtype=np.int64)
    for r in range(rows):
        out[r] = np.searchsorted(c[r], x[r], side="right")     # the first c_i > x
    return np.where(x < total[:, None], out, last_positive[:, None])


def row_status(weights, num_samples, replacement):
    """The status bits the kernels set for float64 ``weights`` (rows x n)."""
    w = np.asarray(weights, dtype=np.float64)
    status = 0
    finite = np.isfinite(w)
    if not finite.all() or (w[finite] < 0).any():
        status |= BAD_WEIGHT
    positive = ((w > 0) & finite).sum(axis=1)
    if (positive == 0).any():
        status |= ZERO_SUM
    elif not replacement and (positive < num_samples).any():
        status |= TOO_FEW_POSITIVE
    if replacement and not status:
        with np.errstate(over="ignore"):
            if not np.isfinite(chunked_cdf(w)[1]).all():
                status |= SUM_OVERFLOW
    return status


# ------------------------------------------------------------------ CUDA C

def _neg_log_device() -> str:
    consts = "".join(f"#define TP_{k} __longlong_as_double(0x{v:016X}LL)\n" for k, v in _LOG_CONSTANTS.items())
    return consts + r"""
// -ln x for normal x in (0, 1]: neg_log of sampling_kernels.py, the same operations in the same order.
__device__ __forceinline__ double tp_neg_log(double x) {
  int hx = __double2hiint(x);
  const int lx = __double2loint(x);
  int k = (hx >> 20) - 1023;
  hx &= 0x000fffff;
  const int i = (hx + 0x95f64) & 0x100000;
  const double m = __hiloint2double(hx | (i ^ 0x3ff00000), lx);
  k += i >> 20;
  const double f = __dsub_rn(m, 1.0);
  const double s = __ddiv_rn(f, __dadd_rn(2.0, f));
  const double dk = (double)k;
  const double z = __dmul_rn(s, s);
  const double w = __dmul_rn(z, z);
  const double t1 = __dmul_rn(w, __dadd_rn(TP_LG2, __dmul_rn(w, __dadd_rn(TP_LG4, __dmul_rn(w, TP_LG6)))));
  const double t2 = __dmul_rn(z, __dadd_rn(TP_LG1, __dmul_rn(w, __dadd_rn(TP_LG3,
                              __dmul_rn(w, __dadd_rn(TP_LG5, __dmul_rn(w, TP_LG7)))))));
  const double r = __dadd_rn(t2, t1);
  const double hfsq = __dmul_rn(__dmul_rn(0.5, f), f);
  return __dsub_rn(__dsub_rn(__dsub_rn(hfsq, __dadd_rn(__dmul_rn(s, __dadd_rn(hfsq, r)),
                                                       __dmul_rn(dk, TP_LN2_LO))), f),
                   __dmul_rn(dk, TP_LN2_HI));
}
"""


_STATUS_DEFINES = (f"#define TP_BAD_WEIGHT {BAD_WEIGHT}\n#define TP_ZERO_SUM {ZERO_SUM}\n"
                   f"#define TP_TOO_FEW_POSITIVE {TOO_FEW_POSITIVE}\n#define TP_SUM_OVERFLOW {SUM_OVERFLOW}\n"
                   "#define TP_DBL_MAX __longlong_as_double(0x7FEFFFFFFFFFFFFFLL)\n")


def _weight(d: dt.dtype, ptr: str, off: str) -> str:
    """A weight of dtype ``d`` loaded as double (exact for every floating dtype)."""
    return f"((double)({_codegen.load_expr(d, ptr, off)}))"


WEIGHT_DTYPES = (dt.float16, dt.bfloat16, dt.float32, dt.float64)


def race_keys_source(d: dt.dtype) -> tuple[str, str]:
    """(source, name) of the key kernel for weights of dtype ``d``: one
    block of 256 threads per row writes the row's keys (int64 bit patterns)
    and ORs the row's status bits into ``status``."""
    name = f"tp_race_keys_{d.name}"
    src = (_codegen.PREAMBLE + _STATUS_DEFINES + _neg_log_device() + f"""
extern "C" __global__ void __launch_bounds__(256) {name}(
    const {d.ctype}* __restrict__ w, const double* __restrict__ u, long long* __restrict__ keys,
    int* __restrict__ status, long long n, long long num_samples) {{{_codegen.GRID_WAIT}  const long long row = blockIdx.x;
  const {d.ctype}* wr = w + row * n;
  const double* ur = u + row * n;
  long long* kr = keys + row * n;
  long long positive = 0;
  int bad = 0;
  for (long long i = threadIdx.x; i < n; i += blockDim.x) {{
    const double v = {_weight(d, "wr", "i")};
    long long key = 0x{ZERO_WEIGHT_KEY:X}LL;
    if (v > 0.0 && v <= TP_DBL_MAX) {{
      key = __double_as_longlong(__ddiv_rn(tp_neg_log(__dsub_rn(1.0, ur[i])), v));
      ++positive;
    }} else if (!(v == 0.0)) {{
      bad = 1;                                       // negative, infinite or NaN
    }}
    kr[i] = key;
  }}
  for (int o = 16; o > 0; o >>= 1) {{
    positive += __shfl_down_sync(0xffffffffu, positive, o);
    bad |= __shfl_down_sync(0xffffffffu, bad, o);
  }}
  __shared__ long long sh_positive[8];
  __shared__ int sh_bad[8];
  if ((threadIdx.x & 31) == 0) {{ sh_positive[threadIdx.x >> 5] = positive; sh_bad[threadIdx.x >> 5] = bad; }}
  __syncthreads();
  if (threadIdx.x == 0) {{
    for (int q = 1; q < 8; ++q) {{ positive += sh_positive[q]; bad |= sh_bad[q]; }}
    int st = bad ? TP_BAD_WEIGHT : 0;
    if (positive == 0) st |= TP_ZERO_SUM;
    else if (positive < num_samples) st |= TP_TOO_FEW_POSITIVE;
    if (st) atomicOr(status, st);
  }}
}}
""")
    return src, name


def inverse_cdf_source(d: dt.dtype) -> tuple[str, str]:
    """(source, name) of the with-replacement kernel for weights of dtype
    ``d``: one block of CDF_CHUNKS threads per row; thread t sums chunk t in
    order, thread 0 runs over the chunk sums in order, then each sample
    binary-searches the chunk sums (shared memory) and walks its chunk."""
    name = f"tp_inverse_cdf_{d.name}"
    c = CDF_CHUNKS
    load = _weight(d, "wr", "i")
    src = (_codegen.PREAMBLE + _STATUS_DEFINES + f"""
// A weight as the sums see it: invalid ones (reported in the status) count as 0.
__device__ __forceinline__ double tp_clean(double v, int* bad) {{
  if (v >= 0.0 && v <= TP_DBL_MAX) return v;
  *bad = 1;
  return 0.0;
}}
extern "C" __global__ void __launch_bounds__({c}) {name}(
    const {d.ctype}* __restrict__ w, const double* __restrict__ u, long long* __restrict__ out,
    int* __restrict__ status, long long n, long long num_samples, long long chunk_len) {{{_codegen.GRID_WAIT}  __shared__ double running[{c}];         // chunk t's sum, then the running sum through chunk t
  __shared__ long long last_positive[{c}];
  __shared__ int bad_chunk[{c}];
  __shared__ double total_sh;
  __shared__ long long fallback_sh;
  const long long row = blockIdx.x;
  const {d.ctype}* wr = w + row * n;
  const int t = threadIdx.x;
  const long long start = t * chunk_len;
  const long long end = start + chunk_len < n ? start + chunk_len : n;
  double p = 0.0;
  long long last = -1;
  int bad = 0;
  for (long long i = start; i < end; ++i) {{
    const double v = tp_clean({load}, &bad);
    if (v > 0.0) last = i;
    p = __dadd_rn(p, v);
  }}
  running[t] = p;
  last_positive[t] = last;
  bad_chunk[t] = bad;
  __syncthreads();
  if (t == 0) {{
    double acc = 0.0;
    long long fallback = -1;
    int any_bad = 0;
    for (int q = 0; q < {c}; ++q) {{
      acc = __dadd_rn(acc, running[q]);
      running[q] = acc;
      if (last_positive[q] > fallback) fallback = last_positive[q];
      any_bad |= bad_chunk[q];
    }}
    int st = any_bad ? TP_BAD_WEIGHT : 0;
    if (fallback < 0) st |= TP_ZERO_SUM;
    else if (!(acc <= TP_DBL_MAX)) st |= TP_SUM_OVERFLOW;
    if (st) atomicOr(status, st);
    total_sh = acc;
    fallback_sh = fallback < 0 ? 0 : fallback;
  }}
  __syncthreads();
  const double total = total_sh;
  for (long long s = t; s < num_samples; s += blockDim.x) {{
    const double x = __dmul_rn(u[row * num_samples + s], total);
    long long pick = fallback_sh;
    if (x < total) {{
      int lo = 0, hi = {c - 1};           // the first chunk whose running sum exceeds x
      while (lo < hi) {{
        const int mid = (lo + hi) >> 1;
        if (running[mid] > x) hi = mid; else lo = mid + 1;
      }}
      const double base = lo ? running[lo - 1] : 0.0;
      const long long i0 = lo * chunk_len;
      const long long i1 = i0 + chunk_len < n ? i0 + chunk_len : n;
      double q = 0.0;
      int ignored = 0;
      for (long long i = i0; i < i1; ++i) {{
        q = __dadd_rn(q, tp_clean({load}, &ignored));
        if (__dadd_rn(base, q) > x) {{ pick = i; break; }}
      }}
    }}
    out[row * num_samples + s] = pick;
  }}
}}
""")
    return src, name


def race_keys_function(d: dt.dtype, device: int):
    """The loaded key kernel for weights of dtype ``d``."""
    return cache.cached_function(("race_keys", d.code), device, lambda: race_keys_source(d))


def inverse_cdf_function(d: dt.dtype, device: int):
    """The loaded with-replacement kernel for weights of dtype ``d``."""
    return cache.cached_function(("inverse_cdf", d.code), device, lambda: inverse_cdf_source(d))
