# SPDX-License-Identifier: Apache-2.0
"""randperm and multinomial without a GPU: the sort schedule and its NumPy
model, the float64 arithmetic of the keys and the inverse CDF with given
uniforms, the CPU path, argument and value errors, NVRTC compilation of
every kernel variant. (tests/kernels/test_kernels_emulated.py runs the kernels'
CUDA C on the CPU; tests/random/test_sampling_cuda.py runs them on a GPU.)

The public functions draw with tensorplay.rand / randint. Tests through the
real ones skip where they are missing; the others swap in a NumPy stand-in
(``fake_random``) to test what the functions do with the numbers they draw.
"""

import math
import re

import numpy as np
import pytest

import tensorplay as tp
from tensorplay._kernels import cache
from tensorplay._kernels import nvrtc
from tensorplay._kernels import sampling_kernels as sk
from tensorplay._kernels import sort_kernels
from tensorplay._ops import sampling as _sampling

ARCH = 90


# ------------------------------------------------------------------ the sort

def test_padded_length_is_the_next_power_of_two():
    assert [sort_kernels.padded_length(n) for n in (0, 1, 2, 3, 4, 5, 2048, 2049, 100003)] == \
        [1, 1, 2, 4, 4, 8, 2048, 4096, 131072]


def test_sort_steps_depend_on_the_padded_length_only():
    tile = sort_kernels.TILE
    assert sort_kernels.sort_steps(1) == [("block", 1)]
    assert sort_kernels.sort_steps(tile) == [("block", tile)]
    assert sort_kernels.sort_steps(2 * tile) == [("block", tile), ("global", 2 * tile, tile), ("merge", 2 * tile)]
    assert sort_kernels.sort_steps(4 * tile) == [
        ("block", tile), ("global", 2 * tile, tile), ("merge", 2 * tile),
        ("global", 4 * tile, 2 * tile), ("global", 4 * tile, tile), ("merge", 4 * tile)]
    # 2**20: one block sort, then for k = 2**12 .. 2**20 (9 stages) 1 + ... + 9 global passes and a merge each
    steps = sort_kernels.sort_steps(2 ** 20)
    assert len(steps) == 1 + 45 + 9
    assert sum(1 for s in steps if s[0] == "global") == 45
    with pytest.raises(ValueError, match="power of two"):
        sort_kernels.sort_steps(3)


@pytest.mark.parametrize("tile", [2, 4, 16, sort_kernels.TILE])
@pytest.mark.parametrize("rows, n", [(1, 1), (1, 2), (1, 3), (1, 31), (2, 64), (3, 100), (1, 1000), (4, 257)])
def test_the_sort_schedule_gives_the_stable_argsort(tile, rows, n):
    """The NumPy model of the kernels runs the very steps the launcher does:
    with small tiles, the global passes and merges of large sorts."""
    rng = np.random.default_rng(rows * 1000 + n)
    keys = rng.integers(0, 2 ** 64, size=(rows, n), dtype=np.uint64)
    keys[:, ::2] = rng.integers(0, 3, size=keys[:, ::2].shape)          # ties, broken by position
    keys[:, :1] = np.uint64(sort_kernels.PAD_KEY)                         # ties with the padding too
    order = sort_kernels.simulate_sort(keys, tile)
    np.testing.assert_array_equal(order[:, :n], np.argsort(keys, axis=1, kind="stable"))
    padded = sort_kernels.padded_length(n)
    np.testing.assert_array_equal(order[:, n:], np.broadcast_to(np.arange(n, padded), (rows, padded - n)))


def test_sort_kernels_compile_to_cubin(monkeypatch):
    made = []
    monkeypatch.setattr(cache, "cached_function", lambda key, dev, make: made.append((key, make())))
    for step in ("block", "global", "merge"):
        sort_kernels.sort_function(step, 0)
    assert [k for k, _ in made] == [("sort", "block"), ("sort", "global"), ("sort", "merge")]
    for _, (src, name) in made:
        assert f" {name}(" in src
        assert nvrtc.compile_cubin(src, name + ".cu", (), ARCH)[:4] == b"\x7fELF"


@pytest.mark.parametrize("d", sk.WEIGHT_DTYPES, ids=lambda d: d.name)
def test_sampling_kernels_compile_to_cubin_for_every_weight_dtype(monkeypatch, d):
    made = []
    monkeypatch.setattr(cache, "cached_function", lambda key, dev, make: made.append((key, make())))
    sk.race_keys_function(d, 0)
    sk.inverse_cdf_function(d, 0)
    assert [k for k, _ in made] == [("race_keys", d.code), ("inverse_cdf", d.code)]
    for _, (src, name) in made:
        assert name.endswith(d.name) and f" {name}(" in src
        # no libm and no contractible arithmetic: every float64 operation is an explicit _rn intrinsic
        assert not re.search(r"\b(log|log1p|logf|__logf|exp|pow)\(", src)
        assert nvrtc.compile_cubin(src, name + ".cu", (), ARCH)[:4] == b"\x7fELF"


# ------------------------------------------------------------------ the arithmetic

def test_neg_log_is_within_one_ulp_of_the_true_value():
    rng = np.random.default_rng(5)
    u = rng.integers(0, 2 ** 53, 200_000) * 2.0 ** -53
    x = np.concatenate([1.0 - u, [1.0, 0.5, 0.25, 2.0 ** -53, 1 - 2.0 ** -53, 2.0 ** -1022, 0.7071067811865476,
                                  0.7071067811865475, 1.4142135623730951 / 2]])
    got = sk.neg_log(x)
    ref = -np.log(x)                     # glibc's log is correctly rounded or within 1 ulp of it
    assert np.all(np.abs(got - ref) <= 2 * np.spacing(np.abs(ref)))
    assert got[u.size].view(np.uint64) == 0                 # -log(1) is +0.0, not -0.0
    assert got[u.size + 1] == math.log(2) and got[u.size + 2] == 2 * math.log(2)
    assert got[u.size + 3] == pytest.approx(53 * math.log(2), rel=1e-16)


def test_race_keys_with_fixed_uniforms():
    w = np.array([[1.0, 2.0, 0.0, 4.0, 1e-310, 3.0, -1.0, np.nan]])
    u = np.array([[0.0, 0.5, 0.9, 0.75, 0.5, 1 - 2.0 ** -53, 0.5, 0.5]])
    keys = sk.race_keys(w, u)
    assert keys.dtype == np.int64 and (keys >= 0).all()
    f = keys.view(np.float64)[0]
    assert f[0] == 0.0 and keys[0, 0] == 0                   # u = 0: E = +0
    assert f[1] == math.log(2) / 2
    assert keys[0, 2] == sk.ZERO_WEIGHT_KEY == keys[0, 6] == keys[0, 7]   # zero and invalid weights
    assert f[3] == 2 * math.log(2) / 4
    assert np.isinf(f[4])                                    # overflows to +inf, still before zero weights
    assert f[5] == pytest.approx(53 * math.log(2) / 3, rel=1e-15)
    assert keys[0, 4] < sk.ZERO_WEIGHT_KEY
    # against a direct NumPy reference (libm's log) on many values: equal up to rounding
    rng = np.random.default_rng(3)
    w = rng.random((4, 1000)) + 0.01
    u = rng.integers(0, 2 ** 53, (4, 1000)) * 2.0 ** -53
    np.testing.assert_allclose(sk.race_keys(w, u).view(np.float64), -np.log1p(-u) / w, rtol=4e-16, atol=0)


def _chunked_cdf_reference(w):
    """The documented order, by hand: c_i = base_j + (w_start + ... + w_i), base_j the in-order sum of chunk sums."""
    n = len(w)
    length = max(1, -(-n // 256))
    c = []
    base = 0.0
    for start in range(0, 256 * length, length):
        p = 0.0
        for i in range(start, min(start + length, n)):
            p = p + float(w[i])
            c.append(base + p)
        base = base + p
    return np.array(c), base


@pytest.mark.parametrize("n", [1, 7, 256, 257, 1000, 3001])
def test_chunked_cdf_follows_the_documented_order_exactly(n):
    rng = np.random.default_rng(n)
    w = rng.random((2, n)) * 10.0 ** rng.integers(-8, 8, (2, n))
    w[:, rng.random(n) < 0.2] = 0.0
    c, total = sk.chunked_cdf(w)
    for r in range(2):
        ref, ref_total = _chunked_cdf_reference(w[r])
        np.testing.assert_array_equal(c[r], ref)
        assert total[r] == ref_total == c[r, -1]
        assert (np.diff(c[r]) >= 0).all()                            # never decreases
        zero = np.flatnonzero(w[r] == 0)
        zero = zero[zero > 0]
        np.testing.assert_array_equal(c[r, zero], c[r, zero - 1])    # a zero weight repeats the sum
    if n <= 256:                                                     # one category per chunk: in-order cumsum
        np.testing.assert_array_equal(c, np.cumsum(w, axis=1))
    np.testing.assert_allclose(c, np.cumsum(w, axis=1), rtol=1e-12)


def test_inverse_cdf_picks_the_first_cumulative_sum_above_u_times_total():
    rng = np.random.default_rng(11)
    w = np.zeros((3, 700))
    w[0, [0, 3, 255, 256, 699]] = [1, 2, 3, 4, 5]        # categories at the ends and at chunk edges
    w[1] = rng.random(700)
    w[1, ::3] = 0.0
    w[2, 350] = 1e-200                                    # one tiny category
    u = rng.integers(0, 2 ** 53, (3, 500)) * 2.0 ** -53
    u[:, 0], u[:, 1] = 0.0, 1 - 2.0 ** -53
    picks = sk.inverse_cdf(w, u)
    c, total = sk.chunked_cdf(w)
    for r in range(3):
        for s in range(500):
            x = u[r, s] * total[r]
            assert picks[r, s] == np.flatnonzero(c[r] > x)[0]
    assert (w[np.arange(3)[:, None], picks] > 0).all()                 # zero weights are never drawn
    assert picks[0, 0] == 0 and picks[0, 1] == 699 and (picks[2] == 350).all()


def test_inverse_cdf_falls_back_to_the_last_positive_category_when_u_times_total_rounds_up():
    tiny = 5e-324                                        # subnormal: u * total can round to total
    w = np.array([[tiny, 0.0, 2 * tiny, 0.0]])
    u = np.array([[1 - 2.0 ** -53, 0.0]])
    c, total = sk.chunked_cdf(w)
    assert u[0, 0] * total[0] == total[0]                # no cumulative sum exceeds u * total
    assert sk.inverse_cdf(w, u).tolist() == [[2, 0]]


@pytest.mark.parametrize("replacement", [False, True])
def test_frequencies_from_given_uniforms_match_the_probabilities(replacement):
    p = np.array([0.05, 0.0, 0.25, 0.1, 0.6, 0.0])
    rows = 40_000
    rng = np.random.default_rng(17)
    w = np.broadcast_to(p * 3.0, (rows, p.size))         # unnormalised
    k = 2
    if replacement:
        picks = sk.inverse_cdf(w, rng.integers(0, 2 ** 53, (rows, k)) * 2.0 ** -53)
        expected = [p, p]
    else:
        keys = sk.race_keys(w, rng.integers(0, 2 ** 53, (rows, p.size)) * 2.0 ** -53)
        picks = np.argsort(keys, axis=1, kind="stable")[:, :k]
        second = np.array([sum(p[i] * p[j] / (1 - p[i]) for i in range(p.size) if i != j) for j in range(p.size)])
        expected = [p, second]
        assert (picks[:, 0] != picks[:, 1]).all()
    for col, probs in enumerate(expected):
        counts = np.bincount(picks[:, col], minlength=p.size)
        assert counts[p == 0].sum() == 0
        live = probs > 0
        chi2 = (((counts[live] - rows * probs[live]) ** 2) / (rows * probs[live])).sum()
        assert chi2 < 27.0, (col, counts, chi2)          # chi-square, 3 degrees of freedom: p < 1e-5


def test_row_status_names_each_problem():
    assert sk.row_status(np.array([[1.0, 2.0]]), 2, False) == 0
    assert sk.row_status(np.array([[1.0, -2.0, 3.0]]), 1, True) == sk.BAD_WEIGHT
    assert sk.row_status(np.array([[1.0, np.nan]]), 1, True) == sk.BAD_WEIGHT
    assert sk.row_status(np.array([[1.0, 1.0], [0.0, 0.0]]), 1, True) == sk.ZERO_SUM
    assert sk.row_status(np.array([[1.0, 0.0, 1.0]]), 3, False) == sk.TOO_FEW_POSITIVE
    assert sk.row_status(np.array([[1.0, 0.0, 1.0]]), 3, True) == 0
    big = np.finfo(np.float64).max
    assert sk.row_status(np.array([[big, big]]), 1, True) == sk.SUM_OVERFLOW
    assert sk.row_status(np.array([[big, big]]), 1, False) == 0       # the keys do not sum
    assert _sampling.status_message(sk.BAD_WEIGHT | sk.ZERO_SUM).startswith("multinomial: the probability")


def test_sample_from_uniforms_on_the_cpu():
    w = tp.tensor([[0.0, 1.0, 3.0], [2.0, 0.0, 2.0]], dtype=tp.float16)
    u = tp.tensor([[0.5, 0.1, 0.2], [0.3, 0.4, 0.9]], dtype=tp.float64)
    got = _sampling.sample_from_uniforms(w, u, 2, False)
    keys = sk.race_keys(w.numpy().astype(np.float64), u.numpy())
    assert got.tolist() == np.argsort(keys, axis=1, kind="stable")[:, :2].tolist()
    got = _sampling.sample_from_uniforms(w, u[:, :2], 2, True)
    assert got.tolist() == [[2, 1], [0, 0]]
    with pytest.raises(ValueError, match="float64 of shape"):
        _sampling.sample_from_uniforms(w, u.to(tp.float32), 2, False)
    with pytest.raises(ValueError, match="num_samples must not exceed"):
        _sampling.sample_from_uniforms(w, u, 3, False)


# ------------------------------------------------------------------ errors of the public functions

def test_randperm_argument_errors():
    with pytest.raises(TypeError, match="n must be an int"):
        tp.randperm(3.0)
    with pytest.raises(TypeError, match="n must be an int"):
        tp.randperm(True)
    with pytest.raises(ValueError, match="non-negative"):
        tp.randperm(-1)
    with pytest.raises(TypeError, match="cannot be bool"):
        tp.randperm(3, dtype=tp.bool_)
    with pytest.raises(ValueError, match="too large for float16"):
        tp.randperm(2050, dtype=tp.float16)
    with pytest.raises(ValueError, match="too large for uint8"):
        tp.randperm(257, dtype=tp.uint8)
    with pytest.raises(ValueError, match="too large for int8"):
        tp.randperm(129, dtype="int8")
    with pytest.raises(ValueError, match="out has shape"):
        tp.randperm(3, out=tp.empty(4, dtype=tp.int64))
    with pytest.raises(TypeError, match="out has dtype int32"):
        tp.randperm(3, out=tp.empty(3, dtype=tp.int32), dtype=tp.int64)
    with pytest.raises(TypeError):
        tp.randperm(3, None)                                 # generator is keyword-only
    assert tp.randperm(0).shape == (0,) and tp.randperm(0).dtype is tp.int64
    assert tp.randperm(0, dtype=tp.float32).dtype is tp.float32


def test_multinomial_argument_errors():
    p = tp.tensor([0.2, 0.3, 0.5])
    with pytest.raises(TypeError, match="must be a Tensor"):
        tp.multinomial([0.5, 0.5], 1)
    with pytest.raises(TypeError, match="must be floating, got int64"):
        tp.multinomial(tp.tensor([1, 2]), 1)
    with pytest.raises(ValueError, match="1-D or 2-D, got 3-D"):
        tp.multinomial(tp.ones(2, 2, 2), 1)
    with pytest.raises(ValueError, match="1-D or 2-D, got 0-D"):
        tp.multinomial(tp.tensor(1.0), 1)
    with pytest.raises(TypeError, match="num_samples must be an int"):
        tp.multinomial(p, 1.0)
    with pytest.raises(ValueError, match="at least 1, got 0"):
        tp.multinomial(p, 0)
    with pytest.raises(TypeError, match="replacement must be a bool"):
        tp.multinomial(p, 1, "yes")
    with pytest.raises(ValueError, match="no categories"):
        tp.multinomial(tp.ones(2, 0), 1)
    with pytest.raises(ValueError, match="cannot draw 4 samples without replacement from 3 categories"):
        p.multinomial(4)
    with pytest.raises(TypeError, match="out has dtype int32"):
        tp.multinomial(p, 2, out=tp.empty(2, dtype=tp.int32))
    with pytest.raises(ValueError, match=r"out has shape \(3,\)"):
        tp.multinomial(p, 2, out=tp.empty(3, dtype=tp.int64))
    with pytest.raises(TypeError):
        tp.multinomial(p, 1, False, None)                    # generator is keyword-only
    assert tp.multinomial(tp.ones(0, 4), 2).shape == (0, 2)


@pytest.mark.parametrize("replacement", [False, True])
@pytest.mark.parametrize("weights, message", [
    ([0.5, -0.1, 0.6], "inf, nan or an element < 0"),
    ([0.5, float("nan"), 0.6], "inf, nan or an element < 0"),
    ([float("inf"), 1.0, 1.0], "inf, nan or an element < 0"),
    ([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]], "sums to zero"),
])
def test_multinomial_value_errors_come_before_any_draw(weights, message, replacement, fake_random):
    with pytest.raises(ValueError, match=message):
        tp.multinomial(tp.tensor(weights, dtype=tp.float64), 1, replacement)
    assert fake_random.calls == []


def test_multinomial_without_replacement_needs_enough_positive_categories(fake_random):
    with pytest.raises(ValueError, match="must not exceed the number of categories of positive weight"):
        tp.multinomial(tp.tensor([[1.0, 0.0, 2.0], [1.0, 1.0, 1.0]]), 3)
    big = np.finfo(np.float64).max
    with pytest.raises(ValueError, match="overflows float64"):
        tp.multinomial(tp.tensor([big, big], dtype=tp.float64), 1, True)
    assert tp.multinomial(tp.tensor([big, big], dtype=tp.float64), 2).shape == (2,)
    assert fake_random.calls == [("rand", (1, 2))]


# ------------------------------------------------------------------ the CPU path with a stand-in generator

class _FakeRandom:
    """rand and randint on the CPU from a seeded NumPy generator, on rand's
    float64 grid; records each call (one call: one offset step)."""

    def __init__(self, seed=0):
        self.rng = np.random.default_rng(seed)
        self.calls = []
        self.generators = []

    def rand(self, *size, generator=None, dtype=None, device=None):
        assert dtype is tp.float64 and str(device) == "cpu"
        self.calls.append(("rand", size))
        self.generators.append(generator)
        return tp.from_numpy(self.rng.integers(0, 2 ** 53, size) * 2.0 ** -53)

    def randint(self, low, high, size, *, generator=None, dtype=None, device=None):
        assert dtype is tp.int64 and str(device) == "cpu"
        self.calls.append(("randint", low, high, size))
        self.generators.append(generator)
        self.last = self.rng.integers(low, high, size)
        return tp.from_numpy(self.last.copy())


@pytest.fixture
def fake_random(monkeypatch):
    fake = _FakeRandom()
    monkeypatch.setattr(_sampling, "rand", fake.rand)
    monkeypatch.setattr(_sampling, "randint", fake.randint)
    return fake


@pytest.mark.parametrize("n", [1, 2, 10, 1000])
def test_randperm_sorts_one_draw_of_keys(n, fake_random):
    marker = object()
    perm = tp.randperm(n, generator=marker)
    assert perm.dtype is tp.int64 and perm.shape == (n,) and perm.device == tp.device("cpu")
    assert sorted(perm.tolist()) == list(range(n))
    assert fake_random.calls == [("randint", 0, 2 ** 62, (n,))] and fake_random.generators == [marker]
    np.testing.assert_array_equal(perm.numpy(), np.argsort(fake_random.last, kind="stable"))


def test_randperm_dtypes_and_out(fake_random):
    for d in (tp.int16, tp.int32, tp.float16, tp.bfloat16, tp.float32, tp.float64, tp.uint8):
        perm = tp.randperm(200, dtype=d, device="cpu")
        assert perm.dtype is d
        assert sorted(perm.numpy().astype(np.int64).tolist()) == list(range(200))
    out = tp.empty(50, dtype=tp.int32)
    assert tp.randperm(50, out=out) is out                   # out's dtype when dtype is not given
    assert sorted(out.tolist()) == list(range(50))
    assert tp.randperm(2049, dtype=tp.float16).shape == (2049,)   # 2048 is still exact in float16
    n_calls = len(fake_random.calls)
    tp.randperm(0)
    assert len(fake_random.calls) == n_calls                 # n = 0 draws nothing


def test_multinomial_cpu_path_uses_one_draw_and_the_twins(fake_random):
    w = tp.tensor([[0.0, 1.0, 3.0, 0.5], [2.0, 0.0, 2.0, 1.0]], dtype=tp.bfloat16)
    got = tp.multinomial(w, 3)
    assert fake_random.calls == [("rand", (2, 4))]
    u = tp.from_numpy(np.random.default_rng(0).integers(0, 2 ** 53, (2, 4)) * 2.0 ** -53)
    assert got.tolist() == _sampling.sample_from_uniforms(w, u, 3, False).tolist()
    got = tp.multinomial(w, 5, replacement=True)
    assert fake_random.calls[-1] == ("rand", (2, 5)) and got.shape == (2, 5)
    assert w.multinomial(num_samples=2, replacement=True).shape == (2, 2)
    assert tp.multinomial(input=w[0], num_samples=1).shape == (1,)


@pytest.mark.parametrize("replacement", [False, True])
def test_multinomial_cpu_frequencies_distinctness_and_zero_categories(replacement, fake_random):
    p = np.array([0.1, 0.0, 0.3, 0.6, 0.0], dtype=np.float32)
    rows = 20_000
    w = tp.tensor(np.broadcast_to(p, (rows, p.size)).copy())
    picks = tp.multinomial(w, 2, replacement).numpy()
    assert picks.shape == (rows, 2) and picks.dtype == np.int64
    assert not np.isin(picks, [1, 4]).any()
    if not replacement:
        assert (picks[:, 0] != picks[:, 1]).all()
    counts = np.bincount(picks[:, 0], minlength=p.size)[[0, 2, 3]]
    probs = p[[0, 2, 3]] / p.sum()
    chi2 = (((counts - rows * probs) ** 2) / (rows * probs)).sum()
    assert chi2 < 23.0, counts                           # chi-square, 2 degrees of freedom: p < 1e-5
    one = tp.multinomial(tp.tensor(p), 3, replacement=True)
    assert one.shape == (3,) and not np.isin(one.numpy(), [1, 4]).any()


def test_multinomial_out(fake_random):
    out = tp.empty(2, 3, dtype=tp.int64)
    w = tp.tensor([[1.0, 2.0, 3.0, 4.0], [4.0, 3.0, 2.0, 1.0]])
    assert tp.multinomial(w, 3, out=out) is out
    assert all(len(set(row)) == 3 for row in out.tolist())


# ------------------------------------------------------------------ with the real generators

def test_randperm_is_a_permutation_and_follows_the_seed():
    for n in (1, 2, 17, 5000):
        perm = tp.randperm(n)
        assert perm.dtype is tp.int64 and sorted(perm.tolist()) == list(range(n))
    a = tp.randperm(1000, generator=tp.Generator().manual_seed(7))
    b = tp.randperm(1000, generator=tp.Generator().manual_seed(7))
    c = tp.randperm(1000, generator=tp.Generator().manual_seed(8))
    assert a.tolist() == b.tolist() != c.tolist()
    keys = tp.randint(0, 2 ** 62, (1000,), generator=tp.Generator().manual_seed(7))
    assert a.tolist() == np.argsort(keys.numpy(), kind="stable").tolist()


@pytest.mark.parametrize("replacement", [False, True])
def test_multinomial_with_the_real_generator(replacement):
    p = tp.tensor([0.2, 0.0, 0.5, 0.3])
    g = tp.Generator().manual_seed(3)
    picks = tp.multinomial(p.unsqueeze(0).expand(30_000, 4).contiguous(), 1, replacement, generator=g).numpy()
    counts = np.bincount(picks[:, 0], minlength=4)
    assert counts[1] == 0
    probs = np.array([0.2, 0.5, 0.3])
    assert (((counts[[0, 2, 3]] - 30_000 * probs) ** 2) / (30_000 * probs)).sum() < 23.0
    a = tp.multinomial(p, 3, replacement, generator=tp.Generator().manual_seed(11))
    b = tp.multinomial(p, 3, replacement, generator=tp.Generator().manual_seed(11))
    assert a.tolist() == b.tolist()
    u = tp.rand(1, 3 if replacement else 4, generator=tp.Generator().manual_seed(11), dtype=tp.float64)
    assert a.tolist() == _sampling.sample_from_uniforms(p.unsqueeze(0), u, 3, replacement)[0].tolist()
