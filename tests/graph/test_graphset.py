# SPDX-License-Identifier: Apache-2.0
"""GraphSet: one graph per batch size in one pool. Values for every size and
for sizes between captured ones (tensorplay and PyTorch work), padding,
eager fallback beyond the largest size, outputs shared between sizes, two
sets sharing a pool, sleep/wake cycles with values and memory checked, and
the errors. The validation that needs no GPU is test_graphset_cpu.py's."""
import gc
import warnings

import numpy as np
import pytest

import tensorplay as tp
from tensorplay._memory import vmm
from tensorplay.cuda import GraphPool, GraphSet, PoolAsleepError

from helpers import torch_cuda as torch  # noqa: F401 (a fixture)

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
