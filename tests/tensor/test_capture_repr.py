# SPDX-License-Identifier: Apache-2.0
"""A tensor's repr during a CUDA graph capture: shape, dtype and device
without reading the data (which would break the capture), on the capturing
thread and on another one; the values again after the replay."""

import pytest

import tensorplay as tp


def test_capture_repr_names_shape_dtype_and_device():
    from tensorplay._tensor.tensor import _capture_repr
    t = tp.zeros(4, 3, dtype=tp.float16)
    assert _capture_repr(t) == ("tensor(<captured: not readable during a CUDA graph capture>, "
                                "shape=(4, 3), dtype=tensorplay.float16, device='cpu')")


@pytest.mark.cuda
def test_repr_inside_a_capture_does_not_break_it():
    x = tp.ones(4, device="cuda")
    (x * 2).sum()
    tp.cuda.synchronize()
    g = tp.cuda.CUDAGraph()
    with tp.cuda.graph(g):
        y = x * 2
        inside = repr(y)
        shown = f"{x} {y[1:]}"
        assert tp.cuda.is_current_stream_capturing()
    dev = y.device
    assert inside == ("tensor(<captured: not readable during a CUDA graph capture>, shape=(4,), "
                      f"dtype=tensorplay.float32, device='{dev}')")
    assert "captured" in shown and "shape=(3,)" in shown
    g.replay()
    assert y.tolist() == [2.0, 2.0, 2.0, 2.0]
    assert "captured" not in repr(y) and "2." in repr(y)


@pytest.mark.cuda
def test_repr_on_another_thread_during_a_capture_reads_nothing():
    import threading
    x = tp.ones(4, device="cuda")
    (x + 1).sum()
    tp.cuda.synchronize()
    seen = []
    g = tp.cuda.CUDAGraph()
    with tp.cuda.graph(g):
        y = x + 1
        t = threading.Thread(target=lambda: seen.append(repr(x)))
        t.start()
        t.join()
    assert "captured" in seen[0]
    g.replay()
    assert y.tolist() == [2.0] * 4
