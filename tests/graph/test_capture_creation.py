# SPDX-License-Identifier: Apache-2.0
"""Creation ops and small host data inside CUDA graph captures (GPU).

Each case runs eagerly first (kernels compile and load), is captured, its
outputs are overwritten, and the graph is replayed: the replay alone must
write the right values, which are compared with NumPy and with the eager
run. Literals (Python numbers, lists, tuples, NumPy scalars) used in a
capture are copied into the graph: they are deleted or changed before the
replays. CPU tensors and NumPy arrays are host memory the caller may change:
tests/graph/test_capture_pinned.py has what a capture does with them.
"""

import gc

import numpy as np
import pytest

import tensorplay as tp
from helpers import ALL_DTYPES, random_array
from tensorplay._kernels.param_upload import PARAM_UPLOAD_CAPACITIES, PARAM_UPLOAD_MAX_BYTES
from tensorplay.cuda import CUDAGraph

pytestmark = pytest.mark.cuda


def _overwrite(outputs, k):
    """Fill the graph's outputs with a value the replay must replace (two
    different ones on two replays, so no expected value can match both)."""
    for t in outputs:
        if t.numel():
            t.fill_((k % 2 == 0) if t.dtype is tp.bool else -7 - 90 * k)


def _replayed(fn):
    """(eager results, graph, captured outputs) of ``fn() -> tuple of tensors``."""
    eager = [t.numpy().copy() for t in fn()]         # also warms up: kernels compile and load here
    tp.cuda.synchronize()
    g = CUDAGraph()
    with tp.cuda.graph(g):
        outs = fn()
    return eager, g, outs


def _check_replays(g, outs, expected, compare):
    for k in range(2):
        _overwrite(outs, k)
        tp.cuda.synchronize()
        g.replay()
        tp.cuda.synchronize()
        for t, want in zip(outs, expected):
            compare(t.numpy(), want)


def _exact(got, want):
    assert got.shape == want.shape and got.dtype == want.dtype
    assert got.tobytes() == want.tobytes(), (got, want)


def _np_arange(start, end, step, d):
    with np.errstate(over="ignore"):
        return np.arange(start, end, step, dtype=np.float64 if d.kind == "f" else np.int64).astype(d.numpy_dtype)


# ------------------------------------------------------------------ creation ops

ARANGE_CASES = [(0, 10, 1), (10, -7, -3), (0.1, 3.3, 0.2), (2.5, -1.0, -0.25), (-0.5, 5, 1.5),
                (1e6, 1e6 + 30, 0.7), (-5, 300, 7)]


@pytest.mark.parametrize("d", ALL_DTYPES)
def test_arange_inside_a_capture_is_numpys_bit_for_bit(d):
    def fn():
        return tuple(tp.arange(s, e, st, dtype=d, device="cuda") for s, e, st in ARANGE_CASES)
    eager, g, outs = _replayed(fn)
    want = [_np_arange(s, e, st, d) for s, e, st in ARANGE_CASES]
    for got, w in zip(eager, want):
        _exact(got, w)                               # outside a capture: the same values
    _check_replays(g, outs, want, _exact)


@pytest.mark.parametrize("d", [tp.float32, tp.float16, tp.int16, tp.int64, tp.uint8])
def test_long_arange_takes_the_vector_path_and_stays_exact(d):
    """A million elements: full tiles through 128-bit stores, a partial tail."""
    cases = [(0, (1 << 20) + 37, 1), (3, 3 + 3 * ((1 << 20) + 5), 3), (0.0, 1e5, 0.0937)]

    def fn():
        return tuple(tp.arange(s, e, st, dtype=d, device="cuda") for s, e, st in cases)
    eager, g, outs = _replayed(fn)
    want = [_np_arange(s, e, st, d) for s, e, st in cases]
    for got, w in zip(eager, want):
        _exact(got, w)
    _check_replays(g, outs, want, _exact)


def test_default_arange_dtypes_on_cuda():
    assert tp.arange(5, device="cuda").dtype is tp.int64
    assert tp.arange(0, 1, 0.25, device="cuda").tolist() == [0.0, 0.25, 0.5, 0.75]
    assert tp.arange(0.1, 1.0, 0.2, device="cuda").dtype is tp.float32
    assert tp.arange(3, 3, device="cuda").shape == (0,)


@pytest.mark.parametrize("d", ALL_DTYPES)
def test_every_creation_op_and_like_form_inside_a_capture(d):
    base = tp.ones(3, 4, device="cuda")               # made before the capture
    cpu_base = tp.ones(2, 5)

    def fn():
        return (tp.zeros(2, 3, dtype=d, device="cuda"), tp.ones(5, dtype=d, device="cuda"),
                tp.full((3, 5), 2.5, dtype=d, device="cuda"), tp.eye(5, 7, dtype=d, device="cuda"),
                tp.linspace(0, 3, 17, dtype=d, device="cuda"),
                tp.zeros_like(base, dtype=d), tp.ones_like(base, dtype=d), tp.full_like(base, 3, dtype=d),
                tp.zeros_like(cpu_base, dtype=d, device="cuda"), tp.ones_like(cpu_base, dtype=d, device="cuda"),
                tp.full_like(cpu_base, 1, dtype=d, device="cuda"))
    eager, g, outs = _replayed(fn)
    nd = d.numpy_dtype
    want = [np.zeros((2, 3), nd), np.ones(5, nd), np.full((3, 5), 2.5).astype(nd), np.eye(5, 7).astype(nd),
            np.linspace(0, 3, 17).astype(nd),               # step 3/16: exact, so casts agree too
            np.zeros((3, 4), nd), np.ones((3, 4), nd), np.full((3, 4), 3).astype(nd),
            np.zeros((2, 5), nd), np.ones((2, 5), nd), np.ones((2, 5), nd)]
    for got, w in zip(eager, want):
        _exact(got, w)
    _check_replays(g, outs, want, _exact)


def test_empty_and_like_forms_with_overrides_inside_a_capture():
    base = tp.ones(3, 4, device="cuda")
    g = CUDAGraph()
    with tp.cuda.graph(g):
        e = tp.empty(2, 3, dtype=tp.int8, device="cuda")
        el = tp.empty_like(base, dtype=tp.bfloat16)
        fl = tp.full_like(base, True, dtype=tp.bool)
        host = tp.zeros_like(base, device="cpu")             # a CPU tensor: no GPU work at all
    assert (e.shape, e.dtype, e.is_cuda) == ((2, 3), tp.int8, True)
    assert (el.shape, el.dtype, el.is_cuda) == ((3, 4), tp.bfloat16, True)
    assert host.is_cpu and np.array_equal(host.numpy(), np.zeros((3, 4), np.float32))
    _check_replays(g, [fl], [np.ones((3, 4), bool)], _exact)


# ------------------------------------------------------------------ small host data

def _host_cases():
    """Fresh host literals each call: the capture's must not be the eager run's."""
    rng = np.random.default_rng(7)
    return {
        "scalar": 3.0,
        "np_scalar": np.float32(2.5),
        "list": [1, 2, 3],
        "nested": [[True, False], [False, True]],
        "index": [0, 2, 3],
        "tuple_values": (5, 6, 7),
        "list_index": [1, 3],
        "nested_operand": rng.standard_normal((4, 2)).tolist(),
        "list_operand": [2.0, -1.0],
        "copy": rng.standard_normal((4, 2)).tolist(),
        "row": [10.0, 20.0],
        "mask": [True, False, True, True],
        "set_index": [1, 2],
        "set_values": [[-1.0, -2.0], [-3.0, -4.0]],
    }


def test_small_host_data_inside_a_capture_is_baked_into_the_graph():
    x = tp.arange(8, dtype=tp.float32, device="cuda").reshape(4, 2)      # a static input
    xs = x.numpy().copy()

    def fn(h):
        copied = tp.zeros(4, 2, device="cuda")
        copied.copy_(h["copy"])                                          # cast on the host, then written
        broadcast = tp.zeros(4, 2, device="cuda")
        broadcast.copy_(h["row"])                                        # uploaded, then broadcast
        into_view = tp.zeros(4, 2, device="cuda")
        into_view[1:3] = h["set_values"]
        scattered = x.clone()
        scattered[h["set_index"]] = h["set_values"]
        return (tp.tensor(h["scalar"], device="cuda"), tp.tensor(h["list"], device="cuda"),
                tp.tensor(h["nested"], device="cuda"), x[h["index"]], x[h["list_index"]],
                x + h["nested_operand"], x * h["list_operand"], copied, broadcast, into_view, scattered,
                tp.as_tensor(h["list"], device="cuda"), tp.tensor(h["tuple_values"], dtype=tp.int16, device="cuda"),
                x * h["np_scalar"], tp.where(h["mask"], x[:, 0], 0.0))   # a host list as the condition

    eager = [t.numpy().copy() for t in fn(_host_cases())]
    tp.cuda.synchronize()
    h = _host_cases()
    g = CUDAGraph()
    with tp.cuda.graph(g):
        outs = fn(h)
    h["nested_operand"][0][0] = 999           # changed and dropped: the graph holds its own copy
    h["copy"][1][1] = -999
    h["list"].append(4)
    del h
    gc.collect()
    c = _host_cases()
    m = np.array(c["mask"], dtype=bool)
    set_rows = xs.copy()
    set_rows[c["set_index"]] = c["set_values"]
    view = np.zeros((4, 2), np.float32)
    view[1:3] = c["set_values"]
    want = [np.array(3.0, np.float32), np.array([1, 2, 3]), np.array(c["nested"]), xs[c["index"]], xs[[1, 3]],
            xs + np.float32(c["nested_operand"]), xs * np.float32([2.0, -1.0]), np.float32(c["copy"]),
            np.broadcast_to(np.float32(c["row"]), (4, 2)), view, set_rows, np.array([1, 2, 3]),
            np.array([5, 6, 7], np.int16), xs * np.float32(2.5), np.where(m, xs[:, 0], 0).astype(np.float32)]
    for got, w in zip(eager, want):
        _exact(got, w)                                                   # outside a capture: the same
    _check_replays(g, outs, want, _exact)


@pytest.mark.parametrize("d", [tp.bool, tp.uint8, tp.int8, tp.float16, tp.bfloat16, tp.int16, tp.float32,
                               tp.float64])
def test_odd_sizes_and_alignments_of_every_small_dtype(d, rng):
    """1, 3, 7 ... bytes, and table edges, written at element offsets 0 and 1
    (odd byte addresses for 1-byte dtypes) without touching the neighbours."""
    counts = [n for n in (1, 3, 7, 255 // d.itemsize, 256 // d.itemsize, 257, 1023, 1025)
              if n * d.itemsize <= PARAM_UPLOAD_MAX_BYTES]
    datas = [random_array(n, d, rng) for n in counts]
    # Python lists of the values (exact: floats hold every element of these dtypes)
    py = bool if d is tp.bool else (float if d.kind == "f" else int)
    lists = [[py(v) for v in a] for a in datas]
    # what copy_ of such a list writes: Python floats are float32, as in PyTorch
    copied = [tp.tensor(v).numpy().astype(d.numpy_dtype) for v in lists]
    others = [~a if d is tp.bool else (a.astype(np.float64) + 1).astype(d.numpy_dtype) for a in datas]
    fence = float(random_array(1, d, rng)[0]) if d.kind == "f" else random_array(1, d, rng)[0].item()
    fences = np.array([fence, fence]).astype(d.numpy_dtype)
    bufs = [tp.full((n + 2,), fence, dtype=d, device="cuda") for n in counts]

    def fn(values):
        made = []
        for buf, v in zip(bufs, values):
            buf[1:1 + len(v)].copy_(v)
            made.append(tp.tensor(v, dtype=d, device="cuda"))
        return tuple(made)

    def check_buffers():
        for b, n, a in zip(bufs, counts, copied):
            got = b.numpy()
            _exact(got[1:1 + n], a)
            _exact(got[[0, n + 1]], fences)                              # the neighbours untouched

    eager = [t.numpy().copy() for t in fn([list(v) for v in lists])]
    for got, a in zip(eager, datas):
        _exact(got, a)
    check_buffers()
    host = [list(v) for v in lists]
    tp.cuda.synchronize()
    g = CUDAGraph()
    with tp.cuda.graph(g):
        outs = fn(host)
    del host
    gc.collect()
    for b, o in zip(bufs, others):
        b[1:1 + len(o)].copy_(o)                  # what the replay must overwrite
    _check_replays(g, outs, datas, _exact)
    check_buffers()


def test_each_table_capacity_writes_exactly_its_bytes():
    for n in sorted({c for c in PARAM_UPLOAD_CAPACITIES} | {c + 1 for c in PARAM_UPLOAD_CAPACITIES[:-1]}):
        a = (np.arange(n) * 7 % 251).astype(np.uint8)
        assert np.array_equal(tp.tensor(a, device="cuda").numpy(), a)


def test_host_data_at_the_limit_is_captured_and_one_byte_over_is_refused_cleanly():
    at = (np.arange(PARAM_UPLOAD_MAX_BYTES) % 241).astype(np.uint8)
    over = (np.arange(PARAM_UPLOAD_MAX_BYTES + 1) % 239).astype(np.uint8)
    at_l, over_l = at.tolist(), over.tolist()                            # literals: copied into a graph
    dst = tp.zeros(PARAM_UPLOAD_MAX_BYTES + 1, dtype=tp.uint8, device="cuda")
    x = tp.ones(600, device="cuda")
    tp.tensor(at, device="cuda") + 1                                     # warm up
    tp.cuda.synchronize()
    g = CUDAGraph()
    with tp.cuda.graph(g):
        y = tp.tensor(at_l, dtype=tp.uint8, device="cuda")               # exactly 4096 bytes: in parameters
        for attempt in (lambda: tp.tensor(over_l, dtype=tp.uint8, device="cuda"), lambda: dst.copy_(over_l),
                        lambda: x[list(range(513))]):
            with pytest.raises(tp.cuda.CudaError) as info:
                attempt()
            assert info.value.name == "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED"
            msg = str(info.value)
            assert "bytes of host data" in msg and f"up to {PARAM_UPLOAD_MAX_BYTES} bytes" in msg, msg
            assert "before the capture" in msg
        with pytest.raises(tp.cuda.CudaError, match="4097 bytes of host data"):
            tp.tensor(over_l, dtype=tp.uint8, device="cuda")
        with pytest.raises(tp.cuda.CudaError, match="pageable memory"):
            tp.tensor(at, device="cuda")                                 # an array: refused at any size
        z = y + 1                                                        # the capture goes on
    assert not tp.cuda.is_current_stream_capturing()
    _check_replays(g, [y, z], [at, (at + 1).astype(np.uint8)], _exact)
    assert dst.numpy().tolist() == [0] * (PARAM_UPLOAD_MAX_BYTES + 1)     # the refused copy did nothing
    # outside a capture the same calls work: a pageable copy
    assert np.array_equal(tp.tensor(over, device="cuda").numpy(), over)
    dst.copy_(over)
    assert np.array_equal(dst.numpy(), over)


def test_a_refused_upload_that_ends_the_capture_leaves_the_process_usable():
    big = np.ones(2048, np.float32)
    g = CUDAGraph()
    with pytest.raises(tp.cuda.CudaError, match="8192 bytes of host data"):
        with tp.cuda.graph(g):
            tp.tensor(big.tolist(), device="cuda")
    assert not tp.cuda.is_current_stream_capturing()
    t = tp.tensor(big, device="cuda")                                    # eager: cuMemcpyHtoDAsync
    with tp.cuda.graph(g):
        y = t * 2 + tp.tensor([1.0], device="cuda")
    g.replay()
    assert y.numpy().tolist() == [3.0] * 2048


# ------------------------------------------------------------------ make_graphed_callables

def test_make_graphed_callables_with_creation_inside_matches_eager(rng):
    """torch's test_graph_make_graphed_callables, ported: three callables
    graphed into one pool, the last building tensors inside the capture
    (its ParameterlessModule calls torch.arange(x.size(0), device=x.device));
    ten calls with new inputs equal the eager results and NumPy."""
    n, d_in, h, d_out = 64, 32, 48, 16

    def weights(a, b):
        return (tp.tensor((rng.standard_normal((a, b)) / np.sqrt(a)).astype(np.float32), device="cuda"),
                tp.tensor(rng.standard_normal(b).astype(np.float32) * 0.1, device="cuda"))
    (w1, b1), (w2, b2), (w3, b3) = weights(d_in, h), weights(h, h), weights(h, d_out)

    def mlp1(x):
        return (x @ w1 + b1).relu()

    def mlp2(x):
        return ((x @ w2 + b2).relu() @ w3 + b3).tanh()

    def parameterless(x):
        rows = tp.arange(x.size(0), device="cuda")                       # a kernel now, not a host copy
        flipped = x[(x.size(0) - 1) - rows]                              # a device index: gather
        keep = tp.tensor([True, False, True, True] * (x.size(1) // 4), device="cuda")
        scale = tp.full((x.size(1),), 0.5, device="cuda")
        out = tp.where(keep, flipped * scale, tp.zeros_like(x))
        return out, out[:, [0, 3, 5, 7]]                                 # an index list

    def np_chain(x):
        a = np.maximum(x @ w1.numpy() + b1.numpy(), 0)
        y = np.tanh(np.maximum(a @ w2.numpy() + b2.numpy(), 0) @ w3.numpy() + b3.numpy())
        out = np.where(np.array([True, False, True, True] * (d_out // 4)), y[::-1] * 0.5, 0)
        return out, out[:, [0, 3, 5, 7]]

    x = tp.tensor(rng.standard_normal((n, d_in)).astype(np.float32), device="cuda")
    hid = tp.zeros(n, h, device="cuda")
    y0 = tp.zeros(n, d_out, device="cuda")
    g1, g2, g3 = tp.cuda.make_graphed_callables((mlp1, mlp2, parameterless), ((x,), (hid,), (y0,)))
    for _ in range(10):
        data = rng.standard_normal((n, d_in)).astype(np.float32)
        real = tp.tensor(data, device="cuda")
        out, picked = g3(g2(g1(real)))
        e_out, e_picked = parameterless(mlp2(mlp1(real)))
        r_out, r_picked = np_chain(data)
        np.testing.assert_allclose(out.numpy(), e_out.numpy(), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(picked.numpy(), e_picked.numpy(), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(out.numpy(), r_out, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(picked.numpy(), r_picked, rtol=1e-4, atol=1e-5)
