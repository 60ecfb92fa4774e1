# SPDX-License-Identifier: Apache-2.0
"""Where the driver spends the extra time of a capture under lazy module loading (issue 42).

Runs on the GPU machine, from ``benchmarks/``::

    python probe_lazy_launch.py [--repeats 200]

Each case is a fresh process with CUDA_MODULE_LOADING set to LAZY or EAGER,
and one way of getting the kernel: cuModuleLoadData + cuModuleGetFunction,
the same followed by cuFuncLoad, cuLibraryLoadData + cuLibraryGetKernel
(launched as a CUkernel), the module's kernel launched with programmatic
stream serialization (cuLaunchKernelEx, as tensorplay launches its own), or
the module's kernel with 60 other modules loaded and used first (tensorplay
loads one module per kernel), or the module's kernel with PyTorch's CUDA
started first in the process (``torch``). It captures 100 launches of an empty kernel with
raw driver calls (cuda.bindings; the binding costs the same in every mode) and
prints the median host us of begin capture, the 100 launches, end capture,
instantiate and destroy, plus 100 launches outside a capture. A difference
between LAZY and EAGER in a column is the driver's, not tensorplay's.
"""

from __future__ import annotations

import argparse
import os

from tpbench.common import run_fresh

CASE = r"""
import json, statistics, sys, time
how, repeats = sys.argv[1], int(sys.argv[2])
from cuda.bindings import driver as d
from tensorplay._kernels.nvrtc import compile_cubin

def ok(r):
    err = r[0] if isinstance(r, tuple) else r
    if err != d.CUresult.CUDA_SUCCESS:
        raise RuntimeError(str(err))
    return r[1] if isinstance(r, tuple) and len(r) == 2 else r[1:] if isinstance(r, tuple) else None

if how == "torch":
    import torch
    torch.zeros(1, device="cuda").add_(1)
    torch.cuda.synchronize()
ok(d.cuInit(0))
dev = ok(d.cuDeviceGet(0))
ctx = ok(d.cuDevicePrimaryCtxRetain(dev))
ok(d.cuCtxSetCurrent(ctx))
major = ok(d.cuDeviceGetAttribute(d.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev))
minor = ok(d.cuDeviceGetAttribute(d.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev))
image = compile_cubin('extern "C" __global__ void probe_empty() {}', "probe_empty.cu", (), major * 10 + minor)
if how == "modules":
    others = []
    for i in range(60):
        src = 'extern "C" __global__ void probe_other_%d() {}' % i
        m = ok(d.cuModuleLoadData(compile_cubin(src, "probe_other_%d.cu" % i, (), major * 10 + minor)))
        others.append((m, ok(d.cuModuleGetFunction(m, b"probe_other_%d" % i))))
if how == "library":
    lib = ok(d.cuLibraryLoadData(image, None, None, 0, None, None, 0))
    # a CUkernel is launched through cuLaunchKernel as a CUfunction
    f = d.CUfunction(int(ok(d.cuLibraryGetKernel(lib, b"probe_empty"))))
else:
    mod = ok(d.cuModuleLoadData(image))
    f = ok(d.cuModuleGetFunction(mod, b"probe_empty"))
    if how == "funcload":
        ok(d.cuFuncLoad(f))
stream = ok(d.cuStreamCreate(1))
mode = str(ok(d.cuModuleGetLoadingMode())).split(".")[-1]
mode_global = d.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL

def launch():
    ok(d.cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, stream, 0, 0))

if how == "pdl":
    config = d.CUlaunchConfig()
    config.gridDimX = config.gridDimY = config.gridDimZ = 1
    config.blockDimX, config.blockDimY, config.blockDimZ = 32, 1, 1
    config.sharedMemBytes = 0
    config.hStream = stream
    attr = d.CUlaunchAttribute()
    attr.id = d.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
    attr.value.programmaticStreamSerializationAllowed = 1
    config.attrs = [attr]
    config.numAttrs = 1

    def launch():
        ok(d.cuLaunchKernelEx(config, f, 0, 0))
if how == "modules":
    for _, other in others:
        ok(d.cuLaunchKernel(other, 1, 1, 1, 32, 1, 1, 0, stream, 0, 0))
    ok(d.cuStreamSynchronize(stream))

cols = {k: [] for k in ("begin", "launch 100", "end", "instantiate", "destroy", "eager 100")}
for rep in range(repeats + 20):
    t = [time.perf_counter()]
    ok(d.cuStreamBeginCapture(stream, mode_global)); t.append(time.perf_counter())
    for _ in range(100):
        launch()
    t.append(time.perf_counter())
    g = ok(d.cuStreamEndCapture(stream)); t.append(time.perf_counter())
    ge = ok(d.cuGraphInstantiate(g, 0)); t.append(time.perf_counter())
    ok(d.cuGraphExecDestroy(ge)); ok(d.cuGraphDestroy(g)); t.append(time.perf_counter())
    for _ in range(100):
        launch()
    t.append(time.perf_counter())
    ok(d.cuStreamSynchronize(stream))
    if rep >= 20:
        for k, a, b in zip(cols, t, t[1:]):
            cols[k].append((b - a) * 1e6)
print("RESULT" + json.dumps({"mode": mode, **{k: statistics.median(v) for k, v in cols.items()}}))
"""


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=200)
    args = ap.parse_args()
    cols = ("begin", "launch 100", "end", "instantiate", "destroy", "eager 100")
    print(f"{'loading':8} {'kernel':9} {'mode':>22} " + " ".join(f"{c:>11}" for c in cols) + "  (median host us)")
    for loading in ("EAGER", "LAZY"):
        for how in ("module", "funcload", "library", "pdl", "modules", "torch"):
            r, failure = run_fresh(CASE, [how, str(args.repeats)], dict(os.environ, CUDA_MODULE_LOADING=loading))
            if r is None:
                print(f"{loading:8} {how:9} failed: {failure}")
                continue
            print(f"{loading:8} {how:9} {r['mode']:>22} " + " ".join(f"{r[c]:11.1f}" for c in cols))


if __name__ == "__main__":
    main()
