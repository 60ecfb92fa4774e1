# SPDX-License-Identifier: Apache-2.0
"""Section ``random``: GPU time of rand, randn and exponential_ of 64 Mi float32
against PyTorch's, and the host time per replay of a graph with a random op in it.
"""

from __future__ import annotations

import gc
import math

import numpy as np

import tensorplay as tp
from tpbench.common import (MI, batch_of, gpu_per_call, guarded, interleaved_host, make_clocks, record,
                            set_speed, torch_graph)

RANDOM_N = 64 * MI            # rand / randn GPU time
RANDOM_GRAPH_N = 1 * MI       # the graph whose replay host time is measured


def _moments_error(y, mean, std):
    """None when ``y`` (a tensor of either library) has about the mean and
    standard deviation of its distribution, else why not. The values differ
    from PyTorch's by design (other generators), so they are not compared."""
    m, s = float(y.mean().item()), float(y.std().item())
    if abs(m - mean) > 1e-3 or abs(s - std) > 1e-3:
        return f"wrong distribution: mean {m:.5f} (want {mean:.5f}), std {s:.5f} (want {std:.5f}); not timed"
    return None


RANDOM_DRAWS = ("rand 64Mi float32", "randn 64Mi float32", "exponential_ 64Mi float32 (no target)")


def random_rows(quick, torch, repeats, calls):
    """rand, randn and exponential_ of 64 Mi float32: GPU time per call against PyTorch's
    (CUDA events around back-to-back calls, as the work section; each
    library's output checked for its distribution's moments first). Then the
    host time per replay of a graph drawing ``x = rand(1 Mi) * 2``, beside
    the same graph without the random op: PyTorch's replay first updates its
    generator's offset on the host and copies it to the device, tensorplay's
    kernels advance the offset on the device themselves."""
    random_draw_rows(quick, torch)
    random_replay_rows(torch, repeats, calls)


def random_draw_rows(quick, torch, cases=RANDOM_DRAWS):
    """GPU time per call of the draws named in ``cases`` (of RANDOM_DRAWS), both libraries."""
    section = "random"
    clocks = make_clocks(torch)
    rounds, target_ms = (5, 10.0) if quick else (15, 25.0)
    n = RANDOM_N
    libraries = [("tensorplay", tp)] + ([("PyTorch", torch)] if torch is not None else [])

    def drawing(fname):
        return lambda lib, g: (lambda: getattr(lib, fname)(n, device="cuda", generator=g))

    def exponential(lib, g):
        x = lib.empty(n, device="cuda")
        return lambda: x.exponential_(generator=g)

    draws = dict(zip(RANDOM_DRAWS, ((drawing("rand"), 0.5, 1 / math.sqrt(12)), (drawing("randn"), 0.0, 1.0),
                                    (exponential, 1.0, 1.0))))
    for case in cases:
        make, mean, std = draws[case]
        fns = {}
        for name, lib in libraries:
            @guarded(section, case, name)
            def _build():
                gen = lib.Generator("cuda").manual_seed(0)
                fn = make(lib, gen)
                for _ in range(3):                     # compile, plan, fill caches
                    y = fn()
                lib.cuda.synchronize()
                wrong = _moments_error(y, mean, std)
                if wrong:
                    raise RuntimeError(wrong)
                fns[name] = fn
        timed = gpu_per_call([(name, fn, clocks[name]) for name, fn in fns.items()], rounds, target_ms)
        for name, (gpu_us, host_us, behind) in timed.items():
            record(section, case, name, host_us=host_us, gpu_us=gpu_us, rate=n * 4 / gpu_us / 1e3, unit="GB/s",
                   note="host fell behind: GPU may have idled" if behind else None)
        if len(timed) == 2:
            set_speed(section, case, timed["PyTorch"][0] / timed["tensorplay"][0])
        gc.collect()


def random_replay_rows(torch, repeats, calls):
    """Host time per replay of a graph drawing ``x = rand(1 Mi) * 2`` and of the same graph without it."""
    section = "random"
    m = RANDOM_GRAPH_N
    for case, with_random in ((f"replay host time: x = rand({m // MI}Mi) * 2", True),
                              (f"replay host time: x = y * 2 ({m // MI}Mi, no random op)", False)):
        contenders = []

        @guarded(section, case, "tensorplay replay()")
        def _tp_graph():
            gen = tp.Generator("cuda").manual_seed(1)
            src = tp.ones(m, device="cuda")

            def step():
                return (tp.rand(m, device="cuda", generator=gen) if with_random else src) * 2
            step()                                     # compile and plan before the capture
            tp.cuda.synchronize()
            g = tp.cuda.CUDAGraph()
            with tp.cuda.graph(g):
                out = step()
            g.replay()
            first = out.cpu().numpy().copy()
            g.replay()
            if with_random and np.array_equal(first, out.cpu().numpy()):
                raise RuntimeError("two replays drew the same numbers; not timed")
            contenders.append(("tensorplay replay()", batch_of(g.replay), tp.cuda.synchronize))

        @guarded(section, case, "PyTorch CUDAGraph.replay()")
        def _torch_graph():
            src = torch.ones(m, device="cuda")

            def step():
                return (torch.rand(m, device="cuda") if with_random else src) * 2
            tg, _ = torch_graph(torch, step)
            contenders.append(("PyTorch CUDAGraph.replay()", batch_of(tg.replay), torch.cuda.synchronize))

        if contenders:
            host = interleaved_host(contenders, calls, repeats)
            for name, _, _ in contenders:
                record(section, case, name, host_us=host[name])
            if len(host) == 2:
                speed = host["PyTorch CUDAGraph.replay()"] / host["tensorplay replay()"]
                set_speed(section, case, speed)
        gc.collect()
