# SPDX-License-Identifier: Apache-2.0
"""A fixed graph description with the structure examples/debug_dump.py
captures (two memsets, two kernels, a WHILE node whose body holds an IF node),
rendered into the debugging guide without a GPU."""

DESCRIPTION = {
    "nodes": [
        {"id": 0, "kind": "memset", "attrs": {"bytes": 4}},
        {"id": 1, "kind": "memset", "attrs": {"bytes": 4}},
        {"id": 2, "kind": "kernel", "name": "tp_lt", "attrs": {}},
        {"id": 3, "kind": "kernel", "name": "tp_set_conditional", "attrs": {}},
        {"id": 4, "kind": "conditional", "type": "while", "attrs": {},
         "bodies": [{
             "nodes": [
                 {"id": 0, "kind": "kernel", "name": "tp_remainder", "attrs": {}},
                 {"id": 1, "kind": "kernel", "name": "tp_eq", "attrs": {}},
                 {"id": 2, "kind": "kernel", "name": "tp_set_conditional", "attrs": {}},
                 {"id": 3, "kind": "conditional", "type": "if", "attrs": {},
                  "bodies": [{"nodes": [{"id": 0, "kind": "kernel", "name": "tp_add", "attrs": {}}],
                              "edges": []}]},
                 {"id": 4, "kind": "kernel", "name": "tp_add", "attrs": {}},
                 {"id": 5, "kind": "kernel", "name": "tp_lt", "attrs": {}},
                 {"id": 6, "kind": "kernel", "name": "tp_set_conditional", "attrs": {}},
             ],
             "edges": [[0, 1], [1, 2], [2, 3], [3, 4], [4, 5], [5, 6]],
         }]},
    ],
    "edges": [[0, 2], [1, 2], [2, 3], [3, 4]],
}
