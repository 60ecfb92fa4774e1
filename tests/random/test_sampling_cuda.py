# SPDX-License-Identifier: Apache-2.0
"""randperm and multinomial on a GPU: the bitonic sort against np.argsort,
the sampling kernels against their NumPy twins bit for bit (given
uniforms: no random core needed), CPU == CUDA for the same seed, and CUDA
graphs (fresh values per replay, equal to the eager sequence)."""

import numpy as np
import pytest

import tensorplay as tp
from tensorplay._kernels import sampling_kernels as sk
from tensorplay._kernels import sort_kernels
from tensorplay._ops import sampling as _sampling
from tensorplay.cuda import CUDAGraph

pytestmark = pytest.mark.cuda
VOCAB = 32000            # a language model's vocabulary: the rows multinomial samples from


def _keys(rng, rows, n):
    """Random 64-bit keys (the top bit too: the sort compares unsigned), with ties."""
    keys = rng.integers(0, 2 ** 64, size=(rows, n), dtype=np.uint64)
    keys[:, ::5] = rng.integers(0, 7, size=keys[:, ::5].shape)
    return keys


@pytest.mark.parametrize("rows, n", [(1, 1), (1, 2), (1, 3), (1, 1000), (1, 4096), (1, 100003), (1, 2 ** 20),
                                     (7, 3), (3, 2049), (4, VOCAB)])
def test_sort_rows_gives_the_stable_argsort(rows, n):
    rng = np.random.default_rng(n + rows)
    keys = _keys(rng, rows, n)
    dev_keys = tp.tensor(keys.view(np.int64), device="cuda")
    order = _sampling.sort_rows(dev_keys, rows, n).numpy()
    padded = sort_kernels.padded_length(n)
    assert order.shape == (rows, padded)
    np.testing.assert_array_equal(order[:, :n], np.argsort(keys, axis=1, kind="stable"))
    np.testing.assert_array_equal(order[:, n:], np.broadcast_to(np.arange(n, padded), (rows, padded - n)))
    assert np.array_equal(dev_keys.numpy(), keys.view(np.int64))          # the keys are left alone


def test_permutation_from_keys_on_cuda_matches_the_cpu():
    rng = np.random.default_rng(2)
    keys = rng.integers(0, 2 ** 62, size=50_000)
    keys[::3] = 5
    cpu = _sampling.permutation_from_keys(tp.tensor(keys))
    gpu = _sampling.permutation_from_keys(tp.tensor(keys, device="cuda"))
    assert gpu.shape == (50_000,) and gpu.is_contiguous()
    np.testing.assert_array_equal(gpu.numpy(), cpu.numpy())


def _weights(rng, rows, n, d):
    w = rng.random((rows, n)) * 10.0 ** rng.integers(-4, 4, size=(rows, n))
    w[rng.random((rows, n)) < 0.25] = 0.0
    w[:, 0] = 0.0
    w[:, -1] = 0.0
    w[:, n // 2] = 1.0
    return w.astype(d.numpy_dtype)


def _uniforms(rng, shape):
    u = rng.integers(0, 2 ** 53, size=shape) * 2.0 ** -53        # rand's float64 grid
    u.flat[0] = 0.0
    u.flat[-1] = 1 - 2.0 ** -53
    return u


@pytest.mark.parametrize("d", sk.WEIGHT_DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("rows, n", [(1, VOCAB), (5, 1000), (2, 3)])
def test_race_keys_kernel_matches_its_numpy_twin_bit_for_bit(d, rows, n):
    rng = np.random.default_rng(n)
    w = _weights(rng, rows, n, d)
    u = _uniforms(rng, (rows, n))
    status = tp.zeros(1, dtype=tp.int32, device="cuda")
    keys = _sampling.race_keys_cuda(tp.tensor(w, device="cuda"), tp.tensor(u, device="cuda"), 1, status)
    np.testing.assert_array_equal(keys.numpy(), sk.race_keys(w.astype(np.float64), u))
    assert status.item() == 0


@pytest.mark.parametrize("d", sk.WEIGHT_DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("rows, n, k", [(1, VOCAB, 1), (4, VOCAB, 300), (3, 255, 1000), (2, 5, 7)])
def test_inverse_cdf_kernel_matches_its_numpy_twin(d, rows, n, k):
    rng = np.random.default_rng(n + k)
    w = _weights(rng, rows, n, d)
    u = _uniforms(rng, (rows, k))
    status = tp.zeros(1, dtype=tp.int32, device="cuda")
    picks = _sampling.inverse_cdf_cuda(tp.tensor(w, device="cuda"), tp.tensor(u, device="cuda"), k, status)
    expected = sk.inverse_cdf(w.astype(np.float64), u)
    np.testing.assert_array_equal(picks.numpy(), expected)
    assert status.item() == 0
    assert (w.astype(np.float64)[np.arange(rows)[:, None], expected] > 0).all()


@pytest.mark.parametrize("replacement", [False, True])
@pytest.mark.parametrize("rows, k", [(1, 1), (1, 50), (6, 1), (6, 200)])
def test_sample_from_uniforms_cpu_equals_cuda(replacement, rows, k):
    """The whole CUDA path (keys, then argmin for one sample or the row sort;
    or the inverse CDF), strided weights included, against the CPU path."""
    rng = np.random.default_rng(rows * 100 + k)
    w = _weights(rng, rows, VOCAB, tp.float32)
    u = _uniforms(rng, (rows, k if replacement else VOCAB))
    cpu = _sampling.sample_from_uniforms(tp.tensor(w), tp.tensor(u), k, replacement)
    w_strided = tp.tensor(w.T.copy(), device="cuda").T           # a transposed view: not contiguous
    gpu = _sampling.sample_from_uniforms(w_strided, tp.tensor(u, device="cuda"), k, replacement)
    assert gpu.shape == (rows, k) and gpu.dtype is tp.int64
    np.testing.assert_array_equal(gpu.numpy(), cpu.numpy())
    if not replacement:
        assert all(len(set(r)) == k for r in gpu.tolist())


@pytest.mark.parametrize("replacement", [False, True])
def test_invalid_weights_raise_after_the_kernels(replacement):
    u_shape = (1, 2) if replacement else (1, 3)
    u = tp.tensor(np.full(u_shape, 0.5), device="cuda")
    for weights, message in (([[1.0, -1.0, 2.0]], "element < 0"), ([[1.0, float("nan"), 2.0]], "element < 0"),
                             ([[0.0, 0.0, 0.0]], "sums to zero")):
        with pytest.raises(ValueError, match=message):
            _sampling.sample_from_uniforms(tp.tensor(weights, device="cuda"), u, 2, replacement)
    if not replacement:
        with pytest.raises(ValueError, match="must not exceed the number of categories of positive weight"):
            _sampling.sample_from_uniforms(tp.tensor([[1.0, 0.0, 0.0]], device="cuda"), u, 2, False)
    ok = _sampling.sample_from_uniforms(tp.tensor([[1.0, 0.0, 2.0]], device="cuda"), u, 2, replacement)
    assert ok.shape == (1, 2)                  # the status of one call does not leak into the next


@pytest.mark.parametrize("replacement", [False, True])
def test_sampling_from_static_uniforms_in_a_graph(replacement):
    rng = np.random.default_rng(4)
    rows, k = 3, 5
    w = tp.tensor(_weights(rng, rows, VOCAB, tp.float32), device="cuda")
    u = tp.tensor(_uniforms(rng, (rows, k if replacement else VOCAB)), device="cuda")
    _sampling.sample_from_uniforms(w, u, k, replacement)           # compile and load first
    tp.cuda.synchronize()
    g = CUDAGraph()
    with tp.cuda.graph(g):
        picks = _sampling.sample_from_uniforms(w, u, k, replacement)
    w_host = w.numpy().astype(np.float64)
    for _ in range(3):
        fresh = _uniforms(rng, u.shape)
        u.copy_(tp.tensor(fresh, device="cuda"))
        g.replay()
        expected = _sampling.sample_from_uniforms(tp.tensor(w_host), tp.tensor(fresh), k, replacement)
        np.testing.assert_array_equal(picks.numpy(), expected.numpy())


def test_invalid_weights_inside_a_capture_give_indices_in_range():
    """No host read inside a capture: the check is skipped, the samples stay in range."""
    w = tp.tensor([[1.0, -5.0, float("nan"), 0.0]], device="cuda")
    for replacement, u in ((True, np.full((1, 3), 0.7)), (False, np.full((1, 4), 0.3))):
        u = tp.tensor(u, device="cuda")
        with pytest.raises(ValueError):
            _sampling.sample_from_uniforms(w, u, 3, replacement)          # eager: raises (and compiles)
        g = CUDAGraph()
        with tp.cuda.graph(g):
            picks = _sampling.sample_from_uniforms(w, u, 3, replacement)
        g.replay()
        got = picks.numpy()
        assert ((got >= 0) & (got < 4)).all(), got


# ------------------------------------------------------------------ with the random core

@pytest.mark.parametrize("n", [1, 2, 1000, 4097, 100003])
@pytest.mark.parametrize("dtype", [tp.int64, tp.int32, tp.float32])
def test_randperm_cpu_equals_cuda_for_the_same_seed(n, dtype):
    if dtype is tp.float32 and n > 2 ** 24:
        pytest.skip("not exact in float32")
    cpu = tp.randperm(n, generator=tp.Generator().manual_seed(n), dtype=dtype)
    gpu = tp.randperm(n, generator=tp.Generator(device="cuda").manual_seed(n), dtype=dtype, device="cuda")
    assert gpu.dtype is dtype and gpu.device == tp.device("cuda:0")
    np.testing.assert_array_equal(gpu.numpy(), cpu.numpy())
    assert sorted(gpu.numpy().astype(np.int64).tolist()) == list(range(n))


def test_randperm_of_a_million_is_a_permutation():
    perm = tp.randperm(2 ** 20, device="cuda").numpy()
    assert np.array_equal(np.sort(perm), np.arange(2 ** 20))
    assert (perm != np.arange(2 ** 20)).mean() > 0.99


@pytest.mark.parametrize("replacement", [False, True])
@pytest.mark.parametrize("shape, k", [((VOCAB,), 1), ((VOCAB,), 64), ((8, VOCAB), 1), ((8, VOCAB), 16),
                                      ((3, 17), 5)])
@pytest.mark.parametrize("dtype", [tp.float32, tp.bfloat16])
def test_multinomial_cpu_equals_cuda_for_the_same_seed(replacement, shape, k, dtype):
    rng = np.random.default_rng(k)
    w = _weights(rng, int(np.prod(shape[:-1])), shape[-1], dtype).reshape(shape)
    cpu = tp.multinomial(tp.tensor(w), k, replacement, generator=tp.Generator().manual_seed(9))
    gpu = tp.multinomial(tp.tensor(w, device="cuda"), k, replacement,
                         generator=tp.Generator(device="cuda").manual_seed(9))
    assert gpu.shape == cpu.shape == shape[:-1] + (k,)
    np.testing.assert_array_equal(gpu.numpy(), cpu.numpy())


@pytest.mark.parametrize("replacement", [False, True])
def test_multinomial_cuda_frequencies(replacement):
    p = np.array([0.1, 0.0, 0.3, 0.6], dtype=np.float32)
    rows = 100_000
    w = tp.tensor(np.broadcast_to(p, (rows, 4)).copy(), device="cuda")
    picks = tp.multinomial(w, 2, replacement).numpy()
    assert not (picks == 1).any()
    if not replacement:
        assert (picks[:, 0] != picks[:, 1]).all()
    counts = np.bincount(picks[:, 0], minlength=4)[[0, 2, 3]]
    probs = p[[0, 2, 3]]
    assert (((counts - rows * probs) ** 2) / (rows * probs)).sum() < 23.0


def test_multinomial_value_errors_on_cuda():
    with pytest.raises(ValueError, match="element < 0"):
        tp.multinomial(tp.tensor([0.5, -0.5, 1.0], device="cuda"), 1)
    with pytest.raises(ValueError, match="sums to zero"):
        tp.multinomial(tp.tensor([[1.0, 1.0], [0.0, 0.0]], device="cuda"), 1, True)
    assert tp.multinomial(tp.tensor([0.5, 0.5], device="cuda"), 2).shape == (2,)


@pytest.mark.parametrize("replacement", [False, True])
def test_graph_replays_draw_fresh_values_equal_to_the_eager_sequence(replacement):
    n, k, replays = 5000, 8, 5
    rng = np.random.default_rng(1)
    w = tp.tensor(_weights(rng, 4, VOCAB, tp.float32), device="cuda")
    warm = tp.Generator(device="cuda").manual_seed(0)       # compile and load everything first
    tp.randperm(n, generator=warm, device="cuda")
    tp.multinomial(w, k, replacement, generator=warm)
    tp.multinomial(w, 1, replacement, generator=warm)
    tp.cuda.synchronize()
    gen = tp.Generator(device="cuda").manual_seed(123)
    g = CUDAGraph()
    with tp.cuda.graph(g):
        perm = tp.randperm(n, generator=gen, device="cuda")
        picks = tp.multinomial(w, k, replacement, generator=gen)
        first = tp.multinomial(w, 1, replacement, generator=gen)
    replayed = []
    for _ in range(replays):
        g.replay()
        replayed.append((perm.numpy().copy(), picks.numpy().copy(), first.numpy().copy()))
    for a, b in zip(replayed, replayed[1:]):
        assert not np.array_equal(a[0], b[0])                    # a new permutation each replay
        assert not np.array_equal(a[1], b[1])
    eager = tp.Generator(device="cuda").manual_seed(123)
    on_cpu = tp.Generator().manual_seed(123)
    w_cpu = w.cpu()
    for got in replayed:
        expected = (tp.randperm(n, generator=eager, device="cuda"), tp.multinomial(w, k, replacement, generator=eager),
                    tp.multinomial(w, 1, replacement, generator=eager))
        for x, y in zip(got, expected):
            np.testing.assert_array_equal(x, y.numpy())
        cpu = (tp.randperm(n, generator=on_cpu), tp.multinomial(w_cpu, k, replacement, generator=on_cpu),
               tp.multinomial(w_cpu, 1, replacement, generator=on_cpu))
        for x, y in zip(got, cpu):
            np.testing.assert_array_equal(x, y.numpy())
        assert sorted(got[0].tolist()) == list(range(n))
