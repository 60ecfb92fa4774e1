# SPDX-License-Identifier: Apache-2.0
"""Creation and small host data on CUDA, without a GPU.

The parameter tables of the small-host-data kernel (a pure function), which
path each upload takes and what it carries (CUDA tensors faked as metadata
over fake addresses, kernel launches and host copies recorded), that the
creation ops make no host copy, and arange's length and kernel arguments
against NumPy; inside a capture, which host data is copied into the graph
(literals), read at every replay (pinned memory, faked here as NumPy arrays
the fake device calls pinned) or refused (pageable CPU tensors and NumPy
arrays). The GPU runs the same paths for real in
tests/graph/test_capture_creation.py and tests/graph/test_capture_pinned.py.
"""

import ctypes
import struct

import numpy as np
import pytest
from cuda.bindings import driver
from hypothesis import given, settings, strategies as st

import tensorplay as tp
from helpers import ALL_DTYPES, ROOT, random_array
from tensorplay._tensor import args as _args
from tensorplay._tensor import creation as _tensor_creation
from tensorplay._tensor import tensor as _tensor
from tensorplay._tensor import transfer as _transfer
from tensorplay._kernels import cache as _kernels
from tensorplay._kernels.param_upload import (PARAM_HEADER_BYTES, PARAM_UPLOAD_CAPACITIES, PARAM_UPLOAD_MAX_BYTES,
                                              PARAM_WRITE_BLOCK, pack_param_write, param_write_capacity)
from tensorplay._ops import creation as _creation
from tensorplay._ops import elementwise as _elementwise
from tensorplay._ops import indexing as _indexing

CAPTURE_UNSUPPORTED = int(driver.CUresult.CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED)
STREAM = 0x5A5A


# ------------------------------------------------------------------ the parameter tables

@pytest.mark.parametrize("nbytes, capacity", [(0, 256), (1, 256), (255, 256), (256, 256), (257, 1024),
                                              (1024, 1024), (1025, 4096), (4095, 4096), (4096, 4096)])
def test_the_smallest_table_that_holds_the_data_is_chosen(nbytes, capacity):
    assert param_write_capacity(nbytes) == capacity


def test_tables_end_at_the_documented_limit():
    assert PARAM_UPLOAD_MAX_BYTES == 4096
    assert list(PARAM_UPLOAD_CAPACITIES) == sorted(PARAM_UPLOAD_CAPACITIES)
    assert PARAM_UPLOAD_CAPACITIES[-1] == PARAM_UPLOAD_MAX_BYTES
    with pytest.raises(ValueError, match="4097 bytes do not fit in kernel parameters: at most 4096"):
        param_write_capacity(PARAM_UPLOAD_MAX_BYTES + 1)
    with pytest.raises(ValueError, match="4097 bytes"):
        pack_param_write(0x1000, bytes(4097))
    with pytest.raises(ValueError, match="negative"):
        param_write_capacity(-1)


@pytest.mark.parametrize("n", [1, 2, 3, 7, 255, 256, 257, 1000, 1024, 1025, 4096])
def test_packed_table_layout(n):
    """Header (destination, byte count) as two little-endian u64, the data
    right after it, zeros up to the capacity: the kernel's parameter struct."""
    data = bytes((7 * k + 1) % 256 for k in range(n))
    dst = 0x7F00_0000_1235                       # an odd address: bytes go anywhere
    capacity, params = pack_param_write(dst, data)
    assert capacity == param_write_capacity(n)
    assert len(params) == PARAM_HEADER_BYTES + capacity == 16 + capacity
    assert struct.unpack_from("<QQ", params) == (dst, n)
    assert params[16:16 + n] == data
    assert params[16 + n:] == bytes(capacity - n)
    assert pack_param_write(dst, memoryview(np.frombuffer(data, np.uint8))) == (capacity, params)


@pytest.mark.parametrize("d", ALL_DTYPES)
def test_packed_values_round_trip_bit_for_bit(d, rng):
    """The bytes carried are the host array's, for every dtype (1-byte bool,
    2-byte halves): the device gets exactly those bits."""
    a = random_array(5, d, rng)
    if d.kind == "f":
        a[0], a[1] = np.nan, -0.0
    _, params = pack_param_write(0x2000, a.tobytes())
    back = np.frombuffer(params[16:16 + a.nbytes], dtype=d.numpy_dtype)
    assert back.tobytes() == a.tobytes()


def test_the_graphs_guide_states_the_limit():
    text = (ROOT / "docs" / "guide" / "graphs.md").read_text()
    assert f"{PARAM_UPLOAD_MAX_BYTES} bytes" in text
    assert "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED" in text


# ------------------------------------------------------------------ a fake device

class FakeDevice:
    """CUDA device 0 without a GPU: tensors are metadata over fake
    addresses; kernel launches, host copies, device copies and memsets are
    recorded; while ``capturing`` is set, the capture check raises as the
    driver's answer inside a capture would make it."""

    def __init__(self):
        self.launches = []         # (kernel key, grid, block, params)
        self.memcpys = []          # (dst, the bytes copied)
        self.device_copies = []    # (dst, src, nbytes)
        self.memsets = []          # (dst, value, nbytes)
        self.allocs = []           # shapes
        self.capture_checks = 0
        self.capturing = False
        self.pinned = []           # the root arrays the fake calls pinned
        self.pinned_copies = []    # (dst, src, nbytes, blocking) of cuMemcpyHtoDAsync from pinned memory
        self.host_copies = []      # (dst, src, nbytes, blocking) of cuMemcpyDtoHAsync to pinned memory
        self.error_checks = 0      # device error checks run after waiting for a copy to the host
        self.kept = []             # what a capture was asked to keep alive
        self._next = 0x7000_0000

    def _address(self, nbytes):
        ptr = self._next
        self._next += (nbytes + 0x1FF) & ~0xFF
        return ptr

    def pin(self, array):
        """A CPU tensor over ``array``, which the fake now calls pinned."""
        self.pinned.append(array)
        return tp.from_numpy(array)

    def pinned_memory_of(self, array):
        b = array
        while b is not None:                     # views keep their base (as_strided's through an object)
            if any(a is b for a in self.pinned):
                return ("pinned", id(b))
            b = getattr(b, "base", None)
        return None

    def copy_pinned(self, mem, dst, src, nbytes, dev, stream, blocking):
        assert stream == STREAM and mem is not None
        self.pinned_copies.append((dst, src, nbytes, blocking))
        return self.capturing

    def copy_to_pinned(self, mem, dst, src, nbytes, dev, stream, blocking):
        assert stream == STREAM and mem is not None
        self.host_copies.append((dst, src, nbytes, blocking))
        return self.capturing

    def check_errors(self, dev):
        assert dev == 0
        self.error_checks += 1

    def allocate(self, nbytes, dev, stream):
        assert stream == STREAM
        self.allocs.append(nbytes)

        class Storage:
            ptr = self._address(nbytes)
        return Storage()

    def empty(self, shape, dtype, dev):
        n = 1
        for s in shape:
            n *= s
        ptr = self._address(n * dtype.itemsize)
        self.allocs.append(tuple(shape))
        t = tp.Tensor.__new__(tp.Tensor)
        t._set_cuda(None, ptr, tuple(shape), _args.contiguous_strides(shape), dtype.code, dev)
        return t

    def function(self, key, dev, make):
        make()                                   # the source must generate
        log = self.launches

        class Launcher:
            def launch(self, grid, block, params, shared=0, stream=None):
                log.append((key, grid, block, params))
        return Launcher()

    def memcpy_htod(self, dst, src_host, nbytes, dev, stream):
        assert stream == STREAM
        self.memcpys.append((dst, ctypes.string_at(src_host, nbytes)))

    def refuse(self, dev, stream, reason):
        assert stream == STREAM
        self.capture_checks += 1
        if self.capturing:
            raise tp._driver.context.make_error(CAPTURE_UNSUPPORTED, reason)

    def writes(self):
        """(dst, data bytes, capacity) of each small-host-data launch."""
        out = []
        for key, grid, block, params in self.launches:
            if key[0] == "param_write":
                assert grid == 1 and block == PARAM_WRITE_BLOCK and len(params) == 16 + key[1]
                dst, n = struct.unpack_from("<QQ", params)
                assert params[16 + n:] == bytes(key[1] - n)
                out.append((dst, params[16:16 + n], key[1]))
        return out

    def kernels(self):
        """The keys of the other launches."""
        return [key for key, *_ in self.launches if key[0] != "param_write"]


@pytest.fixture
def fake(monkeypatch):
    dev = FakeDevice()

    def resolve(device):
        return -1 if _args.as_device(device).type == "cpu" else 0
    for mod in (_tensor, _tensor_creation, _elementwise, _indexing):
        monkeypatch.setattr(mod, "empty_cuda", dev.empty)
    for mod in (_tensor, _tensor_creation, _creation):
        monkeypatch.setattr(mod, "resolve_device", resolve)
    monkeypatch.setattr(_tensor, "cuda_device_index", lambda device=None: 0)
    for mod in (_tensor, _transfer, _indexing):
        monkeypatch.setattr(mod, "current_stream_handle_of", lambda d: STREAM)
    monkeypatch.setattr(_kernels, "cached_function", dev.function)
    monkeypatch.setitem(_kernels._sm_cache, 0, 132)
    monkeypatch.setattr(_transfer, "memcpy_htod_async", dev.memcpy_htod)
    monkeypatch.setattr(_transfer, "refuse_in_capture", dev.refuse)
    monkeypatch.setattr(_tensor, "memcpy_dtod_async",
                        lambda dst, src, n, d, s: dev.device_copies.append((dst, src, n)))
    for mod in (_tensor, _indexing):
        monkeypatch.setattr(mod, "memset_d8_async", lambda dst, v, n, d, s: dev.memsets.append((dst, v, n)))
    monkeypatch.setattr(_indexing, "_flags", {})
    monkeypatch.setattr(_indexing, "_pending", set())
    for mod in (_tensor, _tensor_creation):
        monkeypatch.setattr(mod, "pinned_memory_of", dev.pinned_memory_of)
    monkeypatch.setattr(_tensor, "copy_to_device", dev.copy_pinned)
    monkeypatch.setattr(_tensor, "copy_to_host", dev.copy_to_pinned)
    monkeypatch.setattr(_tensor, "run_device_error_checks", dev.check_errors)
    monkeypatch.setattr(_tensor, "allocate", dev.allocate)
    monkeypatch.setattr(_tensor, "note_capture_use", dev.kept.append)
    monkeypatch.setattr(_indexing, "refuse_in_capture", dev.refuse)
    return dev


# ------------------------------------------------------------------ which path each upload takes

SMALL_DTYPES = [tp.bool, tp.uint8, tp.int8, tp.int16, tp.float16, tp.bfloat16, tp.float32, tp.int64, tp.float64]


@pytest.mark.parametrize("d", SMALL_DTYPES)
@pytest.mark.parametrize("n", [1, 3, 7, 129])
def test_small_host_data_is_one_launch_carrying_its_bytes(fake, d, n, rng):
    a = random_array(n, d, rng)
    t = tp.tensor(a, device="cuda")
    assert t.is_cuda and t.shape == (n,) and t.dtype is d
    assert fake.writes() == [(t.data_ptr(), a.tobytes(), param_write_capacity(a.nbytes))]
    assert fake.kernels() == [] and fake.memcpys == []
    # one driver query: an array may change after a capture, which refuses it (see below)
    assert fake.capture_checks == 1


def test_python_numbers_and_lists_infer_dtypes_as_torch(fake):
    s = tp.tensor(3.0, device="cuda")
    v = tp.tensor([1, 2, 3], device="cuda")
    m = tp.tensor([[True, False, True]], device="cuda")
    assert (s.shape, s.dtype, v.dtype, m.shape, m.dtype) == ((), tp.float32, tp.int64, (1, 3), tp.bool)
    assert [w[1] for w in fake.writes()] == [np.float32(3.0).tobytes(), np.array([1, 2, 3], np.int64).tobytes(),
                                             bytes([1, 0, 1])]


@pytest.mark.parametrize("n, capacity", [(256, 256), (257, 1024), (1024, 1024), (1025, 4096), (4096, 4096)])
def test_table_capacity_follows_the_size(fake, n, capacity):
    a = (np.arange(n) % 251).astype(np.uint8)
    t = tp.tensor(a, device="cuda")
    assert fake.writes() == [(t.data_ptr(), a.tobytes(), capacity)]


def test_larger_host_data_is_copied_with_cumemcpyhtodasync_outside_a_capture(fake):
    a = (np.arange(PARAM_UPLOAD_MAX_BYTES + 1) % 253).astype(np.uint8)
    t = tp.tensor(a, device="cuda")
    assert fake.memcpys == [(t.data_ptr(), a.tobytes())]
    assert fake.writes() == [] and fake.capture_checks == 1


def test_host_data_at_the_limit_inside_a_capture_travels_in_parameters(fake):
    fake.capturing = True
    a = np.arange(1024, dtype=np.float32)        # exactly 4096 bytes
    t = tp.tensor(a.tolist(), device="cuda")     # a list: its values cannot change, the graph keeps them
    assert fake.writes() == [(t.data_ptr(), a.tobytes(), 4096)] and fake.capture_checks == 0


def _assert_refused(info, nbytes):
    err = info.value
    assert isinstance(err, tp.cuda.CudaError) and err.name == "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED"
    msg = str(err)
    assert f"{nbytes} bytes of host data" in msg and f"up to {PARAM_UPLOAD_MAX_BYTES} bytes" in msg
    assert "before the capture" in msg


def test_larger_host_data_inside_a_capture_is_refused_before_any_gpu_work(fake):
    big = [1.0] * 1025                           # 4100 bytes of float32
    dst = fake.empty((1025,), tp.float32, 0)
    wide = fake.empty((4, 1025), tp.float32, 0)
    strided = fake.empty((2050,), tp.float32, 0)[::2]
    x = fake.empty((600, 2), tp.float32, 0)
    allocs = len(fake.allocs)
    fake.capturing = True
    with pytest.raises(tp.cuda.CudaError) as info:
        tp.tensor(big, device="cuda")
    _assert_refused(info, 4100)
    with pytest.raises(tp.cuda.CudaError) as info:
        dst.copy_(big)                           # contiguous: cast on the host, then one upload
    _assert_refused(info, 4100)
    with pytest.raises(tp.cuda.CudaError) as info:
        wide.copy_(big)                          # broadcast: the source alone would be uploaded
    _assert_refused(info, 4100)
    with pytest.raises(tp.cuda.CudaError) as info:
        strided.copy_(list(range(1025)))         # the source's own dtype travels: 8200 bytes of int64
    _assert_refused(info, 8200)
    with pytest.raises(tp.cuda.CudaError) as info:
        x[list(range(513))]                      # 513 int64 indices
    _assert_refused(info, 4104)
    assert len(fake.allocs) == allocs            # nothing allocated, launched or copied
    assert fake.launches == [] and fake.memcpys == [] and fake.device_copies == []


def test_copy_into_a_contiguous_destination_casts_on_the_host(fake):
    dst = fake.empty((5,), tp.float16, 0)
    dst.copy_([1, 2.5, -3, 65504, 1e-3])
    want = np.array([1, 2.5, -3, 65504, 1e-3]).astype(np.float16).tobytes()
    assert fake.writes() == [(dst.data_ptr(), want, 256)] and fake.kernels() == []


def test_copy_into_a_view_at_an_odd_address(fake):
    buf = fake.empty((9,), tp.uint8, 0)
    buf[1:4].copy_([7, 8, 9])
    flags = fake.empty((5,), tp.bool, 0)
    flags[3:].copy_(np.array([True, False]))
    assert fake.writes() == [(buf.data_ptr() + 1, bytes([7, 8, 9]), 256),
                             (flags.data_ptr() + 3, bytes([1, 0]), 256)]


def test_broadcast_and_strided_copies_upload_the_source_then_copy_on_the_device(fake):
    dst = fake.empty((4, 3), tp.float32, 0)
    dst.copy_([1.0, 2.0, 3.0])
    (tmp, data, _), = fake.writes()
    assert data == np.array([1, 2, 3], np.float32).tobytes()
    (key, grid, block, params) = fake.launches[1]
    assert key[0] == "copy" and struct.unpack_from("<QQ", params) == (dst.data_ptr(), tmp)
    fake.launches.clear()
    dst.T.copy_(np.arange(12, dtype=np.int32).reshape(3, 4))     # transposed, another dtype
    (tmp, data, _), = fake.writes()
    assert data == np.arange(12, dtype=np.int32).tobytes()
    assert fake.kernels()[0][0] == "copy"


def test_to_cuda_as_tensor_and_tensor_of_a_cpu_tensor_travel_in_parameters(fake):
    cpu = tp.tensor([1.5, -2.0, 3.25])
    outs = [cpu.to("cuda"), cpu.cuda(), cpu.to("cuda", tp.float64), tp.as_tensor([4, 5], device="cuda"),
            tp.as_tensor(np.array([6, 7], np.int16), device="cuda"), tp.tensor(cpu, device="cuda")]
    f32 = np.array([1.5, -2.0, 3.25], np.float32)
    want = [f32.tobytes(), f32.tobytes(), f32.astype(np.float64).tobytes(), np.array([4, 5]).tobytes(),
            np.array([6, 7], np.int16).tobytes(), f32.tobytes()]
    assert fake.writes() == [(t.data_ptr(), w, 256) for t, w in zip(outs, want)]
    assert fake.memcpys == []


def test_tensor_of_a_cuda_tensor_copies_on_the_device(fake):
    src = fake.empty((6,), tp.float32, 0)
    t = tp.tensor(src, device="cuda")
    assert fake.device_copies == [(t.data_ptr(), src.data_ptr(), 24)]
    assert t.data_ptr() != src.data_ptr()
    h = tp.tensor(src, dtype=tp.float16, device="cuda")           # a cast kernel
    assert fake.kernels()[-1][0] == "copy" and h.dtype is tp.float16
    assert fake.writes() == [] and fake.memcpys == []


def test_list_and_array_indices_travel_in_parameters(fake):
    x = fake.empty((8, 2), tp.float32, 0)
    y = x[[0, 2, -1]]
    z = x[np.array([1, 3], dtype=np.int32)]
    (i1, d1, _), (i2, d2, _) = fake.writes()
    assert d1 == np.array([0, 2, -1], np.int64).tobytes() and d2 == np.array([1, 3], np.int64).tobytes()
    gathers = [struct.unpack_from("<QQQqq", p) for k, _, _, p in fake.launches if k[:2] == ("index", "gather")]
    assert gathers == [(y.data_ptr(), x.data_ptr(), i1, 6, 8), (z.data_ptr(), x.data_ptr(), i2, 4, 8)]
    n = len(fake.launches)
    with pytest.raises(IndexError, match="index 8 is out of bounds"):
        x[[0, 8]]
    assert len(fake.launches) == n               # checked on the host before any launch


def test_setitem_with_a_list_index_uploads_index_and_values(fake):
    x = fake.empty((4, 2), tp.float32, 0)
    x[[1, 3]] = [[5.0, 6.0], [7.0, 8.0]]
    data = [w[1] for w in fake.writes()]
    assert np.array([[5, 6], [7, 8]], np.float32).tobytes() in data
    assert np.array([1, 3], np.int64).tobytes() in data
    assert [k[:2] for k in fake.kernels()][-1] == ("index", "scatter")


def test_host_data_operands_take_the_device_of_the_tensor_operands(fake):
    x = fake.empty((3,), tp.float32, 0)
    y = x + [1.0, 2.0, 3.0]
    (tmp, data, _), = fake.writes()
    assert data == np.array([1, 2, 3], np.float32).tobytes()
    key, _, _, params = fake.launches[-1]
    assert key[0][0] == "add" and struct.unpack_from("<QQQ", params) == (y.data_ptr(), x.data_ptr(), tmp)
    z = x * np.array([[1], [2]], dtype=np.int32)                  # broadcasts to (2, 3)
    assert z.shape == (2, 3) and z.dtype is tp.float32 and z.is_cuda
    assert fake.writes()[-1][1] == np.array([[1], [2]], np.int32).tobytes()
    w = tp.where([True, False, True], x, (0.0, -1.0, 5.0))
    assert w.is_cuda and [d for _, d, _ in fake.writes()[-2:]] == [
        bytes([1, 0, 1]), np.array([0, -1, 5], np.float32).tobytes()]
    n = len(fake.writes())
    x + np.float32(2.0)                          # scalars stay kernel arguments
    x + np.array(2.0)
    assert len(fake.writes()) == n
    with pytest.raises(ValueError, match="one device"):
        x + tp.tensor([1.0, 2.0, 3.0])           # a CPU tensor is not host data: as in PyTorch


# ------------------------------------------------------------------ creation makes no host copy

@pytest.mark.parametrize("d", ALL_DTYPES)
def test_creation_ops_on_cuda_run_kernels_and_memsets_only(fake, d):
    base = fake.empty((3, 4), tp.float32, 0)
    made = [tp.zeros(2, 3, dtype=d, device="cuda"), tp.ones(5, dtype=d, device="cuda"),
            tp.full((2, 2), 1, dtype=d, device="cuda"), tp.eye(3, 4, dtype=d, device="cuda"),
            tp.linspace(-1, 2, 17, dtype=d, device="cuda"), tp.arange(-3, 40, 3, dtype=d, device="cuda"),
            tp.empty(4, dtype=d, device="cuda"), tp.zeros_like(base, dtype=d), tp.ones_like(base, dtype=d),
            tp.full_like(base, 0, dtype=d), tp.empty_like(base, dtype=d),
            tp.zeros_like(tp.ones(2, 2), dtype=d, device="cuda"), tp.ones_like(tp.ones(2), dtype=d, device="cuda")]
    assert all(t.is_cuda and t.dtype is d for t in made)
    assert [t.shape for t in made] == [(2, 3), (5,), (2, 2), (3, 4), (17,), (15,), (4,), (3, 4), (3, 4),
                                       (3, 4), (3, 4), (2, 2), (2,)]
    assert fake.memcpys == [] and fake.writes() == [] and fake.capture_checks == 0
    assert sorted(n for _, _, n in fake.memsets) == sorted([6 * d.itemsize, 12 * d.itemsize, 4 * d.itemsize])
    ops = [k[0] for k in fake.kernels()]
    assert ops == ["fill", "fill", "eye", "linspace", ("arange", "f" if d.kind == "f" else "i"), "fill", "fill",
                   "fill"]
    cpu = tp.zeros_like(base, dtype=d, device="cpu")
    assert cpu.is_cpu and np.array_equal(cpu.numpy(), np.zeros((3, 4), d.numpy_dtype))


def test_arange_on_cuda_is_one_launch_with_numpys_parameters(fake):
    t = tp.arange(0.1, 1.0, 0.2, device="cuda")
    (key, grid, block, params), = fake.launches
    assert key[0] == ("arange", "f") and t.shape == (5,) and t.dtype is tp.float32
    ptr, n, first, delta, second = struct.unpack("<Qqddd", params)
    assert (ptr, n, first, second) == (t.data_ptr(), 5, 0.1, 0.1 + 0.2)
    assert delta == (0.1 + 0.2) - 0.1 != 0.2             # NumPy's step, not the one given
    fake.launches.clear()
    t = tp.arange(10, -1, -3, dtype=tp.int8, device="cuda")
    (key, grid, block, params), = fake.launches
    assert key[0] == ("arange", "i") and struct.unpack("<Qqqq", params) == (t.data_ptr(), 4, 10, -3)
    fake.launches.clear()
    assert tp.arange(5, 5, device="cuda").shape == (0,) and fake.launches == []


# ------------------------------------------------------------------ arange against NumPy

ints = st.integers(-10**6, 10**6)
floats = st.floats(-1e4, 1e4, allow_nan=False, allow_infinity=False)
steps = st.one_of(st.integers(-1000, 1000).filter(bool),
                  st.floats(-100, 100, allow_nan=False, allow_infinity=False).filter(lambda s: abs(s) > 1e-2))


@settings(max_examples=500, deadline=None)
@given(start=st.one_of(ints, floats), end=st.one_of(ints, floats), step=steps)
def test_arange_length_is_numpys(start, end, step):
    n = _tensor_creation.arange_length(start, end, step)
    if n > 200_000:
        return
    assert n == len(np.arange(start, end, step, dtype=np.float64)) == len(np.arange(start, end, step))


@pytest.mark.parametrize("start, end, step, n", [(0, 5, float("inf"), 1), (0, -5, float("inf"), 0),
                                                 (0.0, 1e-300, 1e300, 1), (0.0, -1e-300, 1e300, 0),
                                                 (5, 0, -1, 5), (5, 0, 1, 0), (2**70, 2**70 + 7, 3, 3)])
def test_arange_length_edge_cases(start, end, step, n):
    assert _tensor_creation.arange_length(start, end, step) == n
    if abs(start) < 2**63:
        assert len(np.arange(start, end, step)) == n


def _kernel_values(start, end, step, d):
    """What the CUDA arange kernel computes, evaluated with NumPy: float64
    operations rounded one by one (NumPy's vector multiply and add do not
    fuse), int64 arithmetic wrapping, then the dtype cast of the store."""
    n = _tensor_creation.arange_length(start, end, step)
    kind, expr, scalars = _tensor_creation.arange_kernel_args(start, step, d)
    i = np.arange(n, dtype=np.int64)
    if kind == "f":
        first, delta, second = scalars
        v = first + i.astype(np.float64) * delta
        v[:1] = first
        v[1:2] = second
    else:
        first, delta = scalars
        v = (np.uint64(first % 2**64) + i.astype(np.uint64) * np.uint64(delta % 2**64)).view(np.int64)
    with np.errstate(all="ignore"):
        return v.astype(d.numpy_dtype)


@settings(max_examples=300, deadline=None)
@given(start=st.one_of(ints, floats), end=st.one_of(ints, floats), step=steps, d=st.sampled_from(ALL_DTYPES))
def test_arange_kernel_arguments_reproduce_numpy_bit_for_bit(start, end, step, d):
    if abs((end - start) / step) > 100_000:
        return
    with np.errstate(all="ignore"):
        want = np.arange(start, end, step, dtype=np.float64 if d.kind == "f" else np.int64).astype(d.numpy_dtype)
    got = _kernel_values(start, end, step, d)
    assert got.shape == want.shape and got.tobytes() == want.tobytes()


@pytest.mark.parametrize("d", ALL_DTYPES)
@pytest.mark.parametrize("args", [(10,), (-7, 300, 7), (300, -7, -7), (0.1, 4.2, 0.3), (2.5, -1.0, -0.25),
                                  (-0.5, 5, 1.5), (1e6, 1e6 + 30, 0.7)])
def test_arange_on_the_cpu_matches_numpy_for_every_dtype(d, args):
    t = tp.arange(*args, dtype=d)
    work = np.float64 if d.kind == "f" else np.int64
    with np.errstate(all="ignore"):
        want = np.arange(*args, dtype=work).astype(d.numpy_dtype)
    assert t.dtype is d and t.numpy().tobytes() == want.tobytes()
    start, end, step = (0, args[0], 1) if len(args) == 1 else args
    assert _kernel_values(start, end, step, d).tobytes() == want.tobytes()     # the CUDA kernel's values


def test_arange_default_dtypes_and_numpy_scalars():
    assert tp.arange(5).dtype is tp.int64 and tp.arange(np.int32(5)).dtype is tp.int64
    assert tp.arange(0, 1, 0.25).dtype is tp.float32 and tp.arange(np.float64(2.0)).dtype is tp.float32
    assert tp.arange(np.int16(2), np.int64(9), np.int8(3)).tolist() == [2, 5, 8]


# ids not named "cuda": that keyword marks GPU tests (conftest), and this one runs anywhere
@pytest.mark.parametrize("device", ["cpu", "cuda"], ids=["on_cpu", "on_gpu"])
def test_arange_errors_come_before_any_device_work(device):
    """The same errors on both devices, raised before the device is even
    looked at (so here, without a GPU, never CudaUnavailableError)."""
    with pytest.raises(TypeError, match="real numbers"):
        tp.arange(True, device=device)
    with pytest.raises(TypeError, match="real numbers"):
        tp.arange("3", device=device)
    with pytest.raises(TypeError, match="real numbers"):
        tp.arange(0, 5, None, device=device)
    with pytest.raises(ValueError, match="non-zero"):
        tp.arange(0, 3, 0, device=device)
    with pytest.raises(ValueError, match="cannot compute the length"):
        tp.arange(float("nan"), device=device)
    with pytest.raises(OverflowError, match="does not fit in int64"):
        tp.arange(0, float("inf"), device=device)
    with pytest.raises(OverflowError, match="does not fit in int64"):
        tp.arange(2**70, device=device)
    with pytest.raises(OverflowError, match="does not fit in int64"):
        tp.arange(2**70, 2**70 + 3, device=device)                   # three values beyond int64
    with pytest.raises(OverflowError, match="float64"):
        tp.arange(10**400, 10**400 + 3, dtype=tp.float32, device=device)
    with pytest.raises(TypeError, match="unknown dtype"):
        tp.arange(3, dtype="nope", device=device)


def test_operand_checks_come_before_host_data_is_uploaded(fake):
    x = fake.empty((3,), tp.int32, 0)
    with pytest.raises(TypeError, match="can't be cast"):
        x.add_([1.5, 2.5, 3.5])                  # a float result into an int tensor
    with pytest.raises(ValueError, match="cannot be broadcast"):
        x + [1.0, 2.0]
    with pytest.raises(ValueError, match="out has shape"):
        tp.add(x, [1, 2, 3], out=fake.empty((4,), tp.int32, 0))
    assert fake.launches == [] and fake.memcpys == []
    fake.capturing = True
    with pytest.raises(tp.cuda.CudaError, match="4800 bytes of host data"):
        fake.empty((1200,), tp.float64, 0) + [1.0] * 1200          # float32, as in PyTorch
    with pytest.raises(tp.cuda.CudaError, match="pageable memory"):
        fake.empty((600,), tp.float64, 0) + np.ones(600)
    assert fake.launches == []


# ------------------------------------------------------------------ host arrays inside a capture

def _pageable_calls(fake):
    """(name, call, whether other work comes first) for each way a CPU tensor
    or NumPy array in pageable memory reaches CUDA work; ops allocate their
    result before their operands travel, and an advanced setitem uploads
    its (literal) index before its values."""
    x = fake.empty((4, 3), tp.float32, 0)
    dst = fake.empty((3,), tp.float32, 0)
    cpu = tp.tensor([1.0, 2.0, 3.0])
    arr = np.array([1.0, 2.0, 3.0], np.float32)
    idx = np.array([0, 2])
    return [
        ("copy_ from a CPU tensor", lambda: dst.copy_(cpu), False),
        ("copy_ from an array", lambda: dst.copy_(arr), False),
        ("copy_ broadcasting an array", lambda: x.copy_(arr), False),
        ("copy_ of a cast", lambda: dst.copy_(arr.astype(np.float64)), False),
        ("non_blocking copy_", lambda: dst.copy_(cpu, non_blocking=True), False),
        ("to", lambda: cpu.to("cuda"), False),
        ("to with a cast", lambda: cpu.to("cuda", tp.float64), False),
        ("cuda", lambda: cpu.cuda(), False),
        ("tensor of a CPU tensor", lambda: tp.tensor(cpu, device="cuda"), False),
        ("tensor of an array", lambda: tp.tensor(arr, device="cuda"), True),
        ("as_tensor of an array", lambda: tp.as_tensor(arr, device="cuda"), False),
        ("an array operand", lambda: x + arr, True),
        ("where with an array condition", lambda: tp.where(np.array([True, False, True]), x, 0.0), True),
        ("an array index", lambda: x[idx], False),
        ("a CPU tensor index", lambda: x[tp.tensor([0, 2])], False),
        ("setitem at an array index", lambda: x.__setitem__(idx, 1.0), False),
        ("setitem of array values", lambda: x.__setitem__([0, 1], np.ones((2, 3), np.float32)), True),
        ("setitem of a slice from an array", lambda: x.__setitem__(slice(1, 2), arr), False),
    ]


def test_pageable_host_arrays_work_outside_a_capture(fake):
    for name, call, _ in _pageable_calls(fake):
        call()
    assert fake.pinned_copies == [] and fake.kept == []


def test_pageable_host_arrays_inside_a_capture_are_refused_before_any_gpu_work(fake):
    """Whatever their size: a graph cannot read pageable memory at replay,
    and copying today's values in would ignore later changes silently."""
    calls = _pageable_calls(fake)
    fake.capturing = True
    for name, call, work_first in calls:
        allocs, launches = len(fake.allocs), len(fake.launches)
        with pytest.raises(tp.cuda.CudaError) as info:
            call()
        err = info.value
        assert err.name == "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED", name
        msg = str(err)
        assert "pageable memory" in msg and "pin_memory()" in msg and "before the capture" in msg, (name, msg)
        if not work_first:
            assert (len(fake.allocs), len(fake.launches)) == (allocs, launches), name
    assert fake.memcpys == [] and fake.device_copies == [] and fake.pinned_copies == []
    assert [k[0] for k in fake.kernels()] == []  # at most the literal index's upload ran


def test_a_host_mask_inside_a_capture_is_refused_as_it_decides_the_shape(fake):
    x = fake.empty((4, 3), tp.float32, 0)
    fake.capturing = True
    for mask in (np.array([True, False, True, False]), tp.tensor([True, False, True, False]),
                 fake.pin(np.array([True, False, True, False]))):
        for call in (lambda: x[mask], lambda: x.__setitem__(mask, 1.0)):
            with pytest.raises(tp.cuda.CudaError, match="boolean mask in a CPU tensor or NumPy array") as info:
                call()
            assert info.value.name == "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED"
    assert fake.launches == [] and fake.pinned_copies == []


def test_literals_inside_a_capture_are_still_copied_into_the_graph(fake):
    x = fake.empty((4, 3), tp.float32, 0)
    dst = fake.empty((3,), tp.float32, 0)
    fake.capturing = True
    tp.tensor(3.0, device="cuda")
    tp.tensor([1, 2, 3], device="cuda")
    tp.tensor((1.5, 2.5), device="cuda")
    tp.tensor(np.float32(2.0), device="cuda")
    dst.copy_([1.0, 2.0, 3.0])
    dst.copy_((4, 5, 6))
    x.copy_([7.0, 8.0, 9.0])
    x + [1.0, 2.0, 3.0]
    x[[0, 2]]
    x[[1, 3]] = [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]
    x[[True, False, True, False]]
    tp.where([True, False, True], x, 0.0)
    n = len(fake.writes())
    x * np.float32(2.0)                          # NumPy scalars stay kernel arguments
    x + tp.tensor(2.0)                           # a 0-d CPU tensor is a scalar argument, as in PyTorch
    assert len(fake.writes()) == n
    assert fake.capture_checks == 0 and fake.memcpys == [] and fake.pinned_copies == [] and fake.kept == []
    data = [w[1] for w in fake.writes()]
    for want in (np.float32(3.0), np.array([1, 2, 3]), np.float32([1.5, 2.5]), np.float32([1, 2, 3]),
                 np.float32([4, 5, 6]), np.float32([7, 8, 9]), np.array([0, 2]), np.array([1, 3]),
                 np.float32([[1, 2, 3], [4, 5, 6]]), np.array([0, 2]), bytes([1, 0, 1])):
        assert (want if isinstance(want, bytes) else want.tobytes()) in data, want


def test_a_pinned_source_is_one_driver_copy_that_the_capture_keeps(fake):
    dst = fake.empty((4,), tp.float32, 0)
    a = np.arange(4, dtype=np.float32)
    p = fake.pin(a)
    dst.copy_(p)                                 # outside a capture: waits for the copy
    dst.copy_(p, non_blocking=True)
    assert fake.pinned_copies == [(dst.data_ptr(), a.ctypes.data, 16, True),
                                  (dst.data_ptr(), a.ctypes.data, 16, False)]
    assert fake.kept == [] and fake.writes() == [] and fake.launches == []
    fake.pinned_copies.clear()
    fake.capturing = True
    dst.copy_(p)
    dst.copy_(a)                                 # the NumPy array over the pinned memory: the same
    y = p.to("cuda")
    z = p.cuda(non_blocking=True)
    assert fake.pinned_copies == [(dst.data_ptr(), a.ctypes.data, 16, True), (dst.data_ptr(), a.ctypes.data, 16, True),
                                  (y.data_ptr(), a.ctypes.data, 16, True), (z.data_ptr(), a.ctypes.data, 16, False)]
    assert fake.kept == [("pinned", id(a))] * 4  # the graph keeps the pinned memory alive
    assert fake.writes() == [] and fake.launches == [] and fake.capture_checks == 0


def test_a_cuda_source_into_pinned_memory_is_one_driver_copy_that_the_capture_keeps(fake):
    """The copy a graph can make toward the host: every replay writes the
    pinned buffer (a host function queued after it may read it)."""
    src = fake.empty((4,), tp.float32, 0)
    a = np.zeros(4, np.float32)
    p = fake.pin(a)
    p.copy_(src)                                 # outside a capture: waits, then checks device errors
    p.copy_(src, non_blocking=True)
    assert fake.host_copies == [(a.ctypes.data, src.data_ptr(), 16, True),
                                (a.ctypes.data, src.data_ptr(), 16, False)]
    assert fake.error_checks == 1 and fake.kept == [] and fake.launches == []
    fake.host_copies.clear()
    fake.capturing = True
    p.copy_(src)
    assert fake.host_copies == [(a.ctypes.data, src.data_ptr(), 16, True)]
    assert fake.kept == [("pinned", id(a))] and fake.error_checks == 1
    assert fake.memcpys == [] and fake.pinned_copies == []


@pytest.mark.parametrize("case", ["cast", "broadcast", "strided"])
def test_a_cuda_source_of_another_layout_reaches_pinned_memory_through_a_temporary(fake, case):
    """Cast, broadcast and laid out on the device first, then one copy of
    the destination's bytes."""
    a = np.zeros(8, np.float32)
    p = fake.pin(a)
    src = fake.empty((8,) if case != "broadcast" else (1,), tp.int32 if case == "cast" else tp.float32, 0)
    if case == "strided":
        src = fake.empty((16,), tp.float32, 0)[::2]
    fake.capturing = True
    p.copy_(src)
    (dst, tmp, nbytes, blocking), = fake.host_copies
    assert (dst, nbytes, blocking) == (a.ctypes.data, 32, True)
    assert fake.allocs[-1] == (8,)
    assert _copy_kernel_pointers(fake)[0] == tmp
    assert fake.kept == [("pinned", id(a))]


def test_cuda_values_into_pageable_memory_inside_a_capture_are_refused(fake):
    src = fake.empty((4,), tp.float32, 0)
    fake.capturing = True
    for call in (lambda: tp.from_numpy(np.zeros(4, np.float32)).copy_(src), src.numpy, src.cpu, src[:1].item,
                 src.tolist):
        with pytest.raises(tp.cuda.CudaError, match="pinned memory") as info:
            call()
        assert info.value.name == "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED"
    assert fake.host_copies == [] and fake.kept == []


def _copy_kernel_pointers(fake):
    (key, _, _, params), = fake.launches
    assert key[0] == "copy"
    return struct.unpack_from("<QQ", params)


@pytest.mark.parametrize("case", ["cast", "broadcast", "strided", "reversed", "tensor with dtype"])
def test_a_pinned_source_of_another_layout_goes_through_a_temporary(fake, case):
    """The bytes the source spans are copied from the host buffer into a
    temporary, which the copy kernel then reads with the source's strides."""
    base = np.arange(8, dtype=np.int32 if case in ("cast", "tensor with dtype") else np.float32)
    p = fake.pin(base)
    fake.capturing = True
    first = base.ctypes.data
    if case == "cast":
        dst = fake.empty((8,), tp.float32, 0)
        dst.copy_(p)
        span, offset = 32, 0
    elif case == "broadcast":
        dst = fake.empty((3, 8), tp.float32, 0)
        dst.copy_(p)
        span, offset = 32, 0
    elif case == "strided":
        dst = fake.empty((4,), tp.float32, 0)
        dst.copy_(p[::2])
        span, offset = 28, 0                     # elements 0, 2, 4, 6: 7 elements' bytes
    elif case == "reversed":
        dst = fake.empty((8,), tp.float32, 0)
        dst.copy_(tp.from_numpy(base[::-1]))     # a negative stride: the span starts at the last element
        span, offset = 32, 28
    else:
        dst = tp.tensor(base, dtype=tp.float64, device="cuda")
        span, offset = 32, 0
    (tmp, src, nbytes, blocking), = fake.pinned_copies
    assert (src, nbytes, blocking) == (first, span, True)
    assert fake.allocs[-1] == span
    assert _copy_kernel_pointers(fake) == (dst.data_ptr(), tmp + offset)
    assert fake.kept == [("pinned", id(base))] and fake.writes() == []


def test_pinned_operands_and_indices_are_read_from_their_memory(fake):
    x = fake.empty((4, 3), tp.float32, 0)
    row = np.array([1.0, 2.0, 3.0], np.float32)
    idx = np.array([3, 0], np.int64)
    fake.pin(row)
    fake.pin(idx)
    fake.capturing = True
    x + row
    x[tp.from_numpy(idx)]
    x[tp.from_numpy(idx)] = 0.0
    assert [(src, n) for _, src, n, _ in fake.pinned_copies] == [(row.ctypes.data, 12), (idx.ctypes.data, 16),
                                                                 (idx.ctypes.data, 16)]
    assert fake.writes() == [] and len(fake.kept) == 3


def test_pin_memory_with_a_cuda_device_or_tensor_is_refused(fake):
    for make in (lambda: tp.empty(3, device="cuda", pin_memory=True), lambda: tp.tensor([1], device="cuda",
                                                                                          pin_memory=True),
                 lambda: tp.zeros_like(fake.empty((2,), tp.float32, 0), pin_memory=True),
                 lambda: tp.arange(3, device="cuda", pin_memory=True)):
        with pytest.raises(RuntimeError, match="pin_memory=True makes a CPU tensor"):
            make()
    cuda = fake.empty((2,), tp.float32, 0)
    with pytest.raises(RuntimeError, match="cannot pin a CUDA tensor"):
        cuda.pin_memory()
    assert not cuda.is_pinned()
    assert fake.pin(np.ones(2)).is_pinned() and fake.pin(np.ones(2)).pin_memory().is_pinned()
    p = fake.pin(np.ones(3))
    assert p.pin_memory() is p                   # already pinned: itself, as PyTorch
