# SPDX-License-Identifier: Apache-2.0
"""cudagraphify's bookkeeping without a GPU: the graph bound (LRU eviction),
the eager fallback after a failed capture, the statistics and argument
errors, on a stand-in for capture_callable."""

import warnings

import pytest

import tensorplay as tp
from tensorplay._stax import cudagraphs


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
    assert graphed.stats() == {"captures": 3, "replays": 4, "evictions": 1, "fallbacks": 0, "graphs": 2,
                               "eager_signatures": 0}
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
    assert calls == [5, 5, 5, 5]           # two warm-ups, the failed capture, the eager call
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert graphed(5) == [50] and graphed(5) == [50]
    assert calls == [5] * 6                # eager only: no new capture attempt
    assert graphed(6) == [60]              # other signatures still get graphs
    assert graphed.stats() == {"captures": 1, "replays": 1, "evictions": 0, "fallbacks": 3, "graphs": 1,
                               "eager_signatures": 1}
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
