# SPDX-License-Identifier: Apache-2.0
import gc

import numpy as np
import pytest

import tensorplay as tp

HAS_CUDA = tp.cuda.is_available()
N_GPUS = tp.cuda.device_count()

ALL_DTYPES = list(tp.ALL_DTYPES)
FLOAT_DTYPES = [tp.float16, tp.bfloat16, tp.float32, tp.float64]


def pytest_collection_modifyitems(config, items):
    skip_cuda = pytest.mark.skip(reason=f"needs a CUDA GPU: {tp.cuda.unavailable_reason()}")
    skip_multi = pytest.mark.skip(reason=f"needs 2 CUDA GPUs, {N_GPUS} present")
    for item in items:
        if "cuda" in item.keywords and not HAS_CUDA:
            item.add_marker(skip_cuda)
        if "multigpu" in item.keywords and N_GPUS < 2:
            item.add_marker(skip_multi)


def pytest_terminal_summary(terminalreporter):
    from gpu_helpers import FUZZED_CALLS
    if FUZZED_CALLS[0]:
        terminalreporter.write_line(f"fuzzed calls: {FUZZED_CALLS[0]}")


def random_array(shape, dtype, rng, low=-50, high=50):
    """Random host data representable exactly enough in ``dtype``."""
    d = tp._dtypes.as_dtype(dtype)
    if d.kind == "b":
        return rng.random(shape) > 0.5
    if d.kind == "u":
        return rng.integers(0, 200, size=shape).astype(d.numpy_dtype)
    if d.kind == "i":
        lo, hi = (-100, 100) if d.itemsize == 1 else (low * 10, high * 10)
        return rng.integers(lo, hi, size=shape).astype(d.numpy_dtype)
    return rng.uniform(low, high, size=shape).astype(d.numpy_dtype)


def activation_reference(r, activation):
    """NumPy's ReLU or GELU (tanh approximation, as cuBLASLt's epilogue) of ``r``."""
    if activation == "relu":
        return np.maximum(r, 0)
    if activation == "gelu":
        return 0.5 * r * (1 + np.tanh(np.sqrt(2 / np.pi) * (r + 0.044715 * r ** 3)))
    return r


@pytest.fixture(autouse=True)
def _fresh_launch_plans():
    """Launch plans cache kernels; tests that fake the kernels must not leak them."""
    from tensorplay._kernels import cache
    cache.plans.clear()
    yield
    cache.plans.clear()


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


@pytest.fixture
def memory_baseline():
    """Yields a function asserting that allocated memory came back to the level
    seen when the test started."""
    gc.collect()
    tp.cuda.synchronize()
    start = tp.cuda.memory_allocated()
    before = {id(o) for o in _live_allocations()}

    def check():
        gc.collect()
        tp.cuda.synchronize()
        now = tp.cuda.memory_allocated()
        if now != start:
            new = [o for o in _live_allocations() if id(o) not in before]
            pytest.fail(f"memory_allocated {now} != {start} at the start; allocations made since "
                        f"and alive: {[_holders(o) for o in new][:5]}")
    yield check


def _live_allocations():
    from tensorplay._memory.allocator import DeviceAllocation
    return [o for o in gc.get_objects() if type(o) is DeviceAllocation]


def _holders(obj, depth=3, skip=()):
    """Who keeps ``obj`` alive: a few levels of referrers, by type (diagnostics)."""
    name = f"{type(obj).__name__}"
    if depth == 0:
        return name
    out = []
    for r in gc.get_referrers(obj):
        if any(r is k for k in skip):
            continue
        if type(r).__name__ == "frame":
            if r.f_code.co_name not in ("check", "_holders", "<listcomp>"):
                out.append(f"frame {r.f_code.co_name}")
            continue
        if isinstance(r, list) and len(r) > 1000:        # gc.get_objects() and the like
            continue
        out.append(_holders(r, depth - 1, skip + (out,)))
        if len(out) >= 4:
            break
    return {name: out}
