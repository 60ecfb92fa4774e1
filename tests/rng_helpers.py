# SPDX-License-Identifier: Apache-2.0
"""Helpers of the random-number tests: distribution checks (mean, variance,
Kolmogorov-Smirnov against the exact CDF of the rounded distribution) and a
host build of the generated CUDA C (the device functions compiled as C++)."""

import ctypes
import hashlib
import math
import os
import shutil
import subprocess

import numpy as np

import tensorplay as tp
from tensorplay._kernels import codegen
from tensorplay._kernels import random_kernels as rk

# The 0.1% critical value of the Kolmogorov-Smirnov statistic for large n
KS_CRITICAL = 1.95


def _neighbors(values, dtype):
    """The next representable values of ``dtype`` below and above each of
    ``values`` (finite, in that dtype), as float64."""
    npd = tp._dtypes.as_dtype(dtype).numpy_dtype
    ubits = {2: np.uint16, 4: np.uint32, 8: np.uint64}[npd.itemsize]
    v = values.astype(npd)
    b = v.view(ubits).astype(np.int64)
    sign = np.where(v.astype(np.float64) < 0, -1, 1)
    zero = v.astype(np.float64) == 0
    up = np.where(sign > 0, b + 1, b - 1)
    down = np.where(sign > 0, b - 1, b + 1)
    smallest = np.array([1], dtype=ubits).view(npd).astype(np.float64)[0]
    hi = up.astype(ubits).view(npd).astype(np.float64)
    lo = down.astype(ubits).view(npd).astype(np.float64)
    hi = np.where(zero, smallest, hi)
    lo = np.where(zero, -smallest, lo)
    return lo, hi


def ks_statistic(samples, cdf, dtype, discrete_unit=None):
    """max |ECDF - F| over the support of ``samples`` (a float array of
    ``dtype``'s values), with F the exact CDF of the distribution after
    rounding to ``dtype``: an observed value v collects the mass of
    (midpoint to the value below, midpoint to the value above). With
    ``discrete_unit`` the distribution is uniform on multiples of it in [0,
    1) and F is exact in closed form."""
    x = np.sort(samples.astype(np.float64))
    n = x.size
    vals, counts = np.unique(x, return_counts=True)
    below = np.concatenate([[0], np.cumsum(counts)[:-1]]) / n     # ECDF just below each value
    at = np.cumsum(counts) / n                                     # ECDF at each value
    if discrete_unit is not None:
        f_at = (vals / discrete_unit + 1) * discrete_unit
        f_below = vals
    else:
        lo, hi = _neighbors(vals, dtype)
        f_at = cdf((vals + hi) / 2)
        f_below = cdf((vals + lo) / 2)
    return max(np.max(np.abs(at - f_at)), np.max(np.abs(below - f_below)))


def normal_cdf(x):
    erf = np.vectorize(math.erf, otypes=[np.float64])
    return 0.5 * (1 + erf(np.asarray(x, dtype=np.float64) / math.sqrt(2)))


def exponential_cdf(lambd):
    return lambda x: np.where(x > 0, -np.expm1(-lambd * np.asarray(x, dtype=np.float64)), 0.0)


UNIFORM_UNIT = {"float16": 2.0 ** -11, "bfloat16": 2.0 ** -8, "float32": 2.0 ** -24, "float64": 2.0 ** -53}


def check_uniform(values, dtype):
    """Values of rand() in ``dtype``: in [0, 1), on the dtype's grid, the
    right moments and KS below the 0.1% critical value."""
    x = values.astype(np.float64)
    n = x.size
    unit = UNIFORM_UNIT[tp._dtypes.as_dtype(dtype).name]
    assert x.min() >= 0 and x.max() < 1
    assert np.all(np.mod(x, unit) == 0), "a value off the dtype's grid"
    # the moments of the uniform distribution on the grid k * unit, 0 <= k < 1 / unit
    assert abs(x.mean() - (1 - unit) / 2) < 5 * math.sqrt(1 / 12 / n)
    assert abs(x.var() - (1 - unit ** 2) / 12) < 5 * math.sqrt(1 / 180 / n)
    d = ks_statistic(x, None, dtype, discrete_unit=unit)
    assert d < KS_CRITICAL / math.sqrt(n), f"KS {d} >= {KS_CRITICAL / math.sqrt(n)}"


def check_normal(values, dtype, mean=0.0, std=1.0):
    x = values.astype(np.float64)
    n = x.size
    assert np.all(np.isfinite(x))
    assert abs(x.mean() - mean) < 5 * std / math.sqrt(n)
    assert abs(x.var() / std ** 2 - 1) < 5 * math.sqrt(2 / n) + (1e-3 if dtype == tp.bfloat16 else 0)
    d = ks_statistic(x, lambda v: normal_cdf((v - mean) / std), dtype)
    assert d < KS_CRITICAL / math.sqrt(n), f"KS {d} >= {KS_CRITICAL / math.sqrt(n)}"


def check_exponential(values, dtype, lambd):
    x = values.astype(np.float64)
    n = x.size
    assert x.min() > 0, "exponential values are positive"
    assert abs(x.mean() * lambd - 1) < 5 / math.sqrt(n) + (4e-3 if dtype == tp.bfloat16 else 0)
    d = ks_statistic(x, exponential_cdf(lambd), dtype)
    assert d < KS_CRITICAL / math.sqrt(n), f"KS {d} >= {KS_CRITICAL / math.sqrt(n)}"


# ------------------------------------------------------------------ host build of the CUDA C

# The CUDA intrinsics the generated device functions use, as plain IEEE
# operations of the host (compiled with -ffp-contract=off: no fused
# multiply-add, as --fmad=false and the _rn intrinsics on the GPU).
HOST_SHIMS = r"""
#include <cstring>
#include <cmath>
#define __device__
#define __forceinline__ inline
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fsub_rn(float a, float b) { return a - b; }
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fdiv_rn(float a, float b) { return a / b; }
static inline float __fsqrt_rn(float a) { return std::sqrt(a); }
static inline double __dadd_rn(double a, double b) { return a + b; }
static inline double __dsub_rn(double a, double b) { return a - b; }
static inline double __dmul_rn(double a, double b) { return a * b; }
static inline double __ddiv_rn(double a, double b) { return a / b; }
static inline double __dsqrt_rn(double a) { return std::sqrt(a); }
static inline unsigned int __umulhi(unsigned int a, unsigned int b) {
  return (unsigned int)(((unsigned long long)a * b) >> 32); }
static inline unsigned long long __umul64hi(unsigned long long a, unsigned long long b) {
  return (unsigned long long)(((unsigned __int128)a * b) >> 64); }
static inline float __uint2float_rn(unsigned int x) { return (float)x; }
static inline float __int2float_rn(int x) { return (float)x; }
static inline double __uint2double_rn(unsigned int x) { return (double)x; }
static inline double __int2double_rn(int x) { return (double)x; }
static inline double __ll2double_rn(long long x) { return (double)x; }
static inline double __ull2double_rn(unsigned long long x) { return (double)x; }
static inline unsigned int __float_as_uint(float f) { unsigned int u; std::memcpy(&u, &f, 4); return u; }
static inline float __uint_as_float(unsigned int u) { float f; std::memcpy(&f, &u, 4); return f; }
static inline long long __double_as_longlong(double d) { long long u; std::memcpy(&u, &d, 8); return u; }
static inline double __longlong_as_double(long long u) { double d; std::memcpy(&d, &u, 8); return d; }
"""

HOST_CXX = shutil.which("g++") or shutil.which("c++")
VALUE_NP = {"float": np.float32, "double": np.float64, "bool": np.bool_, "long long": np.int64}


def host_source(op, out, variant=None):
    """C++ of ``tp_run(seed, offset, n, [in], scalars..., values*)``: the
    kernel's Philox, prep lines and values function over every block, in
    the values' compute type (before the store to ``out``'s dtype)."""
    dist = rk.dist_for(op, out, variant)
    per = dist.per_block
    inp = dist.input_dtype
    args = ["unsigned long long seed", "unsigned long long offset", "long long n"]
    if inp is not None:
        args.append(f"const {codegen.compute_ctype(inp)}* in0")
    args += [f"{codegen.scalar_ctype(k)} s{i}" for i, k in enumerate(dist.scalars)]
    args.append(f"{dist.value}* out")
    call = ["r"] + (["a"] if inp is not None else []) + [p.split()[-1] for p in dist.params] + ["v"]
    body = ["  const unsigned int k0 = (unsigned int)seed, k1 = (unsigned int)(seed >> 32);",
            "  const unsigned int o0 = (unsigned int)offset, o1 = (unsigned int)(offset >> 32);"]
    body += ["  " + p for p in dist.prep]
    body += [f"  const {ctype}* {shared} = {glob};"
             for ctype, glob, shared, _ in (rk.TABLES[t] for t in dist.tables)]
    body += [f"  for (long long b = 0; b * {per} < n; ++b) {{",
             "    unsigned int r[4];",
             "    tp_philox((unsigned long long)b, k0, k1, o0, o1, r);"]
    if inp is not None:
        ic = codegen.compute_ctype(inp)
        body += [f"    {ic} a[{per}];",
                 f"    for (int j = 0; j < {per}; ++j) a[j] = b * {per} + j < n ? in0[b * {per} + j] : ({ic})0;"]
    body += [f"    {dist.value} v[{per}];",
             f"    tp_rng_values({', '.join(call)});",
             f"    for (int j = 0; j < {per}; ++j) if (b * {per} + j < n) out[b * {per} + j] = v[j];",
             "  }"]
    return (HOST_SHIMS + rk.math_source(dist.tables) + rk.values_source(dist)
            + f'extern "C" void tp_run({", ".join(args)}) {{\n' + "\n".join(body) + "\n}\n"), dist


def host_values(folder, op, out, seed, offset, n, scalars=(), inp=None, variant=None):
    """Run the generated C (built on the host) for ``op``: the values, as
    ``tensorplay._random.philox.values`` returns them."""
    src, dist = host_source(op, out, variant)
    lib_path = os.path.join(folder, f"rng_{hashlib.sha256(src.encode()).hexdigest()[:16]}.so")
    if not os.path.exists(lib_path):
        cpp = lib_path[:-3] + ".cpp"
        with open(cpp, "w") as f:
            f.write(src)
        subprocess.run([HOST_CXX, "-O2", "-std=c++17", "-shared", "-fPIC", "-ffp-contract=off", "-w",
                        cpp, "-o", lib_path], check=True, capture_output=True)
    lib = ctypes.CDLL(lib_path)
    res = np.zeros(n, dtype=VALUE_NP[dist.value])
    args = [ctypes.c_ulonglong(seed), ctypes.c_ulonglong(offset), ctypes.c_longlong(n)]
    if inp is not None:
        inp = np.ascontiguousarray(inp)
        args.append(inp.ctypes.data_as(ctypes.c_void_p))
    for kind, s in zip(dist.scalars, scalars):
        args.append(ctypes.c_double(s) if kind == "f" else ctypes.c_longlong(s))
    args.append(res.ctypes.data_as(ctypes.c_void_p))
    lib.tp_run(*args)
    return res
