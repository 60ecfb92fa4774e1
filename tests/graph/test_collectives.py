# SPDX-License-Identifier: Apache-2.0
"""NCCL collectives inside tensorplay graphs (world size 1, one GPU):
torch.distributed's all_reduce, all_gather_into_tensor, reduce_scatter_tensor
and broadcast captured into a graph, an IF body and a WHILE body, replayed
on new inputs and checked against NumPy; a thread_local capture; the
capturable check; a first collective inside a capture (a fresh process);
CuPy's NCCL; sleep refused while a pool's graphs hold NCCL kernels; and
CUDAGraph.outside_pool() letting another allocator (a MemPool of PyTorch's,
NCCL's ncclMemAlloc) serve allocations inside a capture.

The process group lives in a module fixture (per pytest-xdist worker, its
FileStore under tmp_path) and is destroyed at the module's end; anything
that sets NCCL's environment runs in a subprocess."""

import json
import textwrap

import numpy as np
import pytest

import tensorplay as tp
from tensorplay._graph import foreign
from tensorplay.cuda import CUDAGraph

from helpers import run_python, torch_cuda  # noqa: F401 (a fixture)

pytestmark = pytest.mark.cuda
N = 4096


@pytest.fixture(scope="module")
def dist(tmp_path_factory):
    """torch.distributed with an NCCL group of one rank on cuda:0, every
    collective of the tests run once eagerly (NCCL's lazy setup)."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("PyTorch sees no CUDA GPU")
    d = pytest.importorskip("torch.distributed")
    if not d.is_available() or not d.is_nccl_available():
        pytest.skip("this PyTorch has no torch.distributed with NCCL")
    if d.is_initialized():
        pytest.skip("a process group is already initialised in this process")
    torch.cuda.set_device(0)
    store = d.FileStore(str(tmp_path_factory.mktemp("nccl") / "store"), 1)
    d.init_process_group("nccl", store=store, rank=0, world_size=1)
    try:
        x = torch.ones(N, device="cuda")
        out = torch.empty_like(x)
        for op in OPS.values():
            op(d, out, x)
        torch.cuda.synchronize()
        yield d
    finally:
        torch.cuda.synchronize()
        d.destroy_process_group()


def _all_reduce(d, out, x):
    out.copy_(x)
    d.all_reduce(out)


def _all_gather(d, out, x):
    d.all_gather_into_tensor(out, x)          # world size 1: out has x's size


def _reduce_scatter(d, out, x):
    d.reduce_scatter_tensor(out, x)


def _broadcast(d, out, x):
    out.copy_(x)
    d.broadcast(out, src=0)


OPS = {"all_reduce": _all_reduce, "all_gather_into_tensor": _all_gather,
       "reduce_scatter_tensor": _reduce_scatter, "broadcast": _broadcast}


def _host(t):
    return t.cpu().numpy()


@pytest.mark.parametrize("op", list(OPS))
def test_a_collective_in_a_graph(dist, op):
    torch = pytest.importorskip("torch")
    x = torch.randn(N, device="cuda")
    out = torch.empty_like(x)
    g = CUDAGraph()
    with torch.no_grad(), tp.cuda.graph(g):
        OPS[op](dist, out, x * 2)
        y = out + 1
    for _ in range(3):
        x.copy_(torch.randn(N, device="cuda"))
        g.replay()
        torch.cuda.synchronize()
        want = _host(x).astype(np.float32) * 2          # one rank: the collective gives its input back
        np.testing.assert_allclose(_host(out), want, rtol=1e-6)
        np.testing.assert_allclose(_host(y), want + 1, rtol=1e-6)


@pytest.mark.parametrize("op", list(OPS))
def test_a_collective_in_an_if_body(dist, op):
    torch = pytest.importorskip("torch")
    x = torch.randn(N, device="cuda")
    out = torch.zeros(N, device="cuda")
    pred = torch.ones(1, dtype=torch.bool, device="cuda")
    g = CUDAGraph()
    with torch.no_grad(), tp.cuda.graph(g):
        with g.if_(pred):
            OPS[op](dist, out, x)
    for taken in (True, False, True):
        x.copy_(torch.randn(N, device="cuda"))
        out.fill_(-3.0)
        pred.fill_(taken)
        g.replay()
        torch.cuda.synchronize()
        want = _host(x) if taken else np.full(N, -3.0, np.float32)
        np.testing.assert_allclose(_host(out), want, rtol=1e-6)


@pytest.mark.parametrize("op", list(OPS))
def test_a_collective_in_a_while_body(dist, op):
    """Each iteration adds x and passes the sum through the collective."""
    torch = pytest.importorskip("torch")
    x = torch.randn(N, device="cuda")
    acc = torch.zeros(N, device="cuda")
    tmp = torch.empty_like(acc)
    count = torch.zeros(1, dtype=torch.int64, device="cuda")
    limit = torch.zeros(1, dtype=torch.int64, device="cuda")
    pred = torch.zeros(1, dtype=torch.bool, device="cuda")
    g = CUDAGraph()
    with torch.no_grad(), tp.cuda.graph(g):
        torch.lt(count, limit, out=pred)
        with g.while_(pred):
            acc.add_(x)
            OPS[op](dist, tmp, acc)
            acc.copy_(tmp)
            count.add_(1)
            torch.lt(count, limit, out=pred)
    for k in (4, 0, 7):
        x.copy_(torch.randn(N, device="cuda"))
        acc.zero_()
        count.zero_()
        limit.fill_(k)
        g.replay()
        torch.cuda.synchronize()
        assert count.item() == k
        want = np.zeros(N, np.float32)
        for _ in range(k):
            want += _host(x)
        np.testing.assert_allclose(_host(acc), want, rtol=1e-5, atol=1e-5)


def test_a_collective_in_a_thread_local_capture(dist):
    """capture_error_mode='thread_local', as one process driving several GPUs
    from several threads needs, captures a collective."""
    torch = pytest.importorskip("torch")
    x = torch.randn(N, device="cuda")
    out = torch.empty_like(x)
    g = CUDAGraph()
    with torch.no_grad(), tp.cuda.graph(g, capture_error_mode="thread_local"):
        _all_reduce(dist, out, x)
        out.mul_(3)
    x.copy_(torch.randn(N, device="cuda"))
    g.replay()
    torch.cuda.synchronize()
    np.testing.assert_allclose(_host(out), _host(x) * 3, rtol=1e-6)


def test_the_capturable_check_on_a_warm_group(dist, monkeypatch):
    tp.cuda.check_collectives_capturable()                     # the default group, warmed up by the fixture
    tp.cuda.check_collectives_capturable(dist.group.WORLD, device=0)
    monkeypatch.delenv("NCCL_GRAPH_MIXING_SUPPORT", raising=False)
    with pytest.raises(tp.cuda.CollectiveError, match=r"NCCL_GRAPH_MIXING_SUPPORT is not set \(NCCL's default: 1\)"):
        tp.cuda.check_collectives_capturable(in_conditional_body=True)
    monkeypatch.setenv("NCCL_GRAPH_MIXING_SUPPORT", "1")
    with pytest.raises(tp.cuda.CollectiveError, match="NCCL_GRAPH_MIXING_SUPPORT=1.*NCCL_GRAPH_MIXING_SUPPORT=0"):
        tp.cuda.check_collectives_capturable(in_conditional_body=True)
    monkeypatch.setenv("NCCL_GRAPH_MIXING_SUPPORT", "0")
    tp.cuda.check_collectives_capturable(in_conditional_body=True)


def test_a_first_collective_inside_a_capture(tmp_path):
    """A fresh group that ran no collective: the check says to run one
    eagerly; a first collective inside a capture either works (and replays
    right) or fails with that advice, never with NCCL's bare error."""
    code = textwrap.dedent(f"""
        import json, torch, torch.distributed as dist
        import tensorplay as tp
        if not (dist.is_available() and dist.is_nccl_available()):
            print(json.dumps({{"skip": "no NCCL in this PyTorch"}})); raise SystemExit
        torch.cuda.set_device(0)
        dist.init_process_group("nccl", store=dist.FileStore({str(tmp_path / 'store')!r}, 1), rank=0, world_size=1)
        out = {{}}
        try:
            tp.cuda.check_collectives_capturable()
            out["check"] = "passed"
        except tp.cuda.CollectiveError as exc:
            out["check"] = str(exc)
        x = torch.arange(16, dtype=torch.float32, device="cuda")
        y = torch.empty_like(x)
        g = tp.cuda.CUDAGraph()
        try:
            with tp.cuda.graph(g):
                y.copy_(x)
                dist.all_reduce(y)
            x.add_(1)
            g.replay()
            torch.cuda.synchronize()
            out["capture"] = "ok" if torch.equal(y, x) else "wrong values"
        except tp.cuda.CollectiveError as exc:
            out["capture"] = "CollectiveError: " + str(exc)
        except BaseException as exc:
            out["capture"] = f"{{type(exc).__name__}}: {{exc}}"
        print(json.dumps(out))
        dist.destroy_process_group()
        """)
    res = run_python(code)
    lines = [ln for ln in res.stdout.splitlines() if ln.startswith("{")]
    assert lines, res.stdout + res.stderr
    out = json.loads(lines[-1])
    if "skip" in out:
        pytest.skip(out["skip"])
    assert "Run one collective eagerly before capturing" in out["check"], out
    assert out["capture"] == "ok" or (out["capture"].startswith("CollectiveError") and "eagerly" in out["capture"]), out


# ------------------------------------------------------------------ CuPy's NCCL

def test_cupys_nccl_in_a_graph_and_a_while_body():
    cupy = pytest.importorskip("cupy")
    try:
        from cupy.cuda import nccl
    except ImportError as exc:
        pytest.skip(f"cupy.cuda.nccl is not available: {exc}")
    if not getattr(nccl, "available", True):
        pytest.skip("CuPy was built without NCCL")
    with cupy.cuda.Device(0):
        comm = nccl.NcclCommunicator(1, nccl.get_unique_id(), 0)
        x = cupy.arange(N, dtype=cupy.float32)
        y = cupy.zeros(N, dtype=cupy.float32)
        count = cupy.zeros(1, dtype=cupy.int64)
        limit = cupy.zeros(1, dtype=cupy.int64)
        pred = cupy.zeros(1, dtype=cupy.bool_)

        def reduce(stream):
            comm.allReduce(x.data.ptr, y.data.ptr, N, nccl.NCCL_FLOAT32, nccl.NCCL_SUM, stream)
        reduce(cupy.cuda.get_current_stream().ptr)     # eagerly first: NCCL's lazy setup
        cupy.cuda.Device().synchronize()
        g = CUDAGraph()
        with tp.cuda.graph(g):
            reduce(tp.cuda.current_stream().handle)
        x += 1
        y.fill(0)
        g.replay()
        tp.cuda.synchronize()
        np.testing.assert_array_equal(cupy.asnumpy(y), cupy.asnumpy(x))

        w = CUDAGraph()
        with tp.cuda.graph(w):
            cupy.less(count, limit, out=pred)
            with w.while_(pred):
                reduce(tp.cuda.current_stream().handle)     # the body's stream
                x += 1
                count += 1
                cupy.less(count, limit, out=pred)
        start = cupy.asnumpy(x).copy()
        limit.fill(3)
        count.fill(0)
        w.replay()
        tp.cuda.synchronize()
        assert int(count.get()[0]) == 3
        np.testing.assert_array_equal(cupy.asnumpy(y), start + 2)     # the last reduce saw x after two adds
        np.testing.assert_array_equal(cupy.asnumpy(x), start + 3)


# ------------------------------------------------------------------ sleep

NAMED_LIKE_NCCL = r"""
extern "C" __global__ void ncclDevKernel_tp_test_stand_in(float* x, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] = x[i] * 2.0f + 1.0f;
}
"""


def _sleepable_or_skip():
    from tensorplay._memory import vmm
    if not vmm.supported(0):
        pytest.skip("this device has no virtual memory management: pools cannot sleep")


def test_sleep_is_refused_while_a_graph_holds_nccl_kernels(monkeypatch):
    """A kernel named as NCCL's device kernels are (no process group needed)
    makes its pool's sleep refuse, naming NCCL_GRAPH_REGISTER; the override,
    NCCL_GRAPH_REGISTER=0 and a reset each let it sleep; values survive."""
    _sleepable_or_skip()
    kernel = tp.RawKernel(NAMED_LIKE_NCCL, "ncclDevKernel_tp_test_stand_in")
    pool = tp.cuda.GraphPool()
    x = tp.arange(N, dtype=tp.float32, device="cuda")
    kernel((N // 256,), (256,), (x, N))
    g = CUDAGraph()
    with tp.cuda.graph(g, pool=pool):
        y = x * 1.0
        kernel((N // 256,), (256,), (y, N))
    assert any(n["name"].startswith("ncclDevKernel") for n in g.describe()["nodes"] if n["kind"] == "kernel")
    monkeypatch.delenv("NCCL_GRAPH_REGISTER", raising=False)
    with pytest.raises(tp.cuda.CollectiveError) as info:
        pool.sleep()
    msg = str(info.value)
    assert "NCCL_GRAPH_REGISTER is not set (NCCL's default: 1)" in msg and "NCCL_GRAPH_REGISTER=0" in msg
    assert "reset()" in msg and "ncclDevKernel_tp_test_stand_in" in msg
    assert not pool.asleep
    monkeypatch.setenv("NCCL_GRAPH_REGISTER", "1")
    with pytest.raises(tp.cuda.CollectiveError, match="NCCL_GRAPH_REGISTER=1"):
        pool.sleep()

    def check():
        x.copy_(tp.arange(N, dtype=tp.float32, device="cuda"))
        g.replay()
        np.testing.assert_array_equal(y.cpu().numpy(), np.arange(N, dtype=np.float32) * 2 + 1)
    for allow in ("override", "env"):
        if allow == "override":
            assert pool.sleep(allow_collectives=True) > 0
        else:
            monkeypatch.setenv("NCCL_GRAPH_REGISTER", "0")
            assert pool.sleep() > 0
        with pytest.raises(tp.cuda.PoolAsleepError):
            g.replay()
        pool.wake()
        check()
        monkeypatch.delenv("NCCL_GRAPH_REGISTER", raising=False)
    del y
    g.reset()                     # the graph is gone: nothing NCCL registered stays
    pool.sleep()
    pool.wake()


def test_sleep_with_a_captured_torch_collective(dist, monkeypatch):
    """A real collective: if its graph holds NCCL kernels sleep is refused
    (world size 1 may copy without a kernel), else sleep, wake and replay."""
    _sleepable_or_skip()
    torch = pytest.importorskip("torch")
    monkeypatch.delenv("NCCL_GRAPH_REGISTER", raising=False)
    pool = tp.cuda.GraphPool()
    x = torch.randn(N, device="cuda")
    out = torch.empty_like(x)
    g = CUDAGraph()
    with torch.no_grad(), tp.cuda.graph(g, pool=pool):
        _all_reduce(dist, out, x * 2)
        y = out + 1
    names = [n.get("name") or "" for n in g.describe()["nodes"]]
    if any(n.startswith(("ncclDevKernel", "ncclKernel")) for n in names):
        with pytest.raises(tp.cuda.CollectiveError, match="NCCL_GRAPH_REGISTER"):
            pool.sleep()
    else:
        pool.sleep()
        pool.wake()
    x.copy_(torch.randn(N, device="cuda"))
    g.replay()
    torch.cuda.synchronize()
    np.testing.assert_allclose(_host(y), _host(x) * 2 + 1, rtol=1e-6)


# ------------------------------------------------------------------ another allocator inside a capture

def _segments(pool):
    return [(s["address"], s["address"] + s["total_size"]) for s in pool.snapshot()]


def _inside(ptr, segments):
    return any(lo <= ptr < hi for lo, hi in segments)


def _torch_pool_of(g):
    lib = next(lib for lib in foreign._libraries if lib.name == "torch")
    return lib.mem_pool(g.device_index, g.pool_id)


def test_outside_pool_lets_another_mempool_allocate(torch_cuda):
    torch = torch_cuda
    other = torch.cuda.MemPool()
    x = torch.randn(N, device="cuda")
    g = CUDAGraph()
    with tp.cuda.graph(g):
        a = x * 2                                    # the graph's pool
        with g.outside_pool():
            with torch.cuda.use_mem_pool(other):
                buf = torch.empty_like(x)            # the other pool
        buf.copy_(a)
        buf.add_(1)
        b = buf * 3                                  # the graph's pool again
    mine = _segments(_torch_pool_of(g))
    theirs = _segments(other)
    assert _inside(buf.data_ptr(), theirs) and not _inside(buf.data_ptr(), mine)
    assert _inside(a.data_ptr(), mine) and _inside(b.data_ptr(), mine)
    assert not _inside(a.data_ptr(), theirs) and not _inside(b.data_ptr(), theirs)
    for _ in range(2):
        x.copy_(torch.randn(N, device="cuda"))
        g.replay()
        torch.cuda.synchronize()
        np.testing.assert_allclose(_host(buf), _host(x) * 2 + 1, rtol=1e-6)
        np.testing.assert_allclose(_host(b), (_host(x) * 2 + 1) * 3, rtol=1e-6)


def test_outside_pool_is_refused_outside_a_capture(torch_cuda):
    g = CUDAGraph()
    with pytest.raises(RuntimeError, match="no capture is open"):
        with g.outside_pool():
            pass
    x = torch_cuda.ones(8, device="cuda")
    with tp.cuda.graph(g):
        with g.outside_pool():
            with pytest.raises(RuntimeError, match="already inside"):
                with g.outside_pool():
                    pass
        y = x + 1
    g.replay()
    np.testing.assert_array_equal(_host(y), np.full(8, 2.0, np.float32))


def test_outside_pool_with_ncclmemalloc_memory(dist):
    """NCCL's allocator (ncclMemAlloc behind the group's mem_allocator) serves
    a buffer inside a capture; a collective on it replays right."""
    torch = pytest.importorskip("torch")
    backend = dist.distributed_c10d._get_default_group()._get_backend(torch.device("cuda", 0))
    try:
        allocator = backend.mem_allocator
    except Exception as exc:          # an NCCL without ncclMemAlloc, a PyTorch without the property
        pytest.skip(f"this PyTorch's NCCL backend gives no mem_allocator: {exc}")
    if allocator is None:
        pytest.skip("this PyTorch's NCCL backend gives no mem_allocator")
    nccl_pool = torch.cuda.MemPool(allocator)
    x = torch.randn(N, device="cuda")
    g = CUDAGraph()
    # relaxed: ncclMemAlloc maps memory itself (cuMemCreate) during the capture
    with torch.no_grad(), tp.cuda.graph(g, capture_error_mode="relaxed"):
        with g.outside_pool():
            with torch.cuda.use_mem_pool(nccl_pool):
                buf = torch.empty_like(x)
        buf.copy_(x)
        dist.all_reduce(buf)
        y = buf - 1
    assert _inside(buf.data_ptr(), _segments(nccl_pool))
    assert not _inside(buf.data_ptr(), _segments(_torch_pool_of(g)))
    x.copy_(torch.randn(N, device="cuda"))
    g.replay()
    torch.cuda.synchronize()
    np.testing.assert_allclose(_host(buf), _host(x), rtol=1e-6)
    np.testing.assert_allclose(_host(y), _host(x) - 1, rtol=1e-6)
    del buf, y
    g.reset()
