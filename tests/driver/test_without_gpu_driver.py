# SPDX-License-Identifier: Apache-2.0
"""Streams and events without a GPU, decided by what PyTorch does: Event()
constructs (its driver event is made at the first record, which raises),
Stream() and ExternalStream() raise at once, whatever the handle; and
Event's argument errors, which name the public API (any machine). The
in-process tests run where CUDA is unavailable (CI); the subprocess test
turns CUDA off with TENSORPLAY_DISABLE_CUDA, so it runs on a GPU machine too."""

import pytest

import tensorplay as tp
from helpers import HAS_CUDA, run_python
from tensorplay._driver.context import require_cuda

no_gpu = pytest.mark.skipif(HAS_CUDA, reason="checks the no-GPU behaviour")


@no_gpu
def test_an_event_constructs_and_waits_for_nothing_until_recorded():
    e = tp.cuda.Event(enable_timing=True)
    assert repr(e) == "<tensorplay.cuda.Event not recorded>"
    assert e.handle == 0 and e.device_index == -1
    assert e.query() is True
    e.synchronize()                                  # nothing recorded: returns at once
    with pytest.raises(ValueError, match="must be recorded before elapsed_time"):
        e.elapsed_time(tp.cuda.Event(enable_timing=True))


def test_event_argument_errors_name_the_public_api():
    with pytest.raises(TypeError, match="^elapsed_time: end must be a tensorplay.cuda.Event, got int$"):
        tp.cuda.Event(enable_timing=True).elapsed_time(3)
    with pytest.raises(TypeError, match=r"^__init__\(\) takes at most 3 positional arguments"):
        tp.cuda.Event(True, False, False, True)
    with pytest.raises(TypeError, match="unexpected keyword argument 'timing'"):
        tp.cuda.Event(timing=True)
    e = tp.cuda.Event(enable_timing=False, blocking=True, external=True)
    with pytest.raises(ValueError, match="both events need enable_timing=True"):
        e.elapsed_time(tp.cuda.Event(enable_timing=True))


@no_gpu
def test_recording_an_event_says_why_cuda_is_unavailable():
    reason = tp.cuda.unavailable_reason()
    for call in (lambda: tp.cuda.Event().record(), lambda: tp.cuda.Event().wait()):
        with pytest.raises(tp.cuda.CudaUnavailableError) as info:
            call()
        assert str(info.value) == f"CUDA is not available: {reason}"


@no_gpu
@pytest.mark.parametrize("make", [lambda: tp.cuda.Stream(), lambda: tp.cuda.Stream(priority=-1),
                                  lambda: tp.cuda.ExternalStream(0), lambda: tp.cuda.ExternalStream(2),
                                  lambda: tp.cuda.ExternalStream(0x1234), lambda: tp.cuda.ExternalStream(0, device=0)],
                         ids=["Stream", "Stream-priority", "External-0", "External-2", "External-ptr",
                              "External-0-device"])
def test_streams_raise_at_once(make):
    with pytest.raises(tp.cuda.CudaUnavailableError, match="CUDA is not available: "):
        make()


@no_gpu
def test_stream_none_is_a_no_op_and_current_stream_raises():
    with tp.cuda.stream(None) as s:                  # as PyTorch: None changes nothing
        assert s is None
    for call in (tp.cuda.current_stream, tp.cuda.default_stream, lambda: tp.cuda.set_stream(None)):
        with pytest.raises(tp.cuda.CudaUnavailableError):
            call()


@no_gpu
def test_require_cuda_names_what_needed_it():
    with pytest.raises(tp.cuda.CudaUnavailableError) as info:
        require_cuda("f: x must be a CUDA tensor")
    assert str(info.value) == f"f: x must be a CUDA tensor, but CUDA is not available: {tp.cuda.unavailable_reason()}"
    with pytest.raises(tp.cuda.CudaUnavailableError, match="^CUDA is not available: "):
        require_cuda()


def test_require_cuda_passes_with_cuda():
    if HAS_CUDA:
        require_cuda("anything")


_DISABLED = """
import tensorplay as tp
E = tp.cuda.CudaUnavailableError
e = tp.cuda.Event()
assert e.query() and repr(e) == "<tensorplay.cuda.Event not recorded>"
e.synchronize()
for make in (tp.cuda.Stream, lambda: tp.cuda.ExternalStream(0), e.record):
    try:
        make()
    except E as exc:
        assert "TENSORPLAY_DISABLE_CUDA" in str(exc), exc
    else:
        raise AssertionError(make)
print("OK")
"""


def test_the_decisions_hold_with_cuda_turned_off():
    out = run_python(_DISABLED, TENSORPLAY_DISABLE_CUDA="1")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "OK"


def test_launch_host_func_checks_its_callable_first():
    with pytest.raises(TypeError, match="^launch_host_func: fn must be callable, got int$"):
        tp.cuda.launch_host_func(1)
    assert issubclass(tp.cuda.HostFunctionError, RuntimeError)


@no_gpu
def test_launch_host_func_without_cuda_raises_cuda_unavailable():
    with pytest.raises(tp.cuda.CudaUnavailableError):
        tp.cuda.launch_host_func(lambda: None)
