# SPDX-License-Identifier: Apache-2.0
"""IF/ELSE and SWITCH without a GPU: the structured form's protocol on a
stand-in graph, argument errors raised before any GPU work, the set-switch
kernels' sources and their NVRTC compilation, labelled bodies in DOT."""

import pytest

import tensorplay as tp
from tensorplay._kernels import cache
from tensorplay._graph import kernels as graph_kernels
from tensorplay._kernels import nvrtc as _nvrtc
from tensorplay.cuda import CUDAGraph
from tensorplay._graph import structured as _structured
from tensorplay._graph.conditionals import IF_NODE, WHILE_NODE

ARCH = 90


class FakeGraph:
    """Records the calls the structured form makes and keeps the node stack
    the real graph keeps, enforcing the same branch order."""

    def __init__(self):
        self.calls = []
        self.stack = []          # [kind, num_bodies, open branch, node, next branch]
        self.is_capturing = True
        self.serial = 100

    @property
    def _innermost_conditional(self):
        if not self.stack:
            return None
        kind, n, branch, node, _ = self.stack[-1]
        return (("if", "while", "switch")[kind], n, branch, node)

    def _push(self, kind, n, open_first):
        self.serial += 1
        self.stack.append([kind, n, 0 if open_first else -1, self.serial, 1 if open_first else 0])

    def begin_capture_to_if_node(self, pred):
        self.calls.append(("if", pred))
        self._push(0, 1, True)

    def begin_capture_to_while_node(self, pred):
        self.calls.append(("while", pred))
        self._push(1, 1, True)

    def _begin_node(self, kind, pred, n):
        self.calls.append(("node", kind, pred, n))
        self._push(kind, n, False)

    def _begin_branch(self, kind, k, what):
        top = self.stack[-1]
        if top[0] != kind or k < top[4]:
            raise RuntimeError(f"{what}: out of order")
        self.calls.append(("branch", k))
        top[2], top[4] = k, k + 1

    def _end_branch(self):
        self.calls.append(("end_branch",))
        self.stack[-1][2] = -1

    def end_capture_to_conditional_node(self):
        self.calls.append(("end",))
        self.stack.pop()

    def reset(self):
        self.calls.append(("abort",))
        self.stack = []
        self.is_capturing = False


def test_if_else_opens_one_node_and_its_branches_in_order():
    g = FakeGraph()
    with _structured.IfElse(g, "p") as (then, otherwise):
        assert (then.index, otherwise.index) == (0, 1)
        with then:
            g.calls.append("work-then")
        with otherwise:
            g.calls.append("work-else")
    assert g.calls == [("node", 0, "p", 2), ("branch", 0), "work-then", ("end_branch",),
                       ("branch", 1), "work-else", ("end_branch",), ("end",)]
    assert g.stack == []


def test_switch_cases_and_nesting_close_in_reverse_order():
    g = FakeGraph()
    with _structured.Switch(g, "i", 3) as cases:
        assert len(cases) == 3 and [c.index for c in cases] == [0, 1, 2]
        with cases[0]:
            with _structured.Body(g, WHILE_NODE, "w"):
                with _structured.Body(g, IF_NODE, "q"):
                    pass
        with cases[2]:                            # case 1 left out: stays empty
            pass
    assert g.calls == [("node", 2, "i", 3), ("branch", 0), ("while", "w"), ("if", "q"), ("end",), ("end",),
                       ("end_branch",), ("branch", 2), ("end_branch",), ("end",)]
    assert g.stack == []


def test_case_index_errors():
    g = FakeGraph()
    with _structured.Switch(g, "i", 2) as cases:
        with pytest.raises(IndexError, match="cases 0 to 1"):
            cases[2]
        with pytest.raises(IndexError):
            cases[-1]
        with pytest.raises(TypeError, match="int"):
            cases[True]
        with pytest.raises(TypeError, match="int"):
            cases["0"]
    assert g.calls[-1] == ("end",)


def test_a_branch_of_an_outer_node_cannot_open_inside_an_inner_one():
    g = FakeGraph()
    with _structured.Switch(g, "i", 2) as outer:
        with outer[0]:
            with _structured.IfElse(g, "p") as (then, _otherwise):
                with pytest.raises(RuntimeError, match="not the innermost"):
                    with outer[1]:
                        pass
                with then:
                    pass
    assert g.stack == [] and ("abort",) not in g.calls


def test_an_exception_in_a_branch_discards_the_capture():
    g = FakeGraph()
    with pytest.raises(ZeroDivisionError):
        with _structured.IfElse(g, "p") as (then, otherwise):
            with then:
                1 / 0
    assert ("abort",) in g.calls and not g.is_capturing
    assert ("end",) not in g.calls and ("end_branch",) not in g.calls


def test_an_exception_in_a_body_discards_the_capture():
    g = FakeGraph()
    with pytest.raises(KeyError):
        with _structured.Body(g, WHILE_NODE, "w"):
            {}["missing"]
    assert g.calls == [("while", "w"), ("abort",)]


def test_a_failing_close_discards_the_capture_too():
    g = FakeGraph()

    def refuse():
        raise RuntimeError("refused")
    g.end_capture_to_conditional_node = refuse
    with pytest.raises(RuntimeError, match="refused"):
        with _structured.Body(g, IF_NODE, "p"):
            pass
    assert g.calls[-1] == ("abort",)


def test_reentering_a_branch_is_refused_by_the_graph():
    g = FakeGraph()
    with _structured.IfElse(g, "p") as (then, otherwise):
        with otherwise:
            pass
        with pytest.raises(RuntimeError, match="out of order"):
            with then:
                pass


# ------------------------------------------------------------------ argument errors, no GPU

def test_switch_argument_errors_come_before_any_gpu_work():
    g = CUDAGraph()
    cpu = tp.zeros(1, dtype=tp.int32)
    for bad, exc, msg in [(0, ValueError, r"\[1, 1024\]"), (1025, ValueError, r"\[1, 1024\]"),
                          (-3, ValueError, "num_cases"), (2.0, TypeError, "int"), (True, TypeError, "int")]:
        with pytest.raises(exc, match=msg):
            g.begin_capture_to_switch_node(cpu, bad)
    with pytest.raises(ValueError, match="CPU"):
        g.begin_capture_to_switch_node(cpu, 4)
    with pytest.raises(TypeError, match="integer dtype, got float32"):
        g.begin_capture_to_switch_node(tp.zeros(1), 4)
    with pytest.raises(TypeError, match="integer dtype, got bool"):
        g.begin_capture_to_switch_node(tp.zeros(1, dtype=tp.bool), 4)
    with pytest.raises(TypeError, match="integer tensor, got int"):
        g.begin_capture_to_switch_node(3, 4)
    with pytest.raises(TypeError, match="case must be an int"):
        g.begin_capture_to_switch_case(1.0)
    with pytest.raises(RuntimeError, match="no capture is open"):
        g.begin_capture_to_switch_case(0)
    with pytest.raises(RuntimeError, match="no capture is open"):
        g.begin_capture_to_else_branch()
    with pytest.raises(ValueError, match="CPU"):
        g.switch(cpu, 2).__enter__()
    assert not g.is_capturing and g.conditional_depth == 0


def test_if_else_argument_errors_come_before_any_gpu_work():
    g = CUDAGraph()
    with pytest.raises(TypeError, match="with_else must be a bool"):
        g.begin_capture_to_if_node(tp.zeros(1, dtype=tp.bool), with_else=1)
    with pytest.raises(ValueError, match="CPU"):
        g.begin_capture_to_if_node(tp.zeros(1, dtype=tp.bool), with_else=True)
    with pytest.raises(ValueError, match="if_else: scalar_pred must be a CUDA tensor"):
        g.if_else(tp.zeros(1, dtype=tp.bool)).__enter__()
    with pytest.raises(ValueError, match="CPU"):
        with g.if_(tp.zeros(1, dtype=tp.bool)):
            pass
    assert not g.is_capturing


# ------------------------------------------------------------------ set-switch kernels

def test_set_switch_kernels_compile_for_every_integer_dtype(monkeypatch):
    made = []
    monkeypatch.setattr(cache, "cached_function", lambda key, dev, make: made.append((key, make())))
    for name in graph_kernels.SWITCH_INDEX_TYPES:
        graph_kernels.set_switch_function(name, 0)
    assert [k for k, _ in made] == [("set_switch", n) for n in graph_kernels.SWITCH_INDEX_TYPES]
    assert set(graph_kernels.SWITCH_INDEX_TYPES) == {d.name for d in tp.ALL_DTYPES if d.kind in "iu"}
    for (_, dtype), (src, name) in made:
        assert name == f"tp_set_switch_{dtype}" and f"void {name}(" in src
        ctype, signed = graph_kernels.SWITCH_INDEX_TYPES[dtype]
        assert f"const {ctype}* index" in src
        assert ("v >= 0 &&" in src) == signed      # negatives select no case
        assert _nvrtc.compile_cubin(src, name + ".cu", (), ARCH)[:4] == b"\x7fELF"


def test_set_switch_kernel_maps_out_of_range_to_num_cases():
    """In range the case is the value; anything else (negative, or too large
    for the unsigned int the handle holds) becomes num_cases, no body, and is
    compared before it is narrowed, so it cannot wrap into range."""
    src = graph_kernels.set_switch_source("int64")
    assert "long long v = *index;" in src
    assert "bool in_range = v >= 0 && (unsigned long long)v < num_cases;" in src
    assert "in_range ? (unsigned int)v : (unsigned int)num_cases" in src
    assert "v >= 0" not in graph_kernels.set_switch_source("uint8")
    with pytest.raises(ValueError, match="integer dtype, got float32"):
        graph_kernels.set_switch_source("float32")
