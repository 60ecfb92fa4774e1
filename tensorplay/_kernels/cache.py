# SPDX-License-Identifier: Apache-2.0
"""Compiled-kernel cache, the launch-plan cache and the elementwise launcher.

Kernels are looked up by a small descriptor tuple, so the CUDA C source is
generated and compiled once per (op, dtypes, dims, device). What a launch
needs beyond its pointers and scalars (the kernel, the grid, the packing
format and the packed geometry) is a :class:`LaunchPlan`, kept in the one
bounded :class:`PlanCache` of the library, :data:`plans`, beside the
elementwise front end's typed :class:`ElementwisePlan`; a repeated launch
costs a cache lookup plus packing the argument buffer.
"""

from __future__ import annotations

import re
import struct
import threading
from collections import OrderedDict
from typing import NamedTuple

from tensorplay._driver.context import get_device_capability, get_device_properties
from tensorplay._driver.launch import Module
from tensorplay._kernels import codegen as _codegen
from tensorplay._kernels import nvrtc as _nvrtc
from tensorplay._kernels.codegen import GRID_WAIT, PDL_MIN_ARCH
from tensorplay._kernels.packer import LaunchPacker

BLOCK = 256

_lock = threading.Lock()
_functions: dict = {}
_modules: dict = {}
_arch_cache: dict = {}
_sm_cache: dict = {}


def device_arch(device: int) -> int:
    a = _arch_cache.get(device)
    if a is None:
        major, minor = get_device_capability(device)
        a = _arch_cache[device] = major * 10 + minor
    return a


def sm_count(device: int) -> int:
    n = _sm_cache.get(device)
    if n is None:
        n = _sm_cache[device] = get_device_properties(device)["multi_processor_count"]
    return n


def load_function(source: str, name: str, device: int, options=(), pdl=None):
    """Compile (cached) and load ``name`` from ``source`` on ``device``.

    The kernel launches with programmatic stream serialization (``pdl``)
    when its source opens with :data:`GRID_WAIT`, as every kernel the library
    generates does, and its code is for sm_90 or newer; ``pdl`` given says
    so for a source of the user's own (its kernel waits itself)."""
    arch = device_arch(device)
    image = _nvrtc.compile_cubin(source, name + ".cu", tuple(options), arch)
    with _lock:
        mod = _modules.get((image, device))
        if mod is None:
            mod = _modules[(image, device)] = Module(image, device)
    f = mod.get_function(name)
    f.pdl = (GRID_WAIT in source if pdl is None else bool(pdl)) and _nvrtc.target_arch(arch) >= PDL_MIN_ARCH
    return f


def cached_function(key, device: int, make_source, options=()):
    """The kernel for descriptor ``key`` on ``device``; ``make_source()`` returns
    (source, name) the first time, compiled with NVRTC ``options`` (which
    ``key`` must determine)."""
    f = _functions.get((key, device))
    if f is None:
        source, name = make_source()
        if getattr(_collecting, "active", False):
            raise KernelCollected(KernelSpec(source, name + ".cu", tuple(str(o) for o in options)))
        f = load_function(source, name, device, options)
        _functions[(key, device)] = f
    return f


# ------------------------------------------------------------------ collecting kernels (precompile)

class KernelSpec(NamedTuple):
    """One kernel as NVRTC compiles it: the CUDA C, the program name
    (``<kernel>.cu``) and the options; :func:`load_function` compiles the
    same for a device's architecture, so the on-disk cache key is the same."""
    source: str
    name: str
    options: tuple


# A device index no GPU has. Tensors made on it (metadata over no memory)
# take the real op code up to cached_function, which under collect_kernel
# hands back the kernel asked for instead of compiling it: the plans and
# kernels kept for real devices are never found or stored from there.
COLLECT_DEVICE = 1 << 20
_collecting = threading.local()


class KernelCollected(BaseException):
    """Ends the call :func:`collect_kernel` runs at the kernel it asks for (a
    BaseException, so that no ``except Exception`` on the way keeps it)."""

    def __init__(self, spec: KernelSpec):
        super().__init__(spec.name)
        self.spec = spec


def collect_kernel(call, *args, **kwargs) -> KernelSpec | None:
    """Run ``call(*args, **kwargs)`` up to the first kernel it asks
    :func:`cached_function` for and return that kernel's :class:`KernelSpec`
    (None if it asks for none), compiling and launching nothing.

    ``call`` is real op code over tensors on :data:`COLLECT_DEVICE` (made
    with ``new_cuda(None, ...)``, ``out=`` given): it must reach the kernel
    before it allocates, launches or asks the device anything, which the
    kernel families do. Only this thread collects meanwhile."""
    before = getattr(_collecting, "active", False)
    _collecting.active = True
    try:
        call(*args, **kwargs)
    except KernelCollected as done:
        return done.spec
    finally:
        _collecting.active = before
    return None


def _ident(key) -> str:
    """A C identifier fragment naming a kernel key (tuples and all)."""
    return re.sub(r"\W+", "_", str(key)).strip("_")


# ------------------------------------------------------------------ plans

# Plans kept by :data:`plans`. A distinct elementwise call seen before holds
# two (its ElementwisePlan and the LaunchPlan that one shares with every call
# of the same kernel and collapsed geometry), so this keeps the 4096 calls
# the front end used to keep, each at a few hundred bytes.
PLAN_CACHE_SIZE = 8192


class PlanCache:
    """A bounded map from plan keys to plans: when full, storing a new plan
    evicts the least recently used one (looked up or stored).

    Keys are tuples led by what names the plan's kind, so kinds never
    collide: a launch plan's key is ``(kernel key, device, collapsed shape,
    collapsed strides)``, the kernel key a tuple as :func:`cached_function`
    takes it; the elementwise front end's keys start with the op's name (a
    str, see ``_ops._elementwise._plan_key``). Plans are immutable and never
    None, and a plan is valid for as long as its key can be formed, so the
    cache has no invalidation: :meth:`clear` only frees them (and drops
    kernels that tests fake).

    Each entry keeps the key object it was stored under, so a lookup (with a
    key built afresh, equal but not identical) compares the nested key tuples
    once, not again to mark the entry recently used. Lookups and stores take
    no lock: each step is one ``OrderedDict`` operation, atomic under the
    GIL, and a race only costs an eviction order slightly off or a plan built
    twice.
    """

    __slots__ = ("maxsize", "_entries")

    def __init__(self, maxsize: int = PLAN_CACHE_SIZE):
        if maxsize < 1:
            raise ValueError(f"a plan cache holds at least one plan, got maxsize={maxsize}")
        self.maxsize = maxsize
        self._entries: OrderedDict = OrderedDict()     # key -> (plan, the key object stored)

    def get(self, key):
        """The plan stored under ``key`` (now the most recently used), or None."""
        entry = self._entries.get(key)
        if entry is None:
            return None
        try:
            self._entries.move_to_end(entry[1])    # the stored key: found by identity
        except KeyError:                           # evicted by another thread meanwhile: still valid
            pass
        return entry[0]

    def put(self, key, plan):
        """Store ``plan`` under ``key`` as the most recently used, evicting the
        least recently used plans beyond :attr:`maxsize`; return ``plan``."""
        entries = self._entries
        entries.pop(key, None)                     # a new entry goes last, with this key object
        entries[key] = (plan, key)
        while len(entries) > self.maxsize:
            try:
                entries.popitem(last=False)
            except KeyError:                       # another thread evicted first
                break
        return plan

    def clear(self) -> None:
        """Drop every plan."""
        self._entries.clear()

    def keys(self) -> list:
        """The keys, least recently used first (for tests and debugging)."""
        return list(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key) -> bool:
        """Whether ``key`` has a plan (without making it recently used)."""
        return key in self._entries


# The launch plans of the library: every LaunchPlan and the elementwise front
# end's ElementwisePlans. Tests clear it to drop the kernels they fake.
plans = PlanCache()


class ElementwisePlan:
    """The elementwise front end's plan for a repeated call
    (``_ops._elementwise.apply``): everything but the operands' pointers and
    scalar values, so a call seen before skips promotion, broadcasting and
    geometry.

    ``dtype``, ``shape`` and ``device`` describe the result (allocated when
    the call gives no ``out``); ``launch_plan`` is the kernel's
    :class:`LaunchPlan`; ``tensor_pos`` and ``scalar_pos`` are the positions
    of the tensor and the scalar operands, and ``scalar_kinds`` passes each
    scalar as double ('f') or long long ('i')."""

    __slots__ = ("dtype", "shape", "device", "launch_plan", "tensor_pos", "scalar_pos", "scalar_kinds")

    def __init__(self, dtype, shape, device, launch_plan, tensor_pos, scalar_pos, scalar_kinds):
        self.dtype = dtype
        self.shape = tuple(shape)
        self.device = device
        self.launch_plan = launch_plan
        self.tensor_pos = tuple(tensor_pos)
        self.scalar_pos = tuple(scalar_pos)
        self.scalar_kinds = tuple(scalar_kinds)

    def __repr__(self):
        return (f"ElementwisePlan({self.dtype.name}, shape={self.shape}, device={self.device}, "
                f"tensors at {self.tensor_pos}, scalars at {self.scalar_pos} as {self.scalar_kinds})")


def launch_plan_key(kernel_key, device: int, shape, strides):
    """The :data:`plans` key of the launch of kernel ``kernel_key`` on
    ``device`` over collapsed ``shape`` and ``strides`` (one sequence per
    operand, as :func:`geometry` returns them)."""
    return (kernel_key, device, tuple(shape), tuple(map(tuple, strides)))


def small_block(n: int, block: int = BLOCK) -> int:
    """The block for ``n`` elements: ``block``, or for fewer elements than
    that the whole warps covering them, so that no warp idles (a launch of
    one warp and one of eight cost the same on the H200: what a tiny node
    costs is its instructions, not its block)."""
    return block if n >= block else max(32, -(-n // 32) * 32)


def grid_for(n: int, device: int) -> int:
    blocks = (n + BLOCK - 1) // BLOCK
    return max(1, min(blocks, sm_count(device) * 16))


# Flat kernels loop over tiles. A grid of 64 blocks per SM looping over 64 Mi
# floats reached 81% of DRAM peak where PyTorch's one tile per block reaches
# 85% (ncu, H200): the cap is high enough that such sizes take one pass.
FLAT_BLOCKS_PER_SM = 512
# Tiled copies: 64 blocks per SM looping over the tiles (2.3x PyTorch's transpose)
TILED_COPY_BLOCKS_PER_SM = 64


def flat_grid(n: int, tile: int, sms: int) -> int:
    """Blocks for a flat kernel over ``n`` elements in tiles of ``tile``."""
    return max(1, min(-(-n // tile), sms * FLAT_BLOCKS_PER_SM))


# Flat launches cover the elements with one vector a thread up to this many
# blocks per SM; beyond (tensors of tens of GB), tiles of two vectors a
# thread over a grid-stride loop. Measured on the H200 (chains of in-place
# float32 ops in a graph), covering is as fast or faster than tiles at every
# size from 256 KiB to 64 MiB: 1.04 against 1.50 us an op at 1 MiB, 32.8
# against 34.1 at 64 MiB.
COVER_BLOCKS_PER_SM = 1 << 16


def flat_launch(n: int, itemsizes, sms: int) -> tuple[int, int]:
    """(grid, block) of a flat kernel over ``n`` elements of operands of
    ``itemsizes``; the kernel reads its regime from the grid
    (``_codegen.flat_kernel_text``). Under one tile, whole warps covering n,
    one element a thread (the fewest instructions a thread: graphs of tiny
    kernels pay for each of them per node);
    then blocks of BLOCK threads covering n with one vector a thread, up to
    COVER_BLOCKS_PER_SM blocks per SM; beyond, :func:`flat_grid` blocks
    looping over tiles."""
    width = _codegen.flat_vector_width(itemsizes)
    tile = _codegen.flat_tile(itemsizes)
    if n < tile:
        block = small_block(n)
        return -(-n // block), block
    covering = -(-n // (BLOCK * width))
    if covering <= sms * COVER_BLOCKS_PER_SM:
        return covering, BLOCK
    return flat_grid(n, tile, sms), BLOCK


def vector_width(ptrs, itemsizes, numel: int) -> int:
    """Elements per vector access for a flat kernel over operands at ``ptrs``
    with ``itemsizes``: the compiled width (16 bytes of the widest operand)
    when every pointer is aligned to its own vector size, else 1 (scalar
    loads). Tails shorter than a tile are handled in the kernel, so any
    ``numel`` of at least one vector can take the vector path. Flat
    elementwise kernels make the same test on the device (the masks of
    ``_codegen.alignment_masks``); reductions pass this width as an argument."""
    width = _codegen.flat_vector_width(itemsizes)
    if width == 1 or numel < width:
        return 1
    for p, mask in zip(ptrs, _codegen.alignment_masks(itemsizes)):
        if p & mask:
            return 1
    return width


def launch_elementwise(op_key, expr: str, out, inputs=(), in_strides=None,
                       scalars=(), scalar_kinds=(), preamble: str = "", stream=None):
    """Launch ``out[i] = expr`` over ``out``'s shape; return its :class:`LaunchPlan`.

    ``inputs`` are CUDA tensors on ``out``'s device; ``in_strides`` gives each
    input's strides broadcast to ``out.shape`` (0 on broadcast dimensions).
    ``scalars`` are passed as double ('f') or long long ('i') per ``scalar_kinds``.
    The plan is kept in :data:`plans` by kernel and collapsed geometry, so a
    launch over the same shapes and strides again reuses it.
    """
    n = out.numel()
    if n == 0:
        return
    dev = out._device_index
    if in_strides is None:
        in_strides = [t.strides for t in inputs]
    shape, strides, ndim = geometry(out.shape, [out.strides] + list(in_strides))
    kinds = tuple(scalar_kinds)
    key = (op_key, out._dtype_code, tuple(t._dtype_code for t in inputs), ndim, kinds)
    pkey = launch_plan_key(key, dev, shape, strides)
    plan = plans.get(pkey)
    if plan is None:
        out_dt = out.dtype
        in_dts = tuple(t.dtype for t in inputs)

        def make():
            name = (f"tp_{_ident(op_key)}_{out_dt.name}_" + "_".join(d.name for d in in_dts) +
                    f"_{ndim}d")
            return _codegen.elementwise_source(name, out_dt, in_dts, expr, ndim, kinds, preamble), name

        f = cached_function(key, dev, make)
        itemsizes = (out_dt.itemsize,) + tuple(d.itemsize for d in in_dts) if not ndim else ()
        plan = plans.put(pkey, LaunchPlan(f, dev, n, 1 + len(in_dts), kinds, shape if ndim else (),
                                          strides if ndim else (), itemsizes))
    ptrs = [out.data_ptr()]
    for t in inputs:
        ptrs.append(t.data_ptr())
    plan.launch(ptrs, scalars, stream)
    return plan


class LaunchPlan:
    """Everything about a launch that depends only on the operands' dtypes,
    shapes and strides: the kernel, the grid, the packing format and the
    packed geometry. Launching needs only the pointers and scalars.

    Arguments are (pointers, n, 8-byte scalars, geometry): for elementwise
    kernels one thread per element, grid-stride, on ``stream`` (default: the
    current stream).

    ``itemsizes`` (one per pointer) marks a flat kernel (every operand
    contiguous, see ``_codegen.flat_kernel_text``): its grid covers tiles of
    several elements per thread. The kernel itself tests the pointers'
    alignment for its vector path, so a plan reused with other pointers
    costs nothing more on the host. ``grid`` and ``block`` given are taken
    as they are (the tiled copy's tiles)."""

    __slots__ = ("f", "dev", "n", "fmt", "geom", "grid", "block", "launch", "launch_operands")

    def __init__(self, f, dev, n, nptrs, kinds, shape, strides, itemsizes=(), grid=None, block=BLOCK):
        self.f = f
        self.dev = dev
        self.n = n
        self.fmt = "<" + "Q" * nptrs + "q" + "".join("d" if k == "f" else "q" for k in kinds)
        flat = list(shape)
        for st in strides:
            flat.extend(st)
        self.geom = struct.pack(f"<{len(flat)}q", *flat)
        if grid is not None:
            self.grid = grid
        elif itemsizes:
            self.grid, block = flat_launch(n, itemsizes, sm_count(dev))
        else:
            block = small_block(n, block)
            self.grid = grid_for(n, dev)
        self.block = block
        # launch(ptrs, scalars, stream=None) and launch_operands(out, operands,
        # tensor_pos, scalar_pos): the buffer laid out, cuLaunchKernel, all compiled
        packer = LaunchPacker(f, dev, n, nptrs, kinds, self.geom, self.grid, block)
        self.launch = packer.launch
        self.launch_operands = packer.launch_operands


def geometry(shape, strides_list):
    """Collapsed (shape, strides) and the kernel's ndim (0: flat indexing)."""
    shape, strides = _codegen.collapse_dims(tuple(shape), [list(s) for s in strides_list])
    ndim = len(shape)
    if ndim == 1 and all(st[0] == 1 for st in strides):
        ndim = 0
    return shape, strides, ndim


# A tiled copy pays off once both unit-stride dimensions span half a tile.
TILED_COPY_MIN = 16


def copy_strategy(shape, src_strides, dst_strides):
    """How ``dst[...] = src[...]`` runs over ``shape`` with these strides
    (elements, src broadcast): ("tile", cshape, [dst, src strides], p, q) when
    after collapsing the destination's unit-stride dimension p and the
    source's q differ (a transpose: 32 x 32 shared-memory tiles make both
    sides coalesced), else ("elementwise",)."""
    cshape, cstrides = _codegen.collapse_dims(tuple(shape), [list(dst_strides), list(src_strides)])
    if len(cshape) < 2:
        return ("elementwise",)
    dst_st, src_st = cstrides
    p = next((d for d in range(len(cshape) - 1, -1, -1) if dst_st[d] == 1), None)
    q = next((d for d in range(len(cshape) - 1, -1, -1) if src_st[d] == 1), None)
    if p is None or q is None or p == q:
        return ("elementwise",)
    if cshape[p] < TILED_COPY_MIN or cshape[q] < TILED_COPY_MIN:
        return ("elementwise",)
    return ("tile", cshape, cstrides, p, q)


def launch_tiled_copy(dst, src, src_strides):
    """Copy CUDA ``src`` (strides broadcast to ``dst``) into ``dst`` through
    shared-memory tiles when ``copy_strategy`` says so; False otherwise. The
    launch's plan is kept in :data:`plans` by kernel and collapsed geometry."""
    strategy = copy_strategy(dst.shape, src_strides, dst.strides)
    if strategy[0] != "tile":
        return False
    _, cshape, cstrides, p, q = strategy
    ndim = len(cshape)
    dev = dst._device_index
    key = ("tiled_copy", dst._dtype_code, src._dtype_code, ndim, p, q)
    pkey = launch_plan_key(key, dev, cshape, cstrides)
    plan = plans.get(pkey)
    if plan is None:
        out_dt, in_dt = dst.dtype, src.dtype

        def make():
            name = f"tp_tiled_copy_{out_dt.name}_{in_dt.name}_{ndim}d_{p}{q}"
            return _codegen.tiled_copy_source(name, out_dt, in_dt, ndim, p, q), name
        f = cached_function(key, dev, make)
        tile = _codegen.TILE
        ntiles = -(-cshape[p] // tile) * -(-cshape[q] // tile)
        for d, size in enumerate(cshape):
            if d not in (p, q):
                ntiles *= size
        grid = max(1, min(ntiles, sm_count(dev) * TILED_COPY_BLOCKS_PER_SM))
        # arguments (dst, src, ntiles, shape, dst strides, src strides)
        plan = plans.put(pkey, LaunchPlan(f, dev, ntiles, 2, (), cshape, cstrides, grid=grid,
                                          block=(tile, _codegen.TILE_ROWS)))
    plan.launch((dst.data_ptr(), src.data_ptr()), ())
    return True
