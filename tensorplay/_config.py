# SPDX-License-Identifier: Apache-2.0
"""``tensorplay.show_config()``: versions, driver, devices and the kernel cache,
for bug reports (in the manner of ``numpy.show_config()`` and ``cupy.show_config()``)."""

from __future__ import annotations

import os
import platform
import sys
from typing import IO, Any

from tensorplay._driver import context as _cuda
from tensorplay import cuda
from tensorplay._kernels import nvrtc as _nvrtc
from tensorplay._memory.units import format_bytes
from tensorplay._version import __version__

# The distributions tensorplay runs on, by their names on PyPI; nvidia-cublas
# is optional (matrix products load it when it is installed).
DISTRIBUTIONS = ("numpy", "ml_dtypes", "cuda-bindings", "cuda-pathfinder", "nvidia-cuda-nvrtc",
                 "nvidia-cublas")
# Every environment variable tensorplay reads or the docs tell users about
# (docs/configuration.md, "Environment variables"), in the order show_config()
# prints them, set or not. The one list: config(), show_config() and the docs
# test (tests/api/test_show_config.py) take it from here.
ENV_VARS = ("TENSORPLAY_CACHE_DIR", "XDG_CACHE_HOME", "TENSORPLAY_DISABLE_CUDA", "TENSORPLAY_PDL",
            "TENSORPLAY_FOREIGN_CAPTURE", "TENSORPLAY_CUBLASLT_WORKSPACE_SIZE", "CUDA_VISIBLE_DEVICES",
            "CUDA_MODULE_LOADING")


def _dist_version(name: str) -> str | None:
    from importlib import metadata
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _kernel_module_version() -> str | None:
    """The NVIDIA kernel module's version (e.g. '580.65.06'), read from
    /proc/driver/nvidia/version; None where there is none."""
    try:
        with open("/proc/driver/nvidia/version") as f:
            line = f.readline()
    except OSError:
        return None
    for word in line.split():
        parts = word.split(".")
        if len(parts) >= 2 and all(p.isdigit() for p in parts):
            return word
    return None


def config() -> dict[str, Any]:
    """Return what :func:`show_config` prints, as a dict, for bug reports.

    Keys: ``tensorplay``, ``python``, ``platform``, one per dependency
    (``numpy``, ``ml_dtypes``, ``cuda-bindings``, ``cuda-pathfinder``,
    ``nvidia-cuda-nvrtc``, ``nvidia-cublas``; None when not installed),
    ``nvrtc`` (NVRTC's own version), ``driver`` (the CUDA version the driver
    supports, None without a driver), ``driver_module`` (the NVIDIA kernel
    module's version), ``gpus`` (one string a device, empty when CUDA is not
    available), ``cuda`` (None when available, else why not), ``kernel_cache``
    (folder, files, bytes) and ``env`` (every environment variable the
    documentation names: ``TENSORPLAY_CACHE_DIR``, ``XDG_CACHE_HOME``,
    ``TENSORPLAY_DISABLE_CUDA``, ``TENSORPLAY_PDL``,
    ``TENSORPLAY_FOREIGN_CAPTURE``, ``TENSORPLAY_CUBLASLT_WORKSPACE_SIZE``,
    ``CUDA_VISIBLE_DEVICES``, ``CUDA_MODULE_LOADING``; None when unset).
    Works without a GPU.
    """
    info: dict[str, Any] = {"tensorplay": __version__, "python": sys.version.split()[0],
                  "platform": platform.platform()}
    for name in DISTRIBUTIONS:
        info[name] = _dist_version(name)
    try:
        info["nvrtc"] = ".".join(map(str, _nvrtc.nvrtc_version()))
    except Exception as exc:
        info["nvrtc"] = f"unavailable ({exc})"
    raw = _cuda.raw_driver_version()
    info["driver"] = _cuda.format_cuda_version(raw) if raw else None
    info["driver_module"] = _kernel_module_version()
    gpus = []
    if cuda.is_available():
        for i in range(cuda.device_count()):
            major, minor = cuda.get_device_capability(i)
            total = cuda.get_device_properties(i)["total_memory"]
            note = "" if cuda.is_device_supported(i) else ", unsupported: needs compute capability 7.5 or newer"
            gpus.append(f"cuda:{i} {cuda.get_device_name(i)} (compute capability {major}.{minor}, "
                        f"{format_bytes(total, digits=1)}{note})")
    info["gpus"] = gpus
    info["cuda"] = cuda.unavailable_reason()
    info["kernel_cache"] = {k: v for k, v in _nvrtc.kernel_cache_info().items() if k in ("path", "files", "bytes")}
    info["env"] = {k: os.environ.get(k) for k in ENV_VARS}
    return info


def show_config(file: IO[str] | None = None) -> None:
    """Print tensorplay's configuration, for bug reports.

    Versions of tensorplay, Python and every dependency, NVRTC, the driver,
    the GPUs (or why CUDA is not available), the kernel cache folder and its
    size, and every environment variable tensorplay reads or documents
    (``(not set)`` when unset). Works without a GPU.

    Parameters
    ----------
    file : file-like, optional
        Where to print; default ``sys.stdout``.
    """
    info = config()
    out = file or sys.stdout
    cache = info["kernel_cache"]
    rows = [("tensorplay", info["tensorplay"]), ("python", info["python"]),
            ("platform", info["platform"])]
    for name in DISTRIBUTIONS:
        rows.append((name, info[name] or "not installed"))
    rows.append(("nvrtc", info["nvrtc"]))
    driver = info["driver"]
    if driver is not None:
        driver = f"CUDA {driver}"
        if info["driver_module"]:
            driver += f" (kernel module {info['driver_module']})"
    if driver is None:
        driver = "not loaded (TENSORPLAY_DISABLE_CUDA)" if _cuda.disabled_by_env(
            info["env"]["TENSORPLAY_DISABLE_CUDA"]) else "not found"
    rows.append(("driver", driver))
    if info["cuda"] is None:
        rows.append(("cuda", "available"))
        rows.extend(("gpu" if k == 0 else "", g) for k, g in enumerate(info["gpus"]))
    else:
        rows.append(("cuda", f"not available: {info['cuda']}"))
    files = f"{cache['files']} file{'' if cache['files'] == 1 else 's'}"
    rows.append(("kernel cache", f"{cache['path']} ({files}, {format_bytes(cache['bytes'], digits=1)})"))
    for k, v in info["env"].items():
        rows.append((k, "(not set)" if v is None else v))
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k:>{width}}{':' if k else ' '} {v}", file=out)
