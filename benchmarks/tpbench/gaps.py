# SPDX-License-Identifier: Apache-2.0
"""Section ``gaps``: GPU time per replay of graphs of dependent kernels,
tensorplay with programmatic dependent launch (PDL) on and off beside
PyTorch's graphs; the cases, the floors for Nsight Compute and gaps.py's
table (gaps.py's docstring describes each case).

The cases add their rows to this module's ``RESULTS`` (gaps.py's JSON);
``gap_rows`` runs them as compare.py's ``gaps`` section, copying them into
``common.RESULTS``.
"""

from __future__ import annotations

import csv

import numpy as np

import tensorplay as tp
from tpbench import common

KI, MI = common.KI, common.MI
RESULTS: list[dict] = []
INC_SOURCE = 'extern "C" __global__ void inc(float* x) { if (threadIdx.x == 0) x[0] += 1.0f; }'
INC_WAITING_SOURCE = r"""extern "C" __global__ void inc_waiting(float* x) {
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  x[0] += 1.0f;
}"""
GELU = tp.ElementwiseKernel(
    "T x", "T y", "y = 0.5f * x * (1.0f + tanhf(0.7978845608f * (x + 0.044715f * x * x * x)))", "gaps_gelu")


def add_row(section, case, library, gpu_us, per=None, note=None, error=None):
    RESULTS.append({"section": section, "case": case, "library": library, "gpu_us": gpu_us,
                    "per_node_us": None if gpu_us is None or not per else gpu_us / per,
                    "note": note, "error": error, "floor_us": None})


def tp_graph(build, pdl):
    """A tensorplay graph of ``build()`` captured with PDL on or off (after one eager warm-up)."""
    with tp.backends.cuda.pdl.flags(enabled=pdl):
        build()
        tp.cuda.synchronize()
        g = tp.cuda.CUDAGraph()
        with tp.cuda.graph(g):
            build()
        g.replay()
        tp.cuda.synchronize()
    return g


def torch_graph(torch, build):
    """PyTorch's graph of ``build()`` (common.torch_graph), replayed once."""
    g, _ = common.torch_graph(torch, build)
    g.replay()
    torch.cuda.synchronize()
    return g


def measure(section, case, contenders, clocks, rounds, per=None):
    """Time each (name, replay, library) and add a row; contenders that
    failed to build arrive as (name, None, error)."""
    ok = [(name, fn, clocks[lib]) for name, fn, lib in contenders if fn is not None]
    for name, fn, err in contenders:
        if fn is None:
            add_row(section, case, name, None, error=err)
    if not ok:
        return {}
    timed = common.gpu_per_call(ok, rounds, target_ms=20.0, min_calls=3, max_calls=200)
    torch_us = timed.get("PyTorch", (None,))[0]
    for name, (gpu, _host, _behind) in timed.items():
        note = f"{gpu / torch_us:.2f}x PyTorch" if torch_us and name.startswith("tensorplay") else None
        add_row(section, case, name, gpu, per, note)
    return {name: v[0] for name, v in timed.items()}


def guard(contenders, name, lib, make):
    try:
        contenders.append((name, make(), lib))
    except Exception as exc:          # a peer missing or failing is reported, not fatal
        contenders.append((name, None, f"{type(exc).__name__}: {exc}"[:200]))


# ---------------------------------------------------------------- cases

def tiny_case(torch, clocks, rounds, n=100):
    x = tp.zeros(1, device="cuda")
    inc = tp.RawKernel(INC_SOURCE, "inc")
    inc_waiting = tp.RawKernel(INC_WAITING_SOURCE, "inc_waiting", pdl=True)
    contenders = []
    for pdl in (True, False):
        guard(contenders, f"tensorplay add_ (PDL {'on' if pdl else 'off'})", "tensorplay",
              lambda: tp_graph(lambda: [x.add_(1) for _ in range(n)], pdl).replay)
    guard(contenders, "tensorplay RawKernel, 1 thread", "tensorplay",
          lambda: tp_graph(lambda: [inc(1, 1, (x,)) for _ in range(n)], False).replay)
    guard(contenders, "tensorplay RawKernel, 256 threads", "tensorplay",
          lambda: tp_graph(lambda: [inc(1, 256, (x,)) for _ in range(n)], False).replay)
    guard(contenders, "tensorplay RawKernel, 1 thread, waits (PDL)", "tensorplay",
          lambda: tp_graph(lambda: [inc_waiting(1, 1, (x,)) for _ in range(n)], True).replay)
    guard(contenders, "tensorplay RawKernel, 1 thread, waits (PDL off)", "tensorplay",
          lambda: tp_graph(lambda: [inc_waiting(1, 1, (x,)) for _ in range(n)], False).replay)
    if torch is not None:
        tx = torch.zeros(1, device="cuda")
        guard(contenders, "PyTorch", "PyTorch", lambda: torch_graph(torch, lambda: [tx.add_(1) for _ in range(n)]).replay)

    def cupy_graph():
        import cupy as cp
        st = cp.cuda.ExternalStream(tp.cuda.current_stream().handle)
        cg, cx = common.cupy_graph(cp, n, st)
        return lambda cx=cx: cg.launch(st)
    guard(contenders, "CuPy +=", "tensorplay", cupy_graph)

    def core_graph():
        graph, st = common.cuda_core_graph(n, x.data_ptr(), tp.cuda.current_stream().handle)
        return lambda: graph.launch(st)
    guard(contenders, "cuda.core 1-thread kernel", "tensorplay", core_graph)
    measure("tiny", f"{n} nodes, 1 float", contenders, clocks, rounds, per=n)


def chain_ops(x, n):
    for k in range(n):
        if k % 2:
            x.add_(1e-3)
        else:
            x.mul_(0.999)


def chains_case(torch, clocks, rounds, lengths, sizes):
    for nbytes in sizes:
        for n in lengths:
            case = f"{n} ops, {common.size_label(nbytes)}"
            x = tp.ones(nbytes // 4, device="cuda")
            contenders = []
            for pdl in (True, False):
                guard(contenders, f"tensorplay (PDL {'on' if pdl else 'off'})", "tensorplay",
                      lambda x=x, pdl=pdl: tp_graph(lambda: chain_ops(x, n), pdl).replay)
            if torch is not None:
                tx = torch.ones(nbytes // 4, device="cuda")
                guard(contenders, "PyTorch", "PyTorch",
                      lambda tx=tx: torch_graph(torch, lambda: chain_ops(tx, n)).replay)
            measure("chains", case, contenders, clocks, rounds, per=n)
            del x
            if torch is not None:
                del tx
                torch.cuda.empty_cache()


def quickstart_case(torch, clocks, rounds):
    rng = np.random.default_rng(0)
    w_host = rng.standard_normal((256, 256)).astype(np.float32) / 16
    w, x = tp.tensor(w_host, device="cuda"), tp.zeros(256, device="cuda")

    def step(lib, w, x):
        h = x
        for _ in range(8):
            h = (w @ h).tanh() + 0.5 * h
        return h
    contenders = []
    for pdl in (True, False):
        guard(contenders, f"tensorplay (PDL {'on' if pdl else 'off'})", "tensorplay",
              lambda: tp_graph(lambda: step(tp, w, x), pdl).replay)
    if torch is not None:
        tw, tx = torch.tensor(w_host, device="cuda"), torch.zeros(256, device="cuda")
        guard(contenders, "PyTorch", "PyTorch", lambda: torch_graph(torch, lambda: step(torch, tw, tx)).replay)
    measure("quickstart", "8 layers, 256 x 256 float32", contenders, clocks, rounds, per=32)


def mlp_case(torch, clocks, rounds, width=1024, layers=4):
    rng = np.random.default_rng(1)
    ws = [(rng.standard_normal((width, width)) / np.sqrt(width)).astype(np.float32) for _ in range(layers)]
    bs = [(rng.standard_normal(width) * 0.1).astype(np.float32) for _ in range(layers)]
    tw = [tp.tensor(w, device="cuda").to(tp.bfloat16) for w in ws]
    tb = [tp.tensor(b, device="cuda").to(tp.bfloat16) for b in bs]

    def tp_step(h):
        for w, b in zip(tw, tb):
            h = GELU(h @ w + b) + h
        return h

    def tp_fused(h):
        for w, b in zip(tw, tb):
            h = tp.linear(h, w.T, b, activation="gelu") + h
        return h
    for batch in (1, 64):
        x = tp.tensor(rng.standard_normal((batch, width)).astype(np.float32), device="cuda").to(tp.bfloat16)
        contenders = []
        for pdl in (True, False):
            guard(contenders, f"tensorplay (PDL {'on' if pdl else 'off'})", "tensorplay",
                  lambda: tp_graph(lambda: tp_step(x), pdl).replay)
        guard(contenders, "tensorplay, bias+GELU in the matmul epilogue (PDL on)", "tensorplay",
              lambda: tp_graph(lambda: tp_fused(x), True).replay)
        if torch is not None:
            pw = [torch.tensor(w, device="cuda").to(torch.bfloat16) for w in ws]
            pb = [torch.tensor(b, device="cuda").to(torch.bfloat16) for b in bs]
            px = torch.tensor(x.to(tp.float32).numpy(), device="cuda").to(torch.bfloat16)

            def torch_step():
                h = px
                for w, b in zip(pw, pb):
                    h = torch.nn.functional.gelu(h @ w + b, approximate="tanh") + h
                return h
            guard(contenders, "PyTorch", "PyTorch", lambda: torch_graph(torch, torch_step).replay)
        measure("mlp", f"4 x {width} bf16, batch {batch}", contenders, clocks, rounds, per=4 * layers)


def while_case(clocks, rounds, n=1000, extra_ops=0):
    """A WHILE node of ``n`` iterations against the same bodies unrolled:
    each body adds 1 to a counter, runs ``extra_ops`` more elementwise ops on
    4 KiB, and sets the predicate (counter < n)."""
    c = tp.zeros(1, dtype=tp.int32, device="cuda")
    lim = tp.full((1,), n, dtype=tp.int32, device="cuda")
    p = tp.zeros(1, dtype=tp.bool, device="cuda")
    work = tp.ones(1024, device="cuda")

    def body():
        c.add_(1)
        chain_ops(work, extra_ops)
        tp.lt(c, lim, out=p)

    def unrolled():
        c.zero_()
        for _ in range(n):
            body()
    case = f"{n} iterations, {2 + extra_ops}-op body"
    contenders = []
    for pdl in (True, False):
        def make_while(pdl=pdl):
            with tp.backends.cuda.pdl.flags(enabled=pdl):
                body()
                g = tp.cuda.CUDAGraph()
                with tp.cuda.graph(g):
                    c.zero_()
                    tp.lt(c, lim, out=p)
                    with g.while_(p):
                        body()
                g.replay()
                assert c.item() == n
            return g.replay
        on = "on" if pdl else "off"
        guard(contenders, f"WHILE node (PDL {on})", "tensorplay", make_while)
        guard(contenders, f"unrolled (PDL {on})", "tensorplay", lambda pdl=pdl: tp_graph(unrolled, pdl).replay)
    times = measure("while", case, contenders, clocks, rounds, per=n)
    for on in ("on", "off"):
        w, u = times.get(f"WHILE node (PDL {on})"), times.get(f"unrolled (PDL {on})")
        if w and u:
            add_row("while", case, f"WHILE / unrolled (PDL {on})", None,
                    note=f"{w / u:.2f}x; the node's own cost {(w - u) / n:.2f} us an iteration")


def nested_case(clocks, rounds, children=10, ops=10):
    """A graph of ``children`` child graph nodes (one step of ``ops``
    elementwise ops on 4 KiB, captured once and replayed inside the outer
    capture) against the same work captured flat, PDL on and off; GPU us a
    replay."""
    x = tp.ones(1024, device="cuda")
    contenders = []
    for pdl in (True, False):
        on = "on" if pdl else "off"
        step = tp_graph(lambda: chain_ops(x, ops), pdl)
        contenders.append((f"flat graph (PDL {on})", tp_graph(lambda: chain_ops(x, children * ops), pdl).replay,
                           "tensorplay"))
        guard(contenders, f"graph of child graph nodes (PDL {on})", "tensorplay",
              lambda: tp_graph(lambda: [step.replay() for _ in range(children)], pdl).replay)
    measure("nested", f"{children} children of {ops} ops, 4 KiB", contenders, clocks, rounds, per=children * ops)


# ---------------------------------------------------------------- floors (Nsight Compute)

MARKER = 'extern "C" __global__ void gaps_marker_{k}() {{}}'


def floor_cases(quick):
    """(case id, build) for --floor: each builds and returns a replay callable."""
    cases = []
    x1 = tp.zeros(1, device="cuda")
    inc = tp.RawKernel(INC_SOURCE, "inc")
    cases.append(("tiny", lambda: tp_graph(lambda: [x1.add_(1) for _ in range(100)], False).replay))
    cases.append(("tiny RawKernel 1 thread", lambda: tp_graph(lambda: [inc(1, 1, (x1,)) for _ in range(100)], False).replay))
    for nbytes in (4 * KI, MI, 64 * MI):
        x = tp.ones(nbytes // 4, device="cuda")
        cases.append((f"chains 100 {common.size_label(nbytes)}",
                      lambda x=x: tp_graph(lambda: chain_ops(x, 100), False).replay))
    return cases


def run_floors(quick):
    for k, (case, build) in enumerate(floor_cases(quick)):
        replay = build()
        tp.cuda.synchronize()
        tp.RawKernel(MARKER.format(k=k), f"gaps_marker_{k}")(1, 1, ())
        replay()
        tp.cuda.synchronize()
        print(f"floor case {k}: {case}")


def floors_from(path, quick):
    """{case: summed kernel us} from ncu's CSV: kernels after marker k belong to case k."""
    names = [c for c, _ in floor_cases(quick)]
    sums: dict[str, float] = {}
    current = None
    with open(path) as f:
        lines = [line for line in f if line.startswith('"')]
    for row in csv.DictReader(lines):
        kernel = row.get("Kernel Name", "")
        if kernel.startswith("gaps_marker_"):
            current = names[int(kernel.rsplit("_", 1)[1])]
            continue
        if current is None or row.get("Metric Name") != "gpu__time_duration.sum":
            continue
        value = float(row["Metric Value"].replace(",", ""))
        unit = row.get("Metric Unit", "ns")
        sums[current] = sums.get(current, 0.0) + value * {"ns": 1e-3, "usecond": 1.0, "us": 1.0,
                                                          "msecond": 1e3, "nsecond": 1e-3}.get(unit, 1e-3)
    return sums


# ---------------------------------------------------------------- output

def print_gaps_table():
    print(f"{'section':<11} {'case':<30} {'contender':<52} {'GPU us':>10} {'us/node':>8}  note")
    for r in RESULTS:
        gpu = "-" if r["gpu_us"] is None else f"{r['gpu_us']:.1f}"
        per = "-" if r["per_node_us"] is None else f"{r['per_node_us']:.3f}"
        note = r["error"] or r["note"] or ""
        print(f"{r['section']:<11} {r['case']:<30} {r['library']:<52} {gpu:>10} {per:>8}  {note}")


SECTIONS = ("tiny", "chains", "quickstart", "mlp", "while", "nested")


def run(sections, quick, torch):
    clocks = common.make_clocks(torch)
    rounds = 5 if quick else 11
    if "tiny" in sections:
        tiny_case(torch, clocks, rounds)
    if "chains" in sections:
        chains_case(torch, clocks, rounds, (10, 100) if quick else (10, 100, 1000), (4 * KI, MI, 64 * MI))
    if "quickstart" in sections:
        quickstart_case(torch, clocks, rounds)
    if "mlp" in sections:
        mlp_case(torch, clocks, rounds)
    if "while" in sections:
        while_case(clocks, rounds)
        while_case(clocks, rounds, n=200, extra_ops=18)
    if "nested" in sections:
        nested_case(clocks, rounds)


def gap_rows(quick, torch):
    """gaps.py's cases (GPU time per replay, PDL on and off, beside PyTorch's
    graphs), as rows of section gaps; each tensorplay row's note gives its
    GPU time over PyTorch's."""
    with tp.cuda.stream(tp.cuda.Stream()):
        run(SECTIONS, quick, torch)
    for r in RESULTS:
        common.record("gaps", f"{r['section']}: {r['case']}", r["library"], gpu_us=r["gpu_us"], note=r["note"],
                      error=r["error"])
