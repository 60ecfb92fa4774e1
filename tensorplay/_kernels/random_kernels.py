# SPDX-License-Identifier: Apache-2.0
"""CUDA C of the random kernels: Philox4x32-10, the exact transforms and the
device-resident generator state.

The arithmetic is ``tensorplay._kernels.philox``'s, operation for operation,
with its constants (as hexadecimal literals) and with IEEE intrinsics
(``__fadd_rn``, ``__fmul_rn``, ``__fdiv_rn``, ``__fsqrt_rn`` and the double
ones) that are never contracted into fused multiply-adds; the kernels are
also compiled with ``--fmad=false``. So the bits equal the CPU path's.

Generator state on the device (``tp_rng_state``, 32 bytes): the seed, the
offset and a done-counter. Every block of a random kernel reads seed and
offset when it starts; when it is done, thread 0 counts the block in
(``atomicAdd`` after ``__threadfence``) and the last block of the grid
writes ``offset + 1`` and clears the counter. One launch thus draws and
advances the stream, with no host work: an eager call, a graph replay and
an iteration of a WHILE body all consume the next offset.

Kernel arguments, 8 bytes each: ``out``, the input (dropout's values,
Bernoulli's probabilities) when the op has one, the state, ``n``, then the
op's scalars (double or long long). Each thread computes one Philox block
(four 32-bit words) per grid-stride step and writes its two or four
elements with one vector store when the pointers allow.
"""

from __future__ import annotations

import struct

from tensorplay import _dtypes as dt
from tensorplay._kernels import cache
from tensorplay._kernels import codegen
from tensorplay._kernels import philox as _philox

BLOCK = 256
STATE_BYTES = 32          # seed, offset, done-counter, padding
OPTIONS = ("--fmad=false",)

# ------------------------------------------------------------------ literals


def literal(value, ctype):
    """An exact C literal of ``value`` (already rounded to ``ctype``): hexadecimal."""
    text = float.hex(float(value))
    return text + "f" if ctype == "float" else text


def _horner(ctype, coefs, z):
    """C lines evaluating ``coefs[0] + z (coefs[1] + ...)`` into ``p`` (as FloatMath.horner)."""
    add, mul = _ops(ctype)
    lines = [f"  {ctype} p = {literal(coefs[-1], ctype)};"]
    for c in reversed(coefs[:-1]):
        lines.append(f"  p = {add}({mul}(p, {z}), {literal(c, ctype)});")
    return lines


def _ops(ctype):
    return ("__fadd_rn", "__fmul_rn") if ctype == "float" else ("__dadd_rn", "__dmul_rn")


# ------------------------------------------------------------------ shared device code

def philox_source():
    """Philox4x32-10 over counter (block lo, block hi, o0, o1) and key (k0, k1)."""
    return f"""
__device__ __forceinline__ void tp_philox(unsigned long long block, unsigned int k0, unsigned int k1,
                                          unsigned int o0, unsigned int o1, unsigned int r[4]) {{
  unsigned int c0 = (unsigned int)block, c1 = (unsigned int)(block >> 32), c2 = o0, c3 = o1;
#pragma unroll
  for (int round = 0; round < {_philox.PHILOX_ROUNDS}; ++round) {{
    const unsigned int hi0 = __umulhi({_philox.PHILOX_M0:#010x}u, c0), lo0 = {_philox.PHILOX_M0:#010x}u * c0;
    const unsigned int hi1 = __umulhi({_philox.PHILOX_M1:#010x}u, c2), lo1 = {_philox.PHILOX_M1:#010x}u * c2;
    c0 = hi1 ^ c1 ^ k0; c1 = lo1; c2 = hi0 ^ c3 ^ k1; c3 = lo0;
    k0 += {_philox.PHILOX_W0:#010x}u; k1 += {_philox.PHILOX_W1:#010x}u;
  }}
  r[0] = c0; r[1] = c1; r[2] = c2; r[3] = c3;
}}
__device__ __forceinline__ unsigned long long tp_rng_w64(const unsigned int r[4], int j) {{
  return (unsigned long long)r[2 * j] | ((unsigned long long)r[2 * j + 1] << 32);
}}
"""


def log_source_f32(fm):
    """``tp_rng_log_f(u, tab)``: TableMath32.log in C, ``tab`` its log table."""
    c = "float"
    c2, c3, c4 = (literal(x, c) for x in fm.log1p_coefs)
    return "\n".join([
        "__device__ __forceinline__ float tp_rng_log_f(float u, const tp_f4* tab) {",
        "  const unsigned int bits = __float_as_uint(u);",
        f"  int e = (int)(bits >> 23) - {fm.bias};",
        "  float m = __uint_as_float((bits & 0x7fffffu) | 0x3f800000u);",
        f"  if (m > {literal(fm.sqrt2, c)}) {{ m = __fmul_rn(m, {literal(0.5, c)}); e += 1; }}",
        "  const tp_f4 row = tab[(__float_as_uint(m) >> 16) & 0xffu];",
        "  const float r = __fmul_rn(__fsub_rn(m, row.x), row.y);",
        f"  const float q = __fmul_rn(__fadd_rn(__fmul_rn(r, {c4}), {c3}), r);",
        f"  const float l1p = __fadd_rn(r, __fmul_rn(__fmul_rn(r, r), __fadd_rn(q, {c2})));",
        "  const float ef = __int2float_rn(e);",
        f"  return __fadd_rn(__fadd_rn(__fmul_rn(ef, {literal(fm.ln2_hi, c)}), row.z), "
        f"__fadd_rn(__fmul_rn(ef, {literal(fm.ln2_lo, c)}), l1p));",
        "}"]) + "\n"


def sincos_source_f32(fm):
    """``tp_rng_sincos_2pi_f(k, tab, &c, &s)``: TableMath32.sincos_2pi in C for
    24-bit ``k``, ``tab`` its (cos, sin) table."""
    return "\n".join([
        "__device__ __forceinline__ void tp_rng_sincos_2pi_f(unsigned int k, const tp_f2* tab, "
        "float* cos_out, float* sin_out) {",
        f"  const tp_f2 row = tab[k >> {24 - fm.SINCOS_BITS}];",
        f"  const float b = __fmul_rn(__uint2float_rn(k & {(1 << (24 - fm.SINCOS_BITS)) - 1:#x}u), "
        f"{literal(fm.sincos_step, 'float')});",
        "  const float b2 = __fmul_rn(b, b);",
        f"  const float cb = __fsub_rn({literal(1.0, 'float')}, __fmul_rn(b2, {literal(0.5, 'float')}));",
        f"  const float sb = __fsub_rn(b, __fmul_rn(__fmul_rn(b, b2), {literal(fm.sin_coef, 'float')}));",
        "  cos_out[0] = __fsub_rn(__fmul_rn(row.x, cb), __fmul_rn(row.y, sb));",
        "  sin_out[0] = __fadd_rn(__fmul_rn(row.y, cb), __fmul_rn(row.x, sb));",
        "}"]) + "\n"


# The float32 tables, as the kernels' global constants; a kernel that uses
# one copies it into shared memory first (random rows: no coalescing).
TABLE_TYPES = r"""
struct alignas(8) tp_f2 { float x, y; };
struct alignas(16) tp_f4 { float x, y, z, w; };
"""

# name -> (C type, global, shared name, rows of fm)
TABLES = {
    "sincos": ("tp_f2", "tp_rng_sincos_table_f", "sincos_tab", lambda fm: fm.sincos_table),
    "log": ("tp_f4", "tp_rng_log_table_f", "log_tab", lambda fm: fm.log_table),
}


def table_source(name):
    """The global constant array of table ``name`` (exact hexadecimal literals)."""
    ctype, glob, _, rows_of = TABLES[name]
    rows = rows_of(_philox.F32)
    body = ",\n".join("  {" + ", ".join(literal(v, "float") for v in row) + "}" for row in rows)
    return f"__device__ const {ctype} {glob}[{len(rows)}] = {{\n{body}\n}};\n"


def log_source(fm):
    """``tp_rng_log_d(u)``: FloatMath.log in C (float64)."""
    c = "double"
    add, mul = _ops(c)
    one = literal(1.0, c)
    lines = ["__device__ __forceinline__ double tp_rng_log_d(double u) {",
             "  const unsigned long long bits = (unsigned long long)__double_as_longlong(u);",
             f"  int e = (int)(bits >> {fm.mant_bits}) - {fm.bias};",
             f"  double m = __longlong_as_double((long long)((bits & {(1 << fm.mant_bits) - 1:#x}ull) | "
             f"{fm.bias << fm.mant_bits:#x}ull));",
             f"  if (m > {literal(fm.sqrt2, c)}) {{ m = {mul}(m, {literal(0.5, c)}); e += 1; }}",
             f"  const double f = __dsub_rn(m, {one});",
             f"  const double s = __ddiv_rn(f, {add}(m, {one}));",
             f"  const double z = {mul}(s, s);",
             ] + _horner(c, fm.log_coefs, "z") + [
        f"  const {c} h = {mul}(s, p);",
        f"  const {c} ef = __int2double_rn(e);",
        f"  return {add}({mul}(ef, {literal(fm.ln2_hi, c)}), {add}({mul}(ef, {literal(fm.ln2_lo, c)}), {add}(h, h)));",
        "}"]
    return "\n".join(lines) + "\n"


def sincos_source(fm, bits):
    """``tp_rng_sincos_2pi_d(k, &c, &s)``: FloatMath.sincos_2pi in C (float64)
    for ``k < 2**bits``."""
    c = "double"
    add, mul = _ops(c)
    quarter = [f"  const int q = (int)(((unsigned long long)k + {1 << (bits - 3)}ull) >> {bits - 2});",
               f"  const long long v = (long long)k - ((long long)q << {bits - 2});",
               f"  const {c} x = {mul}({mul}(__ll2double_rn(v), {literal(2.0 ** -bits, c)}), "
               f"{literal(fm.two_pi, c)});"]
    lines = [f"__device__ __forceinline__ void tp_rng_sincos_2pi_d(unsigned int k, {c}* cos_out, "
             f"{c}* sin_out) {{"] + quarter + [f"  const {c} z = {mul}(x, x);"]
    lines += ["  " + x for x in ["{"] + _horner(c, fm.cos_coefs, "z") + ["  cos_out[0] = p;", "}"]]
    lines += ["  " + x for x in ["{"] + _horner(c, fm.sin_coefs, "z") + [f"  sin_out[0] = {mul}(x, p);", "}"]]
    lines += [f"  const {c} cv = cos_out[0], sv = sin_out[0];",
              "  switch (q & 3) {",
              "    case 0: break;",
              "    case 1: cos_out[0] = -sv; sin_out[0] = cv; break;",
              "    case 2: cos_out[0] = -cv; sin_out[0] = -sv; break;",
              "    default: cos_out[0] = sv; sin_out[0] = -cv; break;",
              "  }",
              "}"]
    return "\n".join(lines) + "\n"


def math_source(tables=()):
    """Philox, log and sin/cos for both compute types, and the float32 tables
    named in ``tables``: plain functions of IEEE operations, compilable as
    host C++ too (tests do, against NumPy)."""
    return (philox_source() + TABLE_TYPES + "".join(table_source(t) for t in tables)
            + log_source_f32(_philox.F32) + log_source(_philox.F64)
            + sincos_source_f32(_philox.F32) + sincos_source(_philox.F64, 32))


STATE_SOURCE = r"""
struct tp_rng_state { unsigned long long seed; unsigned long long offset; unsigned int done; unsigned int pad[3]; };
__device__ __forceinline__ unsigned long long tp_rng_load(const unsigned long long* p) {
  return *(const volatile unsigned long long*)p;
}
// The last block to finish advances the offset: every block has read the
// state by then (each reads it before counting itself in).
__device__ __forceinline__ void tp_rng_advance(tp_rng_state* st, unsigned long long offset) {
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    // atomicInc wraps the counter to 0 in the same operation that finds the
    // last block, so no increment can fall between a count and its reset
    if (atomicInc(&st->done, gridDim.x - 1u) == gridDim.x - 1u) {
      __threadfence();      // order the other blocks' reads before this write
      *(volatile unsigned long long*)&st->offset = offset + 1ull;
      __threadfence();
    }
  }
}
"""

SET_STATE_SOURCE = STATE_SOURCE + r"""
extern "C" __global__ void tp_rng_set_state(tp_rng_state* st, unsigned long long seed, unsigned long long offset) {""" + codegen.GRID_WAIT + r"""  st->seed = seed;
  st->offset = offset;
  st->done = 0u;
}
"""


def set_state_function(device):
    """The one-thread kernel writing (seed, offset) into a generator's device state."""
    return cache.cached_function(("rng_set_state",), device, lambda: (SET_STATE_SOURCE, "tp_rng_set_state"))


def launch_set_state(device, state_ptr, seed, offset, stream):
    """Write ``seed`` and ``offset`` into the state at ``state_ptr`` on ``stream``
    (kernel arguments carry them, so this can be captured)."""
    f = set_state_function(device)
    f.launch(1, 1, struct.pack("<QQQ", state_ptr, seed, offset), 0, stream)


# ------------------------------------------------------------------ the ops

class Dist:
    """One random op's kernel recipe.

    ``layout``: the stream layout (philox.W32, W64, BOX_MULLER);
    ``value``: the C type of the values before the store; ``scalars``: the
    kinds of the kernel's scalar arguments ('f' double, 'i' long long);
    ``prep``: C lines turning them into the values function's parameters
    ``params`` (C declarations); ``body``: C lines computing ``v[j]`` from
    ``r[4]`` (and the input values ``a[j]``); ``tables``: the float32
    tables (TABLES) it reads, passed to the values function by their shared
    names."""

    def __init__(self, layout, value, scalars, prep, params, body, input_dtype=None, tables=()):
        self.layout, self.value, self.scalars = layout, value, tuple(scalars)
        self.tables = tuple(tables)
        self.prep = prep
        self.params = list(params) + [f"const {TABLES[t][0]}* {TABLES[t][2]}" for t in self.tables]
        self.body = body
        self.input_dtype = input_dtype

    @property
    def per_block(self):
        return _philox.ELEMENTS_PER_BLOCK[self.layout]


def _compute(out):
    return "double" if out is dt.float64 else "float"


def _require_float(d, what):
    if d.kind != "f":
        raise TypeError(f"{what}: a floating dtype is needed, got {d.name}")


def uniform_dist(out):
    """``low + span * u``; u in [0, 1) exactly representable in ``out``."""
    _require_float(out, "uniform")
    c = _compute(out)
    add, mul = _ops(c)
    if out is dt.float64:
        body = ["for (int j = 0; j < 2; ++j) {",
                f"  const double u = __dmul_rn(__ull2double_rn(tp_rng_w64(r, j) >> 11), {literal(2.0 ** -53, c)});",
                f"  v[j] = {add}({mul}(u, span), low);",
                "}"]
        layout = _philox.W64
    else:
        bits = _philox.UNIFORM_BITS[out.name]
        body = ["for (int j = 0; j < 4; ++j) {",
                f"  const float u = __fmul_rn(__uint2float_rn(r[j] >> {32 - bits}), {literal(2.0 ** -bits, c)});",
                f"  v[j] = {add}({mul}(u, span), low);",
                "}"]
        layout = _philox.W32
    return Dist(layout, c, "ff", [f"const {c} low = ({c})s0, span = ({c})s1;"],
                [f"{c} low", f"{c} span"], body)


def normal_dist(out):
    """Box-Muller, four normals per block, then ``z * std + mean``."""
    _require_float(out, "normal")
    c = _compute(out)
    add, mul = _ops(c)
    if c == "float":
        u1 = f"__fmul_rn(__uint2float_rn((r[2 * p] >> 8) + 1u), {literal(2.0 ** -24, c)})"
        sincos = "tp_rng_sincos_2pi_f(r[2 * p + 1] >> 8, sincos_tab, &cs, &sn)"
        log = "tp_rng_log_f(u1, log_tab)"
        sqrt, tables = "__fsqrt_rn", ("sincos", "log")
    else:
        u1 = f"__dmul_rn(__dadd_rn(__uint2double_rn(r[2 * p]), 1.0), {literal(2.0 ** -32, c)})"
        sincos = "tp_rng_sincos_2pi_d(r[2 * p + 1], &cs, &sn)"
        log = "tp_rng_log_d(u1)"
        sqrt, tables = "__dsqrt_rn", ()
    body = ["for (int p = 0; p < 2; ++p) {",
            f"  const {c} u1 = {u1};",
            f"  {c} cs, sn;",
            f"  {sincos};",
            f"  const {c} rad = {sqrt}({mul}({log}, {literal(-2.0, c)}));",
            f"  v[2 * p] = {add}({mul}({mul}(rad, cs), stdv), mean);",
            f"  v[2 * p + 1] = {add}({mul}({mul}(rad, sn), stdv), mean);",
            "}"]
    return Dist(_philox.BOX_MULLER, c, "ff", [f"const {c} mean = ({c})s0, stdv = ({c})s1;"],
                [f"{c} mean", f"{c} stdv"], body, tables=tables)


def exponential_dist(out):
    """``(-1 / lambd) * log(u)`` for u in (0, 1], never 0 (as philox.exponential)."""
    _require_float(out, "exponential")
    c = _compute(out)
    mul = _ops(c)[1]
    tiniest = literal(_philox.TINIEST[out.name], c)
    if out is dt.float64:
        step = 2.0 ** -53
        u = f"__dmul_rn(__ull2double_rn((tp_rng_w64(r, j) >> 11) + 1ull), {literal(step, c)})"
        n, layout, div, log, tables = 2, _philox.W64, "__ddiv_rn", "tp_rng_log_d(u)", ()
    else:
        step = 2.0 ** -24
        u = f"__fmul_rn(__uint2float_rn((r[j] >> 8) + 1u), {literal(step, c)})"
        n, layout, div, log, tables = 4, _philox.W32, "__fdiv_rn", "tp_rng_log_f(u, log_tab)", ("log",)
    body = [f"for (int j = 0; j < {n}; ++j) {{",
            f"  const {c} u = {u};",
            f"  const {c} lg = u == {literal(1.0, c)} ? {literal(-step / 2, c)} : {log};",
            f"  const {c} x = {mul}(neg_inv_lambd, lg);",
            f"  v[j] = x < {tiniest} ? {tiniest} : x;",
            "}"]
    return Dist(layout, c, "f", [f"const {c} neg_inv_lambd = {div}({literal(-1.0, c)}, ({c})s0);"],
                [f"{c} neg_inv_lambd"], body, tables=tables)


_UNIT_DOUBLE = f"__dmul_rn(__uint2double_rn(r[j]), {literal(2.0 ** -32, 'double')})"


def bernoulli_dist(out):
    """``u < p`` with u = w * 2**-32 in double, p a scalar."""
    body = ["for (int j = 0; j < 4; ++j) v[j] = " + _UNIT_DOUBLE + " < p;"]
    return Dist(_philox.W32, "bool", "f", ["const double p = s0;"], ["double p"], body)


def bernoulli_tensor_dist(out, probs):
    """``u < p[i]`` with the probabilities an input tensor (floating)."""
    _require_float(probs, "bernoulli probabilities")
    body = ["for (int j = 0; j < 4; ++j) v[j] = " + _UNIT_DOUBLE + " < (double)a[j];"]
    return Dist(_philox.W32, "bool", "", [], [], body, input_dtype=probs)


def dropout_dist(out):
    """``(x * keep) * scale`` with keep = ``u < p_keep`` (u = w * 2**-32, double)."""
    _require_float(out, "dropout")
    c = _compute(out)
    mul = _ops(c)[1]
    body = ["for (int j = 0; j < 4; ++j) {",
            f"  const {c} keep = {_UNIT_DOUBLE} < p_keep ? {literal(1.0, c)} : {literal(0.0, c)};",
            f"  v[j] = {mul}({mul}(a[j], keep), scale);",
            "}"]
    return Dist(_philox.W32, c, "ff", ["const double p_keep = s0;", f"const {c} scale = ({c})s1;"],
                ["double p_keep", f"{c} scale"], body, input_dtype=out)


def integer_dist(out, mode):
    """Integers ``low + (w * span) >> 32`` (mode 'w32'), ``low + (w64 * span) >> 64``
    ('w64') or ``low + w64`` ('full', span 2**64), wrapping in 64 bits."""
    if mode == "w32":
        body = ["for (int j = 0; j < 4; ++j) v[j] = (long long)(low + (((unsigned long long)r[j] * span) >> 32));"]
        layout = _philox.W32
    elif mode == "w64":
        body = ["for (int j = 0; j < 2; ++j) v[j] = (long long)(low + __umul64hi(tp_rng_w64(r, j), span));"]
        layout = _philox.W64
    elif mode == "full":
        body = ["for (int j = 0; j < 2; ++j) v[j] = (long long)(low + tp_rng_w64(r, j)); (void)span;"]
        layout = _philox.W64
    else:
        raise ValueError(f"unknown integer mode {mode!r}")
    return Dist(layout, "long long", "ii",
                ["const unsigned long long low = (unsigned long long)s0, span = (unsigned long long)s1;"],
                ["unsigned long long low", "unsigned long long span"], body)


def dist_for(op, out, variant=None):
    """The Dist of ``op`` writing dtype ``out``; ``variant`` is the input
    dtype (bernoulli_tensor) or the integer mode (random)."""
    if op == "uniform":
        return uniform_dist(out)
    if op == "normal":
        return normal_dist(out)
    if op == "exponential":
        return exponential_dist(out)
    if op == "bernoulli":
        return bernoulli_dist(out)
    if op == "bernoulli_tensor":
        return bernoulli_tensor_dist(out, variant)
    if op == "dropout":
        return dropout_dist(out)
    if op == "random":
        return integer_dist(out, variant)
    raise ValueError(f"unknown random op {op!r}")


def values_source(dist):
    """``tp_rng_values(r, [a,] params..., v)``: one Philox block's elements."""
    args = ["const unsigned int r[4]"]
    if dist.input_dtype is not None:
        args.append(f"const {codegen.compute_ctype(dist.input_dtype)} a[{dist.per_block}]")
    args += dist.params
    args.append(f"{dist.value} v[{dist.per_block}]")
    return (f"__device__ __forceinline__ void tp_rng_values({', '.join(args)}) {{\n"
            + "\n".join("  " + line for line in dist.body) + "\n}\n")


def kernel_source(name, op, out, variant=None):
    """The complete CUDA C of random kernel ``name``: ``op`` into dtype ``out``."""
    dist = dist_for(op, out, variant)
    per = dist.per_block
    inp = dist.input_dtype
    # no __restrict__ with an input: in-place dropout and x.bernoulli_(x) pass one pointer twice
    params = [f"{out.ctype}* __restrict__ out" if inp is None else f"{out.ctype}* out"]
    if inp is not None:
        params.append(f"const {inp.ctype}* in0")
    params += ["tp_rng_state* st", "long long n"]
    params += [f"{codegen.scalar_ctype(k)} s{i}" for i, k in enumerate(dist.scalars)]
    mask = f"((unsigned long long)out & {out.itemsize * per - 1}ULL)"
    if inp is not None:
        mask += f" | ((unsigned long long)in0 & {inp.itemsize * per - 1}ULL)"
    call = ["r"] + (["a"] if inp is not None else []) + [p.split()[-1] for p in dist.params] + ["v"]
    lines = [f'extern "C" __global__ void __launch_bounds__({BLOCK}) {name}({", ".join(params)}) {{' + codegen.GRID_WAIT,
             "  const unsigned long long seed = tp_rng_load(&st->seed), offset = tp_rng_load(&st->offset);",
             "  const unsigned int k0 = (unsigned int)seed, k1 = (unsigned int)(seed >> 32);",
             "  const unsigned int o0 = (unsigned int)offset, o1 = (unsigned int)(offset >> 32);"]
    lines += ["  " + p for p in dist.prep]
    for t in dist.tables:
        ctype, glob, shared, rows_of = TABLES[t]
        n_rows = len(rows_of(_philox.F32))
        lines += [f"  __shared__ {ctype} {shared}[{n_rows}];",
                  f"  for (int i = threadIdx.x; i < {n_rows}; i += blockDim.x) {shared}[i] = {glob}[i];"]
    if dist.tables:
        lines.append("  __syncthreads();")
    lines += [f"  const long long nblocks = (n + {per - 1}) / {per};",
              f"  const bool vectors = ({mask}) == 0;",
              "  for (long long b = blockIdx.x * (long long)blockDim.x + threadIdx.x; b < nblocks;",
              "       b += (long long)gridDim.x * blockDim.x) {",
              "    unsigned int r[4];",
              "    tp_philox((unsigned long long)b, k0, k1, o0, o1, r);",
              f"    const long long base = b * {per};",
              f"    const bool full = vectors && base + {per} <= n;"]
    if inp is not None:
        ic = codegen.compute_ctype(inp)
        lines += [f"    {ic} a[{per}];",
                  "    if (full) {",
                  f"      const tp_vec<{inp.ctype}, {per}> t = reinterpret_cast<const tp_vec<{inp.ctype}, {per}>*>(in0)[b];",
                  f"      for (int j = 0; j < {per}; ++j) a[j] = {codegen.load_expr(inp, 't.v', 'j')};",
                  "    } else {",
                  f"      for (int j = 0; j < {per}; ++j) a[j] = base + j < n ? {codegen.load_expr(inp, 'in0', 'base + j')} : ({ic})0;",
                  "    }"]
    lines += [f"    {dist.value} v[{per}];",
              f"    tp_rng_values({', '.join(call)});",
              "    if (full) {",
              f"      tp_vec<{out.ctype}, {per}> w;",
              "#pragma unroll",
              f"      for (int j = 0; j < {per}; ++j) {{ {codegen.store_stmt(out, 'w.v', 'j', 'v[j]')} }}",
              f"      reinterpret_cast<tp_vec<{out.ctype}, {per}>*>(out)[b] = w;",
              "    } else {",
              f"      for (int j = 0; j < {per}; ++j) {{",
              f"        if (base + j < n) {{ {codegen.store_stmt(out, 'out', 'base + j', 'v[j]')} }}",
              "      }",
              "    }",
              "  }",
              "  tp_rng_advance(st, offset);",
              "}"]
    return (codegen.PREAMBLE + codegen.VECTOR_PREAMBLE + STATE_SOURCE + math_source(dist.tables)
            + values_source(dist)
            + "\n".join(lines) + "\n")


def kernel_name(op, out, variant=None):
    v = "" if variant is None else "_" + (variant.name if isinstance(variant, dt.dtype) else str(variant))
    return f"tp_rng_{op}_{out.name}{v}"


def grid_for(n, per_block, device, blocks_per_sm):
    """Blocks of BLOCK threads, one Philox block per thread and grid-stride
    step, capped at one wave (``blocks_per_sm``, the kernel's occupancy, per
    SM): every block ends with an atomic on the one done-counter, and 65536
    blocks queueing on that address cost more than the numbers (64 Mi floats
    ran 5x slower than PyTorch's); a partial second wave would idle SMs."""
    nblocks = -(-n // per_block)
    return max(1, min(-(-nblocks // BLOCK), cache.sm_count(device) * max(1, blocks_per_sm)))


def launch(op, out, state_ptr, scalars=(), inp=None, variant=None, stream=None):
    """Launch random op ``op`` into contiguous CUDA tensor ``out`` (nothing
    for 0 elements), reading and advancing the generator state at
    ``state_ptr``; ``inp`` is the contiguous input of dropout and
    bernoulli_tensor (out's shape). The LaunchPlan is kept in ``cache.plans``."""
    n = out.numel()
    if n == 0:
        return None
    dev = out._device_index
    key = ("rng", op, out._dtype_code, None if inp is None else inp._dtype_code,
           variant.name if isinstance(variant, dt.dtype) else variant)
    pkey = cache.launch_plan_key(key, dev, (n,), ())
    plan = cache.plans.get(pkey)
    if plan is None:
        dist = dist_for(op, out.dtype, variant)
        name = kernel_name(op, out.dtype, variant)
        f = cache.cached_function(key, dev, lambda: (kernel_source(name, op, out.dtype, variant), name),
                                  options=OPTIONS)
        nptrs = 2 if inp is None else 3
        plan = cache.plans.put(pkey, cache.LaunchPlan(f, dev, n, nptrs, dist.scalars, (), (),
                                                      grid=grid_for(n, dist.per_block, dev,
                                                                    f.max_active_blocks(BLOCK)),
                                                      block=BLOCK))
    ptrs = (out.data_ptr(), state_ptr) if inp is None else (out.data_ptr(), inp.data_ptr(), state_ptr)
    plan.launch(ptrs, scalars, stream)
    return plan


def kernel_variants():
    """Every (op, out dtype, variant) a random kernel is made for: what the
    ops can launch (tests compile each)."""
    floats = [d for d in dt.ALL_DTYPES if d.kind == "f"]
    out = []
    for op in ("uniform", "normal", "exponential", "dropout"):
        out += [(op, d, None) for d in floats]
    out += [("bernoulli", d, None) for d in dt.ALL_DTYPES]
    out += [("bernoulli_tensor", d, p) for d in dt.ALL_DTYPES for p in floats]
    out += [("random", d, "w32") for d in dt.ALL_DTYPES]
    out += [("random", d, "w64") for d in (dt.int64, dt.float64)]
    out += [("random", dt.int64, "full")]
    return out
