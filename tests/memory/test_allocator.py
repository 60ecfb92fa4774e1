# SPDX-License-Identifier: Apache-2.0
import gc

import numpy as np
import pytest

import tensorplay as tp
from helpers import spin

pytestmark = pytest.mark.cuda
MiB = 1 << 20


def test_stats_return_to_baseline_after_tensors_die(memory_baseline):
    before = tp.cuda.memory_allocated()
    xs = [tp.empty(n, dtype=tp.float32, device="cuda") for n in (1, 100, 4096, 300_000, 5_000_000)]
    assert tp.cuda.memory_allocated() >= before + 4 * (1 + 100 + 4096 + 300_000 + 5_000_000)
    assert tp.cuda.memory_reserved() >= tp.cuda.memory_allocated()
    assert tp.cuda.max_memory_allocated() >= tp.cuda.memory_allocated()
    del xs
    memory_baseline()


def test_freed_blocks_are_reused_on_the_same_stream():
    x = tp.empty(1000, device="cuda")
    p = x.data_ptr()
    del x
    y = tp.empty(1000, device="cuda")
    assert y.data_ptr() == p
    segs = tp.cuda.memory_stats()["segment.all.allocated"]
    zs = [tp.empty(100, device="cuda") for _ in range(100)]   # split from cached segments
    assert tp.cuda.memory_stats()["segment.all.allocated"] - segs <= 1
    del zs


def test_blocks_of_another_stream_are_not_reused_before_record_stream_work_ends():
    gc.collect()                        # earlier tests' garbage goes now, not into this test's blocks
    s = tp.cuda.Stream()
    x = tp.empty(1 << 18, device="cuda")
    p = x.data_ptr()
    spin(s, 300_000_000)
    x.record_stream(s)
    del x
    y = tp.empty(1 << 18, device="cuda")
    assert y.data_ptr() != p            # s still runs: the block waits for its event
    s.synchronize()
    del y
    gc.collect()
    z = tp.empty(1 << 18, device="cuda")
    w = tp.empty(1 << 18, device="cuda")
    # x's memory is reused once s is done: by z or w, from p or from a free
    # neighbour it merged with (a shuffled run once had z start 1 KiB before p)
    assert any(t.data_ptr() <= p < t.data_ptr() + t.nbytes for t in (z, w))
    assert tp.cuda.memory_stats()["pending_events"] == 0


def test_empty_cache_releases_reserved_memory():
    tp.cuda.empty_cache()
    base = tp.cuda.memory_reserved()
    x = tp.empty(64 * MiB // 4, device="cuda")
    assert tp.cuda.memory_reserved() >= base + 64 * MiB
    del x
    assert tp.cuda.memory_reserved() >= base + 64 * MiB      # cached
    tp.cuda.empty_cache()
    assert tp.cuda.memory_reserved() == base
    tp.cuda.reset_peak_memory_stats()
    assert tp.cuda.max_memory_reserved() == tp.cuda.memory_reserved()


def test_out_of_memory_is_clear_and_recoverable(memory_baseline):
    free, total = tp.cuda.mem_get_info()
    with pytest.raises(tp.cuda.OutOfMemoryError, match="tried to allocate") as info:
        tp.empty(2 * total, dtype=tp.uint8, device="cuda")
    assert info.value.name == "CUDA_ERROR_OUT_OF_MEMORY"
    assert tp.cuda.memory_stats()["num_ooms"] >= 1
    x = tp.ones(10, device="cuda")
    assert x.tolist() == [1.0] * 10
    del x
    memory_baseline()


def test_private_pools_hold_memory_until_released():
    from tensorplay._memory.api import allocator
    a = allocator(0)
    pid = tp.cuda.graph_pool_handle()
    assert pid != tp.cuda.graph_pool_handle()
    pool = a.retain_pool(pid)
    assert pool.graph_refs == 1
    a.release_pool(pid)
    assert a.get_pool(pid, False) is None      # nothing held, nothing allocated: forgotten


def test_zero_size_allocations():
    x = tp.empty(0, device="cuda")
    assert x.numel() == 0 and x.data_ptr() == 0
    assert x.numpy().shape == (0,)
    y = tp.zeros(0, 3, device="cuda")
    y.copy_(np.zeros((0, 3)))
    assert y.tolist() == []
