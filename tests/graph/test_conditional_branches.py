# SPDX-License-Identifier: Apache-2.0
"""IF/ELSE and SWITCH nodes inside captured graphs (GPU): every branch and
case taken and not taken against NumPy, predicates and indices changed
between replays, out-of-range indices, nesting with WHILE, a device-side
state machine, the structured form, allocations in branches, and errors
that leave the capture usable."""

import numpy as np
import pytest

import tensorplay as tp
from helpers import warm
from tensorplay.cuda import CUDAGraph

pytestmark = pytest.mark.cuda

INDEX_DTYPES = ["uint8", "int8", "int16", "int32", "int64"]


def _branch_kernels():
    """Compile the index, predicate and arithmetic kernels the branches use
    (warm() runs it before the captures)."""
    c = tp.zeros(1, dtype=tp.int32, device="cuda")
    p = tp.zeros(1, dtype=tp.bool, device="cuda")
    c.add_(1)
    tp.lt(c, c, out=p)
    tp.floor_divide(c, 2, out=c)
    tp.remainder(c, 2, out=c)
    c.mul_(3)
    tp.eq(c, 1, out=p)
    tp.ne(c, 1, out=p)


def _strip_handles(desc):
    """describe() without the conditional handles (which differ between graphs)."""
    for node in desc["nodes"]:
        node["attrs"].pop("handle", None)
        for body in node.get("bodies", []):
            _strip_handles(body)
    return desc


def _if_else_graph(structured):
    pred = tp.zeros(1, dtype=tp.bool, device="cuda")
    x = tp.zeros(3, dtype=tp.int32, device="cuda")
    g = CUDAGraph()
    with tp.cuda.graph(g):
        x.add_(1)
        if structured:
            with g.if_else(pred) as (then, otherwise):
                with then:
                    x.mul_(10)
                with otherwise:
                    x.sub_(3)
        else:
            g.begin_capture_to_if_node(pred, with_else=True)
            x.mul_(10)
            g.begin_capture_to_else_branch()
            x.sub_(3)
            g.end_capture_to_conditional_node()
        x.add_(2)
    return g, pred, x


@pytest.mark.parametrize("structured", [False, True])
def test_if_else_runs_exactly_one_branch_per_replay(structured):
    warm(_branch_kernels)
    g, pred, x = _if_else_graph(structured)
    expected = np.zeros(3, dtype=np.int32)
    for flag in [True, False, False, True, False, True, True]:
        pred.fill_(flag)                                # changed between replays
        g.replay()
        expected = expected + 1
        expected = expected * 10 if flag else expected - 3
        expected = expected + 2
        np.testing.assert_array_equal(x.numpy(), expected)


def test_if_else_is_one_node_with_then_and_else_bodies():
    warm(_branch_kernels)
    g, _, _ = _if_else_graph(False)
    desc = g.describe()
    conds = [n for n in desc["nodes"] if n["kind"] == "conditional"]
    assert len(conds) == 1 and conds[0]["type"] == "if"
    assert [b["label"] for b in conds[0]["bodies"]] == ["then", "else"]
    assert all(len(b["nodes"]) == 1 and b["nodes"][0]["kind"] == "kernel" for b in conds[0]["bodies"])
    assert sum(1 for n in desc["nodes"] if n.get("name") == "tp_set_conditional") == 1


def test_if_with_else_never_begun_has_an_empty_else():
    warm(_branch_kernels)
    pred = tp.zeros(1, dtype=tp.bool, device="cuda")
    x = tp.zeros(2, device="cuda")
    g = CUDAGraph()
    with tp.cuda.graph(g):
        g.begin_capture_to_if_node(pred, with_else=True)
        x.add_(1)
        g.end_capture_to_conditional_node()
    for flag, want in [(True, 1.0), (False, 1.0), (True, 2.0)]:
        pred.fill_(flag)
        g.replay()
        assert x.tolist() == [want, want]
    body = [n for n in g.describe()["nodes"] if n["kind"] == "conditional"][0]["bodies"]
    assert [b["label"] for b in body] == ["then", "else"] and body[1]["nodes"] == []


@pytest.mark.parametrize("structured", [False, True])
def test_structured_and_begin_end_forms_describe_the_same_graph(structured):
    warm(_branch_kernels)
    a = _strip_handles(_if_else_graph(False)[0].describe())
    b = _strip_handles(_if_else_graph(structured)[0].describe())
    assert a == b
    sa = _strip_handles(_switch_graph("int32", 4, False)[0].describe())
    sb = _strip_handles(_switch_graph("int32", 4, structured)[0].describe())
    assert sa == sb
    case_labels = [b["label"] for n in sa["nodes"] if n["kind"] == "conditional" for b in n["bodies"]]
    assert case_labels == ["case 0", "case 1", "case 2", "case 3"]


def _switch_graph(dtype, n, structured, skip=()):
    index = tp.zeros(1, dtype=getattr(tp, dtype), device="cuda")
    hits = tp.zeros(n, dtype=tp.int32, device="cuda")
    g = CUDAGraph()
    with tp.cuda.graph(g):
        if structured:
            with g.switch(index, n) as cases:
                for k in range(n):
                    if k not in skip:
                        with cases[k]:
                            hits[k:k + 1].add_(k + 1)
        else:
            g.begin_capture_to_switch_node(index, n)
            for k in range(n):
                if k not in skip:
                    g.begin_capture_to_switch_case(k)
                    hits[k:k + 1].add_(k + 1)
            g.end_capture_to_conditional_node()
    return g, index, hits


@pytest.mark.parametrize("dtype", INDEX_DTYPES)
def test_switch_runs_the_case_the_index_selects_and_none_out_of_range(dtype):
    warm(_branch_kernels)
    n = 4
    g, index, hits = _switch_graph(dtype, n, structured=False)
    info = np.iinfo(dtype)
    values = [0, 3, 1, 1, 2, n, info.max]
    if info.min < 0:
        values += [-1, info.min]                       # negatives select no case
    if info.max > 2**32:
        values += [2**32, 2**32 + 1]                   # would wrap into range if narrowed first
    expected = np.zeros(n, dtype=np.int32)
    for v in values:
        index.fill_(v)
        g.replay()
        if 0 <= v < n:
            expected[v] += v + 1
        np.testing.assert_array_equal(hits.numpy(), expected, err_msg=f"index {v}")


def test_switch_cases_never_begun_run_nothing():
    warm(_branch_kernels)
    g, index, hits = _switch_graph("int32", 5, structured=True, skip=(1, 4))
    expected = np.zeros(5, dtype=np.int32)
    for v in [1, 0, 4, 2, 3, 1, 5]:
        index.fill_(v)
        g.replay()
        if v in (0, 2, 3):
            expected[v] += v + 1
        np.testing.assert_array_equal(hits.numpy(), expected)


def test_switch_of_one_case():
    warm(_branch_kernels)
    g, index, hits = _switch_graph("int64", 1, structured=False)
    for v, want in [(0, 1), (1, 1), (-5, 1), (0, 2)]:
        index.fill_(v)
        g.replay()
        assert hits.tolist() == [want]


def test_switch_index_computed_inside_the_graph():
    warm(_branch_kernels)
    v = tp.zeros(1, dtype=tp.int32, device="cuda")
    index = tp.zeros(1, dtype=tp.int32, device="cuda")
    out = tp.zeros(1, dtype=tp.int32, device="cuda")
    g = CUDAGraph()
    with tp.cuda.graph(g):
        tp.remainder(v, 3, out=index)
        with g.switch(index, 3) as cases:
            with cases[0]:
                out.add_(1)
            with cases[1]:
                out.mul_(2)
            with cases[2]:
                out.sub_(1)
    want = 0
    for val in [0, 1, 2, 5, 3, 4, 7]:
        v.fill_(val)
        g.replay()
        want = [want + 1, want * 2, want - 1][val % 3]
        assert out.item() == want


def test_nesting_three_deep_switch_if_else_while():
    """SWITCH -> case 1: IF/ELSE -> then: WHILE counting to a limit; other
    cases and the else branch do simple arithmetic; checked against NumPy for
    every combination."""
    warm(_branch_kernels)
    index = tp.zeros(1, dtype=tp.int32, device="cuda")
    pred = tp.zeros(1, dtype=tp.bool, device="cuda")
    c = tp.zeros(1, dtype=tp.int32, device="cuda")
    limit = tp.zeros(1, dtype=tp.int32, device="cuda")
    going = tp.zeros(1, dtype=tp.bool, device="cuda")
    acc = tp.zeros(3, dtype=tp.int32, device="cuda")
    g = CUDAGraph()
    with tp.cuda.graph(g):
        c.zero_()
        with g.switch(index, 3) as cases:
            with cases[0]:
                acc[0:1].add_(1)
            with cases[1]:
                with g.if_else(pred) as (then, otherwise):
                    with then:
                        tp.lt(c, limit, out=going)
                        with g.while_(going):
                            c.add_(1)
                            acc[1:2].add_(c)
                            tp.lt(c, limit, out=going)
                    with otherwise:
                        acc[2:3].add_(100)
            with cases[2]:
                with g.while_(going):                  # going is false here: never runs
                    acc.add_(1000)
    expected = np.zeros(3, dtype=np.int32)
    for i, p, lim in [(1, True, 4), (0, False, 9), (1, False, 2), (2, True, 3), (1, True, 0), (1, True, 7),
                      (5, True, 3), (-1, False, 1)]:
        index.fill_(i)
        pred.fill_(p)
        limit.fill_(lim)
        going.fill_(False)
        g.replay()
        if i == 0:
            expected[0] += 1
        elif i == 1 and p:
            expected[1] += sum(range(1, lim + 1))
        elif i == 1:
            expected[2] += 100
        np.testing.assert_array_equal(acc.numpy(), expected, err_msg=f"{(i, p, lim)}")


def _collatz_steps(x):
    steps = 0
    while x != 1:
        x = x // 2 if x % 2 == 0 else 3 * x + 1
        steps += 1
    return steps


def test_switch_inside_while_state_machine_runs_to_completion_on_the_device():
    """A state machine: state 0 halves an even x, state 1 maps an odd x to
    3x + 1, and the loop runs until x is 1 (the Collatz sequence); the state
    (the SWITCH index) changes every iteration."""
    warm(_branch_kernels)
    x = tp.zeros(1, dtype=tp.int64, device="cuda")
    state = tp.zeros(1, dtype=tp.int64, device="cuda")
    steps = tp.zeros(1, dtype=tp.int64, device="cuda")
    running = tp.zeros(1, dtype=tp.bool, device="cuda")
    g = CUDAGraph()
    with tp.cuda.graph(g):
        steps.zero_()
        tp.ne(x, 1, out=running)
        with g.while_(running):
            tp.remainder(x, 2, out=state)
            with g.switch(state, 2) as cases:
                with cases[0]:
                    tp.floor_divide(x, 2, out=x)
                with cases[1]:
                    x.mul_(3)
                    x.add_(1)
            steps.add_(1)
            tp.ne(x, 1, out=running)
    for start in [1, 2, 3, 6, 7, 27, 97]:
        x.fill_(start)
        g.replay()
        assert x.item() == 1
        assert steps.item() == _collatz_steps(start), start


def test_allocations_in_branches_are_pooled_and_never_alias_live_tensors():
    warm(_branch_kernels)
    pred = tp.zeros(1, dtype=tp.bool, device="cuda")
    index = tp.zeros(1, dtype=tp.int32, device="cuda")
    x = tp.arange(1, 5, dtype=tp.float32, device="cuda")
    out = tp.zeros(4, device="cuda")
    kept = tp.zeros(4, device="cuda")
    tp.cuda.synchronize()
    before = tp.cuda.memory_allocated()
    g = CUDAGraph()
    with tp.cuda.graph(g):
        live = x * 3                                   # live across both nodes
        early = x * 5                                  # allocated before the branch, freed inside it
        early_ptr = early.data_ptr()
        with g.if_else(pred) as (then, otherwise):
            with then:
                out.copy_(early)
                del early
                t = x + 100                            # must not take early's block inside the branch
                assert t.data_ptr() != early_ptr
                out.add_(t)
                del t
            with otherwise:
                u = x * 7
                assert u.data_ptr() != live.data_ptr()
                out.copy_(u)
                del u
        with g.switch(index, 2) as cases:
            for k in range(2):
                with cases[k]:
                    w = x + (k + 1) * 1000
                    assert w.data_ptr() != live.data_ptr()
                    out.add_(w)
                    del w
        kept.copy_(live)
    xs = np.arange(1, 5, dtype=np.float32)
    for p, i in [(True, 0), (False, 1), (True, 2), (False, 0)]:
        pred.fill_(p)
        index.fill_(i)
        out.zero_()
        g.replay()
        want = xs * 5 + xs + 100 if p else xs * 7
        if 0 <= i < 2:
            want = want + xs + (i + 1) * 1000
        np.testing.assert_allclose(out.numpy(), want)
        np.testing.assert_allclose(kept.numpy(), xs * 3)
    del live
    g.reset()
    tp.cuda.synchronize()
    assert tp.cuda.memory_allocated() == before


def test_set_conditional_inside_a_switch_case_takes_an_index():
    warm(_branch_kernels)
    index = tp.zeros(1, dtype=tp.int32, device="cuda")
    other = tp.zeros(1, dtype=tp.int16, device="cuda")
    hits = tp.zeros(2, dtype=tp.int32, device="cuda")
    g = CUDAGraph()
    with tp.cuda.graph(g):
        g.begin_capture_to_switch_node(index, 2)
        g.begin_capture_to_switch_case(0)
        with pytest.raises(TypeError, match="integer"):
            g.set_conditional_handle_for_current_node(tp.zeros(1, dtype=tp.bool, device="cuda"))
        g.set_conditional_handle_for_current_node(other)   # writes the handle; the case already ran
        hits[0:1].add_(1)
        g.begin_capture_to_switch_case(1)
        hits[1:2].add_(1)
        g.end_capture_to_conditional_node()
    for v in [0, 1, 1]:
        index.fill_(v)
        g.replay()
    assert hits.tolist() == [1, 2]


def test_errors_leave_the_capture_usable():
    warm(_branch_kernels)
    pred = tp.ones(1, dtype=tp.bool, device="cuda")
    index = tp.ones(1, dtype=tp.int32, device="cuda")
    x = tp.zeros(2, dtype=tp.int32, device="cuda")
    g = CUDAGraph()
    g.capture_begin()
    with pytest.raises(RuntimeError, match="no conditional node is open"):
        g.begin_capture_to_else_branch()
    with pytest.raises(RuntimeError, match="no conditional node is open"):
        g.begin_capture_to_switch_case(0)
    for bad, exc in [(tp.zeros(1, device="cuda"), TypeError), (tp.zeros(2, dtype=tp.int32, device="cuda"), ValueError),
                     (tp.zeros(1, dtype=tp.int32), ValueError), (tp.zeros(1, dtype=tp.bool, device="cuda"), TypeError)]:
        with pytest.raises(exc):
            g.begin_capture_to_switch_node(bad, 2)
    for n in (0, 1025):
        with pytest.raises(ValueError, match="num_cases"):
            g.begin_capture_to_switch_node(index, n)
    g.begin_capture_to_if_node(pred)                          # a plain IF: no else
    with pytest.raises(RuntimeError, match="without an else body"):
        g.begin_capture_to_else_branch()
    with pytest.raises(RuntimeError, match="not a SWITCH"):
        g.begin_capture_to_switch_case(0)
    x.add_(1)
    g.end_capture_to_conditional_node()
    g.begin_capture_to_if_node(pred, with_else=True)
    x.add_(10)
    g.begin_capture_to_else_branch()
    with pytest.raises(RuntimeError, match="already begun"):
        g.begin_capture_to_else_branch()
    x.add_(1000)
    g.end_capture_to_conditional_node()
    g.begin_capture_to_switch_node(index, 3)
    with pytest.raises(RuntimeError, match="no branch of the innermost SWITCH"):
        g.begin_capture_to_if_node(pred)                      # no case open to hold it
    with pytest.raises(RuntimeError, match="no branch"):
        g.set_conditional_handle_for_current_node(index)
    with pytest.raises(RuntimeError, match="not an IF/ELSE"):
        g.begin_capture_to_else_branch()
    g.begin_capture_to_switch_case(1)
    with pytest.raises(ValueError, match="out of range"):
        g.begin_capture_to_switch_case(3)
    with pytest.raises(ValueError, match="out of range"):
        g.begin_capture_to_switch_case(-1)
    with pytest.raises(RuntimeError, match="increasing order"):
        g.begin_capture_to_switch_case(1)                     # repeated
    with pytest.raises(RuntimeError, match="increasing order"):
        g.begin_capture_to_switch_case(0)                     # out of order
    x.add_(100)
    g.end_capture_to_conditional_node()
    assert g.conditional_depth == 0
    g.capture_end()
    g.replay()
    assert x.tolist() == [111, 111]


def test_work_between_cases_is_refused_and_the_graph_stays_reusable():
    warm(_branch_kernels)
    index = tp.zeros(1, dtype=tp.int32, device="cuda")
    x = tp.zeros(1, dtype=tp.int32, device="cuda")
    g = CUDAGraph()
    g.capture_begin()
    g.begin_capture_to_switch_node(index, 2)
    x.add_(1)                                                # lands in no case
    with pytest.raises(RuntimeError, match="between the branches"):
        g.begin_capture_to_switch_case(0)
    assert not g.is_capturing and not tp.cuda.is_current_stream_capturing()
    assert tp.cuda.current_stream().handle == 0
    with pytest.raises(RuntimeError, match="between the branches"):
        with tp.cuda.graph(g):
            with g.if_else(tp.zeros(1, dtype=tp.bool, device="cuda")) as (then, otherwise):
                with then:
                    pass
                x.add_(1)                                    # between then and otherwise
                with otherwise:
                    pass
    assert not g.is_capturing
    with tp.cuda.graph(g):
        with g.switch(index, 2) as cases:
            with cases[0]:
                x.add_(5)
    x.zero_()
    g.replay()
    assert x.item() == 5


def test_an_exception_inside_a_branch_discards_the_capture():
    warm(_branch_kernels)
    index = tp.zeros(1, dtype=tp.int32, device="cuda")
    g = CUDAGraph()
    with pytest.raises(ZeroDivisionError):
        with tp.cuda.graph(g):
            with g.switch(index, 2) as cases:
                with cases[0]:
                    with g.if_(tp.ones(1, dtype=tp.bool, device="cuda")):
                        1 / 0
    assert not g.is_capturing and g.conditional_depth == 0
    assert not tp.cuda.is_current_stream_capturing() and tp.cuda.current_stream().handle == 0
    y = tp.zeros(1, device="cuda")
    with tp.cuda.graph(g):
        y.add_(2)
    g.replay()
    assert y.item() == 2.0


def test_debug_dump_shows_the_branch_labels(tmp_path):
    warm(_branch_kernels)
    g, _, _ = _switch_graph("int8", 3, structured=True)
    text = open(g.debug_dump(tmp_path / "s.dot")).read()
    for k in range(3):
        assert f'label="case {k}"' in text
    g2, _, _ = _if_else_graph(True)
    text = open(g2.debug_dump(tmp_path / "i.dot")).read()
    assert 'label="then"' in text and 'label="else"' in text


def test_a_set_kernel_that_fails_to_load_leaves_the_capture_usable():
    """The set-switch kernel is loaded before the node's handle is made: a
    failure there leaves no handle without a node, and the capture goes on."""
    from tensorplay._graph import graphs as _graphs

    class FailingSwitchKernels(_graphs._GraphKernels):
        @staticmethod
        def set_switch(dtype, device):
            raise RuntimeError("no set-switch kernel today")

    warm(_branch_kernels)
    x = tp.ones(8, device="cuda")
    index = tp.tensor([1], dtype=tp.int32, device="cuda")
    from tensorplay._graph.capture import CUDAGraphBase
    g = CUDAGraph()
    CUDAGraphBase.__init__(g, FailingSwitchKernels())      # the graph layer's kernels come from here
    with tp.cuda.graph(g):
        y = x * 2
        with pytest.raises(RuntimeError, match="no set-switch kernel today"):
            g.begin_capture_to_switch_node(index, 3)
        assert g.is_capturing and g.conditional_depth == 0
        y.add_(1)
    g.replay()
    assert y.tolist() == [3.0] * 8
