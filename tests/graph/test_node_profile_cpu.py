# SPDX-License-Identifier: Apache-2.0
"""The node profile without a GPU: records as the stamp kernels write them
become node times, shares, WHILE iterations and a critical path; a stored
profile loads back and colours DOT; bad arguments are refused before any
GPU work."""

import json

import numpy as np
import pytest

import tensorplay as tp
from tensorplay._graph.dot import heat
from tensorplay._graph.node_profile import _longest_path, build_profile
from tensorplay.cuda import CUDAGraph
from tensorplay.cuda.graphs import GraphProfile

# kernel a (0) -> WHILE (1) -> kernel c (3); kernel b (2) beside them, from nothing to nothing;
# the WHILE's body: kernel k (0) -> kernel j (1)
DESCRIPTION = {
    "nodes": [
        {"id": 0, "kind": "kernel", "name": "a", "attrs": {}},
        {"id": 1, "kind": "conditional", "type": "while", "attrs": {}, "bodies": [
            {"label": "body", "edges": [[0, 1]], "programmatic_edges": [], "nodes": [
                {"id": 0, "kind": "kernel", "name": "k", "attrs": {}},
                {"id": 1, "kind": "kernel", "name": "j", "attrs": {}}]}]},
        {"id": 2, "kind": "kernel", "name": "b", "attrs": {}},
        {"id": 3, "kind": "kernel", "name": "c", "attrs": {}},
    ],
    "edges": [[0, 1], [1, 3]],
    "programmatic_edges": [],
}
SLOTS = [((), -1), ((), 0), ((), 1), ((), 2), ((), 3), ((1, 0), -1), ((1, 0), 0), ((1, 0), 1)]
FLOOR_NS = 2000          # what a stamp pair reads with nothing between
PAIR_NS = 3000           # what a stamp pair costs a graph (read around an empty kernel)
CAP = 16


def record(durations_ns, cap=CAP):
    """A record as the end stamp leaves it: last start, sum, count, the first ``cap`` durations."""
    rec = np.zeros(3 + cap, np.uint64)
    rec[1] = sum(durations_ns)
    rec[2] = len(durations_ns)
    rec[3:3 + min(cap, len(durations_ns))] = durations_ns[:cap]
    return rec


def replay_records(iterations=10, relaunch_ns=0):
    """One replay: a 10 us, the loop of ``iterations`` x (k 5 us, j 3 us, then ``relaunch_ns`` of
    the loop's own between iterations), b 50 us, c 20 us; each reading as the node's time plus the
    floor, containers also paying a pair's cost per nested pair."""
    f, p = FLOOR_NS, PAIR_NS
    return np.stack([
        record([0]),                                          # the graph's span
        record([10000 + f]),
        record([iterations * (8000 + relaunch_ns) + f + p * 3 * iterations]),  # the span's pair, k's, j's
        record([50000 + f]), record([20000 + f]),
        record([8000 + f + 2 * p] * iterations),              # the body's span: the two nodes' pairs inside
        record([5000 + f] * iterations), record([3000 + f] * iterations),
    ])


def make_profile(replays=3, iterations=10, relaunch_ns=0):
    records = np.stack([replay_records(iterations, relaunch_ns) for _ in range(replays)])
    floor = np.full(64, FLOOR_NS, np.uint64)
    pair = np.full(64, PAIR_NS, np.uint64)
    return build_profile(DESCRIPTION, SLOTS, records, floor, pair, replay_us=111.0)


def test_records_become_node_times_less_the_floor():
    prof = make_profile()
    assert prof.floor_us == 2.0 and prof.stamp_pair_us == 3.0 and prof.empty_kernel_us == 1.0
    assert prof.replays == 3
    a, loop, b, c = (prof.node(i) for i in range(4))
    assert (a.us, b.us, c.us) == (10.0, 50.0, 20.0)
    assert a.raw_us == 12.0 and a.executions == 1
    assert loop.total_us == pytest.approx(80.0)
    assert loop.iterations == 10 and loop.per_iteration_us == pytest.approx(8.0)
    assert loop.per_iteration_us * loop.iterations == pytest.approx(loop.total_us)
    k, j = prof.body((1, 0))
    assert (k.us, j.us, k.executions, j.total_us) == (5.0, 3.0, 10, 30.0)


def test_a_while_nodes_iteration_is_its_body_and_the_loops_relaunch():
    prof = make_profile(relaunch_ns=1500)
    loop = prof.node(1)
    assert loop.total_us == pytest.approx(95.0)
    assert loop.per_iteration_us == pytest.approx(9.5) and loop.body_us == pytest.approx(8.0)
    assert loop.per_iteration_us * loop.iterations == pytest.approx(loop.total_us)
    assert "10 iterations, 9.50 us each (the body 8.00 us, the loop's relaunch 1.50 us)" in prof.table()
    d = prof.to_dict()
    assert GraphProfile.from_dict(json.loads(json.dumps(d))).node(1).body_us == pytest.approx(8.0)
    # stored before body_us: per_iteration_us held the body's span
    for n in d["nodes"]:
        if n.get("iterations"):
            n["per_iteration_us"] = n.pop("body_us")
        else:
            n.pop("body_us")
    old = GraphProfile.from_dict(json.loads(json.dumps(d))).node(1)
    assert (old.per_iteration_us, old.body_us) == (pytest.approx(9.5), pytest.approx(8.0))


def test_the_critical_path_and_shares():
    prof = make_profile()
    # a -> loop -> c (110 us) is longer than b alone (50 us)
    assert prof.critical_path == [0, 1, 3] and prof.critical_path_us == pytest.approx(110.0)
    assert [prof.node(i).critical for i in range(4)] == [True, True, False, True]
    assert prof.node(2).share == pytest.approx(50 / 110)
    assert prof.node(1).share == pytest.approx(80 / 110)
    assert all(n.critical for n in prof.body((1, 0)))        # k -> j: the body's own path


def test_a_profile_stores_as_json_and_loads_back():
    prof = make_profile()
    back = GraphProfile.from_dict(json.loads(json.dumps(prof.to_dict())))
    assert back == prof
    assert back.node(0, ()).name == "a" and back.body((1, 0))[1].name == "j"


def test_the_table_lists_nodes_longest_first():
    text = make_profile().table()
    lines = text.splitlines()
    assert lines[2].startswith("*1 conditional") and "80.00" in lines[2]
    assert "10 iterations, 8.00 us each" in lines[3]
    assert "critical path 110.0 us" in text and "floor 2.00 us" in text


def test_annotate_and_dot_colour_nodes_by_share():
    prof = make_profile()
    desc = prof.annotate(DESCRIPTION)
    assert "time" not in DESCRIPTION["nodes"][0]           # the description given is not changed
    assert desc["nodes"][2]["time"]["share"] == pytest.approx(50 / 110)
    assert desc["nodes"][1]["time"]["iterations"] == 10
    assert desc["nodes"][1]["bodies"][0]["nodes"][0]["time"]["us"] == 5.0
    dot = tp.cuda.to_dot(desc)
    assert f'fillcolor="{heat(80 / 110)}"' in dot and f'fillcolor="{heat(50 / 110)}"' in dot
    assert dot.count("penwidth=2.5") == 5                  # a, the loop, c and the body's k and j
    assert "80.0 us (73%)" in dot and "10 iterations, 8.0 us each" in dot
    assert heat(0) == "#ffffff" and heat(1) == "#ff0000" and heat(3) == "#ff0000"
    with pytest.raises(TypeError, match="graph description"):
        prof.annotate([1, 2])


def test_a_body_not_taken_reads_zero():
    records = np.stack([replay_records(0) for _ in range(2)])
    prof = build_profile(DESCRIPTION, SLOTS, records, np.full(8, FLOOR_NS, np.uint64),
                         np.full(8, PAIR_NS, np.uint64), replay_us=80.0)
    k, j = prof.body((1, 0))
    assert k.executions == 0 and k.total_us == 0 and k.us == 0
    assert prof.node(1).iterations == 0 and prof.node(1).total_us == 0


@pytest.mark.parametrize("kwargs, error, match", [
    ({"replays": 0}, ValueError, "replays must be at least 1"),
    ({"replays": 2.5}, TypeError, "replays must be an int"),
    ({"warmup": -1}, ValueError, "warmup must be at least 0"),
    ({"samples": True}, TypeError, "samples must be an int"),
])
def test_bad_arguments_are_refused_before_any_gpu_work(kwargs, error, match):
    with pytest.raises(error, match=match):
        CUDAGraph().profile_nodes(**kwargs)


def test_an_empty_graph_has_nothing_to_profile():
    with pytest.raises(RuntimeError, match="profile_nodes: nothing to replay"):
        CUDAGraph().profile_nodes()


def test_a_node_of_no_time_stays_on_the_critical_path():
    # an empty node (0 us) -> a (10 us) -> b (5 us); c (12 us) beside them
    path, length = _longest_path([0, 1, 2, 3], [[0, 1], [1, 2]], {0: 0.0, 1: 10.0, 2: 5.0, 3: 12.0})
    assert path == [0, 1, 2] and length == 15.0
    assert _longest_path([], [], {}) == ([], 0.0)
