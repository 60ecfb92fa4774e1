# SPDX-License-Identifier: Apache-2.0
"""PyTorch and CuPy tensors at the graph boundary: stage_and_launch with
PyTorch static inputs and inputs (the stager kept while the same tensors
are passed), rebind_and_launch and rebindable() (tensorplay's kernels on
PyTorch memory rebind, a tensor PyTorch's kernel reads is copied),
describe(static_inputs=...), make_graphed_callables and cudagraphify of
PyTorch callables; a cuda.core kernel launched on tensorplay's capture
stream."""

import numpy as np
import pytest

import tensorplay as tp
from tensorplay._testing import staged_builds, stages_in_one_launch
from tensorplay.cuda import CUDAGraph

from helpers import torch_cuda as torch  # noqa: F401 (a fixture)

pytestmark = pytest.mark.cuda
N = 1 << 20                     # 1M float32: 4 MiB


# ------------------------------------------------------------------ stage_and_launch

def test_stage_and_launch_with_torch_tensors(torch):
    xs = torch.zeros(N, device="cuda")
    ys = torch.zeros(N, device="cuda")

    def f(x, y):
        return torch.sin(x) * 2 + y
    f(xs, ys)
    torch.cuda.synchronize()
    g = CUDAGraph()
    with tp.cuda.graph(g):
        out = f(xs, ys)
    statics = [xs, ys]
    x1, y1 = torch.randn(N, device="cuda"), torch.randn(N, device="cuda")
    g.stage_and_launch(statics, [x1, y1])
    torch.cuda.synchronize()
    torch.testing.assert_close(out, f(x1, y1))
    builds = staged_builds()
    big = torch.randn(2 * N, device="cuda")
    cases = []
    for k in range(6):
        x, y = torch.randn(N, device="cuda"), torch.randn(N, device="cuda")
        if k % 3 == 0:
            cases.append(([x, y], x, y))                            # PyTorch tensors
        elif k % 3 == 1:
            cases.append(([tp.from_dlpack(x), y], x, y))            # a tensorplay view of one
        else:
            cases.append(([big[::2], y], big[::2], y))              # strided: the generic copy
    for inputs, x, y in cases:
        g.stage_and_launch(statics, inputs)                         # the same static tensors each time
        torch.cuda.synchronize()
        torch.testing.assert_close(out, f(x, y))
        assert torch.equal(xs, x) and torch.equal(ys, y)            # staged onto the static inputs
    g.stage_and_launch(list(statics), [x1, y1])                      # another list of the same tensors
    torch.cuda.synchronize()
    torch.testing.assert_close(out, f(x1, y1))
    assert staged_builds() == builds                                 # one stager, kept
    assert stages_in_one_launch(g)


def test_stage_and_launch_with_cupy_arrays():
    cp = pytest.importorskip("cupy")
    a = cp.zeros(N, dtype=cp.float32)
    (cp.cos(a) + a).sum()
    cp.cuda.Device().synchronize()
    g = CUDAGraph()
    with tp.cuda.graph(g):
        out = (cp.cos(a) + a).sum()
    builds = None
    rs = cp.random.RandomState(5)
    for _ in range(3):
        new = rs.standard_normal(N, dtype=cp.float32)
        g.stage_and_launch([a], [new])
        cp.cuda.Device().synchronize()
        builds = staged_builds() if builds is None else builds
        np.testing.assert_allclose(float(out), float((cp.cos(new) + new).sum()), rtol=1e-4)
    assert staged_builds() == builds


# ------------------------------------------------------------------ rebind_and_launch

def test_tensorplay_kernels_on_torch_memory_rebind(torch):
    xs = torch.randn(N, device="cuda")
    X = tp.from_dlpack(xs)
    X * 2.0 + 1.0
    tp.cuda.synchronize()
    g = CUDAGraph()
    with tp.cuda.graph(g):
        Y = X * 2.0 + 1.0
    assert g.rebindable([xs]) == [True]
    assert g.describe(static_inputs=[xs])["rebindable"] == {"inputs": [True], "outputs": []}
    before = xs.clone()
    for _ in range(3):
        xn = torch.randn(N, device="cuda")
        g.rebind_and_launch([xs], [xn])
        got = Y.numpy()
        np.testing.assert_allclose(got, (xn * 2.0 + 1.0).cpu().numpy(), rtol=1e-5, atol=1e-5)
    torch.cuda.synchronize()
    assert torch.equal(xs, before)                     # read in place: the static input was not written
    g.replay()                                         # replay() reads the static input again
    np.testing.assert_allclose(Y.numpy(), (before * 2.0 + 1.0).cpu().numpy(), rtol=1e-5, atol=1e-5)


def test_a_tensor_a_torch_kernel_reads_is_copied(torch):
    xs = torch.randn(N, device="cuda")
    X = tp.from_dlpack(xs)
    (torch.sin(xs) * 2, X * 3.0)
    torch.cuda.synchronize()
    g = CUDAGraph()
    with tp.cuda.graph(g):
        y = torch.sin(xs) * 2                          # PyTorch's kernel reads xs
        z = X * 3.0                                    # and so does ours
    assert g.rebindable([xs]) == [False]
    assert g.describe(static_inputs=[xs])["rebindable"] == {"inputs": [False], "outputs": []}
    for _ in range(3):
        xn = torch.randn(N, device="cuda")
        g.rebind_and_launch([xs], [xn])                # the copy fallback
        torch.cuda.synchronize()
        torch.testing.assert_close(y, torch.sin(xn) * 2)
        np.testing.assert_allclose(z.numpy(), (xn * 3.0).cpu().numpy(), rtol=1e-5, atol=1e-5)
        assert torch.equal(xs, xn)                     # copied onto the static input


# ------------------------------------------------------------------ graphed callables

def test_make_graphed_callables_of_a_torch_module(torch):
    torch.manual_seed(0)
    lin = torch.nn.Linear(1024, 1024).cuda()
    x = torch.randn(256, 1024, device="cuda")
    sample = x.clone()
    graphed = tp.cuda.make_graphed_callables(lin, (x,))
    first = None
    for _ in range(3):
        xn = torch.randn(256, 1024, device="cuda")
        y = graphed(xn)
        assert isinstance(y, torch.Tensor) and y.shape == (256, 1024)
        torch.cuda.synchronize()
        torch.testing.assert_close(y, lin(xn), rtol=1e-4, atol=1e-4)
        first = y if first is None else first
        assert y is first                              # the static output, overwritten by each call
    assert torch.equal(x, sample)                      # the sample was cloned, never written


def test_cudagraphify_a_torch_function(torch):
    w = torch.randn(1024, 1024, device="cuda") / 32

    def fn(x, w):
        return (x @ w).relu() + 1

    f = tp.cuda.cudagraphify(fn)
    x1, x2 = torch.randn(256, 1024, device="cuda"), torch.randn(256, 1024, device="cuda")
    o1 = f(x1, w)
    torch.cuda.synchronize()
    assert isinstance(o1, torch.Tensor)
    torch.testing.assert_close(o1, fn(x1, w), rtol=1e-4, atol=1e-4)
    o2 = f(x2, w)
    torch.cuda.synchronize()
    torch.testing.assert_close(o2, fn(x2, w), rtol=1e-4, atol=1e-4)
    assert o2.data_ptr() == o1.data_ptr()              # the static output again
    stats = f.stats()
    assert stats["captures"] == 1 and stats["replays"] == 2 and stats["rebinds"] == 0, stats
    f(x1, w)
    assert f.stats()["replays"] == 3 and f.stats()["captures"] == 1

    h = tp.cuda.cudagraphify(fn, clone_outputs=True)
    c1 = h(x1, w)
    c2 = h(x2, w)
    torch.cuda.synchronize()
    assert isinstance(c1, torch.Tensor) and isinstance(c2, torch.Tensor)
    assert c1.data_ptr() != c2.data_ptr()
    torch.testing.assert_close(c1, fn(x1, w), rtol=1e-4, atol=1e-4)      # not changed by the second call
    torch.testing.assert_close(c2, fn(x2, w), rtol=1e-4, atol=1e-4)
    assert h.stats()["captures"] == 1


def test_cudagraphify_runs_a_torch_random_op_eagerly(torch):
    f = tp.cuda.cudagraphify(lambda x: x * torch.rand_like(x))
    x = torch.ones(N, device="cuda")
    with pytest.warns(RuntimeWarning, match="could not be captured"):
        r = f(x)
    assert isinstance(r, torch.Tensor)
    r2 = f(x)
    torch.cuda.synchronize()
    for v in (r, r2):
        assert 0.0 <= v.min().item() and v.max().item() < 1.0
    assert not torch.equal(r, r2)
    stats = f.stats()
    assert stats["captures"] == 0 and stats["fallbacks"] == 2 and stats["eager_signatures"] == 1, stats
    assert torch.cuda.current_stream() == torch.cuda.default_stream()


# ------------------------------------------------------------------ cuda.core on the capture stream

CORE_SOURCE = r"""
extern "C" __global__ void foreign_core_axpb(const float* x, float* y, float a, unsigned long long n) {
  unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + 1.0f;
}
"""


def _cuda_core():
    """cuda.core's module with the names the test uses, or a skip."""
    pytest.importorskip("cuda.core")
    names = ("Device", "Program", "ProgramOptions", "LaunchConfig", "launch")
    import cuda.core as core
    if all(hasattr(core, n) for n in names):
        return core
    try:
        import cuda.core.experimental as core
    except ImportError:
        pytest.skip("cuda.core without Device/Program/launch")
    if not all(hasattr(core, n) for n in names):
        pytest.skip("cuda.core without Device/Program/launch")
    return core


def test_a_cuda_core_kernel_in_a_capture():
    core = _cuda_core()
    dev = core.Device(tp.cuda.current_device())
    dev.set_current()
    arch = "".join(str(v) for v in tuple(dev.compute_capability)[:2])
    try:
        prog = core.Program(CORE_SOURCE, code_type="c++", options=core.ProgramOptions(arch=f"sm_{arch}"))
        kernel = prog.compile("cubin").get_kernel("foreign_core_axpb")
    except TypeError as exc:
        pytest.skip(f"this cuda.core compiles differently: {exc}")
    x = tp.zeros(N, device="cuda")
    y = tp.zeros(N, device="cuda")
    config = core.LaunchConfig(grid=(N + 255) // 256, block=256)
    args = (np.uint64(x.data_ptr()), np.uint64(y.data_ptr()), np.float32(3.0), np.uint64(N))

    def run():
        stream = dev.create_stream(tp.cuda.current_stream())
        core.launch(stream, config, kernel, *args)
    eager = tp.cuda.Stream()
    try:
        with tp.cuda.stream(eager):
            run()                                      # loads the kernel; checks this cuda.core's API
    except (TypeError, AttributeError) as exc:
        pytest.skip(f"this cuda.core launches differently: {exc}")
    eager.synchronize()
    assert y.numpy()[:4].tolist() == [1.0] * 4
    g = CUDAGraph()
    with tp.cuda.graph(g):
        run()
    rng = np.random.default_rng(0)
    for _ in range(3):
        a = rng.standard_normal(N).astype(np.float32)
        x.copy_(a)
        g.replay()
        np.testing.assert_allclose(y.numpy(), 3.0 * a + 1.0, rtol=1e-5, atol=1e-5)
    names = [n.get("name") for n in g.describe()["nodes"] if n["kind"] == "kernel"]
    assert names == ["foreign_core_axpb"], names
