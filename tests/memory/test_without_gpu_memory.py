# SPDX-License-Identifier: Apache-2.0
"""The memory functions without a GPU, as PyTorch's before CUDA is
initialised: statistics read as an allocator that never allocated
(memory_stats() is {}, counters 0), empty_cache() and
reset_peak_memory_stats() do nothing, a device that is not a CUDA device
still raises; graph_pool_handle() and mem_get_info() need CUDA and raise.
The in-process tests run where CUDA is unavailable (CI); the subprocess test
turns CUDA off with TENSORPLAY_DISABLE_CUDA, so it runs on a GPU machine too."""

import pytest

import tensorplay as tp
from helpers import HAS_CUDA, run_python

no_gpu = pytest.mark.skipif(HAS_CUDA, reason="checks the no-GPU behaviour")

COUNTERS = ("memory_allocated", "max_memory_allocated", "memory_reserved", "max_memory_reserved")


@no_gpu
@pytest.mark.parametrize("device", [None, "cuda", "cuda:0", "cuda:3", 0, 1, tp.device("cuda"), tp.device("cuda:1")],
                         ids=repr)
def test_statistics_read_as_an_allocator_that_never_allocated(device):
    for name in COUNTERS:
        assert getattr(tp.cuda, name)(device) == 0, name
    assert tp.cuda.memory_stats(device) == {}
    assert tp.cuda.memory_snapshot(device) == []
    tp.cuda.reset_peak_memory_stats(device)       # nothing to reset
    tp.cuda.empty_cache(device)                   # nothing to release


@no_gpu
def test_the_summary_is_a_table_of_zeros():
    text = tp.cuda.memory_summary()
    assert text.splitlines()[0].split()[:3] == ["Metric", "Cur", "Usage"]
    assert "Allocated memory" in text and "GPU reserved segments" in text
    assert "device alloc/free calls: 0/0, OOM retries: 0, OOMs: 0" in text
    assert "pool" not in text.split("OOMs: 0", 1)[1]            # no pool has segments


@no_gpu
@pytest.mark.parametrize("device, error", [("cpu", ValueError), ("cuda:x", ValueError), (1.5, TypeError),
                                           (True, TypeError)])
def test_a_device_that_is_no_cuda_device_still_raises(device, error):
    for call in (tp.cuda.memory_allocated, tp.cuda.memory_stats, tp.cuda.reset_peak_memory_stats,
                 tp.cuda.empty_cache):
        with pytest.raises(error):
            call(device)


@no_gpu
def test_what_needs_a_device_raises_with_the_reason():
    reason = tp.cuda.unavailable_reason()
    for call in (tp.cuda.graph_pool_handle, tp.cuda.graphs.graph_pool_handle, tp.cuda.mem_get_info):
        with pytest.raises(tp.cuda.CudaUnavailableError) as info:
            call()
        assert str(info.value) == f"CUDA is not available: {reason}"


@no_gpu
def test_live_driver_objects_counts_nothing():
    counts = tp.cuda.live_driver_objects()
    assert counts == {"streams": 0, "events": 0, "graphs": 0, "execs": 0, "modules": 0, "cached_streams": 0}


_DISABLED = """
import tensorplay as tp
assert tp.cuda.memory_allocated() == tp.cuda.max_memory_reserved("cuda:0") == 0
assert tp.cuda.memory_stats() == {} and tp.cuda.memory_snapshot() == []
tp.cuda.empty_cache(); tp.cuda.reset_peak_memory_stats()
assert "OOMs: 0" in tp.cuda.memory_summary()
try:
    tp.cuda.graph_pool_handle()
except tp.cuda.CudaUnavailableError as exc:
    assert "TENSORPLAY_DISABLE_CUDA" in str(exc), exc
else:
    raise AssertionError("graph_pool_handle() without CUDA")
print("OK")
"""


def test_the_decisions_hold_with_cuda_turned_off():
    out = run_python(_DISABLED, TENSORPLAY_DISABLE_CUDA="1")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "OK"
