# SPDX-License-Identifier: Apache-2.0
"""Sections ``while`` and ``branch``: control flow on the device against the host.

- while: a loop until a device-side condition, as one WHILE node, as a
  host loop reading the predicate, and unrolled in a static graph (latency
  per whole loop);
- branch: an if/else as one IF/ELSE node, two IF nodes and host branching;
  a SWITCH of 8 cases, 8 IF nodes and host dispatch (latency per replay).
"""

from __future__ import annotations

import tensorplay as tp
from tpbench.common import latency, record


# ---------------------------------------------------------------- while

def while_rows(iterations, repeats):
    sync = tp.cuda.synchronize
    for n in iterations:
        case = f"{n} iterations"
        c = tp.zeros(1, dtype=tp.int32, device="cuda")
        lim = tp.full((1,), n, dtype=tp.int32, device="cuda")
        p = tp.zeros(1, dtype=tp.bool, device="cuda")
        c.add_(1)
        tp.lt(c, lim, out=p)
        g = tp.cuda.CUDAGraph()
        with tp.cuda.graph(g):
            c.zero_()
            tp.lt(c, lim, out=p)
            g.begin_capture_to_while_node(p)
            c.add_(1)
            tp.lt(c, lim, out=p)
            g.end_capture_to_conditional_node()
        g.replay()
        assert c.item() == n
        record("while", case, "tensorplay WHILE node (one launch)", latency_us=latency(g.replay, repeats, sync))

        def host_loop():
            c.zero_()
            while True:
                c.add_(1)
                tp.lt(c, lim, out=p)
                if not p.item():
                    break
        record("while", case, "host loop reading the predicate", latency_us=latency(host_loop, max(3, repeats // 4),
                                                                              sync))
        u = tp.cuda.CUDAGraph()
        with tp.cuda.graph(u):
            c.zero_()
            for _ in range(n):
                c.add_(1)
                tp.lt(c, lim, out=p)
        record("while", case, "unrolled static graph", latency_us=latency(u.replay, repeats, sync))


# ---------------------------------------------------------------- branch (IF/ELSE, SWITCH)

def branch_rows(repeats):
    """An if/else as one IF/ELSE node vs two IF nodes (pred, logical_not(pred))
    vs host branching (read pred back, replay one of two graphs); a SWITCH of 8
    cases vs 8 IF nodes (index == k) vs host dispatch (read the index back,
    replay one of 8 graphs). Latency from replay to completion, both branches
    alternating, each body one small kernel."""
    sync = tp.cuda.synchronize
    x = tp.zeros(1024, device="cuda")
    pred = tp.zeros(1, dtype=tp.bool, device="cuda")
    not_pred = tp.zeros(1, dtype=tp.bool, device="cuda")
    index = tp.zeros(1, dtype=tp.int32, device="cuda")
    hits = [tp.zeros(1, dtype=tp.bool, device="cuda") for _ in range(8)]
    x.add_(1)
    x.mul_(1.5)
    tp.logical_not(pred, out=not_pred)
    tp.eq(index, 0, out=hits[0])
    sync()

    def alternating(replay_for, values):
        state = [0]

        def step():
            v = values[state[0] % len(values)]
            state[0] += 1
            replay_for(v)
        return step

    case = "if/else, branch alternating"
    one = tp.cuda.CUDAGraph()
    with tp.cuda.graph(one):
        with one.if_else(pred) as (then, otherwise):
            with then:
                x.add_(1)
            with otherwise:
                x.mul_(0.5)
    two = tp.cuda.CUDAGraph()
    with tp.cuda.graph(two):
        tp.logical_not(pred, out=not_pred)
        with two.if_(pred):
            x.add_(1)
        with two.if_(not_pred):
            x.mul_(0.5)
    then_g, else_g = tp.cuda.CUDAGraph(), tp.cuda.CUDAGraph()
    with tp.cuda.graph(then_g):
        x.add_(1)
    with tp.cuda.graph(else_g):
        x.mul_(0.5)

    def set_pred(v):
        pred.fill_(v)

    def on_device(g):
        return lambda v: (set_pred(v), g.replay())

    def host_if(v):
        set_pred(v)
        (then_g if pred.item() else else_g).replay()      # the read-back the graph avoids
    for name, fn in (("one IF/ELSE node", on_device(one)), ("two IF nodes (pred, not pred)", on_device(two)),
                     ("host branch (item(), one of two graphs)", host_if)):
        record("branch", case, name, latency_us=latency(alternating(fn, [True, False]), repeats, sync))

    case = "switch of 8 cases, case cycling"
    sw = tp.cuda.CUDAGraph()
    with tp.cuda.graph(sw):
        with sw.switch(index, 8) as cases:
            for k in range(8):
                with cases[k]:
                    x.add_(k)
    ifs = tp.cuda.CUDAGraph()
    with tp.cuda.graph(ifs):
        for k in range(8):
            tp.eq(index, k, out=hits[k])
        for k in range(8):
            with ifs.if_(hits[k]):
                x.add_(k)
    per_case = []
    for k in range(8):
        gk = tp.cuda.CUDAGraph()
        with tp.cuda.graph(gk):
            x.add_(k)
        per_case.append(gk)

    def set_index(v):
        index.fill_(v)

    def host_switch(v):
        set_index(v)
        per_case[int(index.item())].replay()
    for name, fn in (("one SWITCH node", lambda v: (set_index(v), sw.replay())),
                     ("8 IF nodes (index == k)", lambda v: (set_index(v), ifs.replay())),
                     ("host dispatch (item(), one of 8 graphs)", host_switch)):
        record("branch", case, name, latency_us=latency(alternating(fn, list(range(8))), repeats, sync))
