# SPDX-License-Identifier: Apache-2.0
"""A state machine run to completion on the GPU: a SWITCH inside a WHILE.

Each iteration of the WHILE node picks the state's case with one SWITCH
node: state 0 halves an even x, state 1 maps an odd x to 3x + 1 (the Collatz
map), state 2 is the final state (x reached 1) and counts the finish. The next
state is computed on the device, so the whole run, however many steps it
takes, is one graph launch; the host version reads the state back after
every step to decide what to launch next.
Run:  python examples/state_machine.py
(in a clone: bash scripts/setup.sh, then .venv/bin/python in place of python)
"""

from __future__ import annotations

import sys
import time

import numpy as np

import tensorplay as tp

HALVE, TRIPLE, DONE = 0, 1, 2


def collatz_steps(x: int) -> int:
    steps = 0
    while x != 1:
        x = x // 2 if x % 2 == 0 else 3 * x + 1
        steps += 1
    return steps


def main() -> int:
    if not tp.cuda.is_available():
        print(f"No CUDA GPU here ({tp.cuda.unavailable_reason()}); this example needs one.")
        return 0
    x = tp.zeros(1, dtype=tp.int64, device="cuda")
    state = tp.zeros(1, dtype=tp.int64, device="cuda")
    steps = tp.zeros(1, dtype=tp.int64, device="cuda")
    finished = tp.zeros(1, dtype=tp.int64, device="cuda")
    running = tp.zeros(1, dtype=tp.bool, device="cuda")
    is_one = tp.zeros(1, dtype=tp.bool, device="cuda")

    def next_state() -> None:
        # DONE once x is 1, else HALVE or TRIPLE by parity
        tp.eq(x, 1, out=is_one)
        tp.where(is_one, DONE, tp.remainder(x, 2), out=state)
        tp.ne(state, DONE, out=running)

    def halve() -> None:
        tp.floor_divide(x, 2, out=x)

    def triple() -> None:
        x.mul_(3)
        x.add_(1)

    # warm up: compile and load every kernel once
    x.fill_(6)
    next_state()
    halve()
    triple()
    steps.add_(1)
    tp.cuda.synchronize()

    g = tp.cuda.CUDAGraph()
    with tp.cuda.graph(g):
        steps.zero_()
        finished.zero_()
        next_state()
        with g.while_(running):                       # until the DONE state
            with g.switch(state, 3) as cases:
                with cases[HALVE]:
                    halve()
                with cases[TRIPLE]:
                    triple()
            steps.add_(1)
            next_state()
        with g.switch(state, 3) as cases:             # the final state's own case
            with cases[DONE]:
                finished.add_(1)

    def run_graph(start: int) -> int:
        x.fill_(start)
        g.replay()
        return int(steps.item())

    def run_host(start: int) -> int:
        x.fill_(start)
        n = 0
        next_state()
        while True:
            s = int(state.item())                     # a host round trip per step
            if s == DONE:
                return n
            if s == HALVE:
                halve()
            else:
                triple()
            n += 1
            next_state()

    starts = [27, 97, 871, 6171, 77031]
    ok = True
    for start in starts:
        got, host, want = run_graph(start), run_host(start), collatz_steps(start)
        ok = ok and got == host == want and int(finished.item()) == 1
        print(f"start {start:>6}: {got:4d} steps on the device, {host:4d} from the host, expected {want}")
    print("same answers:", ok)

    times = {}
    for name, run in (("SWITCH in WHILE (one launch)", run_graph), ("host-driven steps", run_host)):
        samples = []
        for _ in range(5):
            t0 = time.perf_counter()
            run(starts[-1])
            samples.append(time.perf_counter() - t0)
        times[name] = float(np.median(samples))
        print(f"{name:>30}: {times[name] * 1e3:8.2f} ms per run of {collatz_steps(starts[-1])} steps")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
