# SPDX-License-Identifier: Apache-2.0
"""Programmatic dependent launch on the GPU: our kernels launched so still
see every result they depend on, eagerly and in graphs.

Each test is built to fail if a wait were missing: a slow producer
(``slow_write``) lets the next kernel launch at once (launch_dependents),
sleeps about 200 us, and only then writes; the reader comes one or more
launches later, across memcpy and memset nodes, another stream, conditional
bodies, staging and rebinding. ``test_a_reader_that_does_not_wait_sees_stale_data``
shows the harness catches a reader that does not wait."""

import numpy as np
import pytest

import tensorplay as tp
from helpers import slow_writer, warm
from tensorplay.cuda import CUDAGraph

pytestmark = pytest.mark.cuda

SLEEP_NS = 200_000
N = 1 << 20          # 4 MiB of float32

# Declared pdl but never waits: what a kernel missing its wait would do.
NO_WAIT_READ = r"""
extern "C" __global__ void no_wait_read(const float* y, float* out) {
  out[0] = y[0];
}
"""


def _needs_pdl():
    if tp.cuda.get_device_capability() < (9, 0):
        pytest.skip("programmatic dependent launch needs sm_90 or newer")


@pytest.fixture(autouse=True)
def pdl_on():
    _needs_pdl()
    assert tp.backends.cuda.pdl.enabled
    yield
    tp.backends.cuda.pdl.enabled = True


@pytest.fixture(scope="module")
def slow_write():
    return slow_writer(SLEEP_NS)


def _values(t):
    return np.unique(t.numpy())


@pytest.mark.serial  # a race timed by a 200 us GPU sleep, which another process's time slice can end
@pytest.mark.parametrize("where", ["stream", "graph"])
def test_a_reader_that_does_not_wait_sees_stale_data(slow_write, where):
    """The harness's own check: a PDL-launched reader without the wait runs
    while slow_write sleeps and reads the old value, on a stream of its own
    and in a graph: the early launch is real, and the tests below would see
    a missing wait."""
    racy = tp.RawKernel(NO_WAIT_READ, "no_wait_read", pdl=True)
    y = tp.zeros(N, device="cuda")
    out = tp.zeros(1, device="cuda")

    def work():
        y.fill_(-5.0)
        slow_write(y, 1.0)
        racy((1,), (1,), (y, out))
    warm(work)
    if where == "graph":
        g = _capture(work)
        out.zero_()
        g.replay()
    else:
        s = tp.cuda.Stream()
        with tp.cuda.stream(s):
            work()
        s.synchronize()
    assert out.item() == -5.0
    assert _values(y).tolist() == [1.0]


@pytest.mark.parametrize("own_stream", [False, True])
@pytest.mark.parametrize("n", [1, 4096, N])
def test_eager_reader_sees_the_slow_write(slow_write, n, own_stream):
    y = tp.full((n,), -5.0, device="cuda")
    s = tp.cuda.Stream() if own_stream else tp.cuda.current_stream()
    with tp.cuda.stream(s):
        for value in (1.0, 2.0, 3.0):
            slow_write(y, value)
            z = y + 1.0
            assert _values(z).tolist() == [value + 1.0]


def test_reader_two_kernels_later(slow_write):
    y = tp.full((N,), -5.0, device="cuda")
    w = tp.zeros(N, device="cuda")
    slow_write(y, 1.0)
    w.add_(1.0)                       # a PDL kernel between that does not touch y
    z = y * 2.0
    assert _values(z).tolist() == [2.0]
    assert _values(w).tolist() == [1.0]


def _capture(fn):
    g = CUDAGraph()
    with tp.cuda.graph(g):
        fn()
    return g


def test_graph_reader_two_kernels_later_and_programmatic_edges(slow_write):
    y = tp.zeros(N, device="cuda")
    w = tp.zeros(N, device="cuda")
    z = tp.zeros(N, device="cuda")
    warm(lambda: (y.fill_(-5.0), slow_write(y, 1.0), w.add_(1.0), tp.mul(y, 2.0, out=z)))
    g = _capture(lambda: (y.fill_(-5.0), slow_write(y, 1.0), w.add_(1.0), tp.mul(y, 2.0, out=z)))
    w.zero_()
    for k in range(1, 4):
        z.zero_()
        g.replay()
        assert _values(z).tolist() == [2.0]
        assert _values(w).tolist() == [float(k)]
    desc = g.describe()
    kernels = {n["id"] for n in desc["nodes"] if n["kind"] == "kernel"}
    assert len(kernels) == 4
    # fill -> slow_write -> add -> mul: each edge programmatic
    assert sorted(map(tuple, desc["programmatic_edges"])) == sorted(map(tuple, desc["edges"]))
    assert len(desc["programmatic_edges"]) == 3


def test_switch_off_makes_plain_edges_and_the_same_values(slow_write):
    y = tp.zeros(N, device="cuda")
    z = tp.zeros(N, device="cuda")
    warm(lambda: (slow_write(y, 1.0), tp.add(y, 1.0, out=z)))
    with tp.backends.cuda.pdl.flags(enabled=False):
        g = _capture(lambda: (y.fill_(-5.0), slow_write(y, 1.0), tp.add(y, 1.0, out=z)))
    desc = g.describe()
    assert desc["programmatic_edges"] == [] and len(desc["edges"]) == 2
    g.replay()
    assert _values(z).tolist() == [2.0]
    g2 = _capture(lambda: (y.fill_(-5.0), slow_write(y, 1.0), tp.add(y, 1.0, out=z)))
    tp.backends.cuda.pdl.enabled = False   # a graph captured with PDL keeps its edges
    z.zero_()
    g2.replay()
    assert _values(z).tolist() == [2.0]
    assert len(g2.describe()["programmatic_edges"]) == 2


@pytest.mark.parametrize("captured", [False, True])
def test_across_memcpy_and_memset(slow_write, captured):
    """slow_write -> memcpy (y -> y2) -> reader of y2; slow_write -> memset
    of the same tensor -> reader: the memset comes after the write."""
    y = tp.zeros(N, device="cuda")
    y2 = tp.zeros(N, device="cuda")
    a = tp.zeros(N, device="cuda")
    b = tp.zeros(N, device="cuda")
    x = tp.zeros(N, device="cuda")

    def work():
        y.fill_(-5.0)
        slow_write(y, 1.0)
        y2.copy_(y)                   # a memcpy node
        tp.add(y2, 1.0, out=a)
        slow_write(x, 7.0)
        x.zero_()                     # a memset node after the slow write
        tp.add(x, 1.0, out=b)
    if captured:
        warm(work)
        g = _capture(work)
        kinds = [n["kind"] for n in g.describe()["nodes"]]
        assert "memcpy" in kinds and "memset" in kinds
        for _ in range(3):
            a.zero_(), b.zero_()
            g.replay()
            assert _values(a).tolist() == [2.0] and _values(b).tolist() == [1.0]
    else:
        work()
        assert _values(a).tolist() == [2.0] and _values(b).tolist() == [1.0]


@pytest.mark.parametrize("captured", [False, True])
def test_reader_on_another_stream_joined_by_an_event(slow_write, captured):
    y = tp.zeros(N, device="cuda")
    z = tp.zeros(N, device="cuda")
    side = tp.cuda.Stream()

    def work():
        y.fill_(-5.0)
        side.wait_stream(tp.cuda.current_stream())
        with tp.cuda.stream(side):
            slow_write(y, 3.0)
        tp.cuda.current_stream().wait_stream(side)
        tp.add(y, 1.0, out=z)
    if captured:
        warm(work)
        g = _capture(work)
        for _ in range(3):
            z.zero_()
            g.replay()
            assert _values(z).tolist() == [4.0]
    else:
        work()
        assert _values(z).tolist() == [4.0]


def test_inside_while_and_if_bodies(slow_write):
    """Each WHILE iteration: fill y, slow-write it, add it into acc: three
    iterations give 3.0 only if every read waited; an IF body the same once."""
    y = tp.zeros(N, device="cuda")
    acc = tp.zeros(N, device="cuda")
    c = tp.zeros(1, dtype=tp.int32, device="cuda")
    lim = tp.full((1,), 3, dtype=tp.int32, device="cuda")
    p = tp.zeros(1, dtype=tp.bool, device="cuda")
    yes = tp.ones(1, dtype=tp.bool, device="cuda")
    warm(lambda: (y.fill_(-5.0), slow_write(y, 1.0), acc.add_(y), c.add_(1), tp.lt(c, lim, out=p)))
    g = CUDAGraph()
    with tp.cuda.graph(g):
        acc.zero_()
        c.zero_()
        tp.lt(c, lim, out=p)
        with g.while_(p):
            y.fill_(-5.0)
            slow_write(y, 1.0)
            acc.add_(y)
            c.add_(1)
            tp.lt(c, lim, out=p)
        with g.if_(yes):
            y.fill_(-5.0)
            slow_write(y, 0.5)
            acc.add_(y)
        acc.add_(y)                   # after the IF node: reads the body's write
    for _ in range(2):
        g.replay()
        assert _values(acc).tolist() == [4.0]
        assert c.item() == 3


@pytest.mark.parametrize("how", ["stage", "rebind"])
def test_staging_and_rebinding_read_a_slow_input(slow_write, how):
    x = tp.zeros(N, device="cuda")
    z = tp.zeros(N, device="cuda")
    warm(lambda: tp.add(x, 1.0, out=z))
    g = _capture(lambda: tp.add(x, 1.0, out=z))
    for value in (5.0, 6.0):
        inp = tp.full((N,), -5.0, device="cuda")
        slow_write(inp, value)
        if how == "stage":
            g.stage_and_launch([x], [inp])
        else:
            g.rebind_and_launch([x], [inp], [z], [z])
        assert _values(z).tolist() == [value + 1.0]


@pytest.mark.parametrize("captured", [False, True])
def test_around_a_cublaslt_matmul(slow_write, captured):
    """slow_write -> matmul (cuBLASLt, a plain launch) -> our kernel reading
    its result: values right; no programmatic edge touches the matmul."""
    n = 1024
    a = tp.zeros((n, n), device="cuda")
    b = tp.ones((n, n), device="cuda")
    out = tp.zeros((n, n), device="cuda")

    def work():
        a.fill_(-5.0)
        slow_write(a, 0.5)
        c = a @ b
        tp.add(c, 1.0, out=out)
    warm(work)
    if captured:
        g = _capture(work)
        out.zero_()
        g.replay()
        desc = g.describe()
        names = {n_["id"]: n_.get("name", "") for n_ in desc["nodes"]}
        # into our kernels only (they wait); the matmul's own launch is plain
        for src, dst in desc["programmatic_edges"]:
            assert names[dst].startswith(("tp_", "slow_write")), (names[src], names[dst])
        into_matmul = [e for e in desc["edges"] if "gemm" in names[e[1]] or "cublas" in names[e[1]]]
        assert into_matmul and not [e for e in into_matmul if e in desc["programmatic_edges"]]
    else:
        work()
    assert _values(out).tolist() == [n * 0.5 + 1.0]


def test_a_hundred_kernel_chain_matches_with_and_without_pdl():
    rng = np.random.default_rng(0)
    data = rng.standard_normal(N).astype(np.float32)
    results = []
    for enabled in (True, False):
        with tp.backends.cuda.pdl.flags(enabled=enabled):
            x = tp.tensor(data, device="cuda")
            g = _capture(lambda: [x.mul_(1.01).add_(0.5) for _ in range(50)])
            g.replay()
            results.append(x.numpy())
            assert len(g.describe()["programmatic_edges"]) == (99 if enabled else 0)
    want = data.copy()
    for _ in range(50):
        want = want * np.float32(1.01) + np.float32(0.5)
    np.testing.assert_allclose(results[0], want, rtol=1e-4)
    assert np.array_equal(results[0], results[1])


def test_recapture_updates_a_graph_with_programmatic_edges(slow_write):
    y = tp.zeros(N, device="cuda")
    z = tp.zeros(N, device="cuda")
    warm(lambda: (slow_write(y, 1.0), tp.add(y, 1.0, out=z)))
    g = CUDAGraph()
    for value, enabled in ((1.0, True), (2.0, True), (3.0, False), (4.0, True)):
        with tp.backends.cuda.pdl.flags(enabled=enabled):
            with tp.cuda.graph(g):
                y.fill_(-5.0)
                slow_write(y, value)
                tp.add(y, 1.0, out=z)
        g.replay()
        assert _values(z).tolist() == [value + 1.0]
        assert len(g.describe()["programmatic_edges"]) == (2 if enabled else 0)
