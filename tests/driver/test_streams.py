# SPDX-License-Identifier: Apache-2.0
import threading

import numpy as np
import pytest

import tensorplay as tp
from helpers import spin

pytestmark = pytest.mark.cuda


def test_default_current_stream_is_the_legacy_stream():
    s = tp.cuda.current_stream()
    assert s.handle == 0 and s == tp.cuda.default_stream()
    assert s.device_index == 0


def test_stream_properties_and_protocol():
    s = tp.cuda.Stream()
    assert s.handle != 0 and s.cuda_stream == s.handle
    assert s.__cuda_stream__() == (0, s.handle)
    assert s == s and hash(s) == hash(tp.cuda.ExternalStream(s.handle))
    assert s != tp.cuda.Stream()
    assert s.query() is True
    hi = tp.cuda.Stream(priority=-100)     # clamped to the device's range
    assert hi.priority <= 0


def test_stream_context_manager_and_set_stream_are_per_thread():
    s = tp.cuda.Stream()
    with tp.cuda.stream(s):
        assert tp.cuda.current_stream() == s
        other = {}
        t = threading.Thread(target=lambda: other.setdefault("s", tp.cuda.current_stream()))
        t.start()
        t.join()
        assert other["s"].handle == 0
    assert tp.cuda.current_stream().handle == 0
    tp.cuda.set_stream(s)
    try:
        assert tp.cuda.current_stream() is s
    finally:
        tp.cuda.set_stream(tp.cuda.default_stream())
    with tp.cuda.stream(None):
        assert tp.cuda.current_stream().handle == 0


def test_ops_are_asynchronous_on_a_non_default_current_stream():
    s = tp.cuda.Stream()
    x = tp.zeros(1 << 20, device="cuda")
    x.fill_(1.0)                           # the fill kernel compiled and loaded beforehand
    tp.cuda.synchronize()
    with tp.cuda.stream(s):
        spin(s, 400_000_000)
        x.fill_(3.0)                       # queued behind the spin, returns at once
        assert s.query() is False          # so the stream is still busy
        assert tp.cuda.default_stream().query() is True
        y = x.clone()
        assert s.query() is False
    s.synchronize()
    assert s.query() is True
    assert np.all(y.numpy() == 3.0)


def test_wait_stream_orders_work_across_streams():
    s1, s2 = tp.cuda.Stream(), tp.cuda.Stream()
    x = tp.zeros(1 << 16, device="cuda")
    y = tp.zeros(1 << 16, device="cuda")
    tp.cuda.synchronize()
    with tp.cuda.stream(s1):
        spin(s1, 200_000_000)
        x.fill_(7.0)
    s2.wait_stream(s1)
    with tp.cuda.stream(s2):
        y.copy_(x)
        assert s2.query() is False
        assert np.all(y.numpy() == 7.0)    # numpy() waits on s2, the current stream


@pytest.mark.serial  # GPU times (other processes' kernels time-slice in)
def test_events_time_real_work_and_order_streams():
    s = tp.cuda.Stream()
    start, end = tp.cuda.Event(enable_timing=True), tp.cuda.Event(enable_timing=True)
    start.record(s)
    spin(s, 100_000_000)
    end.record(s)
    assert end.query() is False
    end.synchronize()
    assert end.query() is True
    ms = start.elapsed_time(end)
    assert 5.0 < ms < 5000.0
    short_start, short_end = tp.cuda.Event(enable_timing=True), tp.cuda.Event(enable_timing=True)
    short_start.record(s)
    short_end.record(s)
    short_end.synchronize()
    assert short_start.elapsed_time(short_end) < ms

    e = tp.cuda.Event()
    s2 = tp.cuda.Stream()
    # the fill kernel is loaded before the spin: the first launch of a lazily
    # loaded kernel may synchronize the context, which would wait out the spin
    x = tp.zeros(4, device="cuda")
    with tp.cuda.stream(s2):
        x.fill_(0)
    s2.synchronize()
    spin(s, 100_000_000)
    s.record_event(e)
    e.wait(s2)
    with tp.cuda.stream(s2):
        x.fill_(1)
    assert s2.query() is False
    s2.synchronize()
    assert e.query() is True


def test_event_errors():
    a, b = tp.cuda.Event(), tp.cuda.Event()
    with pytest.raises(ValueError, match="enable_timing"):
        a.elapsed_time(b)
    t0, t1 = tp.cuda.Event(enable_timing=True), tp.cuda.Event(enable_timing=True)
    with pytest.raises(ValueError, match="recorded"):
        t0.elapsed_time(t1)
    assert tp.cuda.Event().query() is True       # never recorded
    tp.cuda.Event().synchronize()
    with pytest.raises(TypeError, match="^wait_event: event must be a tensorplay.cuda.Event, got str$"):
        tp.cuda.Stream().wait_event("not an event")
    with pytest.raises(TypeError):
        tp.cuda.stream(3.5)


def test_external_stream_wraps_a_foreign_stream():
    s = tp.cuda.Stream()
    ext = tp.cuda.ExternalStream(s.handle)
    assert ext == s and ext.device_index == 0
    x = tp.zeros(8, device="cuda")
    with tp.cuda.stream(ext):
        x.fill_(2)
    ext.synchronize()
    assert x.tolist() == [2.0] * 8
    with pytest.raises(TypeError):
        tp.cuda.ExternalStream("0x1")
