# SPDX-License-Identifier: Apache-2.0
"""rebind_and_launch: replays reading and writing other tensors than the
captured ones, by patching kernel-node arguments (GPU)."""

import gc
import weakref

import numpy as np
import pytest

import tensorplay as tp
from tensorplay._testing import rebind_patch_calls
from tensorplay.cuda import CUDAGraph

pytestmark = pytest.mark.cuda

N = 1 << 18          # 1 MiB of float32


def _cuda(a):
    return tp.tensor(np.ascontiguousarray(a), device="cuda")


def _affine_graph(n=N):
    """y = x * 2 + 1, captured on static x and y."""
    x = tp.zeros(n, device="cuda")
    y = tp.zeros(n, device="cuda")
    (x * 2.0 + 1.0)
    tp.cuda.synchronize()
    g = CUDAGraph()
    with tp.cuda.graph(g):
        tp.add(x * 2.0, 1.0, out=y)       # (y.copy_ would be a memcpy node: y copied, not rebound)
    return g, x, y


def test_rebinding_reads_and_writes_the_new_tensors_without_touching_the_statics(rng):
    g, x, y = _affine_graph()
    assert g.rebindable([x], [y]) == [True, True]
    for _ in range(3):
        a = rng.standard_normal(N).astype(np.float32)
        xin, out = _cuda(a), tp.empty(N, device="cuda")
        g.rebind_and_launch([x], [xin], [y], [out])
        np.testing.assert_allclose(out.numpy(), a * 2 + 1, rtol=1e-6)
        assert not x.numpy().any() and not y.numpy().any()      # the statics were never used


def test_same_tensors_patch_nothing_and_other_tensors_patch_each_call(rng):
    g, x, y = _affine_graph()
    sets = [(_cuda(rng.standard_normal(N).astype(np.float32)), tp.empty(N, device="cuda")) for _ in range(2)]
    g.rebind_and_launch([x], [sets[0][0]], [y], [sets[0][1]])
    calls = rebind_patch_calls(g)
    assert calls > 0
    g.rebind_and_launch([x], [sets[0][0]], [y], [sets[0][1]])
    assert rebind_patch_calls(g) == calls                        # nothing changed: no SetParams
    for i in range(4):
        xin, out = sets[i % 2]
        g.rebind_and_launch([x], [xin], [y], [out])
    assert rebind_patch_calls(g) > calls
    for xin, out in sets:
        np.testing.assert_allclose(out.numpy(), xin.numpy() * 2 + 1, rtol=1e-6)


def test_replay_and_stage_and_launch_after_rebinding_use_the_statics(rng):
    g, x, y = _affine_graph()
    xin, out = _cuda(np.full(N, 3.0, np.float32)), tp.empty(N, device="cuda")
    g.rebind_and_launch([x], [xin], [y], [out])
    x.fill_(5.0)
    g.replay()
    assert np.all(y.numpy() == 11.0) and np.all(out.numpy() == 7.0)
    g.rebind_and_launch([x], [xin], [y], [out])
    g.stage_and_launch([x], [tp.full((N,), 2.0, device="cuda")])
    assert np.all(y.numpy() == 5.0) and np.all(out.numpy() == 7.0)
    g.rebind_and_launch([x], [_cuda(np.ones(N, np.float32))], [y], [out])
    assert np.all(out.numpy() == 3.0) and np.all(y.numpy() == 5.0)


def test_a_view_of_a_static_input_is_rebound_at_the_same_offset(rng):
    x = tp.zeros(1024, device="cuda")
    y = tp.zeros(1000, device="cuda")
    tp.cuda.synchronize()
    g = CUDAGraph()
    with tp.cuda.graph(g):
        tp.add(x[24:], x[:1000], out=y)
    a = rng.standard_normal(1024).astype(np.float32)
    out = tp.empty(1000, device="cuda")
    g.rebind_and_launch([x], [_cuda(a)], [y], [out])
    np.testing.assert_allclose(out.numpy(), a[24:] + a[:1000], rtol=1e-6)


def test_a_long_chain_of_nodes_is_rebound_everywhere(rng):
    x = tp.zeros(N, device="cuda")
    y = tp.zeros(N, device="cuda")
    (x + 1.0)
    tp.cuda.synchronize()
    g = CUDAGraph()
    with tp.cuda.graph(g):
        tp.mul(x, 1.0, out=y)
        for k in range(300):
            y.add_(x * 0.001)
    assert g.num_nodes >= 300
    a = rng.standard_normal(N).astype(np.float32)
    out = tp.empty(N, device="cuda")
    g.rebind_and_launch([x], [_cuda(a)], [y], [out])
    np.testing.assert_allclose(out.numpy(), a * 1.3, rtol=1e-4, atol=1e-5)


def test_inputs_a_foreign_kernel_reads_are_copied_and_the_rest_rebound(rng):
    n = 256
    x = tp.zeros((n, n), device="cuda")
    w = tp.zeros((n, n), device="cuda")
    b = tp.zeros(n, device="cuda")
    y = tp.zeros((n, n), device="cuda")
    ((x * 2.0) @ w + b)
    tp.cuda.synchronize()
    g = CUDAGraph()
    with tp.cuda.graph(g):
        tp.add((x * 2.0) @ w, b, out=y)
    # x is read by our kernel only, w by cuBLAS, b by ours, y written by ours
    assert g.rebindable([x, w, b], [y]) == [True, False, True, True]
    for _ in range(2):
        xa, wa, ba = (rng.standard_normal(s).astype(np.float32) for s in ((n, n), (n, n), n))
        out = tp.empty((n, n), device="cuda")
        g.rebind_and_launch([x, w, b], [_cuda(xa), _cuda(wa), _cuda(ba)], [y], [out])
        np.testing.assert_allclose(out.numpy(), (xa * 2) @ wa + ba, rtol=1e-3, atol=1e-3)
        np.testing.assert_array_equal(w.numpy(), wa)               # w went through its static


def test_an_output_written_by_a_cublas_node_is_copied_out(rng):
    n = 128
    a_s, b_s, y = (tp.zeros((n, n), device="cuda") for _ in range(3))
    (a_s @ b_s)
    tp.cuda.synchronize()
    g = CUDAGraph()
    with tp.cuda.graph(g):
        tp.matmul(a_s, b_s, out=y)
    assert g.rebindable([a_s, b_s], [y]) == [False, False, False]
    aa, ba = rng.standard_normal((n, n)).astype(np.float32), rng.standard_normal((n, n)).astype(np.float32)
    out = tp.empty((n, n), device="cuda")
    g.rebind_and_launch([a_s, b_s], [_cuda(aa), _cuda(ba)], [y], [out])
    np.testing.assert_allclose(out.numpy(), aa @ ba, rtol=1e-3, atol=1e-3)


def test_an_output_cleared_by_a_memset_node_is_copied_out(rng):
    x = tp.zeros(N, device="cuda")
    y = tp.zeros(N, device="cuda")
    (x + 1.0)
    tp.cuda.synchronize()
    g = CUDAGraph()
    with tp.cuda.graph(g):
        y.zero_()                       # cuMemsetD8Async: a memset node
        y.add_(x)
    assert g.rebindable([x], [y]) == [True, False]
    a = rng.standard_normal(N).astype(np.float32)
    out = tp.full((N,), 9.0, device="cuda")
    g.rebind_and_launch([x], [_cuda(a)], [y], [out])
    np.testing.assert_array_equal(out.numpy(), a)


def _while_graph():
    """while flag: y += x; i += 1; flag = i < 3 (three iterations)."""
    x = tp.zeros(N, device="cuda")
    y = tp.zeros(N, device="cuda")
    i = tp.zeros(1, dtype=tp.int32, device="cuda")
    flag = tp.ones(1, dtype=tp.bool, device="cuda")
    tp.cuda.synchronize()
    g = CUDAGraph()
    with tp.cuda.graph(g):
        y.zero_()
        i.zero_()
        flag.fill_(True)
        with g.while_(flag):
            y.add_(x)
            i.add_(1)
            tp.lt(i, 3, out=flag)
    return g, x, y


def test_rebinding_inside_conditional_bodies(rng):
    g, x, y = _while_graph()
    a = rng.standard_normal(N).astype(np.float32)
    out = tp.empty(N, device="cuda")
    g.rebind_and_launch([x], [_cuda(a)], [y], [out])
    np.testing.assert_allclose(out.numpy(), a * 3, rtol=1e-5)
    # x is read only inside the body, by our kernel; y is also cleared by a memset node
    assert g.rebindable([x], [y]) == [True, False]


def _if_else_graph(scales=(2.0,)):
    """y = x * scale if pred else -x, captured once per scale into one graph
    (a re-capture after the first); returns g, x, y, pred."""
    x = tp.zeros(N, device="cuda")
    y = tp.zeros(N, device="cuda")
    pred = tp.ones(1, dtype=tp.bool, device="cuda")
    (x * 2.0)
    tp.cuda.synchronize()
    g = CUDAGraph()
    for scale in scales:
        with tp.cuda.graph(g):
            with g.if_else(pred) as (then, otherwise):
                with then:
                    tp.mul(x, scale, out=y)
                with otherwise:
                    tp.mul(x, -1.0, out=y)
    return g, x, y, pred


def _check_if_else_rebinding(g, x, y, pred, scale, rng):
    """Both branches, rebound onto a new input and output, give the values."""
    a = rng.standard_normal(N).astype(np.float32)
    xin, out = _cuda(a), tp.empty(N, device="cuda")
    for p, expect in ((True, a * scale), (False, -a)):
        pred.fill_(p)
        g.rebind_and_launch([x], [xin], [y], [out])
        np.testing.assert_allclose(out.numpy(), expect, rtol=1e-6)


def test_rebinding_inside_if_else_bodies(rng):
    g, x, y, pred = _if_else_graph()
    _check_if_else_rebinding(g, x, y, pred, 2.0, rng)
    assert g.rebindable([x], [y]) == [True, True]
    assert not y.numpy().any()          # both bodies wrote the caller's tensor


def test_rebound_tensors_live_until_the_next_rebinding():
    g, x, y = _affine_graph()
    xin = tp.ones(N, device="cuda")
    ref = weakref.ref(xin)
    out = tp.empty(N, device="cuda")
    g.rebind_and_launch([x], [xin], [y], [out])
    del xin
    gc.collect()
    assert ref() is not None
    g.rebind_and_launch([x], [tp.zeros(N, device="cuda")], [y], [out])
    gc.collect()
    assert ref() is None
    tp.cuda.synchronize()
    assert np.all(out.numpy() == 1.0)


def test_large_inputs_rebind(rng):
    n = 16 << 20                          # 64 MiB of float32
    g, x, y = _affine_graph(n)
    a = rng.standard_normal(n).astype(np.float32)
    out = tp.empty(n, device="cuda")
    g.rebind_and_launch([x], [_cuda(a)], [y], [out])
    np.testing.assert_allclose(out.numpy()[::4099], (a * 2 + 1)[::4099], rtol=1e-6)


def test_recapture_then_rebind(rng):
    g, x, y = _affine_graph()
    out = tp.empty(N, device="cuda")
    g.rebind_and_launch([x], [tp.ones(N, device="cuda")], [y], [out])
    with tp.cuda.graph(g):
        tp.mul(x, 3.0, out=y)
    x.fill_(1.0)
    g.replay()
    assert np.all(y.numpy() == 3.0)
    g.rebind_and_launch([x], [tp.full((N,), 2.0, device="cuda")], [y], [out])
    assert np.all(out.numpy() == 6.0) and np.all(y.numpy() == 3.0)


def test_bad_arguments_raise_before_any_launch():
    g, x, y = _affine_graph()
    out = tp.empty(N, device="cuda")
    with pytest.raises(ValueError, match="shape"):
        g.rebind_and_launch([x], [tp.zeros(N - 1, device="cuda")], [y], [out])
    with pytest.raises(ValueError, match="float64"):
        g.rebind_and_launch([x], [tp.zeros(N, dtype=tp.float64, device="cuda")], [y], [out])
    with pytest.raises(ValueError, match="strides"):
        g.rebind_and_launch([x], [tp.zeros(2 * N, device="cuda")[::2]], [y], [out])
    with pytest.raises(ValueError, match="cuda:0"):
        g.rebind_and_launch([x], [tp.zeros(N)], [y], [out])
    with pytest.raises(TypeError, match="not a tensor"):
        g.rebind_and_launch([x], [np.zeros(N, np.float32)], [y], [out])
    with pytest.raises(ValueError, match="1 static inputs"):
        g.rebind_and_launch([x], [], [y], [out])
    with pytest.raises(TypeError, match="lists or tuples"):
        g.rebind_and_launch([x], [x], [y], out)
    with pytest.raises(ValueError, match="overlap"):
        g.rebind_and_launch([x, x[1:]], [x, x[1:]])
    with pytest.raises(RuntimeError, match="nothing to replay"):
        CUDAGraph().rebind_and_launch([x], [x])
    g.rebind_and_launch([x], [tp.full((N,), 4.0, device="cuda")], [y], [out])   # still usable
    assert np.all(out.numpy() == 9.0)


def test_errors_name_the_method_called():
    g, x, y = _affine_graph()
    for method in (g.rebindable, g.rebind_and_launch):
        name = method.__name__
        args = ([x], [x]) if name == "rebind_and_launch" else ([x],)
        with pytest.raises(TypeError, match=f"^{name}: static_outputs must be a list or tuple of tensors"):
            method(*args, y)
        with pytest.raises(ValueError, match=rf"^{name}: static_inputs\[0\] must live on cuda:0"):
            method([tp.zeros(N)], *args[1:])
        with pytest.raises(ValueError, match=f"^{name}: static tensors 0 and 1 overlap"):
            method([x, x[1:]], *([[x, x[1:]]] if name == "rebind_and_launch" else []))
    with pytest.raises(TypeError, match="^rebindable: static_inputs"):
        g.describe([3])


def test_a_less_aligned_replacement_is_copied_for_that_call(rng):
    g, x, y = _affine_graph()
    a = rng.standard_normal(N).astype(np.float32)
    buf = tp.zeros(N + 1, device="cuda")
    buf[1:].copy_(_cuda(a))
    out = tp.empty(N, device="cuda")
    g.rebind_and_launch([x], [buf[1:]], [y], [out])       # 4 bytes past a 512-byte boundary
    np.testing.assert_allclose(out.numpy(), a * 2 + 1, rtol=1e-6)
    g.rebind_and_launch([x], [_cuda(a)], [y], [out])
    np.testing.assert_allclose(out.numpy(), a * 2 + 1, rtol=1e-6)


def test_a_static_that_is_a_view_of_a_larger_tensor_is_copied():
    buf = tp.zeros(2 * N, device="cuda")
    x = tp.zeros(N, device="cuda")
    y = buf[:N]
    (x + 1.0)
    tp.cuda.synchronize()
    g = CUDAGraph()
    with tp.cuda.graph(g):
        tp.add(x, 1.0, out=y)
        buf.add_(1.0)                   # reaches y's bytes and beyond through y's address
    assert g.rebindable([x], [y]) == [True, False]
    out = tp.zeros(N, device="cuda")
    g.rebind_and_launch([x], [tp.ones(N, device="cuda")], [y], [out])
    assert np.all(out.numpy() == 3.0)


def test_overlapping_replacements_raise():
    g, x, y = _affine_graph()
    t = tp.zeros(N, device="cuda")
    with pytest.raises(ValueError, match="overlap"):
        g.rebind_and_launch([x], [t], [y], [t])
    out = tp.empty(N, device="cuda")
    g.rebind_and_launch([x], [tp.ones(N, device="cuda")], [y], [out])
    assert np.all(out.numpy() == 3.0)


def test_recapture_updated_in_place_stays_rebindable():
    # the executable's nodes are the first capture's graph's: patches after
    # one update and after another must reach them
    g, x, y = _affine_graph()
    out = tp.empty(N, device="cuda")
    g.rebind_and_launch([x], [tp.ones(N, device="cuda")], [y], [out])
    for scale in (5.0, 7.0):
        with tp.cuda.graph(g):
            tp.add(x * scale, 1.0, out=y)    # the same topology: cuGraphExecUpdate
        assert g.update_result == "success"
        assert g.rebindable([x], [y]) == [True, True]
        x.fill_(0.0)
        y.fill_(-1.0)
        other = tp.full((N,), 2.0, device="cuda")
        g.rebind_and_launch([x], [other], [y], [out])
        assert rebind_patch_calls(g) > 0
        assert np.all(out.numpy() == 2.0 * scale + 1.0)
        assert np.all(y.numpy() == -1.0)     # written through the patched pointer, not copied
        g.replay()                           # and back on the statics
        assert np.all(y.numpy() == 1.0)


def test_conditional_bodies_after_an_in_place_update_are_copied_and_correct(rng):
    # the executable's bodies are the first capture's, which the driver does
    # not show: their tensors fall back to the copy path, still correct
    g, x, y, pred = _if_else_graph((2.0, 3.0))
    updated = g.update_result == "success"      # (a driver may refuse to update conditional nodes)
    assert g.rebindable([x], [y]) == [not updated, not updated]
    _check_if_else_rebinding(g, x, y, pred, 3.0, rng)


def test_describe_says_which_static_tensors_are_rebindable():
    g, x, y = _affine_graph()
    d = g.describe([x], [y])
    assert d["rebindable"] == {"inputs": [True], "outputs": [True]}
    assert [n["kind"] for n in d["nodes"]].count("kernel") >= 1
    assert "rebindable" not in g.describe()
    # an output a memcpy node writes (contiguous copy_) is copied, not rebound
    z = tp.zeros(N, device="cuda")
    h = CUDAGraph()
    with tp.cuda.graph(h):
        z.copy_(x * 3.0)
    assert h.describe([x], [z])["rebindable"] == {"inputs": [True], "outputs": [False]}
