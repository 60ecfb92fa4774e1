# SPDX-License-Identifier: Apache-2.0
"""IF and WHILE nodes inside captured graphs, nested, and their errors."""

import pytest

import tensorplay as tp
from helpers import warm
from tensorplay.cuda import CUDAGraph

pytestmark = pytest.mark.cuda


def _counter_kernels():
    """Compile the counter and predicate kernels the bodies use (warm() runs it before the captures)."""
    c = tp.zeros(1, dtype=tp.int32, device="cuda")
    n = tp.zeros(1, dtype=tp.int32, device="cuda")
    p = tp.zeros(1, dtype=tp.bool, device="cuda")
    c.add_(1)
    tp.lt(c, n, out=p)
    c.zero_()
    (c * 2).add_(c)


def test_if_node_runs_its_body_exactly_when_true():
    warm(_counter_kernels)
    pred = tp.zeros(1, dtype=tp.bool, device="cuda")
    x = tp.zeros(4, device="cuda")
    g = CUDAGraph()
    with tp.cuda.graph(g):
        g.begin_capture_to_if_node(pred)
        x.add_(1)
        g.end_capture_to_conditional_node()
        x.mul_(10)
    expected = 0.0
    for flag in [True, False, False, True, True, False]:
        pred.fill_(flag)
        g.replay()
        expected = (expected + (1 if flag else 0)) * 10
        assert x.tolist() == [expected] * 4


def test_if_predicate_computed_inside_the_graph():
    warm(_counter_kernels)
    v = tp.zeros(1, device="cuda")
    pred = tp.zeros(1, dtype=tp.bool, device="cuda")
    out = tp.zeros(1, device="cuda")
    g = CUDAGraph()
    with tp.cuda.graph(g):
        out.zero_()
        tp.gt(v, 0.5, out=pred)
        g.begin_capture_to_if_node(pred)
        out.add_(v * 2.0)
        g.end_capture_to_conditional_node()
    for val in (0.1, 0.9, 0.5, 3.0):
        v.fill_(val)
        g.replay()
        assert out.item() == pytest.approx(2 * val if val > 0.5 else 0.0)


def _counting_graph(n, second_tensor=False):
    c = tp.zeros(1, dtype=tp.int32, device="cuda")
    limit = tp.full((1,), n, dtype=tp.int32, device="cuda")
    pred = tp.zeros(1, dtype=tp.bool, device="cuda")
    pred2 = tp.zeros(1, dtype=tp.bool, device="cuda")
    trace = tp.zeros(1, dtype=tp.int32, device="cuda")
    g = CUDAGraph()
    with tp.cuda.graph(g):
        c.zero_()
        trace.zero_()
        tp.lt(c, limit, out=pred)
        g.begin_capture_to_while_node(pred)
        c.add_(1)
        tmp = c * 2                       # an allocation inside the body
        trace.add_(tmp)
        if second_tensor:
            tp.lt(c, limit, out=pred2)
            g.set_conditional_handle_for_current_node(pred2)
        else:
            tp.lt(c, limit, out=pred)
        g.end_capture_to_conditional_node()
    return g, c, limit, trace


@pytest.mark.parametrize("n", [0, 1, 5, 100])
def test_while_node_counts_to_n(n):
    warm(_counter_kernels)
    g, c, limit, trace = _counting_graph(n)
    before = tp.cuda.memory_allocated()
    for _ in range(3):
        g.replay()
        assert c.item() == n
        assert trace.item() == n * (n + 1)          # sum of 2k for k = 1..n
    assert tp.cuda.memory_allocated() == before     # the body's allocations don't grow


def test_while_loop_with_predicate_in_a_second_tensor():
    warm(_counter_kernels)
    g, c, limit, trace = _counting_graph(7, second_tensor=True)
    g.replay()
    assert c.item() == 7
    limit.fill_(3)
    g.replay()
    assert c.item() == 3


def test_two_level_loop_nest_and_if_inside_while():
    warm(_counter_kernels)
    i = tp.zeros(1, dtype=tp.int32, device="cuda")
    j = tp.zeros(1, dtype=tp.int32, device="cuda")
    ni = tp.full((1,), 4, dtype=tp.int32, device="cuda")
    nj = tp.full((1,), 3, dtype=tp.int32, device="cuda")
    pi = tp.zeros(1, dtype=tp.bool, device="cuda")
    pj = tp.zeros(1, dtype=tp.bool, device="cuda")
    odd = tp.zeros(1, dtype=tp.bool, device="cuda")
    total = tp.zeros(1, dtype=tp.int32, device="cuda")
    odd_count = tp.zeros(1, dtype=tp.int32, device="cuda")
    g = CUDAGraph()
    with tp.cuda.graph(g):
        i.zero_()
        total.zero_()
        odd_count.zero_()
        tp.lt(i, ni, out=pi)
        g.begin_capture_to_while_node(pi)                    # for i in range(ni)
        j.zero_()
        tp.lt(j, nj, out=pj)
        g.begin_capture_to_while_node(pj)                    #   for j in range(nj)
        total.add_(i * 10 + j)
        tp.eq(tp.remainder(i + j, 2), 1, out=odd)
        g.begin_capture_to_if_node(odd)                      #     if (i + j) odd
        odd_count.add_(1)
        g.end_capture_to_conditional_node()
        j.add_(1)
        tp.lt(j, nj, out=pj)
        g.end_capture_to_conditional_node()
        i.add_(1)
        tp.lt(i, ni, out=pi)
        g.end_capture_to_conditional_node()
    for a, b in [(4, 3), (2, 5), (0, 3), (3, 0)]:
        ni.fill_(a)
        nj.fill_(b)
        g.replay()
        assert total.item() == sum(x * 10 + y for x in range(a) for y in range(b))
        assert odd_count.item() == sum((x + y) % 2 for x in range(a) for y in range(b))


def test_if_inside_if_three_levels():
    warm(_counter_kernels)
    flags = [tp.zeros(1, dtype=tp.bool, device="cuda") for _ in range(3)]
    hits = tp.zeros(3, dtype=tp.int32, device="cuda")
    g = CUDAGraph()
    with tp.cuda.graph(g):
        hits.zero_()
        for k in range(3):
            g.begin_capture_to_if_node(flags[k])
            hits[k:k + 1].add_(1)
        for k in range(3):
            g.end_capture_to_conditional_node()
    for bits in range(8):
        vals = [bool(bits & 1), bool(bits & 2), bool(bits & 4)]
        for f, v in zip(flags, vals):
            f.fill_(v)
        g.replay()
        expected, on = [], True
        for v in vals:
            on = on and v
            expected.append(1 if on else 0)
        assert hits.tolist() == expected


def test_conditional_errors_leave_the_process_usable():
    warm(_counter_kernels)
    g = CUDAGraph()
    good = tp.zeros(1, dtype=tp.bool, device="cuda")
    with pytest.raises(RuntimeError, match="capture"):
        g.begin_capture_to_if_node(good)                 # outside a capture
    with pytest.raises(RuntimeError, match="no conditional body"):
        g.end_capture_to_conditional_node()
    g.capture_begin()
    with pytest.raises(TypeError, match="dtype bool"):
        g.begin_capture_to_if_node(tp.zeros(1, dtype=tp.int32, device="cuda"))
    with pytest.raises(ValueError, match="one element"):
        g.begin_capture_to_while_node(tp.zeros(2, dtype=tp.bool, device="cuda"))
    with pytest.raises(ValueError, match="CPU"):
        g.begin_capture_to_if_node(tp.zeros(1, dtype=tp.bool))
    with pytest.raises(TypeError, match="CUDA bool tensor"):
        g.begin_capture_to_if_node(True)
    with pytest.raises(RuntimeError, match="no conditional body"):
        g.end_capture_to_conditional_node()
    with pytest.raises(RuntimeError, match="no conditional body"):
        g.set_conditional_handle_for_current_node(good)
    g.begin_capture_to_if_node(good)
    with pytest.raises(RuntimeError, match="still open"):
        g.capture_end()                                  # unbalanced: discarded
    assert not g.is_capturing and not tp.cuda.is_current_stream_capturing()
    assert tp.cuda.current_stream().handle == 0
    good.fill_(True)                                     # eager: outside any capture
    x = tp.zeros(2, device="cuda")
    with tp.cuda.graph(g):
        g.begin_capture_to_if_node(good)
        x.add_(5)
        g.end_capture_to_conditional_node()
    g.replay()
    assert x.tolist() == [5.0, 5.0]
