# SPDX-License-Identifier: Apache-2.0
"""CuPy inside tensorplay captures: elementwise work with temporaries and a
reduction, in a plain capture and in IF/ELSE, WHILE and SWITCH bodies with
CuPy predicates, replayed on new inputs; CuPy's current stream restored
after a capture and a failed one; CuPy's allocations during a capture come
from tensorplay's pool (free_all_blocks between replays changes nothing,
capture/reset cycles stay flat); a synchronize inside a capture fails it
and leaves CuPy usable; PyTorch and CuPy in one capture."""

import gc
import traceback

import numpy as np
import pytest

import tensorplay as tp
from tensorplay.cuda import CUDAGraph

from helpers import capture_construct

pytestmark = pytest.mark.cuda
MiB = 1 << 20
N = 1 << 20                     # 1M float32: 4 MiB


@pytest.fixture
def cp():
    """CuPy with a GPU (skips without)."""
    cp = pytest.importorskip("cupy")
    try:
        if cp.cuda.runtime.getDeviceCount() < 1:
            pytest.skip("CuPy sees no GPU")
    except Exception as exc:                         # no driver, no runtime
        pytest.skip(f"CuPy cannot use the GPU: {exc}")
    yield cp
    cp.cuda.Device().synchronize()


def _sync(cp):
    cp.cuda.Device().synchronize()


def _close(cp, got, want, rtol=1e-5, atol=1e-5):
    np.testing.assert_allclose(cp.asnumpy(got), cp.asnumpy(want), rtol=rtol, atol=atol)


class Work:
    """Static CuPy inputs, ``fn`` of them, written or added into an output."""

    def __init__(self, cp, shapes, fn, tol):
        self.rs = cp.random.RandomState(1234)
        self.shapes = shapes
        self.inputs = [self.rs.standard_normal(s, dtype=cp.float32) for s in shapes]
        self.fn = fn
        self.rtol, self.atol = tol
        self.cp = cp

    def write(self, out):
        self.cp.copyto(out, self.fn(*self.inputs))

    def accumulate(self, out):
        out += self.fn(*self.inputs)

    def result(self):
        return self.fn(*self.inputs)

    def refresh(self):
        for static, shape in zip(self.inputs, self.shapes):
            static[...] = self.rs.standard_normal(shape, dtype=self.cp.float32)


def _work(cp, name):
    if name == "temporaries":
        return Work(cp, [(N,)], lambda a: cp.sin(a) * 2 + a, (1e-5, 1e-5))
    if name == "reduction":
        return Work(cp, [(1024, 1024)], lambda a: (cp.sin(a) * a).sum(axis=-1), (1e-4, 1e-3))
    raise AssertionError(name)


def _advance(c):
    c.count += 1


class Control:
    def __init__(self, cp):
        self.pred = cp.zeros(1, dtype=cp.bool_)
        self.index = cp.zeros(1, dtype=cp.int64)
        self.count = cp.zeros(1, dtype=cp.int32)
        self.limit = cp.zeros(1, dtype=cp.int32)


PLANS = {"graph": [None, None, None], "if_else": [True, False, True], "while": [3, 0, 1],
         "switch": [0, 1, 2, -1, 0]}


@pytest.mark.parametrize("construct", list(PLANS))
@pytest.mark.parametrize("workload", ["temporaries", "reduction"])
def test_cupy_work_in_graphs_and_conditional_bodies(cp, workload, construct):
    work = _work(cp, workload)
    out = cp.empty_like(work.result())
    c = Control(cp)
    work.write(out)                                  # every kernel once, eagerly
    work.accumulate(out)
    out.fill(-7.0)
    c.count += 1
    cp.less(c.count, c.limit, out=c.pred)
    _sync(cp)
    g = CUDAGraph()
    capture_construct(g, construct, work, out, c, other=lambda o: o.fill(-7.0),
                      recheck=lambda c: cp.less(c.count, c.limit, out=c.pred), advance=_advance)
    assert cp.cuda.get_current_stream().ptr == tp.cuda.current_stream().handle
    for v in PLANS[construct]:
        work.refresh()
        if construct == "if_else":
            c.pred.fill(v)
        elif construct == "while":
            c.count.fill(0)
            c.limit.fill(v)
            out.fill(0)
        elif construct == "switch":
            c.index.fill(v)
            out.fill(5.0)
        g.replay()
        _sync(cp)
        if construct == "while":
            want = cp.zeros_like(out)
            for _ in range(v):
                work.accumulate(want)
            assert int(c.count[0]) == v
        elif construct == "graph" or (construct == "if_else" and v) or (construct == "switch" and v == 0):
            want = work.result()
        elif construct == "if_else" or v == 1:
            want = cp.full_like(out, -7.0)
        else:
            want = cp.full_like(out, 5.0)
        _close(cp, out, want, work.rtol, work.atol)
    g.reset()


def test_cupy_follows_the_capture_and_is_restored(cp):
    rs = cp.random.RandomState(0)
    a = rs.standard_normal(N, dtype=cp.float32)

    def f(a):
        return cp.cos(a) * a + 1
    f(a)
    _sync(cp)
    before = cp.cuda.get_current_stream()
    g, failed = CUDAGraph(), CUDAGraph()
    with tp.cuda.graph(g):
        inside = cp.cuda.get_current_stream()
        assert inside.ptr == tp.cuda.current_stream().handle and inside.ptr != before.ptr
        y = f(a)
    assert cp.cuda.get_current_stream().ptr == before.ptr
    with pytest.raises(ValueError):
        with tp.cuda.graph(failed):
            f(a)
            raise ValueError("in the block")
    assert cp.cuda.get_current_stream().ptr == before.ptr
    pred = cp.ones(1, dtype=cp.bool_)
    with pytest.raises(ValueError):
        with tp.cuda.graph(failed):
            with failed.if_(pred):
                assert cp.cuda.get_current_stream().ptr == tp.cuda.current_stream().handle
                f(a)
                raise ValueError("in the body")
    assert cp.cuda.get_current_stream().ptr == before.ptr and not failed.is_capturing
    s = cp.cuda.Stream(non_blocking=True)
    g2 = CUDAGraph()
    with s:
        b = cp.full(N, 2.0, dtype=cp.float32)
        b *= 1.5                                   # queued on s: the capture must see it
        with tp.cuda.graph(g2):
            assert cp.cuda.get_current_stream().ptr not in (0, s.ptr)
            z = f(b)
        assert cp.cuda.get_current_stream().ptr == s.ptr
    assert cp.cuda.get_current_stream().ptr == before.ptr
    s.synchronize()
    for _ in range(2):
        a[...] = rs.standard_normal(N, dtype=cp.float32)
        g.replay()
        g2.replay()
        _sync(cp)
        _close(cp, y, f(a))
        _close(cp, z, f(cp.full(N, 3.0, dtype=cp.float32)))


def test_cupy_allocations_during_a_capture_come_from_tensorplays_pool(cp):
    pool = cp.get_default_memory_pool()
    rs = cp.random.RandomState(1)
    a = rs.standard_normal(N, dtype=cp.float32)

    def f(a):
        return (cp.sin(a) * 2 + a) * cp.cos(a)
    f(a)
    _sync(cp)
    gc.collect()
    used, allocated = pool.used_bytes(), tp.cuda.memory_allocated()
    g = CUDAGraph()
    with tp.cuda.graph(g):
        y = f(a)
        assert pool.used_bytes() == used                          # nothing from CuPy's pool
        assert tp.cuda.memory_allocated() >= allocated + y.nbytes
    assert isinstance(y.data.mem, cp.cuda.UnownedMemory)
    assert pool.used_bytes() == used
    assert tp.cuda.memory_allocated() >= allocated + y.nbytes     # the output lives in the graph's pool
    z = cp.empty(N, dtype=cp.float32)                             # eager again: CuPy's pool
    assert pool.used_bytes() >= used + z.nbytes
    del z
    for _ in range(3):
        pool.free_all_blocks()
        junk = [cp.full(N, 7.0, dtype=cp.float32) for _ in range(8)]
        a[...] = rs.standard_normal(N, dtype=cp.float32)
        g.replay()
        _sync(cp)
        _close(cp, y, f(a))
        assert all(bool((j == 7.0).all()) for j in junk)
        del junk
    del y
    g.reset()
    gc.collect()
    assert tp.cuda.memory_allocated() <= allocated


def test_capture_cycles_with_cupy_keep_memory_flat(cp):
    pool = cp.get_default_memory_pool()
    a = cp.random.RandomState(2).standard_normal(256 * 1024, dtype=cp.float32)     # 1 MiB

    def f(a):
        return cp.sin(a) * 2 + a
    f(a)
    _sync(cp)
    g = CUDAGraph()
    base = None
    for i in range(200):
        with tp.cuda.graph(g):
            y = f(a)
        g.replay()
        if i % 50 == 0:
            _sync(cp)
            _close(cp, y, f(a))
        del y
        g.reset()
        if i == 4:
            gc.collect()
            _sync(cp)
            base = (tp.cuda.memory_reserved(), pool.total_bytes())
    gc.collect()
    _sync(cp)
    assert tp.cuda.memory_reserved() <= base[0] + 4 * MiB, (tp.cuda.memory_reserved(), base)
    assert pool.total_bytes() <= base[1] + 4 * MiB, (pool.total_bytes(), base)


def test_a_cupy_synchronize_inside_a_capture_fails_it_and_cupy_recovers(cp):
    pool = cp.get_default_memory_pool()
    a = cp.random.RandomState(3).standard_normal(N, dtype=cp.float32)
    cp.sin(a) * 2
    _sync(cp)
    before = cp.cuda.get_current_stream()
    g = CUDAGraph()
    with pytest.raises(RuntimeError) as info:
        with tp.cuda.graph(g):
            cp.sin(a) * 2
            cp.cuda.get_current_stream().synchronize()
    traceback.clear_frames(info.value.__traceback__)
    del info
    assert not g.is_capturing and not tp.cuda.is_current_stream_capturing()
    assert cp.cuda.get_current_stream().ptr == before.ptr
    assert abs(float((a * 2).sum()) - 2 * float(a.sum())) < 1e-2       # CuPy works eagerly
    used = pool.used_bytes()
    z = cp.empty(N, dtype=cp.float32)
    assert pool.used_bytes() >= used + z.nbytes                          # its own allocator again
    with tp.cuda.graph(g):                                               # and tensorplay captures again
        w = cp.cos(a) + 1
    a[...] = 0.5
    g.replay()
    _sync(cp)
    _close(cp, w, cp.cos(cp.full(N, 0.5, dtype=cp.float32)) + 1)


def test_torch_and_cupy_in_one_capture(cp):
    """PyTorch writes a tensor, CuPy reads it in an IF body gated on a
    PyTorch predicate and writes another: both follow, in order."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("PyTorch sees no CUDA GPU")
    torch.cuda.current_blas_handle()
    x = torch.randn(N, device="cuda")
    h = torch.empty(N, device="cuda")
    out = torch.zeros(N, device="cuda")
    pred = torch.zeros(1, dtype=torch.bool, device="cuda")
    hc, outc = cp.from_dlpack(h), cp.from_dlpack(out)

    def torch_part():
        torch.mul(x, 2.0, out=h)
        h.relu_()

    def cupy_part():
        cp.copyto(outc, cp.sin(hc) + 1)
    torch_part()
    cupy_part()
    torch.cuda.synchronize()
    _sync(cp)
    assert set(tp.cuda.foreign_capture_libraries()) >= {"torch", "cupy"}
    g = CUDAGraph()
    with tp.cuda.graph(g):
        assert torch.cuda.current_stream().cuda_stream == cp.cuda.get_current_stream().ptr
        torch_part()
        with g.if_(pred):
            assert torch.cuda.current_stream().cuda_stream == cp.cuda.get_current_stream().ptr
            cupy_part()
    for flag in (True, False, True):
        x.copy_(torch.randn(N, device="cuda"))
        out.fill_(-1.0)
        pred.fill_(flag)
        g.replay()
        torch.cuda.synchronize()
        torch.testing.assert_close(h, (x * 2).relu())
        want = (x * 2).relu().sin() + 1 if flag else torch.full_like(out, -1.0)
        torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)
