# SPDX-License-Identifier: Apache-2.0
"""DOT rendering of graph descriptions: no GPU needed; Graphviz checks the output."""

import json
import shutil
import subprocess

import pytest

from tensorplay._graph import dot as _dot

NESTED = {
    "nodes": [
        {"id": 0, "kind": "memset", "attrs": {"bytes": 4096, "value": 0}},
        {"id": 1, "kind": "kernel", "name": 'tp_add "quoted" \\ back\nline <&>', "attrs": {"grid": (4, 1, 1),
                                                                                          "block": (256, 1, 1)}},
        {"id": 2, "kind": "conditional", "type": "while", "attrs": {"handle": 7},
         "bodies": [{
             "nodes": [
                 {"id": 0, "kind": "kernel", "name": "_Z3fooPfi", "attrs": {}},
                 {"id": 1, "kind": "conditional", "type": "if", "attrs": {},
                  "bodies": [{"nodes": [{"id": 0, "kind": "kernel", "name": "inner", "attrs": {}}],
                              "edges": []}]},
             ],
             "edges": [[0, 1]],
         }]},
        {"id": 3, "kind": "event_record", "attrs": {}},
    ],
    "edges": [[0, 1], [1, 2], [2, 3]],
}


def test_dot_has_the_expected_nodes_edges_and_clusters():
    dot = _dot.to_dot(NESTED, detailed=True)
    assert dot.startswith("digraph cudagraph {") and dot.rstrip().endswith("}")
    assert '"n0" -> "n1";' in dot and '"n1" -> "n2";' in dot and '"n2" -> "n3";' in dot
    assert dot.count("subgraph cluster_") == 2
    assert 'label="while"' in dot and 'label="if"' in dot
    assert '"n2b0_n0" -> "n2b0_n1";' in dot
    assert '\\"quoted\\"' in dot and "\\\\ back" in dot
    assert "grid=(4, 1, 1)" in dot
    plain = _dot.to_dot(NESTED)
    assert "grid=" not in plain and "tp_add" in plain


def test_escape_handles_any_text():
    assert _dot.escape('a"b') == '"a\\"b"'
    assert _dot.escape("x\\y") == '"x\\\\y"'
    assert _dot.escape("l1\nl2") == '"l1\\nl2"'
    assert "\x01" not in _dot.escape("bad\x01char")


def test_demangle_plain_names_pass_through():
    assert _dot.demangle("tp_add_float32") == "tp_add_float32"
    if shutil.which("c++filt"):
        assert _dot.demangle("_Z3fooPfi") == "foo(float*, int)"


def test_bad_descriptions_raise():
    with pytest.raises(TypeError):
        _dot.to_dot([1, 2])


@pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz 'dot' is not installed")
def test_graphviz_accepts_the_output(tmp_path):
    for detailed in (False, True):
        src = tmp_path / f"g{int(detailed)}.dot"
        src.write_text(_dot.to_dot(NESTED, detailed=detailed))
        out = subprocess.run(["dot", "-Tsvg", str(src)], capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        assert "<svg" in out.stdout and "while" in out.stdout and "if" in out.stdout


BRANCHES = {
    "nodes": [
        {"id": 0, "kind": "kernel", "name": "tp_set_conditional", "attrs": {}},
        {"id": 1, "kind": "conditional", "type": "if", "attrs": {},
         "bodies": [{"label": "then", "nodes": [{"id": 0, "kind": "kernel", "name": "add_one", "attrs": {}}],
                     "edges": []},
                    {"label": "else", "nodes": [], "edges": []}]},
        {"id": 2, "kind": "kernel", "name": "tp_set_switch_int32", "attrs": {}},
        {"id": 3, "kind": "conditional", "type": "switch", "attrs": {},
         "bodies": [{"label": f"case {k}",
                     "nodes": [{"id": 0, "kind": "kernel", "name": f"case_kernel_{k}", "attrs": {}}] if k != 1
                     else [{"id": 0, "kind": "conditional", "type": "while", "attrs": {},
                            "bodies": [{"label": "body", "nodes": [{"id": 0, "kind": "kernel",
                                                                    "name": "loop", "attrs": {}}],
                                        "edges": []}]}],
                     "edges": []} for k in range(3)]},
    ],
    "edges": [[0, 1], [1, 2], [2, 3]],
}


def test_else_bodies_and_switch_cases_are_labelled_clusters():
    dot = _dot.to_dot(BRANCHES)
    assert dot.count("subgraph cluster_") == 6          # then, else, 3 cases, the while in case 1
    for label in ("then", "else", "case 0", "case 1", "case 2"):
        assert f'label="{label}"; style=rounded' in dot
        assert f'style=dashed, label="{label}"]' in dot     # the edge into the branch says which
    assert 'label="while"; style=rounded' in dot           # a one-body node keeps its type
    assert 'label="body"' not in dot
    assert '"n1b1_empty" [label="(empty)"' in dot          # the empty else still shows
    assert '"n1" -> "n1b0_n0" [lhead=cluster_1, style=dashed, label="then"];' in dot
    assert '"n3" -> "n3b2_n0"' in dot and '"n3b1_n0" -> "n3b1_n0b0_n0"' in dot
    assert "switch node" in dot and "if node" in dot


@pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz 'dot' is not installed")
def test_graphviz_accepts_branch_clusters(tmp_path):
    src = tmp_path / "b.dot"
    src.write_text(_dot.to_dot(BRANCHES, detailed=True))
    out = subprocess.run(["dot", "-Tsvg", str(src)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "case 2" in out.stdout and "else" in out.stdout


# ---------------------------------------------------------------- the public to_dot

def test_to_dot_is_public_in_tensorplay_cuda_and_its_graphs_module():
    import tensorplay as tp
    assert tp.cuda.to_dot is tp.cuda.graphs.to_dot is _dot.to_dot
    assert "to_dot" in tp.cuda.__all__ and "to_dot" in tp.cuda.graphs.__all__


def test_to_dot_renders_a_description_built_by_hand_or_loaded_from_json():
    import tensorplay as tp
    dot = tp.cuda.graphs.to_dot(NESTED, title="my graph")
    assert dot.startswith("digraph cudagraph {") and 'label="my graph"; labelloc=t;' in dot
    assert "grid=" not in dot and "grid=(4, 1, 1)" in tp.cuda.to_dot(NESTED, detailed=True)
    # JSON turns tuples into lists: the same picture
    assert tp.cuda.to_dot(json.loads(json.dumps(NESTED)), detailed=True) == tp.cuda.to_dot(NESTED, detailed=True)


@pytest.mark.parametrize("bad", [[1, 2], {"edges": []}, "digraph {}", None])
def test_to_dot_refuses_what_is_no_description(bad):
    with pytest.raises(TypeError, match="^to_dot expects a graph description .* got "):
        _dot.to_dot(bad)


def test_a_child_graph_node_is_a_labelled_cluster():
    desc = {"nodes": [{"id": 0, "kind": "kernel", "name": "a"},
                      {"id": 1, "kind": "graph", "attrs": {},
                       "bodies": [{"label": "child graph", "nodes": [{"id": 0, "kind": "kernel", "name": "inner"}],
                                   "edges": []}]}],
            "edges": [[0, 1]]}
    dot = _dot.to_dot(desc)
    assert 'label="child graph"; style=rounded' in dot
    assert '"n1b0_n0" [label="kernel\\ninner", shape=box];' in dot
    assert '"n1" -> "n1b0_n0" [lhead=cluster_1, style=dashed];' in dot
