# SPDX-License-Identifier: Apache-2.0
"""``tensorplay.show_config()``: versions and devices, for bug reports."""

from __future__ import annotations

import platform
import sys
from typing import IO, Any


def config() -> dict[str, Any]:
    """Return the versions of tensorplay and its dependencies and the GPUs seen, for bug reports.

    Returns
    -------
    dict
        ``tensorplay``, ``python``, ``platform``, ``numpy``,
        ``cuda-bindings``, ``nvrtc``, ``driver`` (None without one) and
        ``gpus`` (``"index: name (sm_XY)"`` each; empty without a driver,
        and then ``cuda`` says why).
    """
    import numpy

    from . import __version__, cuda
    from ._nvrtc import nvrtc_version
    info: dict[str, Any] = {"tensorplay": __version__, "python": sys.version.split()[0], "platform": platform.platform(),
            "numpy": numpy.__version__}
    try:
        from cuda.bindings import __version__ as cb
    except ImportError:
        cb = None
    info["cuda-bindings"] = cb
    try:
        info["nvrtc"] = ".".join(map(str, nvrtc_version()))
    except Exception as exc:
        info["nvrtc"] = f"unavailable ({exc})"
    if cuda.is_available():
        info["driver"] = ".".join(map(str, cuda.driver_version()))
        info["gpus"] = [f"{i}: {cuda.get_device_name(i)} (sm_{''.join(map(str, cuda.get_device_capability(i)))})"
                        for i in range(cuda.device_count())]
    else:
        info["driver"] = None
        info["gpus"] = []
        info["cuda"] = cuda.unavailable_reason()
    return info


def show_config(file: IO[str] | None = None) -> None:
    """Print :func:`config`, one item a line.

    Parameters
    ----------
    file : file-like, optional
        Where to print; default ``sys.stdout``.
    """
    for k, v in config().items():
        if isinstance(v, list):
            v = "; ".join(v) if v else "none"
        print(f"{k:>14}: {v}", file=file or sys.stdout)
