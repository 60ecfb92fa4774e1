# SPDX-License-Identifier: Apache-2.0
"""What every section shares: the result rows, the timing helpers and the peers' graphs.

- Results: ``RESULTS`` (compare.py's rows, written to its JSON as they
  are), ``record``, ``set_speed``, ``guarded``, ``write_json``.
- Host time: ``interleaved_host`` (rounds alternating between contenders),
  ``host_per_call``, ``latency`` (one call between two synchronizations),
  ``event_latency`` (the same from CUDA events), ``batch_of``.
- GPU time: ``GpuClock``, ``make_clocks`` and ``gpu_per_call`` (CUDA
  events around back-to-back calls queued behind a spin kernel).
- Peers: ``torch_graph``, ``cuda_core_graph``, ``cupy_graph``,
  ``build_cloop`` (the C loop of cuGraphLaunch, ``_cloop.pyx``).
- Memory and checks: ``settle``, ``mib``, ``size_label``, ``TOLERANCE``,
  ``as_torch``, ``relative_error``, ``check_against``, ``to_library``.
- Setup: ``gpu_and_torch`` (what a script needs before it starts),
  ``decode_loop_module`` (examples/decode_loop.py), ``run_fresh`` (a probe's
  case in a fresh interpreter, its RESULT line read back).

Section modules import this module (and ``workloads``), never each other.
"""

from __future__ import annotations

import functools
import gc
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

import numpy as np

import tensorplay as tp

# benchmarks/, where _cloop.pyx is and the scripts run from
BENCHMARKS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES = os.path.join(os.path.dirname(BENCHMARKS), "examples")
RESULTS = []

KI = 1 << 10
MI = 1 << 20            # Mi elements
MIB = MI                # bytes


# ---------------------------------------------------------------- results

def record(section, case, library, host_us=None, latency_us=None, extra=None, error=None,
           reserved_mib=None, total_mib=None, peak_mib=None, final_mib=None,
           gpu_us=None, rate=None, unit=None, note=None, capture_ms=None):
    """Append one result; the ``*_mib`` figures are the memory section's (see
    MEMORY_LEGEND, and serving's reserved growth); ``gpu_us``, ``rate``/``unit``
    and ``capture_ms`` the work and serving sections' (see WORK_LEGEND).
    ``speed_vs_torch`` is set later on tensorplay's rows (set_speed)."""
    RESULTS.append({"section": section, "case": case, "library": library, "host_us": host_us,
                    "latency_us": latency_us, "extra": extra, "error": error,
                    "reserved_mib": reserved_mib, "total_mib": total_mib, "peak_mib": peak_mib,
                    "final_mib": final_mib, "gpu_us": gpu_us, "rate": rate, "unit": unit, "note": note,
                    "capture_ms": capture_ms, "speed_vs_torch": None})


def set_speed(section, case, speed):
    """Store PyTorch's GPU time / tensorplay's (>1: tensorplay faster) on the tensorplay row."""
    for r in RESULTS:
        if r["section"] == section and r["case"] == case and r["library"] == "tensorplay":
            r["speed_vs_torch"] = speed


def guarded(section, case, library):
    """Decorator: run a measurement, recording an error instead of stopping the run."""
    def wrap(fn):
        try:
            fn()
        except Exception as exc:    # a peer missing or failing is reported, not fatal
            record(section, case, library, error=f"{type(exc).__name__}: {exc}"[:200])
        return fn
    return wrap


def write_json(path, meta, results):
    """Write ``{"meta": meta, "results": results}`` to ``path``, the format of every results file."""
    with open(path, "w") as f:
        json.dump({"meta": meta, "results": results}, f, indent=1)


# ---------------------------------------------------------------- host time

def batch_of(fn):
    """A contender's batch for ``interleaved_host``: ``batch(k)`` calls ``fn()`` k times."""
    def batch(k):
        for _ in range(k):
            fn()
    return batch


def host_per_call(fn, calls, repeats, sync):
    """Median host time of one call, timed over ``calls`` back-to-back calls
    after a synchronize (the launch queue stays short)."""
    return interleaved_host([("_", lambda k: [fn() for _ in range(k)], sync)], calls, repeats)["_"]


def interleaved_host(contenders, calls, rounds):
    """Median host time per call of each contender, ``(name, batch, sync)``
    with ``batch(k)`` making k calls. Rounds alternate between contenders so
    that drift of the machine affects all of them alike."""
    per = {name: [] for name, _, _ in contenders}
    for _ in range(rounds):
        for name, batch, sync in contenders:
            sync()
            t0 = time.perf_counter()
            batch(calls)
            per[name].append((time.perf_counter() - t0) / calls * 1e6)
    for _, _, sync in contenders:
        sync()
    return {name: statistics.median(v) for name, v in per.items()}


def median_host_us(fn, repeats, sync=None):
    """Median host time of one ``fn()`` in µs (after ``sync()``, when given)."""
    per = []
    for _ in range(repeats):
        if sync is not None:
            sync()
        t0 = time.perf_counter()
        fn()
        per.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(per)


def latency(fn, repeats, sync):
    """Median wall time of one ``fn()`` between two synchronizations, in µs."""
    per = []
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        per.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(per)


def event_latency(lib, fn, repeats):
    """Median time of one ``fn()`` between two CUDA events on the current
    stream, recorded after a synchronize: the GPU waits for the host's
    launch too, so this is end to end (inputs in, graph done), in µs."""
    per = []
    start, end = lib.cuda.Event(enable_timing=True), lib.cuda.Event(enable_timing=True)
    for _ in range(repeats):
        lib.cuda.synchronize()
        start.record()
        fn()
        end.record()
        end.synchronize()
        per.append(start.elapsed_time(end) * 1e3)
    return statistics.median(per)


# ---------------------------------------------------------------- GPU time

# A kernel that waits on the GPU: queued ahead of a timed batch, it keeps the
# GPU busy while the host enqueues the batch, so the events around the batch
# measure the kernels back to back, not the host's launch rate.
SPIN_SOURCE = r"""
extern "C" __global__ void bench_spin(unsigned long long ns) {
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    } while (t - t0 < ns);
}
"""


class GpuClock:
    """One library's CUDA events, synchronize and current stream, for GPU time.

    ``spin(ms)`` queues the spin kernel on the library's current stream (it is
    launched through tensorplay in both cases: one context, any stream)."""

    def __init__(self, lib, spin_kernel, stream_of=None):
        self.lib = lib
        self.spin_kernel = spin_kernel
        self._stream_of = stream_of or (lambda: None)

    def spin(self, ms):
        if self.spin_kernel is not None:
            self.spin_kernel(1, 1, [int(ms * 1e6)], stream=self._stream_of())

    def batch(self, fn, calls, spin_ms):
        """(GPU ms per call, host enqueue ms for the whole batch) of ``calls`` calls."""
        self.lib.cuda.synchronize()
        start = self.lib.cuda.Event(enable_timing=True)
        end = self.lib.cuda.Event(enable_timing=True)
        self.spin(spin_ms)
        start.record()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        host_ms = (time.perf_counter() - t0) * 1e3
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / calls, host_ms


def make_clocks(torch):
    """{library: GpuClock}; the spin kernel is None (and timed batches start
    with an empty queue) when it cannot be built."""
    try:
        spin = tp.cuda.RawKernel(SPIN_SOURCE, "bench_spin")
        spin(1, 1, [1000])
        tp.cuda.synchronize()
    except Exception as exc:
        print(f"no spin kernel ({type(exc).__name__}: {exc}); GPU times may include host launch gaps")
        spin = None
    clocks = {"tensorplay": GpuClock(tp, spin)}
    if torch is not None:
        def torch_stream():
            return tp.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream, device=torch.cuda.current_device())
        clocks["PyTorch"] = GpuClock(torch, spin, torch_stream)
    return clocks


def gpu_per_call(contenders, rounds, target_ms, min_calls=20, max_calls=100):
    """Median GPU time per call of each contender ``(name, fn, clock)``, in µs,
    with the median host enqueue time per call and whether the host fell
    behind the GPU in any round (the GPU may then have idled between calls).

    A calibration batch per contender picks the calls per round (enough for
    ``target_ms`` of GPU work, within [min_calls, max_calls]) and the spin
    (longer than the host needs to enqueue the batch); rounds then alternate
    between contenders so that drift affects them alike."""
    plan = {}
    for name, fn, clock in contenders:
        gpu_ms, host_ms = clock.batch(fn, min_calls, 5.0)
        calls = max(min_calls, min(max_calls, int(target_ms / max(gpu_ms, 1e-4))))
        spin_ms = min(50.0, max(0.5, 2.0 * host_ms / min_calls * calls + 0.2))
        plan[name] = (calls, spin_ms)
    gpu = {name: [] for name, _, _ in contenders}
    host = {name: [] for name, _, _ in contenders}
    behind = {name: False for name, _, _ in contenders}
    for _ in range(rounds):
        for name, fn, clock in contenders:
            calls, spin_ms = plan[name]
            gpu_ms, host_ms = clock.batch(fn, calls, spin_ms)
            gpu[name].append(gpu_ms * 1e3)
            host[name].append(host_ms / calls * 1e3)
            behind[name] |= clock.spin_kernel is None or host_ms > spin_ms
    return {name: (statistics.median(gpu[name]), statistics.median(host[name]), behind[name])
            for name, _, _ in contenders}


# ---------------------------------------------------------------- the peers' graphs

def torch_graph(torch, build):
    """(a torch.cuda.CUDAGraph of ``build()``, what the captured call
    returned), warmed up first on a side stream as PyTorch's docs ask."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        build()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = build()
    return g, out


def cuda_core_graph(n, ptr, stream_handle=None):
    """(cuda.core graph of ``n`` one-thread kernels each adding 1 to the float
    at ``ptr``, uploaded, the cuda.core stream it launches on): that stream
    wraps ``stream_handle``, or is a new one."""
    try:
        from cuda.core import Device, LaunchConfig, Program, ProgramOptions, Stream, launch
    except ImportError:
        from cuda.core.experimental import Device, LaunchConfig, Program, ProgramOptions, Stream, launch
    dev = Device(tp.cuda.current_device())
    dev.set_current()
    prog = Program('extern "C" __global__ void inc(float* x) { x[0] += 1.0f; }', code_type="c++",
                   options=ProgramOptions(arch=f"sm_{dev.arch}"))
    ker = prog.compile("cubin").get_kernel("inc")
    st = dev.create_stream() if stream_handle is None else Stream.from_handle(stream_handle)
    gb = st.create_graph_builder()
    gb.begin_building()
    for _ in range(n):
        launch(gb, LaunchConfig(grid=1, block=1), ker, np.uintp(ptr))
    graph = gb.end_building().complete()
    graph.upload(st)
    return graph, st


def cupy_graph(cp, n, stream):
    """(CuPy graph of ``n`` in-place ``+= 1`` on one float, captured on the
    CuPy ``stream`` and uploaded, that float): the graph writes the float,
    so whoever launches it keeps the float too."""
    cx = cp.zeros(1, dtype=cp.float32)
    cx += 1
    with stream:
        stream.begin_capture()
        for _ in range(n):
            cx += 1
        cg = stream.end_capture()
    if hasattr(cg, "upload"):
        cg.upload(stream)
    return cg, cx


@functools.cache
def build_cloop():
    """Compile benchmarks/_cloop.pyx against cuda.bindings' cydriver (once a process)."""
    import cuda.bindings
    import cuda.pathfinder
    from Cython.Build import cythonize
    from setuptools import Distribution, Extension
    inc = cuda.pathfinder.find_nvidia_header_directory("cudart")
    root = os.path.dirname(os.path.dirname(os.path.dirname(cuda.bindings.__file__)))
    build = tempfile.mkdtemp(prefix="tp_cloop_")
    ext = Extension("_cloop", [os.path.join(BENCHMARKS, "_cloop.pyx")], include_dirs=[inc], language="c++")
    exts = cythonize([ext], include_path=[root], build_dir=build, quiet=True,
                     compiler_directives={"language_level": 3})
    dist = Distribution({"ext_modules": exts})
    cmd = dist.get_command_obj("build_ext")
    cmd.build_lib = build
    cmd.build_temp = build
    cmd.ensure_finalized()
    cmd.run()
    sys.path.insert(0, build)
    import _cloop
    return _cloop


# ---------------------------------------------------------------- memory

def mib(nbytes):
    return nbytes / MIB


def size_label(nbytes):
    return f"{nbytes // MIB} MiB" if nbytes >= MIB else f"{nbytes >> 10} KiB"


def settle(lib):
    """Free what nothing references, empty the library's cache and return its
    reserved bytes: the baseline a memory figure is measured from."""
    gc.collect()
    lib.cuda.synchronize()
    lib.cuda.empty_cache()
    lib.cuda.synchronize()
    return lib.cuda.memory_reserved()


# ---------------------------------------------------------------- checks against PyTorch

# Largest error allowed, relative to the largest magnitude of PyTorch's
# result: rounding of the output dtype and a different summation order pass,
# a wrong layout, transpose or epilogue does not.
TOLERANCE = {"float64": 1e-9, "float32": 1e-4, "tf32": 4e-3, "float16": 4e-3, "bfloat16": 2e-2}


def as_torch(x, torch):
    """A tensorplay CUDA tensor as a torch tensor (DLPack, no copy), or
    through the host where DLPack fails."""
    try:
        return torch.from_dlpack(x)
    except Exception:
        return torch.from_numpy(np.asarray(x.cpu().numpy(), dtype=np.float64)).cuda()


def relative_error(got, want, torch):
    """max |got - want| / max |want| (inf for a shape mismatch); ``got`` is a
    tensorplay or torch tensor, ``want`` a torch tensor."""
    if not isinstance(got, torch.Tensor):
        got = as_torch(got, torch)
    if tuple(got.shape) != tuple(want.shape):
        return math.inf
    got, want = got.double(), want.to(got.device).double()
    scale = want.abs().max().item() or 1.0
    return (got - want).abs().max().item() / scale


def check_against(got, want, tolerance, torch):
    """None when ``got`` agrees with torch's ``want``, else why not (a row's error)."""
    err = relative_error(got, want, torch)
    if err <= tolerance:
        return None
    return f"wrong result: max error {err:.2e} of the largest value (tolerance {tolerance:.0e}); not timed"


def to_library(lib, array, dtype):
    """A float32 NumPy array as a CUDA tensor of ``lib`` with ``dtype`` (cast on the device)."""
    return lib.from_numpy(array).to("cuda").to(getattr(lib, dtype))


# ---------------------------------------------------------------- setup

def gpu_and_torch(why_torch: str, missing_torch_exit: int = 1) -> tuple[Any, int | None]:
    """(torch, None) when a CUDA GPU and PyTorch are here; else (None, exit
    code) after saying what is missing in one line: 0 without a GPU (nothing
    to measure on this machine), ``missing_torch_exit`` (1 unless told)
    without PyTorch (``why_torch`` says why it is needed)."""
    if not tp.cuda.is_available():
        print(f"no GPU: {tp.cuda.unavailable_reason()}")
        return None, 0
    try:
        import torch
    except ImportError:
        print(f"PyTorch is needed: {why_torch}")
        return None, missing_torch_exit
    return torch, None


def decode_loop_module():
    """examples/decode_loop.py, imported from its folder (it is no package)."""
    sys.path.insert(0, EXAMPLES)
    try:
        import decode_loop
    finally:
        sys.path.remove(EXAMPLES)
    return decode_loop


def run_fresh(case, args, env=None):
    """Run the Python source ``case`` with ``args`` (strings) in a fresh
    interpreter, from benchmarks/, in ``env`` (default this one's); return
    (the dict it printed as ``RESULT<json>``, None), or (None, its output's
    tail) when it printed none."""
    p = subprocess.run([sys.executable, "-c", case, *args], capture_output=True, text=True, env=env,
                       cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    for line in p.stdout.splitlines():
        if line.startswith("RESULT"):
            return json.loads(line[6:]), None
    return None, (p.stdout[-400:] + p.stderr[-800:])
