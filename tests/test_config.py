# SPDX-License-Identifier: Apache-2.0
"""User-facing conventions: requirements checked at initialisation, the
unavailable reason, error type names and pickling, kernel compile logging, the
kernel cache API, show_config(), and repr during a capture."""

import logging
import os
import pickle
import subprocess
import sys
import traceback

import pytest

import tensorplay as tp
from tensorplay._driver import context as _cuda
from tensorplay._kernels import nvrtc as _nvrtc
from conftest import HAS_CUDA

ARCH = 90


# ------------------------------------------------------------ requirements

def test_unavailable_reason_is_our_sentence():
    reason = tp.cuda.unavailable_reason()
    if HAS_CUDA:
        assert reason is None
        return
    assert isinstance(reason, str) and reason
    for internal in ("system search", "pathfinder", '"cuda"', "Traceback"):
        assert internal not in reason, reason
    assert "\n" not in reason and not reason.endswith(".")


def test_missing_driver_library_reads_as_our_sentence():
    from cuda.pathfinder import DynamicLibNotFoundError
    exc = DynamicLibNotFoundError('"cuda" is an NVIDIA driver library and can only be found via '
                                  'system search. Ensure the NVIDIA display driver is installed.')
    assert _cuda._driver_load_problem(exc) == "no NVIDIA driver was found (libcuda.so.1 could not be loaded)"
    other = _cuda._driver_load_problem(OSError("bad ELF"))
    assert other.startswith("the NVIDIA driver library libcuda.so.1 could not be used") and "bad ELF" in other


@pytest.mark.parametrize("version", [13000, 13010, 13050, 14000])
def test_cuda_13_drivers_are_accepted(version):
    assert _cuda._driver_version_problem(version) is None


@pytest.mark.parametrize("version,shown", [(12090, "12.9"), (12040, "12.4"), (11080, "11.8")])
def test_older_drivers_are_refused_in_one_sentence(version, shown):
    msg = _cuda._driver_version_problem(version)
    assert msg == (f"the NVIDIA driver supports CUDA {shown}, but tensorplay needs a driver for "
                   "CUDA 13.0 or newer (driver R580 or newer)")


def test_a_driver_without_a_version_is_refused():
    assert "cuDriverGetVersion" in _cuda._driver_version_problem(0)


@pytest.mark.parametrize("cc,ok", [((7, 5), True), ((8, 0), True), ((9, 0), True), ((10, 0), True),
                                   ((12, 1), True), ((7, 0), False), ((7, 2), False), ((6, 1), False)])
def test_compute_capability_floor_is_7_5(cc, ok):
    assert _cuda._capability_supported(*cc) is ok
    assert _cuda.MIN_COMPUTE_CAPABILITY == (7, 5)


def test_one_old_gpu_makes_cuda_unavailable_with_one_sentence():
    msg = _cuda._devices_problem([("Tesla V100-SXM2-16GB", 7, 0)])
    assert msg == ("cuda:0 (Tesla V100-SXM2-16GB) has compute capability 7.0, but tensorplay's "
                   "NVRTC-compiled kernels need compute capability 7.5 or newer (Turing or newer)")


def test_only_old_gpus_make_cuda_unavailable():
    msg = _cuda._devices_problem([("Tesla V100", 7, 0), ("Tesla P100", 6, 0)])
    assert msg.startswith("no CUDA device has compute capability 7.5 or newer")
    assert "cuda:0 Tesla V100 7.0" in msg and "cuda:1 Tesla P100 6.0" in msg


def test_one_supported_gpu_is_enough():
    assert _cuda._devices_problem([("Tesla V100", 7, 0), ("NVIDIA H200", 9, 0)]) is None
    assert _cuda._devices_problem([("NVIDIA H200", 9, 0)]) is None
    assert _cuda._devices_problem([]) == "the NVIDIA driver reports no CUDA devices"


def test_work_on_an_unsupported_device_names_it():
    msg = _cuda._unsupported_device_message(1, "Tesla V100", 7, 0)
    assert msg.startswith("cuda:1 (Tesla V100) has compute capability 7.0") and "7.5 or newer" in msg


@pytest.mark.parametrize("value,off", [(None, False), ("", False), ("0", False), ("false", False),
                                       ("no", False), ("OFF", False), ("1", True), ("yes", True),
                                       ("true", True)])
def test_disable_variable_values(value, off):
    assert _cuda._disabled_by_env(value) is off


def _run(code, **env):
    full = dict(os.environ, **env)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/", env=full,
                          timeout=120)


def test_disable_variable_set_to_zero_leaves_cuda_alone():
    out = _run("import tensorplay as tp\nprint(tp.cuda.unavailable_reason())", TENSORPLAY_DISABLE_CUDA="0")
    assert out.returncode == 0, out.stderr
    assert "TENSORPLAY_DISABLE_CUDA" not in out.stdout


def test_disabled_cuda_raises_a_public_error_type():
    out = _run("import tensorplay as tp\ntp.zeros(2, device='cuda')", TENSORPLAY_DISABLE_CUDA="1")
    assert out.returncode == 1
    last = out.stderr.strip().splitlines()[-1]
    assert last == ("tensorplay.cuda.CudaUnavailableError: CUDA is not available: "
                    "the environment variable TENSORPLAY_DISABLE_CUDA turns CUDA off")


# ------------------------------------------------------------ error types

@pytest.mark.parametrize("err", [tp.cuda.CudaError(1, "CUDA_ERROR_INVALID_VALUE", "invalid argument"),
                                 tp.cuda.OutOfMemoryError(),
                                 tp.cuda.CudaUnavailableError("CUDA is not available: no GPU")])
def test_errors_print_their_public_path_and_pickle(err):
    cls = type(err)
    assert cls.__module__ == "tensorplay.cuda"
    assert getattr(tp.cuda, cls.__name__) is cls
    assert repr(cls) == f"<class 'tensorplay.cuda.{cls.__name__}'>"
    line = traceback.format_exception_only(cls, err)[-1]
    assert line.startswith(f"tensorplay.cuda.{cls.__name__}: ")
    data = pickle.dumps(err)
    assert b"tensorplay.cuda" in data and b"tensorplay._driver.context" not in data
    back = pickle.loads(data)
    assert type(back) is cls and str(back) == str(err)
    if isinstance(err, tp.cuda.CudaError):
        assert (back.code, back.name, back.description) == (err.code, err.name, err.description)


def test_make_error_keeps_the_status_code_and_name():
    err = _cuda.make_error(2, "cuMemAlloc of 1 TiB")
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is tp.cuda.OutOfMemoryError
    assert back.code == 2 and back.name == "CUDA_ERROR_OUT_OF_MEMORY" and "1 TiB" in str(back)


# ------------------------------------------------------------ kernel cache and logging

@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TENSORPLAY_CACHE_DIR", str(tmp_path))
    _nvrtc.clear_memory_cache()
    yield tmp_path / "kernels"
    _nvrtc.clear_memory_cache()


def _unique_source(tag):
    return 'extern "C" __global__ void %s(int* x) { x[0] = %d; }' % (tag, os.getpid())


def test_kernel_cache_dir_follows_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("TENSORPLAY_CACHE_DIR", str(tmp_path / "a"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert tp.cuda.kernel_cache_dir() == str(tmp_path / "a" / "kernels")
    monkeypatch.delenv("TENSORPLAY_CACHE_DIR")
    assert tp.cuda.kernel_cache_dir() == str(tmp_path / "xdg" / "tensorplay" / "kernels")
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert tp.cuda.kernel_cache_dir() == os.path.expanduser("~/.cache/tensorplay/kernels")


def test_compiling_a_kernel_logs_name_target_and_time(cache, caplog):
    with caplog.at_level(logging.DEBUG, logger="tensorplay"):
        _nvrtc.compile_cubin(_unique_source("logged_kernel"), "logged_kernel.cu", arch=ARCH)
    compiled = [r for r in caplog.records if r.name == "tensorplay.nvrtc" and r.levelno == logging.INFO]
    assert len(compiled) == 1, caplog.text
    msg = compiled[0].getMessage()
    assert msg.startswith("compiled kernel logged_kernel for sm_90 with NVRTC ") and msg.endswith(" ms")

    caplog.clear()
    _nvrtc.clear_memory_cache()
    with caplog.at_level(logging.DEBUG, logger="tensorplay"):
        _nvrtc.compile_cubin(_unique_source("logged_kernel"), "logged_kernel.cu", arch=ARCH)
    hits = [r for r in caplog.records if r.name == "tensorplay.nvrtc"]
    assert [r.levelno for r in hits] == [logging.DEBUG], caplog.text
    assert "logged_kernel" in hits[0].getMessage() and "from the cache" in hits[0].getMessage()


def test_memory_cache_hits_log_nothing(cache, caplog):
    src = _unique_source("quiet_kernel")
    _nvrtc.compile_cubin(src, arch=ARCH)
    with caplog.at_level(logging.DEBUG, logger="tensorplay"):
        _nvrtc.compile_cubin(src, arch=ARCH)
    assert not [r for r in caplog.records if r.name.startswith("tensorplay")]


def test_kernel_cache_info_and_clear(cache):
    assert tp.cuda.kernel_cache_info()["files"] == 0
    before = tp.cuda.kernel_cache_info()["compiled"]
    _nvrtc.compile_cubin(_unique_source("cached_a"), arch=ARCH)
    _nvrtc.compile_cubin(_unique_source("cached_b"), arch=ARCH)
    info = tp.cuda.kernel_cache_info()
    assert info["path"] == str(cache) == tp.cuda.kernel_cache_dir()
    assert info["files"] == 2 and info["bytes"] == sum(f.stat().st_size for f in cache.rglob("*.bin"))
    assert info["compiled"] == before + 2
    keep = cache / "README.txt"
    keep.write_text("not ours")

    removed = tp.cuda.clear_kernel_cache()
    assert removed == {"path": str(cache), "files": 2, "bytes": info["bytes"]}
    assert not list(cache.rglob("*.bin")) and keep.exists()
    assert tp.cuda.kernel_cache_info()["files"] == 0
    _nvrtc.compile_cubin(_unique_source("cached_a"), arch=ARCH)    # compiles again
    assert tp.cuda.kernel_cache_info()["compiled"] == before + 3


def test_clearing_a_missing_cache_is_fine(tmp_path, monkeypatch):
    monkeypatch.setenv("TENSORPLAY_CACHE_DIR", str(tmp_path / "never-made"))
    assert tp.cuda.clear_kernel_cache()["files"] == 0
    assert tp.cuda.kernel_cache_info()["files"] == 0


# ------------------------------------------------------------ show_config

def test_show_config_prints_versions_cache_and_environment(cache, monkeypatch, capsys):
    monkeypatch.setenv("TENSORPLAY_DISABLE_CUDA", "0")
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    _nvrtc.compile_cubin(_unique_source("config_kernel"), arch=ARCH)
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
    assert rows["kernel cache"].startswith(f"{cache} (1 file, ")
    assert rows["TENSORPLAY_CACHE_DIR"] == str(cache.parent)
    assert rows["XDG_CACHE_HOME"] == "(not set)" and rows["TENSORPLAY_DISABLE_CUDA"] == "0"
    if HAS_CUDA:
        assert rows["cuda"] == "available" and rows["driver"].startswith("CUDA 13.")
        assert "compute capability" in rows["gpu"]
    else:
        assert rows["cuda"] == f"not available: {tp.cuda.unavailable_reason()}"


def test_show_config_with_cuda_disabled():
    out = _run("import tensorplay as tp\ntp.show_config()", TENSORPLAY_DISABLE_CUDA="1")
    assert out.returncode == 0, out.stderr
    rows = {k.strip(): v.strip() for k, _, v in (line.partition(":") for line in out.stdout.splitlines())}
    assert rows["driver"] == "not loaded (TENSORPLAY_DISABLE_CUDA)"
    assert rows["cuda"] == "not available: the environment variable TENSORPLAY_DISABLE_CUDA turns CUDA off"
    assert rows["TENSORPLAY_DISABLE_CUDA"] == "1"


def test_config_is_a_dict_without_a_gpu_too(cache):
    info = tp.config()
    assert info["kernel_cache"]["path"] == str(cache)
    assert set(info["env"]) == {"TENSORPLAY_CACHE_DIR", "XDG_CACHE_HOME", "TENSORPLAY_DISABLE_CUDA"}
    assert (info["cuda"] is None) == HAS_CUDA
    if not HAS_CUDA:
        assert info["gpus"] == []


# ------------------------------------------------------------ repr during a capture

def test_capture_repr_names_shape_dtype_and_device():
    from tensorplay._tensor.tensor import _capture_repr
    t = tp.zeros(4, 3, dtype=tp.float16)
    assert _capture_repr(t) == ("tensor(<captured: not readable during a CUDA graph capture>, "
                                "shape=(4, 3), dtype=tensorplay.float16, device='cpu')")


@pytest.mark.cuda
def test_repr_inside_a_capture_does_not_break_it():
    x = tp.ones(4, device="cuda")
    (x * 2).sum()
    tp.cuda.synchronize()
    g = tp.cuda.CUDAGraph()
    with tp.cuda.graph(g):
        y = x * 2
        inside = repr(y)
        shown = f"{x} {y[1:]}"
        assert tp.cuda.is_current_stream_capturing()
    dev = y.device
    assert inside == ("tensor(<captured: not readable during a CUDA graph capture>, shape=(4,), "
                      f"dtype=tensorplay.float32, device='{dev}')")
    assert "captured" in shown and "shape=(3,)" in shown
    g.replay()
    assert y.tolist() == [2.0, 2.0, 2.0, 2.0]
    assert "captured" not in repr(y) and "2." in repr(y)


@pytest.mark.cuda
def test_repr_on_another_thread_during_a_capture_reads_nothing():
    import threading
    x = tp.ones(4, device="cuda")
    (x + 1).sum()
    tp.cuda.synchronize()
    seen = []
    g = tp.cuda.CUDAGraph()
    with tp.cuda.graph(g):
        y = x + 1
        t = threading.Thread(target=lambda: seen.append(repr(x)))
        t.start()
        t.join()
    assert "captured" in seen[0]
    g.replay()
    assert y.tolist() == [2.0] * 4


@pytest.mark.cuda
def test_requirements_hold_on_the_gpu_machine():
    assert tp.cuda.driver_version() >= (13, 0)
    assert tp.cuda.unavailable_reason() is None
    for i in range(tp.cuda.device_count()):
        assert tp.cuda.is_device_supported(i) == (tp.cuda.get_device_capability(i) >= (7, 5))
