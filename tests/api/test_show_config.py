# SPDX-License-Identifier: Apache-2.0
"""tensorplay.config() and show_config(): the versions of tensorplay and its
dependencies, the kernel cache, the environment, and the GPUs (or why there
are none)."""

import re
import sys

import numpy as np

import tensorplay as tp
from helpers import HAS_CUDA, KERNEL_ARCH, ROOT, run_python, unique_kernel_source
from tensorplay._config import ENV_VARS
from tensorplay._kernels import nvrtc as _nvrtc

# Variables the docs name that tensorplay itself does not read: the test
# suite's and scripts/setup.sh's (where each is read).
NOT_TENSORPLAYS = {"TENSORPLAY_TEST_CACHE_DIR": "tests/conftest.py", "TENSORPLAY_TEST_SHUFFLE": "tests/conftest.py",
                   "TENSORPLAY_REBUILD": "scripts/setup.sh"}


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
    assert list(info["env"]) == list(ENV_VARS)
    assert (info["cuda"] is None) == HAS_CUDA
    if not HAS_CUDA:
        assert info["gpus"] == []


def _documented_variables():
    """{name: first page} of the TENSORPLAY_* and CUDA_* environment variables
    that README.md and docs/**/*.md name (CUresult names such as
    CUDA_ERROR_OUT_OF_MEMORY are not variables)."""
    pages = [ROOT / "README.md"] + sorted(p for p in (ROOT / "docs").rglob("*.md")
                                          if not {"_build", "_generated"} & set(p.parts))
    names = {}
    for page in pages:
        for name in re.findall(r"\b(?:TENSORPLAY|CUDA)_[A-Z0-9_]*[A-Z0-9]\b", page.read_text()):
            if not name.startswith(("CUDA_ERROR_", "CUDA_SUCCESS")):
                names.setdefault(name, str(page.relative_to(ROOT)))
    return names


def test_show_config_lists_every_documented_variable():
    documented = _documented_variables()
    assert {"TENSORPLAY_FOREIGN_CAPTURE", "TENSORPLAY_CUBLASLT_WORKSPACE_SIZE", "CUDA_VISIBLE_DEVICES",
            "TENSORPLAY_CACHE_DIR", "TENSORPLAY_PDL", "TENSORPLAY_DISABLE_CUDA"} <= set(documented)
    missing = {n: page for n, page in documented.items() if n not in ENV_VARS and n not in NOT_TENSORPLAYS}
    assert not missing, f"documented but not in tensorplay._config.ENV_VARS (show_config): {missing}"
    undocumented = [n for n in ENV_VARS if n not in documented and n != "XDG_CACHE_HOME"]
    assert not undocumented, f"in ENV_VARS but named nowhere in the docs: {undocumented}"
    assert "XDG_CACHE_HOME" in (ROOT / "docs" / "configuration.md").read_text()
    for name, where in NOT_TENSORPLAYS.items():          # really the tests' and scripts', not the package's
        assert name in documented and name in (ROOT / where).read_text(), name
    for name in ENV_VARS:                                 # config()'s docstring names them too
        assert f"``{name}``" in tp.config.__doc__, name


def test_every_variable_the_package_reads_is_listed():
    """os.environ.get("X") / os.getenv("X") in the package's sources: X is in ENV_VARS."""
    read = set()
    for path in [*(ROOT / "tensorplay").rglob("*.py"), *(ROOT / "src").rglob("*.pyx")]:
        read |= set(re.findall(r"(?:environ\.get|getenv|environ\[)\(?\s*[\"']([A-Z0-9_]+)[\"']", path.read_text()))
    assert {"TENSORPLAY_CACHE_DIR", "TENSORPLAY_FOREIGN_CAPTURE", "TENSORPLAY_PDL"} <= read
    assert not read - set(ENV_VARS), read - set(ENV_VARS)


def test_show_config_prints_each_variable_set_or_not(tmp_path):
    values = {"TENSORPLAY_CACHE_DIR": str(tmp_path), "XDG_CACHE_HOME": str(tmp_path / "xdg"),
              "TENSORPLAY_DISABLE_CUDA": "1", "TENSORPLAY_PDL": "0", "TENSORPLAY_FOREIGN_CAPTURE": "off",
              "TENSORPLAY_CUBLASLT_WORKSPACE_SIZE": "1024", "CUDA_VISIBLE_DEVICES": "1,0",
              "CUDA_MODULE_LOADING": "EAGER"}
    assert set(values) == set(ENV_VARS)
    out = run_python("import tensorplay as tp\ntp.show_config()", **values)
    assert out.returncode == 0, out.stderr
    rows = [line.partition(":") for line in out.stdout.splitlines()]
    shown = {k.strip(): v.strip() for k, _, v in rows}
    assert [k.strip() for k, _, _ in rows[-len(ENV_VARS):]] == list(ENV_VARS)      # in that order, last
    assert {k: shown[k] for k in ENV_VARS} == values
    unset = "import os\nfor k in %r: os.environ.pop(k, None)\nimport tensorplay as tp\ntp.show_config()" % (
        list(ENV_VARS),)
    out = run_python(unset)
    assert out.returncode == 0, out.stderr
    shown = {k.strip(): v.strip() for k, _, v in (line.partition(":") for line in out.stdout.splitlines())}
    assert {k: shown[k] for k in ENV_VARS} == dict.fromkeys(ENV_VARS, "(not set)")
