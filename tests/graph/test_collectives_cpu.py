# SPDX-License-Identifier: Apache-2.0
"""NCCL's rules without a GPU (tensorplay._graph.collectives): NCCL's
kernels found in descriptions, conditional bodies included; the sleep check
over a pool's graphs and NCCL_GRAPH_REGISTER; NCCL failures explained, in a
capture and in a conditional body (naming NCCL_GRAPH_MIXING_SUPPORT and its
value); the capturable check on a gloo group; pausing and resuming the
followed libraries' routing (CUDAGraph.outside_pool's session half)."""

import pytest

import tensorplay as tp
from tensorplay._graph import collectives, foreign, structured
from tensorplay._graph.conditionals import WHILE_NODE


def _desc(*names, bodies=()):
    nodes = [{"id": i, "kind": "kernel", "name": n} for i, n in enumerate(names)]
    if bodies:
        nodes.append({"id": len(nodes), "kind": "conditional", "type": "while", "bodies": list(bodies)})
    return {"nodes": nodes, "edges": []}


def test_nccl_kernels_are_found_in_bodies_too():
    assert collectives.collective_kernels(_desc("elementwise_add", "ncclKernel_AllReduce_RING_LL_Sum_float")) == \
        ["ncclKernel_AllReduce_RING_LL_Sum_float"]
    inner = _desc("ncclDevKernel_AllGather_RING_LL")
    assert collectives.collective_kernels(_desc("tp_copy", bodies=[_desc(bodies=[inner])])) == \
        ["ncclDevKernel_AllGather_RING_LL"]
    assert collectives.collective_kernels(_desc("tp_copy", "my_nccl_like")) == []


class FakeGraph:
    def __init__(self, pool_id, names):
        self.pool_id = pool_id
        self.is_instantiated = True
        self._names = names

    def describe(self):
        return _desc(*self._names)


def test_sleep_is_checked_against_the_pools_graphs(monkeypatch):
    monkeypatch.delenv("NCCL_GRAPH_REGISTER", raising=False)
    monkeypatch.setattr(collectives, "is_sleepable", lambda pool_id: True)     # the fake pools sleep
    plain, nccl = FakeGraph(10_001, ["tp_add"]), FakeGraph(10_001, ["ncclDevKernel_AllReduce_Sum_f32"])
    other = FakeGraph(10_002, ["ncclDevKernel_AllReduce_Sum_f32"])
    for g in (plain, nccl, other):
        collectives.note_capture(g)
    del g
    with pytest.raises(collectives.CollectiveError) as info:
        collectives.check_sleep(10_001)
    msg = str(info.value)
    assert "1 graph(s) of pool 10001" in msg and "ncclDevKernel_AllReduce_Sum_f32" in msg
    assert "NCCL_GRAPH_REGISTER is not set (NCCL's default: 1)" in msg
    assert "NCCL_GRAPH_REGISTER=0" in msg and "reset()" in msg and "allow_collectives=True" in msg
    collectives.check_sleep(10_001, allow_collectives=True)
    monkeypatch.setenv("NCCL_GRAPH_REGISTER", "0")
    collectives.check_sleep(10_001)
    monkeypatch.setenv("NCCL_GRAPH_REGISTER", "2")
    with pytest.raises(collectives.CollectiveError, match="NCCL_GRAPH_REGISTER=2"):
        collectives.check_sleep(10_001)
    nccl.is_instantiated = False                      # reset: it holds nothing any more
    collectives.check_sleep(10_001)
    nccl.is_instantiated, nccl.pool_id = True, 10_003  # captured again into another pool
    collectives.check_sleep(10_001)
    del other                                         # dropped graphs are forgotten
    collectives.check_sleep(10_002)


class DistBackendError(RuntimeError):
    """Named as torch.distributed's."""


def test_an_nccl_failure_is_explained(monkeypatch):
    monkeypatch.delenv("NCCL_GRAPH_MIXING_SUPPORT", raising=False)
    nccl = DistBackendError("NCCL error in: ProcessGroupNCCL.cpp:123, unhandled cuda error\nmore")
    assert collectives.explain_collective_error(ValueError("nothing of NCCL's")) is None
    assert collectives.explain_collective_error(RuntimeError("CUDA error: out of memory")) is None
    plain = collectives.explain_collective_error(nccl)
    assert isinstance(plain, tp.cuda.CollectiveError)
    assert "inside a tensorplay capture" in str(plain) and "unhandled cuda error" in str(plain)
    assert "more" not in str(plain)                   # NCCL's first line only
    body = collectives.explain_collective_error(nccl, in_body=True)
    assert "conditional body" in str(body)
    assert "NCCL_GRAPH_MIXING_SUPPORT is not set (NCCL's default: 1)" in str(body)
    assert "NCCL_GRAPH_MIXING_SUPPORT=0" in str(body)
    monkeypatch.setenv("NCCL_GRAPH_MIXING_SUPPORT", "1")
    assert "(NCCL_GRAPH_MIXING_SUPPORT=1)" in str(collectives.explain_collective_error(nccl, in_body=True))
    monkeypatch.setenv("NCCL_GRAPH_MIXING_SUPPORT", "0")
    assert "not the cause" in str(collectives.explain_collective_error(nccl, in_body=True))
    assert collectives.explain_collective_error(body) is None      # explained once
    assert isinstance(foreign.explain_capture_error(nccl), tp.cuda.CollectiveError)


class BodyGraph:
    """Stands in for a graph with one body open (structured's calls only)."""

    def __init__(self):
        self.is_capturing = True
        self.conditional_depth = 0

    def begin_capture_to_while_node(self, pred):
        self.conditional_depth = 1

    def end_capture_to_conditional_node(self):
        self.conditional_depth = 0

    def reset(self):
        self.is_capturing = False
        self.conditional_depth = 0


def test_a_collective_failing_in_a_body_names_the_setting(monkeypatch):
    monkeypatch.setenv("NCCL_GRAPH_MIXING_SUPPORT", "1")
    g = BodyGraph()
    with pytest.raises(tp.cuda.CollectiveError, match=r"NCCL_GRAPH_MIXING_SUPPORT=1.*NCCL_GRAPH_MIXING_SUPPORT=0") \
            as info:
        with structured.Body(g, WHILE_NODE, None):
            raise DistBackendError("NCCL error: unhandled cuda error (run with NCCL_DEBUG=INFO for details)")
    assert isinstance(info.value.__cause__, DistBackendError)
    assert not g.is_capturing                         # the capture was discarded


def test_the_capturable_check_on_cpu(tmp_path):
    torch = pytest.importorskip("torch")
    dist = pytest.importorskip("torch.distributed")
    if not dist.is_available() or dist.is_initialized():
        pytest.skip("torch.distributed is missing, or a group is initialised already")
    with pytest.raises(tp.cuda.CollectiveError, match="init_process_group"):
        tp.cuda.check_collectives_capturable()
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        with pytest.raises(tp.cuda.CollectiveError, match="no NCCL backend for cuda:0 .*gloo"):
            tp.cuda.check_collectives_capturable(device=0)
        dist.all_reduce(torch.ones(2))
    finally:
        dist.destroy_process_group()


class Routed(foreign.Library):
    name = "routed"

    def __init__(self, log, fail_pause=False):
        self.log = log
        self.fail_pause = fail_pause

    def begin(self, device, stream, pool_id):
        return self.name

    def pause(self, state):
        if self.fail_pause:
            raise RuntimeError("cannot pause")
        self.log.append(("pause", state))

    def resume(self, state):
        self.log.append(("resume", state))

    def end(self, state, on_capture_thread):
        return {}


def test_a_session_pauses_and_resumes_its_libraries():
    log = []
    a, b = Routed(log), Routed(log)
    a.name, b.name = "a", "b"
    session = foreign.ForeignSession([a, b], 0)
    session.states = [(a, "a"), (b, "b")]
    session.pause()
    session.resume()
    assert log == [("pause", "a"), ("pause", "b"), ("resume", "a"), ("resume", "b")]
    log.clear()
    c = Routed(log, fail_pause=True)
    session.states = [(a, "a"), (c, "c")]
    with pytest.raises(RuntimeError, match="cannot pause"):
        session.pause()
    assert log == [("pause", "a"), ("resume", "a")]    # what was paused is routed again
