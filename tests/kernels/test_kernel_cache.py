# SPDX-License-Identifier: Apache-2.0
"""The NVRTC kernel cache: where it lives (the environment decides), a
compile logged with its name, target and time, memory-cache hits silent, and
the public info and clear functions."""

import logging
import os

import tensorplay as tp
from helpers import KERNEL_ARCH, unique_kernel_source
from tensorplay._kernels import nvrtc as _nvrtc


def test_kernel_cache_dir_follows_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("TENSORPLAY_CACHE_DIR", str(tmp_path / "a"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert tp.cuda.kernel_cache_dir() == str(tmp_path / "a" / "kernels")
    monkeypatch.delenv("TENSORPLAY_CACHE_DIR")
    assert tp.cuda.kernel_cache_dir() == str(tmp_path / "xdg" / "tensorplay" / "kernels")
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert tp.cuda.kernel_cache_dir() == os.path.expanduser("~/.cache/tensorplay/kernels")


def test_compiling_a_kernel_logs_name_target_and_time(kernel_cache, caplog):
    with caplog.at_level(logging.DEBUG, logger="tensorplay"):
        _nvrtc.compile_cubin(unique_kernel_source("logged_kernel"), "logged_kernel.cu", arch=KERNEL_ARCH)
    compiled = [r for r in caplog.records if r.name == "tensorplay.nvrtc" and r.levelno == logging.INFO]
    assert len(compiled) == 1, caplog.text
    msg = compiled[0].getMessage()
    assert msg.startswith("compiled kernel logged_kernel for sm_90 with NVRTC ") and msg.endswith(" ms")

    caplog.clear()
    _nvrtc.clear_memory_cache()
    with caplog.at_level(logging.DEBUG, logger="tensorplay"):
        _nvrtc.compile_cubin(unique_kernel_source("logged_kernel"), "logged_kernel.cu", arch=KERNEL_ARCH)
    hits = [r for r in caplog.records if r.name == "tensorplay.nvrtc"]
    assert [r.levelno for r in hits] == [logging.DEBUG], caplog.text
    assert "logged_kernel" in hits[0].getMessage() and "from the cache" in hits[0].getMessage()


def test_memory_cache_hits_log_nothing(kernel_cache, caplog):
    src = unique_kernel_source("quiet_kernel")
    _nvrtc.compile_cubin(src, arch=KERNEL_ARCH)
    with caplog.at_level(logging.DEBUG, logger="tensorplay"):
        _nvrtc.compile_cubin(src, arch=KERNEL_ARCH)
    assert not [r for r in caplog.records if r.name.startswith("tensorplay")]


def test_kernel_cache_info_and_clear(kernel_cache):
    assert tp.cuda.kernel_cache_info()["files"] == 0
    before = tp.cuda.kernel_cache_info()["compiled"]
    _nvrtc.compile_cubin(unique_kernel_source("cached_a"), arch=KERNEL_ARCH)
    _nvrtc.compile_cubin(unique_kernel_source("cached_b"), arch=KERNEL_ARCH)
    info = tp.cuda.kernel_cache_info()
    assert info["path"] == str(kernel_cache) == tp.cuda.kernel_cache_dir()
    assert info["files"] == 2 and info["bytes"] == sum(f.stat().st_size for f in kernel_cache.rglob("*.bin"))
    assert info["compiled"] == before + 2
    keep = kernel_cache / "README.txt"
    keep.write_text("not ours")

    removed = tp.cuda.clear_kernel_cache()
    assert removed == {"path": str(kernel_cache), "files": 2, "bytes": info["bytes"]}
    assert not list(kernel_cache.rglob("*.bin")) and keep.exists()
    assert tp.cuda.kernel_cache_info()["files"] == 0
    _nvrtc.compile_cubin(unique_kernel_source("cached_a"), arch=KERNEL_ARCH)    # compiles again
    assert tp.cuda.kernel_cache_info()["compiled"] == before + 3


def test_clearing_a_missing_cache_is_fine(tmp_path, monkeypatch):
    monkeypatch.setenv("TENSORPLAY_CACHE_DIR", str(tmp_path / "never-made"))
    assert tp.cuda.clear_kernel_cache()["files"] == 0
    assert tp.cuda.kernel_cache_info()["files"] == 0


def test_the_suite_compiles_into_a_temporary_cache():
    """conftest points TENSORPLAY_CACHE_DIR at a temporary folder: the tests'
    kernels never land in the user's cache, unless TENSORPLAY_TEST_CACHE_DIR asks."""
    import tempfile
    wanted = os.environ.get("TENSORPLAY_TEST_CACHE_DIR") or tempfile.gettempdir()
    assert tp.cuda.kernel_cache_dir().startswith(os.path.abspath(wanted))
    assert not tp.cuda.kernel_cache_dir().startswith(os.path.expanduser("~/.cache"))
