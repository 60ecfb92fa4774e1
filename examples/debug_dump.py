# SPDX-License-Identifier: Apache-2.0
"""What did I capture? describe() and debug_dump() of a graph with a WHILE
node holding an IF node.

Run:  python examples/debug_dump.py [out.dot|out.svg]
(in a clone: bash scripts/setup.sh, then .venv/bin/python in place of python)
"""

from __future__ import annotations

import os
import sys
import tempfile

import tensorplay as tp


def main() -> int:
    if not tp.cuda.is_available():
        print(f"No CUDA GPU here ({tp.cuda.unavailable_reason()}); nothing to capture.")
        return 0
    path = sys.argv[1] if len(sys.argv) > 1 else os.path.join(tempfile.gettempdir(), "tp_graph.dot")
    i = tp.zeros(1, dtype=tp.int32, device="cuda")
    n = tp.full((1,), 4, dtype=tp.int32, device="cuda")
    odd = tp.zeros(1, dtype=tp.bool, device="cuda")
    more = tp.zeros(1, dtype=tp.bool, device="cuda")
    hits = tp.zeros(1, dtype=tp.int32, device="cuda")
    i.add_(1)                                          # kernels loaded before capture
    tp.lt(i, n, out=more)
    tp.eq(i % 2, 1, out=odd)
    g = tp.cuda.CUDAGraph()
    g.enable_debug_mode()                              # keep full node attributes
    with tp.cuda.graph(g):
        i.zero_()
        hits.zero_()
        tp.lt(i, n, out=more)
        g.begin_capture_to_while_node(more)            # while i < n:
        tp.eq(i % 2, 1, out=odd)
        g.begin_capture_to_if_node(odd)                #     if i is odd:
        hits.add_(1)                                   #         hits += 1
        g.end_capture_to_conditional_node()
        i.add_(1)                                      #     i += 1
        tp.lt(i, n, out=more)
        g.end_capture_to_conditional_node()
    g.replay()
    print("loop ran to i =", i.item(), "with", hits.item(), "odd steps (expect 4 and 2)")
    desc = g.describe()
    kinds = [node["kind"] for node in desc["nodes"]]
    print("top level:", kinds)
    written = g.debug_dump(path)
    print("DOT written to", written)
    with open(written) as f:
        print(f.read().splitlines()[0], "...")
    return 0


if __name__ == "__main__":
    sys.exit(main())
