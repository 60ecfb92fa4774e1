# SPDX-License-Identifier: Apache-2.0
"""CUDA tensors: creation, copies across device pairs, casts, layouts, views."""

import itertools

import numpy as np
import pytest

import tensorplay as tp
from helpers import ALL_DTYPES, random_array

pytestmark = pytest.mark.cuda


def _np(d):
    return d.numpy_dtype


@pytest.mark.parametrize("d", ALL_DTYPES)
def test_creation_matches_numpy(d, rng):
    assert np.array_equal(tp.zeros(3, 5, dtype=d, device="cuda").numpy(), np.zeros((3, 5), _np(d)))
    assert np.array_equal(tp.ones(7, dtype=d, device="cuda").numpy(), np.ones(7, _np(d)))
    v = True if d is tp.bool else 3
    assert np.array_equal(tp.full((2, 3), v, dtype=d, device="cuda").numpy(), np.full((2, 3), v, _np(d)))
    a = random_array((4, 6), d, rng)
    t = tp.tensor(a, device="cuda")
    assert t.dtype is d and t.is_cuda and t.shape == (4, 6) and t.strides == (6, 1)
    assert np.array_equal(t.numpy(), a)
    assert np.array_equal(tp.zeros_like(t).numpy(), np.zeros_like(a))
    assert np.array_equal(tp.ones_like(t).numpy(), np.ones_like(a))
    assert tp.empty_like(t).shape == (4, 6)


def test_full_values_are_exact():
    big = (1 << 62) + 12345
    assert tp.full((2,), big, device="cuda").tolist() == [big, big]
    assert tp.full((1,), -1, dtype=tp.uint8, device="cuda").tolist() == [255]
    assert tp.full((1,), 0.1, dtype=tp.float64, device="cuda").item() == 0.1
    assert tp.full((1,), float("nan"), device="cuda").numpy()[0] != tp.full((1,), float("nan"), device="cuda").numpy()[0]
    assert tp.full((2,), 2.5, dtype=tp.bool, device="cuda").tolist() == [True, True]
    with pytest.raises(OverflowError):
        tp.full((1,), 1 << 70, dtype=tp.int64, device="cuda")
    with pytest.raises(OverflowError, match="does not fit int32"):
        tp.full((1,), float("inf"), dtype=tp.int32, device="cuda")


def test_arange_and_tensor_on_cuda():
    assert tp.arange(10, device="cuda").tolist() == list(range(10))
    assert np.allclose(tp.arange(0, 1, 0.1, device="cuda").numpy(), np.arange(0, 1, 0.1, dtype=np.float32))
    assert tp.tensor(3.5, device="cuda").item() == 3.5
    assert tp.tensor([[True, False]], device="cuda").tolist() == [[True, False]]


@pytest.mark.parametrize("src_dt,dst_dt", list(itertools.product(ALL_DTYPES, ALL_DTYPES)))
def test_device_copy_casts_like_numpy(src_dt, dst_dt, rng):
    a = random_array((33, 17), src_dt, rng, 0, 100)
    src = tp.tensor(a, device="cuda")
    expected = a.astype(_np(dst_dt))
    dst = tp.empty(33, 17, dtype=dst_dt, device="cuda")
    dst.copy_(src)                                   # contiguous, kernel cast (or memcpy)
    assert np.array_equal(dst.numpy(), expected)
    dst_t = tp.empty(17, 33, dtype=dst_dt, device="cuda").T
    dst_t.copy_(src.T.T)                             # strided destination
    assert np.array_equal(dst_t.numpy(), expected)
    host = tp.empty(33, 17, dtype=dst_dt)
    host.copy_(src)                                  # D2H with cast
    assert np.array_equal(host.numpy(), expected)
    dev = tp.empty(33, 17, dtype=dst_dt, device="cuda")
    dev.copy_(tp.from_numpy(a))                      # H2D with cast
    assert np.array_equal(dev.numpy(), expected)


LAYOUTS = [
    ("contiguous", lambda x: x),
    ("transposed", lambda x: x.T),
    ("sliced", lambda x: x[1:, ::2]),
    ("negative step", lambda x: x[::-1, 3:0:-1]),
    ("broadcast row", lambda x: x[:1].expand(x.shape[0], x.shape[1])),
    ("inserted dims", lambda x: x[:, None, :, None][2:5]),
]


@pytest.mark.parametrize("name,layout", LAYOUTS)
@pytest.mark.parametrize("d", [tp.float32, tp.float16, tp.int64, tp.bool, tp.bfloat16])
def test_layouts_match_numpy_on_every_device_pair(name, layout, d, rng):
    a = random_array((8, 12), d, rng)
    ref = np.ascontiguousarray(_apply_np(name, a))
    for src_dev, dst_dev in [("cuda", "cuda"), ("cpu", "cuda"), ("cuda", "cpu")]:
        src = layout(tp.tensor(a, device=src_dev))
        assert src.shape == ref.shape
        assert np.array_equal(src.numpy(), ref), (name, src_dev)
        dst = tp.zeros(*ref.shape, dtype=d, device=dst_dev)
        dst.copy_(src)
        assert np.array_equal(dst.numpy(), ref), (name, src_dev, dst_dev)
        # a strided destination too
        big = tp.zeros(ref.shape[0] * 2, *ref.shape[1:], dtype=d, device=dst_dev)
        big[::2].copy_(src)
        assert np.array_equal(big.numpy()[::2], ref)
        assert not big.numpy()[1::2].any()


def _apply_np(name, a):
    return {
        "contiguous": a, "transposed": a.T, "sliced": a[1:, ::2], "negative step": a[::-1, 3:0:-1],
        "broadcast row": np.broadcast_to(a[:1], a.shape),
        "inserted dims": a[:, None, :, None][2:5],
    }[name]


def test_copy_broadcasts_and_validates():
    dst = tp.zeros(4, 3, device="cuda")
    dst.copy_(tp.tensor([1.0, 2.0, 3.0], device="cuda"))
    assert dst.tolist() == [[1, 2, 3]] * 4
    dst.copy_(np.array([[5.0], [6], [7], [8]]))
    assert dst.numpy()[:, 2].tolist() == [5, 6, 7, 8]
    dst.copy_(2.5)
    assert dst.tolist() == [[2.5] * 3] * 4
    with pytest.raises(ValueError, match="broadcast"):
        dst.copy_(tp.zeros(5, device="cuda"))
    with pytest.raises(ValueError, match="broadcast"):
        tp.zeros(3, device="cuda").copy_(tp.zeros(4, 3, device="cuda"))
    assert dst.tolist() == [[2.5] * 3] * 4      # failed copies changed nothing


def test_overlapping_copy_is_correct():
    x = tp.arange(10, device="cuda")
    x[1:].copy_(x[:-1])
    assert x.tolist() == [0, 0, 1, 2, 3, 4, 5, 6, 7, 8]
    y = tp.arange(6, device="cuda").view(2, 3)
    y.copy_(y[::-1])
    assert y.tolist() == [[3, 4, 5], [0, 1, 2]]


def test_setitem_and_views_share_storage():
    x = tp.zeros(4, 5, device="cuda")
    x[1] = 3
    x[:, 4] = tp.tensor([1.0, 2, 3, 4], device="cuda")
    x[2:, :2] = np.array([[7.0, 8.0]])
    ref = np.zeros((4, 5), np.float32)
    ref[1] = 3
    ref[:, 4] = [1, 2, 3, 4]
    ref[2:, :2] = [7, 8]
    assert np.array_equal(x.numpy(), ref)
    v = x.view(20)
    v[0] = 42
    assert x[0, 0].item() == 42
    assert v.storage_offset() == 0 and x[1, 2].storage_offset() == 7
    del x
    assert v[0].item() == 42                     # the view keeps the storage alive


def test_movement_methods():
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    c = tp.tensor(a).cuda()
    assert c.device == "cuda:0" and c.cuda() is c
    assert c.to("cuda") is c and c.to(tp.float32) is c
    assert c.to("cuda", copy=True) is not c
    h = c.to(tp.float16)
    assert h.dtype is tp.float16 and h.is_cuda and np.array_equal(h.numpy(), a.astype(np.float16))
    back = c.cpu()
    assert back.is_cpu and np.array_equal(back.numpy(), a)
    both = tp.tensor(a).to("cuda:0", tp.int32)
    assert both.dtype is tp.int32 and both.is_cuda
    like = tp.zeros(2, dtype=tp.int8).to(c)
    assert like.dtype is tp.float32 and like.is_cuda
    assert c[2, 3].item() == 11.0 and isinstance(c[2, 3].item(), float)
    assert c.tolist() == a.tolist()
    cl = c.clone()
    cl[0, 0] = -1
    assert c[0, 0].item() == 0 and cl.data_ptr() != c.data_ptr()
    t = c.T
    assert not t.is_contiguous() and t.contiguous().is_contiguous()
    assert np.array_equal(t.contiguous().numpy(), a.T)
    assert c.contiguous() is c
    with pytest.raises(TypeError, match="implicitly"):
        np.asarray(c)
    assert "device='cuda:0'" in repr(c)


def test_item_and_bool_sync_on_current_stream():
    s = tp.cuda.Stream()
    with tp.cuda.stream(s):
        x = tp.full((1,), 5, device="cuda")
        assert x.item() == 5 and bool(x) is True
        assert int(x) == 5 and float(x) == 5.0


def test_mixed_validation_errors_leave_tensors_intact():
    x = tp.ones(3, device="cuda")
    with pytest.raises(TypeError):
        x.fill_("a")
    with pytest.raises(TypeError):
        x.copy_(object())
    with pytest.raises(ValueError):
        x.view(4)
    with pytest.raises(TypeError):
        x.record_stream("stream")
    assert x.tolist() == [1.0, 1.0, 1.0]
