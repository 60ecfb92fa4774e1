# SPDX-License-Identifier: Apache-2.0
"""CUDA C generation for elementwise kernels.

One description (operand dtypes, an expression over loaded values, the number
of dimensions after collapsing) yields one kernel. Every parameter is an 8-byte
slot (pointers, ``long long``, ``double``), so argument buffers pack without
padding rules.
"""

from __future__ import annotations

from tensorplay import _dtypes as dt

# Half types are stored as 16-bit integers and converted with PTX cvt, so no
# header (cuda_fp16.h) is needed and compute happens in float.
PREAMBLE = r"""
typedef unsigned short tp_half;
typedef unsigned short tp_bf16;
template <class A, class B> struct tp_same { static constexpr bool value = false; };
template <class A> struct tp_same<A, A> { static constexpr bool value = true; };

__device__ __forceinline__ float tp_h2f(tp_half h) { float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f; }
__device__ __forceinline__ tp_half tp_f2h(float f) { tp_half h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h; }
__device__ __forceinline__ tp_half tp_d2h(double d) { tp_half h; asm("cvt.rn.f16.f64 %0, %1;" : "=h"(h) : "d"(d)); return h; }
__device__ __forceinline__ float tp_b2f(tp_bf16 b) { return __uint_as_float(((unsigned int)b) << 16); }
__device__ __forceinline__ tp_bf16 tp_f2b(float f) { tp_bf16 h; asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h; }
__device__ __forceinline__ tp_bf16 tp_d2b(double d) { tp_bf16 h; asm("cvt.rn.bf16.f64 %0, %1;" : "=h"(h) : "d"(d)); return h; }

template <class T> __device__ __forceinline__ tp_half tp_to_half(T v) {
  if constexpr (tp_same<T, double>::value) return tp_d2h(v);
  else if constexpr (tp_same<T, float>::value) return tp_f2h(v);
  else return tp_d2h((double)v);
}
template <class T> __device__ __forceinline__ tp_bf16 tp_to_bf16(T v) {
  if constexpr (tp_same<T, double>::value) return tp_d2b(v);
  else if constexpr (tp_same<T, float>::value) return tp_f2b(v);
  else return tp_d2b((double)v);
}
// The store to an integer type (T: signed char, unsigned char, short, int,
// long long). Floating values are truncated toward zero, saturate at T's
// limits and NaN becomes 0, the rule the CPU path follows too; C leaves the
// out-of-range conversions undefined, so they never happen here. Integers
// wrap, as C converts them.
template <class T, class V> __device__ __forceinline__ T tp_to_int(V v) {
  if constexpr (tp_same<V, float>::value || tp_same<V, double>::value) {
    constexpr bool is_signed = (T)-1 < 0;
    constexpr int bits = 8 * sizeof(T);
    constexpr unsigned long long umax = is_signed ? (1ULL << (bits - 1)) - 1ULL
                                                  : (bits == 64 ? ~0ULL : (1ULL << bits) - 1ULL);
    const V top = (V)umax + (V)1;           // 2**(bits-1) (2**bits unsigned), exact
    const V bottom = is_signed ? -top : (V)0;
    if (v != v) return (T)0;
    if (v >= top) return (T)umax;
    if (v <= bottom) return is_signed ? (T)(-(long long)umax - 1LL) : (T)0;
    return (T)v;
  } else {
    return (T)v;
  }
}
"""

# Programmatic dependent launch. Every generated kernel opens with this, before
# its first memory access: wait for the grids it depends on to complete with
# their memory visible (griddepcontrol.wait; a no-op when launched without the
# attribute), then let the next kernel launch while this one runs
# (launch_dependents). A kernel launched with programmatic stream
# serialization must wait in every block before it exits, or the ones after
# it race with the ones before it; with the wait first, that holds down any
# chain. Compiled in for sm_90 and newer only: tensorplay._kernels.cache
# launches a kernel that way only when its source has this and the code was
# compiled for such a target.
GRID_WAIT = """
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
"""
PDL_MIN_ARCH = 90

# load: storage -> compute value; store: any value -> storage
_LOAD = {
    "bool": "({p}[{o}] != 0)",
    "float16": "tp_h2f({p}[{o}])",
    "bfloat16": "tp_b2f({p}[{o}])",
}
_STORE = {
    "bool": "{p}[{o}] = (({v}) != 0);",
    "float16": "{p}[{o}] = tp_to_half({v});",
    "bfloat16": "{p}[{o}] = tp_to_bf16({v});",
}
_STORE.update({d.name: "{p}[{o}] = tp_to_int<" + d.ctype + ">({v});"
               for d in dt.ALL_DTYPES if d.kind in "iu"})
COMPUTE_CTYPE = {
    "bool": "bool", "float16": "float", "bfloat16": "float",
}


def compute_ctype(d: dt.dtype) -> str:
    return COMPUTE_CTYPE.get(d.name, d.ctype)


def load_expr(d: dt.dtype, ptr: str, off: str) -> str:
    return _LOAD.get(d.name, "{p}[{o}]").format(p=ptr, o=off)


def store_stmt(d: dt.dtype, ptr: str, off: str, value: str) -> str:
    tmpl = _STORE.get(d.name)
    if tmpl is None:
        return f"{ptr}[{off}] = ({d.ctype})({value});"
    return tmpl.format(p=ptr, o=off, v=value)


def scalar_ctype(kind: str) -> str:
    """'f' scalars travel as double, 'i' as long long."""
    return "double" if kind == "f" else "long long"


# Vectorized flat kernels move 16 bytes per operand per load (one 128-bit
# ld/st for the widest operand) and each thread handles FLAT_VECTORS such
# vectors per tile, so enough bytes are in flight per SM to cover DRAM latency.
VECTOR_BYTES = 16
FLAT_VECTORS = 2
FLAT_BLOCK = 256

VECTOR_PREAMBLE = r"""
template <class T, int N> struct alignas(sizeof(T) * N) tp_vec { T v[N]; };
"""


def flat_vector_width(itemsizes) -> int:
    """Elements per vector of a flat elementwise kernel over operands of these
    item sizes: 16 bytes of the widest operand (1 means no vector path)."""
    return max(1, VECTOR_BYTES // max(itemsizes))


def alignment_masks(itemsizes) -> tuple:
    """Per operand, the low pointer bits that must be clear for its vectors
    of ``flat_vector_width(itemsizes)`` elements to be naturally aligned."""
    width = flat_vector_width(itemsizes)
    return tuple(width * s - 1 for s in itemsizes)


def flat_tile(itemsizes) -> int:
    """Elements one block handles per grid-stride step of a flat kernel."""
    return FLAT_BLOCK * FLAT_VECTORS * flat_vector_width(itemsizes)


def elementwise_source(name: str, out: dt.dtype, inputs: tuple, expr: str,
                       ndim: int, scalars: tuple = (), preamble: str = "") -> str:
    """CUDA C for ``out[i] = expr(a0, a1, ..., s0, s1, ...)`` over ``ndim``
    collapsed dimensions (0: every operand contiguous, flat indexing).

    Parameters are: out pointer, input pointers, element count, (ndim 0 only)
    the vector width chosen for this launch, scalars, then for ndim > 0 the
    sizes and each operand's strides (elements), 8 bytes each.
    """
    if not ndim:
        return PREAMBLE + VECTOR_PREAMBLE + preamble + flat_kernel_text(name, out, inputs, expr, scalars)
    nops = 1 + len(inputs)
    params = [f"{out.ctype}* __restrict__ out"]
    params += [f"const {d.ctype}* __restrict__ in{k}" for k, d in enumerate(inputs)]
    params.append("long long n")
    params += [f"{scalar_ctype(kind)} s{k}" for k, kind in enumerate(scalars)]
    if ndim:
        params.append(f"tp_geom_{ndim}_{nops} g")
    body, offs = offset_code(ndim, nops)
    for k, d in enumerate(inputs):
        body.append(f"    {compute_ctype(d)} a{k} = {load_expr(d, f'in{k}', offs[k + 1])};")
    body.append("    " + store_stmt(out, "out", offs[0], expr))
    return PREAMBLE + preamble + kernel_text(name, params, body, ndim, nops)


def flat_kernel_text(name, out, inputs, expr, scalars):
    """A flat (every operand contiguous) kernel over tiles of ``flat_tile``
    elements, grid-stride; or, when the grid covers the elements (the launch
    plan chooses, :func:`tensorplay._kernels.cache.flat_launch`), one element
    or one vector a thread. When every pointer is aligned for its vectors
    (tested here on the device: a plan cached by shape is reused with other
    pointers, and the test is free on the host this way) full tiles go
    through 128-bit vector loads and stores; otherwise, and for the last
    partial tile, each thread handles the same elements one by one, still
    loading all before storing."""
    sizes = [out.itemsize] + [d.itemsize for d in inputs]
    width = flat_vector_width(sizes)
    per_thread = FLAT_VECTORS * width
    params = [f"{out.ctype}* __restrict__ out"]
    params += [f"const {d.ctype}* __restrict__ in{k}" for k, d in enumerate(inputs)]
    params.append("long long n")
    params += [f"{scalar_ctype(kind)} s{k}" for k, kind in enumerate(scalars)]
    names = ["out"] + [f"in{k}" for k in range(len(inputs))]
    misaligned = " | ".join(f"((unsigned long long){p} & {m}ULL)" for p, m in zip(names, alignment_masks(sizes)))
    lines = [f'extern "C" __global__ void __launch_bounds__({FLAT_BLOCK}) {name}({", ".join(params)}) {{' + GRID_WAIT,
             f"  const bool vectors = ({misaligned}) == 0;",
             f"  const long long tile = {FLAT_BLOCK * per_thread}LL;",
             # The launch plan's grid says how the work is split (see
             # cache.flat_launch): covering n with one element a thread (the
             # fewest instructions, in a branch of its own: graphs of tiny
             # kernels pay for each instruction per node), or with one vector
             # a thread (the rest, up to tens of GB); a tiled grid never
             # covers n with one vector a thread.
             "  const long long threads = (long long)gridDim.x * blockDim.x;",
             "  const long long tid = blockIdx.x * (long long)blockDim.x + threadIdx.x;",
             "  if (threads >= n) {",
             "    if (tid < n) {",
             "      const long long i = tid;"]
    lines += _element_at_i("      ", out, inputs, expr)
    lines += ["    }",
              "    return;",
              "  }"]
    if width > 1:
        lines += ["  if (threads * " + str(width) + " >= n) {",
                  f"    const long long first = tid * {width};",
                  f"    if (vectors && first + {width} <= n) {{"]
        for k, d in enumerate(inputs):
            lines.append(f"      const tp_vec<{d.ctype}, {width}> r{k} = "
                         f"reinterpret_cast<const tp_vec<{d.ctype}, {width}>*>(in{k})[tid];")
        lines.append(f"      tp_vec<{out.ctype}, {width}> w;")
        lines += _vector_lanes("      ", out, inputs, expr, width, "first", "", "w")
        lines.append(f"      reinterpret_cast<tp_vec<{out.ctype}, {width}>*>(out)[tid] = w;")
        lines.append("      return;")
        lines.append("    }")
        lines.append(f"    for (long long i = first; i < first + {width} && i < n; ++i) {{")
        lines += _element_at_i("      ", out, inputs, expr)
        lines += ["    }",
                  "    return;",
                  "  }"]
    lines += [
             "  const long long ntiles = (n + tile - 1) / tile;",
             "  for (long long t = blockIdx.x; t < ntiles; t += gridDim.x) {",
             "    const long long base = t * tile;"]
    if width > 1:
        lines.append("    if (vectors && base + tile <= n) {")
        for k, d in enumerate(inputs):
            lines.append(f"      tp_vec<{d.ctype}, {width}> r{k}[{FLAT_VECTORS}];")
        lines.append(f"      tp_vec<{out.ctype}, {width}> w[{FLAT_VECTORS}];")
        lines.append(f"      const long long vbase = base / {width} + threadIdx.x;")
        lines.append("#pragma unroll")
        lines.append(f"      for (int u = 0; u < {FLAT_VECTORS}; ++u) {{")
        for k, d in enumerate(inputs):
            lines.append(f"        r{k}[u] = reinterpret_cast<const tp_vec<{d.ctype}, {width}>*>(in{k})"
                         f"[vbase + u * {FLAT_BLOCK}];")
        lines.append("      }")
        lines.append("#pragma unroll")
        lines.append(f"      for (int u = 0; u < {FLAT_VECTORS}; ++u) {{")
        lines += _vector_lanes("        ", out, inputs, expr, width, f"(vbase + u * {FLAT_BLOCK}) * {width}", "[u]",
                               "w[u]")
        lines.append(f"        reinterpret_cast<tp_vec<{out.ctype}, {width}>*>(out)[vbase + u * {FLAT_BLOCK}]"
                     " = w[u];")
        lines.append("      }")
        lines.append("      continue;")
        lines.append("    }")
    lines.append("    (void)vectors;")
    for k, d in enumerate(inputs):
        lines.append(f"    {compute_ctype(d)} r{k}[{per_thread}];")
    lines.append("#pragma unroll")
    lines.append(f"    for (int u = 0; u < {per_thread}; ++u) {{")
    lines.append(f"      long long i = base + u * {FLAT_BLOCK} + threadIdx.x;")
    lines.append("      if (i < n) {")
    for k, d in enumerate(inputs):
        lines.append(f"        r{k}[u] = {load_expr(d, f'in{k}', 'i')};")
    lines.append("      }")
    lines.append("    }")
    lines.append("#pragma unroll")
    lines.append(f"    for (int u = 0; u < {per_thread}; ++u) {{")
    lines.append(f"      long long i = base + u * {FLAT_BLOCK} + threadIdx.x;")
    lines.append("      if (i < n) {")
    for k, d in enumerate(inputs):
        lines.append(f"        {compute_ctype(d)} a{k} = r{k}[u];")
    lines.append("        " + store_stmt(out, "out", "i", expr))
    lines.append("      }")
    lines.append("    }")
    lines.append("  }")
    lines.append("}")
    return "\n".join(lines) + "\n"


def _element_at_i(indent, out, inputs, expr):
    """C lines loading each input at element ``i`` and storing ``expr`` there."""
    lines = [f"{indent}{compute_ctype(d)} a{k} = {load_expr(d, f'in{k}', 'i')};" for k, d in enumerate(inputs)]
    return lines + [indent + store_stmt(out, "out", "i", expr)]


def _vector_lanes(indent, out, inputs, expr, width, first, lane, dst):
    """C lines computing the ``width`` lanes of one vector: input k from the
    loaded vector ``r<k><lane>``, into vector ``dst``; ``i`` (the element
    index, which ``expr`` may use) is ``first`` + lane."""
    lines = ["#pragma unroll", f"{indent}for (int j = 0; j < {width}; ++j) {{",
             f"{indent}  long long i = {first} + j; (void)i;"]
    for k, d in enumerate(inputs):
        lines.append(f"{indent}  {compute_ctype(d)} a{k} = {load_expr(d, f'r{k}{lane}.v', 'j')};")
    lines += [f"{indent}  " + store_stmt(out, f"{dst}.v", "j", expr), f"{indent}}}"]
    return lines


def offset_code(ndim, nops):
    """C lines computing each operand's element offset o0.. from the linear
    index i (flat indexing when ndim is 0), and the offset names."""
    if not ndim:
        return [], ["i"] * nops
    body = ["    long long rem = i;"]
    body += [f"    long long o{k} = 0;" for k in range(nops)]
    body.append(f"    for (int d = {ndim - 1}; d >= 0; --d) {{")
    body.append("      long long c = rem % g.size[d]; rem /= g.size[d];")
    body += [f"      o{k} += c * g.stride[{k}][d];" for k in range(nops)]
    body.append("    }")
    return body, [f"o{k}" for k in range(nops)]


def kernel_text(name, params, body, ndim, nops):
    """A grid-stride elementwise kernel around ``body``."""
    geom = ""
    if ndim:
        geom = (f"struct tp_geom_{ndim}_{nops} {{ long long size[{ndim}]; "
                f"long long stride[{nops}][{ndim}]; }};\n")
    return (geom + f'extern "C" __global__ void {name}({", ".join(params)}) {{' + GRID_WAIT +
            "  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;\n"
            "       i += (long long)gridDim.x * blockDim.x) {\n"
            + "\n".join(body) + "\n  }\n}\n")


def custom_elementwise_source(name, arrays, scalars, typedefs, operation, ndim, preamble=""):
    """CUDA C for a user ElementwiseKernel.

    ``arrays``: [(var, dtype, is_output)] in parameter order; ``scalars``:
    [(var, dtype)] passed as 8-byte slots; ``typedefs``: {placeholder: dtype}.
    Inputs are loaded into variables named as declared (half types as float),
    ``operation`` assigns the outputs, which are then stored. ``i`` is the
    linear index.
    """
    nops = len(arrays)
    params = [f"{d.ctype}* __restrict__ p_{v}" for v, d, _ in arrays]
    params.append("long long n")
    params += [f"{scalar_ctype('f' if d.kind == 'f' else 'i')} raw_{v}" for v, d in scalars]
    if ndim:
        params.append(f"tp_geom_{ndim}_{nops} g")
    body, offs = offset_code(ndim, nops)
    for ph, d in typedefs.items():
        body.append(f"    typedef {compute_ctype(d)} {ph};")
    for v, d in scalars:
        body.append(f"    {compute_ctype(d)} {v} = ({compute_ctype(d)})raw_{v};")
    for k, (v, d, is_out) in enumerate(arrays):
        init = load_expr(d, f"p_{v}", offs[k]) if not is_out else "0"
        body.append(f"    {compute_ctype(d)} {v} = {init};")
    body.append("    { " + operation.strip().rstrip(";") + "; }")
    for k, (v, d, is_out) in enumerate(arrays):
        if is_out:
            body.append("    " + store_stmt(d, f"p_{v}", offs[k], v))
    return PREAMBLE + preamble + kernel_text(name, params, body, ndim, nops)


def collapse_dims(shape, strides_list):
    """Merge dimensions that are contiguous in every operand and drop size-1
    dimensions. Returns (shape, [strides per operand]); shape () means one
    element; a result with every operand row-major contiguous returns ndim 0
    for the caller to use flat indexing."""
    dims = [i for i, s in enumerate(shape) if s != 1]
    shape2 = [shape[i] for i in dims]
    strides2 = [[st[i] for i in dims] for st in strides_list]
    if not shape2:
        return (), [[] for _ in strides_list]
    out_shape = [shape2[0]]
    out_strides = [[st[0]] for st in strides2]
    for i in range(1, len(shape2)):
        mergeable = all(st[i - 1] == st[i] * shape2[i] for st in strides2)
        if mergeable:
            out_shape[-1] *= shape2[i]
            for k, st in enumerate(strides2):
                out_strides[k][-1] = st[i]
        else:
            out_shape.append(shape2[i])
            for k, st in enumerate(strides2):
                out_strides[k].append(st[i])
    return tuple(out_shape), out_strides


TILE = 32
TILE_ROWS = 8       # a 32 x 8 block moves a 32 x 32 tile, four elements per thread


def tiled_copy_source(name, out, src, ndim, p, q):
    """CUDA C copying (and casting) through 32 x 33 shared-memory tiles over
    collapsed dimensions ``ndim``: ``q`` is the source's unit-stride dimension,
    ``p`` the destination's. Each tile is read with threads along q and written
    with threads along p, so both sides are coalesced; the padding column
    keeps the transposed shared-memory reads free of bank conflicts. The other
    dimensions index the tiles (one div/mod walk per tile, not per element)."""
    batch_dims = [d for d in range(ndim - 1, -1, -1) if d not in (p, q)]
    walk = "".join(f"      {{ long long c = r % g.size[{d}]; r /= g.size[{d}]; "
                   f"od += c * g.stride[0][{d}]; os += c * g.stride[1][{d}]; }}\n" for d in batch_dims)
    value = load_expr(src, "tile[threadIdx.x]", "k")
    return (PREAMBLE +
            f"struct tp_geom_{ndim}_2 {{ long long size[{ndim}]; long long stride[2][{ndim}]; }};\n"
            f'extern "C" __global__ void __launch_bounds__({TILE * TILE_ROWS}) {name}('
            f"{out.ctype}* __restrict__ out, const {src.ctype}* __restrict__ in, long long ntiles, "
            f"tp_geom_{ndim}_2 g) {{" + GRID_WAIT +
            f"  __shared__ {src.ctype} tile[{TILE}][{TILE + 1}];\n"
            f"  const long long np_ = g.size[{p}], nq = g.size[{q}];\n"
            f"  const long long tq_count = (nq + {TILE - 1}) / {TILE}, tp_count = (np_ + {TILE - 1}) / {TILE};\n"
            "  const long long per_batch = tq_count * tp_count;\n"
            "  for (long long t = blockIdx.x; t < ntiles; t += gridDim.x) {\n"
            "    const long long rem = t % per_batch;\n"
            f"    const long long q0 = (rem % tq_count) * {TILE}, p0 = (rem / tq_count) * {TILE};\n"
            "    long long od = 0, os = 0;\n"
            "    {\n"
            "      long long r = t / per_batch;\n"
            + walk +
            "    }\n"
            "#pragma unroll\n"
            f"    for (int k = threadIdx.y; k < {TILE}; k += {TILE_ROWS}) {{\n"
            "      const long long iq = q0 + threadIdx.x, ip = p0 + k;\n"
            f"      if (iq < nq && ip < np_) tile[k][threadIdx.x] = in[os + iq * g.stride[1][{q}] + ip * g.stride[1][{p}]];\n"
            "    }\n"
            "    __syncthreads();\n"
            "#pragma unroll\n"
            f"    for (int k = threadIdx.y; k < {TILE}; k += {TILE_ROWS}) {{\n"
            "      const long long ip = p0 + threadIdx.x, iq = q0 + k;\n"
            "      if (iq < nq && ip < np_) {\n"
            f"        " + store_stmt(out, "out", f"od + ip * g.stride[0][{p}] + iq * g.stride[0][{q}]", value) + "\n"
            "      }\n"
            "    }\n"
            "    __syncthreads();\n"
            "  }\n"
            "}\n")
