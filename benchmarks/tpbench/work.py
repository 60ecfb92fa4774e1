# SPDX-License-Identifier: Apache-2.0
"""Section ``work``: GPU time per call of matmuls on cuBLASLt, linear with fused
epilogues, bandwidth-bound kernels and a small captured graph, beside PyTorch.

Each row is one ``WorkCase`` of ``WORK_CASES``: both libraries get the same
input values; tensorplay's result is checked against PyTorch's once before
the row is timed (CUDA events around back-to-back calls behind a spin
kernel, rounds alternating between the libraries).
"""

from __future__ import annotations

import gc

import numpy as np

import tensorplay as tp
from tpbench.common import (MI, TOLERANCE, check_against, gpu_per_call, guarded, make_clocks, record, set_speed,
                            to_library, torch_graph)


def _same(make):
    return {"tensorplay": make, "PyTorch": make}


def _matmul(lib, a, b):
    return lambda: lib.matmul(a, b)


def _matmul_operator(lib, a, b):
    return lambda: a @ b


def _mv(lib, a, v):
    return lambda: lib.mv(a, v)


def _add_out(lib, a, b):
    out = lib.empty_like(a)
    return lambda: lib.add(a, b, out=out)


def _sum(lib, a):
    return lambda: a.sum()


def _transpose_copy(lib, a):
    return lambda: a.transpose(0, 1).contiguous()


def _tp_linear(activation):
    def make(lib, x, w, b):
        return lambda: lib.linear(x, w, b, activation=activation)
    return make


def _torch_linear(activation):
    def make(lib, x, w, b):
        F = lib.nn.functional
        if activation is None:
            return lambda: F.linear(x, w, b)
        if activation == "relu":
            return lambda: F.relu(F.linear(x, w, b))
        return lambda: F.gelu(F.linear(x, w, b), approximate="tanh")    # cuBLASLt's GELU epilogue is tanh's
    return make


def _layers(x, w, layers):
    for _ in range(layers):
        x = (x @ w).relu() + x
    return x


def _replayer(g, y):
    """A work-row call: replay ``g``, return its output ``y``."""
    def replay():
        g.replay()
        return y
    return replay


def _tp_graph_layers(lib, x, w, layers=4):
    _layers(x, w, layers)                                   # compiles the kernels, makes the plans
    tp.cuda.synchronize()
    g = tp.cuda.CUDAGraph()
    with tp.cuda.graph(g):
        y = _layers(x, w, layers)
    return _replayer(g, y)


def _torch_graph_layers(torch, x, w, layers=4):
    g, y = torch_graph(torch, lambda: _layers(x, w, layers))
    return _replayer(g, y)


class WorkCase:
    """One row of the work section.

    ``shapes`` are the inputs' shapes (uniform in [low, 1), ``scale`` times,
    the same values for both libraries); ``ops`` maps a library name to
    ``make(lib, *inputs)``, which returns a call that does the work once and
    returns its result. ``flops`` gives TFLOP/s, else ``nbytes`` (bytes read
    and written) gives GB/s. ``tf32`` runs the row with TF32 matmuls allowed
    in both libraries."""

    def __init__(self, case, dtype, shapes, ops, flops=0, nbytes=0, low=-1.0, scale=1.0, tf32=False):
        self.case, self.dtype, self.shapes, self.ops = case, dtype, shapes, ops
        self.flops, self.nbytes, self.low, self.scale, self.tf32 = flops, nbytes, low, scale, tf32

    @property
    def tolerance(self):
        return TOLERANCE["tf32" if self.tf32 else self.dtype]

    def rate(self, gpu_us):
        """(value, unit) of the achieved rate for a GPU time per call."""
        if self.flops:
            return self.flops / gpu_us / 1e6, "TFLOP/s"
        return self.nbytes / gpu_us / 1e3, "GB/s"


def _gemm(m, n, k, dtype, tf32=False, batch=1, label=None):
    shapes = ((batch, m, k), (batch, k, n)) if batch > 1 else ((m, k), (k, n))
    size = f"{batch} x ({m}x{k} @ {k}x{n})" if batch > 1 else (f"{m}^2" if m == n == k else f"{m}x{k} @ {k}x{n}")
    case = label or f"matmul {size} {dtype}" + (" TF32" if tf32 else "")
    itemsize = np.dtype(dtype).itemsize if dtype != "bfloat16" else 2
    return WorkCase(case, dtype, shapes, _same(_matmul), flops=2 * batch * m * n * k, tf32=tf32,
                    nbytes=batch * (m * k + k * n + m * n) * itemsize)


def _linear(n, dtype, activation):
    name = {None: "linear + bias", "relu": "linear + bias + relu", "gelu": "linear + bias + gelu"}[activation]
    return WorkCase(f"{name} {n}^2 {dtype}", dtype, ((n, n), (n, n), (n,)),
                    {"tensorplay": _tp_linear(activation), "PyTorch": _torch_linear(activation)},
                    flops=2 * n * n * n)


WORK_CASES = [
    _gemm(4096, 4096, 4096, "float32"),
    _gemm(4096, 4096, 4096, "float32", tf32=True),
    _gemm(4096, 4096, 4096, "bfloat16"),
    _gemm(4096, 4096, 4096, "float16"),
    _gemm(1024, 1024, 1024, "bfloat16"),
    _gemm(2048, 2048, 2048, "bfloat16"),
    _gemm(8192, 8192, 8192, "bfloat16"),
    WorkCase("a @ b 4096^2 bf16 (operator)", "bfloat16", ((4096, 4096), (4096, 4096)), _same(_matmul_operator),
             flops=2 * 4096 ** 3),
    # GEMV: bound by reading the matrix, so GB/s
    WorkCase("matmul 1x4096 @ 4096x4096 float32 (GEMV)", "float32", ((1, 4096), (4096, 4096)), _same(_matmul),
             nbytes=(4096 + 4096 * 4096 + 4096) * 4),
    WorkCase("mv 4096x4096 @ 4096 float32", "float32", ((4096, 4096), (4096,)), _same(_mv),
             nbytes=(4096 + 4096 * 4096 + 4096) * 4),
    _gemm(512, 512, 64, "bfloat16", batch=32),
    _linear(4096, "bfloat16", None),
    _linear(4096, "bfloat16", "relu"),
    _linear(4096, "bfloat16", "gelu"),
    WorkCase("add 64Mi float32, out=", "float32", ((64 * MI,), (64 * MI,)), _same(_add_out), nbytes=3 * 64 * MI * 4),
    WorkCase("sum 64Mi float32", "float32", ((64 * MI,),), _same(_sum), nbytes=64 * MI * 4, low=0.0),
    WorkCase("transpose copy 8192^2 float32", "float32", ((8192, 8192),), _same(_transpose_copy),
             nbytes=2 * 8192 * 8192 * 4),
    # weights read per replay (4 layers of 1024x1024 float32), so GB/s
    WorkCase("graph replay: 4 x ((x @ w).relu() + x), 1x1024 @ 1024^2 float32", "float32",
             ((1, 1024), (1024, 1024)), {"tensorplay": _tp_graph_layers, "PyTorch": _torch_graph_layers},
             nbytes=4 * 1024 * 1024 * 4, scale=1 / 32),
]


def host_inputs(case, seed):
    """The case's inputs as float32 NumPy arrays, the same for every library."""
    rng = np.random.default_rng(seed)
    return [(rng.random(shape, dtype=np.float32) * (1 - case.low) + case.low) * np.float32(case.scale)
            for shape in case.shapes]


class _Tf32:
    """Sets TF32 matmuls on (``enabled``) or off in both libraries for a row,
    and restores the previous settings on exit. ``tp_error`` says why
    tensorplay's switch could not be set (its row is then not measured)."""

    def __init__(self, enabled, torch):
        self.enabled, self.torch, self.saved, self.tp_error = enabled, torch, [], None

    def _set(self, holder):
        self.saved.append((holder, holder.allow_tf32))
        holder.allow_tf32 = self.enabled

    def __enter__(self):
        if self.torch is not None:
            self._set(self.torch.backends.cuda.matmul)
        try:
            self._set(tp.backends.cuda.matmul)
        except AttributeError as exc:
            if self.enabled:                # off is tensorplay's default: nothing to set
                self.tp_error = f"cannot allow TF32 in tensorplay: {exc}"
        return self

    def __exit__(self, *exc):
        for holder, value in reversed(self.saved):
            holder.allow_tf32 = value
        return False


def work_rows(quick, torch, cases=None):
    """GPU time per call of each WORK_CASES row in both libraries, from CUDA
    events around back-to-back calls; tensorplay's result checked against
    PyTorch's once per row before it is timed."""
    clocks = make_clocks(torch)
    rounds, target_ms = (5, 10.0) if quick else (15, 25.0)
    for seed, case in enumerate(WORK_CASES if cases is None else cases):
        work_case(case, seed, clocks, rounds, target_ms, torch)
        gc.collect()


def work_case(case, seed, clocks, rounds, target_ms, torch):
    arrays = host_inputs(case, seed)
    libraries = [("tensorplay", tp)] + ([("PyTorch", torch)] if torch is not None else [])
    with _Tf32(case.tf32, torch) as tf32:
        calls, errors = {}, {}
        for name, lib in libraries:
            @guarded("work", case.case, name)
            def _build():
                if name == "tensorplay" and tf32.tp_error:
                    raise RuntimeError(tf32.tp_error)
                inputs = [to_library(lib, a, case.dtype) for a in arrays]
                fn = case.ops[name](lib, *inputs)
                for _ in range(3):                 # compile, plan, fill caches
                    fn()
                lib.cuda.synchronize()
                calls[name] = fn
        if "tensorplay" in calls and "PyTorch" in calls:
            try:
                wrong = check_against(calls["tensorplay"](), calls["PyTorch"](), case.tolerance, torch)
            except Exception as exc:     # an unchecked result is not timed either
                wrong = f"check failed: {type(exc).__name__}: {exc}"[:200]
            if wrong:
                errors["tensorplay"] = wrong
                del calls["tensorplay"]
        elif "tensorplay" in calls:
            errors["tensorplay"] = "unchecked (no PyTorch)"
        for name, msg in errors.items():
            if name not in calls:
                record("work", case.case, name, error=msg)
        timed = gpu_per_call([(name, fn, clocks[name]) for name, fn in calls.items()], rounds, target_ms)
    for name, (gpu_us, host_us, behind) in timed.items():
        rate, unit = case.rate(gpu_us)
        note = [errors[name]] if name in errors else []
        if behind:
            note.append("host fell behind: GPU may have idled")
        record("work", case.case, name, host_us=host_us, gpu_us=gpu_us, rate=rate, unit=unit,
               note="; ".join(note) or None)
    if "tensorplay" in timed and "PyTorch" in timed:
        set_speed("work", case.case, timed["PyTorch"][0] / timed["tensorplay"][0])
