# SPDX-License-Identifier: Apache-2.0
"""GPU time of elementwise ops, reductions and copies, tensorplay beside PyTorch.

Run from benchmarks/ on the GPU machine::

    python probe_kernels.py --out probe.json [--calls 50] [--repeats 7] [--only add,sum]

Each case is timed by CUDA events (each library's own) around ``--calls``
back-to-back calls on the legacy default stream, after a warm-up; the figure
is the median over ``--repeats`` such windows, divided by the number of
calls. GB/s counts the bytes each op must move (reads of every input element
plus writes of every output element). Results are checked against each other
once (float tolerance) so a fast wrong kernel does not pass unnoticed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

import numpy as np

import tensorplay as tp
from tpbench.common import gpu_and_torch

MI = 1 << 20
N = 64 * MI
SIDE = 8192


def gpu_us(fn, event_cls, sync, calls, repeats):
    """Median GPU microseconds per call of ``fn`` over ``repeats`` windows of ``calls``."""
    for _ in range(5):
        fn()
    sync()
    times = []
    for _ in range(repeats):
        start, end = event_cls(enable_timing=True), event_cls(enable_timing=True)
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000.0 / calls)
    return statistics.median(times)


def cases(torch):
    """(name, bytes moved, tensorplay setup, PyTorch setup): each setup returns
    (callable, result getter)."""
    rng = np.random.default_rng(0)
    flat = rng.standard_normal(N, dtype=np.float32)
    square = flat.reshape(SIDE, SIDE)

    def tp_t(a, dtype=None):
        t = tp.tensor(a, device="cuda")
        return t if dtype is None else t.to(dtype)

    def th_t(a, dtype=None):
        t = torch.from_numpy(a).cuda()
        return t if dtype is None else t.to(dtype)

    out = []

    def add(lib, dtype):
        def make():
            if lib == "tp":
                d = tp.float32 if dtype == "float32" else tp.bfloat16
                x, y = tp_t(flat, d), tp_t(flat[::-1].copy(), d)
                o = tp.empty(N, dtype=d, device="cuda")
                return (lambda: tp.add(x, y, out=o)), (lambda: o)
            d = torch.float32 if dtype == "float32" else torch.bfloat16
            x, y = th_t(flat, d), th_t(flat[::-1].copy(), d)
            o = torch.empty(N, dtype=d, device="cuda")
            return (lambda: torch.add(x, y, out=o)), (lambda: o)
        return make

    size = {"float32": 4, "bfloat16": 2}
    for dtype in ("float32", "bfloat16"):
        out.append((f"add 64Mi {dtype} out=", 3 * N * size[dtype], add("tp", dtype), add("torch", dtype)))

    def unary(lib, fn_name):
        def make():
            if lib == "tp":
                x = tp_t(flat)
                o = tp.empty(N, dtype=tp.float32, device="cuda")
                f = {"mul": lambda: tp.mul(x, 1.5, out=o), "relu": lambda: tp.relu(x, out=o)}[fn_name]
                return f, (lambda: o)
            x = th_t(flat)
            o = torch.empty(N, dtype=torch.float32, device="cuda")
            f = {"mul": lambda: torch.mul(x, 1.5, out=o), "relu": lambda: torch.clamp_min(x, 0, out=o)}[fn_name]
            return f, (lambda: o)
        return make

    out.append(("mul 64Mi fp32 by scalar out=", 2 * N * 4, unary("tp", "mul"), unary("torch", "mul")))
    out.append(("relu 64Mi fp32 out=", 2 * N * 4, unary("tp", "relu"), unary("torch", "relu")))

    def reduction(lib, op, dim, data):
        def make():
            if lib == "tp":
                x = tp_t(data)
                fn = {"sum": tp.sum, "mean": tp.mean, "amax": tp.amax}[op]
            else:
                x = th_t(data)
                fn = {"sum": torch.sum, "mean": torch.mean, "amax": torch.amax}[op]
            box = [None]

            def call():
                box[0] = fn(x) if dim is None else fn(x, dim)
            return call, (lambda: box[0])
        return make

    out.append(("sum 64Mi fp32 (full)", N * 4, reduction("tp", "sum", None, flat),
                reduction("torch", "sum", None, flat)))
    out.append(("sum(dim=1) 8192x8192 fp32", N * 4, reduction("tp", "sum", 1, square),
                reduction("torch", "sum", 1, square)))
    out.append(("sum(dim=0) 8192x8192 fp32", N * 4, reduction("tp", "sum", 0, square),
                reduction("torch", "sum", 0, square)))
    out.append(("mean 64Mi fp32 (full)", N * 4, reduction("tp", "mean", None, flat),
                reduction("torch", "mean", None, flat)))
    out.append(("amax 64Mi fp32 (full)", N * 4, reduction("tp", "amax", None, flat),
                reduction("torch", "amax", None, flat)))

    def copy(lib, kind):
        def make():
            if lib == "tp":
                x = tp_t(square)
                if kind == "transpose":
                    o = tp.empty(SIDE, SIDE, dtype=tp.float32, device="cuda")
                    return (lambda: o.copy_(x.T)), (lambda: o)
                o = tp.empty(SIDE, SIDE // 2, dtype=tp.float32, device="cuda")
                v = x[:, ::2]
                return (lambda: o.copy_(v)), (lambda: o)
            x = th_t(square)
            if kind == "transpose":
                o = torch.empty(SIDE, SIDE, dtype=torch.float32, device="cuda")
                return (lambda: o.copy_(x.t())), (lambda: o)
            o = torch.empty(SIDE, SIDE // 2, dtype=torch.float32, device="cuda")
            v = x[:, ::2]
            return (lambda: o.copy_(v)), (lambda: o)
        return make

    out.append(("transpose copy 8192^2 fp32", 2 * N * 4, copy("tp", "transpose"), copy("torch", "transpose")))
    out.append(("contiguous() of x[:, ::2] 8192^2 fp32", N * 4, copy("tp", "stride"), copy("torch", "stride")))
    return out


def to_numpy(r):
    if hasattr(r, "detach"):
        r = r.detach()
        if r.dtype.is_floating_point and r.element_size() == 2:
            r = r.float()
        return r.cpu().numpy()
    if r.dtype in (tp.bfloat16, tp.float16):
        r = r.to(tp.float32)
    return np.asarray(r.numpy())


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="probe_kernels.json")
    ap.add_argument("--calls", type=int, default=50)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--only", default="", help="comma-separated substrings of case names")
    args = ap.parse_args()
    torch, exit_code = gpu_and_torch("the kernels are compared with PyTorch's")
    if torch is None:
        return exit_code
    rows = []
    print(f"{'case':42s} {'tp us':>9s} {'torch us':>9s} {'tp GB/s':>8s} {'torch GB/s':>10s} {'tp/torch':>8s} check")
    only = [s.strip() for s in args.only.split(",") if s.strip()]
    for name, nbytes, make_tp, make_th in cases(torch):
        if only and not any(s in name for s in only):
            continue
        f_tp, get_tp = make_tp()
        f_th, get_th = make_th()
        t_tp = gpu_us(f_tp, tp.cuda.Event, tp.cuda.synchronize, args.calls, args.repeats)
        t_th = gpu_us(f_th, torch.cuda.Event, torch.cuda.synchronize, args.calls, args.repeats)
        a, b = to_numpy(get_tp()), to_numpy(get_th())
        ok = a.shape == b.shape and bool(np.allclose(a, b, rtol=2e-2 if "bf16" in name or "bfloat16" in name
                                                      else 1e-4, atol=1e-2))
        row = {"case": name, "bytes": nbytes, "tensorplay_us": t_tp, "torch_us": t_th,
               "tensorplay_GBps": nbytes / t_tp / 1e3, "torch_GBps": nbytes / t_th / 1e3,
               "ratio": t_tp / t_th, "values_match": ok}
        rows.append(row)
        print(f"{name:42s} {t_tp:9.1f} {t_th:9.1f} {row['tensorplay_GBps']:8.0f} {row['torch_GBps']:10.0f} "
              f"{row['ratio']:8.3f} {'ok' if ok else 'MISMATCH'}", flush=True)
        del f_tp, get_tp, f_th, get_th
        torch.cuda.empty_cache()
    meta = {"device": tp.cuda.get_device_name(0) if hasattr(tp.cuda, "get_device_name") else None,
            "torch": torch.__version__, "tensorplay": getattr(tp, "__version__", None),
            "calls": args.calls, "repeats": args.repeats}
    with open(args.out, "w") as fh:
        json.dump({"meta": meta, "rows": rows}, fh, indent=1)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
