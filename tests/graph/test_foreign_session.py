# SPDX-License-Identifier: Apache-2.0
"""Foreign capture without a GPU: the ForeignSession protocol on recording
libraries (begin, follow, end, their order and failures), registering
libraries and switching the following off, the RNG error's translation (in
the structured blocks and ``tp.cuda.graph`` on stand-in graphs), tensors at
the graph boundary, and PyTorch's and CuPy's adapters on fake ``torch`` and
``cupy`` modules: streams set and restored, allocations routed, PyTorch's
pools shared per tensorplay pool and let go once unused."""

import contextlib
import gc
import sys
import threading
import types
import weakref

import numpy as np
import pytest

import tensorplay as tp
from helpers import run_python
from tensorplay._graph import foreign
from tensorplay._graph import structured as _structured
from tensorplay._graph.conditionals import IF_NODE, WHILE_NODE

TORCH_RNG_MESSAGE = "Attempt to increase offset for a CUDA generator not in capture mode."


# ------------------------------------------------------------------ recording libraries

class Recorder(foreign.Library):
    """A followed library that records every call in a shared log."""

    def __init__(self, name, log, loaded=True, handle=None, fail_begin=False, fail_end=False):
        self.name = name
        self.log = log
        self.loaded = loaded
        self.handle = handle
        self.fail_begin = fail_begin
        self.fail_end = fail_end
        self.kept = object()

    def is_loaded(self):
        return self.loaded

    def current_stream_handle(self, device):
        self.log.append(("handle", self.name, device))
        return self.handle

    def begin(self, device, stream, pool_id):
        self.log.append(("begin", self.name, device, stream, pool_id))
        if self.fail_begin:
            raise ValueError(f"{self.name} cannot begin")
        return f"state-{self.name}"

    def follow(self, state, stream):
        self.log.append(("follow", self.name, state, stream))

    def end(self, state, on_capture_thread):
        self.log.append(("end", self.name, state, on_capture_thread))
        if self.fail_end:
            raise KeyError(f"{self.name} cannot end")
        return {id(self.kept): self.kept}


@pytest.fixture
def libraries(monkeypatch):
    """A fresh list of followed libraries and the process switch on, both
    put back after the test."""
    libs = []
    monkeypatch.setattr(foreign, "_libraries", libs)
    monkeypatch.setattr(foreign, "_enabled", [True])
    return libs


def test_session_begins_follows_and_ends_in_order():
    log = []
    a, b = Recorder("a", log), Recorder("b", log)
    s = foreign.ForeignSession([a, b], 3)
    assert s.names() == ("a", "b") and s.device == 3
    s.begin("S", 11)
    s.follow("body")
    s.follow("S")
    keep = s.end()
    assert log == [("begin", "a", 3, "S", 11), ("begin", "b", 3, "S", 11),
                   ("follow", "a", "state-a", "body"), ("follow", "b", "state-b", "body"),
                   ("follow", "a", "state-a", "S"), ("follow", "b", "state-b", "S"),
                   ("end", "b", "state-b", True), ("end", "a", "state-a", True)]   # last begun, first ended
    assert keep == {id(a.kept): a.kept, id(b.kept): b.kept}
    assert s.states == []
    assert s.end() == {} and len(log) == 8            # nothing left to end


def test_streams_to_join_skips_none_and_duplicates():
    log = []
    libs = [Recorder("a", log, handle=5), Recorder("b", log), Recorder("c", log, handle=5),
            Recorder("d", log, handle=7)]
    assert foreign.ForeignSession(libs, 1).streams_to_join() == [5, 7]
    assert log == [("handle", n, 1) for n in "abcd"]


def test_a_failing_begin_ends_the_libraries_begun_before_and_raises():
    log = []
    libs = [Recorder("a", log), Recorder("b", log), Recorder("c", log, fail_begin=True), Recorder("d", log)]
    s = foreign.ForeignSession(libs, 0)
    with pytest.raises(ValueError, match="c cannot begin"):
        s.begin("S", 1)
    assert [e[:2] for e in log] == [("begin", "a"), ("begin", "b"), ("begin", "c"), ("end", "b"), ("end", "a")]
    assert s.states == []


def test_end_restores_every_library_then_raises_the_first_error():
    log = []
    libs = [Recorder("a", log), Recorder("b", log, fail_end=True), Recorder("c", log, fail_end=True)]
    s = foreign.ForeignSession(libs, 0)
    s.begin("S", 1)
    with pytest.raises(KeyError, match="c cannot end"):          # c ends first
        s.end()
    assert [e[:2] for e in log if e[0] == "end"] == [("end", "c"), ("end", "b"), ("end", "a")]
    assert s.states == []


def test_end_off_the_capture_thread_says_so():
    log = []
    s = foreign.ForeignSession([Recorder("a", log), Recorder("b", log)], 0)
    s.begin("S", 1)
    done = []
    t = threading.Thread(target=lambda: done.append(s.end(on_capture_thread=False)))
    t.start()
    t.join()
    assert len(done[0]) == 2
    assert [e for e in log if e[0] == "end"] == [("end", "b", "state-b", False), ("end", "a", "state-a", False)]


# ------------------------------------------------------------------ which libraries are followed

def test_register_and_unregister(libraries):
    log = []
    a = Recorder("a", log)
    with pytest.raises(TypeError, match="expects a Library, got object"):
        foreign.register_library(object())
    with pytest.raises(TypeError, match="got type"):
        foreign.register_library(Recorder)             # the class, not a library
    foreign.register_library(a)
    foreign.register_library(a)                        # once, however often registered
    assert libraries == [a]
    assert foreign.foreign_capture_libraries() == ("a",)
    foreign.unregister_library(a)
    foreign.unregister_library(a)                      # not registered: nothing happens
    assert libraries == [] and foreign.foreign_capture_libraries() == ()


def test_set_foreign_capture_and_the_capture_argument(libraries):
    log = []
    foreign.register_library(Recorder("a", log))
    foreign.register_library(Recorder("off", log, loaded=False))
    foreign.register_library(Recorder("b", log))
    for bad in (1, 0, "no", None, 1.0):
        with pytest.raises(TypeError, match="expects a bool"):
            tp.cuda.set_foreign_capture(bad)
    assert tp.cuda.foreign_capture_libraries() == ("a", "b")      # only loaded ones
    assert tp.cuda.foreign_capture_libraries(False) == ()
    tp.cuda.set_foreign_capture(False)
    assert tp.cuda.foreign_capture_libraries() == ()
    assert tp.cuda.foreign_capture_libraries(True) == ("a", "b")  # a capture's own choice wins
    assert foreign.begin_session(0, None) is None
    assert foreign.begin_session(0, True).names() == ("a", "b")
    tp.cuda.set_foreign_capture(True)
    assert tp.cuda.foreign_capture_libraries() == ("a", "b")
    s = foreign.begin_session(2, None)
    assert s.names() == ("a", "b") and s.device == 2 and s.states == []
    assert foreign.begin_session(0, False) is None
    assert log == []                                   # asking begins nothing


def test_begin_session_is_none_when_nothing_is_followed(libraries):
    assert foreign.begin_session(0, None) is None
    assert foreign.begin_session(0, True) is None
    foreign.register_library(Recorder("gone", [], loaded=False))
    assert foreign.begin_session(0, True) is None
    assert foreign.foreign_capture_libraries(True) == ()


def test_the_public_names():
    assert tp.cuda.set_foreign_capture is foreign.set_foreign_capture
    assert tp.cuda.foreign_capture_libraries is foreign.foreign_capture_libraries
    assert tp.cuda.ForeignRandomError is foreign.ForeignRandomError
    assert issubclass(tp.cuda.ForeignRandomError, RuntimeError)
    assert tp.cuda.graphs.ForeignRandomError is foreign.ForeignRandomError
    assert [type(lib) for lib in foreign._libraries[:2]] == [foreign.TorchLibrary, foreign.CupyLibrary]
    assert [lib.name for lib in foreign._libraries[:2]] == ["torch", "cupy"]


def test_the_library_base_class():
    lib = foreign.Library()
    for call in (lambda: lib.begin(0, None, 1), lambda: lib.follow(None, None), lambda: lib.end(None, True)):
        with pytest.raises(NotImplementedError):
            call()
    assert lib.current_stream_handle(0) is None

    class Sys(foreign.Library):
        module = "sys"

    class Missing(foreign.Library):
        module = "tensorplay_no_such_module_xyz"
    assert Sys().is_loaded() and not Missing().is_loaded()


_ENVIRONMENT = """
import tensorplay as tp
from tensorplay._graph import foreign
class Fake(foreign.Library):
    name = "fake"
    module = "sys"
foreign.register_library(Fake())
print(repr(tp.cuda.foreign_capture_libraries()))
print(repr("fake" in tp.cuda.foreign_capture_libraries(True)))
"""


@pytest.mark.parametrize("value, on", [("0", False), (" Off ", False), ("1", True)])
def test_the_environment_switch(value, on):
    out = run_python(_ENVIRONMENT, TENSORPLAY_FOREIGN_CAPTURE=value)
    assert out.returncode == 0, out.stderr
    listed, forced = out.stdout.strip().splitlines()
    assert forced == "True"
    assert ("'fake'" in listed) == on and (listed == "()") == (not on)


# ------------------------------------------------------------------ PyTorch's RNG error

def test_explain_capture_error():
    exc = RuntimeError(TORCH_RNG_MESSAGE)
    better = foreign.explain_capture_error(exc)
    assert isinstance(better, foreign.ForeignRandomError) and isinstance(better, RuntimeError)
    msg = str(better)
    assert "uniform_" in msg and "tp.from_dlpack" in msg and "normal_" in msg
    assert foreign.explain_capture_error(RuntimeError("CUDA error: operation not permitted when stream is "
                                                      "capturing")) is None
    assert foreign.explain_capture_error(ValueError(TORCH_RNG_MESSAGE)) is None       # only RuntimeErrors
    assert foreign.explain_capture_error(better) is None                              # never re-wrapped
    assert foreign.explain_capture_error(foreign.ForeignRandomError(TORCH_RNG_MESSAGE)) is None
    assert foreign.explain_capture_error(KeyboardInterrupt()) is None


class StandInGraph:
    """The graph methods the structured blocks call, recorded."""

    def __init__(self):
        self.calls = []
        self.is_capturing = True
        self.node = 0

    def begin_capture_to_if_node(self, pred):
        self.calls.append(("if", pred))

    def begin_capture_to_while_node(self, pred):
        self.calls.append(("while", pred))

    def _begin_node(self, kind, pred, n):
        self.calls.append(("node", kind, pred, n))
        self.node += 1

    @property
    def _innermost_conditional(self):
        return ("if", 2, -1, self.node)

    def _begin_branch(self, kind, k, what):
        self.calls.append(("branch", k))

    def _end_branch(self):
        self.calls.append(("end_branch",))

    def end_capture_to_conditional_node(self):
        self.calls.append(("end",))

    def reset(self):
        self.calls.append(("abort",))
        self.is_capturing = False


def _torch_rng_failure():
    raise RuntimeError(TORCH_RNG_MESSAGE)


@pytest.mark.parametrize("block", ["if", "while", "then", "otherwise", "case", "outer"])
def test_structured_blocks_translate_the_rng_error(block):
    g = StandInGraph()
    with pytest.raises(tp.cuda.ForeignRandomError, match="uniform_") as info:
        if block in ("if", "while"):
            with _structured.Body(g, IF_NODE if block == "if" else WHILE_NODE, "p"):
                _torch_rng_failure()
        elif block in ("then", "otherwise"):
            with _structured.IfElse(g, "p") as (then, otherwise):
                with (then if block == "then" else otherwise):
                    _torch_rng_failure()
        elif block == "case":
            with _structured.Switch(g, "i", 3) as cases:
                with cases[1]:
                    _torch_rng_failure()
        else:
            with _structured.IfElse(g, "p"):
                _torch_rng_failure()
    assert type(info.value.__cause__) is RuntimeError and str(info.value.__cause__) == TORCH_RNG_MESSAGE
    assert g.calls[-1] == ("abort",) and ("end",) not in g.calls and not g.is_capturing


def test_nested_blocks_do_not_wrap_twice():
    g = StandInGraph()
    with pytest.raises(tp.cuda.ForeignRandomError) as info:
        with _structured.Switch(g, "i", 2) as cases:
            with cases[0]:
                with _structured.Body(g, WHILE_NODE, "w"):
                    with _structured.Body(g, IF_NODE, "p"):
                        _torch_rng_failure()
    assert type(info.value.__cause__) is RuntimeError             # torch's error, not another wrapper
    assert g.calls.count(("abort",)) == 1                          # the outer blocks see it stopped


def test_other_errors_pass_through_the_blocks_unchanged():
    g = StandInGraph()
    with pytest.raises(RuntimeError, match="operation not permitted") as info:
        with _structured.Body(g, WHILE_NODE, "w"):
            raise RuntimeError("CUDA error: operation not permitted when stream is capturing")
    assert type(info.value) is RuntimeError and g.calls[-1] == ("abort",)


class RecordingGraph(tp.cuda.CUDAGraph):
    """A CUDAGraph whose capture calls are recorded, not run (no GPU)."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def capture_begin(self, pool=None, capture_error_mode="global", stream=None, foreign=None):
        self.calls.append(("begin", pool, capture_error_mode, stream, foreign))

    def capture_end(self):
        self.calls.append(("end",))

    def reset(self):
        self.calls.append(("reset",))


@pytest.mark.parametrize("choice", [None, True, False])
def test_graph_passes_foreign_on_and_translates_the_rng_error(choice):
    g = RecordingGraph()
    with tp.cuda.graph(g, pool=4, foreign=choice):
        pass
    assert g.calls == [("begin", 4, "global", None, choice), ("end",)]
    g.calls.clear()
    with pytest.raises(tp.cuda.ForeignRandomError, match="uniform_") as info:
        with tp.cuda.graph(g, foreign=choice):
            _torch_rng_failure()
    assert str(info.value.__cause__) == TORCH_RNG_MESSAGE
    assert g.calls == [("begin", None, "global", None, choice), ("reset",)]
    g.calls.clear()
    with pytest.raises(ZeroDivisionError):
        with tp.cuda.graph(g):
            1 / 0
    assert g.calls[-1] == ("reset",)


def test_foreign_must_be_a_bool_or_none():
    g = tp.cuda.CUDAGraph()
    for bad in ("yes", 1, 0, 1.0):
        with pytest.raises(TypeError, match="foreign must be None, True or False"):
            g.capture_begin(pool=5, foreign=bad)          # an explicit pool id: no GPU needed to get there
        with pytest.raises(TypeError, match="foreign must be None, True or False"):
            with tp.cuda.graph(g, pool=5, foreign=bad):
                pass
    assert not g.is_capturing


# ------------------------------------------------------------------ tensors at the boundary

def test_is_foreign_tensor():
    class Cai:
        __cuda_array_interface__ = {"shape": (1,), "typestr": "<f4", "data": (0, False), "version": 3}

    class Dl:
        def __dlpack__(self, stream=None):
            raise AssertionError("not called")

        def __dlpack_device__(self):
            return (2, 0)
    assert not foreign.is_foreign_tensor(np.zeros(3))        # host data, taken as before
    assert foreign.is_foreign_tensor(Cai()) and foreign.is_foreign_tensor(Dl())
    assert not foreign.is_foreign_tensor(tp.zeros(3))
    for obj in (3, 2.5, "s", None, [1, 2], (1,), b"x"):
        assert not foreign.is_foreign_tensor(obj)


def test_graph_tensor():
    t = tp.ones(3)
    assert foreign.graph_tensor(t) is t
    for obj in (3, 2.5, "s", None, [1, 2], (1, 2)):
        assert foreign.graph_tensor(obj) is obj
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    assert foreign.graph_tensor(a) is a            # NumPy arrays are host data, not converted

    class Dl:                                      # another library's array on the host
        def __init__(self):
            self.a = np.arange(6, dtype=np.float32)

        def __dlpack__(self, stream=None, **kwargs):
            return self.a.__dlpack__()

        def __dlpack_device__(self):
            return self.a.__dlpack_device__()
    d = Dl()
    v = foreign.graph_tensor(d)
    assert isinstance(v, tp.Tensor) and not v.is_cuda
    assert v.shape == (6,) and v.dtype is tp.float32 and v.data_ptr() == d.a.ctypes.data


def test_graph_tensor_before_tensorplay_is_whole(monkeypatch):
    monkeypatch.setattr(foreign, "foreign_converter", lambda: None)
    class Cai:
        __cuda_array_interface__ = {"shape": (2,), "typestr": "<f4", "data": (0, False), "version": 3}
    with pytest.raises(TypeError, match="Cai cannot be used here"):
        foreign.graph_tensor(Cai())
    assert foreign.graph_tensor(5) == 5


# ------------------------------------------------------------------ a fake PyTorch

class FakeTorchStream:
    def __init__(self, handle, device):
        self.cuda_stream = handle
        self.device_index = device

    def __repr__(self):
        return f"<stream {self.cuda_stream:#x} on {self.device_index}>"


class FakeMemPool:
    made = 0

    def __init__(self, device):
        FakeMemPool.made += 1
        self.device = device
        self.id = (1, FakeMemPool.made)
        self.segments = []

    def snapshot(self, include_traces=True):
        return self.segments


class FakeDevices:
    """The current device of a fake library, and its ``device(d)`` block."""

    device_now = 0

    @contextlib.contextmanager
    def device(self, d):
        prev, self.device_now = self.device_now, d
        try:
            yield
        finally:
            self.device_now = prev


class FakeTorch(FakeDevices):
    """``torch`` as TorchLibrary uses it: ``torch.cuda`` (two devices, each
    with its current stream, one current device) and
    ``torch._C._cuda_checkPoolLiveAllocations``."""

    def __init__(self, available=True):
        self.log = []
        self.device_now = 0
        self.streams = {0: FakeTorchStream(0, 0), 1: FakeTorchStream(0, 1)}
        self.live = {}                       # pool id -> True while a tensor lives in it
        self.available = available
        self.fail_set_stream = False
        self.module = types.SimpleNamespace(
            cuda=types.SimpleNamespace(
                is_available=self.is_available, current_device=lambda: self.device_now,
                current_stream=self.current_stream, set_stream=self.set_stream, set_device=self.set_device,
                ExternalStream=self.external_stream, device=self.device, MemPool=self.mem_pool,
                use_mem_pool=self.use_mem_pool, current_blas_handle=self.blas_handle),
            _C=types.SimpleNamespace(_cuda_checkPoolLiveAllocations=self.check_pool))

    def is_available(self):
        if isinstance(self.available, BaseException):
            raise self.available
        return self.available

    def current_stream(self, device=None):
        return self.streams[self.device_now if device is None else device]

    def set_stream(self, s):
        if self.fail_set_stream:
            raise RuntimeError("set_stream refused")
        self.log.append(("set_stream", s.cuda_stream, s.device_index))
        self.streams[s.device_index] = s

    def set_device(self, d):
        self.log.append(("set_device", d))
        self.device_now = d

    def external_stream(self, handle, device=None):
        self.log.append(("external", handle, device))
        return FakeTorchStream(handle, device)


    def mem_pool(self):
        self.log.append(("mem_pool", self.device_now))
        return FakeMemPool(self.device_now)

    @contextlib.contextmanager
    def use_mem_pool(self, pool, device=None):
        self.log.append(("route", pool.id, device))
        try:
            yield
        finally:
            self.log.append(("unroute", pool.id, device))

    def blas_handle(self):
        self.log.append(("blas", self.device_now))
        return 1

    def check_pool(self, device, pool_id, allowed):
        assert allowed == set()
        return not self.live.get(pool_id, False)


class CaptureStream:
    """What the adapters read of a tensorplay Stream: its handle."""

    def __init__(self, handle):
        self.handle = handle

    def __cuda_stream__(self):
        return (0, self.handle)


@pytest.fixture
def fake_torch(monkeypatch):
    gc.collect()                     # holds of real pools go now, not into this test's parked list
    monkeypatch.setattr(foreign._PoolHold, "parked", [])
    monkeypatch.setattr(foreign, "open_captures", lambda: [])
    fake = FakeTorch()
    monkeypatch.setitem(sys.modules, "torch", fake.module)
    return fake


def _events(fake, *kinds):
    return [e for e in fake.log if e[0] in kinds]


def test_torch_library_is_loaded(monkeypatch):
    lib = foreign.TorchLibrary()
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    assert not lib.is_loaded()
    for available, loaded in ((True, True), (False, False), (RuntimeError("broken build"), False)):
        monkeypatch.setitem(sys.modules, "torch", FakeTorch(available).module)
        assert lib.is_loaded() is loaded


def test_torch_library_switches_streams_and_restores_them(fake_torch):
    lib = foreign.TorchLibrary()
    before = fake_torch.current_stream(0)
    assert lib.current_stream_handle(0) == 0
    lib.prepare(0)                                           # before the capture begins
    state = lib.begin(0, CaptureStream(0x1000), 7)
    cur = fake_torch.current_stream(0)
    assert (cur.cuda_stream, cur.device_index) == (0x1000, 0)
    assert lib.current_stream_handle(0) == 0x1000
    pool = lib.mem_pool(0, 7)
    assert _events(fake_torch, "route", "unroute") == [("route", pool.id, 0)]
    assert _events(fake_torch, "blas") == [("blas", 0)]     # cuBLAS's handle made before the capture
    lib.follow(state, CaptureStream(0x2000))                 # a conditional body
    assert fake_torch.current_stream(0).cuda_stream == 0x2000
    lib.follow(state, CaptureStream(0x1000))                 # its parent again
    assert fake_torch.current_stream(0).cuda_stream == 0x1000
    keep = lib.end(state, True)
    assert fake_torch.current_stream(0) is before and fake_torch.device_now == 0
    assert _events(fake_torch, "route", "unroute") == [("route", pool.id, 0), ("unroute", pool.id, 0)]
    (hold,) = keep.values()
    assert isinstance(hold, foreign._PoolHold) and hold.pool is pool and hold.device == 0
    # the wrapper of a capture stream is kept: captures reuse their streams
    lib.end(lib.begin(0, CaptureStream(0x1000), 7), True)
    assert _events(fake_torch, "external") == [("external", 0x1000, 0), ("external", 0x2000, 0)]


def test_torch_library_restores_the_device_too(fake_torch):
    lib = foreign.TorchLibrary()
    before = {d: fake_torch.current_stream(d) for d in (0, 1)}
    lib.prepare(1)
    state = lib.begin(1, CaptureStream(0x3000), 9)          # capture on cuda:1, torch's device is 0
    assert fake_torch.device_now == 0
    assert fake_torch.current_stream(1).cuda_stream == 0x3000 and fake_torch.current_stream(0) is before[0]
    assert _events(fake_torch, "blas", "mem_pool") == [("blas", 1), ("mem_pool", 1)]
    assert lib.mem_pool(1, 9).device == 1
    fake_torch.set_device(1)                                 # the captured code moved torch's device
    lib.end(state, True)
    assert fake_torch.device_now == 0
    assert fake_torch.current_stream(1) is before[1] and fake_torch.current_stream(0) is before[0]
    assert _events(fake_torch, "unroute") == [("unroute", lib.mem_pool(1, 9).id, 1)]


def test_torch_library_ends_only_the_routing_off_the_capture_thread(fake_torch):
    lib = foreign.TorchLibrary()
    state = lib.begin(0, CaptureStream(0x1000), 3)
    fake_torch.log.clear()
    keep = lib.end(state, on_capture_thread=False)
    assert [e[0] for e in fake_torch.log] == ["unroute"]      # no set_stream, no set_device
    assert fake_torch.current_stream(0).cuda_stream == 0x1000
    assert len(keep) == 1


def test_torch_library_undoes_the_routing_when_begin_fails(fake_torch):
    lib = foreign.TorchLibrary()
    fake_torch.fail_set_stream = True
    with pytest.raises(RuntimeError, match="set_stream refused"):
        lib.begin(0, CaptureStream(0x1000), 3)
    assert [e[0] for e in _events(fake_torch, "route", "unroute")] == ["route", "unroute"]
    assert fake_torch.current_stream(0).cuda_stream == 0


def test_torch_pools_are_shared_per_device_and_pool_while_alive(fake_torch):
    lib = foreign.TorchLibrary()
    p = lib.mem_pool(0, 7)
    assert lib.mem_pool(0, 7) is p
    q, r = lib.mem_pool(0, 8), lib.mem_pool(1, 7)
    assert len({id(p), id(q), id(r)}) == 3
    s1 = lib.begin(0, CaptureStream(0x1000), 7)
    s2 = lib.begin(0, CaptureStream(0x2000), 7)               # a second capture into the same pool
    assert s1[3] is p and s2[3] is p
    lib.end(s2, True)
    lib.end(s1, True)
    ref, old = weakref.ref(p), p.id
    del p, s1, s2
    gc.collect()
    assert ref() is None                                      # nothing held it: gone
    assert lib.mem_pool(0, 7).id != old                       # a new one


def test_a_dropped_hold_parks_the_pool_until_no_tensor_uses_it(fake_torch, monkeypatch):
    lib = foreign.TorchLibrary()
    keep = lib.end(lib.begin(0, CaptureStream(0x1000), 7), True)
    pool = lib.mem_pool(0, 7)
    ref = weakref.ref(pool)
    fake_torch.live[pool.id] = True                           # a static output of PyTorch's lives in it
    del pool
    keep.clear()                                              # the graph's reset
    gc.collect()
    assert [p for _, p in foreign._PoolHold.parked] == [ref()] and ref() is not None
    foreign.release_parked_pools()
    assert len(foreign._PoolHold.parked) == 1                 # still used
    fake_torch.live.clear()                                   # the output died
    monkeypatch.setattr(foreign, "open_captures", lambda: ["a capture"])
    foreign.release_parked_pools()
    assert len(foreign._PoolHold.parked) == 1                 # never freed while a capture is open
    monkeypatch.setattr(foreign, "open_captures", lambda: [])
    foreign.release_parked_pools()
    assert foreign._PoolHold.parked == []
    gc.collect()
    assert ref() is None


def test_an_unused_pool_goes_when_its_hold_goes(fake_torch):
    lib = foreign.TorchLibrary()
    keep = lib.end(lib.begin(0, CaptureStream(0x1000), 7), True)
    ref = weakref.ref(lib.mem_pool(0, 7))
    keep.clear()
    gc.collect()
    assert foreign._PoolHold.parked == [] and ref() is None


def test_torch_pool_in_use_without_the_live_allocation_check():
    pool = FakeMemPool(0)
    no_check = types.SimpleNamespace(_C=types.SimpleNamespace())
    pool.segments = [{"allocated_size": 0}, {"allocated_size": 0}]
    assert not foreign._torch_pool_in_use(no_check, 0, pool)
    pool.segments = [{"allocated_size": 0}, {"allocated_size": 512}]
    assert foreign._torch_pool_in_use(no_check, 0, pool)

    def broken(*args):
        raise RuntimeError("no such pool")
    failing = types.SimpleNamespace(_C=types.SimpleNamespace(_cuda_checkPoolLiveAllocations=broken))
    pool.segments = [{"allocated_size": 512}]
    # PyTorch raises for a pool it never made (nothing was allocated in it): let go
    assert not foreign._torch_pool_in_use(failing, 0, pool)
    pool.snapshot = broken
    assert foreign._torch_pool_in_use(no_check, 0, pool)      # nothing known: kept


# ------------------------------------------------------------------ a fake CuPy

class FakeCupyStream:
    def __init__(self, cupy, ptr, device):
        self.cupy = cupy
        self.ptr = ptr
        self.device = device

    def use(self):
        self.cupy.log.append(("use", self.ptr, self.device))
        self.cupy.current[self.device] = self
        return self


class FakeCupy(FakeDevices):
    """``cupy`` as CupyLibrary uses it: ``cupy.cuda`` with a current stream
    per device, a device context, the allocator hook and memory wrappers."""

    def __init__(self):
        self.log = []
        self.device_now = 0
        self.current = {0: FakeCupyStream(self, 0, 0), 1: FakeCupyStream(self, 0, 1)}
        self.allocator = "cupy's pool"
        self.fail_use = False
        self.module = types.SimpleNamespace(cuda=types.SimpleNamespace(
            Device=self.device, get_current_stream=lambda: self.current[self.device_now],
            ExternalStream=self.external_stream, using_allocator=self.using_allocator,
            UnownedMemory=self.unowned_memory, MemoryPointer=self.memory_pointer))


    def external_stream(self, ptr, device_id=-1):
        if self.fail_use:
            raise RuntimeError("no such stream")
        return FakeCupyStream(self, ptr, self.device_now if device_id < 0 else device_id)

    @contextlib.contextmanager
    def using_allocator(self, fn):
        prev, self.allocator = self.allocator, fn
        self.log.append(("route",))
        try:
            yield
        finally:
            self.allocator = prev
            self.log.append(("unroute",))

    def unowned_memory(self, ptr, size, owner, device_id):
        return types.SimpleNamespace(ptr=ptr, size=size, owner=owner, device_id=device_id)

    def memory_pointer(self, mem, offset):
        return types.SimpleNamespace(mem=mem, offset=offset)


@pytest.fixture
def fake_cupy(monkeypatch):
    fake = FakeCupy()
    monkeypatch.setitem(sys.modules, "cupy", fake.module)
    return fake


def test_cupy_library_switches_streams_and_routes_allocations(fake_cupy):
    lib = foreign.CupyLibrary()
    assert lib.is_loaded()
    before = fake_cupy.current[1]
    state = lib.begin(1, CaptureStream(0x1000), 5)
    assert fake_cupy.device_now == 0                          # only inside the device's context
    assert fake_cupy.current[1].ptr == 0x1000 and fake_cupy.current[1].device == 1
    assert fake_cupy.current[0].ptr == 0
    assert lib.current_stream_handle(1) == 0x1000 and lib.current_stream_handle(0) == 0
    assert callable(fake_cupy.allocator)
    lib.follow(state, CaptureStream(0x2000))
    assert fake_cupy.current[1].ptr == 0x2000
    assert lib.end(state, True) == {}
    assert fake_cupy.current[1] is before and fake_cupy.allocator == "cupy's pool"
    assert fake_cupy.log[0] == ("route",) and fake_cupy.log[-1] == ("unroute",)
    assert ("use", 0, 1) in fake_cupy.log                     # the previous stream made current again


def test_cupy_allocations_come_from_tensorplays_allocator(fake_cupy, monkeypatch):
    made = []

    class Allocation:
        ptr = 0xABC000

    def allocate(nbytes, device, stream):
        made.append((nbytes, device, stream))
        return Allocation()
    monkeypatch.setattr(foreign, "allocate", allocate)
    monkeypatch.setattr(foreign, "current_stream_handle_of", lambda device: 0x2000 + device)
    lib = foreign.CupyLibrary()
    state = lib.begin(1, CaptureStream(0x1000), 5)
    ptr = fake_cupy.allocator(4096)
    assert made == [(4096, 1, 0x2001)]                        # on the current (capture or body) stream
    assert ptr.offset == 0 and ptr.mem.ptr == 0xABC000 and ptr.mem.size == 4096 and ptr.mem.device_id == 1
    assert isinstance(ptr.mem.owner, foreign._CupyBlock) and isinstance(ptr.mem.owner.allocation, Allocation)
    lib.end(state, True)


def test_cupy_library_leaves_the_capture_thread_alone_elsewhere(fake_cupy):
    lib = foreign.CupyLibrary()
    state = lib.begin(0, CaptureStream(0x1000), 5)
    n = len(fake_cupy.log)
    assert lib.end(state, on_capture_thread=False) == {}
    assert len(fake_cupy.log) == n and fake_cupy.current[0].ptr == 0x1000   # per-thread state: not touched
    lib.end(state, True)
    assert fake_cupy.current[0].ptr == 0 and fake_cupy.allocator == "cupy's pool"


def test_cupy_14_streams_come_from_the_stream_protocol_not_the_deprecated_external_stream(fake_cupy):
    wrapped = []

    def from_external(obj):
        version, ptr = obj.__cuda_stream__()
        wrapped.append((version, ptr, fake_cupy.device_now))
        return FakeCupyStream(fake_cupy, ptr, fake_cupy.device_now)

    def deprecated(*args):
        raise AssertionError("ExternalStream is deprecated in CuPy 14: not to be called")
    fake_cupy.module.cuda.Stream = types.SimpleNamespace(from_external=from_external)
    fake_cupy.module.cuda.ExternalStream = deprecated
    lib = foreign.CupyLibrary()
    state = lib.begin(1, CaptureStream(0x1000), 5)
    lib.follow(state, CaptureStream(0x2000))
    assert wrapped == [(0, 0x1000, 1), (0, 0x2000, 1)]        # wrapped inside the device's context
    assert fake_cupy.current[1].ptr == 0x2000 and fake_cupy.device_now == 0
    lib.end(state, True)
    assert fake_cupy.current[1].ptr == 0


def test_cupy_library_undoes_the_routing_when_begin_fails(fake_cupy):
    lib = foreign.CupyLibrary()
    fake_cupy.fail_use = True
    with pytest.raises(RuntimeError, match="no such stream"):
        lib.begin(0, CaptureStream(0x1000), 5)
    assert fake_cupy.log == [("route",), ("unroute",)] and fake_cupy.allocator == "cupy's pool"


def test_a_session_over_both_fakes(fake_torch, fake_cupy, libraries):
    """The default adapters in one session: begun torch then cupy, ended
    cupy then torch, both back where they were."""
    torch_lib, cupy_lib = foreign.TorchLibrary(), foreign.CupyLibrary()
    libraries.extend([torch_lib, cupy_lib])
    assert foreign.foreign_capture_libraries() == ("torch", "cupy")
    fake_torch.streams[0] = FakeTorchStream(0x77, 0)          # torch and CuPy each on a stream of their own
    fake_cupy.current[0] = FakeCupyStream(fake_cupy, 0x88, 0)
    s = foreign.begin_session(0, None)
    assert s.streams_to_join() == [0x77, 0x88]
    s.begin(CaptureStream(0x1000), 4)
    assert fake_torch.current_stream(0).cuda_stream == 0x1000 and fake_cupy.current[0].ptr == 0x1000
    s.follow(CaptureStream(0x2000))
    assert fake_torch.current_stream(0).cuda_stream == 0x2000 and fake_cupy.current[0].ptr == 0x2000
    keep = s.end()
    assert fake_torch.current_stream(0).cuda_stream == 0x77 and fake_cupy.current[0].ptr == 0x88
    assert [type(v) for v in keep.values()] == [foreign._PoolHold]



class FakeRawCalls:
    """PyTorch's raw calls (torch._C) that TorchLibrary uses when all exist:
    routing by pool id, the current stream as a tuple, the device."""

    def __init__(self, fake):
        self.fake = fake
        self.pool_uses = {}                  # pool id -> begun and not released

    def install(self):
        c = self.fake.module._C
        for name in foreign.TorchLibrary._RAW_CALLS:
            setattr(c, name, getattr(self, name))

    def _cuda_beginAllocateCurrentThreadToPool(self, device, pool_id):
        self.fake.log.append(("raw route", pool_id, device))
        self.pool_uses[pool_id] = self.pool_uses.get(pool_id, 0) + 1

    def _cuda_endAllocateToPool(self, device, pool_id):
        self.fake.log.append(("raw unroute", pool_id, device))

    def _cuda_releasePool(self, device, pool_id):
        self.pool_uses[pool_id] -= 1

    def _cuda_getCurrentStream(self, device):
        s = self.fake.streams[device]
        return (s.cuda_stream, s.device_index, 1)

    def _cuda_setStream(self, stream_id, device_index, device_type):
        self.fake.log.append(("set_stream", stream_id, device_index))
        self.fake.streams[device_index] = FakeTorchStream(stream_id, device_index)

    def _cuda_getDevice(self):
        return self.fake.device_now

    def _cuda_setDevice(self, d):
        self.fake.set_device(d)


def test_torch_library_raw_calls_route_by_pool_id_and_restore(fake_torch):
    """With PyTorch's raw calls, a capture's begin and end, and a pause and
    resume (CUDAGraph.outside_pool) between them, route and release the
    pool's id in pairs; the device is restored only where it changed."""
    raw = FakeRawCalls(fake_torch)
    raw.install()
    lib = foreign.TorchLibrary()
    FakeTorchStream.stream_id = property(lambda s: s.cuda_stream)
    FakeTorchStream.device_type = 1
    try:
        state = lib.begin(0, CaptureStream(0x1000), 7)
        pool_id = lib.mem_pool(0, 7).id
        assert fake_torch.streams[0].cuda_stream == 0x1000
        assert raw.pool_uses == {pool_id: 1}
        lib.pause(state)                                        # outside_pool()
        assert raw.pool_uses == {pool_id: 0}
        lib.resume(state)
        assert raw.pool_uses == {pool_id: 1}
        assert _events(fake_torch, "raw route", "raw unroute") == [
            ("raw route", pool_id, 0), ("raw unroute", pool_id, 0), ("raw route", pool_id, 0)]
        lib.end(state, True)
        assert raw.pool_uses == {pool_id: 0}
        assert fake_torch.streams[0].cuda_stream == 0                # PyTorch's stream before the capture
        assert _events(fake_torch, "set_device") == []                # the device never changed
        state = lib.begin(0, CaptureStream(0x1000), 7)
        fake_torch.set_device(1)                                      # the captured code moved it
        lib.end(state, True)
        assert fake_torch.device_now == 0 and raw.pool_uses == {pool_id: 0}
    finally:
        del FakeTorchStream.stream_id, FakeTorchStream.device_type
