# SPDX-License-Identifier: Apache-2.0
"""describe() and debug_dump() of captured graphs on the GPU."""

import shutil
import subprocess

import pytest

import tensorplay as tp
from tensorplay.cuda import CUDAGraph

pytestmark = pytest.mark.cuda


def _multistream_graph(debug):
    x = tp.ones(1024, device="cuda")
    (x * 3, x + 4, x.sum())
    tp.cuda.synchronize()
    side = tp.cuda.Stream()
    g = CUDAGraph()
    if debug:
        g.enable_debug_mode()
    with tp.cuda.graph(g):
        main = tp.cuda.current_stream()
        side.wait_stream(main)
        with tp.cuda.stream(side):
            a = x * 3
        b = x + 4
        main.wait_stream(side)
        c = a + b
        c.zero_()
    return g, (a, b, c)


@pytest.mark.parametrize("debug", [False, True])
def test_multistream_capture_description_and_dump(debug, tmp_path):
    g, keep = _multistream_graph(debug)
    d = g.describe()
    kinds = [n["kind"] for n in d["nodes"]]
    assert kinds.count("kernel") == 3 and kinds.count("memset") == 1
    names = {n.get("name", "") for n in d["nodes"] if n["kind"] == "kernel"}
    assert any("mul" in nm for nm in names) and any("add" in nm for nm in names)
    # the add of a and b depends on both branches
    by_id = {n["id"]: n for n in d["nodes"]}
    preds = {}
    for a, b in d["edges"]:
        preds.setdefault(b, []).append(a)
    join = [i for i, n in by_id.items() if n["kind"] == "kernel" and len(preds.get(i, [])) == 2]
    assert len(join) == 1
    kernel = by_id[join[0]]
    assert ("grid" in kernel["attrs"]) == debug
    path = g.debug_dump(tmp_path / "multi.dot")
    text = open(path).read()
    assert text.startswith("digraph") and text.count("->") >= len(d["edges"])
    assert ("grid=" in text) == debug
    if shutil.which("dot"):
        assert subprocess.run(["dot", "-Tsvg", path], capture_output=True).returncode == 0


@pytest.mark.parametrize("debug", [False, True])
def test_nested_while_if_dump_has_clusters(debug, tmp_path):
    i = tp.zeros(1, dtype=tp.int32, device="cuda")
    n = tp.full((1,), 3, dtype=tp.int32, device="cuda")
    p = tp.zeros(1, dtype=tp.bool, device="cuda")
    q = tp.zeros(1, dtype=tp.bool, device="cuda")
    i.add_(1)
    tp.lt(i, n, out=p)
    tp.cuda.synchronize()
    g = CUDAGraph()
    if debug:
        g.enable_debug_mode()
    with tp.cuda.graph(g):
        i.zero_()
        tp.lt(i, n, out=p)
        g.begin_capture_to_while_node(p)
        tp.lt(i, 1, out=q)
        g.begin_capture_to_if_node(q)
        n.add_(0)
        g.end_capture_to_conditional_node()
        i.add_(1)
        tp.lt(i, n, out=p)
        g.end_capture_to_conditional_node()
    g.replay()
    assert i.item() == 3
    d = g.describe()
    whiles = [x for x in d["nodes"] if x["kind"] == "conditional"]
    assert len(whiles) == 1 and whiles[0]["type"] == "while"
    body = whiles[0]["bodies"][0]
    ifs = [x for x in body["nodes"] if x["kind"] == "conditional"]
    assert len(ifs) == 1 and ifs[0]["type"] == "if" and ifs[0]["bodies"][0]["nodes"]
    assert ("handle" in whiles[0]["attrs"]) == debug
    text = open(g.debug_dump(tmp_path / "nested.dot")).read()
    assert text.count("subgraph cluster_") == 2 and 'label="while"' in text and 'label="if"' in text
    if shutil.which("dot"):
        out = g.debug_dump(tmp_path / "nested.svg")
        assert open(out).read().lstrip().startswith("<?xml") or "<svg" in open(out).read()


def test_dump_errors():
    g = CUDAGraph()
    with pytest.raises(RuntimeError, match="nothing captured"):
        g.describe()
    x = tp.ones(2, device="cuda")
    with tp.cuda.graph(g):
        x.add_(1)
    with pytest.raises(OSError):
        g.debug_dump("/nonexistent-dir/x.dot")
    g.reset()
    with pytest.raises(RuntimeError, match="nothing captured"):
        g.debug_dump("/tmp/x.dot")
