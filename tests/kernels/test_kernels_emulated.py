# SPDX-License-Identifier: Apache-2.0
"""The generated CUDA C of the sort, sampling, scan and flat elementwise kernels, run on the CPU.

tests/kernels/cuda_emulator.hpp gives the kernels just enough of CUDA (one OS thread
per CUDA thread, the blocks one after another, __syncthreads as a barrier,
warp shuffles, the __d*_rn intrinsics as single IEEE operations), so g++
builds the very sources NVRTC compiles. The launches go through the real
launchers of tensorplay._ops.sampling and tensorplay._ops.scan (their
argument packing, grids and step schedule) with fake CUDA tensors over
NumPy arrays, and the results are compared with NumPy: the stable argsort,
the NumPy twins of sampling_kernels and of the sort keys, and np.cumsum.
Catches what compiling alone cannot (a missing barrier, a wrong index, a
reduction that drops a warp); not timing, memory ordering between blocks,
or what only the GPU's compiler does.
"""

import ctypes
import functools
import os
import re
import shutil
import subprocess

import numpy as np
import pytest

import tensorplay as tp
from tensorplay import _dtypes as dt
from tensorplay._kernels import cache
from tensorplay._kernels import codegen
from tensorplay._kernels import sampling_kernels as sk
from tensorplay._kernels import sort_kernels
from tensorplay._kernels import scan_kernels
from tensorplay._ops import sampling as _sampling
from tensorplay._ops import scan as _scan_ops

HERE = os.path.dirname(os.path.abspath(__file__))
CXX = shutil.which("g++") or shutil.which("c++")


# Flat elementwise kernels (contiguous operands): out = in0 * 2 + s0
FLAT = {"tp_emu_flat_f32": dt.float32, "tp_emu_flat_f64": dt.float64}
# The sort keys of sort and topk (flat elementwise kernels): name -> (dtype, descending)
KEYS = {f"tp_emu_key_{d.name}_{int(desc)}": (d, desc)
        for d in (dt.float32, dt.float64, dt.float16, dt.bfloat16, dt.int64, dt.int32, dt.uint8, dt.bool_)
        for desc in (False, True)}
# The scan kernels: (input dtype, output dtype) of the chunk scans; the chunk
# totals scan and add in the accumulator's dtype
SCANS = [(dt.float32, dt.float32), (dt.float64, dt.float64), (dt.int32, dt.int64), (dt.bool_, dt.int64),
         (dt.int64, dt.int64), (dt.int64, dt.int32), (dt.float32, dt.int64)]
# A small scan configuration: 2 elements a thread, blocks of up to 64 threads
SMALL_SCAN = {"items": 2, "block": 64}
SCAN_PLAN = scan_kernels.scan_plan


def _scan_sources():
    out = {}
    for in_t, out_t in SCANS:
        acc = scan_kernels.acc_dtype(in_t)
        for o in (out_t, acc):
            name = f"tp_scan_{in_t.name}_{acc.name}_{o.name}"
            out[name] = scan_kernels.scan_source(name, in_t, acc, o)
            out[name + "_small"] = scan_kernels.scan_source(name + "_small", in_t, acc, o, **SMALL_SCAN)
            for level in (acc, o):      # the chunk totals' scans, and the add pass
                name = f"tp_scan_{acc.name}_{acc.name}_{level.name}"
                out[name] = scan_kernels.scan_source(name, acc, acc, level)
                out[name + "_small"] = scan_kernels.scan_source(name + "_small", acc, acc, level, **SMALL_SCAN)
            name = f"tp_scan_add_{acc.name}_{o.name}"
            out[name] = scan_kernels.add_source(name, acc, o)
    return list(out.items())


def _all_sources():
    """(name, source) of every kernel variant of the sort and sampling
    modules, and the flat elementwise kernels of FLAT."""
    out = [(name, make()) for make, name in sort_kernels.SOURCES.values()]
    out += [(name, codegen.elementwise_source(name, d, (d,), "a0 * 2 + s0", 0, ("f",))) for name, d in FLAT.items()]
    out += [(name, codegen.elementwise_source(name, dt.int64, (d,), sort_kernels.key_expr(d, desc), 0, (),
                                              sort_kernels.KEY_PREAMBLE)) for name, (d, desc) in KEYS.items()]
    out += _scan_sources()
    for d in sk.WEIGHT_DTYPES:
        for make in (sk.race_keys_source, sk.inverse_cdf_source):
            src, name = make(d)
            out.append((name, src))
    return out


_SIGNATURE = re.compile(r'extern "C" __global__ void __launch_bounds__\(\d+\) (\w+)\((.*?)\)\s*\{', re.S)


def _wrapper(name, source):
    """A C entry point ``emu_<name>(grid, block, params)`` that unpacks the
    8-byte argument slots of ``params`` (as cuLaunchKernel does) and runs the
    kernel over the grid."""
    found = _SIGNATURE.search(source)
    assert found and found.group(1) == name, name
    args = []
    for k, param in enumerate(p.strip() for p in found.group(2).split(",")):
        ctype = re.sub(r"\s*\b\w+$", "", param).replace("__restrict__", "").strip()
        if "*" in ctype:
            args.append(f"({ctype})(uintptr_t)p[{k}]")
        elif ctype == "long long":
            args.append(f"p[{k}]")
        elif ctype == "double":
            args.append(f"[&] {{ double v; std::memcpy(&v, &p[{k}], 8); return v; }}()")
        else:
            raise AssertionError(f"{name}: no unpacking for parameter type {ctype!r}")
    return (f'extern "C" void emu_{name}(unsigned int grid, unsigned int block, const long long* p) {{\n'
            f"  tp_emu::launch(grid, block, [&] {{ {name}({', '.join(args)}); }});\n}}\n")


@pytest.fixture(scope="module")
def emulated(tmp_path_factory):
    """The kernels built for the CPU: a ctypes library with one emu_<name> per kernel."""
    if CXX is None:
        pytest.skip("no C++ compiler")
    folder = tmp_path_factory.mktemp("emulated")
    probe = folder / "probe.cpp"
    probe.write_text(f'#include "{os.path.join(HERE, "cuda_emulator.hpp")}"\nint main() {{ return 0; }}\n')
    if subprocess.run([CXX, "-std=c++20", "-pthread", "-fsyntax-only", str(probe)], capture_output=True).returncode:
        pytest.skip(f"{CXX} cannot build the emulator (C++20 with <barrier> needed)")
    parts = [f'#include "{os.path.join(HERE, "cuda_emulator.hpp")}"\n']
    for name, src in _all_sources():
        body = src.replace(codegen.PREAMBLE, "")        # its PTX conversions: the emulator has its own
        parts.append(f"namespace ns_{name} {{\n{body}\n}}\nusing ns_{name}::{name};\n")
        parts.append(_wrapper(name, src))
    cpp, lib = folder / "kernels.cpp", folder / "kernels.so"
    cpp.write_text("".join(parts))
    res = subprocess.run([CXX, "-std=c++20", "-O1", "-ffp-contract=off", "-fno-fast-math", "-pthread",
                          "-shared", "-fPIC", "-o", str(lib), str(cpp)], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-4000:]
    return ctypes.CDLL(str(lib))


class _EmulatedFunction:
    """A loaded kernel's stand-in: launch() runs the emulated kernel."""

    def __init__(self, lib, name):
        self.entry = getattr(lib, f"emu_{name}")
        self.launches = []

    def launch(self, grid, block, params, shared_mem=0, stream=None):
        assert isinstance(grid, int) and isinstance(block, int), (grid, block)
        assert len(params) % 8 == 0
        self.launches.append((grid, block))
        buf = ctypes.create_string_buffer(params, len(params))
        self.entry(ctypes.c_uint(grid), ctypes.c_uint(block), buf)


class FakeCudaTensor:
    """What the launchers read of a CUDA tensor, over a NumPy array."""
    is_cpu = False
    _device_index = 0

    def __init__(self, array, dtype=None):
        self.array = np.ascontiguousarray(array)
        self.dtype = dtype or dt.from_numpy_dtype(self.array.dtype)
        self.shape = self.array.shape

    def data_ptr(self):
        return self.array.ctypes.data

    def view(self, *shape):
        return FakeCudaTensor(self.array.reshape(shape), self.dtype)


@pytest.fixture
def kernels(emulated, monkeypatch):
    """Route the launchers to the emulated kernels and fake CUDA allocations."""
    functions = {}

    def cached_function(key, device, make):
        if key not in functions:
            _src, name = make()
            functions[key] = _EmulatedFunction(emulated, name)
        return functions[key]

    monkeypatch.setattr(cache, "cached_function", cached_function)
    monkeypatch.setattr(_sampling, "empty_cuda",
                        lambda shape, dtype, dev: FakeCudaTensor(np.empty(shape, dtype=dtype.numpy_dtype)))
    monkeypatch.setitem(cache._sm_cache, 0, 4)          # a small GPU: grid-stride loops take several turns
    return functions


@pytest.mark.parametrize("rows, n", [(1, 1), (1, 2), (1, 3), (1, 1000), (1, 2048), (1, 4096),
                                     (1, 5000), (3, 700), (5, 3), (2, 2049)])
def test_sort_rows_gives_the_stable_argsort(kernels, rows, n):
    rng = np.random.default_rng(n * 7 + rows)
    keys = rng.integers(0, 2 ** 64, size=(rows, n), dtype=np.uint64)
    keys[:, ::3] = rng.integers(0, 4, size=keys[:, ::3].shape)     # many ties
    if n > 2:
        keys[:, 1] = np.uint64(sort_kernels.PAD_KEY)                # a real key equal to the padding's
    order = _sampling.sort_rows(FakeCudaTensor(keys.view(np.int64)), rows, n).array
    padded = sort_kernels.padded_length(n)
    assert order.shape == (rows, padded)
    np.testing.assert_array_equal(order[:, :n], np.argsort(keys, axis=1, kind="stable"))
    np.testing.assert_array_equal(order[:, n:], np.broadcast_to(np.arange(n, padded), (rows, padded - n)))
    steps = sort_kernels.sort_steps(padded)
    assert sum(len(f.launches) for f in kernels.values()) == len(steps)


def _uniforms(rng, shape):
    """Uniforms on rand's float64 grid (multiples of 2**-53), the extremes included."""
    u = rng.integers(0, 2 ** 53, size=shape) * 2.0 ** -53
    u.flat[0] = 0.0
    u.flat[-1] = 1 - 2.0 ** -53
    return u


def _weights(rng, rows, n, d):
    w = rng.random((rows, n)) * 10.0 ** rng.integers(-3, 3, size=(rows, n))
    w[rng.random((rows, n)) < 0.3] = 0.0
    w[:, 0] = 0.0
    w[:, -1] = 0.0
    if n > 2:
        w[:, 1] = 1.0                                   # every row has a positive weight
    return w.astype(d.numpy_dtype)


@pytest.mark.parametrize("d", sk.WEIGHT_DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("rows, n", [(1, 5), (3, 300), (2, 1537)])
def test_race_keys_kernel_matches_its_numpy_twin_bit_for_bit(kernels, d, rows, n):
    rng = np.random.default_rng(n + rows)
    w = _weights(rng, rows, n, d)
    u = _uniforms(rng, (rows, n))
    status = np.zeros(1, dtype=np.int32)
    keys = _sampling.race_keys_cuda(FakeCudaTensor(w, d), FakeCudaTensor(u), 2, FakeCudaTensor(status)).array
    np.testing.assert_array_equal(keys, sk.race_keys(w.astype(np.float64), u))
    assert status[0] == 0


@pytest.mark.parametrize("d", sk.WEIGHT_DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("rows, n, k", [(1, 5, 3), (2, 255, 40), (1, 257, 600), (3, 4000, 100)])
def test_inverse_cdf_kernel_matches_its_numpy_twin(kernels, d, rows, n, k):
    rng = np.random.default_rng(n * 3 + k)
    w = _weights(rng, rows, n, d)
    w64 = w.astype(np.float64)
    chunk = sk.cdf_chunk_length(n)
    x = np.linspace(0, 1, k, endpoint=False)
    u = _uniforms(rng, (rows, k))
    # uniforms landing exactly on cumulative sums at chunk boundaries
    c, total = sk.chunked_cdf(w64)
    for r in range(rows):
        for s, i in enumerate(range(chunk - 1, n, chunk)[: k // 4]):
            u[r, s] = c[r, i] / total[r]
    u[:, -2] = x[-1]
    status = np.zeros(1, dtype=np.int32)
    picks = _sampling.inverse_cdf_cuda(FakeCudaTensor(w, d), FakeCudaTensor(u), k, FakeCudaTensor(status)).array
    np.testing.assert_array_equal(picks, sk.inverse_cdf(w64, u))
    assert (w64[np.arange(rows)[:, None], picks] > 0).all()
    assert status[0] == 0


@pytest.mark.parametrize("replacement", [False, True])
def test_kernels_report_invalid_rows_as_the_numpy_twin_does(kernels, replacement):
    d = tp.float32
    cases = {
        "negative": [[1.0, -1.0, 2.0]], "nan": [[1.0, np.nan, 2.0]], "inf": [[np.inf, 1.0, 1.0]],
        "zero row": [[1.0, 2.0, 3.0], [0.0, 0.0, 0.0]], "one positive": [[0.0, 3.0, 0.0]],
    }
    for what, rows in cases.items():
        w = np.array(rows, dtype=np.float32)
        k = 2
        status = np.zeros(1, dtype=np.int32)
        if replacement:
            u = np.full((w.shape[0], k), 0.5)
            picks = _sampling.inverse_cdf_cuda(FakeCudaTensor(w, d), FakeCudaTensor(u), k,
                                               FakeCudaTensor(status)).array
        else:
            u = np.full(w.shape, 0.5)
            _sampling.race_keys_cuda(FakeCudaTensor(w, d), FakeCudaTensor(u), k, FakeCudaTensor(status))
            picks = np.zeros(1, dtype=np.int64)
        expected = sk.row_status(w.astype(np.float64), k, replacement)
        assert status[0] == expected, what
        assert ((picks >= 0) & (picks < w.shape[1])).all(), what     # in range even for invalid rows
    big = np.array([[np.finfo(np.float64).max, np.finfo(np.float64).max]])
    status = np.zeros(1, dtype=np.int32)
    if replacement:
        _sampling.inverse_cdf_cuda(FakeCudaTensor(big), FakeCudaTensor(np.full((1, 1), 0.5)), 1,
                                   FakeCudaTensor(status))
        assert status[0] == sk.SUM_OVERFLOW == sk.row_status(big, 1, True)


@pytest.mark.parametrize("name", FLAT)
@pytest.mark.parametrize("n", [1, 5, 31, 32, 33, 255, 256, 257, 1000, 1023, 1024, 2047, 2048, 2049, 4096, 5000,
                               70001, 70002, 300001])
def test_flat_kernels_cover_every_element_with_the_plans_grid(emulated, monkeypatch, name, n):
    """The launch plan's grid and block (one element a thread under a tile,
    tiles over a grid-stride loop from one on, vectors when aligned) write
    each element once, and only those."""
    d = FLAT[name]
    f = _EmulatedFunction(emulated, name)
    monkeypatch.setitem(cache._sm_cache, 0, 4)          # a small GPU: grid-stride loops take several turns
    src = np.arange(1, n + 1, dtype=d.numpy_dtype) * 0.5
    out = np.full(n + 8, -7.0, dtype=d.numpy_dtype)          # guard elements past the end
    for offset in (0, 1):                                      # aligned, and off the vectors' alignment
        out[:] = -7.0
        ins, outs = src[offset:], out[offset:]
        m = n - offset
        if m == 0:
            continue
        plan = cache.LaunchPlan(f, 0, m, 2, ("f",), (), (), itemsizes=(d.itemsize, d.itemsize))
        plan.launch([outs.ctypes.data, ins.ctypes.data], [3.0], 0)
        np.testing.assert_array_equal(outs[:m], ins[:m] * 2 + 3.0)
        assert (outs[m:] == -7.0).all() and (out[:offset] == -7.0).all()
        grid, block = f.launches[-1]
        sizes = (d.itemsize, d.itemsize)
        width = codegen.flat_vector_width(sizes)
        if m < codegen.flat_tile(sizes):                       # one element a thread
            assert grid * block >= m and block == cache.small_block(m) and block % 32 == 0
        elif -(-m // (cache.BLOCK * width)) <= 4 * cache.COVER_BLOCKS_PER_SM:   # one vector a thread
            assert block == cache.BLOCK and grid * block < m <= grid * block * width
        else:                                                  # tiles, grid-stride
            assert block == cache.BLOCK and grid * block * width < m


# ------------------------------------------------------------------ sort keys

def _key_values(d, rng):
    """Values of dtype ``d`` with what orders hard: ties, signed zeros, NaN, the extremes."""
    if d.kind == "b":
        return np.array([True, False, False, True, True])
    if d.kind in "iu":
        info = np.iinfo(d.numpy_dtype)
        v = rng.integers(info.min, info.max, size=300, dtype=d.numpy_dtype, endpoint=True)
        return np.concatenate([v, np.array([info.min, info.max, 0, 1, 0, info.max], dtype=d.numpy_dtype)])
    v = rng.standard_normal(300) * 10.0 ** rng.integers(-3, 4, size=300)
    special = [0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, 1.0, 1.0, -1.0, 5e-324, -5e-324, 1e300, -1e300]
    with np.errstate(over="ignore"):                # 1e300 is inf in the narrow types
        return np.concatenate([v, special]).astype(d.numpy_dtype)


@pytest.mark.parametrize("name", KEYS)
def test_sort_key_kernels_match_their_numpy_twin(emulated, monkeypatch, name):
    """The keys the CUDA kernel computes are sort_kernels.sort_keys' bit for
    bit, and their stable argsort is the stable sort of the values as
    PyTorch orders them (NaN last, -0.0 equal to 0.0)."""
    monkeypatch.setitem(cache._sm_cache, 0, 4)
    d, desc = KEYS[name]
    vals = _key_values(d, np.random.default_rng(len(name)))
    n = vals.size
    f = _EmulatedFunction(emulated, name)
    keys = np.zeros(n, dtype=np.int64)
    src = np.ascontiguousarray(vals)
    plan = cache.LaunchPlan(f, 0, n, 2, (), (), (), itemsizes=(8, d.itemsize))
    plan.launch([keys.ctypes.data, src.ctypes.data], [], 0)
    twin = sort_kernels.sort_keys(vals, desc)
    np.testing.assert_array_equal(keys.view(np.uint64), twin)
    if d.kind == "f":
        w = vals.astype(np.float64)
        nan = np.isnan(w)
        w = np.where(nan, 0.0, w)
        # NaN after every value ascending, before every value descending; stable: lexsort is
        expect = np.lexsort((-w, ~nan)) if desc else np.lexsort((w, nan))
    else:
        w = vals.astype(np.int64)
        expect = np.argsort(~w if desc else w, kind="stable")
    np.testing.assert_array_equal(np.argsort(twin, kind="stable"), expect)


# ------------------------------------------------------------------ scans

@pytest.fixture
def scans(emulated, monkeypatch):
    """Route the scan launcher to the emulated kernels and fake its allocations."""
    monkeypatch.setattr(_scan_ops, "empty_cuda",
                        lambda shape, dtype, dev: FakeCudaTensor(np.empty(shape, dtype=dtype.numpy_dtype)))
    monkeypatch.setitem(cache._sm_cache, 0, 4)

    def route(small):
        suffix = "_small" if small else ""
        launched = []

        def scan_function(in_t, out_t, device):
            acc = scan_kernels.acc_dtype(in_t)
            f = _EmulatedFunction(emulated, f"tp_scan_{in_t.name}_{acc.name}_{out_t.name}{suffix}")
            launched.append(f)
            return f

        def add_function(acc, out_t, device):
            f = _EmulatedFunction(emulated, f"tp_scan_add_{acc.name}_{out_t.name}")
            launched.append(f)
            return f
        monkeypatch.setattr(scan_kernels, "scan_function", scan_function)
        monkeypatch.setattr(scan_kernels, "add_function", add_function)
        if small:
            monkeypatch.setattr(scan_kernels, "scan_plan", functools.partial(SCAN_PLAN, **SMALL_SCAN))
        return launched
    return route


def _scan_input(in_t, rows, n, rng):
    if in_t.kind == "b":
        return rng.random((rows, n)) < 0.5
    if in_t.kind == "f":
        return rng.integers(-4, 5, size=(rows, n)).astype(in_t.numpy_dtype)   # sums exact in float32
    return rng.integers(-1000, 1000, size=(rows, n)).astype(in_t.numpy_dtype)


@pytest.mark.parametrize("in_t, out_t", SCANS, ids=lambda d: d.name)
@pytest.mark.parametrize("rows, n", [(1, 1), (1, 5), (3, 100), (2, 256), (1, 4096), (1, 4097), (2, 9000)])
def test_scan_rows_gives_the_cumulative_sums(scans, in_t, out_t, rows, n):
    launched = scans(small=False)
    rng = np.random.default_rng(rows * 10007 + n)
    x = _scan_input(in_t, rows, n, rng)
    out = np.full((rows, n), 77, dtype=out_t.numpy_dtype)
    _scan_ops.scan_rows(FakeCudaTensor(x, in_t), rows, n, FakeCudaTensor(out, out_t))
    expect = np.cumsum(x.astype(scan_kernels.acc_dtype(in_t).numpy_dtype), axis=1)
    np.testing.assert_array_equal(out, expect.astype(out_t.numpy_dtype))
    chunks = scan_kernels.scan_plan(n)[2]
    assert len(launched) == (1 if chunks == 1 else 3)


@pytest.mark.parametrize("in_t, out_t", [(dt.float64, dt.float64), (dt.int32, dt.int64)], ids=lambda d: d.name)
@pytest.mark.parametrize("rows, n", [(1, 63), (2, 129), (1, 5000), (3, 20000)])
def test_scan_rows_with_small_blocks_takes_several_levels(scans, in_t, out_t, rows, n):
    """Chunks of 128 elements: 20000 elements take three levels of chunk totals."""
    launched = scans(small=True)
    rng = np.random.default_rng(n)
    x = _scan_input(in_t, rows, n, rng)
    out = np.zeros((rows, n), dtype=out_t.numpy_dtype)
    _scan_ops.scan_rows(FakeCudaTensor(x, in_t), rows, n, FakeCudaTensor(out, out_t))
    np.testing.assert_array_equal(out, np.cumsum(x, axis=1).astype(out_t.numpy_dtype))
    levels, m = 1, n
    while SCAN_PLAN(m, **SMALL_SCAN)[2] > 1:
        m = SCAN_PLAN(m, **SMALL_SCAN)[2]
        levels += 1
    assert len(launched) == 1 + 2 * (levels - 1)
    if n == 20000:
        assert levels == 3
