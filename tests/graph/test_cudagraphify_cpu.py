# SPDX-License-Identifier: Apache-2.0
"""cudagraphify's bookkeeping without a GPU: the graph bound (LRU eviction),
the eager fallback after a failed capture, the statistics and argument
errors, on a stand-in for capture_callable."""

import warnings

import pytest

import tensorplay as tp
from tensorplay._graph import cudagraphs


class FakeGraph:
    def __init__(self, label):
        self.label = label
        self.launches = 0
        self.was_reset = False

    def stage_and_launch(self, static, tensors):
        assert not self.was_reset, "a reset graph was launched"
        self.launches += 1

    def reset(self):
        self.was_reset = True


class FakeCapture:
    """capture_callable's contract: warm-up runs, then the captured run;
    a signature listed in ``fail_on`` fails in the capture, after warm-up."""

    def __init__(self, monkeypatch, fail_on=()):
        self.graphs = []
        self.fail_on = set(fail_on)
        self.current = None
        monkeypatch.setattr(cudagraphs, "capture_callable", self)
        # pool ids are device memory: graph_pool_handle() needs CUDA
        pool_ids = iter(range(1000, 2000))
        monkeypatch.setattr(cudagraphs, "graph_pool_handle", lambda: next(pool_ids))

    def __call__(self, run, static_args, *, warmup, pool, capture_error_mode, where):
        for _ in range(warmup):
            run()
        out = run()
        if self.current in self.fail_on:
            raise RuntimeError(f"{where} could not be captured: a host read")
        g = FakeGraph(self.current)
        self.graphs.append(g)
        return g, out


def _wrapped(capture, **options):
    calls = []

    def f(n):
        capture.current = n
        calls.append(n)
        return [n * 10]
    return cudagraphs.cudagraphify(f, **options), calls


def test_the_least_recently_used_graph_is_evicted_and_reset(monkeypatch):
    capture = FakeCapture(monkeypatch)
    graphed, _ = _wrapped(capture, max_graphs=2, warmup=1)
    for n in (1, 2, 1, 3):
        assert graphed(n) == [n * 10]
    by_label = {g.label: g for g in capture.graphs}
    assert by_label[2].was_reset and not by_label[1].was_reset and not by_label[3].was_reset
    assert graphed.stats() == {"captures": 3, "replays": 4, "rebinds": 0, "evictions": 1, "fallbacks": 0,
                               "graphs": 2, "eager_signatures": 0}
    graphed(2)                             # 1 is now the least recently used
    assert by_label[1].was_reset and not by_label[3].was_reset
    assert [g.label for g in capture.graphs] == [1, 2, 3, 2]
    assert graphed.stats()["evictions"] == 2 and graphed.stats()["graphs"] == 2
    graphed(3)
    assert capture.graphs[-1].launches == 1 and by_label[3].launches == 2


def test_the_default_bound_and_no_bound(monkeypatch):
    capture = FakeCapture(monkeypatch)
    graphed, _ = _wrapped(capture, warmup=0)
    assert graphed.max_graphs == cudagraphs.DEFAULT_MAX_GRAPHS == 8
    for n in range(10):
        graphed(n)
    assert graphed.stats()["graphs"] == 8 and graphed.stats()["evictions"] == 2
    unbounded, _ = _wrapped(capture, warmup=0, max_graphs=None)
    for n in range(20):
        unbounded(n)
    assert unbounded.stats()["graphs"] == 20 and unbounded.stats()["evictions"] == 0


def test_a_failed_capture_warns_once_and_runs_eagerly_without_retrying(monkeypatch):
    capture = FakeCapture(monkeypatch, fail_on={5})
    graphed, calls = _wrapped(capture, warmup=2)
    with pytest.warns(RuntimeWarning, match="f could not be captured for this signature") as caught:
        assert graphed(5) == [50]
    assert len(caught) == 1
    assert caught[0].filename == __file__            # the caller's line, not the wrapper's
    assert calls == [5, 5, 5, 5]           # two warm-ups, the failed capture, the eager call
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert graphed(5) == [50] and graphed(5) == [50]
    assert calls == [5] * 6                # eager only: no new capture attempt
    assert graphed(6) == [60]              # other signatures still get graphs
    assert graphed.stats() == {"captures": 1, "replays": 1, "rebinds": 0, "evictions": 0, "fallbacks": 3,
                               "graphs": 1, "eager_signatures": 1}
    graphed.reset()                        # forgets the eager signatures: 5 is tried again
    with pytest.warns(RuntimeWarning):
        graphed(5)
    assert graphed.stats()["fallbacks"] == 4


def test_an_error_in_a_warmup_run_propagates_and_is_not_remembered(monkeypatch):
    FakeCapture(monkeypatch)
    state = {"fail": True}

    def f(n):
        if state["fail"]:
            raise RuntimeError("fn's own bug")
        return [n]
    graphed = cudagraphs.cudagraphify(f, warmup=1)
    with pytest.raises(RuntimeError, match="own bug"):
        graphed(1)
    state["fail"] = False
    assert graphed(1) == [1]
    assert graphed.stats()["captures"] == 1 and graphed.stats()["fallbacks"] == 0


def test_errors_other_than_runtime_errors_in_the_capture_propagate(monkeypatch):
    FakeCapture(monkeypatch)
    runs = []

    def f(n):
        runs.append(n)
        if len(runs) > 1:
            raise TypeError("bad output")
        return [n]
    graphed = cudagraphs.cudagraphify(f, warmup=1)
    with pytest.raises(TypeError, match="bad output"):
        graphed(1)
    assert graphed.stats()["eager_signatures"] == 0


@pytest.mark.parametrize("bad, error", [(0, ValueError), (-3, ValueError), (True, TypeError),
                                        ("4", TypeError), (2.0, TypeError)])
def test_max_graphs_is_checked(bad, error):
    with pytest.raises(error, match="max_graphs must be a positive int or None"):
        cudagraphs.cudagraphify(lambda n: [n], max_graphs=bad)


def test_make_graphed_callables_checks_pool_before_any_gpu_work():
    with pytest.raises(TypeError, match="pool must be None"):
        tp.cuda.make_graphed_callables(lambda: None, (), pool="shared")
    with pytest.raises(ValueError, match="pool ids are positive"):
        tp.cuda.make_graphed_callables(lambda: None, (), pool=-2)
    with pytest.raises(ValueError, match="has not captured anything"):
        tp.cuda.make_graphed_callables(lambda: None, (), pool=tp.cuda.CUDAGraph())


# ---------------------------------------------------------------- rebinding instead of staging

class FakeStorage:
    def __init__(self, pool_id):
        self.pool_id = pool_id


_addresses = [0x10000000]


def fake_cuda(n=4, pool_id=0, storage=None, ptr=None):
    """A float32 CUDA tensor of n elements over a fake address: metadata only."""
    if ptr is None:
        ptr = _addresses[0]
        _addresses[0] += 0x10000
    t = tp.Tensor.__new__(tp.Tensor)
    return t._set_cuda(storage or FakeStorage(pool_id), ptr, (n,), (1,), tp.float32.code, 0)


class RebindingGraph(FakeGraph):
    """A CUDAGraph with rebind_and_launch: which static inputs it can rebind
    is ``can_rebind`` (one flag for all, or a function of the index)."""

    def __init__(self, label, pool, can_rebind):
        super().__init__(label)
        self.pool_id = pool
        self.can_rebind = can_rebind
        self.asked = []
        self.rebound = []
        self.staged = []

    def rebindable(self, tensors):
        self.asked.append(list(tensors))
        return [self.can_rebind(k) if callable(self.can_rebind) else self.can_rebind for k in range(len(tensors))]

    def rebind_and_launch(self, static_inputs, inputs, static_outputs=(), outputs=()):
        assert not self.was_reset, "a reset graph was launched"
        assert not static_outputs and not outputs, "cudagraphify must not rebind outputs"
        assert all(a.shape == b.shape and a.strides == b.strides for a, b in zip(static_inputs, inputs))
        self.rebound.append((list(static_inputs), list(inputs)))
        self.launches += 1

    def stage_and_launch(self, static, tensors):
        self.staged.append((list(static), list(tensors)))
        super().stage_and_launch(static, tensors)


class RebindCapture(FakeCapture):
    def __init__(self, monkeypatch, can_rebind=True, graph=RebindingGraph):
        super().__init__(monkeypatch)
        self.can_rebind = can_rebind
        self.graph = graph
        self.pool = None
        # static inputs are clones: new fake tensors of the default pool
        monkeypatch.setattr(tp.Tensor, "clone", lambda t: fake_cuda(t.shape[0]))

    def __call__(self, run, static_args, *, warmup, pool, capture_error_mode, where):
        self.pool = pool               # what fn allocates now comes from the wrappers' pool
        for _ in range(warmup + 1):
            out = run()
        g = (self.graph(self.current, pool, self.can_rebind) if self.graph is RebindingGraph
             else self.graph(self.current))
        self.graphs.append(g)
        return g, out


def _elementwise(capture, **options):
    """y_k = f(x_k): one new output (from the pool) per tensor argument."""
    def f(*xs):
        capture.current = len(xs)
        return [fake_cuda(x.shape[0], pool_id=capture.pool) for x in xs]
    return cudagraphs.cudagraphify(f, **options)


def test_every_input_rebindable_rebinds_the_callers_tensors(monkeypatch):
    capture = RebindCapture(monkeypatch)
    graphed = _elementwise(capture, warmup=1)
    xs = [fake_cuda(), fake_cuda()]
    out = graphed(*xs)
    (g,) = capture.graphs
    assert len(g.asked) == 1                       # asked once, at the capture, about the static inputs
    static = g.asked[0]
    assert [s.data_ptr() for s in static] != [x.data_ptr() for x in xs]
    assert g.rebound == [(static, xs)] and not g.staged
    for _ in range(3):
        ys = [fake_cuda(), fake_cuda()]
        assert graphed(*ys) is out                 # the static outputs, as with staging
        assert g.rebound[-1] == (static, ys)
    assert not g.staged and len(g.asked) == 1
    st = graphed.stats()
    assert st["replays"] == st["rebinds"] == 4 and st["captures"] == 1


def test_one_input_not_rebindable_stages_every_input(monkeypatch):
    capture = RebindCapture(monkeypatch, can_rebind=lambda k: k != 1)    # say a matmul reads input 1
    graphed = _elementwise(capture, warmup=0)
    for _ in range(3):
        graphed(fake_cuda(), fake_cuda(), fake_cuda())
    (g,) = capture.graphs
    assert len(g.staged) == 3 and not g.rebound
    assert graphed.stats()["rebinds"] == 0 and graphed.stats()["replays"] == 3


def test_a_graph_without_rebinding_stages(monkeypatch):
    capture = RebindCapture(monkeypatch, graph=FakeGraph)       # a CUDAGraph before rebind_and_launch
    graphed = _elementwise(capture, warmup=0)
    graphed(fake_cuda())
    graphed(fake_cuda())
    assert capture.graphs[0].launches == 2 and graphed.stats()["rebinds"] == 0


def test_no_tensor_arguments_stage(monkeypatch):
    capture = RebindCapture(monkeypatch)
    graphed = cudagraphs.cudagraphify(lambda n: [fake_cuda(pool_id=capture.pool)], warmup=0)
    graphed(3)
    graphed(3)
    (g,) = capture.graphs
    assert not g.asked and not g.rebound and len(g.staged) == 2


@pytest.mark.parametrize("view", [lambda x: x, lambda x: tp.Tensor.__new__(tp.Tensor)._set_cuda(
    x._storage, x.data_ptr() + 8, (2,), (1,), tp.float32.code, 0)], ids=["itself", "a view"])
def test_an_output_aliasing_an_input_stages(monkeypatch, view):
    capture = RebindCapture(monkeypatch)

    def f(x, y):
        return [view(x), fake_cuda(pool_id=capture.pool)]
    graphed = cudagraphs.cudagraphify(f, warmup=0)
    graphed(fake_cuda(), fake_cuda())
    graphed(fake_cuda(), fake_cuda())
    (g,) = capture.graphs
    assert len(g.staged) == 2 and not g.rebound and graphed.stats()["rebinds"] == 0


def test_a_call_passing_memory_the_graphs_write_stages(monkeypatch):
    capture = RebindCapture(monkeypatch)
    graphed = _elementwise(capture, warmup=0)
    (y,) = graphed(fake_cuda())
    (g,) = capture.graphs
    assert len(g.rebound) == 1
    graphed(y)                                     # its own static output: y = f(y) would read what it writes
    assert len(g.staged) == 1 and g.staged[-1][1] == [y]
    other = fake_cuda(pool_id=capture.pool)        # any tensor of the pool (another graph's output)
    graphed(other)
    assert len(g.staged) == 2
    elsewhere = tp.Tensor.__new__(tp.Tensor)._set_cuda(FakeStorage(None), 0x7000, (4,), (1,),
                                                      tp.float32.code, 0)     # a foreign storage
    graphed(elsewhere)
    graphed(fake_cuda())                           # fresh tensors rebind again
    assert len(g.rebound) == 3 and g.rebound[-2][1] == [elsewhere]
    assert graphed.stats()["replays"] == 5 and graphed.stats()["rebinds"] == 3


def test_eviction_and_reset_forget_the_rebinding(monkeypatch):
    capture = RebindCapture(monkeypatch)
    graphed = _elementwise(capture, warmup=0, max_graphs=1)
    graphed(fake_cuda())
    graphed(fake_cuda(8))                          # evicts the 4-element graph
    assert capture.graphs[0].was_reset and list(graphed._rebind) == list(graphed._entries)
    graphed.reset()
    assert not graphed._rebind and not graphed._entries
    graphed(fake_cuda())
    assert graphed.stats()["rebinds"] == 3 and graphed.stats()["captures"] == 3
