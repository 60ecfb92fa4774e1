# SPDX-License-Identifier: Apache-2.0
"""tensorplay.cuda.precompile and compile_progress: the kernels of named ops
compiled ahead into the on-disk cache (NVRTC needs no GPU: an explicit arch
works here), their progress shown or not, and, on a GPU, a model-like run
after precompile() compiling nothing new."""

import json
import logging
import os
import subprocess
import sys

import numpy as np
import pytest

import tensorplay as tp
from helpers import KERNEL_ARCH, unique_kernel_source
from tensorplay._graph import kernel_catalog
from tensorplay._kernels import cache, nvrtc, precompile as precompile_mod
from tensorplay._kernels import random_kernels
from tensorplay._kernels.cache import KernelSpec
from tensorplay._ops import elementwise as _elementwise
from tensorplay._ops import reduce as _reduce
from tensorplay._tensor import creation
from tensorplay._tensor.args import contiguous_strides
from tensorplay._tensor.tensor import copy_into, new_cuda
from tensorplay._tensor.transfer import upload

SMALL = {"ops": ["add", "sum"], "dtypes": ["float32"], "arch": KERNEL_ARCH}


def _progress_lines(caplog):
    return [r.getMessage() for r in caplog.records
            if r.name == "tensorplay.nvrtc" and r.getMessage().startswith("precompile")]


def test_precompile_fills_the_cache_and_a_second_call_finds_every_kernel(kernel_cache):
    first = tp.cuda.precompile(**SMALL, progress=False)
    # add: same shapes, a broadcast row, a 0-d tensor, a number; sum: 5 row and 4 column variants
    assert first["kernels"] == 4 + 9
    assert first["compiled"] == first["kernels"] and first["cached"] == 0
    assert first["archs"] == [KERNEL_ARCH] and first["path"] == tp.cuda.kernel_cache_dir()
    assert first["seconds"] > 0
    info = tp.cuda.kernel_cache_info()
    assert info["files"] == first["compiled"] == len(list(kernel_cache.rglob("*.bin")))
    again = tp.cuda.precompile(**SMALL, progress=False)
    assert (again["compiled"], again["cached"]) == (0, first["kernels"])
    nvrtc.clear_memory_cache()                   # a new process: found on disk, not compiled again
    compiled = tp.cuda.kernel_cache_info()["compiled"]
    assert tp.cuda.precompile(**SMALL, progress=False)["compiled"] == 0
    assert tp.cuda.kernel_cache_info()["compiled"] == compiled


def test_several_archs_and_groups(kernel_cache):
    r = tp.cuda.precompile(["graph"], arch=[KERNEL_ARCH, 80, KERNEL_ARCH], progress=False, workers=1)
    graph_kernels = len(kernel_catalog.catalog_kernels("graph"))
    assert r["archs"] == [80, KERNEL_ARCH] and r["kernels"] == r["compiled"] == 2 * graph_kernels
    assert {"amin", "prod", "any"} <= set(kernel_catalog._names("reduce"))
    assert "amin" not in kernel_catalog._names(None)


def test_the_default_set_is_the_documented_one():
    default = kernel_catalog._names(None)
    doc = " ".join(tp.cuda.precompile.__doc__.split())
    for name in default:
        assert f" {name} " in doc.replace("``", " "), name
    specs = kernel_catalog.catalog_kernels()
    assert len(specs) == len(set(specs)) > 300
    assert all(s.name.endswith(".cu") and s.source for s in specs)


def test_one_kernel_of_each_default_op_compiles(kernel_cache):
    specs = [kernel_catalog.catalog_kernels(name)[0] for name in kernel_catalog._names(None)]
    r = precompile_mod.compile_kernels(specs, [KERNEL_ARCH], progress=False)
    assert r["compiled"] + r["cached"] == len(set(specs))


def test_without_a_gpu_the_arch_must_be_given(monkeypatch):
    monkeypatch.setattr(precompile_mod, "is_available", lambda: False)
    monkeypatch.setattr(precompile_mod, "unavailable_reason", lambda: "no NVIDIA driver was found")
    with pytest.raises(tp.cuda.CudaUnavailableError, match=r"no NVIDIA driver was found.*arch=90"):
        tp.cuda.precompile(progress=False)


@pytest.mark.parametrize("kwargs, error, match", [
    ({"ops": ["add", "nope"]}, ValueError, r"unknown op 'nope'; known ops: add, sub, .*; groups: elementwise"),
    ({"ops": "softmax"}, ValueError, r"unknown op 'softmax'"),
    ({"arch": 10}, ValueError, r"cannot compile for arch=10: NVRTC 13\.\d+ targets 75, 80, .*90"),
    ({"arch": "sm_91"}, ValueError, r"cannot compile for arch='sm_91': NVRTC .* targets 75, "),
    ({"arch": []}, ValueError, r"arch is empty"),
    ({"arch": 90, "workers": 0}, ValueError, r"workers must be a positive int"),
    ({"arch": 90, "progress": "yes"}, TypeError, r"progress must be True, False or None"),
    ({"arch": 90, "dtypes": ["float99"]}, TypeError, r"float99"),
])
def test_bad_arguments_raise_before_compiling(kwargs, error, match, kernel_cache):
    with pytest.raises(error, match=match):
        tp.cuda.precompile(**kwargs)
    assert tp.cuda.kernel_cache_info()["files"] == 0


@pytest.mark.parametrize("arch, archs", [
    (90, [90]), ("sm_90", [90]), ("90", [90]), (" sm_80 ", [80]), (np.int64(90), [90]),
    ([90, "sm_80", "90"], [80, 90]), ((80,), [80]), ({75, 90}, [75, 90]), (iter(["sm_75"]), [75]),
])
def test_arch_is_an_int_a_sm_string_or_a_list_of_them(arch, archs):
    # "sm_90" is one arch, not the characters s, m, _, 9, 0
    assert precompile_mod.resolve_archs(arch) == archs


@pytest.mark.parametrize("arch, error, match", [
    (9.0, TypeError, r"arch must be an int such as 90 .*, a string such as 'sm_90' or '90', or a list of them, "
                     r"got 9\.0 \(float\)\. NVRTC 13\.\d+ targets 75, 80, "),
    (999, ValueError, r"cannot compile for arch=999: NVRTC 13\.\d+ targets 75, 80, "),
    (76, ValueError, r"cannot compile for arch=76: NVRTC .* targets 75, 80, "),      # not PTX for 75
    ((9, 0), ValueError, r"cannot compile for arch=9 \(compute capability 9\.0 is arch=90\)"),
    ("sm_90a", ValueError, r"arch 'sm_90a' is not an architecture; arch must be an int .* targets 75, "),
    ("compute_90", ValueError, r"arch 'compute_90' is not an architecture"),
    ("", ValueError, r"arch '' is not an architecture"),
    (b"90", TypeError, r"got b'90' \(bytes\)\. NVRTC .* targets 75, "),
    (True, TypeError, r"got True \(bool\)"),
    ([90, 8.9], TypeError, r"got 8\.9 \(float\)"),
    ([[90]], TypeError, r"got \[90\] \(list\)"),
    (object(), TypeError, r"arch must be an int"),
])
def test_every_other_arch_is_refused_naming_the_valid_targets(arch, error, match, kernel_cache):
    with pytest.raises(error, match=match) as info:
        tp.cuda.precompile(["add"], dtypes=["float32"], arch=arch, progress=False)
    valid = precompile_mod.valid_archs()
    assert valid == sorted(nvrtc.supported_archs()) and 75 in valid and 90 in valid
    assert ", ".join(map(str, valid)) in str(info.value)
    assert tp.cuda.kernel_cache_info()["files"] == 0


def test_progress_false_prints_and_logs_nothing(kernel_cache, capsys, caplog):
    with caplog.at_level(logging.INFO, logger="tensorplay"):
        r = tp.cuda.precompile(**SMALL, progress=False)
    assert r["compiled"] == 13
    assert _progress_lines(caplog) == []
    assert capsys.readouterr() == ("", "")


def test_progress_without_tqdm_logs_lines(kernel_cache, caplog, monkeypatch):
    monkeypatch.setitem(sys.modules, "tqdm", None)          # import tqdm fails
    with caplog.at_level(logging.INFO, logger="tensorplay.nvrtc"):
        r = tp.cuda.precompile(**SMALL, progress=True)
    lines = _progress_lines(caplog)
    assert lines[-1].startswith(f"precompile: 13 kernels for sm_{KERNEL_ARCH}: 13 compiled, 0 already cached, in ")
    counts = [line.split()[1] for line in lines[:-1]]
    assert counts[-1] == "13/13" and len(counts) == 7           # every ceil(13 / 10) = 2 kernels, and the last
    assert r["compiled"] == 13


def test_progress_bar_with_tqdm(kernel_cache, capsys):
    pytest.importorskip("tqdm")
    tp.cuda.precompile(**SMALL, progress=True)
    err = capsys.readouterr().err
    assert "precompile" in err and "13/13" in err


def test_compile_progress_counts_compilations_not_cache_hits(kernel_cache, caplog, monkeypatch):
    monkeypatch.setitem(sys.modules, "tqdm", None)
    src = unique_kernel_source("progress_kernel")
    with caplog.at_level(logging.INFO, logger="tensorplay.nvrtc"):
        with tp.cuda.compile_progress() as counts:
            nvrtc.compile_cubin(src, "progress_kernel.cu", (), KERNEL_ARCH)
            nvrtc.compile_cubin(src, "progress_kernel.cu", (), KERNEL_ARCH)      # a memory hit
            assert counts["compiled"] == 1 and counts["seconds"] > 0
    msgs = [r.getMessage() for r in caplog.records]
    assert any(m.startswith("compiling kernels on first use (progress_kernel first)") for m in msgs)
    assert msgs[-1].startswith("compiled 1 kernels on first use")
    nvrtc.compile_cubin(unique_kernel_source("after_progress"), "after.cu", (), KERNEL_ARCH)
    assert counts["compiled"] == 1                              # the listener is gone
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="tensorplay.nvrtc"):
        with tp.cuda.compile_progress(progress=False) as quiet:
            nvrtc.compile_cubin(unique_kernel_source("quiet_progress"), "quiet.cu", (), KERNEL_ARCH)
    assert quiet["compiled"] == 1
    assert not [r for r in caplog.records if "on first use" in r.getMessage()]


def test_a_compile_error_stops_and_raises(kernel_cache):
    bad = KernelSpec('extern "C" __global__ void k() { nope = 1; }', "bad.cu", ())
    good = KernelSpec(unique_kernel_source("good_one"), "good.cu", ())
    with pytest.raises(tp.NVRTCError, match="nope"):
        precompile_mod.compile_kernels([good, bad], [KERNEL_ARCH], workers=2, progress=False)


def test_collecting_leaves_no_plan_or_kernel_behind():
    kernel_catalog.catalog_kernels(["add", "to", "rand", "sum"])
    assert len(cache.plans) == 0
    assert not [k for k in cache._functions if k[1] == cache.COLLECT_DEVICE]


# ------------------------------------------------------------------ the ops' own kernels are the precompiled ones

class _Stub:
    """A loaded kernel that launches nowhere."""

    def launch(self, *args, **kwargs):
        pass

    def max_active_blocks(self, block):
        return 4


def _fake(shape, d, strides=None, _next=[1 << 36]):
    _next[0] += 1 << 24
    return new_cuda(None, _next[0], tuple(shape), strides or contiguous_strides(shape), d, 0)


def test_the_kernels_ops_ask_for_are_the_precompiled_ones(monkeypatch):
    """Real op code over metadata-only tensors of device 0, kernels recorded
    as the ops ask for them (test_ops_codegen's way, not precompile's): each
    is one precompile() compiles by default, byte for byte."""
    default = set(kernel_catalog.catalog_kernels())
    asked = []

    def cached_function(key, device, make, options=()):
        src, name = make()
        asked.append(KernelSpec(src, name + ".cu", tuple(options)))
        return _Stub()
    monkeypatch.setattr(cache, "cached_function", cached_function)
    monkeypatch.setitem(cache._sm_cache, 0, 132)
    monkeypatch.setattr(_reduce, "empty_cuda", lambda shape, d, dev: _fake(shape, d))
    monkeypatch.setattr(creation, "empty_cuda", lambda shape, d, dev: _fake(shape, d))
    monkeypatch.setattr(creation, "resolve_device", lambda device: 0)

    for d in (tp.float32, tp.float16, tp.bfloat16):
        x, b, m = _fake((64, 128), d), _fake((128,), d), _fake((64, 1), d)
        out, mask = _fake((64, 128), d), _fake((64, 128), tp.bool)
        _elementwise.apply("add", x, b, out=out)                      # a bias
        _elementwise.apply("sub", x, m, out=out)                      # minus a keepdim reduction
        _elementwise.apply("mul", x, 0.5, out=out)
        _elementwise.apply("div", x, _fake((), d), out=out)
        _elementwise.apply("mul", x, x, out=out)
        _elementwise.apply("gt", x, 0, out=mask)
        for op in ("relu", "exp", "sigmoid", "tanh", "rsqrt", "neg"):
            _elementwise.apply(op, x, out=out)
        _elementwise.where(mask, x, 0.0, out=out)
        _elementwise.where(_fake((128,), tp.bool), x, float("-inf"), out=out)
        _elementwise.where(mask, x, x, out=out)
        _reduce.reduce("sum", x, -1, out=_fake((64,), d))                      # warp rows
        _reduce.reduce("sum", x, None, out=_fake((), d))                       # block rows
        _reduce.reduce("sum", _fake((1, 1 << 20), d), None, out=_fake((), d))  # split, then the partials
        _reduce.reduce("sum", x, 0, out=_fake((128,), d))                      # columns
        _reduce.reduce("sum", _fake((65536, 16), d), 0, out=_fake((16,), d))   # split columns
        _reduce.reduce("amax", x, -1, keepdim=True, out=_fake((64, 1), d))
        _reduce.reduce("argmax", x, -1, out=_fake((64,), tp.int64))
        _reduce.mean(x, -1, out=_fake((64,), d))
        _reduce.reduce("sum", mask, None, out=_fake((), tp.int64))
        for other in (tp.float32, tp.int64, tp.bool):
            if other is not d:
                copy_into(_fake((64, 128), other), x)
                copy_into(_fake((64, 128), d), _fake((64, 128), other))
        copy_into(_fake((128, 64), d), x.transpose(0, 1))                       # a transpose
        copy_into(_fake((64, 64), d), _fake((64, 64), d, (128, 1)))             # a slice
        _fake((8,), d).fill_(1)
        for op in ("uniform", "normal", "dropout"):
            dist = random_kernels.dist_for(op, d, None)
            scalars = tuple(0.0 if k == "f" else 0 for k in dist.scalars)
            random_kernels.launch(op, _fake((1000,), d), 0x1000, scalars, _fake((1000,), d) if op == "dropout"
                                  else None, None)
    _fake((8,), tp.bool).fill_(True)
    creation.arange(10, device=0)
    creation.arange(0.0, 1.0, 0.25, device=0)
    upload(_fake((3,), tp.int64), np.arange(3))
    random_kernels.set_state_function(0)

    assert len(asked) > 100
    missing = sorted({s.name for s in asked if s not in default})
    assert not missing, missing


# ------------------------------------------------------------------ on the GPU

_MODEL_LIKE = r"""
import json
import tensorplay as tp
from tensorplay._kernels import nvrtc
from tensorplay.nn import functional as F

r = tp.cuda.precompile()
compiled = []
nvrtc.add_compile_listener(lambda kernel, target, seconds: compiled.append(kernel))
with tp.cuda.compile_progress(progress=False) as counts:
    dev = "cuda"
    tp.manual_seed(0)
    for d in (tp.float32, tp.float16, tp.bfloat16):
        x = tp.randn(64, 128, device=dev, dtype=d)
        b = tp.rand(128, device=dev, dtype=d)
        w = tp.ones(64, 128, device=dev, dtype=d)
        y = (x + b) * 0.5 - w / 2.0
        y = tp.where(y > 0, y, 0.0).relu().exp().sigmoid().sqrt().tanh()
        e = (y - y.amax(-1, keepdim=True)).exp()
        p = e / e.sum(-1, keepdim=True)
        p.mean(-1), p.argmax(-1), p.sum(), y.sum(0)
        tp.randn(1 << 20, device=dev, dtype=d).sum()
        F.dropout(x, 0.1)
        x.to(tp.float32), x.to(tp.int64), (x > 0).to(d), (x > 0).sum()
        x.transpose(0, 1).contiguous(), x[:, :64].contiguous()
        tp.full((4,), 2.0, dtype=d, device=dev)
    tp.arange(10, device=dev), tp.tensor([1, 2, 3], device=dev)
    static, pred = tp.zeros(8, device=dev), tp.ones((), dtype=tp.bool, device=dev)
    static.add_(1.0)
    g = tp.cuda.CUDAGraph()
    with tp.cuda.graph(g):
        with g.if_(pred):
            static.add_(1.0)
    g.stage_and_launch([static], [tp.ones(8, device=dev)])
    tp.cuda.synchronize()
print(json.dumps({"precompiled": r["compiled"], "new": compiled, "counted": counts["compiled"]}))
"""


@pytest.mark.cuda
def test_after_precompile_a_model_like_run_compiles_nothing(tmp_path):
    """A fresh process (nothing loaded yet) with a fresh cache: precompile()
    for the device, then ops in the dtypes and forms precompile covers,
    a graph with an IF node and stage_and_launch: no kernel compiles."""
    env = dict(os.environ, TENSORPLAY_CACHE_DIR=str(tmp_path))
    out = subprocess.run([sys.executable, "-c", _MODEL_LIKE], env=env, capture_output=True, text=True,
                         cwd="/", timeout=600)
    assert out.returncode == 0, out.stderr[-4000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["precompiled"] > 300
    assert result["new"] == [] and result["counted"] == 0, result
