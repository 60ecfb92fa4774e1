# SPDX-License-Identifier: Apache-2.0
import threading

import pytest

import tensorplay as tp
from tensorplay._testing import bound_device

pytestmark = pytest.mark.cuda


def test_device_queries():
    n = tp.cuda.device_count()
    assert n >= 1
    assert tp.cuda.is_available()
    props = tp.cuda.get_device_properties(0)
    assert props["name"] == tp.cuda.get_device_name(0) and props["name"]
    assert (props["major"], props["minor"]) == tp.cuda.get_device_capability("cuda:0")
    assert props["total_memory"] > 1 << 30
    assert props["multi_processor_count"] > 0
    free, total = tp.cuda.mem_get_info()
    assert 0 < free <= total == props["total_memory"]
    assert tp.cuda.driver_version() >= (12, 4)


def test_device_index_out_of_range_is_a_value_error():
    n = tp.cuda.device_count()
    for bad in (n, n + 5, "cuda:%d" % n):
        with pytest.raises(ValueError, match="out of range"):
            tp.cuda.set_device(bad)
        with pytest.raises(ValueError, match="out of range"):
            tp.zeros(2, device=bad)
    with pytest.raises(ValueError, match="out of range"):
        tp.cuda.get_device_properties(n)
    with pytest.raises(ValueError):
        tp.cuda.Stream(device=n)
    with pytest.raises(ValueError, match="out of range"):
        tp.cuda.enable_peer_access(0, n)
    tp.cuda.enable_peer_access(0, 0)             # a device always reaches its own memory
    tp.cuda.disable_peer_access(0, 0)


def test_set_device_and_device_context_manager():
    assert tp.cuda.current_device() == 0
    with tp.cuda.device(0):
        assert tp.cuda.current_device() == 0
    tp.cuda.set_device("cuda:0")
    assert tp.cuda.current_device() == 0
    x = tp.zeros(3, device="cuda")
    assert x.device == "cuda:0" and x.device.index == 0


def test_synchronize_and_context_bound_lazily_per_thread():
    tp.cuda.synchronize()
    tp.cuda.synchronize("cuda:0")
    seen = {}

    def worker():
        seen["before"] = bound_device()
        x = tp.ones(4, device="cuda:0")
        seen["values"] = x.tolist()
        seen["after"] = bound_device()

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    assert seen == {"before": -1, "values": [1.0] * 4, "after": 0}


def test_driver_errors_carry_name_and_code():
    from tensorplay._driver.memcpy import pointer_device
    with pytest.raises(tp.cuda.CudaError) as info:
        pointer_device(0x10)      # not a device pointer
    assert info.value.name.startswith("CUDA_ERROR_")
    assert info.value.code != 0
    assert str(info.value).startswith(info.value.name + ":")
