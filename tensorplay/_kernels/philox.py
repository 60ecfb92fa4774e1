# SPDX-License-Identifier: Apache-2.0
"""Philox4x32-10 and the exact transforms of tensorplay's random numbers, in NumPy.

This is the CPU path and the reference of the CUDA kernels
(``tensorplay._kernels.random_kernels`` emits the same arithmetic in C from
the constants below), so the same seed gives the same bits on both.

Philox4x32-10 (Salmon, Moraes, Dror and Shaw, "Parallel random numbers: as
easy as 1, 2, 3", SC 2011) maps a 128-bit counter and a 64-bit key to 128
random bits in ten rounds of two 32 x 32 -> 64 bit products.

The stream layout
-----------------
A generator holds a 64-bit ``seed`` (the key: low word, high word) and a
64-bit ``offset``. A random op reads the offset ``o``, draws Philox block
``b`` at counter ``(b lo, b hi, o lo, o hi)`` and advances the offset by one,
whatever the number of elements. Element ``i`` (in row-major order of the
result's shape) takes

- 32-bit draws (``W32``): word ``i % 4`` of block ``i // 4``;
- 64-bit draws (``W64``, float64 uniforms and integer ranges of 2**32 or
  more): words ``2 * (i % 2)`` (low) and ``2 * (i % 2) + 1`` (high) of block
  ``i // 2``;
- normal draws (``BOX_MULLER``): block ``i // 4``, pair ``p = (i % 4) // 2``;
  words ``2p`` and ``2p + 1`` give one Box-Muller pair, ``R cos t`` for even
  ``i`` and ``R sin t`` for odd ``i``, so every block gives four normals.

Nothing depends on a grid size, so values are the same on the CPU and on any
GPU.

Exact arithmetic
----------------
Every transform uses only operations that IEEE 754 rounds correctly
(``+ - * /`` and ``sqrt``, round to nearest even, no fused multiply-add), in
the same order in NumPy and in C; the logarithm, sine and cosine that
Box-Muller and the exponential distribution need are polynomials written
with those operations. float16 and bfloat16 compute in float32 and round at
the end, float64 computes in float64.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["PHILOX_M0", "PHILOX_M1", "PHILOX_W0", "PHILOX_W1", "PHILOX_ROUNDS", "DEFAULT_SEED",
           "W32", "W64", "BOX_MULLER", "ELEMENTS_PER_BLOCK", "philox4x32", "block_words"]

PHILOX_M0 = 0xD2511F53
PHILOX_M1 = 0xCD9E8D57
PHILOX_W0 = 0x9E3779B9      # golden ratio
PHILOX_W1 = 0xBB67AE85      # sqrt(3) - 1
PHILOX_ROUNDS = 10

# PyTorch's default seed, used by every generator until seeded
DEFAULT_SEED = 67280421310721

W32, W64, BOX_MULLER = "w32", "w64", "box_muller"
ELEMENTS_PER_BLOCK = {W32: 4, W64: 2, BOX_MULLER: 4}

_MASK32 = 0xFFFFFFFF
_MASK64 = (1 << 64) - 1


# ------------------------------------------------------------------ Philox

def _mulhilo(a, m):
    """(hi, lo) words of the 64-bit product of uint32 ``a`` and the constant ``m``."""
    p = a.astype(np.uint64) * np.uint64(m)
    return (p >> np.uint64(32)).astype(np.uint32), p.astype(np.uint32)


def philox4x32(c0, c1, c2, c3, k0, k1, rounds=PHILOX_ROUNDS):
    """Philox4x32 of counters ``(c0, c1, c2, c3)`` (uint32 arrays or ints,
    broadcast together) under key ``(k0, k1)`` (ints); return the four output
    words as uint32 arrays."""
    c0, c1, c2, c3 = (np.asarray(c, dtype=np.uint32) for c in (c0, c1, c2, c3))
    c0, c1, c2, c3 = np.broadcast_arrays(c0, c1, c2, c3)
    k0, k1 = int(k0) & _MASK32, int(k1) & _MASK32
    for r in range(rounds):
        if r:
            k0, k1 = (k0 + PHILOX_W0) & _MASK32, (k1 + PHILOX_W1) & _MASK32
        hi0, lo0 = _mulhilo(c0, PHILOX_M0)
        hi1, lo1 = _mulhilo(c2, PHILOX_M1)
        c0, c1, c2, c3 = hi1 ^ c1 ^ np.uint32(k0), lo1, hi0 ^ c3 ^ np.uint32(k1), lo0
    return c0, c1, c2, c3


def block_words(seed, offset, first, count):
    """The words of Philox blocks ``first .. first + count - 1`` of stream
    ``(seed, offset)``, as a (count, 4) uint32 array."""
    b = np.arange(first, first + count, dtype=np.uint64)
    c0 = (b & np.uint64(_MASK32)).astype(np.uint32)
    c1 = (b >> np.uint64(32)).astype(np.uint32)
    words = philox4x32(c0, c1, offset & _MASK32, (offset >> 32) & _MASK32, seed & _MASK32,
                       (seed >> 32) & _MASK32)
    return np.stack(words, axis=1)


# Blocks drawn per pass, so that temporaries stay small for large tensors
_CHUNK_BLOCKS = 1 << 18


def draw(layout, seed, offset, n, transform):
    """``transform(words)`` over the blocks of ``n`` elements in ``layout``,
    chunk by chunk; ``words`` is a (blocks, 4) uint32 array and
    ``transform`` returns the elements of those blocks (ELEMENTS_PER_BLOCK
    each). Returns the first ``n`` elements, concatenated."""
    per = ELEMENTS_PER_BLOCK[layout]
    nblocks = -(-n // per)
    parts = []
    for first in range(0, nblocks, _CHUNK_BLOCKS):
        count = min(_CHUNK_BLOCKS, nblocks - first)
        parts.append(transform(block_words(seed, offset, first, count)))
    if not parts:
        return transform(np.zeros((0, 4), dtype=np.uint32))
    out = parts[0] if len(parts) == 1 else np.concatenate(parts)
    return out[:n]


def words32(words):
    """The 32-bit draws of blocks (``W32``): one per word, in order."""
    return words.reshape(-1)


def words64(words):
    """The 64-bit draws of blocks (``W64``): words (0, 1) and (2, 3), low word first."""
    w = words.astype(np.uint64)
    lo = w[:, 0::2]
    hi = w[:, 1::2]
    return (lo | (hi << np.uint64(32))).reshape(-1)


# ------------------------------------------------------------------ exact math
# Each type's constants, rounded once to that type; the C code uses these
# very values (as hexadecimal literals).

class FloatMath:
    """The constants of the exact log / sin / cos of one floating type.

    ``log``: ``u = 2**e * m`` with ``m`` in [sqrt(1/2), sqrt(2)); ``s = (m - 1) / (m + 1)``;
    ``log(m) = 2 s (1 + s**2 / 3 + s**4 / 5 + ...)`` (the atanh series, to
    ``len(log_coefs)`` terms); ``log(u) = e ln2_hi + (e ln2_lo + log(m))``
    (``e ln2_hi`` is exact).

    ``sin`` / ``cos`` of ``2 pi u`` for ``u = k / 2**bits``: the nearest
    quarter turn ``q`` is taken off exactly in integers, leaving ``x = 2 pi v``
    with ``|v| <= 1/8``; then the Taylor polynomials in ``x**2`` and the
    quadrant's signs and swap."""

    def __init__(self, np_type, mant_bits, exp_bits, log_terms, cos_terms, sin_terms):
        t = np_type
        self.type = t
        self.mant_bits = mant_bits           # stored fraction bits
        self.bias = (1 << (exp_bits - 1)) - 1
        self.uint = np.uint32 if t == np.float32 else np.uint64
        self.sqrt2 = t(math.sqrt(2.0))
        self.two_pi = t(2.0 * math.pi)
        if t == np.float32:
            self.ln2_hi = np.array([0x3F317180], dtype=np.uint32).view(np.float32)[0]
            self.ln2_lo = np.array([0x3717F7D1], dtype=np.uint32).view(np.float32)[0]
        else:
            self.ln2_hi = np.array([0x3FE62E42FEE00000], dtype=np.uint64).view(np.float64)[0]
            self.ln2_lo = np.array([0x3DEA39EF35793C76], dtype=np.uint64).view(np.float64)[0]
        self.log_coefs = tuple(t(1.0 / (2 * k + 1)) for k in range(log_terms))
        self.cos_coefs = tuple(t((-1) ** k / math.factorial(2 * k)) for k in range(cos_terms))
        self.sin_coefs = tuple(t((-1) ** k / math.factorial(2 * k + 1)) for k in range(sin_terms))

    # -------------------------------------------------------------- NumPy

    def horner(self, coefs, z):
        """``coefs[0] + z (coefs[1] + z (...))``, one rounding per operation."""
        p = np.full(np.shape(z), coefs[-1], dtype=self.type)
        for c in reversed(coefs[:-1]):
            p = p * z + c
        return p

    def log(self, u):
        """Natural logarithm of ``u`` (positive, normal numbers of this type)."""
        t = self.type
        one = t(1.0)
        bits = np.ascontiguousarray(u, dtype=t).view(self.uint)
        mb = self.uint(self.mant_bits)
        e = (bits >> mb).astype(np.int64) - self.bias
        frac_mask = self.uint((1 << self.mant_bits) - 1)
        one_bits = self.uint(self.bias << self.mant_bits)
        m = ((bits & frac_mask) | one_bits).view(t)
        big = m > self.sqrt2
        m = np.where(big, m * t(0.5), m)
        e = np.where(big, e + 1, e)
        f = m - one
        s = f / (m + one)
        p = self.horner(self.log_coefs, s * s)
        h = s * p
        logm = h + h
        ef = e.astype(t)
        return ef * self.ln2_hi + (ef * self.ln2_lo + logm)

    def sincos_2pi(self, k, bits):
        """(cos, sin) of ``2 pi k / 2**bits`` for integers ``0 <= k < 2**bits`` (a uint array)."""
        t = self.type
        k = k.astype(np.int64)
        q = (k + (1 << (bits - 3))) >> (bits - 2)          # nearest quarter turn, 0..4
        v = k - (q << (bits - 2))                          # in [-2**(bits-3), 2**(bits-3))
        x = v.astype(t) * t(2.0 ** -bits) * self.two_pi
        z = x * x
        c = self.horner(self.cos_coefs, z)
        s = x * self.horner(self.sin_coefs, z)
        q = q & 3
        cos = np.where(q == 0, c, np.where(q == 1, -s, np.where(q == 2, -c, s)))
        sin = np.where(q == 0, s, np.where(q == 1, c, np.where(q == 2, -s, -c)))
        return cos, sin


class TableMath32(FloatMath):
    """float32's log and sin/cos from small tables (what the kernels hold in
    shared memory): a third of the operations of the polynomials, which made
    the normal kernel compute-bound.

    ``log``: as FloatMath, ``m`` in [sqrt(1/2), sqrt(2)); the bucket ``j`` of
    ``m`` (its float's exponent bit and top 7 fraction bits) gives a centre
    ``c`` (1 itself for the two buckets beside 1, so that logs near 0 stay
    relatively exact), ``1/c`` and ``log c``; ``r = (m - c) / c`` (``m - c``
    is exact, Sterbenz; then one product by ``1/c``) is below 2**-7, and
    ``log(m) = log c + r - r**2 / 2 + r**3 / 3 - r**4 / 4``.

    ``sin`` / ``cos`` of ``2 pi k / 2**24``: the top 12 bits of ``k`` index
    a table of the 4096 turns' (cos, sin), exactly symmetric; the low 12
    bits give ``b < 2 pi 2**-12``, with ``cos b = 1 - b**2 / 2`` and ``sin b =
    b - b**3 / 6`` (the next terms are below 2**-40); then the sum formulas."""

    SINCOS_BITS = 12
    LOG_BUCKETS = 256

    def __init__(self):
        super().__init__(np.float32, 23, 8, log_terms=0, cos_terms=0, sin_terms=0)
        t = np.float32
        n = 1 << self.SINCOS_BITS
        quarter = n // 4
        first = np.array([(math.cos(math.pi * i / (n // 2)), math.sin(math.pi * i / (n // 2)))
                          for i in range(quarter)], dtype=np.float64).astype(t)
        first[0] = (1.0, 0.0)
        tab = np.empty((n, 2), dtype=t)
        tab[:quarter] = first                                   # the other quarters by exact symmetry
        tab[quarter:2 * quarter] = np.stack([-first[:, 1], first[:, 0]], axis=1)
        tab[2 * quarter:3 * quarter] = -first
        tab[3 * quarter:] = np.stack([first[:, 1], -first[:, 0]], axis=1)
        self.sincos_table = tab
        self.sincos_step = t(2.0 * math.pi * 2.0 ** -24)
        self.sin_coef = t(1.0 / 6.0)
        lo = (np.arange(self.LOG_BUCKETS, dtype=np.uint32) << np.uint32(16)) | np.uint32(0x3F000000)
        edge = lo.view(t)
        width = np.where(np.arange(self.LOG_BUCKETS) < 128, t(2.0 ** -8), t(2.0 ** -7))
        centre = (edge + width * t(0.5)).astype(t)              # exact: 9 significant bits
        centre[0x7F] = centre[0x80] = t(1.0)
        self.log_table = np.stack([centre, (1.0 / centre.astype(np.float64)).astype(t),
                                   np.log(centre.astype(np.float64)).astype(t),
                                   np.zeros(self.LOG_BUCKETS, dtype=t)], axis=1)
        self.log1p_coefs = (t(-0.5), t(1.0 / 3.0), t(-0.25))

    def log(self, u):
        t = self.type
        bits = np.ascontiguousarray(u, dtype=t).view(np.uint32)
        e = (bits >> np.uint32(23)).astype(np.int64) - self.bias
        m = ((bits & np.uint32(0x7FFFFF)) | np.uint32(0x3F800000)).view(t)
        big = m > self.sqrt2
        m = np.where(big, m * t(0.5), m)
        e = np.where(big, e + 1, e)
        row = self.log_table[(m.view(np.uint32) >> np.uint32(16)) & np.uint32(0xFF)]
        r = (m - row[..., 0]) * row[..., 1]
        c2, c3, c4 = self.log1p_coefs
        q = (r * c4 + c3) * r
        l1p = r + (r * r) * (q + c2)
        ef = e.astype(t)
        return (ef * self.ln2_hi + row[..., 2]) + (ef * self.ln2_lo + l1p)

    def sincos_2pi(self, k, bits):
        if bits != 24:
            raise ValueError("the float32 table sin/cos takes 24-bit angles")
        t = self.type
        k = np.asarray(k, dtype=np.uint32)
        low = 24 - self.SINCOS_BITS                    # the bits below the table's turn, as the C
        row = self.sincos_table[k >> np.uint32(low)]
        b = (k & np.uint32((1 << low) - 1)).astype(t) * self.sincos_step
        b2 = b * b
        cb = t(1.0) - b2 * t(0.5)
        sb = b - (b * b2) * self.sin_coef
        ca, sa = row[..., 0], row[..., 1]
        return ca * cb - sa * sb, sa * cb + ca * sb


F32 = TableMath32()
F64 = FloatMath(np.float64, 52, 11, log_terms=11, cos_terms=10, sin_terms=10)


def math_for(compute):
    """The FloatMath of compute type ``"float"`` or ``"double"``."""
    return F32 if compute == "float" else F64


# ------------------------------------------------------------------ transforms
# Each takes the (blocks, 4) words and returns that many blocks' elements in
# the compute type: float32 (for float16, bfloat16, float32) or float64.

# uniform [0, 1): (shift, scale) of a 32-bit word per storage dtype, exact in it
UNIFORM_BITS = {"float16": 11, "bfloat16": 8, "float32": 24}


def uniform_unit(words, dtype_name):
    """Uniforms in [0, 1) exactly representable in ``dtype_name``: the top bits
    of each draw (24 for float32, 11 float16, 8 bfloat16, 53 of a 64-bit draw
    for float64) times 2**-bits."""
    if dtype_name == "float64":
        w = words64(words)
        return (w >> np.uint64(11)).astype(np.float64) * np.float64(2.0 ** -53)
    bits = UNIFORM_BITS[dtype_name]
    w = words32(words)
    return (w >> np.uint32(32 - bits)).astype(np.float32) * np.float32(2.0 ** -bits)


def uniform(words, dtype_name, low, span):
    """``low + span * u`` in the compute type (``span``, ``low`` rounded to it first)."""
    u = uniform_unit(words, dtype_name)
    t = u.dtype.type
    return u * t(span) + t(low)


def box_muller(words, compute):
    """Standard normals, four per block (see the module docstring)."""
    fm = math_for(compute)
    t = fm.type
    a = words[:, 0::2].reshape(-1)          # radius words: 0, 2 of each block
    b = words[:, 1::2].reshape(-1)          # angle words: 1, 3
    if compute == "float":
        u1 = ((a >> np.uint32(8)) + np.uint32(1)).astype(np.float32) * np.float32(2.0 ** -24)  # (0, 1]
        cos, sin = fm.sincos_2pi(b >> np.uint32(8), 24)
    else:
        u1 = (a.astype(np.float64) + 1.0) * np.float64(2.0 ** -32)
        cos, sin = fm.sincos_2pi(b, 32)
    r = np.sqrt(fm.log(u1) * t(-2.0))
    out = np.empty(2 * r.size, dtype=t)
    out[0::2] = r * cos
    out[1::2] = r * sin
    return out


def normal(words, compute, mean, std):
    """``z * std + mean`` of the standard normals, in the compute type."""
    t = math_for(compute).type
    return box_muller(words, compute) * t(std) + t(mean)


# the smallest positive value of each dtype
TINIEST = {"float16": 2.0 ** -24, "bfloat16": 2.0 ** -133, "float32": 2.0 ** -149, "float64": 2.0 ** -1074}


def exponential(words, dtype_name, lambd):
    """``(-1 / lambd) * log(u)`` for ``u`` in (0, 1] (24 random bits, 53 for
    float64). ``log(1)`` is taken as minus half a step of u's grid (the
    cell's mean, near enough) and results below the dtype's smallest
    positive value become that value, so that, as in PyTorch, none is 0."""
    if dtype_name == "float64":
        fm, step = F64, 2.0 ** -53
        u = ((words64(words) >> np.uint64(11)) + np.uint64(1)).astype(np.float64) * np.float64(step)
    else:
        fm, step = F32, 2.0 ** -24
        u = ((words32(words) >> np.uint32(8)) + np.uint32(1)).astype(np.float32) * np.float32(step)
    t = fm.type
    lg = np.where(u == t(1.0), t(-step / 2), fm.log(u))
    x = (t(-1.0) / t(lambd)) * lg
    tiniest = t(TINIEST[dtype_name])
    return np.where(x < tiniest, tiniest, x)


def unit_double(words):
    """Each 32-bit draw as ``w * 2**-32`` in float64 (exact), for Bernoulli draws."""
    return words32(words).astype(np.float64) * np.float64(2.0 ** -32)


def bernoulli(words, p):
    """``u < p`` per element (``p`` a float or a float64 array of the elements)."""
    return unit_double(words) < p


def mulhi64(a, b):
    """High 64 bits of the 128-bit products of uint64 ``a`` and the int ``b`` < 2**64."""
    m32 = np.uint64(_MASK32)
    s32 = np.uint64(32)
    a_lo, a_hi = a & m32, a >> s32
    b_lo, b_hi = np.uint64(b & _MASK32), np.uint64(b >> 32)
    ll, lh, hl, hh = a_lo * b_lo, a_lo * b_hi, a_hi * b_lo, a_hi * b_hi
    mid = (ll >> s32) + (lh & m32) + (hl & m32)
    return hh + (lh >> s32) + (hl >> s32) + (mid >> s32)


def integers(words, low, span, mode):
    """Integers in [low, low + span) as int64, by multiply-shift: ``(w * span)
    >> 32`` of a 32-bit draw for mode 'w32' (span < 2**32), ``(w * span) >>
    64`` of a 64-bit draw for 'w64', the draw itself for 'full' (span
    2**64). ``low`` and ``span`` are taken modulo 2**64, as the kernels'
    arguments."""
    base = np.uint64(low & _MASK64)
    span &= _MASK64
    if mode == "w32":
        w = words32(words).astype(np.uint64)
        off = (w * np.uint64(span)) >> np.uint64(32)
    elif mode == "w64":
        off = mulhi64(words64(words), span)
    else:
        off = words64(words)
    return (off + base).view(np.int64)


# ------------------------------------------------------------------ one entry point

def integer_mode(span):
    """How integers over ``span`` values are drawn: 'w32', 'w64' or 'full' (2**64)."""
    if span < (1 << 32):
        return "w32"
    return "w64" if span < (1 << 64) else "full"


LAYOUT_OF_MODE = {"w32": W32, "w64": W64, "full": W64}


def layout_of(op, dtype_name, mode=None):
    """The stream layout of ``op`` writing ``dtype_name``."""
    if op == "normal":
        return BOX_MULLER
    if op in ("uniform", "exponential"):
        return W64 if dtype_name == "float64" else W32
    if op == "random":
        return LAYOUT_OF_MODE[mode]
    return W32                       # bernoulli, bernoulli_tensor, dropout


def values(op, dtype_name, seed, offset, n, scalars=(), inp=None, mode=None):
    """The first ``n`` elements of random op ``op`` on stream ``(seed,
    offset)``, before rounding to ``dtype_name``: float32 (for float16,
    bfloat16 and float32) or float64 values, int64 for 'random', bool for
    the Bernoulli ops. Mirrors ``random_kernels.dist_for`` operation for
    operation. ``inp`` is the input (probabilities, dropout's values) as a
    flat array in its compute type; ``mode`` the integer mode of 'random'."""
    compute = "double" if dtype_name == "float64" else "float"
    layout = layout_of(op, dtype_name, mode)
    if op == "uniform":
        low, span = scalars
        return draw(layout, seed, offset, n, lambda w: uniform(w, dtype_name, low, span))
    if op == "normal":
        mean, std = scalars
        return draw(layout, seed, offset, n, lambda w: normal(w, compute, mean, std))
    if op == "exponential":
        (lambd,) = scalars
        return draw(layout, seed, offset, n, lambda w: exponential(w, dtype_name, lambd))
    if op == "bernoulli":
        (p,) = scalars
        return draw(layout, seed, offset, n, lambda w: bernoulli(w, p))
    if op == "random":
        low, span = scalars
        return draw(layout, seed, offset, n, lambda w: integers(w, low, span, mode))
    u = draw(layout, seed, offset, n, unit_double)
    if op == "bernoulli_tensor":
        return u < inp.astype(np.float64)
    if op == "dropout":
        p_keep, scale = scalars
        t = math_for(compute).type
        keep = (u < p_keep).astype(t)
        with np.errstate(invalid="ignore", over="ignore"):
            return (inp * keep) * t(scale)
    raise ValueError(f"unknown random op {op!r}")
