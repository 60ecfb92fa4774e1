# SPDX-License-Identifier: Apache-2.0
"""GraphSet: one graph per batch size in one pool. Values for every size and
for sizes between captured ones (tensorplay and PyTorch work), padding,
eager fallback beyond the largest size, outputs shared between sizes, two
sets sharing a pool, sleep/wake cycles with values and memory checked, and
the errors. The validation that needs no GPU is test_graphset_cpu.py's."""
import gc
import threading
import time
import warnings

import numpy as np
import pytest

import tensorplay as tp
from tensorplay._memory import vmm
from tensorplay.cuda import GraphPool, GraphSet, PoolAsleepError

from helpers import torch_cuda as torch  # noqa: F401 (a fixture)
from helpers import warm

pytestmark = pytest.mark.cuda
MiB = 1 << 20
SIZES = [1, 2, 4, 8, 16, 32]


def device_free():
    tp.cuda.synchronize()
    return tp.cuda.mem_get_info()[0]


def tp_step(x, y):
    return x * 2.0 + y, x - y


def test_every_size_and_the_sizes_between_give_numpys_values():
    rng = np.random.default_rng(0)
    sample = tp.tensor(rng.standard_normal((3, 1000), dtype=np.float32), device="cuda")
    gs = GraphSet(tp_step, [sample, sample], SIZES, progress=False)
    assert sorted(gs.graphs) == SIZES and set(gs.memory_added) == set(SIZES)
    for n in range(1, 33):
        a = rng.standard_normal((n, 1000), dtype=np.float32)
        b = rng.standard_normal((n, 1000), dtype=np.float32)
        s, d = gs(tp.tensor(a, device="cuda"), tp.tensor(b, device="cuda"))
        assert tuple(s.shape) == (n, 1000) == tuple(d.shape)
        assert gs.size_for(n) == min(x for x in SIZES if x >= n)
        np.testing.assert_allclose(s.cpu().numpy(), a * 2 + b, rtol=1e-6, err_msg=f"{n} rows")
        np.testing.assert_allclose(d.cpu().numpy(), a - b, rtol=1e-6, err_msg=f"{n} rows")


def test_beyond_the_largest_size_runs_eagerly_and_says_so_once():
    x = tp.ones((2, 64), device="cuda")
    gs = GraphSet(tp_step, [x, x], [1, 2, 4], progress=False)
    big = tp.tensor(np.arange(7 * 64, dtype=np.float32).reshape(7, 64), device="cuda")
    with pytest.warns(RuntimeWarning, match="7 rows is larger than the largest captured size 4") as caught:
        s, _ = gs(big, big)
    assert [w.filename for w in caught] == [__file__]           # the caller's line, not GraphSet's
    np.testing.assert_allclose(s.cpu().numpy(), big.cpu().numpy() * 3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        s, _ = gs(big, big)                         # said once
    assert gs.size_for(7) is None


def test_pad_value_fills_the_padding_rows():
    x = tp.ones((4, 8), device="cuda")
    gs = GraphSet(lambda a: a * 1.0, [x], [4], pad_value=-5.0, progress=False)
    out = gs(tp.full((3, 8), 2.0, device="cuda"))
    assert tuple(out.shape) == (3, 8)
    static = gs.static_inputs[0].cpu().numpy()
    np.testing.assert_array_equal(static[:3], 2.0)
    np.testing.assert_array_equal(static[3], -5.0)


def test_errors_at_call_time_name_the_argument():
    x = tp.ones((2, 8), device="cuda")
    gs = GraphSet(tp_step, [x, x], [2], progress=False)
    with pytest.raises(TypeError, match="takes 2 tensor argument"):
        gs(x)
    with pytest.raises(ValueError, match=r"argument 1 has shape \(2, 9\).*\(batch, 8\)"):
        gs(x, tp.ones((2, 9), device="cuda"))
    with pytest.raises(ValueError, match="argument 1 has 1 rows, argument 0 has 2"):
        gs(x, tp.ones((1, 8), device="cuda"))
    gs.reset()
    with pytest.raises(RuntimeError, match="reset"):
        gs(x, x)


def mlp(torch, width=1024, layers=3, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    ws = [torch.randn(width, width, device="cuda", dtype=torch.bfloat16, generator=g) * width ** -0.5
          for _ in range(layers)]

    def step(x):
        for w in ws:
            x = torch.nn.functional.gelu(x @ w, approximate="tanh") + x
        return x
    return step


def close(torch, got, want):
    return torch.allclose(got.float(), want.float(), atol=3e-2, rtol=3e-2)


def test_pytorch_work_gives_eager_values_for_every_size_and_between(torch):
    step = mlp(torch)
    sizes = [1, 2, 4, 8, 16, 24, 32, 64]
    gs = GraphSet(step, [torch.randn(5, 1024, device="cuda", dtype=torch.bfloat16)], sizes, progress=False)
    for n in list(range(1, 34)) + [40, 63, 64]:
        x = torch.randn(n, 1024, device="cuda", dtype=torch.bfloat16)
        got = gs(x)
        assert isinstance(got, torch.Tensor) and tuple(got.shape) == (n, 1024)
        assert close(torch, got, step(x)), f"{n} rows"


def test_shared_outputs_take_less_memory_and_stay_right_until_the_next_call(torch):
    # outputs of 16 and 32 MiB: with sharing, the smaller graph's output reuses the larger one's block
    g = torch.Generator(device="cuda").manual_seed(5)
    w = torch.randn(1024, 32768, device="cuda", dtype=torch.bfloat16, generator=g) * 0.03

    def step(x):
        return x @ w
    sizes = [256, 512]
    sample = torch.randn(2, 1024, device="cuda", dtype=torch.bfloat16)
    shared = GraphSet(step, [sample], sizes, progress=False)
    apart = GraphSet(step, [sample], sizes, share_outputs=False, progress=False)
    m_shared, m_apart = shared.pool.memory()["mapped"], apart.pool.memory()["mapped"]
    assert m_shared + 16 * MiB <= m_apart, (m_shared >> 20, m_apart >> 20)
    for n in (512, 3, 200, 256, 1):
        x = torch.randn(n, 1024, device="cuda", dtype=torch.bfloat16)
        a = shared(x)
        assert close(torch, a, step(x)), f"{n} rows"
        assert close(torch, apart(x), a)


def test_two_sets_share_one_pool_and_sleep_together(torch):
    pool = GraphPool()
    f, g = mlp(torch, seed=1), mlp(torch, seed=2)
    sample = torch.randn(2, 1024, device="cuda", dtype=torch.bfloat16)
    a = GraphSet(f, [sample], [1, 4, 16], pool=pool, progress=False)
    b = GraphSet(g, [sample], [2, 8, 16], pool=pool, progress=False)
    for n in (1, 3, 16, 5, 9):
        x = torch.randn(n, 1024, device="cuda", dtype=torch.bfloat16)
        assert close(torch, a(x), f(x)), f"set a, {n} rows"
        assert close(torch, b(x), g(x)), f"set b, {n} rows"
    pool.sleep()
    assert a.asleep and b.asleep
    x = torch.randn(3, 1024, device="cuda", dtype=torch.bfloat16)
    for s in (a, b):
        with pytest.raises(PoolAsleepError):
            s(x)
    pool.wake()
    assert close(torch, a(x), f(x)) and close(torch, b(x), g(x))


@pytest.mark.serial  # device-wide free memory (cuMemGetInfo)
def test_a_hundred_sleep_wake_cycles_return_memory_and_keep_values(torch):
    step = mlp(torch, width=2048)
    gs = GraphSet(step, [torch.randn(4, 2048, device="cuda", dtype=torch.bfloat16)], [1, 8, 64, 256],
                  progress=False)
    mapped = gs.pool.memory()["mapped"]
    assert mapped > 0
    gen = torch.Generator(device="cuda").manual_seed(3)
    for cycle in range(100):
        before = device_free()
        assert gs.sleep() == mapped
        assert device_free() - before >= 0.95 * mapped, f"cycle {cycle}"
        assert gs.wake() == mapped
        n = 1 + cycle * 7 % 256
        x = torch.randn(n, 2048, device="cuda", dtype=torch.bfloat16, generator=gen)
        assert close(torch, gs(x), step(x)), f"cycle {cycle}, {n} rows"


def test_kept_pytorch_tensors_survive_sleep(torch):
    step = mlp(torch)
    gs = GraphSet(step, [torch.randn(4, 1024, device="cuda", dtype=torch.bfloat16)], [4], progress=False)
    out = gs(torch.randn(4, 1024, device="cuda", dtype=torch.bfloat16))
    want = out.clone()
    gs.sleep(keep=[out])
    gs.wake()
    assert torch.equal(out, want)


def test_reset_gives_the_sets_memory_back(torch):
    step = mlp(torch, width=2048)
    gs = GraphSet(step, [torch.randn(4, 2048, device="cuda", dtype=torch.bfloat16)], [64, 512], progress=False)
    pid = gs.pool.id
    assert vmm.regions(pid)
    gs.reset()            # PyTorch's memory in the pool goes once its cuBLAS workspace is dropped
    del gs
    gc.collect()
    assert vmm.regions(pid) == []


def settled_free(torch):
    """Free device memory with both libraries' caches emptied."""
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    tp.cuda.empty_cache()
    return device_free()


@pytest.mark.serial  # device-wide free memory (cuMemGetInfo)
def test_memory_parity_with_pytorch_when_nothing_sleeps(torch):
    """The same set captured vLLM's way with torch.cuda.graph: the device
    memory each set holds (cuMemGetInfo, caches emptied), at most PyTorch's."""
    step = mlp(torch, width=2048)
    sizes = [1, 8, 64, 256]
    sample = torch.randn(256, 2048, device="cuda", dtype=torch.bfloat16)
    step(sample)
    before = settled_free(torch)
    gs = GraphSet(step, [sample], sizes, progress=False)
    ours = before - settled_free(torch)
    static = sample.clone()
    before = settled_free(torch)
    pool = torch.cuda.graph_pool_handle()
    keep = []
    for s in sorted(sizes, reverse=True):
        step(static[:s])
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=pool):
            keep.append((g, step(static[:s])))
    theirs = before - settled_free(torch)
    assert ours <= theirs, (ours >> 20, theirs >> 20)
    del gs


# ---------------------------------------------------------------- sizes captured when needed (issue 44)

def rows_of(rng, n, width=1000):
    a = rng.standard_normal((n, width), dtype=np.float32)
    b = rng.standard_normal((n, width), dtype=np.float32)
    return a, b


@pytest.mark.parametrize("mode", ["largest", "on_demand"])
def test_a_lazy_set_gives_numpys_values_in_a_random_order_and_captures_only_what_is_called(mode):
    rng = np.random.default_rng(44)
    sample = tp.tensor(rng.standard_normal((3, 1000), dtype=np.float32), device="cuda")
    gs = GraphSet(tp_step, [sample, sample], SIZES, capture=mode, progress=False)
    assert sorted(gs.graphs) == ([32] if mode == "largest" else [])
    called = [int(n) for n in rng.permutation(np.arange(1, 33))[:9]]
    expected = {32} if mode == "largest" else set()
    for n in called:
        a, b = rows_of(rng, n)
        s, d = gs(tp.tensor(a, device="cuda"), tp.tensor(b, device="cuda"))
        expected.add(min(x for x in SIZES if x >= n))
        assert sorted(gs.graphs) == sorted(expected), f"after {n} rows"
        np.testing.assert_allclose(s.cpu().numpy(), a * 2 + b, rtol=1e-6, err_msg=f"{n} rows")
        np.testing.assert_allclose(d.cpu().numpy(), a - b, rtol=1e-6, err_msg=f"{n} rows")
    report = {r["size"]: r for r in gs.memory_report()}
    assert list(report) == SIZES
    assert {s for s, r in report.items() if r["state"] == "captured"} == expected
    assert {s for s, r in report.items() if r["state"] == "pending"} == set(SIZES) - expected
    # captured in the order first called (after the largest in "largest" mode)
    first_calls = ([32] if mode == "largest" else []) + [min(x for x in SIZES if x >= n) for n in called]
    assert sorted(expected, key=lambda s: report[s]["order"]) == list(dict.fromkeys(first_calls))
    left = sorted(set(SIZES) - expected, reverse=True)
    assert gs.capture_all() == left                   # the rest, largest first
    assert sorted(gs.graphs) == SIZES and gs.capture_all() == []
    for n in range(1, 33):
        a, b = rows_of(rng, n)
        s, d = gs(tp.tensor(a, device="cuda"), tp.tensor(b, device="cuda"))
        np.testing.assert_allclose(s.cpu().numpy(), a * 2 + b, rtol=1e-6, err_msg=f"{n} rows, all captured")


def test_a_lazy_pytorch_set_matches_the_eager_set_and_eager_pytorch(torch):
    step = mlp(torch, seed=4)
    sizes = [1, 2, 4, 8, 16, 24, 32, 64]
    sample = torch.randn(5, 1024, device="cuda", dtype=torch.bfloat16)
    eager = GraphSet(step, [sample], sizes, progress=False)
    lazy = GraphSet(step, [sample], sizes, capture="on_demand", progress=False)
    rng = np.random.default_rng(7)
    called = [int(n) for n in rng.permutation(np.arange(1, 65))[:6]]
    for n in called:
        x = torch.randn(n, 1024, device="cuda", dtype=torch.bfloat16)
        want = step(x)
        got = lazy(x).clone()
        assert close(torch, got, want), f"{n} rows"
        assert close(torch, eager(x), got), f"{n} rows"
    assert set(lazy.graphs) == {min(s for s in sizes if s >= n) for n in called}
    lazy.capture_all()
    assert sorted(lazy.graphs) == sizes


@pytest.mark.parametrize("mode", ["all", "on_demand"])
def test_the_memory_report_adds_up_to_the_pools_growth(torch, mode):
    if not vmm.supported(0):
        pytest.skip("the pool's mapped bytes need a sleepable pool")
    step = mlp(torch, width=2048, seed=6)
    sizes = [1, 8, 64, 256]
    gs = GraphSet(step, [torch.randn(4, 2048, device="cuda", dtype=torch.bfloat16)], sizes, capture=mode,
                  progress=False)
    for n in (3, 200, 1):                                     # on demand: 8, 256, then 1
        gs(torch.randn(n, 2048, device="cuda", dtype=torch.bfloat16))
    report = {r["size"]: r for r in gs.memory_report()}
    captured = [r for r in report.values() if r["state"] == "captured"]
    assert {r["size"] for r in captured} == (set(sizes) if mode == "all" else {1, 8, 256})
    for r in captured:
        assert r["nodes"] > 0 and r["capture_ms"] > 0 and r["bytes"] >= 0 and r["runs"] == r["size"], r
        assert r["bytes"] == gs.memory_added[r["size"]]
    first = min(captured, key=lambda r: r["order"])
    assert first["bytes"] > 0 and first["size"] == (256 if mode == "all" else 8)
    mapped = gs.pool.memory()["mapped"]                       # the set's own new pool: it started empty
    assert abs(sum(r["bytes"] for r in captured) - mapped) <= MiB, (sum(r["bytes"] for r in captured), mapped)
    if mode == "on_demand":
        assert report[64]["state"] == "pending" and report[64]["bytes"] is None and report[64]["runs"] == 64


def test_a_memory_budget_stops_capturing_and_falls_back_with_one_warning(torch):
    step = mlp(torch, seed=8)
    sizes = [1, 4, 16, 64]
    sample = torch.randn(4, 1024, device="cuda", dtype=torch.bfloat16)
    # one byte: the largest size is captured (no estimate yet, nothing added), then nothing more
    gs = GraphSet(step, [sample], sizes, capture="largest", memory_budget=1, progress=False)
    assert sorted(gs.graphs) == [64] and gs.memory_added[64] > 1
    x = torch.randn(3, 1024, device="cuda", dtype=torch.bfloat16)
    with pytest.warns(RuntimeWarning, match=r"size 4 is not captured: .*memory_budget of 1 B; calls of up to 4 "
                                            r"rows run the graph of size 64 \(padded\)") as caught:
        got = gs(x)
    assert [w.filename for w in caught] == [__file__]
    assert close(torch, got, step(x)) and tuple(got.shape) == (3, 1024)
    with warnings.catch_warnings():
        warnings.simplefilter("error")                        # said once: size 1 is turned away silently
        for n in (1, 2, 16, 40):
            x = torch.randn(n, 1024, device="cuda", dtype=torch.bfloat16)
            assert close(torch, gs(x), step(x)), f"{n} rows"
        assert gs.capture_all() == []
    assert sorted(gs.graphs) == [64] and gs.size_for(2) == 64
    states = {r["size"]: (r["state"], r["runs"]) for r in gs.memory_report()}
    assert states == {1: ("over budget", 64), 4: ("over budget", 64), 16: ("over budget", 64), 64: ("captured", 64)}


def test_a_budget_with_nothing_larger_captured_runs_eagerly(torch):
    step = mlp(torch, seed=9)
    sample = torch.randn(4, 1024, device="cuda", dtype=torch.bfloat16)
    gs = GraphSet(step, [sample], [2, 8, 32], capture="on_demand", memory_budget=1, progress=False)
    x = torch.randn(7, 1024, device="cuda", dtype=torch.bfloat16)
    assert close(torch, gs(x), step(x)) and sorted(gs.graphs) == [8]
    x = torch.randn(20, 1024, device="cuda", dtype=torch.bfloat16)
    with pytest.warns(RuntimeWarning, match="calls of up to 32 rows run eagerly"):
        got = gs(x)
    assert close(torch, got, step(x)) and sorted(gs.graphs) == [8] and gs.size_for(20) is None
    x = torch.randn(1, 1024, device="cuda", dtype=torch.bfloat16)
    assert close(torch, gs(x), step(x)) and gs.size_for(1) == 8      # padded into 8's graph


def test_an_eager_set_with_a_budget_warns_at_construction(torch):
    step = mlp(torch, seed=10)
    sample = torch.randn(4, 1024, device="cuda", dtype=torch.bfloat16)
    with pytest.warns(RuntimeWarning, match="size 16 is not captured") as caught:
        gs = GraphSet(step, [sample], [1, 16, 64], memory_budget=1, progress=False)
    assert [w.filename for w in caught] == [__file__]
    assert sorted(gs.graphs) == [64]
    x = torch.randn(5, 1024, device="cuda", dtype=torch.bfloat16)
    assert close(torch, gs(x), step(x))


def test_sleep_and_wake_with_a_lazy_set(torch):
    step = mlp(torch, seed=11)
    gs = GraphSet(step, [torch.randn(4, 1024, device="cuda", dtype=torch.bfloat16)], [1, 4, 16, 64],
                  capture="largest", progress=False)
    x4 = torch.randn(4, 1024, device="cuda", dtype=torch.bfloat16)
    x16 = torch.randn(13, 1024, device="cuda", dtype=torch.bfloat16)
    assert close(torch, gs(x4), step(x4))
    mapped = gs.pool.memory()["mapped"]
    assert gs.sleep() == mapped
    with pytest.raises(PoolAsleepError, match="size 16 is not captured yet and the set's pool is asleep"):
        gs(x16)
    with pytest.raises(PoolAsleepError):
        gs(x4)
    with pytest.raises(PoolAsleepError):
        gs.capture_all()
    assert sorted(gs.graphs) == [4, 64]
    assert gs.wake() == mapped
    assert close(torch, gs(x16), step(x16)) and sorted(gs.graphs) == [4, 16, 64]   # captured after waking
    assert close(torch, gs(x4), step(x4))
    gs.sleep()
    gs.wake()
    gs.capture_all()
    for n in (1, 4, 13, 64):
        x = torch.randn(n, 1024, device="cuda", dtype=torch.bfloat16)
        assert close(torch, gs(x), step(x)), f"{n} rows"


def test_a_lazy_capture_inside_another_capture_is_refused():
    x = tp.ones((4, 64), device="cuda")
    gs = GraphSet(tp_step, [x, x], [1, 4, 8], capture="largest", progress=False)
    g = tp.cuda.CUDAGraph()
    with pytest.raises(RuntimeError, match="size 4 is not captured yet, and a capture cannot begin inside another "
                                           "one on this thread: CUDAGraph at .* is capturing"):
        with tp.cuda.graph(g):
            gs(x, x)
    assert sorted(gs.graphs) == [8]
    s, d = gs(x * 3.0, x)                          # outside: captured now
    assert sorted(gs.graphs) == [4, 8]
    np.testing.assert_array_equal(s.cpu().numpy(), 7.0)
    np.testing.assert_array_equal(d.cpu().numpy(), 2.0)


def test_a_size_first_called_while_another_thread_replays_and_reads():
    """The other thread replays a captured size, runs eager work and reads
    the host on its own stream while this thread's first calls capture new
    sizes (thread_local captures: its reads do not break them). The new
    sizes' values are checked once it stops: outputs of one pool are shared
    between sizes, so its replays overwrite them meanwhile."""
    rng = np.random.default_rng(45)
    width = 256
    rounds, during, errors = [0], [], []
    stop, running = threading.Event(), threading.Event()

    def step(x, y):
        if running.is_set() and tp.cuda.is_current_stream_capturing():
            # wait inside the capture for two of the other thread's rounds
            start, deadline = rounds[0], time.monotonic() + 10
            while rounds[0] < start + 2 and time.monotonic() < deadline and not errors:
                time.sleep(0.001)
            during.append(rounds[0] - start)
        return x * 2.0 + y, x - y
    sample = tp.tensor(rng.standard_normal((3, width), dtype=np.float32), device="cuda")
    gs = GraphSet(step, [sample, sample], SIZES, capture="largest", progress=False)
    a_host = rng.standard_normal((64, width), dtype=np.float32)
    a_dev = tp.tensor(a_host, device="cuda")
    warm(lambda: a_dev * 3.0)
    g32 = gs.graphs[32]
    tp.cuda.synchronize()                              # the other thread's stream does not wait for this one

    def other():
        try:
            with tp.cuda.stream(tp.cuda.Stream()):
                while not stop.is_set():
                    g32.replay()
                    y = a_dev * 3.0
                    np.testing.assert_allclose(y.cpu().numpy(), a_host * 3, rtol=1e-6)
                    rounds[0] += 1
        except BaseException as e:
            errors.append(e)
    t = threading.Thread(target=other)
    t.start()
    running.set()
    try:
        for n in (3, 1, 16, 2, 7):                      # sizes 4, 1, 16, 2, 8: each captured here
            a, b = rows_of(rng, n, width)
            gs(tp.tensor(a, device="cuda"), tp.tensor(b, device="cuda"))
    finally:
        stop.set()
        t.join()
    assert not errors, errors
    assert len(during) == 5 and min(during) >= 2, during     # the other thread ran inside every capture
    assert sorted(gs.graphs) == SIZES
    tp.cuda.synchronize()
    for n in range(1, 33):
        a, b = rows_of(rng, n, width)
        s, d = gs(tp.tensor(a, device="cuda"), tp.tensor(b, device="cuda"))
        np.testing.assert_allclose(s.cpu().numpy(), a * 2 + b, rtol=1e-6, err_msg=f"{n} rows")
        np.testing.assert_allclose(d.cpu().numpy(), a - b, rtol=1e-6, err_msg=f"{n} rows")
