# SPDX-License-Identifier: Apache-2.0
"""RawKernel.compile and ElementwiseKernel.compile: with ``arch`` they compile
with NVRTC alone (no GPU: these run on CI) and return the CUBIN; a source
that does not compile raises NVRTCError with NVRTC's log; without ``arch``
they compile for a device and load the kernel there (GPU tests)."""

import numpy as np
import pytest

import tensorplay as tp
from helpers import HAS_CUDA, KERNEL_ARCH, unique_kernel_source

SCALE = r'''
extern "C" __global__ void scale(float* x, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] *= a;
}
'''


def _is_cubin(image):
    return isinstance(image, bytes) and image[:4] == b"\x7fELF"


def test_raw_kernel_compiles_for_an_arch_without_a_gpu(kernel_cache):
    k = tp.cuda.RawKernel(SCALE, "scale")
    image = k.compile(arch=KERNEL_ARCH)
    assert _is_cubin(image) and b"scale" in image
    assert k.compile(arch=(KERNEL_ARCH // 10, KERNEL_ARCH % 10)) == image
    assert _is_cubin(k.compile(arch=80)) and k.compile(arch=80) != image


def test_compiling_for_an_arch_fills_the_kernel_cache(kernel_cache):
    source = unique_kernel_source("ahead_of_time")
    tp.cuda.RawKernel(source, "ahead_of_time").compile(arch=KERNEL_ARCH)
    info = tp.cuda.kernel_cache_info()
    assert info["files"] == 1
    tp.cuda.RawKernel(source, "ahead_of_time").compile(arch=KERNEL_ARCH)    # another object: a cache hit
    assert tp.cuda.kernel_cache_info()["compiled"] == info["compiled"]


def test_a_syntax_error_raises_nvrtc_error_with_the_log(kernel_cache):
    bad = 'extern "C" __global__ void broken(float* x) {\n    x[0] = ;\n}\n'
    with pytest.raises(tp.NVRTCError) as info:
        tp.cuda.RawKernel(bad, "broken").compile(arch=KERNEL_ARCH)
    err = info.value
    assert "broken.cu(2): error: expected an expression" in err.log
    assert str(err).startswith(f"compiling broken.cu for sm_{KERNEL_ARCH} failed") and err.log in str(err)


def test_elementwise_kernel_compiles_for_an_arch_without_a_gpu(kernel_cache):
    fixed = tp.cuda.ElementwiseKernel("float32 x, float32 y", "float32 z", "z = x * y + 1", "fma1")
    assert _is_cubin(fixed.compile(arch=KERNEL_ARCH))
    generic = tp.cuda.ElementwiseKernel("T x, T y", "T z", "z = x * y + 1", "fma_t")
    half = generic.compile(arch=KERNEL_ARCH, types={"T": tp.float16})
    assert _is_cubin(half) and half != generic.compile(arch=KERNEL_ARCH, types={"T": "float64"})


def test_elementwise_kernel_compile_needs_a_dtype_for_each_placeholder(kernel_cache):
    k = tp.cuda.ElementwiseKernel("T x", "U y", "y = x", "cast_t")
    with pytest.raises(TypeError, match=r"placeholder U \(of y\) needs a dtype: pass types=\{'U': \.\.\.\}"):
        k.compile(arch=KERNEL_ARCH, types={"T": tp.float32})
    with pytest.raises(TypeError, match=r"'V' is not a placeholder type of this kernel \(its placeholders: \['T', 'U'\]\)"):
        k.compile(arch=KERNEL_ARCH, types={"T": tp.float32, "U": tp.int32, "V": tp.int8})
    assert _is_cubin(k.compile(arch=KERNEL_ARCH, types={"T": tp.float32, "U": tp.int32}))


def test_elementwise_kernel_syntax_error_raises_nvrtc_error_with_the_log(kernel_cache):
    k = tp.cuda.ElementwiseKernel("float32 x", "float32 z", "z = x +* 2", "bad_op")
    with pytest.raises(tp.NVRTCError) as info:
        k.compile(arch=KERNEL_ARCH)
    assert "error" in info.value.log and "z = x +* 2" in info.value.log


@pytest.mark.parametrize("arch, error", [("sm_90", TypeError), (9.0, TypeError), (True, TypeError),
                                         ((9,), ValueError), ((9, 10), ValueError), (5, ValueError),
                                         (1000, ValueError)])
def test_a_bad_arch_is_refused_before_compiling(arch, error):
    for k in (tp.cuda.RawKernel(SCALE, "scale"), tp.cuda.ElementwiseKernel("float32 x", "float32 y", "y = x", "cp")):
        with pytest.raises(error, match="arch must be a compute capability such as 90 or"):
            k.compile(arch=arch)


def test_an_arch_nvrtc_cannot_target_raises_nvrtc_error(kernel_cache):
    with pytest.raises(tp.NVRTCError, match="cannot target compute capability 70"):
        tp.cuda.RawKernel(SCALE, "scale").compile(arch=70)


def test_device_and_arch_together_are_refused():
    with pytest.raises(TypeError, match="give a device .* or an arch .*, not both"):
        tp.cuda.RawKernel(SCALE, "scale").compile("cuda:0", arch=KERNEL_ARCH)


@pytest.mark.skipif(HAS_CUDA, reason="checks the no-GPU behaviour")
def test_compiling_for_a_device_without_cuda_says_why():
    reason = tp.cuda.unavailable_reason()
    for call in (lambda: tp.cuda.RawKernel(SCALE, "scale").compile(),
                 lambda: tp.cuda.ElementwiseKernel("float32 x", "float32 y", "y = x", "cp").compile()):
        with pytest.raises(tp.cuda.CudaUnavailableError) as info:
            call()
        assert str(info.value) == f"CUDA is not available: {reason}"


# ---------------------------------------------------------------- on the GPU

@pytest.mark.cuda
def test_compile_for_the_device_loads_what_the_call_runs(kernel_cache):
    major, minor = tp.cuda.get_device_capability()
    k = tp.cuda.RawKernel(SCALE, "scale")
    image = k.compile(arch=(major, minor))                  # ahead of time, for this GPU
    compiled = tp.cuda.kernel_cache_info()["compiled"]
    f = k.compile()                                        # the device's arch: a cache hit, loaded
    assert tp.cuda.kernel_cache_info()["compiled"] == compiled and _is_cubin(image)
    assert f is k.compile(0)
    x = tp.ones(100, device="cuda")
    k((1,), (128,), (x, 3.0, 100))
    assert np.all(x.numpy() == 3.0)


@pytest.mark.cuda
def test_elementwise_compile_for_the_device_serves_a_contiguous_call(kernel_cache):
    k = tp.cuda.ElementwiseKernel("T x, T y", "T z", "z = x * y + 1", "fma_dev")
    k.compile(types={"T": tp.float32})
    x = tp.full((4, 8), 2.0, device="cuda")          # before counting: its own kernel may compile now
    compiled = tp.cuda.kernel_cache_info()["compiled"]
    z = k(x, x)
    assert tp.cuda.kernel_cache_info()["compiled"] == compiled      # the call compiled nothing
    assert np.all(z.numpy() == 5.0)
