# SPDX-License-Identifier: Apache-2.0
"""The test suite's shared helpers (conftest.py holds the fixtures and hooks):
what this machine has, the repository root, ``warm()`` before a capture, a
kernel that keeps a stream busy, the PTX of a kernel source (no GPU needed),
random host data, the fuzz counter, and the random-number checks with a host
build of the generated CUDA C."""

import ctypes
import hashlib
import math
import os
import pathlib
import shutil
import struct
import subprocess
import sys

import numpy as np
import pytest

import tensorplay as tp

# The checkout (or unpacked sdist) the tests run from: docs, scripts, pyproject.toml
ROOT = pathlib.Path(__file__).resolve().parent.parent

HAS_CUDA = tp.cuda.is_available()
N_GPUS = tp.cuda.device_count()

ALL_DTYPES = list(tp.ALL_DTYPES)
FLOAT_DTYPES = [tp.float16, tp.bfloat16, tp.float32, tp.float64]

# TP_FUZZ_SCALE multiplies the fuzzers' example counts (the GPU run uses more).
FUZZ_SCALE = float(os.environ.get("TP_FUZZ_SCALE", "1"))
FUZZED_CALLS = [0]


def count_fuzzed_call(n=1):
    """Count fuzzed calls; conftest prints the total at the end of the run."""
    FUZZED_CALLS[0] += n


# ------------------------------------------------------------------ host data

def random_array(shape, dtype, rng, low=-50, high=50):
    """Random host data representable exactly enough in ``dtype``."""
    d = tp._dtypes.as_dtype(dtype)
    if d.kind == "b":
        return rng.random(shape) > 0.5
    if d.kind == "u":
        return rng.integers(0, 200, size=shape).astype(d.numpy_dtype)
    if d.kind == "i":
        lo, hi = (-100, 100) if d.itemsize == 1 else (low * 10, high * 10)
        return rng.integers(lo, hi, size=shape).astype(d.numpy_dtype)
    return rng.uniform(low, high, size=shape).astype(d.numpy_dtype)


def activation_reference(r, activation):
    """NumPy's ReLU or GELU (tanh approximation, as cuBLASLt's epilogue) of ``r``."""
    if activation == "relu":
        return np.maximum(r, 0)
    if activation == "gelu":
        return 0.5 * r * (1 + np.tanh(np.sqrt(2 / np.pi) * (r + 0.044715 * r ** 3)))
    return r


# ------------------------------------------------------------------ GPU

def warm(f, *args):
    """Run ``f(*args)`` once eagerly and wait for it, so that its kernels are
    compiled and loaded (and lazily made state exists) before a capture; return
    its result."""
    r = f(*args)
    tp.cuda.synchronize()
    return r


def counted_loop(body, iterations, after=None, lib=tp):
    """(graph, counter, limit): a graph running ``body()`` in a WHILE node
    while the counter is below the limit (a device int32, first
    ``iterations``), then ``after(counter)``. ``lib`` makes the counting
    tensors: tensorplay, or torch (the same calls)."""
    c = lib.zeros(1, dtype=lib.int32, device="cuda")
    lim = lib.full((1,), iterations, dtype=lib.int32, device="cuda")
    p = lib.zeros(1, dtype=lib.bool, device="cuda")
    warm(lambda: (c.add_(1), lib.lt(c, lim, out=p)))
    g = tp.cuda.CUDAGraph()
    with tp.cuda.graph(g):
        c.zero_()
        lib.lt(c, lim, out=p)
        with g.while_(p):
            body()
            c.add_(1)
            lib.lt(c, lim, out=p)
        if after is not None:
            after(c)
    g.counting_tensors = (c, lim, p)    # torch's allocator reuses what nothing references
    return g, c, lim


def graph_objects():
    """(graphs, executables) the driver holds for tensorplay now."""
    live = tp.cuda.live_driver_objects()
    return live["graphs"], live["execs"]


SPIN_SOURCE = r"""
extern "C" __global__ void tp_test_spin(long long cycles, int* flag) {
  long long start = clock64();
  while (clock64() - start < cycles) { }
  if (flag) *flag = 1;
}
"""


def spin(stream, cycles=200_000_000, flag_ptr=0, device=0):
    """Keep ``stream`` busy for about ``cycles`` GPU clocks (~0.1 s at 2 GHz)."""
    from tensorplay._kernels import cache
    f = cache.load_function(SPIN_SOURCE, "tp_test_spin", device)
    f.launch(1, 1, struct.pack("<qQ", cycles, flag_ptr), 0, stream.handle)


HOLD_SOURCE = r"""
extern "C" __global__ void tp_test_hold(const volatile int* release, unsigned long long timeout_ns) {
  unsigned long long start, now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    __nanosleep(1000);
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (*release == 0 && now - start < timeout_ns);
}
"""


def hold(stream, timeout_s=60.0, device=0):
    """Keep ``stream`` busy until the returned ``release()`` is called (or
    ``timeout_s`` of GPU time pass, so a failing test cannot hang): unlike a
    spin of a set length, it outlasts however slow the host is meanwhile.
    ``release()`` writes the flag from another stream and waits for ``stream``."""
    from tensorplay._kernels import cache
    flag = tp.zeros(1, dtype=tp.int32, device=f"cuda:{device}")
    tp.cuda.synchronize(device)                       # the flag is zero before the kernel reads it
    f = cache.load_function(HOLD_SOURCE, "tp_test_hold", device)
    f.launch(1, 1, struct.pack("<QQ", flag.data_ptr(), int(timeout_s * 1e9)), 0, stream.handle)
    releaser = tp.cuda.Stream(device=device)

    def release():
        with tp.cuda.stream(releaser):
            flag.fill_(1)
        stream.synchronize()
    return release


SLOW_WRITE = r"""
extern "C" __global__ void slow_write(float* y, long long n, float value, unsigned long long ns) {
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  unsigned long long start, now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    __nanosleep(1000);
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (now - start < ns);
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
    y[i] = value;
}
"""



def slow_writer(sleep_ns=200_000):
    """``write(y, value)``: a kernel that lets the kernels after it launch at
    once (programmatic dependent launch), sleeps ``sleep_ns`` on the GPU and
    only then writes ``value`` into every element of float32 CUDA tensor
    ``y``: what reads ``y`` too early sees the old values."""
    kernel = tp.RawKernel(SLOW_WRITE, "slow_write", pdl=True)

    def write(y, value, ns=sleep_ns):
        kernel((64,), (256,), (y, y.numel(), float(value), ns))
    return write


def ptx_of(source, arch=90, options=()):
    """PTX of ``source`` for compute_``arch``: to see which instructions and
    parameters a kernel has (NVRTC only, no GPU)."""
    from cuda.bindings import nvrtc
    err, prog = nvrtc.nvrtcCreateProgram(source.encode(), b"k.cu", 0, [], [])
    assert err == nvrtc.nvrtcResult.NVRTC_SUCCESS
    try:
        opts = [f"--gpu-architecture=compute_{arch}".encode(), b"-std=c++17"] + [str(o).encode() for o in options]
        (res,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
        assert res == nvrtc.nvrtcResult.NVRTC_SUCCESS
        err, n = nvrtc.nvrtcGetPTXSize(prog)
        buf = b" " * n
        (res,) = nvrtc.nvrtcGetPTX(prog, buf)
        assert res == nvrtc.nvrtcResult.NVRTC_SUCCESS
        return buf.decode()
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


# ------------------------------------------------------------------ processes and the kernel cache

def run_python(code, **env):
    """Run ``code`` in a fresh interpreter (outside the checkout) with ``env`` added."""
    full = dict(os.environ, **env)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/", env=full,
                          timeout=120)


# The architecture the kernel-cache tests compile for (NVRTC only, no GPU)
KERNEL_ARCH = 90


def unique_kernel_source(tag):
    """A kernel named ``tag`` whose source no other test process compiles (a fresh cache entry)."""
    return 'extern "C" __global__ void %s(int* x) { x[0] = %d; }' % (tag, os.getpid())


# ------------------------------------------------------------------ random numbers: distribution checks

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
    from tensorplay._kernels import codegen
    from tensorplay._kernels import random_kernels as rk
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
    ``tensorplay._kernels.philox.values`` returns them."""
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


def capture_construct(g, construct, work, out, control, *, other, recheck, advance):
    """Capture another library's ``work`` into ``g`` under ``construct``:
    "graph" (``work.write(out)``), "if_else" (write, else ``other(out)``),
    "while" (``work.accumulate(out)`` then ``advance(control)`` while
    ``recheck(control)`` sets ``control.pred``) or "switch" (case 0 writes,
    case 1 ``other(out)``, case 2 empty, on ``control.index``)."""
    with tp.cuda.graph(g):
        if construct == "graph":
            work.write(out)
        elif construct == "if_else":
            with g.if_else(control.pred) as (then, otherwise):
                with then:
                    work.write(out)
                with otherwise:
                    other(out)
        elif construct == "while":
            recheck(control)
            with g.while_(control.pred):
                work.accumulate(out)
                advance(control)
                recheck(control)
        else:
            with g.switch(control.index, 3) as cases:
                with cases[0]:
                    work.write(out)
                with cases[1]:
                    other(out)


@pytest.fixture
def torch_cuda():
    """PyTorch with CUDA, autograd off for the test (skips without them); the
    thread's cuBLAS handle made first, as an eager run of a model would have.
    Test modules import it under the name ``torch``."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("PyTorch sees no CUDA GPU")
    torch.cuda.current_blas_handle()
    with torch.no_grad():
        yield torch
    torch.cuda.synchronize()
