# SPDX-License-Identifier: Apache-2.0
"""Host time of the launch-plan paths, without a GPU.

CUDA tensors are metadata over fake addresses and kernels are no-op
launchers, so what is timed is the pure-Python work of a cached launch:
the plan key, the plan-cache lookup and the argument packing. Run from
anywhere: ``python benchmarks/host_plans.py``."""

import sys
import timeit

import tensorplay as tp
from tensorplay._kernels import cache as _kernels
from tensorplay._ops import elementwise as _elementwise
from tensorplay._ops import custom as _custom


class _NoOp:
    def launch(self, grid, block, params, shared=0, stream=None):
        pass


def fake(shape, dtype, ptr=0x100000, strides=None):
    t = tp.Tensor.__new__(tp.Tensor)
    strides = strides or tp._tensor.args.contiguous_strides(shape)
    t._set_cuda(None, ptr, tuple(shape), tuple(strides), dtype.code, 0)
    return t


def main(number=20000, repeat=15):
    noop = _NoOp()
    _kernels.cached_function = lambda key, dev, make: noop
    _kernels._sm_cache[0] = 132
    _elementwise.empty_cuda = lambda shape, dtype, dev: fake(shape, dtype, 0x900000)
    _elementwise.empty = lambda shape, dtype, device: fake(shape, dtype, 0x900000)   # first calls
    _kernels.plans.clear()
    f32 = tp.float32
    a, b, o = fake((64, 128), f32, 0x10000), fake((128,), f32, 0x20000), fake((64, 128), f32, 0x30000)
    s = fake((64, 128), f32, 0x40000, strides=(1, 64))       # a transposed view
    d = fake((64, 128), f32, 0x50000, strides=(256, 2))      # every other column
    apply, launch = _elementwise.apply, _kernels.launch_elementwise
    k = _custom.ElementwiseKernel("T x, T y", "T z", "z = x * y", "mul2")
    apply("add", a, b, out=o)
    plan_key, get = _elementwise._plan_key, _kernels.plans.get
    lp = get(plan_key("add", (a, b), o, False)).launch_plan

    def lookup_and_pack(a, b, o):      # what apply does on a hit, less its own call and checks
        get(plan_key("add", (a, b), o, False)).launch_plan.launch([o.data_ptr(), a.data_ptr(), b.data_ptr()], ())
    cases = {
        "apply add(a, b, out=o)": lambda: apply("add", a, b, out=o),
        "apply mul(a, 2.5, out=o)": lambda: apply("mul", a, 2.5, out=o),
        "apply add(a, b) -> new": lambda: apply("add", a, b),
        "apply add_(o, 1) inplace": lambda: apply("add", o, 1, out=o, _inplace=True),
        "plan_key add(a, b, out=o)": lambda: _elementwise._plan_key("add", (a, b), o, False),
        "key + get + pack add(a, b, out=o)": lambda: lookup_and_pack(a, b, o),
        "LaunchPlan.launch (pack only)": lambda: lp.launch((1, 2, 3), ()),
        "launch_elementwise copy strided": lambda: launch("copy", "a0", d, (a,), (a.strides,)),
        "launch_elementwise fill": lambda: launch("fill", "s0", o, (), (), (1.5,), ("f",)),
        "launch_tiled_copy transpose": lambda: _kernels.launch_tiled_copy(o, s, s.strides),
        "ElementwiseKernel(a, b, o)": lambda: k(a, b, o),
    }
    width = max(map(len, cases))
    for name, fn in cases.items():
        fn()                                          # make the plans
        best = min(timeit.repeat(fn, number=number, repeat=repeat)) / number
        print(f"{name:<{width}}  {best * 1e9:7.0f} ns")


if __name__ == "__main__":
    main(*(int(x) for x in sys.argv[1:]))
