# SPDX-License-Identifier: Apache-2.0
"""PyTorch (and Triton, which launches on PyTorch's stream) inside
tensorplay captures: elementwise ops with and without temporaries, cuBLAS
matmuls, an nn.Module and a Triton kernel, each in a plain capture and in
IF/ELSE, WHILE and SWITCH bodies with PyTorch predicates, replayed on new
inputs; PyTorch's current stream and device restored after a capture and a
failed one; following switched off; PyTorch's memory (empty_cache between
replays, 1,000 capture/replay/reset cycles, eager work beside a replaying
graph, pools shared between graphs); failed captures (item(), RNG ops);
thread-local captures on two threads; kernel names in describe()."""

import gc
import threading
import traceback

import pytest

import tensorplay as tp
from tensorplay._graph import foreign
from tensorplay.cuda import CUDAGraph

from helpers import capture_construct, torch_cuda as torch  # noqa: F401 (a fixture)

pytestmark = pytest.mark.cuda
MiB = 1 << 20
N = 1 << 20                     # 1M float32: 4 MiB


# ------------------------------------------------------------------ Triton

tl = None              # triton.language, once the fixture imported it (the kernel's globals)
_TRITON = {}


@pytest.fixture
def triton_add(torch):
    """``add(x, y)``: a Triton kernel writing x + y into a new PyTorch tensor."""
    global tl
    triton = pytest.importorskip("triton")
    if "add" not in _TRITON:
        import triton.language as tl

        @triton.jit
        def foreign_test_add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
            offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            mask = offs < n
            tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask), mask=mask)

        def add(x, y):
            out = torch.empty_like(x)
            n = x.numel()
            foreign_test_add_kernel[(triton.cdiv(n, 1024),)](x, y, out, n, BLOCK=1024)
            return out
        _TRITON["add"] = add
    return _TRITON["add"]


# ------------------------------------------------------------------ workloads

class Work:
    """Static PyTorch inputs (made by ``makers``, which also make new
    values), ``fn`` of them, and how a capture writes ``fn`` into an output
    (``write``) or adds it (``accumulate``)."""

    def __init__(self, makers, fn, tol, write=None, accumulate=None):
        self.makers = makers
        self.inputs = [m() for m in makers]
        self.fn = fn
        self.rtol, self.atol = tol
        self._write = write
        self._accumulate = accumulate

    def write(self, out):
        if self._write is not None:
            self._write(out, *self.inputs)
        else:
            out.copy_(self.fn(*self.inputs))

    def accumulate(self, out):
        if self._accumulate is not None:
            self._accumulate(out, *self.inputs)
        else:
            out.add_(self.fn(*self.inputs))

    def result(self):
        return self.fn(*self.inputs)

    def refresh(self):
        """New values into the static inputs."""
        for static, make in zip(self.inputs, self.makers):
            static.copy_(make())


WORKLOADS = ["elementwise", "temporaries", "matmul_fp32", "matmul_bf16", "mlp", "triton"]


def _work(torch, name, request):
    gen = torch.Generator(device="cuda")
    gen.manual_seed(1234)

    def randn(*shape, scale=1.0, dtype=torch.float32):
        return lambda: (torch.randn(*shape, device="cuda", generator=gen) * scale).to(dtype)
    if name == "elementwise":              # no temporaries: out= and in-place ops only
        def write(out, x):
            torch.mul(x, 2.0, out=out)
            out.add_(1.0)

        def accumulate(out, x):
            out.add_(x, alpha=2.0)
            out.add_(1.0)
        return Work([randn(N)], lambda x: x * 2.0 + 1.0, (1e-6, 1e-6), write, accumulate)
    if name == "temporaries":
        return Work([randn(1024, 1024)], lambda x: (x * 2 + 1).relu().sum(-1), (1e-5, 1e-3))
    if name == "matmul_fp32":
        return Work([randn(1024, 1024, scale=1 / 32), randn(1024, 1024)], lambda a, b: a @ b, (1e-4, 1e-4))
    if name == "matmul_bf16":
        return Work([randn(1024, 1024, scale=1 / 32, dtype=torch.bfloat16),
                     randn(1024, 1024, dtype=torch.bfloat16)], lambda a, b: a @ b, (2e-2, 2e-2))
    if name == "mlp":
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.GELU(),
                                    torch.nn.Linear(1024, 256)).cuda()
        return Work([randn(512, 1024)], model, (1e-4, 1e-4))
    if name == "triton":
        return Work([randn(N), randn(N)], request.getfixturevalue("triton_add"), (1e-6, 1e-6))
    raise AssertionError(name)


class Control:
    """The conditional nodes' PyTorch tensors: a predicate, a SWITCH index,
    a WHILE counter and its limit."""

    def __init__(self, torch):
        self.pred = torch.zeros(1, dtype=torch.bool, device="cuda")
        self.index = torch.zeros(1, dtype=torch.int64, device="cuda")
        self.count = torch.zeros(1, dtype=torch.int32, device="cuda")
        self.limit = torch.zeros(1, dtype=torch.int32, device="cuda")


def _warm(torch, work, out, c):
    """Every kernel of the capture once, eagerly: loaded before the capture."""
    work.write(out)
    work.accumulate(out)
    out.fill_(-7.0)
    c.count.add_(1)
    torch.lt(c.count, c.limit, out=c.pred)
    c.count.zero_()
    torch.cuda.synchronize()


def _capture(torch, g, construct, work, out, c):
    capture_construct(g, construct, work, out, c, other=lambda o: o.fill_(-7.0),
                      recheck=lambda c: torch.lt(c.count, c.limit, out=c.pred),
                      advance=lambda c: c.count.add_(1))


PLANS = {"graph": [None, None, None], "if_else": [True, False, True], "while": [3, 0, 1],
         "switch": [0, 1, 2, -1, 0]}


@pytest.mark.parametrize("construct", list(PLANS))
@pytest.mark.parametrize("workload", WORKLOADS)
def test_torch_work_in_graphs_and_conditional_bodies(torch, request, workload, construct):
    work = _work(torch, workload, request)
    out = torch.empty_like(work.result())
    c = Control(torch)
    _warm(torch, work, out, c)
    g = CUDAGraph()
    _capture(torch, g, construct, work, out, c)
    assert torch.cuda.current_stream() == torch.cuda.default_stream()
    assert g.num_nodes >= 1
    for v in PLANS[construct]:
        work.refresh()
        if construct == "if_else":
            c.pred.fill_(v)
        elif construct == "while":
            c.count.zero_()
            c.limit.fill_(v)
            out.zero_()
        elif construct == "switch":
            c.index.fill_(v)
            out.fill_(5.0)
        g.replay()
        torch.cuda.synchronize()
        if construct == "while":
            want = torch.zeros_like(out)
            for _ in range(v):
                work.accumulate(want)
            assert c.count.item() == v
        elif construct == "graph" or (construct == "if_else" and v) or (construct == "switch" and v == 0):
            want = work.result()
        elif construct == "if_else" or v == 1:
            want = torch.full_like(out, -7.0)
        else:
            want = torch.full_like(out, 5.0)               # no case ran
        torch.testing.assert_close(out, want, rtol=work.rtol, atol=work.atol)
    g.reset()


def test_a_loop_with_torch_temporaries_counts_its_iterations(torch):
    """WHILE: the body adds a PyTorch expression with temporaries and counts;
    the count and the sum are right for each limit."""
    x = torch.randn(N, device="cuda")
    acc = torch.zeros(N, device="cuda")
    count = torch.zeros(1, dtype=torch.int64, device="cuda")
    limit = torch.zeros(1, dtype=torch.int64, device="cuda")
    pred = torch.zeros(1, dtype=torch.bool, device="cuda")

    def body():
        acc.add_((x.sin() * 0.5).relu())
        count.add_(1)
        torch.lt(count, limit, out=pred)
    body()
    torch.cuda.synchronize()
    g = CUDAGraph()
    with tp.cuda.graph(g):
        torch.lt(count, limit, out=pred)
        with g.while_(pred):
            body()
    for k in (5, 1, 0, 12):
        x.copy_(torch.randn(N, device="cuda"))
        acc.zero_()
        count.zero_()
        limit.fill_(k)
        g.replay()
        torch.cuda.synchronize()
        assert count.item() == k
        want = torch.zeros_like(acc)
        for _ in range(k):
            want.add_((x.sin() * 0.5).relu())
        torch.testing.assert_close(acc, want, rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------ following, and restoring after

@pytest.fixture(params=["raw calls", "public wrappers"])
def torch_calls(request, torch, monkeypatch):
    """PyTorch followed through its torch._C calls (the default) or, as
    where this PyTorch lacks one of them, through use_mem_pool and set_stream."""
    if request.param == "public wrappers":
        monkeypatch.setattr(foreign.TorchLibrary, "_raw", lambda self, torch: None)
    return request.param


def test_torch_follows_the_capture_and_is_restored(torch, torch_calls):
    x = torch.randn(N, device="cuda")
    (x * 2).sin()
    torch.cuda.synchronize()
    device = torch.cuda.current_device()
    before = torch.cuda.current_stream()
    assert "torch" in tp.cuda.foreign_capture_libraries()
    g, failed = CUDAGraph(), CUDAGraph()
    with tp.cuda.graph(g):
        inside = torch.cuda.current_stream()
        assert inside.cuda_stream == tp.cuda.current_stream().handle
        assert inside.cuda_stream != before.cuda_stream
        assert torch.cuda.is_current_stream_capturing()
        y = (x * 2).sin()
    lib = next(lib for lib in foreign._libraries if isinstance(lib, foreign.TorchLibrary))
    segments = lib.mem_pool(device, g.pool_id).snapshot()      # the pool the capture routed to
    assert any(seg["address"] <= y.data_ptr() < seg["address"] + seg["total_size"] for seg in segments)
    assert torch.cuda.current_stream() == before and torch.cuda.current_device() == device
    assert not torch.cuda.is_current_stream_capturing()
    with pytest.raises(ValueError, match="in the block"):
        with tp.cuda.graph(failed):
            (x * 3).cos()
            raise ValueError("in the block")
    assert torch.cuda.current_stream() == before and torch.cuda.current_device() == device
    pred = torch.ones(1, dtype=torch.bool, device="cuda")
    with pytest.raises(ValueError, match="in the body"):
        with tp.cuda.graph(failed):
            with failed.if_(pred):
                assert torch.cuda.current_stream().cuda_stream == tp.cuda.current_stream().handle
                (x * 3).cos()
                raise ValueError("in the body")
    assert torch.cuda.current_stream() == before and not failed.is_capturing
    assert torch.cuda.current_device() == device
    for _ in range(2):
        x.copy_(torch.randn(N, device="cuda"))
        g.replay()
        torch.cuda.synchronize()
        torch.testing.assert_close(y, (x * 2).sin())


def test_a_capture_begun_on_a_torch_side_stream(torch):
    """PyTorch's current stream is a new stream of its own when the capture
    begins (no cuBLAS workspace made for it yet): the capture follows, and
    gives the stream back after a capture and after a failed one."""
    s = torch.cuda.Stream()
    g, failed = CUDAGraph(), CUDAGraph()
    with torch.cuda.stream(s):
        x = torch.full((N,), 2.0, device="cuda")
        x.mul_(1.5)                                  # queued on s before the capture
        with tp.cuda.graph(g):
            assert torch.cuda.current_stream().cuda_stream not in (0, s.cuda_stream)
            y = (x * 2).sin()
        assert torch.cuda.current_stream() == s
        with pytest.raises(ValueError):
            with tp.cuda.graph(failed):
                (x * 3).cos()
                raise ValueError("in the block")
        assert torch.cuda.current_stream() == s
    assert torch.cuda.current_stream() == torch.cuda.default_stream()
    torch.cuda.synchronize()
    g.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(y, torch.full_like(y, 6.0).sin())


def test_bodies_follow_their_own_streams(torch):
    """Inside each body PyTorch's stream is the body's, back to the
    parent's stream between and after them."""
    pred = torch.ones(1, dtype=torch.bool, device="cuda")
    index = torch.zeros(1, dtype=torch.int32, device="cuda")
    x = torch.ones(16, device="cuda")
    x.add_(1.0)
    torch.cuda.synchronize()
    seen = []

    def here():
        h = torch.cuda.current_stream().cuda_stream
        assert h == tp.cuda.current_stream().handle
        seen.append(h)
    g = CUDAGraph()
    with tp.cuda.graph(g):
        here()
        x.add_(1.0)
        with g.if_else(pred) as (then, otherwise):
            with then:
                here()
                x.add_(1.0)
            with otherwise:
                here()
                x.add_(1.0)
        here()
        with g.switch(index, 2) as cases:
            with cases[1]:
                here()
                with g.if_(pred):
                    here()
                    x.add_(1.0)
                here()
        here()
    assert seen[0] == seen[3] == seen[-1]                 # the capture stream around the nodes
    assert seen[1] != seen[0] and seen[2] != seen[0] and seen[4] != seen[0]
    assert seen[5] not in (seen[0], seen[4]) and seen[6] == seen[4]
    index.fill_(1)
    g.replay()
    torch.cuda.synchronize()
    assert x.tolist() == [5.0] * 16                       # 2, parent +1, then +1, case 1's IF +1


def test_foreign_off_leaves_torch_alone(torch):
    """foreign=False, and set_foreign_capture(False): PyTorch's stream is its
    own during the capture, its work runs once, eagerly, and the graph does
    not contain it; foreign=True captures it while the process switch is off."""
    a = tp.ones(N, device="cuda")
    t = torch.ones(N, device="cuda")
    (a * 2.0, t.mul_(3.0))
    torch.cuda.synchronize()
    ref = CUDAGraph()
    with tp.cuda.graph(ref):
        a * 2.0
    for how in ("argument", "process"):
        t.fill_(1.0)
        torch.cuda.synchronize()
        g = CUDAGraph()
        try:
            if how == "process":
                tp.cuda.set_foreign_capture(False)
                assert tp.cuda.foreign_capture_libraries() == ()
                assert "torch" in tp.cuda.foreign_capture_libraries(True)
                ctx = tp.cuda.graph(g)
            else:
                ctx = tp.cuda.graph(g, foreign=False)
            with ctx:
                assert torch.cuda.current_stream() == torch.cuda.default_stream()
                assert not torch.cuda.is_current_stream_capturing()
                b = a * 2.0
                t.mul_(3.0)                  # eager, on PyTorch's stream
        finally:
            tp.cuda.set_foreign_capture(True)
        torch.cuda.synchronize()
        assert t.eq(3.0).all().item()
        assert g.num_nodes == ref.num_nodes
        names = [n.get("name", "") for n in g.describe()["nodes"] if n["kind"] == "kernel"]
        assert not any("_ZN2at" in n for n in names), names
        g.replay()
        g.replay()
        torch.cuda.synchronize()
        assert t.eq(3.0).all().item() and b.numpy()[:3].tolist() == [2.0] * 3
    forced = CUDAGraph()
    try:
        tp.cuda.set_foreign_capture(False)
        with tp.cuda.graph(forced, foreign=True):
            assert torch.cuda.is_current_stream_capturing()
            t.mul_(3.0)
    finally:
        tp.cuda.set_foreign_capture(True)
    assert forced.num_nodes >= 1
    t.fill_(1.0)
    forced.replay()
    forced.replay()
    torch.cuda.synchronize()
    assert t.eq(9.0).all().item()


@pytest.mark.multigpu
def test_a_capture_on_another_device_restores_torchs_device(torch):
    x = torch.randn(N, device="cuda:1")
    (x * 2).sin()
    with torch.cuda.device(1):
        torch.cuda.current_blas_handle()
    torch.cuda.synchronize(1)
    before = {d: torch.cuda.current_stream(d) for d in (0, 1)}
    g = CUDAGraph()
    with tp.cuda.device(1):
        with tp.cuda.graph(g):
            assert torch.cuda.current_stream(1).cuda_stream == tp.cuda.current_stream().handle
            y = (x * 2).sin()
            torch.cuda.set_device(1)             # the captured code moves PyTorch's device
        assert torch.cuda.current_device() == 0
        assert {d: torch.cuda.current_stream(d) for d in (0, 1)} == before
        x.copy_(torch.randn(N, device="cuda:1"))
        g.replay()
    torch.cuda.synchronize(1)
    torch.testing.assert_close(y, (x * 2).sin())


# ------------------------------------------------------------------ memory

def _torch_pool_ranges(torch, g):
    """[start, end) of the segments of PyTorch's pool that ``g``'s captures
    allocated from, or None if that cannot be read."""
    lib = next((lib for lib in foreign._libraries if lib.name == "torch"), None)
    pools = getattr(lib, "_pools", None)
    pool = pools.get((g.device_index, g.pool_id)) if pools is not None else None
    if pool is None:
        return None
    want = tuple(pool.id)
    try:
        segments = torch.cuda.memory_snapshot()
    except Exception:
        return None
    return [(s["address"], s["address"] + s["total_size"]) for s in segments
            if tuple(s.get("segment_pool_id", ())) == want]


def _inside(ptr, ranges):
    return any(lo <= ptr < hi for lo, hi in ranges)


def _private_reserved(torch):
    """Bytes PyTorch holds in pools other than its default one (the graphs'
    pools): eager work's cache does not count."""
    return sum(s["total_size"] for s in torch.cuda.memory_snapshot()
               if tuple(s.get("segment_pool_id", (0, 0))) != (0, 0))


def _settle(torch):
    """Let go now of what earlier tests left (their graphs' PyTorch pools,
    parked until a capture boundary), so that it is not let go in the
    middle of a measurement."""
    gc.collect()
    foreign.release_parked_pools()
    gc.collect()
    torch.cuda.synchronize()


def test_empty_cache_between_replays_changes_nothing(torch):
    """empty_cache() between replays frees nothing the graph uses (its
    temporaries' blocks, cuBLAS's workspace for the capture stream): eager
    tensors made after it and the graph's outputs stay right."""
    x = torch.randn(N, device="cuda")
    a = torch.randn(1024, 1024, device="cuda") / 32
    b = torch.randn(1024, 1024, device="cuda")

    def f(x):
        return ((x * 2).sin() + x).relu() * 0.5
    (f(x), (a @ b).tanh())
    torch.cuda.synchronize()
    g = CUDAGraph()
    with tp.cuda.graph(g):
        out = f(x)
        c = (a @ b).tanh()
    for k in range(3):
        torch.cuda.empty_cache()
        junk = [torch.full((N,), 7.0, device="cuda") for _ in range(16)]   # where freed memory would go
        x.copy_(torch.randn(N, device="cuda"))
        a.copy_(torch.randn(1024, 1024, device="cuda") / 32)
        g.replay()
        torch.cuda.synchronize()
        torch.testing.assert_close(out, f(x))
        torch.testing.assert_close(c, (a @ b).tanh(), rtol=1e-4, atol=1e-4)
        assert all(j.eq(7.0).all().item() for j in junk)
        del junk


def test_a_thousand_capture_replay_reset_cycles_keep_memory_flat(torch):
    x = torch.randn(256, 1024, device="cuda")          # 1 MiB

    def f(x):
        return (x * 2 + 1).relu().sum(-1)
    f(x)
    _settle(torch)
    g = CUDAGraph()
    base_torch = base_tp = None
    for i in range(1000):
        with tp.cuda.graph(g):
            y = f(x)
        g.replay()
        if i % 100 == 0 or i == 999:
            x.copy_(torch.randn(256, 1024, device="cuda"))
            g.replay()
            torch.cuda.synchronize()
            torch.testing.assert_close(y, f(x), rtol=1e-5, atol=1e-3)
        del y
        g.reset()
        if i == 9:                         # after a warm-up of a few cycles
            gc.collect()
            torch.cuda.synchronize()
            base_torch, base_tp = torch.cuda.memory_reserved(), tp.cuda.memory_reserved()
    gc.collect()
    torch.cuda.synchronize()
    assert torch.cuda.memory_reserved() <= base_torch + 4 * MiB, (torch.cuda.memory_reserved(), base_torch)
    assert tp.cuda.memory_reserved() <= base_tp + 4 * MiB, (tp.cuda.memory_reserved(), base_tp)


def test_matmul_capture_cycles_stay_flat(torch):
    """cuBLAS in the capture (its workspace for the capture stream comes
    from the capture's PyTorch pool): after the first cycle, capture /
    replay / reset cycles do not grow PyTorch's reserved memory."""
    a = torch.randn(1024, 1024, device="cuda") / 32
    b = torch.randn(1024, 1024, device="cuda")
    a @ b
    _settle(torch)
    g = CUDAGraph()
    base = None
    for i in range(50):
        with tp.cuda.graph(g):
            c = (a @ b).relu()
        g.replay()
        if i % 10 == 0:
            torch.cuda.synchronize()
            torch.testing.assert_close(c, (a @ b).relu(), rtol=1e-4, atol=1e-4)
        del c
        g.reset()
        if i == 2:
            _settle(torch)
            base = torch.cuda.memory_reserved()
    _settle(torch)
    assert torch.cuda.memory_reserved() <= base + 4 * MiB, (base, torch.cuda.memory_reserved())


def test_eager_torch_work_never_gets_the_graphs_blocks(torch):
    """A graph writes its static output from PyTorch temporaries; between
    replays PyTorch allocates, writes and frees tensors eagerly, on the
    replay's stream and on another one: the graph's output and the eager
    tensors stay right, and no eager tensor lies in the graph's pool."""
    x = torch.randn(N, device="cuda")

    def f(x):
        return x.sin() * 2 + x.cos() * (x * 0.5).exp()
    f(x)
    torch.cuda.synchronize()
    g = CUDAGraph()
    with tp.cuda.graph(g):
        out = f(x)
    ranges = _torch_pool_ranges(torch, g)
    if ranges is not None:
        assert ranges and _inside(out.data_ptr(), ranges)        # the capture's memory is PyTorch's pool's
    side = torch.cuda.Stream()
    inputs = [torch.randn(N, device="cuda") for _ in range(3)]
    kept = []
    for i in range(30):
        x.copy_(inputs[i % 3])
        g.replay()
        stream = side if i % 2 else torch.cuda.current_stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            fresh = [torch.full((N // (1 + j % 4),), float(100 * i + j), device="cuda") for j in range(8)]
            scratch = [torch.empty(N, device="cuda").fill_(-1.0) for _ in range(4)]
            del scratch                                             # freed eagerly, reused by the next ones
            fresh += [torch.empty(N // 2, device="cuda").fill_(float(100 * i + 50 + j)) for j in range(4)]
        g.replay()                          # runs beside the side stream's work
        torch.cuda.synchronize()
        torch.testing.assert_close(out, f(x))
        for tensors, k in ((kept, i - 1), (fresh, i)):
            for j, t in enumerate(tensors):
                want = float(100 * k + j) if j < 8 else float(100 * k + 50 + j - 8)
                assert t.eq(want).all().item(), (k, j)
        if ranges is not None:
            assert not any(_inside(t.data_ptr(), ranges) for t in fresh)
        kept = fresh


def test_graphs_sharing_a_pool_share_torchs_pool(torch):
    x = torch.randn(N, device="cuda")

    def f1(x):
        return (x * 2).sin() + 1

    def f2(y):
        return (y * 3).cos() - y
    f2(f1(x))
    _settle(torch)
    base = _private_reserved(torch)
    pool = tp.cuda.graph_pool_handle()
    g1, g2 = CUDAGraph(), CUDAGraph()
    with tp.cuda.graph(g1, pool=pool):
        y1 = f1(x)
    after1 = _private_reserved(torch)
    with tp.cuda.graph(g2, pool=g1):
        y2 = f2(y1)
    after2 = _private_reserved(torch)
    assert g1.pool_id == g2.pool_id == pool
    ranges = _torch_pool_ranges(torch, g1)
    if ranges is not None:
        assert _inside(y1.data_ptr(), ranges) and _inside(y2.data_ptr(), ranges)     # one PyTorch pool
    assert after1 > base
    assert after2 - base < 2 * (after1 - base), (base, after1, after2)     # the second reused the first's
    for _ in range(3):
        x.copy_(torch.randn(N, device="cuda"))
        g1.replay()
        g2.replay()
        torch.cuda.synchronize()
        torch.testing.assert_close(y1, f1(x))
        torch.testing.assert_close(y2, f2(f1(x)))
    del y1, y2
    g1.reset()
    g2.reset()
    gc.collect()
    torch.cuda.synchronize()
    assert _private_reserved(torch) <= base, (base, _private_reserved(torch))


def test_an_output_alive_at_reset_frees_torchs_pool_later(torch):
    """reset() with a static output still alive: PyTorch's pool stays while
    it lives; once it is gone the pool is let go at the next capture."""
    x = torch.randn(N, device="cuda")
    (x * 2).sin()
    _settle(torch)
    base = _private_reserved(torch)
    g = CUDAGraph()
    with tp.cuda.graph(g):
        y = (x * 2).sin()
    g.replay()
    g.reset()
    gc.collect()
    torch.cuda.synchronize()
    torch.testing.assert_close(y, (x * 2).sin())            # still valid after the reset
    assert _private_reserved(torch) > base
    del y
    gc.collect()
    other = CUDAGraph()
    a = tp.ones(16, device="cuda")
    with tp.cuda.graph(other):                              # a capture boundary
        a * 2.0
    other.reset()
    gc.collect()
    torch.cuda.synchronize()
    assert _private_reserved(torch) <= base, (base, _private_reserved(torch))


# ------------------------------------------------------------------ failed captures

def test_item_inside_a_capture_raises_and_torch_recovers(torch):
    x = torch.randn(N, device="cuda")
    (x * 2).sum()
    torch.cuda.synchronize()
    g = CUDAGraph()
    with pytest.raises(RuntimeError) as info:
        with tp.cuda.graph(g):
            y = x * 2
            y.sum().item()
    traceback.clear_frames(info.value.__traceback__)
    del info
    assert not g.is_capturing and not tp.cuda.is_current_stream_capturing()
    assert torch.cuda.current_stream() == torch.cuda.default_stream()
    assert not torch.cuda.is_current_stream_capturing()
    assert abs((x * 2).sum().item() - 2 * x.sum().item()) < 1e-2          # PyTorch works eagerly
    z = torch.empty(N, device="cuda").fill_(3.0)
    assert z.sum().item() == 3.0 * N
    with tp.cuda.graph(g):                                                # and captures again
        w = (x * 3).relu()
    x.copy_(torch.randn(N, device="cuda"))
    g.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(w, (x * 3).relu())


@pytest.mark.parametrize("op", ["rand", "dropout", "randn_in_a_body"])
def test_a_torch_random_op_raises_foreign_random_error(torch, op):
    x = torch.randn(N, device="cuda")
    pred = torch.ones(1, dtype=torch.bool, device="cuda")
    torch.rand(N, device="cuda")
    torch.nn.functional.dropout(x, 0.5, training=True)
    torch.cuda.synchronize()
    g = CUDAGraph()
    with pytest.raises(tp.cuda.ForeignRandomError, match="uniform_") as info:
        with tp.cuda.graph(g):
            y = x * 2
            if op == "rand":
                y = y + torch.rand(N, device="cuda")
            elif op == "dropout":
                y = torch.nn.functional.dropout(y, 0.5, training=True)
            else:
                with g.if_(pred):
                    y.add_(torch.randn(N, device="cuda"))
    cause = info.value.__cause__
    assert isinstance(cause, RuntimeError) and not isinstance(cause, tp.cuda.ForeignRandomError)
    assert "generator not in capture mode" in str(cause)
    traceback.clear_frames(info.value.__traceback__)
    del info, cause
    assert not g.is_capturing
    assert torch.cuda.current_stream() == torch.cuda.default_stream()
    r = torch.rand(N, device="cuda")                     # PyTorch's generator works eagerly
    assert 0.0 <= r.min().item() and r.max().item() < 1.0
    a = tp.ones(8, device="cuda")
    with tp.cuda.graph(g):                               # both libraries capture again
        b = a * 2.0
        z = x * 2
    g.replay()
    torch.cuda.synchronize()
    assert b.tolist() == [2.0] * 8
    torch.testing.assert_close(z, x * 2)


def test_tensorplays_generators_fill_torch_tensors_in_a_capture(torch):
    t = torch.empty(N, device="cuda")
    tp.from_dlpack(t).uniform_()
    (t * 2).sum()
    torch.cuda.synchronize()
    g = CUDAGraph()
    with tp.cuda.graph(g):
        tp.from_dlpack(t).uniform_()
        y = t * 2
    draws = []
    for _ in range(3):
        g.replay()
        torch.cuda.synchronize()
        draws.append(y.clone())
    for d in draws:
        assert 0.0 <= d.min().item() and d.max().item() < 2.0
        assert abs(d.mean().item() - 1.0) < 0.01
    assert not torch.equal(draws[0], draws[1]) and not torch.equal(draws[1], draws[2])


# ------------------------------------------------------------------ threads

def test_thread_local_captures_on_two_threads_at_once(torch):
    xs = [torch.randn(N, device="cuda") for _ in range(2)]

    def f(x, i):
        return (x * (i + 2)).sin() + x.relu()
    for i in range(2):
        f(xs[i], i)
    torch.cuda.synchronize()
    barrier = threading.Barrier(2, timeout=60)
    results, errors = [None, None], []

    def work(i):
        try:
            torch.cuda.current_blas_handle()       # as an eager run would (a fresh thread's first: below)
            g = CUDAGraph()
            with tp.cuda.graph(g, capture_error_mode="thread_local"):
                barrier.wait()                     # both captures are open
                handle = torch.cuda.current_stream().cuda_stream
                assert handle == tp.cuda.current_stream().handle
                y = f(xs[i], i)
                barrier.wait()
            assert torch.cuda.current_stream() == torch.cuda.default_stream()
            results[i] = (g, y, handle)
        except BaseException as exc:
            errors.append(exc)
            barrier.abort()
    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert results[0][2] != results[1][2]              # each captured on a stream of its own
    for _ in range(2):
        for i in range(2):
            xs[i].copy_(torch.randn(N, device="cuda"))
        for i in (1, 0):
            results[i][0].replay()
        torch.cuda.synchronize()
        for i in range(2):
            torch.testing.assert_close(results[i][1], f(xs[i], i))


def test_a_fresh_thread_captures_a_matmul(torch):
    """A thread that never ran cuBLAS captures a matmul in global mode (its
    cuBLAS handle and workspace are made by the capture)."""
    a = torch.randn(1024, 1024, device="cuda") / 32
    b = torch.randn(1024, 1024, device="cuda")
    a @ b
    torch.cuda.synchronize()
    result = {}

    def work():
        try:
            g = CUDAGraph()
            with tp.cuda.graph(g):
                c = a @ b
            result["graph"], result["c"] = g, c
        except BaseException as exc:
            result["error"] = exc
    t = threading.Thread(target=work)
    t.start()
    t.join()
    assert "error" not in result, repr(result.get("error"))
    a.copy_(torch.randn(1024, 1024, device="cuda") / 32)
    result["graph"].replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(result["c"], a @ b, rtol=1e-4, atol=1e-4)


# ------------------------------------------------------------------ describe

def _kernel_names(desc):
    names = []
    for node in desc["nodes"]:
        if node["kind"] == "kernel":
            names.append(node.get("name", ""))
        for body in node.get("bodies", ()):
            names += _kernel_names(body)
    return names


def test_describe_names_torchs_kernels(torch):
    x = torch.randn(N, device="cuda")
    a = torch.randn(1024, 1024, device="cuda")
    pred = torch.ones(1, dtype=torch.bool, device="cuda")
    ((x * 2).relu(), a @ a)
    torch.cuda.synchronize()
    g = CUDAGraph()
    with tp.cuda.graph(g):
        y = (x * 2).relu()
        with g.if_(pred):
            c = a @ a
    g.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(c, a @ a, rtol=1e-4, atol=1e-3)
    torch.testing.assert_close(y, (x * 2).relu())
    names = _kernel_names(g.describe())
    assert names and all(names), names
    assert any("_ZN2at" in n or "at::" in n or "native" in n or "elementwise" in n for n in names), names
    foreign_names = [n for n in names if not n.startswith("tp_")]
    assert len(foreign_names) >= 3, names               # mul, relu and cuBLAS's kernel(s)
    assert "?" not in names, f"kernel nodes without a name: {names}"
