# SPDX-License-Identifier: Apache-2.0
"""Small test utilities: a kernel that keeps a stream busy; the fuzz counter;
the PTX of a kernel source (no GPU needed)."""

import os
import struct

# TP_FUZZ_SCALE multiplies the fuzzers' example counts (the GPU run uses more).
FUZZ_SCALE = float(os.environ.get("TP_FUZZ_SCALE", "1"))
FUZZED_CALLS = [0]


def count_fuzzed_call(n=1):
    """Count fuzzed calls; conftest prints the total at the end of the run."""
    FUZZED_CALLS[0] += n

from tensorplay._kernels import cache as _kernels

SPIN_SOURCE = r"""
extern "C" __global__ void tp_test_spin(long long cycles, int* flag) {
  long long start = clock64();
  while (clock64() - start < cycles) { }
  if (flag) *flag = 1;
}
"""


def spin(stream, cycles=200_000_000, flag_ptr=0, device=0):
    """Keep ``stream`` busy for about ``cycles`` GPU clocks (~0.1 s at 2 GHz)."""
    f = _kernels.load_function(SPIN_SOURCE, "tp_test_spin", device)
    f.launch(1, 1, struct.pack("<qQ", cycles, flag_ptr), 0, stream.handle)


def ptx_of(source, arch=90):
    """PTX of ``source`` for compute_``arch``: to see which instructions and
    parameters a kernel has (NVRTC only, no GPU)."""
    from cuda.bindings import nvrtc
    err, prog = nvrtc.nvrtcCreateProgram(source.encode(), b"k.cu", 0, [], [])
    assert err == nvrtc.nvrtcResult.NVRTC_SUCCESS
    try:
        opts = [f"--gpu-architecture=compute_{arch}".encode(), b"-std=c++17"]
        (res,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
        assert res == nvrtc.nvrtcResult.NVRTC_SUCCESS
        err, n = nvrtc.nvrtcGetPTXSize(prog)
        buf = b" " * n
        (res,) = nvrtc.nvrtcGetPTX(prog, buf)
        assert res == nvrtc.nvrtcResult.NVRTC_SUCCESS
        return buf.decode()
    finally:
        nvrtc.nvrtcDestroyProgram(prog)
