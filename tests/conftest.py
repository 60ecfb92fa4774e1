# SPDX-License-Identifier: Apache-2.0
"""Fixtures and hooks of the whole suite; shared functions live in helpers.py.
The ``cuda`` marker alone says a test needs a GPU: it is skipped here without one."""
import gc
import os
import shutil
import tempfile

import numpy as np
import pytest

import tensorplay as tp
from helpers import FUZZED_CALLS, HAS_CUDA, N_GPUS, count_fuzzed_call

# The suite compiles hundreds of kernels: they go to a temporary kernel cache,
# removed at the end, not to the user's ~/.cache/tensorplay, unless
# TENSORPLAY_TEST_CACHE_DIR names the folder to use (to keep them between runs).
# Read at each compilation, so setting it here (before any test) is enough;
# subprocesses of the tests inherit it. The process that makes the temporary
# folder is the one that removes it: it puts the folder in
# TENSORPLAY_TEST_CACHE_DIR, so pytest-xdist's workers (started after this
# runs, with this environment) share it and leave it alone, and none of them
# deletes kernels another one still uses. The disk cache is safe to share
# (each image is written to a temporary file, then renamed into place).
_TEST_CACHE = os.environ.get("TENSORPLAY_TEST_CACHE_DIR")
_OWN_TEST_CACHE = not _TEST_CACHE
if _OWN_TEST_CACHE:
    _TEST_CACHE = tempfile.mkdtemp(prefix="tensorplay-test-cache-")
    os.environ["TENSORPLAY_TEST_CACHE_DIR"] = _TEST_CACHE
os.environ["TENSORPLAY_CACHE_DIR"] = _TEST_CACHE

# Under pytest-xdist, other test processes share the GPU (scripts/gpu_tests.sh)
_XDIST_WORKER = os.environ.get("PYTEST_XDIST_WORKER")


def pytest_unconfigure(config):
    if _OWN_TEST_CACHE:
        shutil.rmtree(_TEST_CACHE, ignore_errors=True)


def pytest_report_header(config):
    made = "made for this run" if _OWN_TEST_CACHE else "TENSORPLAY_TEST_CACHE_DIR"
    return f"tensorplay kernel cache: {_TEST_CACHE} ({made}; TENSORPLAY_TEST_CACHE_DIR keeps one between runs)"


def pytest_collection_modifyitems(config, items):
    skip_cuda = pytest.mark.skip(reason=f"needs a CUDA GPU: {tp.cuda.unavailable_reason()}")
    skip_multi = pytest.mark.skip(reason=f"needs 2 CUDA GPUs, {N_GPUS} present")
    skip_serial = pytest.mark.skip(reason="marked serial (device-wide memory or time): other pytest-xdist "
                                          "workers share the GPU; scripts/gpu_tests.sh runs it alone")
    for item in items:
        if "cuda" in item.keywords and not HAS_CUDA:
            item.add_marker(skip_cuda)
        if "multigpu" in item.keywords and N_GPUS < 2:
            item.add_marker(skip_multi)
        if _XDIST_WORKER and item.get_closest_marker("serial"):
            item.add_marker(skip_serial)
    # TENSORPLAY_TEST_SHUFFLE=SEED runs the tests in a seeded random order (the
    # same in every pytest-xdist worker): what an earlier test leaves behind
    # must not break a later one
    seed = os.environ.get("TENSORPLAY_TEST_SHUFFLE")
    if seed:
        import random
        random.Random(seed).shuffle(items)


def pytest_report_collectionfinish(config, items):
    seed = os.environ.get("TENSORPLAY_TEST_SHUFFLE")
    return f"tests shuffled with seed {seed!r} (TENSORPLAY_TEST_SHUFFLE)" if seed else None


def pytest_sessionfinish(session):
    # a pytest-xdist worker hands its count to the controller (pytest_testnodedown)
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:
        workeroutput["fuzzed_calls"] = FUZZED_CALLS[0]


@pytest.hookimpl(optionalhook=True)        # a pytest-xdist hook: unknown without the plugin
def pytest_testnodedown(node, error):
    count_fuzzed_call(getattr(node, "workeroutput", {}).get("fuzzed_calls", 0))


def pytest_terminal_summary(terminalreporter):
    if FUZZED_CALLS[0]:
        terminalreporter.write_line(f"fuzzed calls: {FUZZED_CALLS[0]}")


@pytest.fixture(autouse=True)
def _fresh_launch_plans():
    """Launch plans cache kernels; tests that fake the kernels must not leak them."""
    from tensorplay._kernels import cache
    cache.plans.clear()
    yield
    cache.plans.clear()


@pytest.fixture
def kernel_cache(tmp_path, monkeypatch):
    """A fresh kernel cache under ``tmp_path`` (TENSORPLAY_CACHE_DIR), the
    in-memory cache cleared before and after; yields its kernels folder."""
    from tensorplay._kernels import nvrtc
    monkeypatch.setenv("TENSORPLAY_CACHE_DIR", str(tmp_path))
    nvrtc.clear_memory_cache()
    yield tmp_path / "kernels"
    nvrtc.clear_memory_cache()


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
