# SPDX-License-Identifier: Apache-2.0
"""CUDAGraph.profile_nodes on the GPU: known costs come back as measured,
WHILE iterations add up to the node's total, the user's graph is unchanged,
and bodies, child graphs and PyTorch kernels are profiled by name."""

import statistics

import numpy as np
import pytest

import tensorplay as tp
from tensorplay.cuda import CUDAGraph
from tensorplay.cuda.graphs import GraphProfile

from helpers import counted_loop, warm
from helpers import torch_cuda as torch  # noqa: F401 (a fixture)

pytestmark = pytest.mark.cuda

# Spins for a set number of ns of the GPU's global timer, then bumps out[0]:
# a kernel of known cost whose effect a test can check.
SPIN_SOURCE = r"""
extern "C" __global__ void spin_ns(unsigned long long ns, float* out) {
  unsigned long long start, now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now)); } while (now - start < ns);
  if (threadIdx.x == 0) out[0] += 1.0f;
}
"""

MIB = 1 << 20


@pytest.fixture
def spin():
    kernel = tp.RawKernel(SPIN_SOURCE, "spin_ns")

    def run(us, out):
        kernel(1, 32, (int(us * 1000), out))
    return run


def event_us(fn, reps=20):
    """Median GPU us of ``fn()`` on the current stream, CUDA events."""
    times = []
    for _ in range(reps + 2):
        a, b = tp.cuda.Event(enable_timing=True), tp.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3)
    return statistics.median(times[2:])


def near(value, truth, rel=0.1, abs_us=3.0):
    return abs(value - truth) <= rel * truth + abs_us


def test_known_costs_come_back_as_shares_of_the_replay(spin):
    out = tp.zeros(1, device="cuda")
    src = tp.ones(16 * MIB, device="cuda")          # 64 MiB
    dst = tp.empty_like(src)
    copy_only = CUDAGraph()
    with tp.cuda.graph(copy_only):
        dst.copy_(src)
    copy_truth = event_us(copy_only.replay)
    g = CUDAGraph()
    with tp.cuda.graph(g):
        spin(20, out)
        spin(60, out)
        dst.copy_(src)
        spin(40, out)
    prof = g.profile_nodes(replays=10)
    assert isinstance(prof, GraphProfile)
    spins = sorted((n for n in prof.nodes if n.name == "spin_ns"), key=lambda n: n.us)
    assert [n.executions for n in spins] == [1, 1, 1]
    for node, truth in zip(spins, (20, 40, 60)):
        assert near(node.us, truth), (node, truth, prof.floor_us)
    copy = [n for n in prof.nodes if n.name != "spin_ns"]
    assert len(copy) == 1 and near(copy[0].us, copy_truth, rel=0.25), (copy, copy_truth)
    total = 120 + copy_truth
    for node in prof.nodes:
        assert abs(node.share - node.total_us / prof.critical_path_us) < 1e-9
        assert node.critical                       # a chain: every node is on the path
    assert abs(sum(n.share for n in prof.nodes) - 1) < 1e-6
    assert near(prof.critical_path_us, total, rel=0.1, abs_us=8)
    assert near(prof.replay_us, total, rel=0.1, abs_us=8)
    assert prof.floor_us >= 0 and prof.floor_spread_us[0] <= prof.floor_spread_us[1]
    # the profile's text and its DOT colours
    assert "spin_ns" in prof.table() and "critical path" in prof.table()
    annotated = g.describe(profile=prof)
    assert all("time" in n for n in annotated["nodes"])
    dot = tp.cuda.to_dot(annotated)
    assert dot.count("fillcolor=") == 4 and "penwidth" in dot


def test_the_users_graph_is_unchanged_by_a_profile(spin):
    out = tp.zeros(1, device="cuda")
    x = tp.arange(4 * MIB, dtype=tp.float32, device="cuda")     # 16 MiB
    y = tp.empty_like(x)
    g = CUDAGraph()
    with tp.cuda.graph(g):
        spin(30, out)
        tp.mul(x, 2.0, out=y)
    nodes, handle = g.num_nodes, g.exec_handle
    desc = g.describe()
    before = event_us(g.replay)
    g.profile_nodes(replays=5, warmup=1)
    assert g.describe() == desc                    # no stamp went into the captured graph
    # the profile ran the instrumented executable 6 times and the graph itself 6 more
    assert g.num_nodes == nodes and g.exec_handle == handle
    out.zero_()
    y.zero_()
    g.replay()
    tp.cuda.synchronize()
    np.testing.assert_array_equal(y.cpu().numpy(), 2.0 * np.arange(4 * MIB, dtype=np.float32))
    assert out.item() == 1.0
    after = event_us(g.replay)
    assert near(after, before, rel=0.1, abs_us=3)


def test_a_while_bodys_iterations_add_up_to_the_nodes_total(spin):
    out = tp.zeros(1, device="cuda")
    g, count, _ = counted_loop(lambda: spin(15, out), 40)
    desc = g.describe()
    prof = g.profile_nodes(replays=5, samples=64)
    assert g.describe() == desc                    # no stamp left in the body or around the node
    loop = next(n for n in prof.nodes if n.kind == "conditional")
    assert loop.iterations == 40
    # an iteration is the body's span and the loop's own relaunch of it, which
    # the graph's replays pay as well
    assert loop.per_iteration_us * loop.iterations == pytest.approx(loop.total_us)
    assert loop.body_us <= loop.per_iteration_us and near(loop.body_us, 15, abs_us=10), loop
    assert near(prof.critical_path_us, prof.replay_us, rel=0.15, abs_us=10), (prof.replay_us, prof.table())
    body = prof.body(loop.scope + (loop.id, 0))
    spin_node = next(n for n in body if n.name == "spin_ns")
    assert spin_node.executions == 40 and near(spin_node.us, 15)
    assert near(spin_node.total_us, 40 * 15, rel=0.1, abs_us=20)
    assert loop.critical and loop.share > 0.8
    assert "40 iterations" in prof.table()
    count.zero_()
    g.replay()
    assert count.item() == 40


def test_a_profile_reaches_into_if_bodies_and_child_graphs(spin):
    out = tp.zeros(1, device="cuda")
    pred = tp.ones(1, dtype=tp.bool, device="cuda")
    inner = CUDAGraph()
    with tp.cuda.graph(inner):
        spin(25, out)
    g = CUDAGraph()
    with tp.cuda.graph(g):
        spin(5, out)
        inner.replay()                              # embedded: a child graph node
        with g.if_(pred):
            spin(35, out)
    desc = g.describe()
    prof = g.profile_nodes(replays=5)
    assert g.describe() == desc
    child = next(i for i, n in enumerate(desc["nodes"]) if n["kind"] == "graph")
    cond = next(i for i, n in enumerate(desc["nodes"]) if n["kind"] == "conditional")
    (in_child,) = [n for n in prof.body((child, 0)) if n.name == "spin_ns"]
    (in_if,) = [n for n in prof.body((cond, 0)) if n.name == "spin_ns"]
    assert near(in_child.us, 25) and near(in_if.us, 35)
    # a container's time is its body's and its own launch of it, as the graph's replays pay
    assert prof.node(child).total_us >= in_child.us - 1 and prof.node(cond).total_us >= in_if.us - 1
    assert near(prof.critical_path_us, prof.replay_us, rel=0.15, abs_us=5), (prof.replay_us, prof.table())
    pred.fill_(False)
    prof = g.profile_nodes(replays=3)
    (in_if,) = [n for n in prof.body((cond, 0)) if n.name == "spin_ns"]
    assert in_if.executions == 0 and in_if.total_us == 0


def test_a_profile_of_switch_and_if_else_times_the_case_taken_and_leaves_the_graph_branching(spin):
    """A graph with conditional nodes is profiled on a copy with handles of
    its own: the case the index selects is timed, the others not run, and
    the graph itself still follows its own predicate and index after."""
    out = tp.zeros(3, device="cuda")
    index = tp.tensor([1], dtype=tp.int32, device="cuda")
    pred = tp.zeros(1, dtype=tp.bool, device="cuda")
    g = CUDAGraph()
    with tp.cuda.graph(g):
        with g.switch(index, 3) as cases:
            for k, us in enumerate((10, 30, 50)):
                with cases[k]:
                    spin(us, out[k:])
        with g.if_else(pred) as (then, otherwise):
            with then:
                spin(40, out[2:])
            with otherwise:
                spin(20, out[2:])
    desc = g.describe()
    prof = g.profile_nodes(replays=4)
    assert g.describe() == desc
    sw, ie = [i for i, n in enumerate(desc["nodes"]) if n["kind"] == "conditional"]
    taken = [[n for n in prof.body((sw, k)) if n.name == "spin_ns"][0] for k in range(3)]
    assert [n.executions > 0 for n in taken] == [False, True, False]
    assert near(taken[1].us, 30) and prof.node(sw).total_us >= taken[1].us - 1
    assert near(prof.critical_path_us, prof.replay_us, rel=0.15, abs_us=5), (prof.replay_us, prof.table())
    then_spin, else_spin = ([n for n in prof.body((ie, b)) if n.name == "spin_ns"][0] for b in (0, 1))
    assert then_spin.executions == 0 and near(else_spin.us, 20)
    # the graph's own executable still reads its own index and predicate
    out.zero_()
    index.fill_(2)
    pred.fill_(True)
    g.replay()
    assert out.tolist() == [0.0, 0.0, 2.0]
    index.fill_(0)
    pred.fill_(False)
    out.zero_()
    g.replay()
    assert out.tolist() == [1.0, 0.0, 1.0]


def test_a_profile_reaches_an_if_inside_a_while_body(spin):
    """Nested conditional nodes: the copy gives the IF and the WHILE handles
    of their own, and the kernel in the body that sets the WHILE's handle
    and the one that sets the IF's each get the right one."""
    out = tp.zeros(1, device="cuda")
    yes = tp.ones(1, dtype=tp.bool, device="cuda")
    c = tp.zeros(1, dtype=tp.int32, device="cuda")
    lim = tp.full((1,), 8, dtype=tp.int32, device="cuda")
    p = tp.zeros(1, dtype=tp.bool, device="cuda")
    warm(lambda: (c.add_(1), tp.lt(c, lim, out=p)))
    g = CUDAGraph()
    with tp.cuda.graph(g):
        c.zero_()
        tp.lt(c, lim, out=p)
        with g.while_(p):
            with g.if_(yes):
                spin(20, out)
            c.add_(1)
            tp.lt(c, lim, out=p)
    desc = g.describe()
    prof = g.profile_nodes(replays=3)
    assert g.describe() == desc
    loop = next(n for n in prof.nodes if n.kind == "conditional")
    assert loop.iterations == 8
    inner = next(n for n in prof.body((loop.id, 0)) if n.kind == "conditional")
    assert inner.executions == 8
    (spun,) = [n for n in prof.body((loop.id, 0, inner.id, 0)) if n.name == "spin_ns"]
    assert spun.executions == 8 and near(spun.us, 20)
    out.zero_()
    g.replay()
    assert out.item() == 8.0 and c.item() == 8


def test_a_profile_names_pytorchs_kernels(torch):
    a = torch.randn(2048, 2048, device="cuda")
    b = torch.randn(2048, 2048, device="cuda")
    g = CUDAGraph()
    with tp.cuda.graph(g):
        c = a @ b
        d = torch.relu(c)
    prof = g.profile_nodes(replays=5)
    names = [n.name or n.kind for n in prof.nodes]
    assert any(k in x.lower() for x in names for k in ("gemm", "nvjet", "cutlass", "xmma")), names
    gemm = max(prof.nodes, key=lambda n: n.total_us)
    assert gemm.share > 0.5                         # the matmul dominates a relu of the same size
    g.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(d, torch.relu(a @ b))


def test_a_profile_reaches_pytorch_kernels_in_a_while_body(torch):
    x = torch.randn(1024, 1024, device="cuda")
    y = torch.empty_like(x)
    g, count, _ = counted_loop(lambda: torch.mm(x, x, out=y), 6, lib=torch)
    prof = g.profile_nodes(replays=4)
    loop = next(n for n in prof.nodes if n.kind == "conditional")
    assert prof.uninstrumented == [] and loop.iterations == 6
    body = prof.body(loop.scope + (loop.id, 0))
    gemm = max(body, key=lambda n: n.total_us)
    assert gemm.executions == 6 and gemm.share > 0.5
    assert loop.per_iteration_us * 6 == pytest.approx(loop.total_us)
    assert gemm.us * 0.9 <= loop.body_us <= loop.per_iteration_us
    g.replay()
    torch.cuda.synchronize()
    assert count.item() == 6
    torch.testing.assert_close(y, x @ x)


def test_a_profile_with_pdl_on_says_its_edges_were_made_full():
    x = tp.ones(MIB, device="cuda")
    with tp.backends.cuda.pdl.flags(enabled=True):
        g = CUDAGraph()
        with tp.cuda.graph(g):
            for _ in range(8):
                x.add_(1.0)
    desc = g.describe()
    prof = g.profile_nodes(replays=3)
    assert prof.programmatic_edges == len(desc["programmatic_edges"])
    if prof.programmatic_edges:
        assert "PDL" in prof.table()
    assert len(prof.nodes) == 8
    g.replay()
    tp.cuda.synchronize()
    # the copy ran 2 warmup + 3 replays, the graph itself as many to be timed, then once here
    assert x[0].item() == 1.0 + 8 * ((2 + 3) * 2 + 1)


def test_profile_nodes_is_refused_inside_a_capture_and_on_an_empty_graph():
    with pytest.raises(RuntimeError, match="nothing to replay"):
        CUDAGraph().profile_nodes()
    x = tp.ones(16, device="cuda")
    g = CUDAGraph()
    with tp.cuda.graph(g):
        x.add_(1)
    outer = CUDAGraph()
    with tp.cuda.graph(outer):
        with pytest.raises(RuntimeError, match="capturing"):
            g.profile_nodes(stream=tp.cuda.current_stream())
        x.add_(1)
    outer.replay()
    tp.cuda.synchronize()
