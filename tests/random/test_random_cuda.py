# SPDX-License-Identifier: Apache-2.0
"""Random numbers on the GPU: the same bits as the CPU path for the same
seed (every function and dtype, odd sizes, misaligned and strided targets,
grids that loop), the distributions' statistics, and graph safety: replays
continue the eager sequence, draw fresh values with no host work, a WHILE
body draws anew each iteration, and what cannot be captured says so."""

import gc
import subprocess
import sys

import numpy as np
import pytest

import tensorplay as tp
from helpers import check_exponential, check_normal, check_uniform, warm
from tensorplay._kernels import philox
from tensorplay.cuda import CUDAGraph

pytestmark = pytest.mark.cuda

FLOATS = [tp.float16, tp.bfloat16, tp.float32, tp.float64]
SIZES = [1, 3, 1001, 4097, (1 << 20) + 3]


def _bits(t):
    a = np.ascontiguousarray(t.numpy())
    return a.view(np.uint8)


def _offset(g):
    return int(g.get_state().numpy().view("<u8")[1])


def _both(make, seed=1234):
    """``make(generator, device)`` on the CPU and on CUDA from the same seed."""
    cpu = make(tp.Generator().manual_seed(seed), "cpu")
    gpu = make(tp.Generator("cuda").manual_seed(seed), "cuda")
    return cpu, gpu


def _assert_same_bits(cpu, gpu):
    assert gpu.is_cuda and cpu.is_cpu
    assert cpu.dtype is gpu.dtype and cpu.shape == gpu.shape
    c, g = _bits(cpu), _bits(gpu)
    if not np.array_equal(c, g):
        cv, gv = cpu.numpy().reshape(-1), gpu.numpy().reshape(-1)
        bad = np.flatnonzero(cv != gv)
        pytest.fail(f"{bad.size} of {cv.size} elements differ; first at {bad[:5].tolist()}: "
                    f"cpu {cv[bad[:5]].tolist()} cuda {gv[bad[:5]].tolist()}")


# ------------------------------------------------------------------ CPU == CUDA, bit for bit

def _host_values(shape, dtype, seed=3):
    rng = np.random.default_rng(seed)
    return rng.standard_normal(shape).astype(np.float32)


FLOAT_CASES = {
    "rand": lambda d, n: lambda g, dev: tp.rand(n, generator=g, dtype=d, device=dev),
    "randn": lambda d, n: lambda g, dev: tp.randn(n, generator=g, dtype=d, device=dev),
    "uniform_": lambda d, n: lambda g, dev: tp.empty(n, dtype=d, device=dev).uniform_(-3.0, 7.25, generator=g),
    "normal_": lambda d, n: lambda g, dev: tp.empty(n, dtype=d, device=dev).normal_(2.5, 0.3, generator=g),
    "exponential_": lambda d, n: lambda g, dev: tp.empty(n, dtype=d, device=dev).exponential_(0.37, generator=g),
    "bernoulli": lambda d, n: lambda g, dev: tp.bernoulli(
        tp.tensor(np.linspace(0, 1, n), dtype=d, device=dev), generator=g),
    "dropout": lambda d, n: lambda g, dev: tp.dropout(
        tp.tensor(_host_values(n, d), dtype=d, device=dev), 0.3, generator=g),
    "random_": lambda d, n: lambda g, dev: tp.empty(n, dtype=d, device=dev).random_(generator=g),
    "randint": lambda d, n: lambda g, dev: tp.randint(-100, 200, (n,), generator=g, dtype=d, device=dev),
}


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("dtype", FLOATS, ids=lambda d: d.name)
@pytest.mark.parametrize("case", sorted(FLOAT_CASES))
def test_floating_ops_give_the_cpu_bits(case, dtype, n):
    _assert_same_bits(*_both(FLOAT_CASES[case](dtype, n)))


INT_DTYPES = [d for d in tp.ALL_DTYPES if d.kind != "f"]


@pytest.mark.parametrize("dtype", INT_DTYPES, ids=lambda d: d.name)
def test_integer_and_bool_ops_give_the_cpu_bits(dtype):
    n = 4099
    hi = 2 if dtype is tp.bool_ else 100
    for make in (lambda g, dev: tp.empty(n, dtype=dtype, device=dev).random_(generator=g),
                 lambda g, dev: tp.randint(0, hi, (n,), generator=g, dtype=dtype, device=dev),
                 lambda g, dev: tp.empty(n, dtype=dtype, device=dev).bernoulli_(0.3, generator=g),
                 lambda g, dev: tp.empty(n, dtype=dtype, device=dev).bernoulli_(
                     tp.tensor(np.linspace(0, 1, n), dtype=tp.bfloat16, device=dev), generator=g)):
        _assert_same_bits(*_both(make))


def test_64_bit_integer_draws_give_the_cpu_bits():
    n = 10001
    for make in (lambda g, dev: tp.randint(-(2 ** 40), 2 ** 50, (n,), generator=g, device=dev),     # w64
                 lambda g, dev: tp.randint(0, 2 ** 33, (n,), generator=g, dtype=tp.float64, device=dev),
                 lambda g, dev: tp.empty(n, dtype=tp.int64, device=dev).random_(-(2 ** 63), None, generator=g),
                 lambda g, dev: tp.empty(n, dtype=tp.int64, device=dev).random_(generator=g)):
        _assert_same_bits(*_both(make))


def test_misaligned_strided_and_broadcast_operands_give_the_cpu_bits():
    def misaligned(g, dev):
        base = tp.zeros(1002, device=dev)
        base[1:].normal_(generator=g)                  # 4 bytes off: the scalar store path
        return base

    def strided(g, dev):
        t = tp.zeros(8, 6, dtype=tp.float16, device=dev).T
        return t.uniform_(generator=g)

    def broadcast_p(g, dev):
        p = tp.tensor([[0.1], [0.5], [0.9]], device=dev)
        return tp.zeros(3, 1000, dtype=tp.int8, device=dev).bernoulli_(p, generator=g)

    def strided_dropout(g, dev):
        x = tp.tensor(_host_values((64, 33), tp.float32), device=dev).T
        return tp.nn.functional.dropout(x, 0.4, inplace=True, generator=g)

    def shifted_p(g, dev):                             # p overlaps the target, one element off
        base = tp.tensor(_host_values((1001,), tp.float32), device=dev).abs().clamp(0.0, 1.0)
        return base[1:].bernoulli_(base[:-1], generator=g)

    for make in (misaligned, strided, broadcast_p, strided_dropout, shifted_p):
        _assert_same_bits(*_both(make))


def test_grids_that_loop_give_the_cpu_bits_and_advance_once():
    """A tensor larger than one grid pass (each thread loops over blocks),
    then sizes from 1 up: every launch advances the offset by exactly one."""
    sms = tp.cuda.get_device_properties(0)["multi_processor_count"]
    n = sms * 512 * 256 * 4 + 4099             # bernoulli_ on uint8: 4 elements per thread and pass
    cpu, gpu = _both(lambda g, dev: tp.empty(n, dtype=tp.uint8, device=dev).bernoulli_(0.5, generator=g))
    _assert_same_bits(cpu, gpu)
    g = tp.Generator("cuda").manual_seed(9)
    h = tp.Generator().manual_seed(9)
    for size in (1, 5, 1000, 1 << 20, (3 << 22) + 1):
        _assert_same_bits(tp.rand(size, generator=h), tp.rand(size, device="cuda", generator=g))
    assert _offset(g) == _offset(h) == 5


def test_empty_tensors_launch_nothing():
    g = tp.Generator("cuda").manual_seed(1)
    tp.rand(0, device="cuda", generator=g)
    tp.empty(0, 3, device="cuda").normal_(generator=g)
    assert _offset(g) == 0


# ------------------------------------------------------------------ generators and default generators

def test_cuda_generator_state_round_trip_and_default_generators():
    g = tp.Generator("cuda")
    assert g.device == tp.device("cuda", 0) and g.initial_seed() == philox.DEFAULT_SEED
    g.manual_seed(77)
    tp.rand(10, device="cuda", generator=g)
    state = g.get_state()
    assert state.numpy().view("<u8").tolist() == [77, 1]
    a = tp.randn(100, device="cuda", generator=g).numpy()
    g.set_state(state)
    assert np.array_equal(tp.randn(100, device="cuda", generator=g).numpy(), a)
    # a CPU generator in the same state continues with the same bits
    cpu = tp.Generator().set_state(state)
    assert np.array_equal(tp.randn(100, generator=cpu).numpy(), a)

    tp.cuda.manual_seed(5)
    assert tp.cuda.initial_seed() == 5
    x = tp.rand(50, device="cuda")
    assert np.array_equal(x.numpy(), tp.rand(50, generator=tp.Generator().manual_seed(5)).numpy())
    assert tp.cuda.get_rng_state().numpy().view("<u8").tolist() == [5, 1]
    tp.cuda.set_rng_state(state)
    assert tp.cuda.default_generators[0].initial_seed() == 77
    tp.manual_seed(6)                      # seeds CUDA's default generators too
    assert tp.cuda.get_rng_state(0).numpy().view("<u8").tolist() == [6, 0]
    tp.cuda.manual_seed_all(8)
    assert tp.cuda.default_generators[-1].initial_seed() == 8
    assert len(tp.cuda.default_generators) == tp.cuda.device_count()


def test_generator_on_another_device_is_refused():
    with pytest.raises(ValueError, match="the generator is on cpu, the tensor on cuda:0"):
        tp.rand(3, device="cuda", generator=tp.Generator())
    with pytest.raises(ValueError, match="the generator is on cuda:0, the tensor on cpu"):
        tp.rand(3, generator=tp.Generator("cuda"))


def test_generator_used_on_a_side_stream():
    g = tp.Generator("cuda").manual_seed(21)
    s = tp.cuda.Stream()
    s.wait_stream(tp.cuda.current_stream())
    with tp.cuda.stream(s):
        x = tp.randn(5000, device="cuda", generator=g)
        y = tp.rand(5000, device="cuda", generator=g)
    s.synchronize()
    h = tp.Generator().manual_seed(21)
    _assert_same_bits(tp.randn(5000, generator=h), x)
    _assert_same_bits(tp.rand(5000, generator=h), y)


# ------------------------------------------------------------------ statistics of CUDA output

@pytest.mark.parametrize("dtype", FLOATS, ids=lambda d: d.name)
def test_cuda_distributions_statistics(dtype):
    g = tp.Generator("cuda").manual_seed(31)
    n = 10 ** 6
    check_uniform(tp.rand(n, dtype=dtype, device="cuda", generator=g).numpy(), dtype)
    check_normal(tp.randn(n, dtype=dtype, device="cuda", generator=g).numpy(), dtype)
    e = tp.empty(n, dtype=dtype, device="cuda").exponential_(1.5, generator=g)
    check_exponential(e.numpy(), dtype, 1.5)
    b = tp.empty(n, dtype=dtype, device="cuda").bernoulli_(0.25, generator=g).numpy().astype(np.float64)
    assert abs(b.mean() - 0.25) < 5 * np.sqrt(0.1875 / n)
    v = tp.randint(-3, 7, (n,), device="cuda", generator=g).numpy()
    counts = np.bincount(v + 3)
    assert counts.size == 10 and np.all(np.abs(counts - n / 10) < 5 * np.sqrt(n * 0.09))


# ------------------------------------------------------------------ graphs

def _step(gen):
    """A few random ops, one offset each."""
    a = tp.rand(1000, device="cuda", generator=gen) * 2
    b = tp.randn(333, dtype=tp.float64, device="cuda", generator=gen)
    c = tp.empty(257, dtype=tp.int32, device="cuda").random_(0, 10, generator=gen)
    return a, b, c


def test_graph_replays_continue_the_eager_sequence():
    warm(_step, tp.Generator("cuda"))
    seed = 4242
    gen = tp.Generator("cuda").manual_seed(seed)
    g = CUDAGraph()
    with tp.cuda.graph(g):
        outs = _step(gen)
    assert _offset(gen) == 0                   # capturing ran nothing
    ref = tp.Generator("cuda").manual_seed(seed)
    seen = []
    for _ in range(10):
        g.replay()
        want = _step(ref)
        for got, exp in zip(outs, want):
            assert np.array_equal(_bits(got), _bits(exp))
        seen.append(outs[0].numpy().copy())
    assert _offset(gen) == _offset(ref) == 30
    assert len({s.tobytes() for s in seen}) == 10           # fresh values every replay
    # eager calls after the replays go on from the device's offset
    _assert_same_bits(tp.rand(64, device="cuda", generator=ref).cpu(),
                      tp.rand(64, device="cuda", generator=gen))


def test_replays_do_no_host_work_for_the_generator():
    warm(_step, tp.Generator("cuda"))
    gen = tp.Generator("cuda").manual_seed(1)
    g = CUDAGraph()
    with tp.cuda.graph(g):
        _step(gen)
    for _ in range(50):
        g.replay()                             # no Python between replays touches the generator
    assert _offset(gen) == 50 * 3              # advanced on the device, three ops per replay


def test_default_generator_in_a_graph():
    warm(_step, tp.Generator("cuda"))
    tp.rand(8, device="cuda")                  # the default generator exists before the capture
    tp.cuda.manual_seed(10)
    g = CUDAGraph()
    with tp.cuda.graph(g):
        x = tp.randn(4096, device="cuda")
    first = []
    for _ in range(3):
        g.replay()
        first.append(x.numpy().copy())
    cpu = tp.Generator().manual_seed(10)
    for k in range(3):
        assert np.array_equal(first[k], tp.randn(4096, generator=cpu).numpy())
    assert tp.cuda.get_rng_state().numpy().view("<u8").tolist() == [10, 3]


def test_random_ops_in_a_while_body_draw_anew_each_iteration():
    warm(_step, tp.Generator("cuda"))
    n_iter = 25
    gen = tp.Generator("cuda").manual_seed(99)
    count = tp.zeros(1, dtype=tp.int32, device="cuda")
    limit = tp.full((1,), n_iter, dtype=tp.int32, device="cuda")
    pred = tp.zeros(1, dtype=tp.bool, device="cuda")
    acc = tp.zeros(64, dtype=tp.float64, device="cuda")
    acc.add_(tp.rand(64, dtype=tp.float64, device="cuda", generator=tp.Generator("cuda")))   # warm up
    count.add_(1)
    tp.lt(count, limit, out=pred)
    tp.cuda.synchronize()
    g = CUDAGraph()
    with tp.cuda.graph(g):
        count.zero_()
        acc.zero_()
        tp.lt(count, limit, out=pred)
        g.begin_capture_to_while_node(pred)
        acc.add_(tp.rand(64, dtype=tp.float64, device="cuda", generator=gen))
        count.add_(1)
        tp.lt(count, limit, out=pred)
        g.end_capture_to_conditional_node()
    ref = tp.Generator().manual_seed(99)
    for replay in range(2):
        g.replay()
        want = np.zeros(64)
        for _ in range(n_iter):
            want = want + tp.rand(64, dtype=tp.float64, generator=ref).numpy()
        assert np.array_equal(acc.numpy(), want)           # not n_iter times one draw
        assert _offset(gen) == n_iter * (replay + 1)       # every iteration advanced the device offset


def test_manual_seed_inside_a_capture_is_replayed():
    warm(_step, tp.Generator("cuda"))
    gen = tp.Generator("cuda")
    g = CUDAGraph()
    with tp.cuda.graph(g):
        gen.manual_seed(5)
        x = tp.rand(100, device="cuda", generator=gen)
    want = tp.rand(100, generator=tp.Generator().manual_seed(5)).numpy()
    for _ in range(3):
        g.replay()
        assert np.array_equal(x.numpy(), want)
    assert _offset(gen) == 1 and gen.initial_seed() == 5


def test_get_state_and_new_generators_inside_a_capture_raise_clearly():
    warm(_step, tp.Generator("cuda"))
    gen = tp.Generator("cuda").manual_seed(3)
    x = tp.zeros(16, device="cuda")
    g = CUDAGraph()
    with tp.cuda.graph(g):
        with pytest.raises(RuntimeError, match="cannot be read while a CUDA graph capture is open"):
            gen.get_state()
        with pytest.raises(RuntimeError, match="outside CUDA graph captures"):
            tp.Generator("cuda")
        x.add_(tp.rand(16, device="cuda", generator=gen))    # the capture goes on
    g.replay()
    assert np.array_equal(x.numpy(), tp.rand(16, generator=tp.Generator().manual_seed(3)).numpy())


def test_first_use_of_the_default_generator_inside_a_capture_raises_clearly():
    code = ("import tensorplay as tp\n"
            "x = tp.zeros(4, device='cuda')\n"
            "x.add_(1)\n"
            "g = tp.cuda.CUDAGraph()\n"
            "try:\n"
            "    with tp.cuda.graph(g):\n"
            "        tp.rand(4, device='cuda')\n"
            "except RuntimeError as e:\n"
            "    print('RAISED', e)\n"
            "print(tp.rand(4, device='cuda').shape)\n")     # usable after, and the generator now exists
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/", timeout=300)
    assert out.returncode == 0, out.stderr
    assert "RAISED the default CUDA generator of cuda:0 is first used inside a CUDA graph capture" in out.stdout
    assert "default_generators[0]" in out.stdout and "(4,)" in out.stdout


def test_a_graph_keeps_a_dropped_generators_state_alive():
    warm(_step, tp.Generator("cuda"))
    gen = tp.Generator("cuda").manual_seed(12)
    g = CUDAGraph()
    with tp.cuda.graph(g):
        x = tp.rand(256, device="cuda", generator=gen)
    del gen
    gc.collect()
    filler = [tp.zeros(8, device="cuda") for _ in range(64)]    # would reuse a freed state block
    for t in filler:
        t.fill_(-1.0)
    cpu = tp.Generator().manual_seed(12)
    for _ in range(3):
        g.replay()
        assert np.array_equal(x.numpy(), tp.rand(256, generator=cpu).numpy())
