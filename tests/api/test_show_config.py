# SPDX-License-Identifier: Apache-2.0
"""tensorplay.config() and show_config(): the versions of tensorplay and its
dependencies, the kernel cache, the environment, and the GPUs (or why there
are none)."""

import sys

import numpy as np

import tensorplay as tp
from helpers import HAS_CUDA, KERNEL_ARCH, run_python, unique_kernel_source
from tensorplay._kernels import nvrtc as _nvrtc


def test_show_config_reports_versions(capsys):
    info = tp.config()
    assert info["tensorplay"] == tp.__version__ and info["numpy"] == np.__version__
    assert info["nvrtc"].split(".")[0].isdigit()
    if not HAS_CUDA:
        assert info["gpus"] == [] and info["cuda"]     # the driver may be there, the GPU not
    tp.show_config()
    out = capsys.readouterr().out
    assert "tensorplay" in out and "cuda-bindings" in out


def test_show_config_prints_versions_cache_and_environment(kernel_cache, monkeypatch, capsys):
    monkeypatch.setenv("TENSORPLAY_DISABLE_CUDA", "0")
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    _nvrtc.compile_cubin(unique_kernel_source("config_kernel"), arch=KERNEL_ARCH)
    tp.show_config()
    out = capsys.readouterr().out
    rows = {}
    for line in out.splitlines():
        key, _, value = line.partition(":")
        rows[key.strip()] = value.strip()
    from importlib import metadata
    assert rows["tensorplay"] == tp.__version__
    assert rows["python"] == sys.version.split()[0]
    for dist in ("numpy", "ml_dtypes", "cuda-bindings", "cuda-pathfinder", "nvidia-cuda-nvrtc"):
        assert rows[dist] == metadata.version(dist), dist
    assert "nvidia-cublas" in rows
    assert rows["nvrtc"] == ".".join(map(str, _nvrtc.nvrtc_version()))
    assert rows["kernel cache"].startswith(f"{kernel_cache} (1 file, ")
    assert rows["TENSORPLAY_CACHE_DIR"] == str(kernel_cache.parent)
    assert rows["XDG_CACHE_HOME"] == "(not set)" and rows["TENSORPLAY_DISABLE_CUDA"] == "0"
    if HAS_CUDA:
        assert rows["cuda"] == "available" and rows["driver"].startswith("CUDA 13.")
        assert "compute capability" in rows["gpu"]
    else:
        assert rows["cuda"] == f"not available: {tp.cuda.unavailable_reason()}"


def test_show_config_with_cuda_disabled():
    out = run_python("import tensorplay as tp\ntp.show_config()", TENSORPLAY_DISABLE_CUDA="1")
    assert out.returncode == 0, out.stderr
    rows = {k.strip(): v.strip() for k, _, v in (line.partition(":") for line in out.stdout.splitlines())}
    assert rows["driver"] == "not loaded (TENSORPLAY_DISABLE_CUDA)"
    assert rows["cuda"] == "not available: the environment variable TENSORPLAY_DISABLE_CUDA turns CUDA off"
    assert rows["TENSORPLAY_DISABLE_CUDA"] == "1"


def test_config_is_a_dict_without_a_gpu_too(kernel_cache):
    info = tp.config()
    assert info["kernel_cache"]["path"] == str(kernel_cache)
    assert set(info["env"]) == {"TENSORPLAY_CACHE_DIR", "XDG_CACHE_HOME", "TENSORPLAY_DISABLE_CUDA", "TENSORPLAY_PDL"}
    assert (info["cuda"] is None) == HAS_CUDA
    if not HAS_CUDA:
        assert info["gpus"] == []
