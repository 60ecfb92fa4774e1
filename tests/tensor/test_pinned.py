# SPDX-License-Identifier: Apache-2.0
"""Pinned (page-locked) host memory: ``pin_memory()``, ``is_pinned()``,
``pin_memory=True`` on the creation functions, and copies from pinned memory
(``non_blocking``), as PyTorch has them.

Without a GPU pinning raises CudaUnavailableError with the reason, as
PyTorch raises; the subprocess test turns CUDA off, so it runs on a GPU
machine too. What a CUDA graph capture does with pinned memory is
tests/graph/test_capture_pinned.py; the host-data rule on a fake device,
tests/tensor/test_host_data.py.
"""

import gc
import inspect
import weakref

import numpy as np
import pytest

import tensorplay as tp
from helpers import ALL_DTYPES, HAS_CUDA, random_array, run_python
from tensorplay import _testing

no_gpu = pytest.mark.skipif(HAS_CUDA, reason="checks the no-GPU behaviour")

# the functions that take pin_memory, as PyTorch's do (their bindings take it with the tensor options)
PIN_MEMORY_FUNCTIONS = ["tensor", "empty", "zeros", "ones", "full", "arange", "empty_like", "zeros_like",
                        "ones_like", "full_like"]


# ------------------------------------------------------------------ signatures (any machine)

@pytest.mark.parametrize("name", PIN_MEMORY_FUNCTIONS)
def test_creation_functions_take_pin_memory_as_pytorch(name):
    p = inspect.signature(getattr(tp, name)).parameters["pin_memory"]
    assert p.kind is inspect.Parameter.KEYWORD_ONLY and p.default is False


def test_copies_take_non_blocking_and_tensors_pin():
    for method in (tp.Tensor.to, tp.Tensor.copy_, tp.Tensor.cuda):
        assert inspect.signature(method).parameters["non_blocking"].default is False
    assert list(inspect.signature(tp.Tensor.pin_memory).parameters) == ["self"]
    assert list(inspect.signature(tp.Tensor.is_pinned).parameters) == ["self"]


def test_ordinary_host_memory_is_not_pinned():
    assert not tp.ones(3).is_pinned()
    assert not tp.from_numpy(np.ones(3)).is_pinned()
    assert _testing.pinned_memory_of(np.ones(3)) is None
    assert _testing.pinned_memory_of(memoryview(b"abc")) is None


# ------------------------------------------------------------------ without a GPU

def _pin_calls():
    cpu = tp.ones(2, 3)
    return [lambda: cpu.pin_memory(), lambda: tp.empty(3, pin_memory=True), lambda: tp.empty(0, pin_memory=True),
            lambda: tp.zeros(2, 2, pin_memory=True), lambda: tp.ones(4, dtype=tp.int8, pin_memory=True),
            lambda: tp.full((2,), 7, pin_memory=True), lambda: tp.arange(5, pin_memory=True),
            lambda: tp.tensor([1, 2], pin_memory=True), lambda: tp.tensor(np.ones(3), pin_memory=True),
            lambda: tp.tensor(cpu, pin_memory=True), lambda: tp.empty_like(cpu, pin_memory=True),
            lambda: tp.zeros_like(cpu, pin_memory=True), lambda: tp.ones_like(cpu, pin_memory=True),
            lambda: tp.full_like(cpu, 2.0, pin_memory=True), lambda: _testing.PinnedMemory(64)]


@no_gpu
def test_pinning_without_a_gpu_says_why():
    reason = tp.cuda.unavailable_reason()
    for k, call in enumerate(_pin_calls()):
        with pytest.raises(tp.cuda.CudaUnavailableError) as info:
            call()
        assert str(info.value) == f"page-locked (pinned) host memory needs CUDA, but CUDA is not available: " \
                                  f"{reason}", k
    assert _testing.pinned_memory_stats() == {"buffers": 0, "bytes": 0, "pending_frees": 0}


_DISABLED = """
import numpy as np
import tensorplay as tp
for call in (lambda: tp.ones(3).pin_memory(), lambda: tp.empty(3, pin_memory=True),
             lambda: tp.tensor([1.0], pin_memory=True)):
    try:
        call()
    except tp.cuda.CudaUnavailableError as exc:
        assert str(exc).startswith("page-locked (pinned) host memory needs CUDA, but CUDA is not available: ")
        assert "TENSORPLAY_DISABLE_CUDA" in str(exc), exc
    else:
        raise AssertionError("pinned without CUDA")
assert not tp.ones(3).is_pinned()
print("OK")
"""


def test_pinning_with_cuda_turned_off_says_why():
    out = run_python(_DISABLED, TENSORPLAY_DISABLE_CUDA="1")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "OK"


# ------------------------------------------------------------------ with a GPU

def _pinned_buffers():
    """Pinned buffers alive after the dropped ones whose GPU work has run are freed."""
    gc.collect()
    tp.cuda.synchronize()
    _testing.free_pending_pinned(wait=True)
    return _testing.pinned_memory_stats()


@pytest.mark.cuda
@pytest.mark.parametrize("d", ALL_DTYPES)
def test_pin_memory_copies_the_values_into_pinned_memory(d, rng):
    a = random_array((3, 5), d, rng)
    t = tp.from_numpy(a)
    p = t.pin_memory()
    assert p.is_pinned() and not t.is_pinned()
    assert (p.shape, p.dtype, p.is_cpu, p.is_contiguous()) == ((3, 5), d, True, True)
    assert p.numpy().tobytes() == a.tobytes()
    assert p.pin_memory() is p                               # already pinned: itself, as PyTorch
    for view in (p[1], p[:, 1:4], p.T, p.reshape(15), p[::2]):
        assert view.is_pinned()                              # views share the pinned memory
    assert not (p + 0).is_pinned() and not p.clone().is_pinned()
    assert _testing.pinned_memory_of(p.numpy()) is not None
    src = tp.from_numpy(a.T)                                 # a non-contiguous source pins contiguously
    q = src.pin_memory()
    assert q.is_contiguous() and q.numpy().tobytes() == np.ascontiguousarray(a.T).tobytes()


@pytest.mark.cuda
def test_creation_functions_make_pinned_tensors_with_their_values():
    base = tp.ones(2, 3, dtype=tp.int16)
    made = {
        "empty": (tp.empty(2, 3, pin_memory=True), None),
        "zeros": (tp.zeros(2, 3, pin_memory=True), np.zeros((2, 3), np.float32)),
        "ones": (tp.ones(4, dtype=tp.int8, pin_memory=True), np.ones(4, np.int8)),
        "full": (tp.full((2,), 7, pin_memory=True), np.full(2, 7)),
        "arange": (tp.arange(5, pin_memory=True), np.arange(5)),
        "tensor": (tp.tensor([[1.5, 2.0]], pin_memory=True), np.float32([[1.5, 2.0]])),
        "tensor of an array": (tp.tensor(np.arange(4.0), pin_memory=True), np.arange(4.0)),
        "tensor of a tensor": (tp.tensor(base, dtype=tp.float64, pin_memory=True), np.ones((2, 3))),
        "empty_like": (tp.empty_like(base, pin_memory=True), None),
        "zeros_like": (tp.zeros_like(base, pin_memory=True), np.zeros((2, 3), np.int16)),
        "ones_like": (tp.ones_like(base, pin_memory=True), np.ones((2, 3), np.int16)),
        "full_like": (tp.full_like(base, 3, pin_memory=True), np.full((2, 3), 3, np.int16)),
        "zero elements": (tp.empty(0, 4, pin_memory=True), np.zeros((0, 4), np.float32)),
    }
    for name, (t, want) in made.items():
        assert t.is_pinned() and t.is_cpu, name
        if want is not None:
            got = t.numpy()
            assert got.dtype == want.dtype and np.array_equal(got, want), name
    assert not tp.ones(3, pin_memory=False).is_pinned()
    with pytest.raises(RuntimeError, match="cannot pin a CUDA tensor"):
        tp.ones(3, device="cuda").pin_memory()
    with pytest.raises(RuntimeError, match="pin_memory=True makes a CPU tensor"):
        tp.ones(3, device="cuda", pin_memory=True)
    assert not tp.ones(3, device="cuda").is_pinned()


@pytest.mark.cuda
def test_pinned_memory_exports_its_bytes():
    m = _testing.PinnedMemory(64)
    v = memoryview(m)
    assert v.nbytes == 64 and not v.readonly
    a = np.frombuffer(m, np.uint8)
    a[:] = np.arange(64)
    assert bytes(memoryview(m)) == bytes(range(64))
    assert _testing.pinned_memory_of(a[3:10]) is m and m.size == 64 and m.ptr == a.ctypes.data
    assert _testing.PinnedMemory(0).size == 0 and len(memoryview(_testing.PinnedMemory(0))) == 0


def _queue_gpu_work():
    """Queue some milliseconds of work on the current stream (so that a call
    that waits for the stream visibly waits)."""
    x = tp.ones(1 << 24, device="cuda")
    for _ in range(100):
        x.mul_(1.0)
    return x


@pytest.mark.cuda
@pytest.mark.parametrize("n", [1, 1000, 1 << 20, 1 << 24])
@pytest.mark.parametrize("d", [tp.float32, tp.int16])
def test_non_blocking_copies_from_pinned_memory_are_right(n, d, rng):
    a = random_array(n, d, rng)
    p = tp.from_numpy(a).pin_memory()
    y = p.to("cuda", non_blocking=True)
    z = tp.empty(n, dtype=d, device="cuda")
    z.copy_(p, non_blocking=True)
    w = p.cuda(non_blocking=True)
    cast = p.to("cuda", tp.float64, non_blocking=True)
    tp.cuda.synchronize()
    for t in (y, z, w):
        assert t.numpy().tobytes() == a.tobytes()
    assert np.array_equal(cast.numpy(), a.astype(np.float64))


@pytest.mark.cuda
def test_non_blocking_returns_before_the_copy_and_blocking_waits_for_it():
    n = 1 << 22
    p = tp.arange(n, dtype=tp.float32, pin_memory=True)
    dst = tp.empty(n, device="cuda")
    stream = tp.cuda.current_stream()
    _queue_gpu_work()
    dst.copy_(p, non_blocking=True)
    assert not stream.query()                # queued behind the work: not done yet
    tp.cuda.synchronize()
    _queue_gpu_work()
    dst.copy_(p)                              # waits: the host may change p at once
    assert stream.query()
    p.fill_(-1.0)
    assert np.array_equal(dst.numpy(), np.arange(n, dtype=np.float32))


@pytest.mark.cuda
def test_a_pinned_buffer_outlives_a_non_blocking_copy_of_it():
    n = 1 << 22
    dst = tp.empty(n, device="cuda")
    before = _pinned_buffers()["buffers"]
    _queue_gpu_work()
    p = tp.arange(n, dtype=tp.float32, pin_memory=True)
    mem = weakref.ref(_testing.pinned_memory_of(p.numpy()))
    dst.copy_(p, non_blocking=True)
    del p
    gc.collect()
    # the copy has not run: the buffer waits for it (its free is pending), and
    # a new allocation must not get its memory
    assert mem() is None
    assert _testing.pinned_memory_stats()["pending_frees"] >= 1 or tp.cuda.current_stream().query()
    other = tp.full((n,), -5.0, pin_memory=True)
    tp.cuda.synchronize()
    assert np.array_equal(dst.numpy(), np.arange(n, dtype=np.float32))
    del other
    after = _pinned_buffers()
    assert (after["buffers"], after["pending_frees"]) == (before, 0)


@pytest.mark.cuda
def test_pinned_memory_is_given_back():
    start = _pinned_buffers()
    for k in range(100):
        p = tp.full((1 << 18,), float(k), pin_memory=True)
        y = p.to("cuda", non_blocking=True)
        q = tp.empty(1 << 10, dtype=tp.uint8, pin_memory=True)
        del p, q
    tp.cuda.synchronize()
    assert y.numpy()[[0, -1]].tolist() == [99.0, 99.0]
    assert _pinned_buffers() == start


@pytest.mark.cuda
def test_many_pinned_buffers_alive_at_once():
    bufs = [tp.full((1 << 16,), float(k), dtype=tp.float64, pin_memory=True) for k in range(64)]
    outs = [b.to("cuda", non_blocking=True) for b in bufs]
    tp.cuda.synchronize()
    assert [o[7].item() for o in outs] == [float(k) for k in range(64)]
    assert _testing.pinned_memory_stats()["bytes"] >= 64 * (1 << 16) * 8
